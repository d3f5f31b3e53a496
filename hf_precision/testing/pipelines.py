"""The five core random-weight pipelines (SDXL, SD 1.x, SVD, PixArt-alpha, DiT), built from configs, offline.

For tests, the demo, scripts and benchmarks. Every builder works offline, builds in float32 and is deterministic
given ``seed`` (``torch.manual_seed(seed)`` before each component). ``size`` is a preset name (``"tiny"``, ``"mid"``,
see :mod:`hf_precision.testing.sizes`) or a dict of per-component config overrides merged over a preset::

    >>> from hf_precision.testing import make_pipeline, example_call_kwargs
    >>> pipe = make_pipeline("sdxl")                       # 115,931 parameters
    >>> image = pipe(**example_call_kwargs("sdxl")).images  # 32x32, 2 steps, ~50 ms on CPU

``"mid"`` presets keep the real block structure (SDXL UNet with 3 levels and 1/2/5 transformer layers, SVD UNet with
4 levels) at about 287M (SDXL) / 169M (SVD) parameters, for memory and speed measurements; call them with
``example_call_kwargs(kind, size="mid")`` (64x64 images). These five are the registry rows tagged ``core``.

Nothing heavy is imported at module import time: torch, diffusers and transformers are imported inside the functions.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from .parts import example_image, finish_pipeline, seeded as _seeded, t5_encoder
from .record import TinyPipeline
from .sizes import SIZES, derive as _derive, resolve_size as _resolve_size
from .tokenizers import make_t5_tokenizer, make_tokenizer

__all__ = ["ROWS", "count_parameters", "example_call_kwargs", "example_img2img_kwargs", "make_dit",
           "make_overflowing_vae", "make_pixart", "make_sd15", "make_sdxl", "make_svd", "save_pipeline"]


def count_parameters(pipe) -> dict[str, int]:
    """Parameter count per ``nn.Module`` component plus ``"total"``.

    >>> count_parameters(make_sdxl())["total"]
    115931
    """
    import torch

    counts = {}
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            counts[name] = sum(p.numel() for p in component.parameters())
    counts["total"] = sum(counts.values())
    return counts


def make_sdxl(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableDiffusionXLPipeline`` in float32 (tiny: 115,931 parameters).

    >>> pipe = make_sdxl()
    >>> pipe(**example_call_kwargs("sdxl")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    configs, explicit = _resolve_size("sdxl", size)
    te1, te2 = configs["text_encoder"], configs["text_encoder_2"]
    time_dim = configs["unet"]["addition_time_embed_dim"]
    _derive(configs, explicit, "unet", "cross_attention_dim", te1["hidden_size"] + te2["hidden_size"])
    _derive(configs, explicit, "unet", "projection_class_embeddings_input_dim", te2["projection_dim"] + 6 * time_dim)

    unet = _seeded(seed, lambda: UNet2DConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(**te1)))
    text_encoder_2 = _seeded(seed, lambda: CLIPTextModelWithProjection(CLIPTextConfig(**te2)))
    scheduler = EulerDiscreteScheduler(**configs["scheduler"])
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=make_tokenizer(),
        tokenizer_2=make_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        image_encoder=None,
        feature_extractor=None,
    )
    return finish_pipeline(pipe)


def make_sd15(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableDiffusionPipeline`` in float32 (no safety checker).

    >>> pipe = make_sd15()
    >>> pipe(**example_call_kwargs("sd15")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    configs, explicit = _resolve_size("sd15", size)
    _derive(configs, explicit, "unet", "cross_attention_dim", configs["text_encoder"]["hidden_size"])

    unet = _seeded(seed, lambda: UNet2DConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(**configs["text_encoder"])))
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=make_tokenizer(),
        unet=unet,
        scheduler=EulerDiscreteScheduler(**configs["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )
    return finish_pipeline(pipe)


def make_svd(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableVideoDiffusionPipeline`` in float32 (tiny: 990,393 parameters).

    >>> pipe = make_svd()
    >>> pipe(**example_call_kwargs("svd")).frames.shape
    (1, 2, 32, 32, 3)
    """
    import warnings

    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    configs, explicit = _resolve_size("svd", size)
    time_dim = configs["unet"]["addition_time_embed_dim"]
    _derive(configs, explicit, "unet", "cross_attention_dim", configs["image_encoder"]["projection_dim"])
    _derive(configs, explicit, "unet", "projection_class_embeddings_input_dim", 3 * time_dim)

    unet = _seeded(seed, lambda: UNetSpatioTemporalConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKLTemporalDecoder(**configs["vae"]))
    image_encoder = _seeded(seed, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**configs["image_encoder"])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torchvision not available, falling back to the PIL processor"
        feature_extractor = CLIPImageProcessor(**configs["feature_extractor"])
    pipe = StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=EulerDiscreteScheduler(**configs["scheduler"]),
        feature_extractor=feature_extractor,
    )
    return finish_pipeline(pipe)


