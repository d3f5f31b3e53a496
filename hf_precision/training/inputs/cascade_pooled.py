"""Stable Cascade's pooled text embeddings (``clip_text_pooled``), as (B, 1, D): pipeline_stable_cascade.py and
pipeline_stable_cascade_prior.py hand them so; zeros (the unconditional input) where the batch has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('cascade_pooled')
def _cascade_pooled(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # The pipelines hand pooled text embeddings as (B, 1, D); unet_stable_cascade.py get_clip_embeddings reads
    # size(1) of what it is given, so a (B, D) tensor would be mis-shaped.
    pooled = batch.get("pooled_prompt_embeds")
    if pooled is None:
        pooled = x0.new_zeros(x0.shape[0], 1, int(module.config["clip_text_pooled_in_channels"]))
    return {"clip_text_pooled": pooled if pooled.dim() == 3 else pooled[:, None]}
