"""The one error type users see for bad input, and a collector that reports every problem of a source at once."""

from __future__ import annotations

import contextlib
import contextvars
import reprlib
from collections.abc import Iterable, Iterator
from os import PathLike
from typing import Any

__all__ = ["RecipeError", "DamagedFileError", "Problems", "override_line", "override_lines", "override_flag", "override_fix",
           "excerpt", "arg", "command_line_spelling", "spelled"]


class RecipeError(ValueError):
    """Bad recipe, override, device or pipeline input.

    Every message names the source (file or ``dict``/``--set``), the key path, the bad value, what is
    allowed and the fix. Several problems found in one source are reported together, one per line.
    """

    def __init__(self, problems: str | Iterable[str]):
        if isinstance(problems, str):
            problems = [problems]
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(self.problems[0] if len(self.problems) == 1 else
                         f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems))


class DamagedFileError(RecipeError):
    """A model file (``model_index.json``, a ``config.json``, a ``.safetensors`` file) that exists but cannot be used.

    ``path`` is the file, ``component`` its pipeline component (``None`` for ``model_index.json``), ``problem`` what
    is wrong and ``fix`` how to get a good copy.

    Example:
        >>> err = DamagedFileError("/m/vae/config.json", "not valid JSON", "save it again", component="vae")
        >>> print(err)
        /m/vae/config.json (component vae): not valid JSON; save it again
    """

    def __init__(self, path: str | PathLike[str], problem: str, fix: str, *, component: str | None = None):
        self.path, self.problem, self.fix, self.component = str(path), problem, fix, component
        where = f"{self.path} (component {component})" if component else self.path
        super().__init__(f"{where}: {problem}; {fix}")


# One repr for every bad value an error quotes: bounded in length, and cheap even for a huge value (reprlib stops
# after a few items instead of building the whole repr first).
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxlist, _REPR.maxtuple, _REPR.maxdict, _REPR.maxset = 3, 6, 6, 6, 6
_REPR.maxstring = _REPR.maxother = _REPR.maxlong = 200


def excerpt(value: Any, limit: int = 80) -> str:
    """``repr(value)`` cut to at most ``limit`` characters, for quoting a bad value in an error message.

    Example:
        >>> excerpt("float16")
        "'float16'"
        >>> excerpt("x" * 10_000)
        "'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...(10,000 characters)"
    """
    text = _REPR.repr(value)
    if len(text) <= limit:
        return text
    size = f"{len(value):,} items" if isinstance(value, (list, tuple, dict, set)) else \
        f"{len(value):,} characters" if isinstance(value, str) else \
        f"{len(value):,} bytes" if isinstance(value, bytes) else "cut"
    tail = f"...({size})"
    return text[:max(limit - len(tail), 8)] + tail


class Problems:
    """Collects problems while walking a source, then raises them together."""

    def __init__(self, source: str):
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        where = f"{self.source}: {path}" if path else self.source
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            raise RecipeError(self.items)


def override_flag(component: str, key: str, value: object) -> str:
    """The value of one ``--set`` flag, ``component.key=value``; lists are written ``[a,b]`` (no spaces, no quotes).

    Example:
        >>> override_flag("vae", "keep_fp32", ["decoder.mid_block", "post_quant_conv"])
        'vae.keep_fp32=[decoder.mid_block,post_quant_conv]'
    """
    return f"{component}.{key}={_flag_value(value)}"


def override_line(component: str, key: str, value: object) -> str:
    """The one way every message spells a fix: the ``--set`` flag and the same override in YAML.

    Lists are written in flow style, so the line can be pasted into a shell (quoted) or a YAML file as is.

    Example:
        >>> override_line("unet", "dtype", "float16")
        '--set unet.dtype=float16 (YAML: components: {unet: {dtype: float16}})'
        >>> override_line("vae", "keep_fp32", ["decoder.mid_block", "post_quant_conv"])
        '--set vae.keep_fp32=[decoder.mid_block,post_quant_conv] (YAML: components: {vae: {keep_fp32: [decoder.mid_block, post_quant_conv]}})'
    """
    return override_lines([(component, key, value)])


# Override sources a Python caller wrote (load_pipeline's keywords, an overrides dict): their fixes are spelled as the
# keyword argument to pass; files and --set flags get the flag and the YAML.
PYTHON_SOURCES = ("load_pipeline ", "apply_recipe ", "overrides dict", "prepare_training ")


