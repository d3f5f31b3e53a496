"""Stable Video Diffusion's ``added_time_ids``: fps - 1, motion bucket id, noise augmentation strength, as
pipeline_stable_video_diffusion.py ``_get_add_time_ids`` builds them from the pipeline's defaults (fps 7, motion
bucket 127, noise_aug_strength 0.02) when the batch has none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder

NOISE_AUG = 0.02  # the pipeline's default noise_aug_strength: the condition image's noise (svd_image) and its id


@builder('svd_time_ids')
def _svd_time_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    ids = batch.get("added_time_ids")
    if ids is None:  # fps - 1, motion bucket, noise augmentation (pipeline_stable_video_diffusion.py _get_add_time_ids)
        ids = torch.tensor([[6.0, 127.0, NOISE_AUG]], device=x0.device).expand(x0.shape[0], 3)
    return {"added_time_ids": ids}
