"""The five core random-weight pipelines (SDXL, SD 1.x, SVD, PixArt-alpha, DiT) by name, and helpers around them.

For tests, the demo, scripts and benchmarks. The pipelines are registry rows (``tiny/core.yaml``, tagged ``core``):
every one builds offline, in float32, deterministic given ``seed`` (``torch.manual_seed(seed)`` before each
component). ``size`` is a preset name (``"tiny"``, ``"mid"``) or a dict of per-component config overrides merged
over a preset::

    >>> from hf_precision.testing import make_pipeline, example_call_kwargs
    >>> pipe = make_pipeline("sdxl")                       # 115,931 parameters
    >>> image = pipe(**example_call_kwargs("sdxl")).images  # 32x32, 2 steps, ~50 ms on CPU

``"mid"`` presets keep the real block structure (SDXL UNet with 3 levels and 1/2/5 transformer layers, SVD UNet with
4 levels) at about 287M (SDXL) / 169M (SVD) parameters, for memory and speed measurements; call them with
``example_call_kwargs(kind, size="mid")`` (64x64 images).

Nothing heavy is imported at module import time: torch, diffusers and transformers are imported inside the functions.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any, Mapping

from .parts import example_image, finish_pipeline, seeded as _seeded
from .registry import PIPELINES, make_pipeline
from .tokenizers import make_tokenizer

__all__ = ["count_parameters", "example_call_kwargs", "example_img2img_kwargs", "example_image", "finish_pipeline",
           "make_dit", "make_overflowing_vae", "make_pixart", "make_sd15", "make_sdxl", "make_svd", "make_tokenizer",
           "save_pipeline"]


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


def _maker(name: str, doc: str):
    def make(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
        return make_pipeline(name, size=size, seed=seed)

    make.__name__ = make.__qualname__ = f"make_{name}"
    make.__doc__ = doc
    return make


make_sdxl = _maker("sdxl", """A random-weight ``StableDiffusionXLPipeline`` in float32 (tiny: 115,931 parameters).

    >>> pipe = make_sdxl()
    >>> pipe(**example_call_kwargs("sdxl")).images.shape
    (1, 32, 32, 3)
    """)
make_sd15 = _maker("sd15", """A random-weight ``StableDiffusionPipeline`` in float32 (no safety checker).

    >>> make_sd15().unet.config.cross_attention_dim
    8
    """)
make_svd = _maker("svd", """A random-weight ``StableVideoDiffusionPipeline`` in float32 (tiny: 990,393 parameters).

    >>> pipe = make_svd()
    >>> pipe(**example_call_kwargs("svd")).frames.shape
    (1, 2, 32, 32, 3)
    """)
make_pixart = _maker("pixart", """A random-weight ``PixArtAlphaPipeline`` in float32 (tiny T5 encoder + handmade T5
    tokenizer).

    >>> make_pixart().transformer.config.caption_channels
    32
    """)
make_dit = _maker("dit", """A random-weight ``DiTPipeline`` in float32 (class-conditional; 1000 classes).

    >>> pipe = make_dit()
    >>> pipe(**example_call_kwargs("dit")).images.shape
    (1, 16, 16, 3)
    """)


def make_overflowing_vae(seed: int = 0, scale: float = 1e5):
    """A tiny ``AutoencoderKL`` whose decoder really overflows float16, and float32 latents to decode with it: its
    ``decoder.conv_in`` times ``scale`` exceeds 65504, finite in float32 (the GroupNorm after it normalises) and
    inf/NaN in float16, what the NaN guard is for.

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
    """Save ``pipe`` with safetensors; with ``fp16_variant`` also ``*.fp16.safetensors`` files from a float16 deep copy.

    As on the Hub (SDXL base, SVD), the variant save leaves ``"dtype": "float16"`` in the transformers configs, so
    transformers 5 (``dtype="auto"``) loads float16 encoders beside a float32 UNet and VAE without ``dtype`` (row S24).

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
    """The smallest call kwargs that run the registry pipeline ``kind`` fast (no ``generator``: add one).

    ``size="mid"`` uses 64x64 images so that the 4-level SVD UNet gets 8x8 latents.

    >>> import torch
    >>> pipe = make_sdxl()
    >>> out = pipe(**example_call_kwargs("sdxl"), generator=torch.Generator().manual_seed(0))
    >>> out.images.dtype
    dtype('float32')
    """
    if kind not in PIPELINES:
        raise ValueError(f"no example call for {kind!r}; use one of {sorted(PIPELINES)}")
    return PIPELINES[kind].call_kwargs(size, output_type=output_type)


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
