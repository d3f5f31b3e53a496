"""Wan-Animate's pose latents and face video: pipeline_wan_animate.py ``__call__`` (``pose_hidden_states``,
``face_pixel_values``). The latents' first frame is the reference image, so the pose latents have one frame fewer,
and the face video has the segment's pixel frames (4 per latent frame after the first) at the motion encoder's
size. Without them: zero pose latents and the pipeline's unconditional face (all pixels -1).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('wan_animate')
def _wan_animate(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    b, c, f, h, w = x0.shape
    pose = batch.get("pose_latents")
    face = batch.get("face_pixel_values")
    if face is None:
        size = int(module.config["motion_encoder_size"])
        face = x0.new_full((b, 3, 4 * (f - 2) + 1, size, size), -1.0)
    return {"pose_hidden_states": x0.new_zeros(b, c, f - 1, h, w) if pose is None else pose, "face_pixel_values": face}
