"""FLUX.2's 4-axis RoPE position ids (T, H, W, L): ``img_ids`` (0, row, column, 0) of each 2x2 latent patch, as
pipeline_flux2.py ``_prepare_latent_ids`` builds them (``torch.cartesian_prod`` over the patched latents' height and
width), and ``txt_ids`` (0, 0, 0, token index), one per prompt token, as ``_prepare_text_ids`` builds them for
``encode_prompt`` (pipeline_flux2_klein.py:267-283, :459). Both are per sample (B, N, 4).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('flux2_ids')
def _flux2_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    b, device = x0.shape[0], x0.device
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    zero = torch.arange(1, device=device)
    img = torch.cartesian_prod(zero, torch.arange(h, device=device), torch.arange(w, device=device), zero)
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    txt = torch.cartesian_prod(zero, zero, zero, torch.arange(tokens, device=device))
    return {"img_ids": img.unsqueeze(0).expand(b, -1, -1), "txt_ids": txt.unsqueeze(0).expand(b, -1, -1)}
