"""HunyuanVideo I2V's extra channels (``image_condition_type="latent_concat"``, the pipeline's default: in_channels
2C + 1): the conditioning image's latents on the first latent frame, zeros after, and a mask of ones there, as
pipeline_hunyuan_video_image2video.py builds them (``prepare_latents``: the image encoded as a one-frame clip at the
VAE's mode, times ``scaling_factor``, repeated over the frames; ``__call__``: ``image_latents[:, :, 1:] = 0``,
``mask[:, :, 1:] = 0``), concatenated ``[latents, image_latents, mask]``. The image is the clip's own first frame.

With ``image_condition_type="token_replace"`` (in_channels C) the first latent frame the transformer takes is that
image's latents, clean at every step, and only the later frames are stepped (``__call__``: ``cat([image_latents,
latents[:, :, 1:]], dim=2)``, ``scheduler.step(noise_pred[:, :, 1:], ...)``, pipeline_hunyuan_video_image2video.py
:890-893, :922-926): the builder then gives them as ``first_frame_latents``, which the training step puts in frame 0
and leaves out of the loss (:func:`hf_precision.training.denoiser_rows.noisy_inputs`).
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("hunyuan_image")
def _hunyuan_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor,
                   generator: Any) -> torch.Tensor | dict[str, torch.Tensor]:
    from ..encode import vae_latents

    vae = tp.components["vae"]
    with torch.no_grad():
        first = vae_latents(vae, pixels[:, :, :1], mode=True).float() * float(vae.config.get("scaling_factor") or 1.0)
    if getattr(tp._denoiser(), "config", {}).get("image_condition_type") == "token_replace":
        return {"first_frame_latents": first}
    image_latents = torch.zeros_like(latents, dtype=first.dtype)
    image_latents[:, :, :1] = first
    mask = torch.zeros_like(image_latents[:, :1])
    mask[:, :, :1] = 1
    return torch.cat([image_latents, mask], dim=1)
