"""CogVideoX image-to-video's extra channels: the conditioning image's latents as the first latent frame, zeros
after, as pipeline_cogvideox_image2video.py ``prepare_latents`` builds them: each image encoded as a one-frame clip
(a sample of the latent distribution), times the VAE's ``scaling_factor`` (divided by it where the config says
``invert_scale_latents``, CogVideoX 1.5), zero frames after; with ``patch_size_t`` the first ``F % patch_size_t``
frames repeated in front. The transformer takes ``cat([latents, image_latents], dim=2)`` (B, F, C, H, W). The image
is the clip's own first frame.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("cogvideox_image")
def _cogvideox_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    from ..encode import vae_latents

    vae = tp.components["vae"]
    with torch.no_grad():  # one image at a time, as the pipeline draws each from the generator in turn
        first = torch.cat([vae_latents(vae, image[None, :, :1], generator).float() for image in pixels])
    scale = float(vae.config.get("scaling_factor") or 1.0)
    first = first / scale if vae.config.get("invert_scale_latents") else first * scale
    b, c, frames, h, w = latents.shape
    image_latents = torch.cat([first, first.new_zeros(b, c, frames - 1, h, w)], dim=2)
    p_t = tp._denoiser().config.get("patch_size_t")
    if p_t:
        image_latents = torch.cat([image_latents[:, :, :frames % p_t], image_latents], dim=2)
    return image_latents
