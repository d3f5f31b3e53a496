"""Lazy package faces: a package binds public names to submodules and imports a submodule on first use.

Every sub-package ``__init__`` uses this, so ``import hf_precision.recipe`` (torch-free) never pulls torch in
through a sibling, and nothing runs at import time.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["face"]


def face(package: str, exports: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """Build a package's ``__getattr__`` and ``__dir__`` from ``{public name: submodule}``.

    Example:
        >>> getattr_, dir_ = face("hf_precision.recipe", {"get_recipe": "resolution"})
        >>> getattr_("get_recipe").__name__
        'get_recipe'
        >>> getattr_("files").__name__     # a submodule not listed is imported on first use
        'hf_precision.recipe.files'
    """
    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            # ``hp.training.prepare_training`` works without ``import hf_precision.training`` first, as it does
            # for an eagerly imported package; private and unknown names stay AttributeErrors.
            if not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None:
                return importlib.import_module(f"{package}.{name}")
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(f"{package}.{module}"), name)
        setattr(importlib.import_module(package), name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(importlib.import_module(package))) | set(exports))

    return __getattr__, __dir__
