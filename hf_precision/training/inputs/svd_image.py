"""Stable Video Diffusion's 4 extra channels: the conditioning image's latents on every frame, as
pipeline_stable_video_diffusion.py ``__call__`` builds them: the image plus ``noise_aug_strength`` (0.02, the value
:mod:`.svd_time_ids` gives the UNet) times Gaussian noise, encoded at the VAE's mode, unscaled
(``_encode_vae_image``: ``latent_dist.mode()``, no scaling factor), repeated over the frames; the UNet takes
``cat([latents, image_latents], dim=2)``. The image is the clip's own first frame; the pipeline's unconditional
half (classifier-free guidance) is zeros, which training never feeds.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition
from .svd_time_ids import NOISE_AUG


@condition("svd_image")
def _svd_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    from ..encode import vae_latents

    image = pixels[:, :, 0]
    noise = torch.randn(image.shape, generator=generator, device=image.device, dtype=image.dtype)
    with torch.no_grad():
        raw = vae_latents(tp.components["vae"], image + NOISE_AUG * noise, mode=True).float()
    return raw.unsqueeze(2).expand(-1, -1, latents.shape[2], -1, -1).contiguous()
