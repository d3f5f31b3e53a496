"""SkyReels-V2's frame-rate flag: a transformer whose config has ``inject_sample_info`` (DF-1.3B-540P,
scripts/convert_skyreelsv2_to_diffusers.py:85-97) adds an embedding of it to every modulation and reads ``fps`` on
every call (transformer_skyreels_v2.py:710-719). The diffusion-forcing pipelines pass ``fps`` (default 24) as one
flag per sample, 0 for 16 fps and 1 otherwise (pipeline_skyreels_v2_diffusion_forcing.py:625, :767-768). Other
SkyReels-V2 transformers ignore it, and the text-to-video pipeline passes none (pipeline_skyreels_v2.py:554-560).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('skyreels_fps')
def _skyreels_fps(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not getattr(module.config, "inject_sample_info", False):
        return {}
    fps = torch.as_tensor(batch.get("fps", 24), device=x0.device).reshape(-1).expand(x0.shape[0])
    return {"fps": (fps != 16).long()}
