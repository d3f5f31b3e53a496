"""PixArt-alpha's micro-conditioning: pipeline_pixart_alpha.py ``__call__`` (step 6.1) passes ``added_cond_kwargs``
with the pixel ``resolution`` and ``aspect_ratio`` when the transformer uses additional conditions (the 1024px
model), else both ``None``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, pixel_size


@builder('pixart_micro')
def _pixart_micro(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not getattr(module, "use_additional_conditions", False):
        return {"added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}
    b, (h, w) = x0.shape[0], pixel_size(batch, x0)
    return {"added_cond_kwargs": {"resolution": torch.tensor([[h, w]], device=x0.device, dtype=torch.float32).expand(b, 2),
                                  "aspect_ratio": torch.tensor([[h / w]], device=x0.device).expand(b, 1)}}
