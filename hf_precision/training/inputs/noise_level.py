"""The x4 upscaler's noise level: pipeline_stable_diffusion_upscale.py ``__call__`` passes ``class_labels =
noise_level`` (default 20), the noise added to the low-res image; a batch's own ``class_labels`` win.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder

NOISE_LEVEL = 20  # the pipeline's default noise_level: the class label and the low-res image's noise (upscale_low_res)


@builder('noise_level')
def _noise_level(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if batch.get("class_labels") is not None:
        return {"class_labels": batch["class_labels"]}
    if not module.config.get("num_class_embeds"):
        return {}
    level = batch.get("noise_level", NOISE_LEVEL)
    return {"class_labels": torch.as_tensor(level, device=x0.device).long().reshape(-1).expand(x0.shape[0])}
