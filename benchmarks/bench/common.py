"""Statistics, formatting and the machine description shared by every benchmark section."""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import platform
import statistics
import subprocess
from pathlib import Path
from typing import Any

MiB = 1024 * 1024
TARGETS = {
    "load_rss_over_weights": 1.10,   # load_pipeline peak RSS above baseline / final weight bytes
    "load_anon_vs_plain": 1.00,      # load_pipeline peak anonymous memory less its fp32 islands / plain's (same layout)
    "runtime_overhead": 0.01,        # recipe hooks over the no-hook floor, paired
    "island_hook_share": 0.01,       # hooks' own time with 166 islands / one denoiser call
    "reapply_over_first": 1.20,      # re-apply / first apply
}
LINEAR_SLOPE = 1.25  # a log-log slope up to this counts as linear growth (1.0 = exactly linear)
QUIET_ENV = {
    "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "DIFFUSERS_VERBOSITY": "error", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore",
}
# The CPU flags that decide half-precision speed (AVX512-BF16 / AMX make bf16 fast, AVX512-FP16 / AMX-FP16 fp16).
SPEED_FLAGS = ("avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
               "amx_int8", "amx_fp16")


def stats(samples: list[float]) -> dict[str, Any]:
    """Median and spread of samples (raw samples kept for the JSON).

    Example:
        >>> stats([3.0, 1.0, 2.0])["median"], stats([])["n"]
        (2.0, 0)
    """
    xs = sorted(float(x) for x in samples if x is not None and not math.isnan(float(x)))
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "samples": []}
    return {"n": len(xs), "median": statistics.median(xs), "min": xs[0], "max": xs[-1],
            "samples": [float(x) for x in samples]}


def fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
    """One number with its unit (``%`` is signed, ``MiB`` takes bytes, ``ms``/``us``/``s`` take seconds).

    Example:
        >>> fmt(0.0123, "%"), fmt(2 * MiB, "MiB"), fmt(0.0015, "ms", 1)
        ('+1.23%', '2.0 MiB', '1.5 ms')
    """
    if value is None:
        return "n/a"
    if unit == "%":
        return f"{value * 100:+.{max(digits - 1, 1)}f}%"
    if unit == "x":
        return f"{value:.{digits}f}x"
    if unit == "MiB":
        return f"{value / MiB:,.1f} MiB"
    if unit == "ms":
        return f"{value * 1e3:,.{digits}f} ms"
    if unit == "us":
        return f"{value * 1e6:,.{digits}f} µs"
    if unit == "s":
        return f"{value:,.{digits}f} s"
    return f"{value:.{digits}g}{unit}"


def fmt_stats(s: dict[str, Any] | None, unit: str = "", digits: int = 3) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    if s["n"] == 1:
        return f"{fmt(s['median'], unit, digits)} (n=1)"
    return f"{fmt(s['median'], unit, digits)} ({fmt(s['min'], unit, digits)} – {fmt(s['max'], unit, digits)}, n={s['n']})"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def loadavg() -> list[float] | None:
    with contextlib.suppress(OSError, AttributeError):
        return [round(x, 2) for x in os.getloadavg()]
    return None


def auto_threads(cores: int, load1: float | None) -> int:
    """Torch threads for a run on a shared machine: every core when the machine is idle, else the cores left free.

    An OpenMP team larger than the free cores waits at every operator's barrier for a member the kernel has
    descheduled: on a 2-core machine at load average 10, one mid-size UNet call took 31-38 s with 2 threads and 8 s
    with 1, burning 7x the CPU time spinning. Both sides of every pair run with the same threads, so the ratios keep
    their meaning; the report names the count and why.

    Example:
        >>> auto_threads(2, 0.3), auto_threads(2, 1.6), auto_threads(2, 9.0), auto_threads(16, 3.2), auto_threads(4, None)
        (2, 1, 1, 13, 4)
    """
    if load1 is None:
        return cores
    return max(1, min(cores, cores - int(load1)))


def cpu_info() -> dict[str, Any]:
    """CPU model and the ISA flags that matter for half precision, read from the OS (as ``lscpu`` shows them)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        with contextlib.suppress(Exception):
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                   text=True).stdout.strip() or model
    return {"model": model, "flags": [f for f in SPEED_FLAGS if f in flags],
            "absent": [f for f in ("avx512_bf16", "avx512_fp16", "amx_bf16", "amx_fp16") if f not in flags],
            "amx": any(f.startswith("amx") for f in flags), "logical_cpus": os.cpu_count(),
            "machine": platform.machine()}


def env_info(threads: int, device: str) -> dict[str, Any]:
    import accelerate
    import diffusers
    import torch
    import transformers

    import hf_precision

    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "torch_cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")(),
        "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__,
        "accelerate": accelerate.__version__, "hf_precision": hf_precision.__version__,
        "threads": threads, "device": device, "gpu": None, "loadavg_start": loadavg(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def quiet_libraries() -> None:
    import warnings

    warnings.filterwarnings("ignore")
    with contextlib.suppress(Exception):
        from diffusers.utils import logging as dlog

        dlog.set_verbosity_error()
        dlog.disable_progress_bar()
    with contextlib.suppress(Exception):
        from transformers.utils import logging as tlog

        tlog.set_verbosity_error()
        tlog.disable_progress_bar()


def sync(device: Any) -> None:
    """Wait for queued GPU work, so that a wall-clock time covers the computation (a no-op on the CPU)."""
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def module_bytes(module: Any) -> int:
    """Bytes of a module's unique parameters and buffers, in their current dtypes."""
    seen, total = set(), 0
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += t.numel() * t.element_size()
    return total


