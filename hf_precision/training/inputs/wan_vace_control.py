"""Wan VACE's control input for text-to-video training, as diffusers 0.42.1 pipelines/wan/pipeline_wan_vace.py
``__call__`` builds it without a conditioning video (``video=None, mask=None``, :910-926): ``preprocess_conditions``
makes a zero video and an all-ones mask (:450-458); ``prepare_video_latents`` encodes the video's inactive part
``video * (1 - mask)`` and reactive part ``video * mask`` at the VAE's mode, each normalised
``(z - latents_mean) / latents_std``, and concatenates them (:559-566: 2 x z_dim channels, the latents of a black
video, which are not zeros); ``prepare_masks`` folds the mask's 8 x 8 pixel blocks into 64 channels at the latent
frames' count (:613-632); __call__ concatenates the two (:925). The transformer takes the result as
``control_hidden_states``, an argument of its own (the row's ``optional`` ``control_latents``), so training feeds what
sampling feeds rather than zeros.

The pipeline's own methods run here, one clip at a time as they require (:539, :601); only the clip's size and frame
count matter, not its pixels: a text-to-video run conditions on nothing.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("wan_vace_control")
def _wan_vace_control(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> dict[str, torch.Tensor]:
    pipe, device = tp.pipe, tp.device
    b, _, frames, height, width = pixels.shape
    with torch.no_grad():
        video, mask, references = pipe.preprocess_conditions(None, None, None, 1, height, width, frames,
                                                             torch.float32, device)
        control = pipe.prepare_video_latents(video, mask, references, generator, device)
        control = torch.cat([control, pipe.prepare_masks(mask, references, generator)], dim=1)
    # the same for every clip of one size: the conditioning is a black video, whatever the sample shows
    return {"control_latents": control.float().expand(b, *control.shape[1:]).clone()}
