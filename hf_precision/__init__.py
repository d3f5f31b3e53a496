"""hf_precision: declarative dtype and device recipes for Hugging Face diffusers pipelines.

Only names are bound here; each submodule is imported on first use (nothing happens at import time).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "RecipeError": "errors",
    "Recipe": "recipe", "ComponentPlan": "recipe", "get_recipe": "recipe", "list_recipes": "recipe",
    "DeviceProfile": "devices", "device_profile": "devices", "device_caps": "devices", "list_presets": "devices",
    "load_pipeline": "load", "apply_recipe": "apply", "Applied": "apply",
    "plan": "planner", "Plan": "planner",
    "check": "checker", "CheckReport": "checker",
    "explain": "mismatch", "MismatchError": "mismatch",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
    from .apply import Applied, apply_recipe
    from .checker import CheckReport, check
    from .devices import DeviceProfile, device_caps, device_profile, list_presets
    from .errors import RecipeError
    from .mismatch import MismatchError, explain
    from .load import load_pipeline
    from .planner import Plan, plan
    from .recipe import ComponentPlan, Recipe, get_recipe, list_recipes


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_precision' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
