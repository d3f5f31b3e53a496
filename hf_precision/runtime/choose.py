"""Which shipped recipe a pipeline object, a folder or a dict of components is trained or loaded under:
:func:`recipe_of`, the one door for all three.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import torch

from ..recipe.catalog import recipe_classes
from ..recipe.recognise import recipe_for_parts
from .apply import config_dict
from .source import composable_models, locate

__all__ = ["recipe_of"]


def recipe_of(target: Any, caller: str = "recipe_of") -> str | None:
    """The shipped recipe of a pipeline object, a folder (Hub id, alias) or a dict of components, chosen one way.

    An object or folder by its class, as ``load_pipeline`` takes it; a dict by its components' classes and configs
    (:func:`hf_precision.recipe.recognise.recipe_for_parts`: SDXL's UNet has ``addition_embed_type: text_time``).
    ``None``: no shipped recipe lists the class (one is composed: :func:`hf_precision.recipe.catalog.recipe_for`).
    RecipeError: a dict no recipe plans or that two fit (it asks for ``recipe=``); a ``_class_name`` diffusers lacks.

    Example:
        >>> from hf_precision.runtime.source import CONFIGS_DIR
        >>> from hf_precision.testing import make_pipeline
        >>> pipe = make_pipeline("sdxl_refiner")
        >>> recipe_of(pipe), recipe_of(dict(pipe.components)), recipe_of(CONFIGS_DIR / "stable-diffusion-v1-5")
        ('sdxl', 'sdxl', 'sd15')
    """
    if isinstance(target, Mapping):
        parts = {str(n): (type(m).__name__, config_dict(m)) for n, m in target.items() if isinstance(m, torch.nn.Module)}
        return recipe_for_parts(parts, caller)
    if isinstance(target, (str, os.PathLike)):
        where, index, _ = locate(target)
        found = recipe_classes().get(str(index.get("_class_name")))
        if found is None:
            composable_models(where, index)  # refuses a class diffusers does not ship, naming the close ones
        return found
    return recipe_classes().get(type(target).__name__)
