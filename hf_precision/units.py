"""Byte counts as people read them: one spelling for every table and message. Torch-free."""

from __future__ import annotations

__all__ = ["format_bytes"]


def format_bytes(n: float) -> str:
    """Decimal units, as disks and model cards count: GB with two decimals, MB and kB with one, then bytes.

    Example:
        >>> format_bytes(13_875_351_468), format_bytes(334_640_000), format_bytes(2_000), format_bytes(512)
        ('13.88 GB', '334.6 MB', '2.0 kB', '512 B')
        >>> format_bytes(-2_500_000)
        '-2.5 MB'
    """
    for unit, scale, digits in (("GB", 1e9, 2), ("MB", 1e6, 1), ("kB", 1e3, 1)):
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{n:.0f} B"
