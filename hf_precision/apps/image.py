"""One picture through the loader, for users who have weights: ``hf-precision generate`` (text-to-image,
image-to-image, edit and inpainting pipelines)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import RecipeError
from .outputs import check_output, written_atomically

__all__ = ["generate"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")


def generate(model: str, prompt: str, out: str | Path, *, device: Any = None, steps: int = 30, height: int | None = None,
             width: int | None = None, guidance: float | None = None, negative_prompt: str | None = None, seed: int = 0,
             recipe: str | None = None, overrides: Any = None, force: bool = False, layout: Any = None,
             max_memory: str | int | None = None, say: Any = None, base: str | None = None, image: Any = None,
             mask: Any = None, strength: float | None = None) -> Path:
    """Generate one image with a pipeline loaded through :func:`hf_precision.load_pipeline`: text-to-image, with
    ``image`` (a file or PIL picture) image-to-image and edit, with ``mask`` too inpainting (white where it repaints).

    The image is written to a temporary file next to ``out`` and renamed, so a failed run leaves nothing behind.
    ``out`` and the inputs the call needs or takes (:func:`~hf_precision.diagnose.inputs.image_inputs`) are checked
    before the model loads. An img2img call that takes no ``height``/``width`` (SD, SDXL) gets its input resized to
    them. ``recipe``, ``force``, ``device``, ``layout`` and ``base`` are ``load_pipeline``'s; ``max_memory`` (bytes or
    ``"12GB"``) lets :func:`~hf_precision.apps.image_plan.choose_image_layout` pick offload and quantized storage that
    fit, and ``say`` gets the line saying what it chose.

    Example:
        >>> import tempfile
        >>> from hf_precision.testing.pipelines import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> generate(str(folder), "a cat", Path(tempfile.mkdtemp()) / "cat.png", device="cpu", steps=2,
        ...          height=32, width=32).suffix
        '.png'
    """
    import torch

    from ..diagnose.call import steps_problem
    from ..runtime.load import load_pipeline
    from ..runtime.progress import quiet_call

    out = check_output(out, suffixes=IMAGE_SUFFIXES, create_parents=True, what="image")
    inputs = _inputs_before_loading(model, base, steps, (height, width), image, mask, strength)
    offload = False
    if max_memory is not None:
        from .image_plan import choose_image_layout
        from ..recipe.overrides import as_list
        from ..units import parse_size

        budget = parse_size(max_memory) if isinstance(max_memory, str) else int(max_memory)
        choice = choose_image_layout(model, layout or device or "cpu", budget, overrides=overrides)
        (say or (lambda _: None))(f"memory plan: {choice.describe()}")
        if choice.quantize:
            overrides = [*as_list(overrides), choice.overrides()]
        offload = choice.offload == "model"
    # offloaded: resolved for the device, loaded on the CPU; the hooks move each component onto it when it runs
    pipe = load_pipeline(model, "cpu" if offload else device, recipe=recipe, overrides=overrides, force=force,
                         layout=layout or (str(device) if offload else None), base=base)
    if offload:
        pipe.enable_model_cpu_offload(device=device)
    # the loaded scheduler (LTX-style shift_terminal cannot take 1 step); a single file's class is known only now
    problem = steps_problem(pipe, steps, inputs.kwargs.get("strength"))
    if problem:
        raise RecipeError(problem)
    call = _call_kwargs(model, pipe, inputs.kwargs, prompt=prompt, steps=steps, size=(height, width),
                        guidance=guidance, negative_prompt=negative_prompt)
    result = pipe(**quiet_call(pipe, call), generator=torch.Generator("cpu").manual_seed(seed))
    pictures = output_pictures(result)
    if pictures is None:  # a prior (Stable Cascade's) returns embeddings for another pipeline
        raise RecipeError(f"{model}: {type(pipe).__name__} returns {type(result).__name__}, not images; generate "
                          f"writes the picture of a text-to-image pipeline: run its decoder pipeline on the output")
    picture = pictures[0]
    asked = (width or picture.size[0], height or picture.size[1])
    if say is not None and picture.size != asked:
        # a pipeline that picks its own size (Kandinsky 5 Image snaps to its fixed list, pipeline_kandinsky_t2i.py:628-631)
        say(f"note: {type(pipe).__name__} made a {picture.size[0]}x{picture.size[1]} picture, not the asked "
            f"{asked[0]}x{asked[1]}: the pipeline chooses its output size itself")
    with written_atomically(out) as tmp:
        picture.save(tmp)
    return out


def output_pictures(result: Any) -> Any:
    """The pictures of a text-to-image pipeline's output: ``images``, or ``image`` where the output class names it so
    (Kandinsky 5 Image's KandinskyImagePipelineOutput, diffusers v0.42.1 pipelines/kandinsky5/pipeline_output.py);
    None for an output without pictures (a prior's embeddings).

    Example:
        >>> from types import SimpleNamespace
        >>> output_pictures(SimpleNamespace(image=[1])), output_pictures(SimpleNamespace(image_embeds=[1]))
        ([1], None)
    """
    pictures = getattr(result, "images", None)
    return pictures if pictures is not None else getattr(result, "image", None)


def _inputs_before_loading(model: str, base: str | None, steps: int, size: tuple[int | None, int | None],
                           image: Any, mask: Any, strength: float | None) -> Any:
    """The checks made before any weight is read: steps, size, and the inputs the pipeline's call needs, from the
    ``model_index.json`` of ``model`` (of ``base`` for a single file, whose folder gives the pipeline class)."""
    from ..diagnose.call import call_params, frames_argument, needed_inputs, size_refused
    from ..diagnose.inputs import image_inputs

    if steps < 1:
        raise RecipeError(f"--steps {steps}: must be at least 1")
    for name, value in zip(("height", "width"), size):
        if value is not None and (value <= 0 or value % 8):
            raise RecipeError(f"--{name} {value}: must be a positive multiple of 8 (e.g. {max(8, round((value or 8) / 8) * 8)})")
    pipeline = needed_inputs(model if base is None else base)[0]
    refused = size_refused(pipeline, *size)
    if refused:
        raise RecipeError(refused)
    if pipeline and frames_argument(call_params(pipeline)):  # before its image is asked
        raise RecipeError(f"{model}: {pipeline} makes videos, not a picture; use `hf-precision video --model {model}`")
    inputs = image_inputs(model if base is None else base, image=image, mask=mask, strength=strength, steps=steps)
    if inputs.others:  # ControlNet's control image, Kandinsky's image embeddings: no flag gives them
        others = inputs.others
        raise RecipeError(f"{model}: {inputs.pipeline} needs {' and '.join(others)} besides the prompt, which generate "
                          f"cannot give; call it in Python (pipe = hp.load_pipeline({str(model)!r}, device); "
                          f"pipe(prompt=..., {others[0]}=...)) or run `hf-precision check {model}`")
    return inputs


def _call_kwargs(model: str, pipe: Any, inputs: dict[str, Any], *, prompt: str, steps: int,
                 size: tuple[int | None, int | None], guidance: float | None,
                 negative_prompt: str | None) -> dict[str, Any]:
    """The kwargs of generate's call: the prompt and the flags the pipeline's ``__call__`` takes, the input pictures
    at the asked size; a pipeline that takes no prompt is refused with the command or call that runs it."""
    from ..diagnose.call import call_params, fitted_to_area, frames_argument, sized_inputs

    params = call_params(pipe)
    if "prompt" not in params:  # the fix: the video command for a video pipeline (SVD), else the call's own inputs
        takes = [k for k, p in params.items() if p.default is p.empty and k != "self"] or ["..."]
        fix = ("use `hf-precision video`" if frames_argument(params) else
               f"call it in Python (pipe = hp.load_pipeline({str(model)!r}, device); pipe({takes[0]}=...)) or run "
               f"`hf-precision check {model}`")
        raise RecipeError(f"{model}: {type(pipe).__name__} is not a text-to-image pipeline (it takes no prompt); {fix}")
    height, width = size
    kwargs: dict[str, Any] = {"prompt": prompt, "num_inference_steps": steps}
    for key, value in (("height", height), ("width", width), ("guidance_scale", guidance),
                       ("negative_prompt", negative_prompt)):
        if value is not None:
            kwargs[key] = value
    if height or width:  # the size asked is the size made: PixArt's binning would swap it for a table's, or fail
        kwargs["use_resolution_binning"] = False
    kwargs.update(sized_inputs(params, inputs, size))
    kwargs.update(fitted_to_area(params, size, kwargs.get("image")))  # Kontext: its area rule at the asked size
    return {k: v for k, v in kwargs.items() if k in params or k in ("prompt", "num_inference_steps")}
