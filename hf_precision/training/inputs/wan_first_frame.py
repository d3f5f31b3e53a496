"""Wan 2.1 / 2.2 image-to-video's 20 extra channels: a 4-channel mask over the first latent frame and the latents
of the conditioning video (the first frame, then black frames), as pipeline_wan_i2v.py ``prepare_latents`` builds
them (no last image, expand_timesteps off): ``video_condition = cat([image, zeros])`` encoded at the VAE's mode
(``sample_mode="argmax"``), normalised ``(z - latents_mean) / latents_std``; the mask is 1 on the first pixel frame,
repeated over the VAE's temporal factor, folded into channels: ``cat([mask, latent_condition])``. The conditioning
image is the clip's own first frame, as finetrainers and Wan's training code take it.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("wan_first_frame")
def _wan_first_frame(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    b, _, frames, height, width = pixels.shape
    video = torch.cat([pixels[:, :, :1], pixels.new_zeros(b, 3, frames - 1, height, width)], dim=2)
    condition_latents = tp.encode_images(video, generator, mode=True)
    # the VAE's temporal factor (4): the pipeline's own, else what the clip's latents say (F = t * (F_latent - 1) + 1)
    t = int(getattr(tp.pipe, "vae_scale_factor_temporal", 0) or (frames - 1) // max(latents.shape[2] - 1, 1))
    # pipeline_wan_i2v.py: ones on pixel frame 0 (repeated t times), zeros after, viewed as t channels per latent frame
    mask = torch.zeros(b, 1, frames, *latents.shape[-2:], device=latents.device)
    mask[:, :, 0] = 1
    mask = torch.cat([mask[:, :, :1].repeat_interleave(t, dim=2), mask[:, :, 1:]], dim=2)
    mask = mask.view(b, -1, t, *latents.shape[-2:]).transpose(1, 2)
    return torch.cat([mask.to(condition_latents), condition_latents], dim=1)
