"""ERNIE-Image's text: its ``encode_prompt`` returns one unpadded hidden-state sequence per prompt (a list; the training
cache keeps it so, as Z-Image's), and its ``__call__`` pads them with zeros into ``text_bth`` (B, longest, H) with
their lengths ``text_lens`` (diffusers 0.42.1 pipeline_ernie_image.py ``_pad_text``, :190-204, :333), which the
transformer turns into its attention mask. A (B, T, H) tensor (a batch made by hand) counts as B sequences of T.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('ernie_text')
def _ernie_text(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    text = batch.get("prompt_embeds")
    if text is None:
        return {}
    items = [t.squeeze(0) if t.dim() == 3 else t for t in text]
    longest = max(t.shape[0] for t in items)
    padded = torch.zeros(len(items), longest, items[0].shape[-1], device=x0.device, dtype=items[0].dtype)
    for i, t in enumerate(items):
        padded[i, :t.shape[0]] = t
    lens = torch.tensor([t.shape[0] for t in items], device=x0.device, dtype=torch.long)
    return {"text_bth": padded, "text_lens": lens}
