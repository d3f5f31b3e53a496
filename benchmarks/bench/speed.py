"""Which half-precision dtypes this machine computes slowly, decided by measuring, never by a CPU name.

A CPU without AVX512-FP16 / AMX-FP16 runs float16 matmuls and convolutions through slow fallback kernels (a
mid-size SDXL UNet call took 29 s in fp16 against ~1 s in fp32 on a 2-core AVX512 CPU without them); bfloat16 is
slow in the same way without AVX512-BF16 / AMX. The probe times a short matmul and a convolution in each dtype
next to the same work in float32 (interleaved, the fastest of a few repeats) and calls a dtype slow when it takes more
than ``SLOW_RATIO`` times as long. The CPU flags ``hf_precision.recipe.device_caps`` reads are recorded beside the
measurement, to explain it, not to decide it.
"""

from __future__ import annotations

import time
from typing import Any
from hf_precision import dtypes as hdt

# A dtype at least this many times slower than float32 on the probe is "slow": a 2x slower layout would still
# finish in time, the fallback kernels are 10-50x slower.
SLOW_RATIO = 2.5


def is_slow(dtype_seconds: float, fp32_seconds: float, ratio: float = SLOW_RATIO) -> bool:
    """Whether a dtype's probe time is slow against float32's on the same work.

    Example:
        >>> is_slow(0.30, 0.01), is_slow(0.012, 0.01), is_slow(0.01, 0.0)
        (True, False, False)
    """
    if fp32_seconds <= 0:
        return False
    return dtype_seconds / fp32_seconds > ratio


def fast_substitute(slow: dict[str, bool]) -> str:
    """The dtype that keeps the layout's structure (half storage, float32 islands) when its own dtype is slow.

    Example:
        >>> fast_substitute({"float16": True, "bfloat16": False}), fast_substitute({"float16": True, "bfloat16": True})
        ('bfloat16', 'float32')
    """
    return "bfloat16" if not slow.get("bfloat16", True) else "float32"


def probe(device: str = "cpu", repeats: int = 7, size: int = 384) -> dict[str, Any]:
    """Time a matmul and a 3x3 convolution per dtype against float32 (interleaved), and decide which are slow."""
    import torch

    dev = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    a, b = torch.randn(size, size, generator=gen), torch.randn(size, size, generator=gen)
    x, w = torch.randn(2, 64, 32, 32, generator=gen), torch.randn(64, 64, 3, 3, generator=gen)
    dtypes = [torch.float32, torch.float16, torch.bfloat16]
    work = {d: (a.to(dev, d), b.to(dev, d), x.to(dev, d), w.to(dev, d)) for d in dtypes}

    def run(d: torch.dtype) -> float:
        ma, mb, cx, cw = work[d]
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        with torch.inference_mode():
            ma @ mb
            torch.nn.functional.conv2d(cx, cw, padding=1)
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        return time.perf_counter() - t0

    times: dict[torch.dtype, list[float]] = {d: [] for d in dtypes}
    errors: dict[str, str] = {}
    for d in dtypes:  # warm-up (first calls pick kernels)
        try:
            run(d)
        except RuntimeError as err:  # a dtype the backend cannot compute at all is as slow as it gets
            errors[hdt.from_torch(d)] = str(err).splitlines()[0]
    live = [d for d in dtypes if hdt.from_torch(d) not in errors]
    for _ in range(repeats):
        for d in live:
            times[d].append(run(d))
    # The minimum, not the median: other processes only ever add time, and a busy machine inflated the median bf16
    # ratio from 0.7x to 2.7x in one run, which would have called a fast dtype slow.
    fp32 = min(times[torch.float32])
    out: dict[str, Any] = {"fp32_s": fp32, "ratio": {}, "slow": {}, "errors": errors, "slow_ratio": SLOW_RATIO}
    for d in (torch.float16, torch.bfloat16):
        name = hdt.from_torch(d)
        if name in errors:
            out["ratio"][name], out["slow"][name] = None, True
            continue
        med = min(times[d])
        out["ratio"][name] = med / fp32 if fp32 > 0 else None
        out["slow"][name] = is_slow(med, fp32)
    try:
        from hf_precision.recipe.devices import device_caps

        caps = device_caps(device)
        out["device_caps"] = {"auto": list(caps.auto), "tags": list(caps.tags)}
    except Exception as err:  # the flags explain the probe; the benchmark does not need them
        out["device_caps"] = {"error": f"{type(err).__name__}: {err}"}
    return out


def effective_layout(recipe: Any, slow: dict[str, bool], exact: bool, fast: str | None = None) -> tuple[dict[str, Any] | None, str]:
    """Overrides that keep the recipe's structure but compute in a fast dtype, and the sentence saying so.

    Returns ``(None, note)`` when every compute dtype is fast, or when ``exact`` (``--layout`` given) asks for the
    layout as it is. Otherwise the overrides pin every component to the asked layout's dtype and float32 islands,
    with ``fast`` (default :func:`fast_substitute`) in place of a slow dtype; they are meant to be resolved for
    the device the benchmark runs on (the asked device's rules may not allow the substitute: a T4 has no bf16).

    Example:
        >>> from hf_precision import get_recipe
        >>> over, note = effective_layout(get_recipe("sdxl", device="t4"), {"float16": True, "bfloat16": False}, False)
        >>> over["components"]["unet"]["dtype"], over["components"]["unet"]["keep_fp32"], over["components"]["vae"]["dtype"]
        ('bfloat16', ['time_embedding', 'add_embedding'], 'float32')
        >>> effective_layout(get_recipe("sdxl", device="t4"), {"float16": True}, exact=True)[0] is None  # as asked
        True
    """
    slow_parts = [p for p in recipe.policies if slow.get(p.compute)]
    if not slow_parts:
        return None, "every compute dtype of this layout runs fast here: measured as it is"
    names = ", ".join(f"{p.name} {p.compute}" for p in slow_parts)
    if exact:
        return None, (f"this machine computes {names} slowly (see the probe); measured as asked (--layout), which can "
                      f"take long")
    fast = fast or fast_substitute(slow)
    over = {"components": {p.name: {"dtype": fast if slow.get(p.compute) else p.compute, "keep_fp32": list(p.keep_fp32)}
                           for p in recipe.policies}}
    return over, (f"this machine computes {names} slowly (see the probe): runtime measures the layout's "
                  f"structure (the same fp32 components, islands and hooks) with {fast} in place of "
                  f"{', '.join(sorted({p.compute for p in slow_parts}))}; the load and fidelity sections use the exact "
                  f"layout (loading does not compute; fidelity measures precision, so it computes as asked). Pass --layout to measure the exact layout anyway")


def slowdown(recipe: Any, probe: dict[str, Any]) -> tuple[float, str]:
    """How much slower than fp32 the denoiser's compute dtype ran in the probe, and that dtype: what the guesses of
    the compute-bound steps (denoiser calls, images) are multiplied by, so the first estimate is not off by 59x.

    Example:
        >>> from hf_precision import get_recipe
        >>> slowdown(get_recipe("sdxl", device="t4"), {"ratio": {"float16": 59.0, "bfloat16": 0.7}})
        (59.0, 'float16')
        >>> slowdown(get_recipe("sdxl", device="cpu-avx2"), {"ratio": {"float16": 59.0}})
        (1.0, 'float32')
    """
    denoiser = recipe[recipe.denoiser] if recipe.denoiser in recipe else recipe.policies[0]
    ratio = probe.get("ratio", {}).get(denoiser.compute) if denoiser.compute != "float32" else 1.0
    return max(1.0, float(ratio or 1.0)), denoiser.compute
