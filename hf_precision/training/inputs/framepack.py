"""HunyuanVideo FramePack's history inputs: pipeline_hunyuan_video_framepack.py ``__call__``, its default inverted
anti-drifting sampling, the section next to the image (no padding): frame indices [prefix | window | history 1x,
2x, 4x]; the clean latents are the image latents then the 1x history. The history is zeros, as the pipeline's
history starts (:836-844).

The window is the frames the training step noises: the clip's frames after its first (the row's ``prefix_frame``,
:func:`hf_precision.training.denoiser_rows.noisy_inputs` cuts it off), for the pipeline's last section steps
``latent_window_size`` frames and puts the image's latents before them (:1016-1017). The prefix is the batch's
``image_latents`` (:mod:`.framepack_image` builds them; ``tp.loss`` refuses a batch without them), or zeros where
they are given as None (on purpose) or absent (the memory plans' meta calls).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('framepack')
def _framepack(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    b, c, f, h, w = x0.shape
    sizes = (1, 2, 16)
    history = batch.get("history_latents")
    history = x0.new_zeros(b, c, sum(sizes), h, w) if history is None else history[:, :, :sum(sizes)].to(x0)
    prefix = batch.get(row.prefix_frame) if getattr(row, "prefix_frame", None) else None
    prefix = x0.new_zeros(b, c, 1, h, w) if prefix is None else prefix.to(x0)
    latents_1x, latents_2x, latents_4x = history.split(sizes, dim=2)
    index_prefix, index_latents, index_1x, index_2x, index_4x = torch.arange(
        1 + f + sum(sizes), device=x0.device).split([1, f, *sizes])
    return {"indices_latents": index_latents, "latents_clean": torch.cat([prefix, latents_1x], dim=2),
            "indices_latents_clean": torch.cat([index_prefix, index_1x]), "latents_history_2x": latents_2x,
            "indices_latents_history_2x": index_2x, "latents_history_4x": latents_4x,
            "indices_latents_history_4x": index_4x}
