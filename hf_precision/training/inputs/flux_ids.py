"""Flux's RoPE position ids: ``img_ids`` (row and column of each 2x2 latent patch) as pipeline_flux.py
``_prepare_latent_image_ids`` builds them, and ``txt_ids``, zeros, one per prompt token, as pipeline_flux.py
``encode_prompt`` returns them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('flux_ids')
def _flux_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    img = torch.zeros(h, w, 3, device=x0.device)
    img[..., 1] += torch.arange(h, device=x0.device)[:, None]
    img[..., 2] += torch.arange(w, device=x0.device)[None, :]
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    return {"img_ids": img.reshape(h * w, 3), "txt_ids": torch.zeros(tokens, 3, device=x0.device)}
