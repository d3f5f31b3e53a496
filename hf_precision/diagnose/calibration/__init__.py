"""calibrate: measure where a pipeline leaves the half dtype's range and write the float32 islands that fix it.

Every tool keeps its fp32 islands by hand (diffusers ``_keep_in_fp32_modules``, ComfyUI's fp16 clamps, A1111's
``--no-half-vae``); a fine-tune or a merge that overflows somewhere else gives black images. calibrate measures, in
the order of docs/calibrate.md (``method``): a reference run records every module's range (``record``), the islands
follow from it and from half runs that are not finite or too far from the reference (``search``), and the result is
an override file with the measured numbers as comments (``report``). ``session`` borrows the pipeline for the runs and
hands it back as it came; ``memory`` says whether the runs fit.

The package is named ``calibration`` rather than ``calibrate``: importing a submodule binds its name on the parent
package, which would replace the function ``hf_precision.diagnose.calibrate`` by the module.

Names are bound lazily: a submodule is imported on first use.
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
