"""What a pipeline cannot be built or run without beyond diffusers' own dependencies: a recipe's ``requires:``,
checked by the loader and the training program before any weight is read (:func:`check_packages`); a plan needs none
and says so in one line (:func:`loading_note`). Torch-free; nothing is imported, only looked up.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from ..errors import RecipeError
from .catalog import pipeline_file, recipe_classes
from .model import Requirement

__all__ = ["Requirement", "requirements", "missing_packages", "check_packages", "loading_note"]


def requirements(data: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]] | None = None
                 ) -> tuple[Requirement, ...]:
    """The ``requires:`` rows of a recipe's data as :class:`Requirement` values, less those a folder's ``configs``
    make unneeded (:func:`unneeded`; a missing key is not taken for the value, the class's default may differ).

    Example:
        >>> requirements({"requires": [{"module": "x", "install": "pip install x", "why": "w", "pipelines": ["P"]}]})
        (Requirement(module='x', install='pip install x', why='w', pipelines=('P',), unless=()),)
        >>> row = {"module": "x", "install": "i", "why": "w", "unless": {"transformer": {"mask": False}}}
        >>> [len(requirements({"requires": [row]}, c)) for c in (None, {"transformer": {"mask": False}},
        ...                                                        {"transformer": {"mask": True}}, {"transformer": {}})]
        [1, 0, 1, 1]
    """
    rows = tuple(Requirement(str(row["module"]), str(row["install"]), " ".join(str(row["why"]).split()),
                             tuple(row.get("pipelines") or ()),
                             tuple((str(c), str(k), v) for c, values in (row.get("unless") or {}).items()
                                   for k, v in values.items()))
                 for row in data.get("requires") or ())
    return tuple(r for r in rows if not unneeded(r, configs))


def unneeded(row: Requirement, configs: Mapping[str, Mapping[str, Any]] | None) -> bool:
    """Whether a folder's ``configs`` make ``row`` unneeded: it has ``unless`` values and the configs hold them all.

    Example:
        >>> unneeded(Requirement("x", "i", "w", (), (("transformer", "mask", False),)), {"transformer": {"mask": False}})
        True
    """
    if not row.unless or configs is None:
        return False
    missing = object()

    def holds(component: str, key: str, value: Any) -> bool:
        found = (configs.get(component) or {}).get(key, missing)
        return type(found) is type(value) and found == value  # the type too: a config's 0 is not `false`

    return all(holds(*item) for item in row.unless)


def _rows(recipe: Any, configs: Mapping[str, Mapping[str, Any]] | None = None) -> Iterable[Requirement]:
    """The requirements of a Recipe, a recipe's data, name or file, or None, less the unneeded."""
    if recipe is None:
        return ()
    if isinstance(recipe, Mapping):
        return requirements(recipe, configs)
    if isinstance(recipe, str):
        return requirements(pipeline_file(recipe)[1], configs)
    return [r for r in getattr(recipe, "requires", ()) if not unneeded(r, configs)]


def missing_packages(recipe: Any, pipeline: str | None,
                     configs: Mapping[str, Mapping[str, Any]] | None = None) -> list[Requirement]:
    """What a recipe (as :func:`_rows` takes it) ``requires:`` for ``pipeline`` (None: every row) that cannot be
    imported here, looked up with ``importlib.util.find_spec``, never imported.

    Example:
        >>> [r.module for r in missing_packages(
        ...     {"requires": [{"module": "no_such_module_x", "install": "pip install x", "why": "w"},
        ...                   {"module": "yaml", "install": "pip install pyyaml", "why": "w"}]}, None)]
        ['no_such_module_x']
    """
    import importlib.util

    missing = []
    for row in _rows(recipe, configs):
        if pipeline is not None and row.pipelines and pipeline not in row.pipelines:
            continue
        try:
            found = importlib.util.find_spec(row.module) is not None
        except (ImportError, ValueError):  # a parent package that is missing
            found = False
        if not found:
            missing.append(row)
    return missing


def _shipped(recipe: Any, pipeline_class: str) -> Any:
    """``recipe``, or when None the shipped recipe that lists the class (None when no shipped recipe does)."""
    return recipe if recipe is not None else recipe_classes().get(pipeline_class)


def check_packages(recipe: Any, pipeline_class: str | None,
                   configs: Mapping[str, Mapping[str, Any]] | None = None) -> None:
    """Refuse, before any weight is read, a pipeline whose recipe ``requires:`` a package that cannot be imported
    here: one error naming each, why and how to install it. ``recipe`` None: the shipped one listing the class.

    Example:
        >>> check_packages("sdxl", "StableDiffusionXLPipeline")  # nothing beyond diffusers' own
        >>> check_packages(None, "MyOwnPipeline")  # no shipped recipe: nothing known to require
    """
    if not pipeline_class:
        return
    missing = missing_packages(_shipped(recipe, str(pipeline_class)), str(pipeline_class), configs)
    if missing:
        needs = "; and ".join(f"{r.module} ({r.why}): {r.install}" for r in missing)
        raise RecipeError(f"{pipeline_class} cannot be built or run without {needs}; install "
                          f"{'it' if len(missing) == 1 else 'them'} and run again")


def loading_note(recipe: Any, pipeline_class: str | None) -> str | None:
    """One line for a plan whose recipe ``requires:`` packages this Python cannot import; else None.

    Example:
        >>> loading_note({"requires": [{"module": "no_such_module_x", "install": "pip install x", "why": "w"}]}, "P")
        'note: loading P needs no_such_module_x, which this Python cannot import (pip install x); planning does not'
        >>> loading_note("sdxl", "StableDiffusionXLPipeline") is None
        True
    """
    if not pipeline_class:
        return None
    missing = missing_packages(_shipped(recipe, str(pipeline_class)), str(pipeline_class))
    if not missing:
        return None
    names = " and ".join(r.module for r in missing)
    return (f"note: loading {pipeline_class} needs {names}, which this Python cannot import "
            f"({'; '.join(r.install for r in missing)}); planning does not")
