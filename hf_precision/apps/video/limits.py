"""The sizes and frame counts a video model's configs bound, read in one place and used by every command.

A denoiser's position table fixes how far a clip reaches: Wan's rotary ``rope_max_seq_len``, AnimateDiff's
``motion_max_seq_length``, CogVideoX 5B I2V's learned ``sample_height`` x ``sample_width`` (embeddings.py
``CogVideoXPatchEmbed`` refuses any other) and Latte's ``video_length``; past them torch fails mid-run ("The size of
tensor a (9) must match the size of tensor b (8)"). ``video`` and ``calibrate`` cap their defaults
(:meth:`SizeLimits.cap`) and refuse larger asks (:meth:`SizeLimits.problems`), as ``train`` does (apps/train/data.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...memory.geometry import axis_value

__all__ = ["SizeLimits", "size_limits"]


@dataclasses.dataclass(frozen=True)
class SizeLimits:
    """What a model's configs allow, in pixels and frames (0: no bound), and the config key each comes from.

    Example:
        >>> lim = SizeLimits(max_frames=8, frames_why="motion modules have positions for 8 frames "
        ...                  "(motion_max_seq_length in unet's config)")
        >>> lim.cap(height=512, width=512, frames=16)
        (512, 512, 8)
        >>> lim.problems("AnimateDiffPipeline", height=32, width=32, frames=9)[0][:61]
        "--frames 9: AnimateDiffPipeline's motion modules have positio"
    """

    max_side: int = 0
    max_frames: int = 0
    fixed_size: tuple[int, int] = (0, 0)   # (height, width)
    fixed_frames: int = 0
    side_why: str = ""
    frames_why: str = ""

    def cap(self, *, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """A default (height, width, frames) brought within the limits: what a command runs when none was asked."""
        if self.fixed_size[0]:
            height, width = self.fixed_size
        if self.max_side:
            height, width = min(height, self.max_side), min(width, self.max_side)
        if self.fixed_frames:
            frames = self.fixed_frames
        elif self.max_frames:
            frames = min(frames, self.max_frames)
        return height, width, frames

    def problems(self, pipeline: str, *, height: int, width: int, frames: int) -> list[str]:
        """Why a size asked for is past the limits, one line each, naming the limit, its config key and the fix."""
        out = []
        if self.fixed_size[0] and (height, width) != self.fixed_size:
            h, w = self.fixed_size
            out.append(f"--height {height} --width {width}: {pipeline}'s {self.side_why}, so it takes {h}x{w} only; "
                       f"use --height {h} --width {w}")
        for name, value in (("height", height), ("width", width)):
            if self.max_side and value > self.max_side:
                out.append(f"--{name} {value}: {pipeline}'s {self.side_why}, so --{name} can be at most "
                           f"{self.max_side}; e.g. --{name} {self.max_side}")
        if self.fixed_frames and frames != self.fixed_frames:
            out.append(f"--frames {frames}: {pipeline}'s {self.frames_why}; use --frames {self.fixed_frames}")
        elif self.max_frames and frames > self.max_frames:
            out.append(f"--frames {frames}: {pipeline}'s {self.frames_why}, so --frames can be at most "
                       f"{self.max_frames}; e.g. --frames {self.max_frames}")
        return out


def size_limits(index: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]], denoiser: str, *,
                spatial: int, temporal: int, patch: int, init_default: Any) -> SizeLimits:
    """The :class:`SizeLimits` of a model from ``model_index.json`` and its configs (nothing loaded). ``spatial`` and
    ``temporal``: the VAE's factors; ``patch``: the denoiser's; ``init_default(spec, key)``: a key's class default.

    Example:
        >>> idx = {"unet": ["diffusers", "UNetMotionModel"]}
        >>> size_limits(idx, {"unet": {"motion_max_seq_length": 8}}, "unet", spatial=8, temporal=1, patch=1,
        ...             init_default=lambda spec, key: None).max_frames
        8
    """
    den = configs.get(denoiser, {})

    def key(name: str) -> int:
        return int(den.get(name) or init_default(index.get(denoiser), name) or 0)

    fixed = key("video_length")  # Latte: a temporal position embedding of that many frames
    frames_why = (f"transformer was built for {fixed} frames (video_length in its config: the temporal position "
                  f"embedding has that length)") if fixed else ""
    positions = key("rope_max_seq_len")
    if positions:  # Wan: each of latent frames, rows and columns, in patches, must fit the table
        t = max(temporal, 1) * axis_value(den.get("patch_size", 1), 0)
        most = (positions * t - 1) // max(temporal, 1) * max(temporal, 1) + 1
        return SizeLimits(max_side=positions * spatial * patch, max_frames=most, fixed_frames=fixed,
                          side_why=f"transformer has rotary positions for {positions} patches per side "
                                   f"(rope_max_seq_len in its config)",
                          frames_why=frames_why or f"transformer has rotary positions for {positions} latent frames "
                                                   f"(rope_max_seq_len in its config)")
    motion = next(((name, int(configs.get(name, {})["motion_max_seq_length"])) for name in (denoiser, "motion_adapter")
                   if (configs.get(name) or {}).get("motion_max_seq_length")), None)
    if motion:  # AnimateDiff: the motion modules' sinusoidal table (embeddings.py SinusoidalPositionalEmbedding)
        return SizeLimits(max_frames=motion[1], fixed_frames=fixed, frames_why=frames_why or (
            f"motion modules have positions for {motion[1]} frames (motion_max_seq_length in {motion[0]}'s config)"))
    if den.get("use_learned_positional_embeddings") and den.get("sample_height") and den.get("sample_width"):
        size = (int(den["sample_height"]) * spatial, int(den["sample_width"]) * spatial)
        return SizeLimits(fixed_size=size, fixed_frames=fixed, frames_why=frames_why,
                          side_why=f"transformer learned its positions for one size (sample_height x sample_width in "
                                   f"its config, {den['sample_height']}x{den['sample_width']} latents, times the VAE's "
                                   f"{spatial})")
    return SizeLimits(fixed_frames=fixed, frames_why=frames_why)
