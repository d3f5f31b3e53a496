"""default_call: the smallest call that runs every component of a pipeline once, for check to record."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RecipeError
from ..recipe.catalog import shipped_sizes, shipped_value, shipped_video
from .steps import call_params, fewest_steps, schedulable, steps_problem

if TYPE_CHECKING:
    from torch import nn

__all__ = ["default_call", "pipeline_modules", "call_params", "schedulable", "steps_problem", "needed_inputs", "call_inputs",
           "frames_argument", "fitted_to_area", "sized_inputs", "default_negative_prompt", "size_refused", "call_defaults", "taken"]

# The names a video pipeline's __call__ takes its frame count by: num_frames (most), video_length (Latte), frames
# (Sana-Video, pipeline_sana_video.py:725). Every command that sets a frame count asks frames_argument, so a pipeline
# that spells it differently is not taken for an image pipeline.
FRAME_ARGS = ("num_frames", "video_length", "frames")


def frames_argument(params: Any) -> str | None:
    """The argument of a pipeline's ``__call__`` (``params``: its parameter names) that takes the frame count, or
    ``None`` for a pipeline that takes none (an image pipeline, or video-to-video whose frames come from its clip).

    Example:
        >>> frames_argument(["prompt", "num_frames"]), frames_argument({"video_length": 16}), frames_argument(["prompt"])
        ('num_frames', 'video_length', None)
        >>> import inspect, diffusers
        >>> frames_argument(inspect.signature(diffusers.SanaVideoPipeline.__call__).parameters)
        'frames'
    """
    return next((a for a in FRAME_ARGS if a in params), None)


def fitted_to_area(params: Mapping[str, Any], size: tuple[int | None, int | None], image: Any) -> dict[str, Any]:
    """Flux Kontext's kwargs that make the asked size the size run: it fits its output to ``max_area`` (1024**2) and
    resizes its input to ~1 MP unless ``_auto_resize=False`` (diffusers 0.42.1 pipeline_flux_kontext.py:846, :938), so
    ``--height 32 --width 32`` ran at 1024; the image is given at the asked size instead. Empty without a full size.

    Example:
        >>> from PIL import Image
        >>> params = {"image": None, "max_area": None, "_auto_resize": None}
        >>> kw = fitted_to_area(params, (32, 48), Image.new("RGB", (640, 480)))
        >>> kw["max_area"], kw["image"].size, kw["_auto_resize"]
        (1536, (48, 32), False)
        >>> fitted_to_area(params, (None, None), None)
        {}
    """
    from PIL import Image

    height, width = size
    if not (height and width) or "max_area" not in params:
        return {}
    kwargs: dict[str, Any] = {"max_area": height * width}
    if "_auto_resize" in params and isinstance(image, Image.Image):
        kwargs.update(image=image.resize((width, height)), _auto_resize=False)
    return kwargs


def sized_inputs(params: Any, inputs: dict[str, Any], size: tuple[int | None, int | None]) -> dict[str, Any]:
    """``inputs`` (``image``, ``mask_image``) resized to ``size`` (height, width) where the call takes no height and width
    (SD/SDXL img2img make the input's size), so the size asked is the size made. Unchanged without a full size.

    Example:
        >>> from PIL import Image
        >>> out = sized_inputs({"image": None}, {"image": Image.new("RGB", (64, 48)), "strength": 0.5}, (32, 40))
        >>> out["image"].size, out["strength"]
        ((40, 32), 0.5)
        >>> sized_inputs({"image": None, "height": None, "width": None}, {"image": 1}, (32, 40))
        {'image': 1}
    """
    height, width = size
    if not (height and width) or ("height" in params and "width" in params):
        return dict(inputs)
    return {k: v.resize((width, height)) if k in ("image", "mask_image") and hasattr(v, "resize") else v
            for k, v in inputs.items()}


def pipeline_modules(pipe: Any) -> dict[str, nn.Module]:
    """The components of a diffusers pipeline that are torch modules, or a RecipeError for anything else."""
    import torch

    comps = getattr(pipe, "components", None)
    if not isinstance(comps, Mapping):
        raise RecipeError(f"check: expected a diffusers pipeline (an object with a `components` mapping), "
                          f"got {type(pipe).__name__}")
    return {k: v for k, v in comps.items() if isinstance(v, torch.nn.Module)}


def _denoiser_name(pipe: Any) -> str | None:
    """The denoiser the recipe names (applied, or the one covering this pipeline class), else the largest model."""
    from ..recipe.catalog import pipeline_spec, recipe_classes
    from ..runtime.apply import applied

    record = applied(pipe)
    if record is not None and record.recipe.denoiser:
        return record.recipe.denoiser
    shipped = recipe_classes().get(type(pipe).__name__)
    if shipped is not None:
        return pipeline_spec(shipped).get("denoiser")
    comps = pipeline_modules(pipe)
    return max(comps, key=lambda n: sum(p.numel() for p in comps[n].parameters()), default=None)


def _denoiser_config(pipe: Any) -> Mapping[str, Any]:
    """The config of the denoiser :func:`_denoiser_name` finds; empty when there is none."""
    config = getattr(getattr(pipe, _denoiser_name(pipe) or "", None), "config", None)
    return config if isinstance(config, Mapping) else {}


def _spatial_patch(patch: Any) -> int:
    """The spatial side of a denoiser's ``patch_size``: an int, or the last two of a (frames, height, width) list.

    Example:
        >>> _spatial_patch(2), _spatial_patch([1, 2, 2]), _spatial_patch((1, 4, 2))
        (2, 2, 4)
    """
    if isinstance(patch, (list, tuple)):  # video transformers (Wan): [t, h, w]; an image one may write [h, w]
        return max((int(p) for p in patch[-2:]), default=1)
    return int(patch)


def _side(pipe: Any) -> int:
    """The smallest image side that runs every level of the denoiser: VAE factor x its downsampling x 2, >= 32."""
    vae_factor = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    config = _denoiser_config(pipe)
    blocks, patch = config.get("block_out_channels"), config.get("patch_size")
    down = 2 ** (len(blocks) - 1) if blocks else 1
    if patch:
        down = max(down, _spatial_patch(patch))
    side = max(32, vae_factor * down * 2)
    return -(-side // 16) * 16


def _fewest_steps(pipe: Any) -> int:
    """1, or 2 for a pipeline whose ``__call__`` treats a 1-step run apart or whose scheduler cannot take 1 step
    (:func:`schedulable`): pipeline_pixart_alpha.py:953 (diffusers 0.42) takes ``scheduler.step(...)[1]`` at one step,
    an IndexError with its own DPM-Solver. Read from the source, naming no class.
    """
    from ..runtime.patches import upstream_source

    if "num_inference_steps == 1" in (upstream_source(type(pipe).__call__) or ""):
        return 2
    return 1 if schedulable(getattr(pipe, "scheduler", None)) else 2


# The __call__ arguments diffusers pipelines take for an input they cannot run without (img2img and upscale's image,
# inpainting's mask, ControlNet's control image or frames, Stable Cascade decoder's prior embeddings, video-to-video's
# clip); optional extras such as ip_adapter_image, or Stable Cascade prior's image variation `images`, are not among
# them. Their defaults are None either way, so the signature cannot tell.
INPUTS = ("image", "mask_image", "control_image", "conditioning_frames", "image_embeddings", "video")
# Of those, the ones a pipeline may document as *optional* and then run without: LTX condition's image and video
# (text-to-video without them), Wan VACE's video. AnimateDiff ControlNet documents its conditioning_frames optional
# too, and fails without them, so the others are needed whatever the docstring says.
MAY_BE_OPTIONAL = ("image", "video")
# Arguments without a default the command line gives itself
GIVEN = ("self", "prompt", "class_labels")


def _documented_optional(cls: Any, name: str) -> bool:
    """Whether ``cls.__call__``'s docstring marks the argument ``name`` as *optional*, as diffusers writes it."""
    import re

    found = re.search(rf"^\s+{re.escape(name)} \((.*)$", inspect.getdoc(cls.__call__) or "", re.M)
    return bool(found and "*optional*" in found.group(1))


def needed_inputs(model: Any) -> tuple[str, list[str]]:
    """(pipeline class, the input arguments besides a prompt its ``__call__`` needs), from ``model_index.json`` alone.

    ``("", [])`` when the model cannot be located here or its class is not diffusers' (loading reports that).

    Example:
        >>> import json, tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> _ = (folder / "model_index.json").write_text(json.dumps({"_class_name": "StableDiffusionInpaintPipeline"}))
        >>> needed_inputs(folder)
        ('StableDiffusionInpaintPipeline', ['image', 'mask_image'])
        >>> _ = (folder / "model_index.json").write_text(json.dumps({"_class_name": "CogVideoXVideoToVideoPipeline"}))
        >>> needed_inputs(folder)
        ('CogVideoXVideoToVideoPipeline', ['video'])
    """
    from ..runtime.source import locate

    try:
        _, index, _ = locate(model)
    except RecipeError:
        return "", []
    import diffusers

    name = str(index.get("_class_name", ""))
    return name, call_inputs(getattr(diffusers, name, None))


def _example_runs_without(cls: Any, name: str) -> bool:
    """Whether the ``Examples:`` of ``cls.__call__``'s docstring call the pipeline, never giving it ``name``: FLUX.2
    documents no reference image as optional, and its own example generates from a prompt alone."""
    import re

    doc = inspect.getdoc(cls.__call__) or ""
    examples = doc.split("Examples:", 1)[1] if "Examples:" in doc else ""
    calls = re.findall(r"\bpipe(?:line)?\((.*?)\)\.(?:images|frames)", examples, re.S)
    return bool(calls) and not any(re.search(rf"\b{re.escape(name)}\b", call) for call in calls)


def _optional(cls: Any, params: Mapping[str, Any], name: str) -> bool:
    if name not in MAY_BE_OPTIONAL:
        return False
    defaulted = params[name].default is None
    return _documented_optional(cls, name) or (defaulted and _example_runs_without(cls, name))


def call_inputs(cls: Any) -> list[str]:
    """The input arguments besides a prompt (and DiT's class labels) a pipeline class's ``__call__`` needs.

    Example:
        >>> from diffusers import LTXConditionPipeline, WanAnimatePipeline, WanVACEPipeline
        >>> call_inputs(WanAnimatePipeline), call_inputs(WanVACEPipeline), call_inputs(LTXConditionPipeline)
        (['image', 'pose_video', 'face_video'], [], [])
        >>> from diffusers import Flux2KleinPipeline, FluxKontextPipeline
        >>> call_inputs(Flux2KleinPipeline), call_inputs(FluxKontextPipeline)  # an example without image; one with
        ([], ['image'])
        >>> from diffusers import HunyuanImageRefinerPipeline  # documented optional; its recipe's call_needs
        >>> call_inputs(HunyuanImageRefinerPipeline)
        ['image']
    """
    params = call_params(cls)
    needed = [k for k in INPUTS if k in params and (not _optional(cls, params, k) or k in _recipe_needs(cls))]
    # anything else the call cannot go without: Wan Animate's pose_video and face_video, Kandinsky's image_embeds
    return needed + [k for k, p in params.items() if k not in (*GIVEN, *needed) and p.default is p.empty
                     and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def _recipe_needs(cls: Any) -> list[str]:
    """The ``call_needs:`` of the shipped recipe that lists ``cls``: inputs documented *optional* that its call
    cannot run without (the HunyuanImage refiner's image)."""
    return list(shipped_value(cls, "call_needs")[1] or ())


def size_refused(cls: Any, height: int | None, width: int | None) -> str | None:
    """Why ``height`` x ``width`` is refused for pipeline class ``cls`` (a class or its name), or None: the shipped
    recipe listing it gives the only ``sizes:`` its call makes (Kandinsky 5 Image), and its call would swap another
    for the listed one of closest aspect ratio. A side not given is the call's default. Read before loading.

    Example:
        >>> size_refused("Kandinsky5T2IPipeline", 1408, 640) is None, size_refused("FluxPipeline", 40, 40) is None
        (True, True)
        >>> print(size_refused("Kandinsky5T2IPipeline", 512, 512))  # doctest: +ELLIPSIS
        --height 512 --width 512: Kandinsky5T2IPipeline makes only 1024x1024, 640x1408, ... (width x height; ...
    """
    name = cls if isinstance(cls, str) else getattr(cls, "__name__", "")
    recipe, sizes = shipped_sizes(name)  # (height, width)
    if not sizes or (height is None and width is None):
        return None
    if height is None or width is None:  # the call's default for the side not given
        params = call_params(cls)
        default = {k: getattr(params.get(k), "default", None) for k in ("height", "width")}
        height = height if height is not None else default["height"]
        width = width if width is not None else default["width"]
    if not (isinstance(height, int) and isinstance(width, int)) or (height, width) in sizes:
        return None
    # the one the call would make instead (closest aspect ratio, pipeline_kandinsky_t2i.py:628-631)
    h, w = min(sizes, key=lambda s: abs(s[1] / s[0] - width / height))
    return (f"--height {height} --width {width}: {name} makes only {', '.join(f'{b}x{a}' for a, b in sizes)} "
            f"(width x height; its call swaps any other for the listed one of closest aspect ratio, recipe "
            f"{recipe} sizes:); ask for one, e.g. --height {h} --width {w}")


def _frames(pipe: Any, config: Mapping[str, Any]) -> int:
    """The fewest frames a video pipeline takes: ``t*(n-1)+1`` for its VAE's temporal factor t and the fewest latent
    count n above 1 its recipe does not refuse (:func:`~hf_precision.recipe.frames.nearest_latent_frames`), a Latte
    denoiser's fixed ``video_length`` (``config``), else 2 (a frame-wise VAE: SVD, AnimateDiff).
    """
    if config.get("video_length"):
        return int(config["video_length"])
    for attr in ("vae_scale_factor_temporal", "vae_temporal_compression_ratio", "vae_temporal_scale_factor"):
        t = getattr(pipe, attr, None)
        if isinstance(t, int) and t > 1:
            from ..recipe.frames import nearest_latent_frames

            latent = nearest_latent_frames(1, shipped_video(type(pipe)).get("refused_latent_frames") or ())[1]
            return t * (latent - 1) + 1
    return 2


def _text_length(pipe: Any) -> int:
    """The prompt tokens of the default call: 16, or the length the denoiser's position table was built for
    (CogVideoX's ``max_text_seq_length``: its joint table holds that many text positions, and another length fails
    inside diffusers; ``hf-precision video`` and ``calibrate`` pass it too)."""
    return int(_denoiser_config(pipe).get("max_text_seq_length") or 16)


def _video_kwargs(pipe: Any, params: Mapping[str, Any], kwargs: Mapping[str, Any],
                  image: Callable[..., Any]) -> dict[str, Any]:
    """What a video pipeline needs beside the prompt: few frames, an input clip (video-to-video, VACE: ``video`` and
    ``mask``; AnimateDiff ControlNet: ``conditioning_frames``; Wan Animate: ``pose_video`` and ``face_video``, one
    segment of them), and the size a learned position table fixes."""
    # Wan Animate: the frames of one segment
    frames_arg = frames_argument(params) or ("segment_frame_length" if "segment_frame_length" in params else None)
    # an input clip: video-to-video's, ControlNet's, and any clip the call cannot go without (Wan Animate's pose and
    # face videos)
    clip_args = [a for a, p in params.items() if a in ("video", "conditioning_frames")
                 or (a.endswith("_video") and p.default is inspect.Parameter.empty)]
    if frames_arg is None and not clip_args:
        return {}
    config = _denoiser_config(pipe)
    frames = int(kwargs.get(frames_arg, 0) or _frames(pipe, config)) if frames_arg else _frames(pipe, config)
    extra: dict[str, Any] = {frames_arg: frames} if frames_arg else {}
    for arg in clip_args:
        extra[arg] = [image((40 * i % 256, 90, 60)) for i in range(frames)]
    if "mask" in params and "video" in params:
        extra["mask"] = [image((255, 255, 255)).convert("L") for _ in range(frames)]
    if "strength" in params and "video" in params:
        extra["strength"] = 1.0
    spatial = getattr(pipe, "vae_scale_factor_spatial", None)
    if config.get("use_learned_positional_embeddings") and config.get("sample_height") and spatial:
        # pipeline_cogvideox_image2video.py refuses any other size when the positions are learned
        extra.update(height=int(config["sample_height"]) * spatial, width=int(config["sample_width"]) * spatial)
    return extra


def default_negative_prompt(pipe: Any) -> str | None:
    """The negative prompt a command passes when none is given: the shipped recipe's ``video.negative_prompt`` for the
    class, else None. EasyAnimate's call iterates a None one under guidance (diffusers v0.42.1
    pipeline_easyanimate.py:347-362: TypeError), so its recipe gives ''.

    Example:
        >>> from types import SimpleNamespace
        >>> default_negative_prompt(type("EasyAnimatePipeline", (), {})()), default_negative_prompt(SimpleNamespace())
        ('', None)
    """
    return shipped_video(type(pipe)).get("negative_prompt")


def taken(params: Mapping[str, Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The ``kwargs`` a call with ``params`` (:func:`call_params`) takes: every one where it takes ``**kwargs`` or its
    parameters are unknown, else those it names (SD upscale's call has no height or width: it makes its input's size).

    Example:
        >>> import inspect
        >>> taken(inspect.signature(lambda prompt, image=None: 0).parameters, {"image": 1, "height": 8})
        {'image': 1}
        >>> taken(inspect.signature(lambda prompt, **kw: 0).parameters, {"height": 8})
        {'height': 8}
    """
    if not params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return dict(kwargs)
    return {k: v for k, v in kwargs.items() if k in params}


def call_defaults(pipe: Any) -> dict[str, Any]:
    """What a call of ``pipe`` needs beside its inputs, though its signature defaults it: the recipe's
    ``video.default_call_args`` and ``negative_prompt`` (EasyAnimate's chat template fails on None), binning off (the
    size asked is the size made; PixArt's table fails on another sample_size), ``clean_caption`` off and
    ``clip_skip=None`` (I2VGen-XL's default 1 reads ``text_encoder.text_model``, gone from transformers 5's CLIP).
    Used by ``check``'s default call and by training's validation.

    Example:
        >>> from diffusers import PixArtAlphaPipeline
        >>> call_defaults(PixArtAlphaPipeline)
        {'use_resolution_binning': False, 'clean_caption': False}
    """
    params = call_params(pipe)
    video = shipped_video(pipe if isinstance(pipe, type) else type(pipe))
    kwargs = dict(video.get("default_call_args") or {})
    for key, value in (("use_resolution_binning", False), ("clean_caption", False), ("clip_skip", None)):
        if key in params:
            kwargs[key] = value
    negative = video.get("negative_prompt") if "negative_prompt" in params else None
    if negative is not None:
        kwargs["negative_prompt"] = negative
    return kwargs


def default_call(pipe: Any, inputs: Mapping[str, Any] | None = None) -> Callable[[Any], Any]:
    """The smallest call that runs every component of a known pipeline once: 1 step, a few pixels, fixed seed.

    A prompt (``"check"``), else SVD's small image and 2 frames, else DiT's ``class_labels=[1]``; img2img and inpainting
    get an image (and mask) at ``strength=1``, video the fewest frames their VAE takes and an input clip where they take
    one; numpy output; 2 steps where 1 cannot run (:func:`_fewest_steps`). ``inputs`` (a user's ``image``,
    ``mask_image``, ``strength``: :func:`~hf_precision.diagnose.inputs.image_inputs`) replace the made-up ones, and a
    ``strength`` below 1 gets the fewest steps it denoises one of (SD img2img at 0.3: 4). RecipeError for a call that
    takes no prompt, image or class labels: pass ``call=lambda pipe: pipe(...)`` to :func:`check`.
    """
    import torch

    from ..runtime.patches import ftfy_stand_in, text_model_alias, tile_where_required

    # a pipeline without a recipe too (apply_recipe does both): Wan VACE's prompt, Allegro's VAE need them
    ftfy_stand_in(pipe)
    for module in pipeline_modules(pipe).values():
        tile_where_required(module)
        text_model_alias(module)  # I2VGenXL's clip_skip reads text_encoder.text_model (transformers 5 has none)
    params = call_params(pipe)
    side = _side(pipe)
    name = type(pipe).__name__

    def image(fill: tuple[int, int, int] = (120, 90, 60)) -> Any:
        from PIL import Image

        return Image.new("RGB", (side, side), fill)

    kwargs: dict[str, Any] = {"num_inference_steps": _fewest_steps(pipe), "output_type": "np"}
    if "class_labels" in params:
        kwargs["class_labels"] = [1]
    elif "image" in params and "prompt" not in params:  # image-to-video (SVD), image variation
        kwargs.update(image=image(), num_frames=2, decode_chunk_size=1)
    elif "prompt" in params:
        kwargs["prompt"] = "check"
        # FLUX.2's reference image is optional (call_inputs), and refused below 64 pixels: text-to-image without it
        if "image" in call_inputs(type(pipe)) or ("image" in params and _documented_optional(type(pipe), "image")):
            kwargs["image"] = image()
        if "mask_image" in params:
            kwargs["mask_image"] = image((255, 255, 255))
        if "control_image" in params:  # ControlNet pipelines (Flux's, SD3's, HunyuanDiT's ...)
            kwargs["control_image"] = image((200, 200, 200))
        if "strength" in params:
            kwargs["strength"] = 1.0
    else:
        raise RecipeError(f"check: no default call for {name} (its __call__ takes no prompt, image or class_labels); "
                          f"pass one: hf_precision.check(pipe, call=lambda pipe: pipe(...))")
    if "image_embeddings" in params:  # Stable Cascade decoder: the prior's output, its size sets the latents'
        channels = _denoiser_config(pipe).get("effnet_in_channels")
        if channels:
            kwargs["image_embeddings"] = torch.zeros(1, int(channels), 4, 4)
    if "height" in params and "width" in params:
        kwargs.update(height=side, width=side)
    kwargs.update(_video_kwargs(pipe, params, kwargs, image))
    # what the call cannot go without though its signature defaults it (the recipe's video.default_call_args)
    kwargs.update(call_defaults(pipe))
    if "max_sequence_length" in params:
        kwargs["max_sequence_length"] = _text_length(pipe)
    if inputs:  # the user's pictures at the tiny call's size (img2img without height/width makes its input's)
        kwargs.update(sized_inputs(params, dict(inputs), (side, side)))
        strength = kwargs.get("strength")  # a user's strength below 1: the fewest steps it denoises one of
        if isinstance(strength, float):
            steps = kwargs["num_inference_steps"]
            kwargs["num_inference_steps"] = fewest_steps(type(pipe), steps, strength) or steps
    kwargs.update(fitted_to_area(params, (side, side), kwargs.get("image")))  # Flux Kontext: the tiny call's size
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = taken(params, kwargs)

    def run(p: Any) -> Any:
        if "generator" in params or accepts_any:
            return p(**kwargs, generator=torch.Generator("cpu").manual_seed(0))
        return p(**kwargs)

    def call(p: Any) -> Any:
        try:
            return run(p)
        except ZeroDivisionError:
            # a pipeline's own sigma schedule that cannot make 1 step (Mochi's linear_quadratic_schedule divides by
            # num_steps // 2, pipeline_mochi.py:67), where the scheduler asked by _fewest_steps could: 2 steps
            if kwargs.get("num_inference_steps") != 1:
                raise
            kwargs["num_inference_steps"] = 2
            return run(p)

    call.kwargs = kwargs  # type: ignore[attr-defined]
    return call