def pipeline_modules(pipe: Any) -> dict[str, Any]:
    import torch

    return {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}


def judge_paired(samples: list[float], target: float, fewest: int = 3) -> dict[str, Any]:
    """A paired figure judged against the noise it shows: half the spread of the per-pair samples.

    PASS when even the median plus the noise is within ``target``, FAIL when the median minus the noise is above it,
    otherwise no verdict (``pass`` None): the pairs cannot tell the figure from ``target`` at this noise. Fewer than
    ``fewest`` samples give no verdict: two samples that happen to agree are no measure of the noise (a busy run
    had two pairs agree within 0.4% while single calls of the same kind spread ±33%).

    Example:
        >>> [judge_paired(xs, 0.01)["pass"] for xs in ([0.001, 0.003, 0.0], [0.2, 0.3, 0.25], [-0.3, 0.3, 0.0])]
        [True, False, None]
        >>> judge_paired([0.2, 0.3], 0.01)["pass"], round(judge_paired([-0.3, 0.3, 0.1], 0.01)["noise"], 2)
        (None, 0.3)
    """
    xs = [float(x) for x in samples if x is not None and math.isfinite(float(x))]
    if len(xs) < fewest:
        return {"pass": None, "median": statistics.median(xs) if xs else None, "noise": None, "n": len(xs),
                "why": f"{len(xs)} sample(s) measure no noise (a verdict needs {fewest}): no verdict"}
    median, noise = statistics.median(xs), (max(xs) - min(xs)) / 2
    ok, why = _verdict(median, noise, target, "target")
    return {"pass": ok, "median": median, "noise": noise, "n": len(xs), "why": why}


def judge_slope(samples: dict[int, list[float]], limit: float) -> dict[str, Any]:
    """The log-log slope of the medians of ``samples`` (count -> repeated times) judged against ``limit``.

    The noise is the largest relative half spread among the counts with two samples or more; moving both ends of
    the range by that much moves the slope by at most ``log((1 + r) / (1 - r)) / log(x_max / x_min)``. PASS when
    the slope plus that is within ``limit``, FAIL when the slope minus it is above, else no verdict.

    Example:
        >>> j = judge_slope({40: [1.0, 1.1], 80: [2.0], 160: [4.2, 3.8]}, 1.25)
        >>> round(j["slope"], 2), round(j["noise"], 2), j["pass"]
        (0.96, 0.07, True)
        >>> [judge_slope(s, 1.25)["pass"] for s in ({40: [1.0, 3.0], 160: [16.0]}, {40: [1.0], 160: [4.0]})]
        [None, None]
    """
    xs = sorted(n for n, v in samples.items() if v)
    meds = [statistics.median(samples[n]) for n in xs]
    if len(xs) < 2 or min(meds) <= 0:
        return {"pass": None, "slope": None, "noise": None, "why": "fewer than two counts with a time"}
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in meds]
    mx, my = statistics.mean(lx), statistics.mean(ly)
    slope = sum((a - mx) * (b - my) for a, b in zip(lx, ly)) / sum((a - mx) ** 2 for a in lx)
    spreads = [(max(v) - min(v)) / 2 / statistics.median(v) for v in samples.values() if len(v) > 1]
    if not spreads:
        return {"pass": None, "slope": slope, "noise": None, "relative_noise": None,
                "why": "no count was called twice: no noise measured, no verdict"}
    r = max(spreads)
    noise = math.log((1 + r) / (1 - r)) / math.log(xs[-1] / xs[0]) if r < 1 else math.inf
    ok, why = _verdict(slope, noise, limit, "limit")
    return {"pass": ok, "slope": slope, "noise": noise, "relative_noise": r, "why": why}


def _verdict(value: float, noise: float, bound: float, what: str) -> tuple[bool | None, str]:
    """PASS (True) or FAIL (False) only when ``value`` is on one side of ``bound`` beyond ``noise``; else None."""
    if value - noise > bound:
        return False, f"above the {what} beyond the noise"
    if value + noise <= bound:
        return True, f"within the {what} beyond the noise"
    return None, f"the noise is larger than the distance to the {what}: these samples cannot resolve it"
