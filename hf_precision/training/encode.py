"""Data into a training step: images to latents (the VAE's planned dtype, the pipeline's scaling), prompts to
the denoiser's conditioning (the pipeline's own ``encode_prompt``, mapped by the family row)."""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..diagnose.steps import call_params
from ..recipe.catalog import shipped_value
from ..runtime.patches import tile_where_required
from . import denoiser_rows
from .image_embeds import IMAGE_KEY, encode_image_embeds, image_encode_of
from .inputs import CONDITIONS
from .pipeline_methods import required_params, without_guidance
from .rules import TrainingError

__all__ = ["condition_key", "encode_condition", "encode_images", "encode_prompt", "encode_prompt_needs", "frame_wise", "latent_shift", "normalise_latents", "patch_normalised", "vae_latents"]


def normalise_latents(latents: torch.Tensor, config: Any) -> torch.Tensor:
    """Shift and scale raw VAE latents as the pipelines do: ``(x - mean) / std`` (Wan, LTX; times ``scaling_factor``
    where there is one), else ``(x - shift_factor) * scaling_factor`` (SD3, Flux; SD/SDXL have no shift).

    Example:
        >>> normalise_latents(torch.ones(1, 1, 2, 2), {"scaling_factor": 0.5, "shift_factor": 0.5}).flatten().tolist()
        [0.25, 0.25, 0.25, 0.25]
    """
    config = dict(config)
    x = latents.float()
    mean, std = config.get("latents_mean"), config.get("latents_std")
    if mean is not None and std is not None:
        shape = (1, len(mean)) + (1,) * (x.dim() - 2)
        x = (x - torch.tensor(mean, device=x.device).view(shape)) / torch.tensor(std, device=x.device).view(shape)
        return x * float(config.get("scaling_factor") or 1.0)
    return (x - float(config.get("shift_factor") or 0.0)) * float(config.get("scaling_factor") or 1.0)


def latent_shift(pipe: Any) -> bool:
    """Whether ``pipe``'s class shifts its VAE latents by ``shift_factor``: not where its recipe says ``latent_shift:
    false`` (Kandinsky 5 Image scales alone, recipes/kandinsky5_image.yaml).

    Example:
        >>> import diffusers
        >>> latent_shift(diffusers.Kandinsky5T2IPipeline), latent_shift(diffusers.FluxPipeline)
        (False, True)
    """
    shift = shipped_value(pipe if isinstance(pipe, type) else type(pipe), "latent_shift")[1]
    return True if shift is None else bool(shift)


def encode_images(tp: Any, pixels: torch.Tensor, generator: torch.Generator | None = None,
                  mode: bool = False) -> torch.Tensor:
    vae = tp.components.get("vae")
    if vae is None:
        raise TrainingError(f"tp.encode_images: no 'vae' component (components: {sorted(tp.components)})")
    with torch.no_grad():  # the entry hooks cast the pixels to the VAE's planned dtype and device
        raw = vae_latents(vae, pixels, generator, mode)
    bn = getattr(vae, "bn", None)
    if isinstance(bn, torch.nn.BatchNorm2d) and bn.running_mean is not None:
        return patch_normalised(raw.float(), bn, float(vae.config.get("batch_norm_eps", bn.eps)))
    raw = _folded(tp, raw)
    config = dict(vae.config)
    if not latent_shift(getattr(tp, "pipe", None)):
        config.pop("shift_factor", None)
    return normalise_latents(raw, config)


# A pipeline with this static method folds its image's latent frame into channels before scaling (HunyuanImage 2.1
# Refiner, diffusers 0.42.1 pipeline_hunyuanimage_refiner.py:405-418; decoding unfolds them, :748-749).
FOLD_METHOD = "_reorder_image_tokens"


def _folded(tp: Any, raw: torch.Tensor) -> torch.Tensor:
    fold = getattr(type(getattr(tp, "pipe", None)), FOLD_METHOD, None)
    if fold is None:
        return raw
    # vae_latents hands an image's one latent frame back as (B, C, h, w); the fold takes (B, C, F, h, w)
    return fold(raw.unsqueeze(2)).squeeze(2) if raw.dim() == 4 else fold(raw)


