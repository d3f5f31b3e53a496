"""The demo's trained model: a small SDXL pipeline fitted to the coloured shapes of ``hf-precision train --demo``.

Shipped in the package (``hf_precision/apps/shapes_sdxl/``, 1.3M parameters, 5.3 MB of fp32 safetensors) so that the demo and the
benchmark show pictures a person can judge without training anything. Rebuilt, deterministically on one torch build,
by ONE command::

    python scripts/build_shapes_model.py            # 12-40 minutes on 2 CPU cores; rewrites the shipped folder

How it is made (:func:`build`), on the CPU, in float32, one torch thread (so the sums run in one order):

1. the SDXL structure of ``hf_precision.testing.make_sdxl`` at :data:`SPEC`'s sizes, random weights (seed 0), its
   Euler scheduler set to v-prediction with zero terminal SNR and "trailing" steps (why: the comment on SPEC);
2. its VAE fitted to reconstruct the shapes (a plain Adam loop on many draws of the 8 shapes: the training program
   trains denoisers, not autoencoders), its ``scaling_factor`` set so that the latents have unit spread;
3. its UNet trained by the project's training program (``hf_precision.apps.train.loop.train``, what
   ``hf-precision train --method full`` runs) on the 8 captioned shapes;
4. the VAE decoder reparametrised so its activations leave the float16 range, as the real SDXL VAE's do (diffusers
   marks that VAE ``force_upcast``; the sdxl-vae-fp16-fix model card explains the overflow): :func:`amplify_decoder`
   scales the decoder's trunk by :data:`AMPLIFY` (a power of two) and its closing GroupNorm divides it out again, so
   the float32 picture is unchanged while an all-float16 decode overflows to inf/NaN.

``shapes_sdxl/shapes_model.json`` records :func:`fingerprint` (of :data:`SPEC`, :data:`TRAINING` and the builder's
version), the losses and the versions that built it; :func:`shipped_folder` refuses a folder whose fingerprint differs.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["SPEC", "TRAINING", "PROMPTS", "AMPLIFY", "fingerprint", "shipped_folder", "shipped_record",
           "amplify_decoder", "decoder_peak", "build"]

FOLDER = Path(__file__).resolve().parent / "shapes_sdxl"
RECORD = "shapes_model.json"
BUILDER_VERSION = 2  # raise when build() changes what it makes (2: time ids count pixels with the VAE's own factor)
# make_sdxl's tiny scheduler; text encoders, a UNet (cross-attention at both levels) and a VAE wide enough to draw a
# shape in the colour its caption names.
SPEC: dict[str, Any] = {
    "base": "tiny",
    "text_encoder": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "projection_dim": 32},
    "text_encoder_2": {"hidden_size": 32, "intermediate_size": 64, "num_attention_heads": 4, "projection_dim": 32},
    "unet": {"block_out_channels": [32, 64], "norm_num_groups": 8, "attention_head_dim": [2, 4],
             "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
             "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D"]},
    "vae": {"block_out_channels": [16, 32], "norm_num_groups": 4},
    # The colour of a caption is decided at the noisiest steps. With epsilon prediction there the colour is a sliver
    # of the target (x0 enters the epsilon loss scaled by sqrt(alpha_bar / (1 - alpha_bar)), 0.07 at t=999), and
    # "leading" spacing starts 8 steps at t=876, whose alpha_bar still promises a signal: the first model (b1c79e384313)
    # read its colour from the seed's noise and drew most captions blue. v-prediction with zero terminal SNR and
    # "trailing" steps (Lin et al. 2024, "Common Diffusion Noise Schedules and Sample Steps Are Flawed", arXiv
    # 2305.08891, sections 3.1-3.3) make the first step predict the picture from the caption alone.
    "scheduler": {"prediction_type": "v_prediction", "rescale_betas_zero_snr": True, "timestep_spacing": "trailing"},
}
TRAINING: dict[str, Any] = {
    "seed": 0, "resolution": 32, "torch_threads": 1,
    "vae": {"steps": 400, "batch_size": 8, "learning_rate": 2e-3, "kl_weight": 1e-6, "draws_per_shape": 16},
    "unet": {"method": "full", "steps": 1000, "batch_size": 8, "learning_rate": 2e-3, "layout": "cpu-avx2"},
}
# The captions the UNet was trained on (hf_precision.apps.train.demo.write_shapes): what the model can draw.
PROMPTS = ("a red square", "a blue circle", "a green circle", "a yellow square", "a red circle", "a blue square",
           "a green square", "a yellow circle")
# The decoder trunk's scale: float16 stops at 65504; the trained decoder's activations peak near 10, times 2**14
# is well past it. A power of two scales every product exactly, so float32 keeps its bits (but for GroupNorm's eps).
AMPLIFY = 2 ** 14


def fingerprint(spec: dict[str, Any] | None = None, training: dict[str, Any] | None = None) -> str:
    """Twelve hex digits naming the model's structure, its training settings and the builder's version.

    Example:
        >>> fingerprint() == fingerprint(SPEC, TRAINING)
        True
        >>> fingerprint(training={**TRAINING, "seed": 1}) == fingerprint()
        False
    """
    text = json.dumps({"spec": spec or SPEC, "training": training or TRAINING, "amplify": AMPLIFY,
                       "builder": BUILDER_VERSION}, sort_keys=True)
    return hashlib.sha1(text.encode()).hexdigest()[:12]


def shipped_record(folder: str | Path = FOLDER) -> dict[str, Any]:
    """What ``shapes_model.json`` of ``folder`` says: fingerprint, settings, losses, the versions that built it.

    Example:
        >>> shipped_record()["fingerprint"] == fingerprint()
        True
    """
    from ..errors import RecipeError

    path = Path(folder) / RECORD
    if not path.is_file():
        raise RecipeError(f"{path}: the demo's shapes model is missing from this install; rebuild it with "
                          f"`python scripts/build_shapes_model.py` (or reinstall hf-precision)")
    return json.loads(path.read_text(encoding="utf-8"))


def shipped_folder() -> Path:
    """The installed folder of the shapes model (a diffusers pipeline folder), checked against :func:`fingerprint`.

    Example:
        >>> (shipped_folder() / "model_index.json").is_file()
        True
    """
    from ..errors import RecipeError

    found = shipped_record(FOLDER).get("fingerprint")
    if found != fingerprint():
        raise RecipeError(f"{FOLDER / RECORD}: fingerprint {found}, but this code builds {fingerprint()} (SPEC or "
                          f"TRAINING changed); rebuild it with `python scripts/build_shapes_model.py`")
    return FOLDER


def amplify_decoder(vae: Any, factor: float = AMPLIFY) -> Any:
    """Scale the activations of ``vae``'s decoder trunk by ``factor`` without changing its float32 output.

    The trunk (``conv_in`` to ``conv_norm_out``) is a sum of residual branches that each open with a GroupNorm, so it
    is homogeneous once every branch's last layer (a resnet's ``conv2``, an attention's ``to_out``) and every bias
    added to the trunk (``conv_in``, shortcut and upsampler convs) is scaled too; ``conv_norm_out`` (a GroupNorm)
    divides the scale out. Returns ``vae``.

    Example:
        >>> import torch
        >>> from hf_precision.testing import make_pipeline
        >>> vae = make_pipeline("sdxl").vae
        >>> z = torch.randn(1, 4, 8, 8)
        >>> with torch.no_grad():
        ...     before = vae.decode(z).sample
        ...     after = amplify_decoder(vae, 2 ** 10).decode(z).sample
        >>> bool((before - after).abs().max() < 1e-4), decoder_peak(vae, z) > 1000
        (True, True)
    """
    import torch
    from diffusers.models.attention_processor import Attention
    from diffusers.models.resnet import ResnetBlock2D
    from diffusers.models.upsampling import Upsample2D

    ends = [vae.decoder.conv_in]  # what is added to the trunk: conv_in, each resnet's conv2, each attention's output
    added_bias = []  # linear in the (scaled) trunk: only the bias they add is scaled
    for module in vae.decoder.modules():
        if isinstance(module, ResnetBlock2D):
            ends.append(module.conv2)
            added_bias.append(module.conv_shortcut)
        elif isinstance(module, Attention):
            ends.append(module.to_out[0])
        elif isinstance(module, Upsample2D):
            added_bias.append(module.conv)
    with torch.no_grad():
        for layer in ends:
            layer.weight.mul_(factor)
            if layer.bias is not None:
                layer.bias.mul_(factor)
        for conv in added_bias:
            if conv is not None and conv.bias is not None:
                conv.bias.mul_(factor)
    return vae


def decoder_peak(vae: Any, latents: Any) -> float:
    """The largest |activation| in ``vae``'s decoder trunk (what enters ``conv_norm_out``) decoding ``latents``.

    Example:
        >>> import torch
        >>> from hf_precision.testing import make_pipeline
        >>> decoder_peak(make_pipeline("sdxl").vae, torch.zeros(1, 4, 8, 8)) < 100
        True
    """
    import torch

    seen: list[float] = []
    handle = vae.decoder.conv_norm_out.register_forward_pre_hook(lambda m, a: seen.append(float(a[0].abs().max())))
    try:
        with torch.no_grad():
            vae.decode(latents.to(vae.dtype))
    finally:
        handle.remove()
    return max(seen)


# --------------------------------------------------------------------------------------------- the rebuild


def _shape_pixels(size: int, draws: int) -> Any:
    """Every colour and shape, ``draws`` times each with another background and margin, as a [-1, 1] tensor."""
    import numpy as np
    import torch

    from .train.demo import COLORS, SHAPES, draw_shape

    images = [np.asarray(draw_shape(shape, rgb, size, seed=1000 + k * 97 + i * 7 + j))
              for k in range(draws) for i, rgb in enumerate(COLORS.values()) for j, shape in enumerate(SHAPES)]
    return torch.from_numpy(np.stack(images)).permute(0, 3, 1, 2).float() / 127.5 - 1


def _fit_vae(vae: Any, settings: dict[str, Any], resolution: int, seed: int, say: Any) -> dict[str, Any]:
    import torch

    pixels = _shape_pixels(resolution, settings["draws_per_shape"])
    generator = torch.Generator().manual_seed(seed)
    optimizer = torch.optim.Adam(vae.parameters(), lr=settings["learning_rate"])
    vae.train()
    losses = []
    for step in range(settings["steps"]):
        batch = pixels[torch.randperm(len(pixels), generator=generator)[: settings["batch_size"]]]
        dist = vae.encode(batch).latent_dist
        z = dist.mean + dist.std * torch.randn(dist.mean.shape, generator=generator)
        loss = torch.nn.functional.mse_loss(vae.decode(z).sample, batch) + settings["kl_weight"] * dist.kl().mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(float(loss.detach()))
        if step % 100 == 0 or step == settings["steps"] - 1:
            say(f"vae step {step + 1}/{settings['steps']}: loss {losses[-1]:.4f}")
    vae.eval()
    with torch.no_grad():
        latents = vae.encode(pixels).latent_dist.mean
        error = float((vae.decode(latents).sample - pixels).abs().mean())
    # SDXL's pipelines divide by scaling_factor before decoding: unit-spread latents are what the UNet trains on
    vae.register_to_config(scaling_factor=round(1 / float(latents.std()), 5))
    return {"loss_first": losses[0], "loss_last": losses[-1], "reconstruction_mean_abs": error,
            "scaling_factor": vae.config.scaling_factor}


def build(out: str | Path = FOLDER, say: Any = print, quiet: bool = False) -> dict[str, Any]:
    """Build the shapes model from scratch into ``out`` (default: the shipped folder) and return its record.

    Example:
        >>> build(tempfile.mkdtemp())["fingerprint"] == fingerprint()  # doctest: +SKIP
        True
    """
    import diffusers
    import torch
    import transformers

    from ..testing.pipelines import make_sdxl, save_pipeline
    from .train.demo import write_shapes
    from .train.loop import train
    from .train.settings import TrainSettings

    out, t, u = Path(out), TRAINING, TRAINING["unet"]
    threads = torch.get_num_threads()
    torch.set_num_threads(t["torch_threads"])
    start = time.perf_counter()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            pipe = make_sdxl(SPEC, seed=t["seed"])
            torch.manual_seed(t["seed"])
            vae_record = _fit_vae(pipe.vae, t["vae"], t["resolution"], t["seed"], say)
            base = save_pipeline(pipe, work / "base")
            data = write_shapes(work / "shapes", t["resolution"])
            torch.manual_seed(t["seed"])
            result = train(TrainSettings(model=str(base), data=str(data), out=str(work / "run"), method=u["method"],
                                         steps=u["steps"], batch_size=u["batch_size"], learning_rate=u["learning_rate"],
                                         resolution=t["resolution"], device="cpu", layout=u["layout"], seed=t["seed"],
                                         checkpoint_every=10 ** 9, save_dtype="float32", quiet=quiet))
            from diffusers import UNet2DConditionModel

            pipe.unet = UNet2DConditionModel.from_pretrained(str(work / "run" / "unet"))
            probe = pipe.vae.encode(_shape_pixels(t["resolution"], 1)).latent_dist.mean
            peak = decoder_peak(pipe.vae, probe)
            amplify_decoder(pipe.vae)
            losses = [result.losses[k] for k in sorted(result.losses)]
            tenth = max(1, len(losses) // 10)
            record = {"fingerprint": fingerprint(), "spec": SPEC, "training": t, "amplify": AMPLIFY,
                      "builder": BUILDER_VERSION, "vae": vae_record,
                      "unet": {"loss_first_tenth": sum(losses[:tenth]) / tenth,
                               "loss_last_tenth": sum(losses[-tenth:]) / tenth},
                      "decoder_peak": {"before": peak, "after": decoder_peak(pipe.vae, probe),
                                       "float16_max": float(torch.finfo(torch.float16).max)},
                      "prompts": list(PROMPTS), "seconds": round(time.perf_counter() - start, 1),
                      "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                                   "transformers": transformers.__version__},
                      "command": "python scripts/build_shapes_model.py"}
            staged = save_pipeline(pipe, work / "staged")
            (staged / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
            if out.exists():
                shutil.rmtree(out)
            shutil.copytree(staged, out)
    finally:
        torch.set_num_threads(threads)
    return record
