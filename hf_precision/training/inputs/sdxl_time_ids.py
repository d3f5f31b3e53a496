"""SDXL's micro-conditioning: ``added_cond_kwargs`` with the pooled prompt (``text_embeds``) and the time ids, as
pipeline_stable_diffusion_xl.py ``_get_add_time_ids`` builds them (original size, crop top-left, target size), or the
refiner's form from pipeline_stable_diffusion_xl_img2img.py ``_get_add_time_ids`` (aesthetic score in place of the
target size). A UNet without ``addition_embed_type: text_time`` (SD 1.5, 2.x) gets nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, pixel_size


@builder('sdxl_time_ids')
def _sdxl_time_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if module.config.get("addition_embed_type") != "text_time":
        return {}
    b, (h, w) = x0.shape[0], pixel_size(batch, x0)
    ids = batch.get("add_time_ids")
    pooled = batch.get("pooled_prompt_embeds")
    if ids is None:  # original size, crop top-left, target size (pipeline_stable_diffusion_xl.py _get_add_time_ids)
        values = [h, w, 0, 0, h, w]
        if pooled is not None and _time_id_count(module.config, pooled.shape[-1]) == 5:
            # the refiner (requires_aesthetics_score): original size, crop top-left, aesthetic score (default 6.0),
            # pipeline_stable_diffusion_xl_img2img.py _get_add_time_ids
            values = [h, w, 0, 0, 6.0]
        ids = torch.tensor([values], dtype=torch.float32, device=x0.device).expand(b, len(values))
    return {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": ids}}


def _time_id_count(config: Any, pooled_dim: int) -> int:
    # the UNet's add_embedding takes pooled text + addition_time_embed_dim per time id
    return (int(config["projection_class_embeddings_input_dim"]) - pooled_dim) // int(config["addition_time_embed_dim"])
