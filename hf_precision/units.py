"""Byte counts as people read and write them: one formatter for every table and message (decimal units, or the
binary units of the training plans), one parser for every size option (``--max-memory``). Torch-free."""

from __future__ import annotations

import re

from .errors import RecipeError

__all__ = ["format_bytes", "format_seconds", "parse_size"]


def format_bytes(n: float, binary: bool = False) -> str:
    """Decimal units, as disks and model cards count: GB with two decimals, MB and kB with one, then bytes.

    ``binary=True``: the units torch's allocator and CUDA's out-of-memory messages print, GiB with two decimals,
    else MiB with one (so a small part of a training plan reads 0.2 MiB beside its 3.50 GiB neighbours).

    Example:
        >>> format_bytes(13_875_351_468), format_bytes(334_640_000), format_bytes(2_000), format_bytes(512)
        ('13.88 GB', '334.6 MB', '2.0 kB', '512 B')
        >>> format_bytes(-2_500_000)
        '-2.5 MB'
        >>> format_bytes(3 * 2**30, binary=True), format_bytes(200_000, binary=True)
        ('3.00 GiB', '0.2 MiB')
    """
    if binary:
        return f"{n / 2**30:.2f} GiB" if abs(n) >= 2**30 else f"{n / 2**20:.1f} MiB"
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"


def format_seconds(seconds: float) -> str:
    """A duration as people say it: seconds under a minute, then minutes and seconds, then hours and minutes.

    Example:
        >>> format_seconds(4.2), format_seconds(450), format_seconds(4 * 3600 + 125)
        ('4 s', '7 min 30 s', '4 h 2 min')
    """
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    minutes, sec = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {sec} s"
    return f"{minutes // 60} h {minutes % 60} min"


def parse_size(text: str, option: str = "--max-memory") -> int:
    """Bytes of ``16GB`` (10^9), ``12GiB`` (2^30), ``800MB``, ``1.5T``; a plain number is GB.

    Raises:
        RecipeError: not a size; the message names ``option``.

    Example:
        >>> parse_size("16GB"), parse_size("1GiB"), parse_size("0.5")
        (16000000000, 1073741824, 500000000)
    """
    m = re.fullmatch(r"\s*(\d*\.?\d*)\s*([KMGT]?)(i?)B?\s*", str(text), flags=re.IGNORECASE)
    if not m or not any(c.isdigit() for c in m[1]):  # "." or "GB" alone: no number
        raise RecipeError(f"{option} {text}: use a size such as 16GB, 12GiB or 800MB")
    unit = m[2].upper() or "G"
    base = 1024 if m[3] else 1000
    size = int(float(m[1]) * base ** ("KMGT".index(unit) + 1))
    if size <= 0:  # a budget nothing fits: every plan would say "does not fit" instead of naming the mistake
        raise RecipeError(f"{option} {text}: a memory budget must be above 0 bytes; use a size such as 16GB")
    return size
