"""Dtype names: canonical spellings, aliases, and the conversion to ``torch.dtype`` (torch only imported there)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = ["DTYPES", "HALF", "FLOAT8", "DTypeName", "canonical", "short", "to_torch", "from_torch", "itemsize"]

DTypeName = Literal["float32", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2"]

# Canonical name first; the aliases are what people type. "half" is refused on purpose: in torch it means
# float16 but users often mean "some 16-bit type", and the difference is the whole point of this library.
DTYPES: dict[str, tuple[str, ...]] = {
    "float32": ("fp32", "f32", "float"),
    "bfloat16": ("bf16",),
    "float16": ("fp16", "f16"),
    "float8_e4m3fn": ("fp8", "fp8_e4m3", "float8"),
    "float8_e5m2": ("fp8_e5m2",),
}
HALF = frozenset({"bfloat16", "float16"})
FLOAT8 = frozenset({"float8_e4m3fn", "float8_e5m2"})
_ITEMSIZE = {"float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1}
_SHORT = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8_e5m2"}
_LOOKUP = {alias: name for name, aliases in DTYPES.items() for alias in (name, *aliases)}


def allowed_names() -> str:
    return ", ".join(DTYPES) + " (aliases: " + ", ".join(a for al in DTYPES.values() for a in al) + ")"


def canonical(name: object) -> str | None:
    """Canonical dtype name for a name, alias or ``torch.dtype``; ``None`` when it is not one.

    Example:
        >>> canonical("bf16"), canonical("torch.float16"), canonical("half")
        ('bfloat16', 'float16', None)
    """
    text = str(name).strip().lower()
    if text.startswith("torch."):
        text = text[len("torch."):]
    return _LOOKUP.get(text)


def short(name: str) -> str:
    """Short form for tables: ``bfloat16`` -> ``bf16``."""
    return _SHORT.get(name, name)


def itemsize(name: str) -> int:
    """Bytes per element of a canonical dtype name."""
    return _ITEMSIZE[name]


def to_torch(name: str) -> torch.dtype:
    """``torch.dtype`` for a canonical name or alias.

    Example:
        >>> to_torch("bf16")
        torch.bfloat16
    """
    import torch

    canon = canonical(name)
    if canon is None:
        raise ValueError(f"unknown dtype {name!r}; allowed: {allowed_names()}")
    return getattr(torch, canon)


def from_torch(dtype: torch.dtype) -> str:
    """Canonical name of a ``torch.dtype`` (``torch.float64`` gives ``float64``)."""
    return str(dtype).removeprefix("torch.")
