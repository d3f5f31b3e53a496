"""Chroma's joint attention mask: pipeline_chroma.py ``_get_t5_prompt_embeds`` keeps the prompt's tokens and the
first padding token, and ``_prepare_attention_mask`` appends one (attended) position per image token, so the mask
spans the whole text + image sequence the transformer attends over. No prompt mask: none, as the pipeline passes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('chroma_mask')
def _chroma_mask(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    mask = batch.get("prompt_attention_mask")
    if mask is None:
        return {}
    # The pipeline's mask is in the text encoder's float dtype (pipeline_chroma.py:251), so the bool image part
    # joins as 1.0 and the transformer gets the same float mask; an integer mask (a hand-made batch) goes the same way.
    mask = mask if mask.is_floating_point() else mask.float()
    tokens = (x0.shape[-2] // 2) * (x0.shape[-1] // 2)  # the 2x2 patches _pack_latents makes
    return {"attention_mask": torch.cat([mask, mask.new_ones(mask.shape[0], tokens)], dim=1)}
