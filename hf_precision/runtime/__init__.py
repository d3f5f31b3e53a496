"""Layer 2 (torch, diffusers): load a pipeline into its planned dtypes and make every boundary agree.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "load_pipeline": "load", "from_pretrained_dtypes": "load", "locate": "source", "component_configs": "source", "configs_of": "source", "shipped_configs": "source",
    "role_of": "source", "recipe_of": "choose", "models_of_pipeline": "source", "models_of_index": "source", "models_of_class": "source",
    "component_islands": "layout", "planned_dtypes": "layout", "drift": "layout", "layerwise_skip_regexes": "layout",
    "apply_recipe": "apply", "Applied": "apply", "applied": "apply", "torch_device": "placement", "same_device": "placement",
    "cast_tree": "hooks", "EntryHook": "hooks", "IslandHook": "hooks", "attach": "hooks",
    "read_header": "headers", "stream_component": "stream", "weight_files": "stream",
    "quiet_progress": "progress", "proc_bytes": "memory", "available_bytes": "memory", "build_on_meta": "meta",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
