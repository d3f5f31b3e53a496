"""The registry of extra input builders (:data:`BUILDERS`, :func:`builder`) and the latent layout helpers the
builders and the training loss share. Each builder lives in its own module of this package, named by its
registered name; ``row`` is a ``DenoiserRow``, typed ``Any`` here because the module of the rows imports this one.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ...errors import RecipeError

__all__ = ["BUILDERS", "Builder", "CONDITIONS", "Condition", "DRAWN", "ZEROS", "builder", "condition", "channel_dim", "frozen_dtype", "model_layout", "optional_inputs",
           "pixel_size", "reference_latents", "config_value", "fitted_latent"]

Builder = Callable[[Any, Any, Mapping[str, Any], torch.Tensor], dict[str, Any]]
BUILDERS: dict[str, Builder] = {}
# (tp, pixels in [-1, 1]: (B, 3, H, W) or a clip (B, 3, F, H, W), their latents, generator) -> the conditioning
# latents in the VAE's layout, or batch entries by key (a denoiser that takes them as arguments of their own)
Condition = Callable[[Any, torch.Tensor, torch.Tensor, Any], "torch.Tensor | dict[str, torch.Tensor]"]
CONDITIONS: dict[str, Condition] = {}
DRAWN: set[str] = set()  # condition builders whose output is a random draw per training step (condition(drawn=True))
ZEROS: set[str] = set()  # condition builders that give zeros, as their pipeline does (condition(zeros=True))


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register an extra input builder under ``name``, the name a row's ``extras`` gives (recipes/denoisers.yaml).

    A builder takes (row, denoiser, batch, clean latents in the denoiser's layout) and returns keyword arguments for
    the denoiser's forward, added after the row's conditioning. The shipped ones are the modules of this package, one
    per name. A user's own builder is registered the same way, in their code, before the denoisers file whose rows
    name it is read (``hf_precision.training.add_rows(path)`` checks a row's extras against the names registered
    then); registering a name again replaces the earlier builder.

    Example:
        >>> @builder("my_scale")
        ... def _my_scale(row, module, batch, x0):
        ...     return {"scale": 1.0}
        >>> BUILDERS["my_scale"](None, None, {}, None)
        {'scale': 1.0}
        >>> del BUILDERS["my_scale"]
        >>> builder("my-scale")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: builder('my-scale'): bad name; allowed: a Python identifier, the name a denoisers row's extras gives, e.g. 'my_scale'
    """
    if not isinstance(name, str) or not name.isidentifier():
        fixed = re.sub(r"\W|^(?=\d)", "_", str(name)) or "my_ids"
        raise RecipeError(f"builder({name!r}): bad name; allowed: a Python identifier, the name a denoisers row's "
                          f"extras gives, e.g. {fixed!r}")

    def register(fn: Builder) -> Builder:
        BUILDERS[name] = fn
        return fn
    return register


def condition(name: str, *, drawn: bool = False, zeros: bool = False) -> Callable[[Condition], Condition]:
    """Register a condition builder under ``name``, the name a row's ``condition`` gives for a pipeline class.

    A condition builder makes, in the encode phase (next to the sample's latents, cached with them), the channels
    the denoiser takes beyond the noisy latents, as that pipeline builds them at inference from its input image
    (and mask): it takes (the training plan ``tp``, the sample's pixels in [-1, 1], a generator or None) and returns
    them in the VAE's layout, the latents' size; the training step concatenates them after the noisy latents. A
    denoiser that takes its conditioning as arguments of their own rather than as channels (I2VGen-XL's
    ``image_latents`` and ``image_embeddings``) has a builder that returns a dict of batch entries, which its row's
    ``optional`` or ``cond`` hands the denoiser; the encode phase runs it for a pipeline class the row names.
    ``drawn=True`` marks a builder whose output is a random draw a training script makes anew each step (an
    inpainting mask): the training program then caches several draws per sample and picks one each step
    (:data:`DRAWN`). ``zeros=True`` marks a builder that gives zeros because its pipeline feeds zeros there
    (HunyuanVideo 1.5 text-to-video, :mod:`.t2v_zeros`): ``tp.loss`` then fills a batch without them itself
    (:data:`ZEROS`) instead of refusing it.

    Example:
        >>> @condition("my_cond")
        ... def _my_cond(tp, pixels, generator):
        ...     return pixels[:, :1]
        >>> tuple(CONDITIONS["my_cond"](None, torch.zeros(1, 3, 4, 4), None).shape)
        (1, 1, 4, 4)
        >>> del CONDITIONS["my_cond"]
    """
    builder(name)  # checks the name by the builders' rule (registers nothing until called)

    def register(fn: Condition) -> Condition:
        CONDITIONS[name] = fn
        (DRAWN.add if drawn else DRAWN.discard)(name)
        (ZEROS.add if zeros else ZEROS.discard)(name)
        return fn
    return register