def encode_condition(tp: Any, pixels: torch.Tensor, latents: torch.Tensor,
                     generator: torch.Generator | None = None, **given: Any) -> dict[str, torch.Tensor]:
    """``{"condition_latents": ..., "image_embeds": ...}``: the channels the denoiser takes beyond the noisy latents,
    built from the sample's ``pixels`` (and their ``latents``, which fix the size) by the row's ``condition`` builder
    (recipes/denoisers.yaml), and the image embedding where it takes one (:mod:`.image_embeds`); ``{}`` for neither.
    Raises naming the pipeline where nothing here makes what its denoiser takes. ``given``: the pipeline's own
    ``__call__`` inputs a builder makes the conditioning from (Wan Animate's ``image``, ``pose_video``, ``face_video``:
    :mod:`.inputs.wan_animate_reference`, which also hands back ``latents`` with the reference's frame first).

    Example:
        >>> import hf_precision as hp
        >>> from hf_precision.testing import make_pipeline
        >>> tp = hp.prepare_training(make_pipeline("sd_inpaint"), device="cpu", train={"unet": "lora"}, rank=2)
        >>> pixels = torch.rand(1, 3, 32, 32) * 2 - 1
        >>> cond = tp.encode_condition(pixels, tp.encode_images(pixels))["condition_latents"]
        >>> tuple(cond.shape), sorted(set(cond[:, 0].flatten().tolist())) <= [0.0, 1.0]  # the mask, masked latents
        ((1, 5, 16, 16), True)
    """
    module = tp._denoiser()
    row = denoiser_rows.row_of(module, str(tp.denoiser_name))
    out: dict[str, torch.Tensor] = {}
    name = denoiser_rows.condition_made(row, module, tp.pipe)
    if name is not None:
        with torch.no_grad():
            made = CONDITIONS[name](tp, pixels, latents, generator, **given)
        # a builder returns the channels, or the batch entries of a denoiser that takes them as arguments of their own
        out = {k: v.float() for k, v in made.items()} if isinstance(made, dict) else {"condition_latents": made.float()}
    return {**out, **encode_image_embeds(tp, row, pixels)}


def condition_key(tp: Any) -> tuple[str, ...]:
    """The names of what :func:`encode_condition` makes for ``tp``, which a cache of encoded samples keys on.

    Example:
        >>> import hf_precision as hp
        >>> from hf_precision.testing import make_pipeline
        >>> condition_key(hp.prepare_training(make_pipeline("svd"), device="cpu", train={"unet": "lora"}, rank=2))
        ('condition', 'svd_image', 'image_embeds', '_encode_image', 'pil')
    """
    module = tp._denoiser()
    row = denoiser_rows.row_of(module, str(tp.denoiser_name))
    name = denoiser_rows.condition_made(row, module, tp.pipe)
    made: tuple[str, ...] = ("condition", name) if name is not None else ()
    encoder = image_encode_of(row, module, tp.pipe)
    return (*made, IMAGE_KEY, *encoder) if encoder else made


