"""Kandinsky 5's rotary positions and scale: pipeline_kandinsky.py ``__call__`` (diffusers v0.42.1 :853-871):
``visual_rope_pos`` the latent frame, row and column indices of the 2x2-patched latents, ``text_rope_pos`` the text
tokens' indices, ``scale_factor`` from the picture's size in pixels (``_get_scale_factor``, :209-227) and no sparse
attention (``attention_type: regular``; the NABLA models build flex-attention masks, not trained here).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder("kandinsky5_rope")
def _kandinsky5_rope(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    _, frames, height, width, _ = x0.shape  # channels-last latents (B, F, H, W, C)
    _, ph, pw = module.config["patch_size"]
    dev = x0.device
    tokens = batch["prompt_embeds"].shape[1]
    # the pipeline counts pixels: latents x its VAE's spatial factor (the batch's vae_scale_factor; 8 on the meta plan)
    factor = int(batch.get("vae_scale_factor") or 8)
    in_480p = all(480 <= n * factor <= 854 for n in (height, width))
    # Kandinsky 5 Image (a 2D VAE: 4D latents before the layout's frame axis) passes no scale: [1.0, 1.0, 1.0]
    # (pipeline_kandinsky_t2i.py:711-712); the video pipelines scale by the size above
    scale = (1.0, 1.0, 1.0) if batch["latents"].dim() == 4 else (1, 2, 2) if in_480p else (1, 3.16, 3.16)
    return {"visual_rope_pos": [torch.arange(frames, device=dev), torch.arange(height // ph, device=dev),
                                torch.arange(width // pw, device=dev)],
            "text_rope_pos": torch.arange(tokens, device=dev),
            "scale_factor": scale, "sparse_params": None}
