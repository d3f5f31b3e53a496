"""calibrate: measure where a pipeline leaves the half dtype's range and write the float32 islands that fix it.

Every tool keeps its fp32 islands by hand (diffusers ``_keep_in_fp32_modules``, ComfyUI's fp16 clamps, A1111's
``--no-half-vae``); a fine-tune that overflows elsewhere gives black images. In docs/calibrate.md's order
(``method``): a reference run records every module's range (``record``), islands follow from it and from half runs
that are not finite or too far off (``search``), and an override file carries the numbers as comments (``report``);
``session`` borrows the pipeline and hands it back, ``memory`` says whether the runs fit. Not named ``calibrate``:
importing a submodule would bind it over the function ``hf_precision.diagnose.calibrate``. Submodules load lazily.
"""

from __future__ import annotations

from ...lazy import face

_EXPORTS = {
    "calibrate": "method",
    "CalibrationResult": "report", "Evidence": "report", "RunError": "report",
    "Recorder": "record",
    "Session": "session",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
