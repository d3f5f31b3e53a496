"""The demo's pictures: the shipped shapes model drawn in float32, in a recipe's layout, and its float32 latents
decoded by the VAE cast to float16, side by side in one labelled PNG; and the demo's image and difference helpers.

The shapes VAE's decoder, like the real SDXL VAE's (diffusers marks it ``force_upcast``; the sdxl-vae-fp16-fix
model card explains it), has activations far past 65504, so a float16 decode is black; a recipe keeps it float32
on a T4 (bfloat16 with the NaN guard on an A100).
"""

from __future__ import annotations

import copy
import warnings
from pathlib import Path
from typing import Any

from .outputs import written_atomically

__all__ = ["difference", "one_call_difference", "SHAPES_CALL", "GRID_PROMPTS", "CELL", "picture_layout",
           "draw_pictures", "enlarged", "save_png", "save_gif", "grid_image", "shape_region",
           "colour_read"]

# What the shapes model was trained for: 32x32 pictures of the captions, no classifier-free guidance (it never saw an
# empty caption), enough Euler steps for a clean shape.
SHAPES_CALL: dict[str, Any] = {"height": 32, "width": 32, "num_inference_steps": 8, "guidance_scale": 1.0}
# Every colour and both shapes, one row each: a person checks the shape and the colour each caption names.
GRID_PROMPTS = ("a red square", "a blue circle", "a green circle", "a yellow square")
CELL = 160  # px per picture in the grid: 32 px enlarged 5x
T4 = "t4"  # the layout people know (fp16 UNet, fp32 VAE) shown where this machine's own recipe has no half dtype


def shape_region(shape: str, size: int, draws: int = 16) -> Any:
    """The pixels that every training draw of ``shape`` at ``size`` px fills (a boolean ``size x size`` array):
    where the shape's colour must be, whatever margin a draw picked (``hf_precision.apps.train.demo.draw_shape``).

    Example:
        >>> region = shape_region("square", 32)
        >>> bool(region[16, 16]), bool(region[0, 0]), region.shape
        (True, False, (32, 32))
    """
    import numpy as np

    from .train.demo import draw_shape

    fill = (255, 0, 255)  # no background draws it (their channels start at 200)
    masks = [(np.asarray(draw_shape(shape, fill, size, seed)) == fill).all(-1) for seed in range(draws)]
    return np.logical_and.reduce(masks)


