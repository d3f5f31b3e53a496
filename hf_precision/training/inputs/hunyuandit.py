"""Hunyuan-DiT's 2D rotary table, image meta size and style: pipeline_hunyuandit.py ``__call__`` step 7
(``image_rotary_emb``, ``add_time_ids``, ``style``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder, pixel_size


@builder('hunyuandit')
def _hunyuandit(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    # pipeline_hunyuandit.py step 7, from latent sizes (the pipeline divides pixel sizes by 8 first)
    config, b, h, w = module.config, x0.shape[0], x0.shape[-2], x0.shape[-1]
    p = int(config["patch_size"])
    grid = (h // p, w // p)
    rotary = get_2d_rotary_pos_embed(module.inner_dim // module.num_heads, get_resize_crop_region_for_grid(grid, 64 // p),
                                     grid, device=x0.device, output_type="pt")
    out: dict[str, Any] = {"image_rotary_emb": tuple(t.float() for t in rotary)}
    if config.get("use_style_cond_and_image_meta_size"):
        ids = batch.get("add_time_ids")  # original size, target size, crop top-left, in pixels
        if ids is None:
            # one row per sample, in memory: the embedder flattens it with .view (embeddings.py
            # HunyuanCombinedTimestepTextSizeStyleEmbedding), which an expanded (stride 0) batch cannot give
            ph, pw = pixel_size(batch, x0)
            ids = torch.tensor([[ph, pw, ph, pw, 0, 0]], dtype=torch.float32, device=x0.device).repeat(b, 1)
        out.update(image_meta_size=ids, style=torch.zeros(b, dtype=torch.long, device=x0.device))
    return out
