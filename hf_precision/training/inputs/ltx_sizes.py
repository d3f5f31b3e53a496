"""LTX-Video's latent grid, which its transformer needs to place the packed tokens' RoPE positions:
pipeline_ltx.py ``__call__`` calls it with ``num_frames=latent_num_frames, height=latent_height,
width=latent_width``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('ltx_sizes')
def _ltx_sizes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    return {"num_frames": x0.shape[2], "height": x0.shape[3], "width": x0.shape[4]}
