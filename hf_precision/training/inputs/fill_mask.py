"""FLUX.1 Fill's extra channels: the masked image's latents and the pixel mask folded into the latent grid, as
pipeline_flux_fill.py ``prepare_mask_latents`` builds them (``masked_image = init_image * (1 - mask)``; latents
``(z - shift_factor) * scaling_factor``; the mask's vae_scale_factor x vae_scale_factor pixel blocks become
channels), then packs each 2x2 and concatenates ``[masked_image_latents, mask]`` after the latents' tokens. Packing
is channel-major, so the unpacked channels returned here, packed with the latents, give the same tokens. The mask
is drawn per sample as for SD inpainting (:func:`.inpaint_mask.random_mask`).
"""

from __future__ import annotations

from typing import Any

import torch

from .inpaint_mask import random_mask
from .registry import condition


@condition("fill_mask", drawn=True)
def _fill_mask(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    b, _, height, width = pixels.shape
    mask = random_mask(b, height, width, generator, pixels.device)
    masked = tp.encode_images(pixels * (1 - mask), generator)
    h, w = latents.shape[-2:]
    f = height // h  # the VAE's spatial factor
    folded = mask[:, 0].view(b, h, f, w, f).permute(0, 2, 4, 1, 3).reshape(b, f * f, h, w)
    return torch.cat([masked, folded.to(masked)], dim=1)