def make_pixart(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``PixArtAlphaPipeline`` in float32 (tiny T5 encoder + handmade T5 tokenizer).

    >>> pipe = make_pixart()
    >>> pipe(**example_call_kwargs("pixart")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel

    configs, explicit = _resolve_size("pixart", size)
    tokenizer = make_t5_tokenizer()
    _derive(configs, explicit, "transformer", "caption_channels", configs["text_encoder"]["d_model"])
    configs["text_encoder"]["vocab_size"] = max(configs["text_encoder"]["vocab_size"], len(tokenizer))

    transformer = _seeded(seed, lambda: PixArtTransformer2DModel(**configs["transformer"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = t5_encoder(seed, **configs["text_encoder"])
    pipe = PixArtAlphaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=DPMSolverMultistepScheduler(**configs["scheduler"]),
    )
    return finish_pipeline(pipe)


def make_dit(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``DiTPipeline`` in float32 (class-conditional; 1000 classes).

    >>> pipe = make_dit()
    >>> pipe(**example_call_kwargs("dit")).images.shape
    (1, 16, 16, 3)
    """
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    configs, _ = _resolve_size("dit", size)
    transformer = _seeded(seed, lambda: DiTTransformer2DModel(**configs["transformer"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler(**configs["scheduler"]))
    return finish_pipeline(pipe)


_BUILDERS = {"sdxl": make_sdxl, "svd": make_svd, "pixart": make_pixart, "dit": make_dit, "sd15": make_sd15}


def make_overflowing_vae(seed: int = 0, scale: float = 1e5):
    """A tiny ``AutoencoderKL`` whose decoder really overflows float16, plus latents to decode with it.

    ``decoder.conv_in`` (weight and bias) is multiplied by ``scale``, so its output exceeds fp16's maximum
    (65504): the decode is finite in float32 (the GroupNorm that follows normalises the large values) and
    inf/NaN in float16, which is what the NaN guard is for. Returns ``(vae, latents)``; latents are float32.

    >>> import torch
    >>> vae, latents = make_overflowing_vae()
    >>> bool(torch.isfinite(vae.decode(latents).sample).all())
    True
    >>> bool(torch.isfinite(vae.half().decode(latents.half()).sample).all())
    False
    """
    import torch
    from diffusers import AutoencoderKL

    def build():
        vae = AutoencoderKL(block_out_channels=[8, 16], norm_num_groups=4, layers_per_block=1, latent_channels=4,
                            down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                            force_upcast=False)
        with torch.no_grad():
            vae.decoder.conv_in.weight.mul_(scale)
            vae.decoder.conv_in.bias.mul_(scale)
        return vae.eval()

    vae = _seeded(seed, build)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed + 1))
    return vae, latents


def save_pipeline(pipe, folder: str | Path, *, fp16_variant: bool = False) -> Path:
    """Save ``pipe`` with safetensors; with ``fp16_variant`` also write ``*.fp16.safetensors`` files.

    The fp16 files come from a deep copy cast to float16, so ``pipe`` itself is unchanged and the folder
    holds both the float32 default files and the ``variant="fp16"`` files. As on the Hub (SDXL base,
    SVD), the variant save leaves ``"dtype": "float16"`` in the transformers ``config.json`` files, so
    with transformers 5 (default ``dtype="auto"``) a load *without* ``dtype`` gives float16 text/image
    encoders next to a float32 UNet and VAE, with or without ``variant="fp16"`` (row S24).

    >>> import tempfile
    >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp(), fp16_variant=True)
    >>> sorted(p.name for p in (folder / "unet").iterdir())
    ['config.json', 'diffusion_pytorch_model.fp16.safetensors', 'diffusion_pytorch_model.safetensors']
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(folder), safe_serialization=True)
    if fp16_variant:
        half = copy.deepcopy(pipe)
        for component in half.components.values():
            if isinstance(component, torch.nn.Module):
                component.to(torch.float16)
        half.save_pretrained(str(folder), safe_serialization=True, variant="fp16")
    return folder


def example_call_kwargs(kind: str, *, size: str = "tiny", output_type: str = "np") -> dict[str, Any]:
    """The smallest call kwargs that run a pipeline of ``kind`` fast (no ``generator``: add one).

    ``size="mid"`` uses 64x64 images so that the 4-level SVD UNet gets 8x8 latents.

    >>> import torch
    >>> pipe = make_sdxl()
    >>> out = pipe(**example_call_kwargs("sdxl"), generator=torch.Generator().manual_seed(0))
    >>> out.images.dtype
    dtype('float32')
    """
    side = 32 if size == "tiny" else 64
    if kind in ("sdxl", "sd15"):
        return {
            "prompt": "a cat",
            "height": side,
            "width": side,
            "num_inference_steps": 2,
            "guidance_scale": 5.0,
            "output_type": output_type,
        }
    if kind == "svd":
        return {
            "image": example_image(side),
            "height": side,
            "width": side,
            "num_frames": 2,
            "num_inference_steps": 2,
            "decode_chunk_size": 2,
            "output_type": output_type,
        }
    if kind == "pixart":
        return {
            "prompt": "a cat",
            "height": side,
            "width": side,
            "num_inference_steps": 2,
            "guidance_scale": 4.5,
            "use_resolution_binning": False,
            "clean_caption": False,
            "max_sequence_length": 16,
            "output_type": output_type,
        }
    if kind == "dit":
        return {"class_labels": [1], "num_inference_steps": 2, "guidance_scale": 4.0, "output_type": output_type}
    raise ValueError(f"no example call for {kind!r}; use one of {[row.name for row in ROWS]}")


def example_img2img_kwargs(*, output_type: str = "np") -> dict[str, Any]:
    """Call kwargs for ``StableDiffusionXLImg2ImgPipeline(**make_sdxl().components)``.

    >>> from diffusers import StableDiffusionXLImg2ImgPipeline
    >>> pipe = StableDiffusionXLImg2ImgPipeline(**make_sdxl().components)
    >>> pipe(**example_img2img_kwargs()).images.shape
    (1, 32, 32, 3)
    """
    return {
        "prompt": "a cat",
        "image": example_image(32, seed=1),
        "strength": 0.6,
        "num_inference_steps": 2,
        "guidance_scale": 5.0,
        "output_type": output_type,
    }


def _kwargs_of(kind: str):
    return lambda size="tiny": example_call_kwargs(kind, size=size)


ROWS = (
    TinyPipeline("sdxl", "StableDiffusionXLPipeline", "sdxl", make_sdxl, _kwargs_of("sdxl"),
                 ("image", "unet", "core"), sizes=SIZES["sdxl"]),
    TinyPipeline("svd", "StableVideoDiffusionPipeline", "svd", make_svd, _kwargs_of("svd"),
                 ("video", "unet", "core"), output="frames", mode="i2v", sizes=SIZES["svd"]),
    TinyPipeline("pixart", "PixArtAlphaPipeline", "pixart", make_pixart, _kwargs_of("pixart"),
                 ("image", "dit", "core"), sizes=SIZES["pixart"]),
    TinyPipeline("dit", "DiTPipeline", "dit", make_dit, _kwargs_of("dit"),
                 ("image", "dit", "core"), sizes=SIZES["dit"]),
    TinyPipeline("sd15", "StableDiffusionPipeline", "sd15", make_sd15, _kwargs_of("sd15"),
                 ("image", "unet", "core"), sizes=SIZES["sd15"]),
)