def channel_dim(row: Any) -> int:
    """The channel axis of latents in the row's layout: 2 for ``frames_first`` (B,F,C,H,W), -1 for ``channels_last``
    (B,F,H,W,C), else 1.

    Example:
        >>> from types import SimpleNamespace
        >>> [channel_dim(SimpleNamespace(layout=k)) for k in ("frames_first", "video", "channels_last")]
        [2, 1, -1]
    """
    return {"frames_first": 2, "channels_last": -1}.get(row.layout, 1)


def reference_latents(row: Any, batch: Mapping[str, Any]) -> list[torch.Tensor]:
    """The batch's ``reference_latents`` in the row's layout, one tensor per reference image (none: ``[]``): what a
    row with ``reference: true`` appends to the token sequence, and what its id builders give positions to.

    Example:
        >>> from types import SimpleNamespace
        >>> row = SimpleNamespace(layout="image", reference=True)
        >>> [tuple(r.shape) for r in reference_latents(row, {"reference_latents": torch.zeros(1, 4, 1, 8, 6)})]
        [(1, 4, 8, 6)]
        >>> reference_latents(row, {}), reference_latents(SimpleNamespace(reference=False), {"reference_latents": 1})
        ([], [])
    """
    given = batch.get("reference_latents") if getattr(row, "reference", False) else None
    if given is None:
        return []
    return [model_layout(row, r) for r in (given if isinstance(given, (list, tuple)) else [given])]


def model_layout(row: Any, x: torch.Tensor) -> torch.Tensor:
    """Latents as the VAE gives them, in the layout the row's denoiser takes.

    Example:
        >>> from types import SimpleNamespace
        >>> model_layout(SimpleNamespace(layout="frames_first"), torch.zeros(1, 4, 3, 8, 8)).shape
        torch.Size([1, 3, 4, 8, 8])
        >>> model_layout(SimpleNamespace(layout="channels_last"), torch.zeros(1, 4, 3, 8, 6)).shape
        torch.Size([1, 3, 8, 6, 4])
    """
    if row.layout == "image" and x.dim() == 5 and x.shape[2] == 1:
        return x[:, :, 0]  # a 3D causal VAE (QwenImage) encodes an image as one latent frame; the pipeline packs it 2D
    if row.layout == "frames_first":
        return x.transpose(1, 2)  # the VAE gives (B,C,F,H,W); CogVideoX and SVD take (B,F,C,H,W)
    if row.layout == "channels_last":
        if x.dim() == 4:  # Kandinsky 5 Image's 2D VAE: one latent frame (pipeline_kandinsky_t2i.py:500-506)
            x = x.unsqueeze(2)
        return x.permute(0, 2, 3, 4, 1)  # Kandinsky 5 takes (B,F,H,W,C) (pipeline_kandinsky.py prepare_latents)
    return x


def frozen_dtype(module: torch.nn.Module) -> torch.dtype:
    """The dtype of a module's first frozen floating weight (float32 when none is frozen).

    Example:
        >>> frozen_dtype(torch.nn.Linear(2, 2).half().requires_grad_(False)), frozen_dtype(torch.nn.Linear(2, 2))
        (torch.float16, torch.float32)
    """
    # The frozen weights' dtype (a LoRA base: the compute dtype); a full fine-tune (fp32 masters) computes under
    # autocast, which casts the timestep itself.
    return next((p.dtype for p in module.parameters() if not p.requires_grad and p.is_floating_point()), torch.float32)


