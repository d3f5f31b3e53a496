"""HunyuanVideo I2V's extra channels (``image_condition_type="latent_concat"``, the pipeline's default: in_channels
2C + 1): the conditioning image's latents on the first latent frame, zeros after, and a mask of ones there, as
pipeline_hunyuan_video_image2video.py builds them (``prepare_latents``: the image encoded as a one-frame clip at the
VAE's mode, times ``scaling_factor``, repeated over the frames; ``__call__``: ``image_latents[:, :, 1:] = 0``,
``mask[:, :, 1:] = 0``), concatenated ``[latents, image_latents, mask]``. The image is the clip's own first frame.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("hunyuan_image")
def _hunyuan_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    from ..encode import vae_latents

    vae = tp.components["vae"]
    with torch.no_grad():
        first = vae_latents(vae, pixels[:, :, :1], mode=True).float() * float(vae.config.get("scaling_factor") or 1.0)
    image_latents = torch.zeros_like(latents, dtype=first.dtype)
    image_latents[:, :, :1] = first
    mask = torch.zeros_like(image_latents[:, :1])
    mask[:, :, :1] = 1
    return torch.cat([image_latents, mask], dim=1)
