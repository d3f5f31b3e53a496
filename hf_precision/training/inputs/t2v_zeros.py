"""Zeros in the extra channels, where the pipeline itself gives zeros: HunyuanVideo 1.5's text-to-video pipeline
feeds its I2V-capable transformer zero condition latents and a zero mask (pipeline_hunyuan_video1_5.py
``prepare_cond_latents_and_mask``: "both are zero tensors for t2v"), so its training does too; ``tp.loss`` fills them itself where a batch lacks them
(``zeros=True``), as that pipeline does.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("t2v_zeros", zeros=True)
def _t2v_zeros(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    from ..denoiser_rows import condition_channels, row_of

    module = tp._denoiser()
    shape = list(latents.shape)
    shape[1] = condition_channels(row_of(module), module)
    return latents.new_zeros(shape)
