"""Finding and safely reading the YAML files: packaged recipes, device rules, user overrides."""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from .errors import RecipeError

__all__ = ["recipes_dir", "read_yaml", "parse_yaml"]


@lru_cache(maxsize=1)
def recipes_dir() -> Path:
    """The folder holding the shipped recipes.

    In an installed wheel it is ``hf_precision/recipes``; in a source checkout the top-level ``recipes/``.
    """
    here = Path(__file__).resolve().parent
    for candidate in (here / "recipes", here.parent / "recipes"):
        if (candidate / "devices.yaml").is_file():
            return candidate
    raise RecipeError(f"hf_precision's recipes are missing (looked in {here / 'recipes'} and {here.parent / 'recipes'}); "
                      "reinstall the package: pip install --force-reinstall hf-precision")


def parse_yaml(text: str, source: str) -> Any:
    """Parse YAML with the safe loader; malformed YAML and Python-object tags become one ``RecipeError``."""
    import yaml

    # libyaml's safe loader when PyYAML has it (same rules, ~10x faster: recipes are read on every load).
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        return yaml.load(text, Loader=loader)
    except yaml.constructor.ConstructorError as err:
        mark = err.problem_mark
        line = f" line {mark.line + 1}" if mark is not None else ""
        raise RecipeError(f"{source}:{line}: refused YAML tag ({err.problem}); recipes are plain data: "
                          "remove tags such as !!python/object and write plain mappings, lists and strings") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err)
        raise RecipeError(f"{source}:{where}: malformed YAML ({problem}); fix the syntax there "
                          "(indentation, a missing ':' or an unclosed bracket)") from None


def read_yaml(path: str | Path) -> Any:
    """Read a YAML file safely; a missing or unreadable file is a ``RecipeError`` naming it."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RecipeError(f"{path}: file not found; check the path (relative paths are taken from {Path.cwd()})") from None
    except (OSError, UnicodeDecodeError) as err:
        raise RecipeError(f"{path}: cannot read it ({err}); pass a readable UTF-8 YAML file") from None
    return parse_yaml(text, str(path))
