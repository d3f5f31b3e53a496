"""Layer 1, torch-free: recipe files, device rules and profiles, patterns, resolution into a frozen Recipe.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "Recipe": "resolution", "ComponentPlan": "resolution", "Decision": "resolution", "get_recipe": "resolution", "list_recipes": "resolution", "parse_set": "resolution", "pipeline_spec": "resolution",
    "resolve": "resolution", "training_overrides": "resolution", "recipe_for_class": "resolution", "placement": "resolution", "component_entries": "resolution",
    "compose_spec": "compose", "component_recipe_for": "compose", "recipe_components": "resolution",
    "DeviceProfile": "devices", "DeviceCaps": "devices", "SystemProbe": "devices", "device_profile": "devices", "device_caps": "devices", "set_probe": "devices", "list_presets": "devices", "rule_ids": "devices",
    "matches": "patterns", "match_modules": "patterns", "outermost": "patterns", "suggest": "patterns", "inside": "patterns", "resolve_islands": "patterns",
    "recipes_dir": "files", "read_yaml": "files", "parse_yaml": "files",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
