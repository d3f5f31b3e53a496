"""Layer 4: the programs as library functions (no argparse): demo, text-to-image, video.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "run_demo": "demo", "difference": "demo",
    "generate": "image",
    "ClipResult": "video", "generate_clip": "video", "generate_batch": "video", "load_video_pipeline": "video",
    "plan_outputs": "video", "save_video": "video",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
