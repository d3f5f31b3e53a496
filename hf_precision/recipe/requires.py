"""What a pipeline cannot be built or run without beyond diffusers' own dependencies: a pipeline recipe's ``requires:``
list, checked as data by :mod:`.schema` and against what this Python can import
(:func:`check_packages`, called before anything loads). Torch-free; nothing is imported, only looked up.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError

__all__ = ["check_packages", "missing_packages"]


def missing_packages(data: Mapping[str, Any], pipeline: str | None) -> list[str]:
    """What a recipe's ``requires:`` holds for ``pipeline`` (every entry when None) that cannot be imported here,
    each as "MODULE (WHY): INSTALL". Only looked up (``importlib.util.find_spec``), never imported.

    Example:
        >>> missing_packages({"requires": [{"module": "no_such_module_x", "install": "pip install x", "why": "w"},
        ...                                {"module": "yaml", "install": "pip install pyyaml", "why": "w"}]}, None)
        ['no_such_module_x (w): pip install x']
    """
    import importlib.util

    missing = []
    for entry in data.get("requires") or ():
        if pipeline is not None and entry.get("pipelines") and pipeline not in entry["pipelines"]:
            continue
        try:
            found = importlib.util.find_spec(entry["module"]) is not None
        except (ImportError, ValueError):  # a parent package that is missing
            found = False
        if not found:
            missing.append(f"{entry['module']} ({entry['why']}): {entry['install']}")
    return missing


def check_packages(recipe: str | Mapping[str, Any] | None, pipeline_class: str | None) -> None:
    """Refuse, before anything loads, a pipeline whose recipe ``requires:`` a package that cannot be imported here:
    one error naming each one, why the pipeline needs it and how to install it. ``recipe`` None: the shipped one
    that lists the class, if any.

    Example:
        >>> check_packages("sdxl", "StableDiffusionXLPipeline")  # nothing beyond diffusers' own
        >>> check_packages(None, "MyOwnPipeline")  # no shipped recipe: nothing known to require
    """
    if not pipeline_class:
        return
    if recipe is None:
        from .catalog import recipe_classes

        recipe = recipe_classes().get(str(pipeline_class))
        if recipe is None:
            return
    from .catalog import pipeline_file

    data = pipeline_file(recipe)[1] if isinstance(recipe, str) else recipe
    missing = missing_packages(data, str(pipeline_class))
    if missing:
        raise RecipeError(f"{pipeline_class} cannot be built or run without {'; and '.join(missing)}; install "
                          f"{'it' if len(missing) == 1 else 'them'} and run again")
