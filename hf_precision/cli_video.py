"""``hf-precision video``: image-to-video with Stable Video Diffusion (the same options as scripts/generate_video.py)."""

from __future__ import annotations

import argparse

from .cli import command


@command("video", "image-to-video with Stable Video Diffusion: mp4, gif or PNG frames (try --demo)",
         "hf_precision.video:run")
def _args_video(p: argparse.ArgumentParser) -> None:
    from .video import add_arguments

    add_arguments(p)
