"""What other libraries print while they import is kept from the command line's user.

diffusers and transformers import every installed quantization backend (their ``quantizers/auto.py``), and those
print on import: bitsandbytes a missing kernel package, torchao its CUDA libraries in a CPU torch and torch's Enum
deprecations, transformers its PIL fallback. :func:`install` holds back everything written during such an import
(warnings, log records, the process's stderr) and lets it through only when the import fails; bitsandbytes
(:data:`DEFERRED`) is imported, held back alike, only when a 4-bit or 8-bit component first reads it, saving other
models its import time. :func:`library_logs` says in our words, once, what diffusers and transformers log that
changes what the user gets. The command line installs both; the library itself changes nothing.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import io
import logging
import os
import re
import sys
import tempfile
import types
import warnings
from collections.abc import Iterator
from typing import Any

__all__ = ["install", "held_back", "library_logs", "in_our_words"]

# The packages whose first import is held back; their own imports of each other happen inside it.
NOISY = ("diffusers", "transformers", "torchao", "bitsandbytes", "optimum", "gguf", "peft", "accelerate")

# Imported on first use, not when diffusers' quantizers/auto.py imports every installed backend: bitsandbytes
# (bound at import by diffusers quantizers/bitsandbytes/utils.py, read only inside its functions) takes seconds to
# import, and a command on a model without 4-bit or 8-bit components never reads it.
DEFERRED = ("bitsandbytes",)

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
            _repoint(text, stderr)
            _depth -= 1


def _repoint(held: io.StringIO, stderr: Any) -> None:
    """A log handler made inside the block (diffusers and transformers make theirs on import, on ``sys.stderr``)
    writes where stderr was before it, not into the block's buffer, which nobody reads after it."""
    loggers = [logging.root, *(v for v in logging.root.manager.loggerDict.values() if isinstance(v, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is held:
                handler.setStream(stderr)


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


class _Deferred(types.ModuleType):
    """A module whose code runs when something first reads a name it would define. ``__file__`` and ``__spec__`` exist
    before (``inspect.getmodule``, called by torch's op registration, would load a ``LazyLoader`` module at once);
    ``__path__`` does not, so a submodule import runs the package's ``__init__`` first, as a plain import does.
    """

    def __getattr__(self, name: str) -> Any:
        spec = object.__getattribute__(self, "__spec__")
        self.__class__ = types.ModuleType
        if spec.submodule_search_locations is not None:
            self.__path__ = spec.submodule_search_locations
        try:
            spec.loader.exec_module(self)
        except BaseException:
            sys.modules.pop(spec.name, None)  # as a failed plain import leaves it: the next import tries again
            raise
        return getattr(self, name)


class _DeferredLoader(_HeldLoader):
    def exec_module(self, module: Any) -> None:
        module.__dict__.pop("__path__", None)
        module.__spec__.loader = _HeldLoader(self.loader)
        module.__class__ = _Deferred


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
            spec.loader = (_DeferredLoader if name in DEFERRED else _HeldLoader)(spec.loader)
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


# The libraries whose log records a command routes: every module logger of theirs propagates to these, whose own
# handlers print to stderr (diffusers.utils.logging, transformers.utils.logging).
LIBRARIES = ("diffusers", "transformers")
_STYLE = re.compile(r"\x1b\[[0-9;]*m")
_REPORT = re.compile(r"(\w+) LOAD REPORT from: (.+)")


def in_our_words(message: str) -> str | None:
    """What a library log message means for the user, in our words, or None where it changes nothing they get:
    transformers' load report's MISSING and MISMATCH weights are initialized at random (the outputs change);
    UNEXPECTED ones (unused, as a full CLIP checkpoint's vision tower) are ignored.

    Example:
        >>> report = "BertModel LOAD REPORT from: /m/text_encoder\\nKey | Status |\\npooler.dense.bias | MISSING |"
        >>> in_our_words(report + "\\nlm_head | UNEXPECTED |")
        'text_encoder (BertModel): 1 weight(s) not in its checkpoint were initialized at random: pooler.dense.bias'
        >>> in_our_words("true_cfg_scale is passed as 4.0, but classifier-free guidance is not enabled") is None
        True
    """
    head, _, rest = _STYLE.sub("", message).partition("\n")
    report = _REPORT.match(head.strip())
    if report is None:
        return None
    cells = [[c.strip() for c in row.split("|")] for row in rest.splitlines() if row.count("|") >= 2]
    lost = sorted(c[0] for c in cells if c[1] in ("MISSING", "MISMATCH"))  # transformers lists them from a set
    if not lost:
        return None
    source = report.group(2).strip()
    shown = ", ".join(lost[:4]) + (f" and {len(lost) - 4} more" if len(lost) > 4 else "")
    return (f"{os.path.basename(source.rstrip('/')) or source} ({report.group(1)}): {len(lost)} weight(s) not in its "
            f"checkpoint were initialized at random: {shown}")


class _Route(logging.Handler):
    """Goes first among a library's handlers inside :func:`library_logs`; the others get :data:`_ERRORS_ONLY` there,
    also one a library adds inside the block (its first import configures its logger)."""

    def __init__(self, prog: str):
        super().__init__()
        self.prog, self.held, self.said, self.muted = prog, [], set(), []

    def mute(self, logger: logging.Logger) -> None:
        for handler in logger.handlers:
            if handler is not self and _ERRORS_ONLY not in handler.filters:
                handler.addFilter(_ERRORS_ONLY)
                self.muted.append(handler)

    def hold_warning(self, message: Any, category: Any, filename: str, lineno: int) -> bool:
        """Hold a Python warning raised in a library's own file as its log records are held (torch's autocast notice
        from diffusers' transformer_mochi.py, about a float32 autocast diffusers asks for on the CPU)."""
        path = os.path.realpath(filename)
        homes = [os.path.dirname(os.path.realpath(getattr(sys.modules.get(name), "__file__", None) or "/"))
                 for name in LIBRARIES if name in sys.modules]
        if not any(path.startswith(home + os.sep) for home in homes if home != "/"):
            return False
        self.held.append(f"{filename}:{lineno}: {category.__name__}: {message}")
        return True

    def emit(self, record: logging.LogRecord) -> None:
        self.mute(logging.getLogger(record.name.split(".")[0]))  # before the later handlers see this record
        if record.levelno >= logging.ERROR:  # the library failing: its own handlers say it as it says it
            return
        note = in_our_words(record.getMessage())
        if note is None:
            self.held.append(record.getMessage())
        elif note not in self.said:
            self.said.add(note)
            print(f"{self.prog}: note: {note}", file=sys.stderr)


class _ErrorsOnly(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


_ERRORS_ONLY = _ErrorsOnly()


@contextlib.contextmanager
def library_logs(prog: str) -> Iterator[_Route]:
    """Inside the block, what :data:`LIBRARIES` log below ERROR goes through us: what changes what the user gets is said
    once as ``PROG: note: ...`` (:func:`in_our_words`); the rest concerns the libraries' own calls (QwenImage's
    ``true_cfg_scale`` without a negative prompt, the ``timesteps`` LTX condition passes itself) and is held back,
    written as the library wrote it only if the block raises other than our own error. The block gets the router,
    whose ``hold_warning`` a warning printer calls (``our_warnings`` does).

    Example:
        >>> import contextlib, logging, sys
        >>> with library_logs("hf-precision check"), contextlib.redirect_stderr(sys.stdout):
        ...     logging.getLogger("diffusers.pipelines.x").warning("a notice about diffusers' own call")
        ...     logging.getLogger("transformers.modeling_utils").warning(
        ...         "BertModel LOAD REPORT from: /m/text_encoder\\npooler.bias | MISSING |")
        hf-precision check: note: text_encoder (BertModel): 1 weight(s) not in its checkpoint were initialized at random: pooler.bias
    """
    from ..errors import RecipeError

    loggers = [logging.getLogger(name) for name in LIBRARIES]
    route = _Route(prog)
    for logger in loggers:
        route.mute(logger)
        logger.handlers.insert(0, route)
    try:
        yield route
    except Exception as err:
        if route.held and not isinstance(err, RecipeError):
            sys.stderr.write("".join(f"{message}\n" for message in route.held))
        raise
    finally:
        for logger in loggers:
            if route in logger.handlers:
                logger.removeHandler(route)
        for handler in route.muted:
            handler.removeFilter(_ERRORS_ONLY)
