"""HunyuanImage 2.1 Refiner's extra channels: the input image's latents noised at the pipeline's fixed strength,
as pipeline_hunyuanimage_refiner.py builds them (diffusers 0.42.1): ``_encode_vae_image`` (:405-418) samples the
VAE, folds the one latent frame into channels (``_reorder_image_tokens``, :378-387) and scales by
``scaling_factor``; ``prepare_latents`` (:334-375) draws ``noise`` of the latents' shape and makes
``cond_latents = strength * noise + (1 - strength) * image_latents`` (:372-373), ``strength`` its default 0.25
(``__call__`` passes none, :614-624); the transformer takes ``cat([latents, cond_latents], dim=1)`` (:653).

A refiner refines an image into itself (the base model's output, sharpened): the training sample's own latents
(``tp.encode_images``, which folds the frame as ``_encode_vae_image`` does) are the input image's. The noise is a
fresh draw each call, as each pipeline call draws it, so the builder is ``drawn``.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition

# prepare_latents' default (pipeline_hunyuanimage_refiner.py:345), the one __call__ uses (:614-624 passes no strength)
STRENGTH = 0.25


@condition("hunyuan_image_refiner", drawn=True)
def _hunyuan_image_refiner(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    from diffusers.utils.torch_utils import randn_tensor

    # the pipeline's shape (B, C, 1, h, w) (:350): the same draws as the latents' (B, C, h, w), one frame
    shape = (latents.shape[0], latents.shape[1], 1, *latents.shape[-2:])
    noise = randn_tensor(shape, generator=generator, device=latents.device, dtype=latents.dtype).view(latents.shape)
    return STRENGTH * noise + (1 - STRENGTH) * latents
