"""The distilled guidance embedding (Flux, HunyuanVideo, FramePack, ...): pipeline_flux.py ``__call__`` passes
``guidance = torch.full([1], guidance_scale)`` when the transformer's config has ``guidance_embeds``; the row's
``guidance_scale`` is the factor a pipeline multiplies it by first (pipeline_hunyuan_video.py: 1000).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('guidance')
def _guidance(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not module.config.get("guidance_embeds"):
        return {}
    value = float(batch.get("guidance", 1.0))
    return {"guidance": torch.full((x0.shape[0],), value * row.guidance_scale, device=x0.device)}
