"""Layer 1, torch-free: recipe files, device rules and profiles, patterns, resolution into a frozen Recipe.

Inside, one way: files, schema <- devices <- model <- catalog, overrides <- resolution (tests/test_layers.py).

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "Recipe": "model", "ComponentPolicy": "model", "Decision": "model",
    "get_recipe": "resolution", "resolve": "resolution", "placement": "resolution",
    "list_recipes": "catalog", "pipeline_spec": "catalog", "recipe_for": "catalog", "recipe_for_class": "catalog", "training_overrides": "catalog",
    "recipe_components": "catalog", "component_entries": "catalog", "compose_spec": "catalog", "component_recipe_for": "catalog",
    "parse_set": "overrides", "Override": "overrides",
    "DeviceProfile": "devices", "DeviceCaps": "devices", "SystemProbe": "devices", "device_profile": "devices", "device_caps": "devices", "set_probe": "devices", "list_presets": "devices", "rule_ids": "devices",
    "matches": "patterns", "match_modules": "patterns", "outermost": "patterns", "suggest": "patterns", "inside": "patterns", "resolve_islands": "patterns",
    "recipes_dir": "files", "read_yaml": "files", "parse_yaml": "files",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
