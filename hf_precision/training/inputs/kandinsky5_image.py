"""Kandinsky 5 I2V's extra channels (visual_cond): zeros beside the latents and a mask of ones on the first latent
frame, as pipeline_kandinsky_i2v.py ``prepare_latents`` builds them (:712-729: ``visual_cond = zeros_like(latents)``,
``visual_cond_mask[:, 0:1] = 1``, concatenated on the last axis). The image itself is the first latent frame of the
noisy latents, clean at every step (:710), which the row's ``clean_first_frame`` gives the training step from the
clip's own first latent frame.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("kandinsky5_image")
def _kandinsky5_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    b, c, frames, h, w = latents.shape  # the VAE's layout; the row's channels_last puts these channels last
    mask = latents.new_zeros(b, 1, frames, h, w)
    mask[:, :, 0] = 1
    return torch.cat([torch.zeros_like(latents), mask], dim=1)
