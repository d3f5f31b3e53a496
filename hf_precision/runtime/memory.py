"""How much memory there is: free bytes on a device, and the kB figures Linux keeps in /proc; one reader for the
calibrator, the video plan's default budget and the video program's RSS measurements.
"""

from __future__ import annotations

from typing import Any

__all__ = ["proc_bytes", "available_bytes"]


def proc_bytes(path: str, key: str) -> int | None:
    """The ``key:`` kB line of a Linux /proc file (``VmRSS``, ``VmHWM``, ``MemAvailable``) in bytes; ``None`` where there
    is none (not Linux).

    Example:
        >>> value = proc_bytes("/proc/meminfo", "MemAvailable")
        >>> value is None or value > 0
        True
    """
    try:
        with open(path, encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        pass
    return None


def available_bytes(device: Any) -> int | None:
    """Free memory of ``device``: CUDA ``mem_get_info``; otherwise the RAM Linux reports available, or ``None``.

    Example:
        >>> value = available_bytes("cpu")
        >>> value is None or value > 0
        True
    """
    import torch

    dev = torch.device(device)
    if dev.type == "cuda" and torch.cuda.is_available():
        return int(torch.cuda.mem_get_info(dev)[0])
    return proc_bytes("/proc/meminfo", "MemAvailable")
