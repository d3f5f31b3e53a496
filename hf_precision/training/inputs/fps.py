"""I2VGen-XL's frame rate: pipeline_i2vgen_xl.py ``__call__``, ``fps_tensor`` = ``target_fps`` (default 16) per
sample.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('fps')
def _fps(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    return {"fps": torch.as_tensor(batch.get("fps", 16), device=x0.device).reshape(-1).expand(x0.shape[0])}
