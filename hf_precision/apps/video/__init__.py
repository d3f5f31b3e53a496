"""The video program as library functions: text/image-to-video for every diffusers video family.

``io`` (jobs, outputs), ``spec`` (a pipeline's rules), ``load`` (with recipe and memory features), ``memory`` (peak
per phase), ``run`` (the generator and batch loop), ``plan`` (the memory plan), ``devices`` (``--device-map
balanced``), ``parallel`` (context parallelism). ``hf-precision video`` and ``scripts/generate_video.py`` call
:func:`generate_batch`. Submodules load lazily.
"""

from __future__ import annotations

from ...lazy import face

_EXPORTS = {
    "FORMATS": "io", "Job": "io", "check_out": "io", "plan_outputs": "io", "read_image": "io", "read_prompts": "io",
    "save_video": "io",
    "VideoRow": "spec", "VideoSpec": "spec", "model_spec": "spec", "spec_of": "spec", "video_row": "spec",
    "video_spec": "spec",
    "MemorySettings": "load", "load_video_pipeline": "load",
    "PhaseMemory": "memory",
    "BatchOptions": "run", "ClipResult": "run", "generate_batch": "run", "generate_clip": "run",
    "Choice": "plan", "Prediction": "plan", "choose": "plan", "predict": "plan",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
