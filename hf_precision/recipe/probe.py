"""The present machine as the device rules see it: :class:`SystemProbe`, and the environment variables that make
this CPU read as another. Torch is imported only by the probe's own methods (device counts, CUDA names).

Two environment variables make the ``cpu`` rules of ``devices.yaml`` (and the recipes, plans and tests built on
them) behave as on another CPU; kernels still run on the real one, which computes every dtype, at another speed.

* ``HF_PRECISION_CPU_FLAGS``: flags as ``/proc/cpuinfo`` spells them, separated by commas, spaces or ``+``;
  ``amx``, ``avx512``, ``avx2`` stand for the sets of the ``cpu:amx`` ... descriptions; ``none``: no flags (macOS,
  Windows, arm64). Unset or empty: the real flags. A value that is no list of flag names is a RecipeError.
* ``HF_PRECISION_CPU_NAME``: the CPU's name. Unset: the real name, marked as simulated when the flags are.

Read when a profile is first built (profiles are cached; ``set_probe(None)`` re-reads them).
"""

from __future__ import annotations

import os
import platform
import re
from collections.abc import Mapping

from ..errors import RecipeError

__all__ = ["SystemProbe", "cpu_flags_from_env", "cpu_name_from_env", "version", "CPU_FLAGS_ENV", "CPU_NAME_ENV",
           "CPU_FLAG_SETS"]

CPU_FLAGS_ENV = "HF_PRECISION_CPU_FLAGS"
CPU_NAME_ENV = "HF_PRECISION_CPU_NAME"

# Shorthands shared by the ``cpu:amx`` device descriptions and HF_PRECISION_CPU_FLAGS. ``amx`` is Sapphire
# Rapids' bf16 set; ``avx512`` an AVX512 CPU with avx512_bf16 but no AMX (AMD Zen 4, Cooper Lake).
CPU_FLAG_SETS: dict[str, tuple[str, ...]] = {
    "amx": ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"),
    "avx512": ("avx2", "avx512f", "avx512_bf16"),
    "avx2": ("avx2",),
}
_FLAG = re.compile(r"[a-z0-9][a-z0-9_]*")
# Known flag names: a token close to one but not one (amxx, avx512bf16) is a typo describing another CPU.
_KNOWN_FLAGS = frozenset({
    "avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16", "amx_int8", "avx",
    "avx_vnni", "avx512vl", "avx512bw", "avx512dq", "avx512cd", "avx512_vnni", "avx512_vbmi", "avx512_vbmi2",
    "avx512ifma", "avx512_bitalg", "avx512_vpopcntdq", "sse", "sse2", "ssse3", "sse4_1", "sse4_2", "fma", "f16c",
    "asimd", "asimdhp", "fp", "fphp", "bf16", "i8mm", "sve", "sve2", "svebf16"})


def _flag_typos(tokens: list[str]) -> list[str]:
    """``'amxx' (did you mean 'amx'?)`` for each token that is no known flag but close to one."""
    import difflib

    known = [*CPU_FLAG_SETS, *_KNOWN_FLAGS]
    out = []
    for t in tokens:
        if t in known or t == "none":
            continue
        near = difflib.get_close_matches(t, known, n=1, cutoff=0.85)
        if near:
            out.append(f"{t!r} (did you mean {near[0]!r}?)")
    return out


def version(text: object) -> tuple[int, ...]:
    """The numbers of a version text, at most three (``"sm 8.9"`` -> ``(8, 9)``).

    Example:
        >>> version("macOS 14.5.1"), version("x")
        ((14, 5, 1), ())
    """
    parts = re.findall(r"\d+", str(text))[:3]
    # No version part has 7 digits; a longer run is not a version (and int() refuses over 4,300 digits).
    return () if any(len(p) > 6 for p in parts) else tuple(int(p) for p in parts)


