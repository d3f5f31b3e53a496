"""The conditioning channels a denoiser takes beyond its latents (an inpainting mask, an image-to-video first frame)
and the batch entries a pipeline's builder makes (I2VGen-XL's image latents): how many, which registered builder
makes them, and the refusal of a batch that lacks them. Rows: :mod:`.denoiser_rows`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from . import inputs
from .inputs.registry import config_value
from .rules import TrainingError

Row = Any  # a hf_precision.training.denoiser_rows.DenoiserRow (imported there, not here: no cycle)

__all__ = ["built_keys", "check_built", "condition_channels", "condition_made", "condition_of", "latent_channels",
           "named_condition", "with_condition_latents"]


def latent_channels(row: Row, config: Mapping[str, Any]) -> int:
    # the VAE's channels, what the denoiser predicts. Packed 2x2: Flux gives out_channels packed (64, patch 1),
    # Qwen-Image unpacked (16, patch 2), out_channels x patch_size^2 either way. Kandinsky 5: *_visual_dim.
    in_c = int(config.get("in_channels") or config.get("in_visual_dim") or 0)
    out_c = int(config.get("out_channels") or config.get("out_visual_dim") or in_c)
    if row.pack in ("flux", "patch"):  # patch: ERNIE-Image's 2x2 patches into channels (out_channels = 4 x VAE's)
        return out_c * int(config.get("patch_size") or 1) ** 2 // 4
    return min(in_c, out_c)


def condition_channels(row: Row, module: torch.nn.Module) -> int:
    """How many channels the denoiser takes beyond the noisy latents (unpacked): inpainting's mask and masked image
    (SD 1 + 4), an image-to-video model's mask and first frame (Wan I2V 4 + 16, SVD 4), 0 for most.

    Example:
        >>> from hf_precision.training.denoiser_rows import row_of
        >>> from diffusers import UNet2DConditionModel
        >>> unet = UNet2DConditionModel(block_out_channels=(8, 8), layers_per_block=1, norm_num_groups=8,
        ...     cross_attention_dim=8, attention_head_dim=2, in_channels=9, out_channels=4,
        ...     down_block_types=("DownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "UpBlock2D"))
        >>> condition_channels(row_of(unet), unet)
        5
    """
    config = getattr(getattr(module, "_orig_mod", module), "config", {})
    want = int(config.get("in_channels") or 0) // (4 if row.pack in ("flux", "patch") else 1)
    if not want and config.get("visual_cond"):
        # Kandinsky 5 I2V: the noise, the image's latents and a 1-channel mask (2 * in_visual_dim + 1,
        # transformer_kandinsky.py:567; pipeline_kandinsky_i2v.py prepare_latents)
        want = 2 * int(config["in_visual_dim"]) + 1
    return max(0, want - latent_channels(row, config))


def condition_of(row: Row, module: torch.nn.Module, pipe: Any) -> str:
    """The condition builder (:data:`.inputs.CONDITIONS`) the row names for ``pipe``'s class, which makes the
    denoiser's extra channels; refused without one (zeros there would teach it to ignore its pipeline's input).

    Example:
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> from diffusers import StableDiffusionInpaintPipeline
        >>> condition_of(ROWS["UNet2DConditionModel"], None, StableDiffusionInpaintPipeline)
        'inpaint_mask'
    """
    named = named_condition(row, pipe)
    if named is not None:
        return named
    cls = pipe if isinstance(pipe, type) else type(pipe)
    name = type(getattr(module, "_orig_mod", module)).__name__
    # prepared from a dict of components there is no pipeline class to read the condition for
    what = "components given as a dict (no pipeline class)" if issubclass(cls, Mapping) else cls.__name__
    raise TrainingError(
        f"{what}: its denoiser ({name}) takes {condition_channels(row, module) if module is not None else 'more'}"
        f" conditioning channels beyond the latents, and no condition builder makes them for this pipeline (known: "
        f"{', '.join(sorted(row.condition)) or 'none'}); training with zeros there would teach it to ignore the "
        f"conditioning its pipeline gives at inference. Add the pipeline to the row's condition in a denoisers YAML "
        f"file (hf_precision.training.add_rows) with a builder registered by "
        f"@hf_precision.training.inputs.condition(name), or give batch['condition_latents'] yourself")


def condition_made(row: Row, module: torch.nn.Module, pipe: Any) -> str | None:
    """The condition builder the encode phase runs: :func:`condition_of`'s, else :func:`named_condition`'s.

    Example:
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> from diffusers import I2VGenXLPipeline
        >>> from types import SimpleNamespace
        >>> condition_made(ROWS["I2VGenXLUNet"], SimpleNamespace(config={"in_channels": 4}), I2VGenXLPipeline)
        'i2vgen_image'
        >>> condition_made(ROWS["I2VGenXLUNet"], SimpleNamespace(config={"in_channels": 4}), object) is None
        True
    """
    if condition_channels(row, module):
        return condition_of(row, module, pipe)
    return named_condition(row, pipe)


def named_condition(row: Row, pipe: Any) -> str | None:
    # the row's condition builder for the pipeline class or a base of it; None for none (or no pipeline)
    cls = pipe if isinstance(pipe, type) or pipe is None else type(pipe)
    return next((row.condition[c.__name__] for c in (cls.__mro__ if cls else ()) if c.__name__ in row.condition), None)


def built_keys(row: Row, module: torch.nn.Module, pipe: Any) -> list[str]:
    """The batch keys of the row's ``optional`` inputs that ``pipe``'s condition builder makes where the denoiser
    takes them as arguments, not channels (I2VGen-XL's ``image_latents``, ``image_embeds``), with a nonzero width.

    Example:
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> from diffusers import I2VGenXLPipeline
        >>> from types import SimpleNamespace
        >>> unet = SimpleNamespace(config={"in_channels": 4, "cross_attention_dim": 8})
        >>> built_keys(ROWS["I2VGenXLUNet"], unet, I2VGenXLPipeline), built_keys(ROWS["I2VGenXLUNet"], unet, object)
        (['image_latents', 'image_embeds'], [])
    """
    # FramePack's image latents: every sampling run gives them (row.prefix_frame), whatever made the pipeline
    prefix = [row.prefix_frame] if row.prefix_frame else []
    if condition_channels(row, module) or condition_made(row, module, pipe) is None:
        return prefix
    config = getattr(module, "config", {}) or {}
    return [key for key, shape in row.optional.values()
            if not shape.partition("@")[2] or config_value(config, shape.partition("@")[2])] + prefix


def check_built(row: Row, module: torch.nn.Module, pipe: Any, batch: Mapping[str, Any]) -> None:
    """Refuse a training batch without :func:`built_keys`: zeros there teach the model to ignore the image its
    pipeline always gives (pipeline_i2vgen_xl.py:640-656). A key given as None asks for the zeros on purpose.

    Example:
        >>> from hf_precision.training.denoiser_rows import ROWS
        >>> from diffusers import I2VGenXLPipeline
        >>> from types import SimpleNamespace
        >>> unet = SimpleNamespace(config={"in_channels": 4, "cross_attention_dim": 8})
        >>> check_built(ROWS["I2VGenXLUNet"], unet, I2VGenXLPipeline, {"image_latents": None, "image_embeds": None})
        >>> check_built(ROWS["I2VGenXLUNet"], unet, I2VGenXLPipeline, {"latents": 0})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.training.rules.TrainingError: tp.loss(batch): SimpleNamespace under I2VGenXLPipeline takes image_latents, image_embeds, which its pipeline builds from the input image, and the batch lacks them ...
    """
    missing = [key for key in built_keys(row, module, pipe) if key not in batch]
    if missing:
        name = type(getattr(module, "_orig_mod", module)).__name__
        what = pipe.__name__ if isinstance(pipe, type) else type(pipe).__name__
        raise TrainingError(f"tp.loss(batch): {name} under {what} takes {', '.join(missing)}, which its pipeline "
                            f"builds from the input image, and the batch lacks them (keys: {sorted(batch)}); "
                            f"add what the pipeline builds from the sample: batch.update(tp.encode_condition(pixels, "
                            f"batch['latents'])), or, for zeros on purpose (condition dropout), give each as None: "
                            f"{', '.join(f'batch[{k!r}] = None' for k in missing)}")


def with_condition_latents(row: Row, module: torch.nn.Module, noisy: torch.Tensor,
                             batch: Mapping[str, Any]) -> torch.Tensor:
    # Inpainting (SD: 4 + 1 mask + 4) and image-to-video (Wan I2V 16 + 20, SVD 4 + 4) concatenate conditioning
    # latents on the channel axis. Zeros only for the memory plan's meta call (noisy_inputs refuses such a batch).
    extra_channels = condition_channels(row, module)
    if not extra_channels:
        return noisy
    dim = inputs.channel_dim(row)
    extra = batch.get("condition_latents")
    if extra is None:
        shape = list(noisy.shape)
        shape[dim] = extra_channels
        return torch.cat([noisy, noisy.new_zeros(shape)], dim=dim)
    extra = inputs.model_layout(row, extra)
    if extra.shape[dim] != extra_channels or extra.shape[0] != noisy.shape[0]:
        raise TrainingError(f"batch['condition_latents'] has shape {tuple(extra.shape)} in the denoiser's layout; "
                            f"the denoiser takes {extra_channels} conditioning channels on axis {dim} for "
                            f"{noisy.shape[0]} sample(s) of latents {tuple(noisy.shape)}; make them with "
                            f"tp.encode_condition(pixels, latents) from the pixels of the latents")
    return torch.cat([noisy, extra.to(noisy)], dim=dim)