def override_fix(source: str, component: str, key: str, value: object) -> str:
    """The fix for a problem of one override ``source``, spelled the way that source was written: a Python keyword
    argument or dict gets ``overrides={...}`` (with the flag for the command line after it), a file or ``--set`` gets
    :func:`override_line`.

    Example:
        >>> override_fix("load_pipeline dtype=", "unet", "dtype", "float16")
        "overrides={'unet': {'dtype': 'float16'}} (CLI: --set unet.dtype=float16)"
        >>> override_fix("--set", "unet", "dtype", "float16")
        '--set unet.dtype=float16 (YAML: components: {unet: {dtype: float16}})'
    """
    if not str(source).startswith(PYTHON_SOURCES):
        return override_line(component, key, value)
    python = list(value) if isinstance(value, tuple) else value
    return f"overrides={{{component!r}: {{{key!r}: {python!r}}}}} (CLI: --set {override_flag(component, key, value)})"


def override_lines(overrides: Iterable[tuple[str, str, object]], *, quoted: bool = False) -> str:
    """Several overrides as one fix: every ``--set`` flag, then the same overrides in YAML, grouped by component.

    ``quoted`` puts the flags in backticks, as the mismatch fixes print them (``check --plain`` reads them back).

    Example:
        >>> override_lines([("vae", "dtype", "float16"), ("unet", "dtype", "float16")], quoted=True)
        '`--set vae.dtype=float16 --set unet.dtype=float16` (YAML: components: {vae: {dtype: float16}, unet: {dtype: float16}})'
    """
    overrides = list(overrides)
    flags = " ".join(f"--set {override_flag(c, k, v)}" for c, k, v in overrides)
    grouped: dict[str, list[str]] = {}
    for c, k, v in overrides:
        yaml_value = f"[{', '.join(map(str, v))}]" if isinstance(v, (list, tuple)) else _flag_value(v)
        grouped.setdefault(c, []).append(f"{k}: {yaml_value}")
    yaml = ", ".join(f"{c}: {{{', '.join(items)}}}" for c, items in grouped.items())
    return f"{f'`{flags}`' if quoted else flags} (YAML: components: {{{yaml}}})"


def _flag_value(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return f"[{','.join(map(str, value))}]"
    return str(value).lower() if isinstance(value, bool) else str(value)


# Who reads the message of an argument's problem: a Python caller (keyword spelling) or the command line (flags).
# hf_precision.cli.main sets it once for every command, so a message raised deep in the library names the spelling
# the user typed.
_SPELLING: contextvars.ContextVar[str] = contextvars.ContextVar("hf_precision_spelling", default="python")


@contextlib.contextmanager
def command_line_spelling() -> Iterator[None]:
    """Within it, :func:`arg` spells arguments as command-line flags (``hf_precision.cli.main`` runs commands in it).

    Example:
        >>> with command_line_spelling():
        ...     arg("base", "./sdxl")
        '--base ./sdxl'
    """
    token = _SPELLING.set("cli")
    try:
        yield
    finally:
        _SPELLING.reset(token)


def arg(name: str, value: object = None) -> str:
    """One argument, as the reader of the message passes it: ``name=value`` (Python; ``name=`` without a value), or
    ``--name value`` within :func:`command_line_spelling` (underscores become dashes).

    Example:
        >>> arg("base"), arg("base", "./sdxl")
        ('base=', "base='./sdxl'")
    """
    if _SPELLING.get() == "cli":
        flag = "--" + name.replace("_", "-")
        return flag if value is None else f"{flag} {value}"
    return f"{name}=" if value is None else f"{name}={value!r}"


def spelled(python: str, flags: str) -> str:
    """A fix written both ways, for whoever reads it: the Python spelling with the flags after it, ``python (CLI:
    flags)``, or the flags alone within :func:`command_line_spelling`.

    Example:
        >>> spelled("recipe='svd'", "--recipe svd")
        "recipe='svd' (CLI: --recipe svd)"
        >>> with command_line_spelling():
        ...     spelled("recipe='svd'", "--recipe svd")
        '--recipe svd'
    """
    return flags if _SPELLING.get() == "cli" else f"{python} (CLI: {flags})"
