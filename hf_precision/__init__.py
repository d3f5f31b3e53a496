"""hf_precision: declarative dtype and device recipes for Hugging Face diffusers pipelines.

Layers, each importing only the ones above it in this list (tests/test_layers.py enforces it):
``errors``/``dtypes`` -> ``recipe`` (torch-free) -> ``runtime`` -> ``diagnose`` -> ``training`` -> ``memory`` -> ``apps``
-> ``cli``;
``testing`` (tiny random-weight pipelines that ship) imports only ``errors``/``dtypes`` and diffusers.

Only names are bound here; each submodule is imported on first use (nothing happens at import time).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import face

__version__ = "0.1.0"

_EXPORTS = {
    "RecipeError": "errors",
    "Recipe": "recipe", "ComponentPolicy": "recipe", "get_recipe": "recipe", "list_recipes": "recipe",
    "DeviceProfile": "recipe", "device_profile": "recipe", "device_caps": "recipe", "list_presets": "recipe",
    "load_pipeline": "runtime", "apply_recipe": "runtime", "Applied": "runtime", "applied": "runtime",
    "plan": "diagnose", "Plan": "diagnose",
    "check": "diagnose", "CheckReport": "diagnose",
    "explain": "diagnose", "explain_error": "diagnose", "MismatchError": "diagnose",
    "calibrate": "diagnose", "CalibrationResult": "diagnose",
    "prepare_training": "training", "TrainingSetup": "training", "resolve_training": "training",
    "TrainingRecipe": "training",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .diagnose import CalibrationResult, CheckReport, MismatchError, Plan, calibrate, check, explain, explain_error, plan
    from .errors import RecipeError
    from .recipe import ComponentPolicy, DeviceProfile, Recipe, device_caps, device_profile, get_recipe, list_presets, list_recipes
    from .runtime import Applied, applied, apply_recipe, load_pipeline
    from .training import TrainingSetup, TrainingRecipe, prepare_training, resolve_training


__getattr__, __dir__ = face(__name__, _EXPORTS)
