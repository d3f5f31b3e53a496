"""Krea 2's RoPE coordinates: one ``position_ids`` (text tokens + image tokens, 3) for the whole batch, the text at the
origin and each 2x2 latent patch at (0, row, column), as diffusers 0.42.1 pipeline_krea2.py ``prepare_position_ids``
builds them (:382-390, called with the prompt length and the packed grid, :608-610).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('krea2_position_ids')
def _krea2_position_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 0
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    grid = torch.zeros(h, w, 3, device=x0.device)
    grid[..., 1] = torch.arange(h, device=x0.device)[:, None]
    grid[..., 2] = torch.arange(w, device=x0.device)[None, :]
    return {"position_ids": torch.cat([torch.zeros(tokens, 3, device=x0.device), grid.reshape(h * w, 3)])}
