"""Which pipeline recipe a training set-up is planned under: the caller's ``recipe=`` (checked), else the one the
pipeline, folder or dict of components is recognised as (:mod:`hf_precision.runtime.choose`)."""

from __future__ import annotations

from typing import Any

from ..recipe.catalog import list_recipes, pipeline_file, unknown_recipe
from .rules import TrainingError

__all__ = ["recipe_name"]


def recipe_name(pipe: Any, recipe: Any) -> str | None:
    """The recipe named with ``recipe=`` (checked), else the one :func:`~hf_precision.runtime.choose.recipe_of`
    picks for a pipeline, a folder or a dict of components.

    Example:
        >>> recipe_name(None, "sdxl")
        'sdxl'
    """
    from ..runtime.choose import recipe_of

    if recipe is None:
        return recipe_of(pipe, "prepare_training")  # None: composed from the classes of a pipeline no recipe lists
    if not isinstance(recipe, str):
        raise TrainingError(f"prepare_training: recipe= takes a pipeline recipe's name (recipe='sdxl') or a recipe "
                            f"YAML file, got {type(recipe).__name__}")
    if recipe.endswith((".yaml", ".yml")):
        pipeline_file(recipe)  # a missing or invalid file: one error naming it
        return recipe
    if recipe not in list_recipes("pipeline"):
        if recipe in list_recipes("component"):
            raise TrainingError(f"prepare_training: recipe {recipe!r} is a component recipe; training plans every "
                                f"component: name a pipeline recipe ({', '.join(list_recipes('pipeline'))})")
        raise unknown_recipe(recipe)
    return recipe
