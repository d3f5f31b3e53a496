"""The image encoder's embedding of a training sample's conditioning frame (a clip's first), as its pipeline makes
it at inference: Wan 2.1 I2V's CLIP vision ``hidden_states[-2]``, SVD's CLIP image embeds, FramePack's SigLIP states.
The row's ``image_encode`` (recipes/denoisers.yaml: pipeline class -> [method, pil | pixels]) names the pipeline's
own method, so its image processor, resizing and hidden-state layer are the ones sampling uses.
"""

from __future__ import annotations

from typing import Any

import torch

from ..diagnose.steps import call_params
from .inputs.registry import config_value
from .pipeline_methods import required_params, without_guidance
from .rules import TrainingError

__all__ = ["IMAGE_KEY", "check_batch", "image_width", "image_encode_of", "encode_image_embeds", "pil_frames"]

IMAGE_KEY = "image_embeds"  # the batch key (a row's cond or optional reads it)
_FILLED = {"num_videos_per_prompt": 1, "num_images_per_prompt": 1, "do_classifier_free_guidance": False,
           "batch_size": 1}


def image_width(row: Any, module: Any) -> int | None:
    """The width of the image embedding ``module`` takes, None where it takes none (Wan T2V: image_dim null).

    Example:
        >>> from types import SimpleNamespace
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> row = ROWS["WanTransformer3DModel"]
        >>> image_width(row, SimpleNamespace(config={"image_dim": 16})), image_width(row, SimpleNamespace(config={}))
        (16, None)
    """
    key = row.text_dims.get(IMAGE_KEY) if IMAGE_KEY in row.cond else None
    for batch_key, shape in row.optional.values():
        if key is None and batch_key == IMAGE_KEY and shape.startswith("token@"):
            key = shape.partition("@")[2]
    value = config_value(getattr(module, "config", {}) or {}, key) if key else None
    return int(value) if value else None


def image_encode_of(row: Any, module: Any, pipe: Any) -> tuple[str, str] | None:
    """The row's ``image_encode`` entry ([method, input]) for ``pipe`` (instance or class) where the denoiser takes an
    image embedding, else None. A pipeline the row names no method for is refused: training without the image tokens
    teaches the denoiser to ignore the image its pipeline gives.

    Example:
        >>> from types import SimpleNamespace
        >>> from diffusers import WanImageToVideoPipeline
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> image_encode_of(ROWS["WanTransformer3DModel"], SimpleNamespace(config={"image_dim": 16}),
        ...                 WanImageToVideoPipeline)
        ('encode_image', 'pil')
    """
    if not row.image_encode or not image_width(row, module):
        return None
    cls = pipe if isinstance(pipe, type) else type(pipe)
    for base in cls.__mro__ if pipe is not None else ():
        if base.__name__ in row.image_encode:
            method, form = row.image_encode[base.__name__]
            return str(method), str(form)
    name = type(getattr(module, "_orig_mod", module)).__name__
    what = cls.__name__ if pipe is not None else "a pipeline prepared from a dict of components"
    raise TrainingError(f"{what}: its denoiser ({name}) takes an image embedding ({IMAGE_KEY}), and the row names no "
                        f"pipeline method that encodes the conditioning image for this pipeline (known: "
                        f"{', '.join(sorted(row.image_encode))}); add [method, pil | pixels] for it to the row's "
                        f"image_encode in a denoisers YAML file, or give batch['{IMAGE_KEY}'] yourself")


def check_batch(row: Any, module: Any, batch: Any) -> None:
    """Refuse a training batch without the image embedding the denoiser takes (its config has the width, its row an
    ``image_encode``): without it Wan 2.1 I2V would train with no image tokens and SVD's UNet has no conditioning.

    Example:
        >>> from types import SimpleNamespace
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> check_batch(ROWS["WanTransformer3DModel"], SimpleNamespace(config={"image_dim": 16}), {})
        Traceback (most recent call last):
        ...
        hf_precision.training.rules.TrainingError: tp.loss(batch): SimpleNamespace takes an image embedding of width 16 (image_embeds) and the batch has none; add the pipeline's encoding of the conditioning frame: batch.update(tp.encode_condition(pixels, batch['latents']))
    """
    width = image_width(row, module) if row.image_encode else None
    if width and batch.get(IMAGE_KEY) is None:
        name = type(getattr(module, "_orig_mod", module)).__name__
        raise TrainingError(f"tp.loss(batch): {name} takes an image embedding of width {width} ({IMAGE_KEY}) and the "
                            f"batch has none; add the pipeline's encoding of the conditioning frame: "
                            f"batch.update(tp.encode_condition(pixels, batch['latents']))")


def pil_frames(pixels: torch.Tensor) -> list[Any]:
    """The conditioning frame of each sample of ``pixels`` (in [-1, 1]; a clip's first) as the PIL picture a user
    hands ``__call__``, made by the pipelines' own ``VaeImageProcessor.pt_to_numpy`` and ``numpy_to_pil``.

    Example:
        >>> [p.size for p in pil_frames(torch.zeros(2, 3, 5, 8, 6))]
        [(6, 8), (6, 8)]
    """
    from diffusers.image_processor import VaeImageProcessor

    frame = pixels[:, :, 0] if pixels.dim() == 5 else pixels
    return VaeImageProcessor.numpy_to_pil(VaeImageProcessor.pt_to_numpy((frame.float() / 2 + 0.5).clamp(0, 1)))


def encode_image_embeds(tp: Any, row: Any, pixels: torch.Tensor) -> dict[str, torch.Tensor]:
    """``{"image_embeds": ...}`` (float32): the row's ``image_encode`` method on ``pixels``' conditioning frames.

    Example:
        >>> import hf_precision as hp
        >>> from hf_precision.testing import make_pipeline
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> tp = hp.prepare_training(make_pipeline("svd"), device="cpu", train={"unet": "lora"}, rank=2)
        >>> row = ROWS["UNetSpatioTemporalConditionModel"]
        >>> tuple(encode_image_embeds(tp, row, torch.rand(2, 3, 3, 32, 32) * 2 - 1)["image_embeds"].shape)
        (2, 1, 8)
    """
    module = tp._denoiser()
    entry = image_encode_of(row, module, tp.pipe)
    if entry is None:
        return {}
    method, form = entry
    params = call_params(tp.pipe, method)
    frame = pixels[:, :, 0] if pixels.dim() == 5 else pixels
    image = next((k for k in ("image", "images") if k in params), next((k for k in params if k != "self"), "image"))
    kwargs = {image: frame if form == "pixels" else pil_frames(frame), "device": tp.device, **_FILLED}
    kwargs = {k: v for k, v in kwargs.items() if k in params}
    missing = required_params(params, {**kwargs, "self": None})
    if missing:
        raise TrainingError(f"{type(tp.pipe).__name__}.{method} needs {', '.join(missing)} besides the image; name "
                            f"another method in the row's image_encode, or give batch['{IMAGE_KEY}'] yourself")
    with torch.no_grad(), without_guidance(tp.pipe):
        out = getattr(tp.pipe, method)(**kwargs)
    out = out[0] if isinstance(out, (tuple, list)) else out  # Stable Cascade-like: (embeds, negative embeds)
    return {IMAGE_KEY: out.float()}
