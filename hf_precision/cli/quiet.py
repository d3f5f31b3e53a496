"""What other libraries print while they import is kept from the command line's user.

diffusers and transformers import every quantization backend that is installed (diffusers
``quantizers/auto.py``, transformers ``quantizers/auto.py``), and those print while they import: bitsandbytes that
an optional kernel package is missing (on an AVX512-BF16 CPU), torchao that its CUDA libraries do not load in a
CPU torch and, through torch, that its Enum registrations are deprecated; transformers that an image processor
falls back to PIL. None of it changes what a command does. :func:`install` holds back everything written while one
of these packages is first imported (Python warnings, log records, and the process's own stderr, where compiled
code writes) and lets it through only when that import fails, so a broken install still says why.

The command line installs it (``hf_precision.cli.main``, ``script_main``); the library itself changes nothing.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import io
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["install", "held_back"]

# The packages whose first import is held back; their own imports of each other happen inside it.
NOISY = ("diffusers", "transformers", "torchao", "bitsandbytes", "optimum", "gguf", "peft", "accelerate")

_depth = 0


@contextlib.contextmanager
def held_back() -> Iterator[None]:
    """Hold back warnings, log records and stderr (Python's and the file descriptor's) inside the block; write them
    out only if the block raises. Re-entrant: the outermost block holds back.

    Example:
        >>> import logging
        >>> with held_back():
        ...     logging.getLogger("somebody.else").warning("not shown")
    """
    global _depth
    if _depth:
        yield
        return
    _depth += 1
    stderr = sys.stderr
    saved_fd = None
    with tempfile.TemporaryFile(mode="w+b") as sink:
        try:
            stderr.flush()
            saved_fd = os.dup(2)
            os.dup2(sink.fileno(), 2)
        except (OSError, ValueError, AttributeError):  # no real fd 2 (an embedding host): Python's stream only
            saved_fd = None
        text = io.StringIO()
        previous = logging.root.manager.disable
        logging.disable(logging.WARNING)
        try:
            with warnings.catch_warnings(), contextlib.redirect_stderr(text):
                warnings.simplefilter("ignore")
                yield
        except BaseException:
            _restore(saved_fd)
            saved_fd = None
            sink.seek(0)
            stderr.write(sink.read().decode(errors="replace") + text.getvalue())
            raise
        finally:
            logging.disable(previous)
            _restore(saved_fd)
            _depth -= 1


def _restore(saved_fd: int | None) -> None:
    if saved_fd is not None:
        os.dup2(saved_fd, 2)
        os.close(saved_fd)


class _HeldLoader(importlib.abc.Loader):
    def __init__(self, loader: Any):
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        with held_back():
            self.loader.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...: the wrapped loader's
        return getattr(self.loader, name)


class _HeldFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in NOISY or name in sys.modules:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
            spec.loader = _HeldLoader(spec.loader)
        return spec


def install() -> None:
    """Hold back what :data:`NOISY` packages print on their first import in this process (idempotent).

    Example:
        >>> install(); install()
        >>> sum(isinstance(f, _HeldFinder) for f in sys.meta_path)
        1
    """
    if not any(isinstance(f, _HeldFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _HeldFinder())
