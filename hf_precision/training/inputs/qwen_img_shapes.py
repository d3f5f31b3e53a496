"""QwenImage's ``img_shapes``, the latent grid its RoPE positions span: pipeline_qwenimage.py ``__call__``,
``img_shapes = [[(1, height // vae_scale_factor // 2, width // vae_scale_factor // 2)]] * batch_size``; the Edit
pipelines add each reference image's grid after it (pipeline_qwenimage_edit.py / _edit_plus.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, reference_latents


@builder('qwen_img_shapes')
def _qwen_img_shapes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    grids = [(1, x.shape[-2] // 2, x.shape[-1] // 2) for x in (x0, *reference_latents(row, batch))]
    return {"img_shapes": [grids] * x0.shape[0]}
