"""QwenImage's ``img_shapes``, the latent grid its RoPE positions span: pipeline_qwenimage.py ``__call__``,
``img_shapes = [[(1, height // vae_scale_factor // 2, width // vae_scale_factor // 2)]] * batch_size``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('qwen_img_shapes')
def _qwen_img_shapes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    return {"img_shapes": [[(1, x0.shape[-2] // 2, x0.shape[-1] // 2)]] * x0.shape[0]}
