"""Ovis-Image's RoPE position ids: ``img_ids`` (0, row, column) of each 2x2 latent patch, as Flux's
(pipeline_ovis_image.py ``_prepare_latent_image_ids``, :365-376), and ``txt_ids`` (0, i, i) for prompt token i, on the
diagonal of the image grid rather than Flux's zeros (``_prepare_prompt_embeds``, :263-265).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('ovis_ids')
def _ovis_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    img = torch.zeros(h, w, 3, device=x0.device)
    img[..., 1] += torch.arange(h, device=x0.device)[:, None]
    img[..., 2] += torch.arange(w, device=x0.device)[None, :]
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    txt = torch.zeros(tokens, 3, device=x0.device)
    txt[:, 1] = txt[:, 2] = torch.arange(tokens, device=x0.device)
    return {"img_ids": img.reshape(h * w, 3), "txt_ids": txt}
