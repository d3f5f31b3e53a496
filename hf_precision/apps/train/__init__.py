"""The training program (``hf-precision train``) as library functions: data, caches, checkpoints, the memory plan
and the loop. The precision rules live in :mod:`hf_precision.training`; this package only feeds it.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ...lazy import face

_EXPORTS = {
    "TrainData": "data", "ModelGeometry": "data", "model_geometry": "data", "read_data": "data",
    "Checkpoints": "checkpoint",
    "EncodingCache": "cache",
    "TrainSettings": "settings", "TrainResult": "loop", "train": "loop", "Run": "prepare", "prepare_run": "prepare",
    "predict_training": "plan", "TrainingPrediction": "plan", "Options": "plan",
    "make_demo": "demo",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