def optional_inputs(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    """The row's ``optional`` forward arguments: the batch's value where it has one, else zeros of the row's shape.

    Example:
        >>> from types import SimpleNamespace
        >>> row = SimpleNamespace(layout="image", optional={"control": ("control_latents", "latents")})
        >>> optional_inputs(row, torch.nn.Identity(), {}, torch.ones(1, 4, 8, 8))["control"].abs().sum().item()
        0.0
    """
    # Conditioning the pipeline always passes but a text-to-X training batch may lack (an I2V image, a VACE control
    # video, Cascade's image embeddings): zeros, the unconditional input, as condition dropout trains it.
    config = getattr(module, "config", {})
    out: dict[str, Any] = {}
    for arg, (key, shape) in row.optional.items():
        kind, _, config_key = shape.partition("@")
        dim = int(config.get(config_key) or 0) if config_key else x0.shape[channel_dim(row)]
        if not dim:
            continue
        given = batch.get(key)
        if given is not None:
            out[arg] = given if kind == "token" else model_layout(row, given)
        elif kind == "token":
            out[arg] = x0.new_zeros(x0.shape[0], 1, dim)
        else:
            zeros = list(x0.shape)
            zeros[channel_dim(row)] = dim
            out[arg] = x0.new_zeros(zeros)
    return out


def pixel_size(batch: Mapping[str, Any], x0: torch.Tensor) -> tuple[int, int]:
    """The picture's (height, width) in pixels for latents ``x0``, as the pipelines' micro-conditioning counts them:
    the latent size times the VAE's spatial factor, which the training loss puts in the batch
    (``vae_scale_factor``, the pipeline's own); 8, the SDXL / PixArt / HunyuanDiT VAEs' factor, where the batch has
    none (the video memory plan on the meta device).

    Example:
        >>> pixel_size({"vae_scale_factor": 2}, torch.zeros(1, 4, 16, 8)), pixel_size({}, torch.zeros(1, 4, 16, 8))
        ((32, 16), (128, 64))
    """
    factor = int(batch.get("vae_scale_factor") or 8)
    return x0.shape[-2] * factor, x0.shape[-1] * factor


def config_value(config: Mapping[str, Any], key: str) -> Any:
    """A config value by a row's name for it: a key, or ``key[i]``, item ``i`` of a list (None where absent).

    Example:
        >>> config_value({"caption_channels": [4096, 2048]}, "caption_channels[1]"), config_value({}, "dim")
        (2048, None)
    """
    name, _, index = key.partition("[")
    value = config.get(name)
    if index and isinstance(value, (list, tuple)):
        i = int(index.rstrip("]"))
        return value[i] if i < len(value) else None
    return None if index else value


def fitted_latent(row: Any, config: Mapping[str, Any], side: int, frames: int) -> tuple[int, ...]:
    """The latents' (frames, height, width) or (height, width) an example batch takes for a denoiser config: ``side``
    and ``frames``, fitted where the config fixes them (CogVideoX's learned positions, its frame pairs).

    Example:
        >>> from types import SimpleNamespace
        >>> fitted_latent(SimpleNamespace(layout="video"), {"patch_size_t": 2}, 8, 3)
        (4, 8, 8)
    """
    if config.get("sample_frames") and config.get("temporal_compression_ratio"):
        # CogVideoX 1.0 sizes its temporal position embedding from the config (cogvideox_transformer_3d.py)
        frames = (int(config["sample_frames"]) - 1) // int(config["temporal_compression_ratio"]) + 1
    if config.get("patch_size_t"):  # CogVideoX 1.5 patches frames in pairs: the pipeline pads latent frames to fit
        frames = -(-frames // int(config["patch_size_t"])) * int(config["patch_size_t"])
    height = width = side
    if config.get("use_learned_positional_embeddings") and config.get("sample_height"):
        # CogVideoX 5B I2V learned its position table for one latent size only (embeddings.py CogVideoXPatchEmbed)
        height, width = int(config["sample_height"]), int(config["sample_width"])
    return (frames, height, width) if row.layout in ("video", "frames_first", "channels_last") else (height, width)