def patch_normalised(latents: torch.Tensor, bn: torch.nn.BatchNorm2d, eps: float) -> torch.Tensor:
    """FLUX.2's latents: its VAE (AutoencoderKLFlux2) keeps running statistics per channel of the 2x2-patchified
    latents, and the pipeline normalises there (diffusers 0.42.1 pipeline_flux2.py:611-618; the inverse before
    decoding, :1019-1024). Returned unpatchified, as the training row packs them 2x2 like Flux.

    Example:
        >>> bn = torch.nn.BatchNorm2d(4).eval()
        >>> bn.running_mean.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))  # doctest: +ELLIPSIS
        tensor(...)
        >>> patch_normalised(torch.tensor([[[[1.0, 2.0], [3.0, 4.0]]]]), bn, 0.0).abs().max().item()
        0.0
    """
    b, c, h, w = latents.shape
    patches = latents.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
    mean = bn.running_mean.view(1, -1, 1, 1).to(latents)
    std = torch.sqrt(bn.running_var.view(1, -1, 1, 1).to(latents) + eps)
    patches = (patches - mean) / std
    return patches.reshape(b, c, 2, 2, h // 2, w // 2).permute(0, 1, 4, 2, 5, 3).reshape(b, c, h, w)


def frame_wise(vae: torch.nn.Module) -> bool:
    """Whether ``vae`` encodes a clip one frame at a time: its encoder has no 3D convolution (SVD's
    AutoencoderKLTemporalDecoder, AutoencoderKL under AnimateDiff); a video VAE (Wan, LTX, CogVideoX, Allegro) has.

    Example:
        >>> from diffusers import AutoencoderKL
        >>> frame_wise(AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4))
        True
    """
    encoder = getattr(vae, "encoder", vae)
    return not any(isinstance(m, torch.nn.Conv3d) for m in encoder.modules())


def vae_latents(vae: torch.nn.Module, pixels: torch.Tensor, generator: torch.Generator | None = None,
                mode: bool = False) -> torch.Tensor:
    """The raw latents of ``vae.encode(pixels)``, unscaled: a sample of ``latent_dist`` (its mode with ``mode``, as
    image-to-video pipelines' ``sample_mode="argmax"``), else ``latent`` (AutoencoderDC). A clip into a frame-wise
    VAE (:func:`frame_wise`) goes with its frames in the batch, as diffusers' SVD pipeline does; an image into a
    video VAE as a clip of one frame, as pipeline_qwenimage.py does; each comes back in the shape it came in.

    Example:
        >>> from diffusers import AutoencoderKL
        >>> vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4)
        >>> tuple(vae_latents(vae, torch.zeros(2, 3, 5, 8, 8)).shape)
        (2, 4, 5, 8, 8)
    """
    tile_where_required(vae)  # Allegro's VAE encodes only tiled
    wise = frame_wise(vae)
    folded = pixels.dim() == 5 and wise
    one_frame = pixels.dim() == 4 and not wise
    b, f = pixels.shape[0], pixels.shape[2] if folded else 1
    x = pixels.transpose(1, 2).flatten(0, 1) if folded else pixels.unsqueeze(2) if one_frame else pixels
    out = vae.encode(x)
    dist = getattr(out, "latent_dist", None)
    if dist is not None:
        raw = dist.mode() if mode else dist.sample(generator)
    else:
        raw = getattr(out, "latent", out[0] if isinstance(out, (tuple, list)) else out)
    return raw.unflatten(0, (b, f)).transpose(1, 2) if folded else raw.squeeze(2) if one_frame else raw


def encode_prompt_needs(pipeline_cls: Any) -> list[str]:
    """What a pipeline class's ``encode_prompt`` requires beyond the prompts (HunyuanVideo I2V: its image).

    Example:
        >>> import diffusers
        >>> encode_prompt_needs(diffusers.StableDiffusionXLPipeline), encode_prompt_needs(diffusers.StableCascadePriorPipeline)
        ([], [])
        >>> encode_prompt_needs(diffusers.HunyuanVideoImageToVideoPipeline)
        ['image']
    """
    params = call_params(pipeline_cls, "encode_prompt")
    # as encode_prompt fills them: its own keys, prompt_2/prompt_3 (None: reuse prompt), Stable Cascade's batch_size
    given = {"prompt", "device", "do_classifier_free_guidance", "num_images_per_prompt", "num_videos_per_prompt",
             "batch_size", "self", *(k for k in params if k.startswith("prompt_"))}
    return required_params(params, given)


def encode_prompt(tp: Any, prompts: str | list[str], **options: Any) -> dict[str, torch.Tensor]:
    pipe = tp.pipe
    if not hasattr(pipe, "encode_prompt"):
        raise TrainingError(f"tp.encode_prompt: {type(pipe).__name__} has no encode_prompt; give the conditioning in the "
                            f"batch yourself (keys: {sorted(denoiser_rows.row_of(tp._denoiser()).cond)})")
    row = denoiser_rows.row_of(tp._denoiser())
    params = call_params(pipe, "encode_prompt")
    prompts = [prompts] if isinstance(prompts, str) else list(prompts)
    wanted = {"prompt": prompts, "device": tp.device, "do_classifier_free_guidance": False,
              "num_images_per_prompt": 1, "num_videos_per_prompt": 1}
    unknown = sorted(set(options) - set(params))
    if unknown:
        raise TrainingError(f"tp.encode_prompt: {type(pipe).__name__}.encode_prompt takes no {', '.join(unknown)}; it "
                            f"takes {', '.join(p for p in params if p != 'prompt')}")
    config = getattr(tp._denoiser(), "config", {})
    kind = config.get("image_condition_type")
    if kind and "image_embed_interleave" in params and "image_embed_interleave" not in options:
        # HunyuanVideo I2V's __call__ keeps every 2nd image token for latent_concat, every 4th for token_replace
        # (pipeline_hunyuan_video_image2video.py:779-785); its encode_prompt's default is 2
        options = {**options, "image_embed_interleave": {"latent_concat": 2, "token_replace": 4}.get(kind, 1)}
    grad = any(tp.kinds.get(c) != "frozen" for c in tp.components if c.startswith("text_encoder"))
    batch: dict[str, torch.Tensor] = {}
    for extra, names in (({}, row.encode), *row.encode_more):
        kwargs = {**wanted, **options, **extra}
        length = denoiser_rows.text_length(row, config, str(names[0]))
        if length:  # CogVideoX, HunyuanDiT: the denoiser was built for prompts of exactly this many tokens
            kwargs["max_sequence_length"] = length
        kwargs = {k: v for k, v in kwargs.items() if k in params}
        # SD3 requires prompt_2/prompt_3 (no defaults); None makes it reuse `prompt`, as its __call__ does
        kwargs.update({k: None for k, p in params.items() if k.startswith("prompt_") and k not in kwargs
                       and p.default is inspect.Parameter.empty})
        if "batch_size" in params and "batch_size" not in kwargs:  # Stable Cascade's encode_prompt requires it
            kwargs["batch_size"] = len(prompts)
        missing = required_params(params, kwargs)
        if missing:  # HunyuanVideo I2V encodes the image with the prompt
            raise TrainingError(f"tp.encode_prompt: {type(pipe).__name__}.encode_prompt needs {', '.join(missing)}; pass "
                                f"{', '.join(f'{k}=...' for k in missing)} as the pipeline's __call__ would")
        with torch.set_grad_enabled(grad), without_guidance(pipe):
            try:
                out = _encoder(pipe, grad)(**kwargs)
            except NameError as err:  # pipeline_wan_i2v.py calls ftfy.fix_text without checking it is installed
                raise TrainingError(f"tp.encode_prompt: {type(pipe).__name__}.encode_prompt failed with '{err}': the "
                                    f"pipeline needs a package that is not installed (pip install ftfy for "
                                    f"'ftfy'), or give the conditioning in the batch yourself") from err
        out = out if isinstance(out, tuple) else (out,)
        # held batch-first, as the cache, the shards and torch.cat see a batch (HiDream's Llama states: layers first)
        batch.update({name: value.movedim(row.batch_axis[name], 0) if name in row.batch_axis else value
                      for name, value in zip(names, out) if name is not None and value is not None})
    return batch


def _encoder(pipe: Any, grad: bool) -> Any:
    # Kandinsky 3 decorates encode_prompt with @torch.no_grad(): a trained text encoder would get no gradient, so
    # under training the undecorated function is called (functools.wraps keeps it as __wrapped__)
    method = pipe.encode_prompt
    if not grad or not hasattr(method, "__func__"):
        return method
    return inspect.unwrap(method.__func__).__get__(pipe)
