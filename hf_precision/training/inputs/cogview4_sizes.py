"""CogView4's micro-conditioning: pipeline_cogview4.py ``__call__`` passes ``original_size``, ``target_size`` (both the
picture's pixel (height, width) unless the caller gives another original size) and ``crop_coords`` (the crop's
top-left, default (0, 0)) to every transformer call, one row per sample (pipeline_cogview4.py:575-581, :625-631).
A batch may give its own (``original_size``, ``crops_coords_top_left``: one row or one per sample), as the data's
original sizes and crops.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, pixel_size


@builder('cogview4_sizes')
def _cogview4_sizes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    b, (h, w) = x0.shape[0], pixel_size(batch, x0)

    def rows(value: Any) -> torch.Tensor:
        # float32: the transformer embeds them sinusoidally in float32 before casting (the recipe never casts them)
        return torch.as_tensor(value, dtype=torch.float32, device=x0.device).reshape(-1, 2).expand(b, 2)

    return {"original_size": rows(batch.get("original_size", (h, w))), "target_size": rows((h, w)),
            "crop_coords": rows(batch.get("crops_coords_top_left", (0, 0)))}