def colour_read(picture: Any, prompt: str) -> dict[str, Any]:
    """The mean colour of ``picture`` (an ``HxWx3`` array in [0, 1]) inside :func:`shape_region` of the shape that
    ``prompt`` names, and the training colour (``hf_precision.apps.train.demo.COLORS``) nearest to it.

    Example:
        >>> import numpy as np
        >>> from hf_precision.apps.train.demo import COLORS, draw_shape
        >>> red = np.asarray(draw_shape("circle", COLORS["red"], 32, 0)) / 255
        >>> colour_read(red, "a red circle")["nearest"]
        'red'
    """
    import numpy as np

    from .train.demo import COLORS, SHAPES

    shape = next(s for s in SHAPES if s in prompt.split())
    array = np.nan_to_num(np.asarray(picture, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    mean = array[shape_region(shape, array.shape[0])].mean(0) * 255
    nearest = min(COLORS, key=lambda name: float(np.linalg.norm(mean - np.asarray(COLORS[name]))))
    return {"shape": shape, "rgb": [round(float(v), 1) for v in mean], "nearest": nearest}


def difference(a: Any, b: Any) -> dict[str, float]:
    """Max and mean absolute difference of two image/frame arrays, and the non-finite count of ``a``.

    Example:
        >>> difference([0.0, 0.5], [0.0, 0.25])
        {'max_abs': 0.25, 'mean_abs': 0.125, 'nonfinite': 0}
    """
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = np.abs(a - b)
    with warnings.catch_warnings():  # an all-NaN picture (the naive float16 decode) has no finite difference: NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return {"max_abs": float(np.nanmax(diff)), "mean_abs": float(np.nanmean(diff)),
                "nonfinite": int((~np.isfinite(a)).sum())}


def _clone(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.detach().clone()
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def one_call_difference(pipe: Any, reference: Any, kwargs: dict[str, Any], seed: int) -> dict[str, float]:
    """One denoiser call of ``pipe`` and of the fp32 ``reference`` on the first step's inputs (``seed``), and the
    reference's on the next seed's: relative L2 differences from the reference. Several steps carry rounding that
    random tiny weights amplify by a kernel-dependent amount (on the H200 machine's AMX CPU and GPU, 4-step bf16/fp16
    pictures lay as far from fp32's as the next seed's; on an AVX2 CPU within 1%); one call does not.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> from hf_precision.testing.pipelines import example_call_kwargs
        >>> ref = make_pipeline("sdxl"); ref.set_progress_bar_config(disable=True)
        >>> d = one_call_difference(ref, ref, example_call_kwargs("sdxl"), 0)
        >>> d["call_rel_l2"], d["call_other_seed_rel_l2"] > 0.1
        (0.0, True)
    """
    import torch

    name = "unet" if getattr(reference, "unet", None) is not None else "transformer"
    denoiser, model = getattr(reference, name), getattr(pipe, name)

    def first_inputs(s: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
        seen: list[Any] = []
        handle = denoiser.register_forward_pre_hook(lambda m, a, kw: seen or seen.append((_clone(a), _clone(kw))),
                                                    with_kwargs=True)
        try:
            with torch.no_grad():
                reference(**{**kwargs, "num_inference_steps": 1, "output_type": "latent"},
                          generator=torch.Generator("cpu").manual_seed(s))
        finally:
            handle.remove()
        return seen[0]

    (args, kw), (other_args, other_kw) = first_inputs(seed), first_inputs(seed + 1)
    with torch.no_grad():
        want = denoiser(*args, **kw)[0].float()
        got = model(*args, **kw)[0].float()
        other = denoiser(*other_args, **other_kw)[0].float()
    scale = float(want.norm())
    return {"call_rel_l2": float((got - want).norm()) / scale, "call_other_seed_rel_l2": float((other - want).norm()) / scale}


def enlarged(array: Any, side: int = 256) -> tuple[Any, str]:
    """An image array in [0, 1] enlarged (nearest neighbour) to ``side`` px, and the words that say so; inf/NaN
    pixels are drawn black (what they become in an 8-bit file).

    Example:
        >>> import numpy as np
        >>> image, note = enlarged(np.full((32, 32, 3), np.nan))
        >>> image.size, image.getpixel((0, 0)), note
        ((256, 256), (0, 0, 0), '32x32, enlarged 8x to 256x256 to be seen')
    """
    import numpy as np
    from PIL import Image

    array = np.nan_to_num(np.asarray(array, dtype=np.float64), nan=0.0, posinf=0.0, neginf=0.0)
    image = Image.fromarray((np.clip(array, 0, 1) * 255).round().astype("uint8"))
    w, h = image.size
    return image.resize((side, side), Image.NEAREST), f"{w}x{h}, enlarged {side // max(w, 1)}x to {side}x{side} to be seen"


def save_png(array: Any, path: Path) -> str:
    """Save ``array`` enlarged (:func:`enlarged`) as a PNG, written whole or not at all; the size note."""
    image, note = enlarged(array)
    with written_atomically(path) as tmp:
        image.save(tmp, format="PNG")
    return note


def save_gif(frames: Any, path: Path, fps: int = 4) -> str:
    """Save frames enlarged (:func:`enlarged`) as a looping GIF, as the video program writes one; the size note."""
    import numpy as np

    from .video.io import save_video

    pairs = [enlarged(f) for f in frames]
    save_video(np.stack([np.asarray(image) for image, _ in pairs]), path, fps=fps, format="gif")
    return f"{len(pairs)} frames of {pairs[0][1]}"


def grid_image(rows: list[tuple[str, list[Any]]], columns: list[str], cell: int = CELL) -> Any:
    """One PIL image: a header of column labels, then per row its label and its pictures, each enlarged to ``cell``.

    Example:
        >>> import numpy as np
        >>> grid_image([("a red square", [np.zeros((32, 32, 3))] * 2)], ["fp32", "recipe"]).size
        (480, 200)
    """
    from PIL import Image, ImageDraw, ImageFont

    try:
        font = ImageFont.load_default(size=14)
    except TypeError:  # Pillow < 10.1: one bitmap size
        font = ImageFont.load_default()
    label_w, head_h = cell, 40
    grid = Image.new("RGB", (label_w + cell * len(columns), head_h + cell * len(rows)), (255, 255, 255))
    draw = ImageDraw.Draw(grid)
    for j, name in enumerate(columns):
        for k, line in enumerate(name.split("\n")[:2]):
            draw.text((label_w + j * cell + 4, 4 + 17 * k), line, fill=(0, 0, 0), font=font)
    for i, (label, pictures) in enumerate(rows):
        draw.text((4, head_h + i * cell + cell // 2 - 8), label, fill=(0, 0, 0), font=font)
        for j, picture in enumerate(pictures):
            grid.paste(enlarged(picture, cell)[0], (label_w + j * cell, head_h + i * cell))
    return grid


def picture_layout(layout_device: str) -> str:
    """The recipe layout the grid shows: this run's, or the T4's where this run's has no half-precision dtype (its
    pictures would be fp32's by construction; part 4 shows them).

    Example:
        >>> picture_layout("a100"), picture_layout("cpu-avx2")
        ('a100', 't4')
    """
    from ..dtypes import HALF
    from ..recipe.resolution import get_recipe

    recipe = get_recipe("sdxl", device=layout_device)
    return layout_device if any(p.compute in HALF for p in recipe.policies) else T4


def _layout_words(recipe: Any) -> str:
    return ", ".join(f"{p.name} {p.compute}" for p in recipe.policies if p.name in ("unet", "vae"))


def _run(pipe: Any, seed: int, seen: list[Any] | None = None) -> Any:
    """The pictures of :data:`GRID_PROMPTS` (seeds ``seed``, ``seed + 1`` ...); ``seen`` gets the latents that enter
    the VAE decoder."""
    import numpy as np
    import torch

    hook = (pipe.vae.decoder.register_forward_pre_hook(lambda m, a: seen.append(a[0].detach().clone()))
            if seen is not None else None)
    generators = [torch.Generator("cpu").manual_seed(seed + i) for i in range(len(GRID_PROMPTS))]
    try:
        with torch.no_grad():
            images = pipe(prompt=list(GRID_PROMPTS), **SHAPES_CALL, generator=generators, output_type="np").images
    finally:
        if hook is not None:
            hook.remove()
    return np.asarray(images, dtype=np.float64)


def _decode_half(vae: Any, latents: Any) -> Any:
    """``latents`` (what entered the fp32 decoder) through a float16 copy of ``vae``'s decoder, as [0, 1] pictures."""
    import numpy as np
    import torch

    half = copy.deepcopy(vae.decoder).to(torch.float16)
    with torch.no_grad():
        images = (half(latents.to(torch.float16)).float() / 2 + 0.5).clamp(0, 1)
    return np.asarray(images.permute(0, 2, 3, 1).cpu(), dtype=np.float64)


def draw_pictures(out: Path, place: str, layout_device: str, seed: int, say: Any = None) -> dict[str, Any]:
    """Draw :data:`GRID_PROMPTS` with the shipped shapes model in fp32 and in :func:`picture_layout`'s recipe, and
    decode fp32's latents with the VAE cast to float16; write ``out/shapes.png`` (one labelled grid) and return
    what was measured.

    Example:
        >>> r = draw_pictures(Path(tempfile.mkdtemp()), "cpu", "cpu", 0)  # doctest: +SKIP
        >>> r["naive"]["nonfinite"] > 0, r["recipe"]["max_abs"] < 0.05  # doctest: +SKIP
        (True, True)
    """
    import torch
    from diffusers import DiffusionPipeline

    from ..recipe.devices import device_profile
    from ..runtime import applied
    from ..runtime.load import load_pipeline
    from .shapes_model import decoder_peak, shipped_folder, shipped_record

    folder, record, layout = shipped_folder(), shipped_record(), picture_layout(layout_device)
    fp32 = DiffusionPipeline.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True).to(place)
    fp32.set_progress_bar_config(disable=True)
    latents: list[Any] = []
    pictures = {"fp32": _run(fp32, seed, latents)}
    pipe = load_pipeline(folder, place, layout=layout)
    pipe.set_progress_bar_config(disable=True)
    pictures["recipe"] = _run(pipe, seed)
    words = _layout_words(applied(pipe).recipe)
    del pipe
    pictures["naive"] = _decode_half(fp32.vae, latents[0])
    results: dict[str, Any] = {
        "model": str(folder), "fingerprint": record["fingerprint"], "prompts": list(GRID_PROMPTS),
        "seeds": [seed + i for i in range(len(GRID_PROMPTS))], "call": dict(SHAPES_CALL),
        "recipe": {"layout": layout, "label": device_profile(layout).label(), "dtypes": words,
                   **difference(pictures["recipe"], pictures["fp32"])},
        "naive": {"dtypes": "the VAE cast to float16, decoding fp32's latents",
                  "decoder_peak_fp32": decoder_peak(fp32.vae, latents[0]),
                  **difference(pictures["naive"], pictures["fp32"])}}
    from .train.demo import COLORS

    results["colours"] = [{"prompt": prompt, "named": next(c for c in COLORS if c in prompt.split()),
                           **{k: colour_read(pictures[k][i], prompt)["nearest"] for k in ("fp32", "recipe")}}
                          for i, prompt in enumerate(GRID_PROMPTS)]
    columns = ["fp32 (every\ncomponent)", f"recipe {layout}:\n{words}", "naive: VAE in\nfloat16, same latents"]
    rows = [(f"{prompt}\nseed {seed + i}", [pictures[k][i] for k in ("fp32", "recipe", "naive")])
            for i, prompt in enumerate(GRID_PROMPTS)]
    path = out / "shapes.png"
    with written_atomically(path) as tmp:
        grid_image(rows, columns).save(tmp, format="PNG")
    results["output"] = str(path)
    _tell(results, say or (lambda text, indent="": print(indent + text)))
    return results


def _tell(results: dict[str, Any], say: Any) -> None:
    side, r, naive = SHAPES_CALL["height"], results["recipe"], results["naive"]
    say(f"model: hf_precision's shipped shapes model (a small SDXL whose UNet `hf-precision train` fitted to the 8 "
        f"captioned shapes of `hf-precision train --demo`; fingerprint {results['fingerprint']}): {side}x{side} "
        f"pictures, {SHAPES_CALL['num_inference_steps']} Euler steps. It draws the shape and the colour its caption "
        f"names.")
    say("the colour inside the shape, nearest training colour (fp32 / recipe): " + "; ".join(
        f"{c['prompt']!r}: {c['fp32']} / {c['recipe']}" for c in results["colours"]))
    say(f"wrote {results['output']}: one row per prompt and seed "
        f"({', '.join(f'{p!r} seed {s}' for p, s in zip(results['prompts'], results['seeds']))}), each picture "
        f"enlarged {CELL // side}x to {CELL}x{CELL}; the columns, left to right:")
    say("fp32: every component in float32, the reference", indent="  ")
    say(f"recipe {r['layout']} ({r['label']}: {r['dtypes']}): the same picture, max |recipe - fp32| = "
        f"{r['max_abs']:.3g}, mean {r['mean_abs']:.3g} (pixels in [0, 1]), non-finite values: {r['nonfinite']}",
        indent="  ")
    say(f"naive: the same latents as fp32 decoded by the VAE cast to float16 (what pipe.to(torch.float16) decodes "
        f"with once force_upcast is off): {naive['nonfinite']:,} non-finite values, drawn black. This VAE's decoder "
        f"activations reach {naive['decoder_peak_fp32']:.3g} in float32, past float16's 65504, as the real SDXL "
        f"VAE's do: diffusers marks that VAE force_upcast and upcasts it to float32 for every decode (the "
        f"sdxl-vae-fp16-fix model card explains the overflow); the recipe keeps it float32 on a T4 (bfloat16 with "
        f"the NaN guard on an A100), so its picture is fp32's.", indent="  ")