def cpu_flags_from_env(environ: Mapping[str, str] | None = None) -> frozenset[str] | None:
    """The CPU flags ``HF_PRECISION_CPU_FLAGS`` asks for, or None when it is unset or empty.

    Example:
        >>> sorted(cpu_flags_from_env({"HF_PRECISION_CPU_FLAGS": "avx512, +amx_bf16"}))
        ['amx_bf16', 'avx2', 'avx512_bf16', 'avx512f']
        >>> cpu_flags_from_env({"HF_PRECISION_CPU_FLAGS": "none"})
        frozenset()
    """
    raw = (os.environ if environ is None else environ).get(CPU_FLAGS_ENV, "")
    tokens = [t for t in re.split(r"[\s,+]+", raw.strip().lower()) if t]
    if not tokens:
        return None
    if tokens == ["none"]:
        return frozenset()
    bad = [t for t in tokens if not _FLAG.fullmatch(t) or t == "none"]
    if bad:
        raise RecipeError(
            f"{CPU_FLAGS_ENV}={raw!r}: {', '.join(map(repr, bad))} is not a CPU flag name; allowed: flag names as "
            f"/proc/cpuinfo spells them (letters, digits, '_'), separated by commas, spaces or '+', the shorthands "
            f"{', '.join(CPU_FLAG_SETS)}, or 'none' alone for a CPU without flags. Example: "
            f"{CPU_FLAGS_ENV}=avx2,avx512f,avx512_bf16,amx_tile,amx_bf16 (or =amx); unset it to read this CPU")
    typos = _flag_typos(tokens)
    if typos:
        raise RecipeError(
            f"{CPU_FLAGS_ENV}={raw!r}: {', '.join(typos)} is not a CPU flag the device rules know, and it is close to "
            f"one that is, so it would silently describe another CPU; allowed: the shorthands "
            f"{', '.join(CPU_FLAG_SETS)}, or flag names as /proc/cpuinfo spells them (e.g. "
            f"avx2,avx512f,avx512_bf16,amx_tile,amx_bf16). Fix the spelling, or unset it to read this CPU")
    return frozenset(f for t in tokens for f in CPU_FLAG_SETS.get(t, (t,)))


def cpu_name_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The CPU name ``HF_PRECISION_CPU_NAME`` asks for, or None when it is unset or empty.

    Example:
        >>> cpu_name_from_env({"HF_PRECISION_CPU_NAME": " Xeon 8480+ "})
        'Xeon 8480+'
    """
    raw = (os.environ if environ is None else environ).get(CPU_NAME_ENV, "")
    if not raw.strip():
        return None
    if not raw.isprintable() or len(raw) > 200:
        raise RecipeError(f"{CPU_NAME_ENV}={raw[:60]!r}: a CPU name is one printable line of at most 200 "
                          f"characters, e.g. {CPU_NAME_ENV}='Intel Xeon Platinum 8480+'; unset it to read this CPU")
    return raw.strip()


class SystemProbe:
    """Reads the present machine. Replace it in tests with :func:`set_probe`.

    The CPU's flags and name come from ``HF_PRECISION_CPU_FLAGS`` / ``HF_PRECISION_CPU_NAME`` when they are set
    (see the module docstring), else from ``/proc/cpuinfo``.
    """

    def cpu_flags(self) -> frozenset[str]:
        override = cpu_flags_from_env()
        if override is not None:
            return override
        # x86 lists its features as "flags", arm64 as "Features"; elsewhere (macOS, Windows) nothing is read.
        return frozenset(_cpuinfo_field("flags", "Features").split())

    def cpu_name(self) -> str:
        override = cpu_name_from_env()
        if override is not None:
            return override
        name = _cpuinfo_field("model name") or platform.processor() or "CPU"
        if cpu_flags_from_env() is not None:
            return f"{name}, flags from {CPU_FLAGS_ENV}"
        return name

    def macos(self) -> tuple[int, ...] | None:
        release = platform.mac_ver()[0]
        return version(release) if release else None

    def count(self, kind: str) -> int:
        import torch

        if kind == "cuda":
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        if kind == "mps":
            return int(torch.backends.mps.is_available())
        if kind == "xpu":
            xpu = getattr(torch, "xpu", None)
            return xpu.device_count() if xpu is not None and xpu.is_available() else 0
        return 1

    def cuda(self, index: int) -> tuple[str, tuple[int, int]]:
        import torch

        return torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]

    def xpu_name(self, index: int) -> str:
        import torch

        return torch.xpu.get_device_name(index)


def _cpuinfo_field(*keys: str) -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                key, sep, value = line.partition(":")
                if sep and key.strip() in keys:
                    return value.strip()
    except OSError:
        pass
    return ""
