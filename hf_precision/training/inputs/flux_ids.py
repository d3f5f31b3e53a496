"""Flux's RoPE position ids: ``img_ids`` (row and column of each 2x2 latent patch) as pipeline_flux.py
``_prepare_latent_image_ids`` builds them, and ``txt_ids``, zeros, one per prompt token, as pipeline_flux.py
``encode_prompt`` returns them. A reference image (Flux Kontext) gets its own patches' ids after them, with index 0
set to 1 (pipeline_flux_kontext.py ``prepare_latents``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, reference_latents


@builder('flux_ids')
def _flux_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    ids = [_ids(x0, 0)] + [_ids(r, 1) for r in reference_latents(row, batch)]
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    return {"img_ids": torch.cat(ids), "txt_ids": torch.zeros(tokens, 3, device=x0.device)}


def _ids(latents: torch.Tensor, index: float) -> torch.Tensor:
    h, w = latents.shape[-2] // 2, latents.shape[-1] // 2
    img = torch.zeros(h, w, 3, device=latents.device)
    img[..., 0] = index
    img[..., 1] += torch.arange(h, device=latents.device)[:, None]
    img[..., 2] += torch.arange(w, device=latents.device)[None, :]
    return img.reshape(h * w, 3)
