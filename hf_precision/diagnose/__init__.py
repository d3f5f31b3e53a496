"""Layer 3: plans on the meta device, checks of a real run, explanations of mismatch errors.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "plan": "planner", "Plan": "planner", "PlannedComponent": "planner", "Island": "planner", "ModuleRow": "planner", "build_on_meta": "planner",
    "check": "checker", "CheckReport": "checker", "Mismatch": "checker", "ErasedIsland": "checker", "Drift": "checker", "Cast": "checker", "default_call": "call",
    "calibrate": "calibration", "CalibrationResult": "calibration",
    "MismatchError": "mismatch", "explain": "mismatch", "explain_error": "mismatch", "parse_mismatch": "mismatch",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
