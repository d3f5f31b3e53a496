"""Allegro's 3D rotary tables and positions: pipeline_allegro.py ``_prepare_rotary_positional_embeddings``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('allegro_rotary')
def _allegro_rotary(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    # from latent sizes: the pipeline divides pixel sizes by the VAE factor first
    config, p = module.config, int(module.config["patch_size"])
    grid = (x0.shape[-2] // p, x0.shape[-1] // p)
    *freqs, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=int(config["attention_head_dim"]), crops_coords=((0, 0), grid), grid_size=grid,
        temporal_size=x0.shape[2], device=x0.device,
        interpolation_scale=(config["interpolation_scale_t"], config["interpolation_scale_h"], config["interpolation_scale_w"]))
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    return {"image_rotary_emb": (tuple(freqs), tuple(pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()))}
