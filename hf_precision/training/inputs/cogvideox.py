"""CogVideoX's rotary tables (pipeline_cogvideox.py ``_prepare_rotary_positional_embeddings``) where the
config uses them, and CogVideoX 1.5 image-to-video's ``ofs`` (pipeline_cogvideox_image2video.py ``__call__``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('cogvideox')
def _cogvideox(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config = module.config
    out: dict[str, Any] = {}
    if config.get("ofs_embed_dim"):  # CogVideoX 1.5 I2V: pipeline_cogvideox_image2video.py passes ofs = 2.0
        out["ofs"] = x0.new_full((1,), 2.0)
    if not config.get("use_rotary_positional_embeddings"):
        return out
    # pipeline_cogvideox.py _prepare_rotary_positional_embeddings, from latent sizes (the pipeline divides pixel sizes
    # by the VAE factor first): CogVideoX 1.0 crops a grid centred in the base size, 1.5 (patch_size_t) slices one
    # from the maximum size
    frames, p, p_t = x0.shape[1], int(config["patch_size"]), config.get("patch_size_t")
    grid = (x0.shape[-2] // p, x0.shape[-1] // p)
    base_h, base_w = int(config["sample_height"]) // p, int(config["sample_width"]) // p
    dim = int(config["attention_head_dim"])
    if p_t is None:
        crops = get_resize_crop_region_for_grid(grid, base_w, base_h)
        cos, sin = get_3d_rotary_pos_embed(embed_dim=dim, crops_coords=crops, grid_size=grid, temporal_size=frames,
                                           device=x0.device)
    else:
        cos, sin = get_3d_rotary_pos_embed(embed_dim=dim, crops_coords=None, grid_size=grid, grid_type="slice",
                                           temporal_size=(frames + p_t - 1) // p_t, max_size=(base_h, base_w),
                                           device=x0.device)
    out["image_rotary_emb"] = (cos.float(), sin.float())
    return out
