#!/usr/bin/env python
"""hf_precision benchmark (issue #6): load cost, runtime overhead, memory, fidelity and scale, in ONE run.

    python scripts/benchmark.py                       # mid-size SDXL (~287M params), T4 layout, ~5-8 min on 2 cores
    python scripts/benchmark.py --quick --size tiny   # smoke run, < 1 min
    python scripts/benchmark.py --recipe-device this  # the layout this machine would get (bf16 on AMX CPUs)

Writes ``<out>/benchmark.md`` (tables, targets with PASS/FAIL) and ``<out>/benchmark.json`` (every raw sample).

What is measured (every figure is a median over repeated runs, with min-max; ratios are taken inside the same
repeat / round):

1. Load: ``hf_precision.load_pipeline`` vs plain ``DiffusionPipeline.from_pretrained(dtype={...})`` with the same
   per-component dtypes, each in a fresh subprocess per repeat (alternating order): wall time and peak RSS above
   the post-import baseline, over the final bytes of the weights (physical floor 1.0).
2. Runtime: one denoiser call with the recipe's hooks vs the same weights with the same dtypes and no hooks (the
   islands wrapped in a hand-written fp32 cast: the floor computes exactly what the recipe computes), vs diffusers
   layerwise casting (per-layer hooks on every Linear/Conv), vs fp32 weights under ``torch.autocast``.
3. Memory: weight bytes under the recipe vs everything in half precision vs fp32 (autocast keeps fp32 weights), on
   the benchmarked pipeline and on the real SDXL configs (meta device, no weights).
4. Fidelity: final image of the recipe and of a naive ``pipe.to(half)`` vs an fp32 reference, same seeds.
5. Scale: time to resolve and apply the recipe on the meta-device real SDXL UNet / pipeline, and on UNets with more
   or fewer modules.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as _dt
import gc
import hashlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import threading
import time
import traceback
import types
from pathlib import Path
from typing import Any, Callable

import hf_precision

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

REAL_SDXL = ROOT / "hf_precision" / "model_configs" / "stable-diffusion-xl-base-1.0"
TARGETS = {
    "load_peak_rss_over_weights": 1.10,  # load_pipeline peak RSS above baseline / final weight bytes
    "load_time_ratio": 1.05,             # load_pipeline / plain diffusers
    "runtime_overhead": 0.01,            # hooks over the no-hook floor
    "memory_vs_all_half": 1.01,          # recipe weight bytes / all-half weight bytes (real SDXL)
}
MiB = 1024 * 1024
_QUIET_ENV = {
    "HF_HUB_OFFLINE": "1", "TQDM_DISABLE": "1", "HF_HUB_DISABLE_PROGRESS_BARS": "1",
    "DIFFUSERS_VERBOSITY": "error", "TRANSFORMERS_VERBOSITY": "error", "PYTHONWARNINGS": "ignore",
}


# ============================================================================================ small helpers


def stats(samples: list[float]) -> dict[str, Any]:
    """Median and spread of a list of samples (the raw samples are kept for the JSON)."""
    xs = sorted(float(x) for x in samples if x is not None and not math.isnan(float(x)))
    if not xs:
        return {"n": 0, "median": None, "min": None, "max": None, "p25": None, "p75": None, "samples": []}

    def q(p: float) -> float:
        k = (len(xs) - 1) * p
        lo, hi = math.floor(k), math.ceil(k)
        return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)

    return {"n": len(xs), "median": statistics.median(xs), "min": xs[0], "max": xs[-1], "p25": q(0.25),
            "p75": q(0.75), "samples": [float(x) for x in samples]}


def fmt(value: float | None, unit: str = "", digits: int = 3) -> str:
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


def fmt_stats(s: dict[str, Any], unit: str = "", digits: int = 3) -> str:
    if not s or s.get("median") is None:
        return "n/a"
    return f"{fmt(s['median'], unit, digits)} ({fmt(s['min'], unit, digits)} – {fmt(s['max'], unit, digits)}, n={s['n']})"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("**PASS**" if ok else "**FAIL**")


def md_table(headers: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def cpu_info() -> dict[str, Any]:
    """CPU model and the ISA flags that matter for half precision (AMX makes bf16 matmuls fast)."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.machine(), platform.processor()):
                model = value.strip()
            elif key.strip() == "flags" and not flags:
                flags = set(value.split())
    except OSError:
        with contextlib.suppress(Exception):
            model = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True,
                                   text=True).stdout.strip() or model
    wanted = ["avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni", "amx_tile", "amx_bf16",
              "amx_int8", "amx_fp16"]
    return {"model": model, "flags": [f for f in wanted if f in flags], "amx": any(f.startswith("amx") for f in flags),
            "logical_cpus": os.cpu_count()}


def env_info(threads: int, device: str) -> dict[str, Any]:
    import accelerate
    import diffusers
    import torch
    import transformers

    info = {
        "date": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "cpu": cpu_info(),
        "torch_cpu_capability": getattr(torch.backends.cpu, "get_cpu_capability", lambda: "?")(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__, "diffusers": diffusers.__version__, "transformers": transformers.__version__,
        "accelerate": accelerate.__version__,
        "threads": threads,
        "device": device,
        "gpu": None,
    }
    with contextlib.suppress(Exception):
        info["hf_precision"] = __import__("hf_precision").__version__
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    with contextlib.suppress(OSError):
        info["loadavg_start"] = list(os.getloadavg())
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
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize(torch.device(device))


def tensor_bytes(module: Any, half_itemsize: int | None = None, fp32: bool = False, params_only: bool = False) -> int:
    """Bytes of a module's (unique) parameters and buffers; optionally as if every floating tensor were cast."""
    seen, total = set(), 0
    tensors = list(module.parameters()) + ([] if params_only else list(module.buffers()))
    for t in tensors:
        if id(t) in seen:
            continue
        seen.add(id(t))
        size = t.element_size()
        if t.is_floating_point():
            size = 4 if fp32 else (half_itemsize or size)
        total += t.numel() * size
    return total


def pipeline_modules(pipe: Any) -> dict[str, Any]:
    import torch

    return {k: v for k, v in pipe.components.items() if isinstance(v, torch.nn.Module)}


def pipeline_bytes(pipe: Any, **kw: Any) -> int:
    return sum(tensor_bytes(m, **kw) for m in pipeline_modules(pipe).values())


# ============================================================================================ the synthetic pipeline


def resolve_size(text: str) -> tuple[str | dict[str, Any], str]:
    """``mid`` / ``tiny`` / a JSON object (inline or a file) -> (size for make_sdxl, a short cache key)."""
    if text in ("mid", "tiny"):
        return text, text
    raw = Path(text).read_text() if Path(text).is_file() else text
    try:
        size = json.loads(raw)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--size: expected mid, tiny, a JSON object or a JSON file, got {text!r} ({err})") from None
    if not isinstance(size, dict):
        raise SystemExit("--size: the JSON must be an object of per-component config overrides")
    return size, "custom-" + hashlib.sha1(json.dumps(size, sort_keys=True).encode()).hexdigest()[:10]


def prepare_pipeline(size: str | dict[str, Any], key: str, cache: Path, log: Callable[[str], None]) -> dict[str, Any]:
    """Build the random-weight SDXL pipeline once and save it (fp32 safetensors) under ``cache``; reuse it later."""
    from hf_precision.testing.pipelines import count_parameters, make_sdxl, save_pipeline

    folder = cache / f"sdxl-{key}"
    marker = folder / "bench_size.json"
    stamp = json.dumps({"size": size, "seed": 0}, sort_keys=True)
    if marker.is_file() and marker.read_text() == stamp and (folder / "model_index.json").is_file():
        log(f"reusing the saved pipeline in {folder}")
        counts = json.loads((folder / "bench_params.json").read_text())
        return {"folder": str(folder), "params": counts, "built_s": None, "reused": True}
    t0 = time.perf_counter()
    pipe = make_sdxl(size=size, seed=0)
    counts = count_parameters(pipe)
    save_pipeline(pipe, folder)
    (folder / "bench_params.json").write_text(json.dumps(counts))
    marker.write_text(stamp)
    del pipe
    gc.collect()
    log(f"built and saved the {key} pipeline ({counts['total']:,} parameters) in {time.perf_counter() - t0:.1f} s")
    return {"folder": str(folder), "params": counts, "built_s": time.perf_counter() - t0, "reused": False}


def recipe_for(recipe_device: str, device: str) -> Any:
    from hf_precision.recipe.resolution import get_recipe

    return get_recipe("sdxl", device=device if recipe_device == "this" else recipe_device)


def plain_dtype_map(recipe: Any) -> dict[str, str]:
    """The per-component dtype dict ``load_pipeline`` hands to ``from_pretrained`` (with 'default')."""
    half = {"float16", "bfloat16"}
    plans = {p.name: p for p in recipe.plans}
    latents = plans.get(recipe.latents_from) if recipe.latents_from else None
    out = {"default": latents.compute if latents else "float32"}
    for name, plan in plans.items():
        out[name] = plan.compute if plan.storage not in half | {"float32"} else plan.storage
    return out


def layout(recipe: Any) -> str:
    return ", ".join(f"{p.name} {p.storage}" + (f"/{p.compute}" if p.compute != p.storage else "")
                     + (f" (fp32: {', '.join(p.keep_fp32)})" if p.keep_fp32 and p.compute != "float32" else "")
                     for p in recipe.plans)


# ============================================================================================ 1. load (subprocess)


def _rss_now() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _maxrss() -> int:
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class _Sampler(threading.Thread):
    """Samples VmRSS / RssAnon / RssFile every few ms (which part of the peak is file-backed safetensors pages)."""

    def __init__(self, interval: float = 0.005):
        super().__init__(daemon=True)
        self.interval, self.stop_flag = interval, threading.Event()
        self.peak = {"VmRSS": 0, "RssAnon": 0, "RssFile": 0}

    def sample(self) -> None:
        try:
            with open("/proc/self/status") as f:
                for line in f:
                    key, _, value = line.partition(":")
                    if key in self.peak:
                        self.peak[key] = max(self.peak[key], int(value.split()[0]) * 1024)
        except OSError:
            pass

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.sample()
            time.sleep(self.interval)

    def stop(self) -> dict[str, int]:
        self.stop_flag.set()
        self.join()
        self.sample()
        return self.peak


def worker_load(args: argparse.Namespace) -> None:
    """One load in this (fresh) process; prints a JSON line. Baseline = RSS after every import."""
    os.environ.update(_QUIET_ENV)
    import torch

    torch.set_num_threads(args.threads)
    import diffusers
    import safetensors.torch  # noqa: F401
    import transformers

    import hf_precision.runtime.apply  # noqa: F401
    import hf_precision.runtime.hooks  # noqa: F401
    import hf_precision.runtime.load as hpload
    from hf_precision.recipe.resolution import get_recipe

    quiet_libraries()
    folder = Path(args.folder)
    index = json.loads((folder / "model_index.json").read_text())
    for name, spec in index.items():  # import every class the load will need (diffusers imports lazily)
        if isinstance(spec, list) and len(spec) == 2 and spec[0]:
            getattr(diffusers if spec[0] == "diffusers" else transformers, spec[1], None) or getattr(
                diffusers, spec[1], None)
    getattr(diffusers, str(index["_class_name"]))
    gc.collect()
    baseline = _rss_now()
    maxrss_before = _maxrss()
    base_sample = _Sampler()
    base_sample.sample()
    stages: dict[str, float] = {}
    if args.worker_load == "recipe":  # time the library's own stages inside load_pipeline
        import hf_precision.runtime.apply as hpapply
        import hf_precision.recipe.resolution as hprecipe

        def timed(owner: Any, attr: str, label: str) -> None:
            fn = getattr(owner, attr, None)
            if fn is None:  # the loader changed: that stage is not timed
                return

            def wrapper(*a: Any, **kw: Any) -> Any:
                t = time.perf_counter()
                try:
                    return fn(*a, **kw)
                finally:
                    stages[label] = stages.get(label, 0.0) + time.perf_counter() - t
            setattr(owner, attr, wrapper)

        timed(hpload, "_reload_islands_fp32", "reload_islands")
        timed(hpload, "_stream_components", "stream")
        timed(hpapply, "apply_recipe", "apply_recipe")
        timed(hprecipe, "get_recipe", "resolve")
        get_recipe = hprecipe.get_recipe
    sampler = _Sampler()
    sampler.start()
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    if args.worker_load == "plain":
        dtypes = {k: getattr(torch, v) for k, v in json.loads(args.dtypes).items()}
        pipe = diffusers.DiffusionPipeline.from_pretrained(str(folder), dtype=dtypes, use_safetensors=True)
        if args.device != "cpu":
            pipe.to(args.device)
    else:
        device = args.device if args.recipe_device == "this" else args.recipe_device
        pipe = hpload.load_pipeline(str(folder), args.device, recipe=get_recipe("sdxl", device=device))
    sync(args.device)
    seconds = time.perf_counter() - t0
    cpu_seconds = time.process_time() - cpu0
    peaks = sampler.stop()
    maxrss = _maxrss()
    gc.collect()
    modules = pipeline_modules(pipe)
    result = {
        "loader": args.worker_load, "seconds": seconds, "cpu_seconds": cpu_seconds, "stages": stages,
        "baseline_rss": baseline, "maxrss_before_load": maxrss_before,
        "maxrss": maxrss, "sampled_peak": peaks, "baseline_sample": base_sample.peak, "final_rss": _rss_now(),
        "weight_bytes": sum(tensor_bytes(m) for m in modules.values()),
        "dtypes": {n: sorted({str(p.dtype).removeprefix("torch.") for p in m.parameters()}) for n, m in modules.items()},
    }
    # ru_maxrss is the process-lifetime peak: if the imports peaked higher than the load, use the sampled peak.
    result["peak_rss"] = maxrss if maxrss > maxrss_before else max(peaks["VmRSS"], baseline)
    result["peak_above_baseline"] = result["peak_rss"] - baseline
    if str(args.device).startswith("cuda"):
        result["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    print("BENCH_RESULT " + json.dumps(result), flush=True)


def bench_load(ctx: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    folder = Path(ctx["folder"])
    for f in sorted(folder.rglob("*.safetensors")):  # warm the page cache so neither loader pays the cold read
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass
    dtypes = plain_dtype_map(ctx["recipe"])
    samples: dict[str, list[dict[str, Any]]] = {"recipe": [], "plain": []}
    env = {**os.environ, **_QUIET_ENV}
    for i in range(ctx["load_repeats"]):
        order = ["plain", "recipe"] if i % 2 == 0 else ["recipe", "plain"]
        for loader in order:
            cmd = [sys.executable, str(Path(__file__).resolve()), "--worker-load", loader, "--folder", str(folder),
                   "--dtypes", json.dumps(dtypes), "--recipe-device", ctx["recipe_device"], "--device", ctx["device"],
                   "--threads", str(ctx["threads"])]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("BENCH_RESULT ")), None)
            if proc.returncode != 0 or line is None:
                raise RuntimeError(f"load worker ({loader}) failed (rc={proc.returncode}):\n{proc.stderr[-3000:]}")
            res = json.loads(line.removeprefix("BENCH_RESULT "))
            res["repeat"], res["position"] = i, order.index(loader)
            samples[loader].append(res)
            log(f"  load {loader:6s} repeat {i}: {res['seconds']:.2f} s, peak +{res['peak_above_baseline'] / MiB:,.0f} MiB")
    out: dict[str, Any] = {"dtype_map": dtypes, "raw": samples}
    for loader, runs in samples.items():
        out[loader] = {
            "seconds": stats([r["seconds"] for r in runs]),
            "cpu_seconds": stats([r["cpu_seconds"] for r in runs]),
            "peak_above_baseline": stats([r["peak_above_baseline"] for r in runs]),
            "peak_over_weights": stats([r["peak_above_baseline"] / r["weight_bytes"] for r in runs]),
            "anon_peak_over_weights": stats([(r["sampled_peak"]["RssAnon"] - r["baseline_sample"]["RssAnon"])
                                             / r["weight_bytes"] for r in runs]),
            "final_above_baseline_over_weights": stats([(r["final_rss"] - r["baseline_rss"]) / r["weight_bytes"]
                                                        for r in runs]),
            "weight_bytes": runs[0]["weight_bytes"],
            "dtypes": runs[0]["dtypes"],
        }
    pairs = list(zip(samples["recipe"], samples["plain"]))
    out["time_ratio"] = stats([r["seconds"] / p["seconds"] for r, p in pairs])
    out["cpu_time_ratio"] = stats([r["cpu_seconds"] / p["cpu_seconds"] for r, p in pairs])
    out["stages"] = {k: stats([r["stages"].get(k, 0.0) for r in samples["recipe"]])
                     for k in ("resolve", "stream", "reload_islands", "apply_recipe")}
    bookkeeping = ("resolve", "reload_islands", "apply_recipe")
    out["own_work_share"] = stats([sum(r["stages"].get(k, 0.0) for k in bookkeeping) / p["seconds"] for r, p in pairs])
    out["peak_ratio"] = stats([r["peak_above_baseline"] / p["peak_above_baseline"] for r, p in pairs])
    out["same_dtypes"] = all(set(out["plain"]["dtypes"][c]) <= set(v) for c, v in out["recipe"]["dtypes"].items())
    rec = out["recipe"]
    out["pass_peak"] = rec["peak_over_weights"]["median"] <= TARGETS["load_peak_rss_over_weights"]
    out["pass_time"] = out["time_ratio"]["median"] <= TARGETS["load_time_ratio"]
    return out


# ============================================================================================ 2. runtime


def strip_hooks(module: Any) -> Any:
    """Drop every forward hook from a (copied) module tree."""
    for m in module.modules():
        for attr in ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs",
                     "_forward_hooks_with_kwargs", "_forward_hooks_always_called"):
            d = getattr(m, attr, None)
            if d is not None:
                d.clear()
        if "_hf_precision_applied" in m.__dict__:
            del m.__dict__["_hf_precision_applied"]
    return module


def _island_wrapper_class() -> type:
    import torch

    class HandIsland(torch.nn.Module):
        """The minimal hand-written island: floating inputs to fp32, the output back to the compute dtype."""

        def __init__(self, inner: torch.nn.Module, out_dtype: torch.dtype):
            super().__init__()
            self.inner, self.out_dtype = inner, out_dtype

        def forward(self, *args: Any, **kwargs: Any) -> Any:
            cast = lambda x: x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x
            out = self.inner(*[cast(a) for a in args], **{k: cast(v) for k, v in kwargs.items()})
            return out.to(self.out_dtype) if isinstance(out, torch.Tensor) and out.is_floating_point() else out

    return HandIsland


def wrap_islands(module: Any, islands: list[str], dtype: Any) -> Any:
    wrapper = _island_wrapper_class()
    for name in islands:
        parent_name, _, leaf = name.rpartition(".")
        parent = module.get_submodule(parent_name) if parent_name else module
        setattr(parent, leaf, wrapper(getattr(parent, leaf), dtype))
    return module


def hook_seconds_per_call(module: Any, call: Callable[[], Any], n: int) -> tuple[float, dict[str, float]]:
    """Time spent inside the forward (pre-)hooks of ``module``'s tree per call, measured by wrapping each hook.

    Returns the total per call and the split per ``module name: pre|post``.
    """
    spent = [0.0]
    split: dict[str, float] = {}
    wrapped = []
    for mname, m in module.named_modules():
        for attr in ("_forward_pre_hooks", "_forward_hooks"):
            d = getattr(m, attr)
            for key, fn in list(d.items()):
                label = f"{mname or '(forward)'}: {'pre' if 'pre' in attr else 'post'}"

                def timed(*a: Any, __fn: Callable[..., Any] = fn, __label: str = label, **kw: Any) -> Any:
                    t = time.perf_counter()
                    try:
                        return __fn(*a, **kw)
                    finally:
                        dt = time.perf_counter() - t
                        spent[0] += dt
                        split[__label] = split.get(__label, 0.0) + dt

                d[key] = timed
                wrapped.append((d, key, fn))
    try:
        for _ in range(n):
            call()
    finally:
        for d, key, fn in wrapped:
            d[key] = fn
    return spent[0] / max(n, 1), {k: v / max(n, 1) for k, v in split.items()}


class HookToggle:
    """Detach / re-attach every forward hook of a module tree in place, and swap its islands for hand-written casts.

    Toggling touches only Python dicts and two attributes: the weights stay where they are, so the floor and the
    hooked variant run on the very same memory.
    """

    _ATTRS = ("_forward_pre_hooks", "_forward_hooks", "_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs",
              "_forward_hooks_always_called")

    def __init__(self, module: Any, islands: list[str], dtype: Any):
        self.saved = [(m, {a: dict(getattr(m, a)) for a in self._ATTRS if hasattr(m, a)}) for m in module.modules()]
        self.saved = [(m, d) for m, d in self.saved if any(d.values())]
        wrapper = _island_wrapper_class()
        self.swaps = []
        for name in islands:
            parent_name, _, leaf = name.rpartition(".")
            parent = module.get_submodule(parent_name) if parent_name else module
            original = getattr(parent, leaf)
            self.swaps.append((parent, leaf, original, wrapper(original, dtype)))
        self.on = True

    def hooks_off(self) -> None:
        if self.on:
            for m, d in self.saved:
                for a in d:
                    getattr(m, a).clear()
            for parent, leaf, _, wrapped in self.swaps:
                setattr(parent, leaf, wrapped)
            self.on = False

    def hooks_on(self) -> None:
        if not self.on:
            for parent, leaf, original, _ in self.swaps:
                setattr(parent, leaf, original)
            for m, d in self.saved:
                for a, v in d.items():
                    getattr(m, a).update(v)
            self.on = True


def median_ci(samples: list[float], z: float = 1.96) -> list[float] | None:
    """Distribution-free ~95% confidence interval of the median (order statistics of the binomial)."""
    xs = sorted(samples)
    n = len(xs)
    if n < 6:
        return None
    lo = max(0, math.floor(n / 2 - z * math.sqrt(n) / 2) - 1)
    hi = min(n - 1, math.ceil(n / 2 + z * math.sqrt(n) / 2) - 1)
    return [xs[lo], xs[hi]]


def bench_runtime(ctx: dict[str, Any], pipes: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import torch
    from diffusers.hooks import apply_layerwise_casting
    from diffusers.hooks.layerwise_casting import DEFAULT_SKIP_MODULES_PATTERN

    from hf_precision import dtypes as hdt

    recipe, device = ctx["recipe"], ctx["device"]
    plan = recipe["unet"]
    compute, storage = hdt.to_torch(plan.compute), hdt.to_torch(plan.storage)
    latents_dtype = hdt.to_torch(recipe[recipe.latents_from].compute) if recipe.latents_from else compute
    hooked = pipes["recipe"].unet
    islands = list(hf_precision.applied(pipes["recipe"]).islands.get("unet", []))
    cfg = hooked.config

    # The floor is the recipe's own UNet object with its hooks detached and the islands wrapped in a hand-written
    # fp32 cast: the same weight memory, the same computation (checked bit-identical below), no hooks.
    toggle = HookToggle(hooked, islands, compute)
    floor_half = strip_hooks(copy.deepcopy(hooked)).to(compute)
    layerwise = wrap_islands(strip_hooks(copy.deepcopy(hooked)), islands, compute)
    skip = list(DEFAULT_SKIP_MODULES_PATTERN) + list(getattr(type(hooked), "_skip_layerwise_casting_patterns", None)
                                                     or []) + [f"^{i}$|^{i}\\." for i in islands]
    apply_layerwise_casting(layerwise, storage_dtype=storage, compute_dtype=compute, skip_modules_pattern=tuple(skip))
    n_layerwise = sum(1 for m in layerwise.modules() if getattr(m, "_diffusers_hook", None) is not None
                      and m._diffusers_hook.get_hook("layerwise_casting") is not None)
    fp32_unet = pipes["fp32"].unet
    autocast_ok = compute in (torch.float16, torch.bfloat16)

    gen = torch.Generator().manual_seed(0)
    b, side = ctx["batch"], ctx["latent"]
    te2_proj = pipes["fp32"].text_encoder_2.config.projection_dim
    n_time_ids = (cfg.projection_class_embeddings_input_dim - te2_proj) // cfg.addition_time_embed_dim
    inputs32 = {
        "sample": torch.randn(b, cfg.in_channels, side, side, generator=gen),
        "timestep": torch.tensor(999.0),
        "encoder_hidden_states": torch.randn(b, 77, cfg.cross_attention_dim, generator=gen),
        "added_cond_kwargs": {"text_embeds": torch.randn(b, te2_proj, generator=gen),
                              "time_ids": torch.tensor([[side * 8.0, side * 8.0, 0, 0, side * 8.0, side * 8.0][:n_time_ids]] * b)},
    }
    from hf_precision.runtime.hooks import cast_tree

    arrive = cast_tree(inputs32, latents_dtype, torch.device(device))           # what the pipeline hands the UNet
    pre_cast = cast_tree(inputs32, compute, torch.device(device))               # hand-cast once, outside the timing
    pre_cast["timestep"] = inputs32["timestep"].to(device)
    arrive["timestep"] = inputs32["timestep"].to(device)
    fp32_inputs = cast_tree(inputs32, torch.float32, torch.device(device))

    def caller(model: Any, kwargs: dict[str, Any], autocast: bool = False) -> Callable[[], Any]:
        def call() -> Any:
            ctxm = torch.autocast(torch.device(device).type, dtype=compute) if autocast else contextlib.nullcontext()
            with ctxm:
                return model(**kwargs, return_dict=False)[0]
        return call

    hooks_call, floor_call = caller(hooked, arrive), caller(hooked, pre_cast)

    variants: dict[str, Callable[[], Any]] = {
        "hooks": hooks_call,
        "floor": floor_call,
        "floor_all_half": caller(floor_half, pre_cast),
        "layerwise": caller(layerwise, pre_cast),
    }
    if autocast_ok:
        variants["autocast"] = caller(fp32_unet, fp32_inputs, autocast=True)

    setups: dict[str, Callable[[], None]] = {"hooks": toggle.hooks_on, "floor": toggle.hooks_off}
    outputs, errors = {}, {}
    try:
        with torch.inference_mode():
            for name, call in variants.items():
                setups.get(name, toggle.hooks_on)()
                try:
                    outputs[name] = call().float().cpu()
                except Exception as err:  # a variant that cannot run is reported, never hidden
                    errors[name] = f"{type(err).__name__}: {err}"
            ref = outputs.get("hooks")
            diffs = {n: float((o - ref).abs().max()) for n, o in outputs.items() if ref is not None}
            for name in errors:
                variants.pop(name)
            for _ in range(ctx["warmup"]):
                for name, call in variants.items():
                    setups.get(name, toggle.hooks_on)()
                    call()
            sync(device)
            # Each variant is timed right next to a floor call (order alternating), so both see the same machine
            # load; its overhead is the ratio inside that pair. Every round has `hook_pairs` hooks/floor pairs and
            # one pair per other variant, interleaved, rotating.
            names = list(variants)
            others = [n for n in names if n not in ("floor", "hooks")]
            times: dict[str, list[float]] = {n: [] for n in names}
            paired: dict[str, list[float]] = {n: [] for n in names if n != "floor"}
            for r in range(ctx["rounds"]):
                rot = others[r % len(others):] + others[: r % len(others)] if others else []
                sequence: list[str] = []
                for k in range(max(ctx["hook_pairs"], len(rot))):
                    if k < ctx["hook_pairs"] and "hooks" in variants:
                        sequence.append("hooks")
                    if k < len(rot):
                        sequence.append(rot[k])
                for j, name in enumerate(sequence):
                    got = {}
                    for n in (["floor", name] if (r + j) % 2 == 0 else [name, "floor"]):
                        setups.get(n, toggle.hooks_on)()
                        sync(device)
                        t0 = time.perf_counter()
                        variants[n]()
                        sync(device)
                        got[n] = time.perf_counter() - t0
                    times["floor"].append(got["floor"])
                    times[name].append(got[name])
                    paired[name].append(got[name] / got["floor"] - 1)
            toggle.hooks_on()
            hook_s, hook_split = hook_seconds_per_call(hooked, variants["hooks"], max(3, ctx["rounds"] // 3))
    finally:
        toggle.hooks_on()  # the pipeline goes on to the fidelity section with its hooks

    out: dict[str, Any] = {
        "inputs": {"batch": b, "latent": side, "latents_dtype": str(latents_dtype).removeprefix("torch."),
                   "compute": plan.compute, "storage": plan.storage, "islands": islands},
        "params": sum(p.numel() for p in hooked.parameters()),
        "modules": sum(1 for _ in hooked.modules()),
        "layerwise_hooked_layers": n_layerwise,
        "layerwise_skip_patterns": skip,
        "errors": errors,
        "max_abs_diff_vs_hooks": diffs,
        "seconds": {n: stats(t) for n, t in times.items()},
        "hook_seconds_per_call": hook_s,
        "hook_seconds_split": hook_split,
    }
    out["over_floor"] = {n: stats(v) for n, v in paired.items()}
    ratios = out["over_floor"]
    out["hooks_median_ci95"] = median_ci(paired.get("hooks", []))
    out["hook_share_of_floor"] = hook_s / out["seconds"]["floor"]["median"] if "floor" in times else None
    ov = ratios.get("hooks", {}).get("median")
    out["pass"] = None if ov is None else ov <= TARGETS["runtime_overhead"]
    ci = out["hooks_median_ci95"]
    out["conclusive"] = ci is not None and (ci[1] <= TARGETS["runtime_overhead"] or ci[0] > TARGETS["runtime_overhead"])
    log(f"  runtime: hooks {ov if ov is None else round(ov * 100, 2)}% over the floor; isolated hook time "
        f"{hook_s * 1e6:.0f} µs/call")
    return out


# ============================================================================================ 3. memory


def count_layout_bytes(module: Any, plan: Any) -> int:
    """Parameter bytes a component takes under a recipe plan: islands fp32, the rest the storage dtype."""
    from hf_precision import dtypes as hdt
    from hf_precision.recipe.patterns import inside, match_modules, outermost

    islands: list[str] = []
    if plan.keep_fp32 and plan.compute != "float32":
        names = [n for n, _ in module.named_modules() if n]
        islands = outermost([n for ms in match_modules(names, list(plan.keep_fp32)).values() for n in ms])
    storage = hdt.itemsize(plan.storage)
    total = 0
    for name, p in module.named_parameters():
        if not p.is_floating_point():
            total += p.numel() * p.element_size()
            continue
        total += p.numel() * (4 if inside(name.rpartition(".")[0], islands) else storage)
    return total


def planner_module() -> Any:
    """The module that holds ``hf_precision.plan`` (its file name has changed before: plan.py, planner.py)."""
    import importlib

    import hf_precision

    return importlib.import_module(hf_precision.plan.__module__)


def build_meta_sdxl(log: Callable[[str], None]) -> dict[str, Any]:
    """The real SDXL-base components on the meta device (configs shipped in hf_precision/model_configs)."""
    index = json.loads((REAL_SDXL / "model_index.json").read_text())
    try:
        build_on_meta = planner_module().build_on_meta
    except (ImportError, AttributeError):
        build_on_meta = None
    out = {}
    for comp in ("text_encoder", "text_encoder_2", "unet", "vae"):
        library, cls = index[comp]
        config = json.loads((REAL_SDXL / comp / "config.json").read_text())
        if build_on_meta is not None:
            out[comp] = build_on_meta(library, cls, config)
        else:
            import torch

            with torch.device("meta"):
                if library == "transformers":
                    import transformers

                    conf = transformers.CONFIG_MAPPING[config["model_type"]].from_dict(config)
                    out[comp] = getattr(transformers, cls)(conf)
                else:
                    import diffusers

                    out[comp] = getattr(diffusers, cls).from_config(config)
    return out


def bench_memory(ctx: dict[str, Any], pipes: dict[str, Any], meta: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    from hf_precision import dtypes as hdt
    from hf_precision.recipe.resolution import get_recipe

    recipe = ctx["recipe"]
    half_size = hdt.itemsize(recipe["unet"].compute) if recipe["unet"].compute in ("float16", "bfloat16") else 2
    pipe = pipes["recipe"]
    bench = {
        "recipe": pipeline_bytes(pipe),
        "all_half": pipeline_bytes(pipe, half_itemsize=half_size),
        "fp32_autocast": pipeline_bytes(pipes["fp32"]),
        "per_component": {n: tensor_bytes(m) for n, m in pipeline_modules(pipe).items()},
    }
    bench["recipe_over_half"] = bench["recipe"] / bench["all_half"]
    bench["fp32_over_half"] = bench["fp32_autocast"] / bench["all_half"]

    configs = {c: json.loads((REAL_SDXL / c / "config.json").read_text()) for c in meta}
    real: dict[str, Any] = {}
    devices = [ctx["recipe_device"] if ctx["recipe_device"] != "this" else ctx["device"]]
    for extra in ("t4", "a100", ctx["device"]):
        if extra not in devices:
            devices.append(extra)
    for dev in devices:
        r = get_recipe("sdxl", device=dev, configs=configs)
        recipe_b = sum(count_layout_bytes(m, r[c]) for c, m in meta.items() if c in r)
        half_b = sum(tensor_bytes(m, half_itemsize=2, params_only=True) for m in meta.values())
        fp32_b = sum(tensor_bytes(m, fp32=True, params_only=True) for m in meta.values())
        row = {"device": dev, "label": r.device.label(), "layout": layout(r), "recipe": recipe_b, "all_half": half_b,
               "fp32_autocast": fp32_b, "recipe_over_half": recipe_b / half_b, "fp32_over_half": fp32_b / half_b,
               "params": sum(sum(p.numel() for p in m.parameters()) for m in meta.values()),
               "per_component": {c: count_layout_bytes(m, r[c]) for c, m in meta.items() if c in r}}
        row["pass"] = row["recipe_over_half"] <= TARGETS["memory_vs_all_half"]
        with contextlib.suppress(ImportError, AttributeError):
            hp_plan = planner_module().plan
            try:
                p = hp_plan("sdxl", device=dev)
                row["hf_precision_plan_bytes"] = p.total_bytes
                row["plan_agrees"] = p.total_bytes == recipe_b
            except Exception as err:
                row["hf_precision_plan_error"] = f"{type(err).__name__}: {err}"
        real[dev] = row
    return {"benchmarked": bench, "real_sdxl": real, "benchmarked_device": devices[0],
            "pass": real[devices[0]]["pass"]}


# ============================================================================================ 4. fidelity


def bench_fidelity(ctx: dict[str, Any], pipes: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import numpy as np
    import torch

    from hf_precision import dtypes as hdt

    recipe = ctx["recipe"]
    half = hdt.to_torch(recipe["unet"].compute)
    if half == torch.float32:
        half = torch.float16
    naive = copy.deepcopy(pipes["fp32"]).to(half)
    upcasts = half == torch.float16 and bool(getattr(naive.vae.config, "force_upcast", False))
    vae_factor = 2 ** (len(pipes["fp32"].vae.config.block_out_channels) - 1)
    side = vae_factor * ctx["fid_latent"]
    kwargs = {"prompt": "a photo of a cat", "negative_prompt": "blurry", "height": side, "width": side,
              "num_inference_steps": ctx["fid_steps"], "guidance_scale": 5.0, "output_type": "np"}
    results: dict[str, dict[str, list[float]]] = {n: {"max": [], "mean": [], "nan": [], "inf": []} for n in ("recipe", "naive")}
    ref_nonfinite = []
    errors = {}
    for seed in range(ctx["fid_seeds"]):
        images = {}
        for name, p in (("fp32", pipes["fp32"]), ("recipe", pipes["recipe"]), ("naive", naive)):
            try:
                with torch.inference_mode():
                    img = p(**kwargs, generator=torch.Generator("cpu").manual_seed(seed)).images
                images[name] = np.asarray(img, dtype=np.float64)
            except Exception as err:
                errors[name] = f"{type(err).__name__}: {err}"
        ref = images.get("fp32")
        if ref is None:
            break
        ref_nonfinite.append(int((~np.isfinite(ref)).sum()))
        for name in ("recipe", "naive"):
            if name not in images:
                continue
            img = images[name]
            diff = np.abs(np.nan_to_num(img, nan=np.inf) - ref)
            finite = np.isfinite(diff)
            results[name]["max"].append(float(diff.max()) if finite.all() else float("inf"))
            results[name]["mean"].append(float(diff[finite].mean()) if finite.any() else float("inf"))
            results[name]["nan"].append(int(np.isnan(img).sum()))
            results[name]["inf"].append(int(np.isinf(img).sum()))
    out: dict[str, Any] = {"image": [side, side], "steps": ctx["fid_steps"], "seeds": ctx["fid_seeds"],
                           "naive_cast": str(half).removeprefix("torch."), "naive_vae_upcast": upcasts, "errors": errors,
                           "reference_nonfinite": ref_nonfinite}
    for name, r in results.items():
        out[name] = {"max_abs": stats(r["max"]), "mean_abs": stats(r["mean"]), "nan": sum(r["nan"]), "inf": sum(r["inf"]),
                     "per_seed": r}
    if errors.get("recipe") or not results["recipe"]["max"]:
        out["pass"] = False
    elif not results["naive"]["max"]:
        out["pass"] = True  # the naive cast failed outright: the recipe is not worse
    else:
        rm, nm = out["recipe"], out["naive"]
        out["pass"] = (rm["mean_abs"]["median"] <= nm["mean_abs"]["median"]
                       and rm["max_abs"]["median"] <= nm["max_abs"]["median"]
                       and rm["nan"] + rm["inf"] <= nm["nan"] + nm["inf"])
    del naive
    gc.collect()
    return out


# ============================================================================================ 5. scale


def _cold_resolve_seconds(device: str) -> dict[str, Any]:
    """First resolve in a fresh process (YAML read and parsed; torch-free), then the cached resolves."""
    code = (
        "import time, json, sys; t0 = time.perf_counter(); from hf_precision.recipe.resolution import get_recipe; t1 = time.perf_counter();"
        f"r = get_recipe('sdxl', device={device!r}); t2 = time.perf_counter(); w = []\n"
        f"for _ in range(20):\n s = time.perf_counter(); get_recipe('sdxl', device={device!r}); w.append(time.perf_counter() - s)\n"
        "print(json.dumps({'import': t1 - t0, 'first': t2 - t1, 'warm': w, 'torch_imported': 'torch' in sys.modules}))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=str(ROOT),
                          env={**os.environ, **_QUIET_ENV}, timeout=300)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def bench_scale(ctx: dict[str, Any], meta: dict[str, Any], log: Callable[[str], None]) -> dict[str, Any]:
    import torch

    from hf_precision.runtime.apply import apply_recipe
    from hf_precision.recipe.resolution import get_recipe

    dev = ctx["recipe_device"] if ctx["recipe_device"] != "this" else ctx["device"]
    configs = {c: json.loads((REAL_SDXL / c / "config.json").read_text()) for c in meta}
    out: dict[str, Any] = {"device": dev, "cold_resolve": _cold_resolve_seconds(dev)}
    resolve = []
    for _ in range(ctx["scale_repeats"]):
        t0 = time.perf_counter()
        recipe = get_recipe("sdxl", device=dev, configs=configs)
        resolve.append(time.perf_counter() - t0)
    out["resolve_with_configs"] = stats(resolve)

    def time_apply(components: dict[str, Any]) -> dict[str, Any]:
        holder = types.SimpleNamespace(components=components)
        dtypes_of = lambda: {c: sorted({str(p.dtype).removeprefix("torch.") for p in m.parameters()})
                             for c, m in components.items()}
        before = dtypes_of()
        first = None
        samples = []
        for i in range(ctx["scale_repeats"] + 1):
            t0 = time.perf_counter()
            applied = apply_recipe(holder, recipe, strict=True)
            dt = time.perf_counter() - t0
            if i == 0:
                first = dt
            else:
                samples.append(dt)
        hooks = len(getattr(applied, "_handles", []))
        after = dtypes_of()
        applied.remove()
        return {"first": first, "reapply": stats(samples),
                "modules": sum(sum(1 for _ in m.modules()) for m in components.values()),
                "params": sum(sum(p.numel() for p in m.parameters()) for m in components.values()),
                "hooks": hooks, "islands": dict(applied.islands), "dtypes_before": before, "dtypes_after": after}

    out["pipeline"] = time_apply(dict(meta))
    out["pipeline"]["meta_params_cast"] = out["pipeline"]["dtypes_before"] != out["pipeline"]["dtypes_after"]
    # UNets of growing size: the real config with fewer / more layers per block and deeper transformer stacks.
    def build_on_meta(library: str, cls: str, config: dict[str, Any]) -> Any:
        import diffusers

        with torch.device("meta"):
            return getattr(diffusers, cls).from_config(config)

    base = configs["unet"]
    tl = base.get("transformer_layers_per_block", 1)
    scale_tl = lambda k: [x * k for x in tl] if isinstance(tl, list) else tl * k
    variants = [("layers_per_block=1", {"layers_per_block": 1}), ("real SDXL UNet", {})]
    if not ctx["quick"]:
        variants += [("layers_per_block=3", {"layers_per_block": 3}),
                     ("layers_per_block=3, 2x transformer depth", {"layers_per_block": 3,
                                                                   "transformer_layers_per_block": scale_tl(2)})]
    rows = []
    for label, change in variants:
        unet = meta["unet"] if not change else build_on_meta("diffusers", "UNet2DConditionModel", {**base, **change})
        res = time_apply({"unet": unet})
        res["label"] = label
        res["per_module_us"] = res["reapply"]["median"] / res["modules"] * 1e6
        rows.append(res)
        if change:
            del unet
        log(f"  scale {label}: {res['modules']} modules, apply {res['reapply']['median'] * 1e3:.1f} ms")
    out["unets"] = rows
    if len(rows) >= 2:
        xs = [math.log(r["modules"]) for r in rows]
        ys = [math.log(r["reapply"]["median"]) for r in rows]
        mx, my = statistics.mean(xs), statistics.mean(ys)
        out["growth_exponent"] = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return out


# ============================================================================================ report


def render(res: dict[str, Any]) -> str:
    env, cfg = res["env"], res["config"]
    cpu = env["cpu"]
    L = [f"# hf_precision benchmark ({cfg['size']} SDXL-shaped pipeline, {cfg['params']['total']:,} parameters)", ""]
    L.append(f"- Command: `{cfg['command']}`")
    L.append(f"- Date: {env['date']}; total wall time {res.get('wall_s', 0):.0f} s")
    L.append(f"- CPU: {cpu['model']} ({cpu['logical_cpus']} logical CPUs); flags: {' '.join(cpu['flags']) or '-'}; "
             f"AMX: {'yes' if cpu['amx'] else 'no'}; torch CPU capability: {env['torch_cpu_capability']}")
    if env.get("gpu"):
        L.append(f"- GPU: {env['gpu']}")
    L.append(f"- torch {env['torch']}, diffusers {env['diffusers']}, transformers {env['transformers']}, accelerate "
             f"{env['accelerate']}, Python {env['python']}; torch threads: {env['threads']}; device: {env['device']}")
    if env.get("loadavg_start"):
        L.append(f"- Load average at start / end: {', '.join(f'{x:.2f}' for x in env['loadavg_start'])} / "
                 f"{', '.join(f'{x:.2f}' for x in env.get('loadavg_end', []))} (other processes add noise)")
    L.append(f"- Benchmarked layout (recipe `sdxl` resolved for `{cfg['recipe_device']}` = {cfg['recipe_label']}): "
             f"{cfg['layout']}")
    L.append("- Parameters per component: " + ", ".join(f"{k} {v:,}" for k, v in cfg["params"].items() if k != "total"))
    L.append("- Figures: median (min – max, n = repeats); ratios are computed inside each repeat / round, then the median.")
    if cfg.get("quick"):
        L.append("- **Smoke run (`--quick`)**: too few repeats to be a measurement; PASS/FAIL here means nothing.")
    L.append("")

    summary = []
    sec = res["sections"]

    def failed(name: str) -> str | None:
        return sec.get(name, {}).get("error") or sec.get(name, {}).get("skipped")

    # ---- targets summary
    ld, rt, mem, fid = sec.get("load", {}), sec.get("runtime", {}), sec.get("memory", {}), sec.get("fidelity", {})
    if not failed("load"):
        summary.append(["Load peak RSS above baseline / final weight bytes (load_pipeline)",
                        fmt_stats(ld["recipe"]["peak_over_weights"], "x"), f"≤ {TARGETS['load_peak_rss_over_weights']:.2f}x",
                        verdict(ld["pass_peak"])])
        summary.append(["Load time load_pipeline / plain diffusers", fmt_stats(ld["time_ratio"], "x"),
                        f"≤ {TARGETS['load_time_ratio']:.2f}x", verdict(ld["pass_time"])])
    else:
        summary.append(["Load", failed("load"), "", verdict(None if sec.get("load", {}).get("skipped") else False)])
    if not failed("runtime"):
        summary.append(["Runtime: recipe hooks over the no-hook floor (per denoiser call)",
                        fmt_stats(rt["over_floor"].get("hooks", {}), "%"), f"≤ {TARGETS['runtime_overhead'] * 100:.0f}%",
                        verdict(rt["pass"])])
    else:
        summary.append(["Runtime", failed("runtime"), "", verdict(None if sec.get("runtime", {}).get("skipped") else False)])
    if not failed("memory"):
        for dev, row in mem["real_sdxl"].items():
            summary.append([f"Memory: real SDXL weight bytes, recipe ({dev}) / all-half",
                            f"{row['recipe_over_half']:.4f}x", f"≤ {TARGETS['memory_vs_all_half']:.2f}x",
                            verdict(row["pass"]) + ("" if dev == mem["benchmarked_device"] else " (other layout)")])
    else:
        summary.append(["Memory", failed("memory"), "", verdict(None if sec.get("memory", {}).get("skipped") else False)])
    if not failed("fidelity"):
        summary.append(["Fidelity: recipe error vs fp32 not worse than naive pipe.to(half)",
                        f"mean {fmt(fid['recipe']['mean_abs']['median'], '', 3)} vs {fmt(fid['naive']['mean_abs']['median'], '', 3)}",
                        "recipe ≤ naive", verdict(fid["pass"])])
    else:
        summary.append(["Fidelity", failed("fidelity"), "", verdict(None if sec.get("fidelity", {}).get("skipped") else False)])
    L += ["## Targets", "", md_table(["target", "measured", "target value", "result"], summary), ""]

    def machine_load(name: str) -> None:
        la = sec.get(name, {}).get("loadavg_1min")
        if la:
            L.append(f"_Section wall time {sec[name].get('wall_s', 0):.0f} s; 1-minute load average {la[0]:.2f} at its "
                     f"start, {la[1]:.2f} at its end ({env['cpu']['logical_cpus']} CPUs)._")
            L.append("")

    def section_ok(name: str) -> bool:
        """Print the section's machine load; False (with the error written) when the section did not run."""
        machine_load(name)
        if failed(name):
            L.extend([f"{'ERROR: ' if sec.get(name, {}).get('error') else ''}{failed(name)}", ""])
            return False
        return True

    # ---- 1. load
    L += ["## 1. Load", ""]
    if section_ok("load"):
        L.append(f"Each load runs in a fresh subprocess ({cfg['load_repeats']} per loader, order alternating; page cache "
                 f"warm; fp32 safetensors on disk, cast while loading). Plain diffusers gets "
                 f"`dtype={json.dumps(ld['dtype_map'])}` (the dict load_pipeline passes). Baseline = RSS after importing "
                 f"torch, diffusers, transformers and hf_precision. Peak = `ru_maxrss`.")
        L.append("")
        rows = []
        for loader, label in (("plain", "plain `DiffusionPipeline.from_pretrained`"), ("recipe", "`hf_precision.load_pipeline`")):
            r = ld[loader]
            rows.append([label, fmt_stats(r["seconds"], "s", 2), fmt_stats(r["cpu_seconds"], "s", 2),
                         fmt_stats(r["peak_above_baseline"], "MiB"),
                         fmt_stats(r["peak_over_weights"], "x", 2), fmt_stats(r["anon_peak_over_weights"], "x", 2),
                         fmt(r["weight_bytes"], "MiB")])
        L.append(md_table(["loader", "wall time", "CPU time", "peak RSS − baseline", "peak / weights", "peak anon RSS / weights",
                           "final weight bytes"], rows))
        L.append("")
        L.append(f"- load_pipeline / plain, time: {fmt_stats(ld['time_ratio'], 'x')} (target ≤ "
                 f"{TARGETS['load_time_ratio']}x: {verdict(ld['pass_time'])}); CPU time: {fmt_stats(ld['cpu_time_ratio'], 'x')}; "
                 f"peak RSS: {fmt_stats(ld['peak_ratio'], 'x')}")
        st = ld["stages"]
        L.append(f"- Inside load_pipeline (timed by wrapping its stages): resolve {fmt(st['resolve']['median'], 'ms', 1)}, "
                 f"re-reading the fp32 islands {fmt(st['reload_islands']['median'], 'ms', 1)}, apply_recipe (casts + hooks) "
                 f"{fmt(st['apply_recipe']['median'], 'ms', 1)}: this bookkeeping is {fmt_stats(ld['own_work_share'], '%')} "
                 f"of the plain load time. Components read tensor by tensor (`_stream_components`, instead of "
                 f"from_pretrained's memory map): {fmt(st['stream']['median'], 's', 2)}"
                 + (" (not used by this load_pipeline)." if not st["stream"]["median"] else "."))
        L.append(f"- Final parameter dtypes: plain {json.dumps(ld['plain']['dtypes'])}; load_pipeline "
                 f"{json.dumps(ld['recipe']['dtypes'])} (its fp32 islands make its weights a little larger; the ratios use "
                 f"each loader's own final bytes). Same storage dtypes apart from the islands: {ld['same_dtypes']}.")
        L.append("- 'peak anon RSS' is the sampled peak of anonymous memory (RssAnon, every 5 ms); the rest of the peak is "
                 "file-backed pages of the memory-mapped safetensors files.")
        L.append("")

    # ---- 2. runtime
    L += ["## 2. Runtime overhead (one denoiser call)", ""]
    if section_ok("runtime"):
        i = rt["inputs"]
        L.append(f"UNet {rt['params']:,} parameters, {rt['modules']} modules; inputs: batch {i['batch']} (CFG), latents "
                 f"{i['batch']}x4x{i['latent']}x{i['latent']}, 77 text tokens; inputs arrive in the pipeline's latents dtype "
                 f"({i['latents_dtype']}); compute {i['compute']}, storage {i['storage']}, fp32 islands: "
                 f"{', '.join(i['islands']) or 'none'}. {cfg['warmup']} warm-up calls per variant, then {cfg['rounds']} "
                 f"rounds; every round times {cfg['hook_pairs']} recipe/floor pairs and one pair per other variant, each pair "
                 f"back to back (order alternating), and a variant's overhead is the ratio inside its pair; "
                 f"`torch.inference_mode()`.")
        L.append("")
        desc = {
            "hooks": "recipe (load_pipeline): entry hook + island hooks",
            "floor": "floor: the same UNet object (same weight memory) with its hooks detached and the islands wrapped "
                     "in a hand-written fp32 cast, inputs pre-cast",
            "floor_all_half": "no hooks, islands cast to the compute dtype too (no island casts at all), inputs pre-cast",
            "layerwise": f"diffusers layerwise casting (storage {i['storage']} → compute {i['compute']}) on "
                         f"{rt['layerwise_hooked_layers']} Linear/Conv layers of the floor model",
            "autocast": f"fp32 weights, fp32 inputs, `torch.autocast(dtype={i['compute']})`",
        }
        rows = []
        for name, s in rt["seconds"].items():
            over = rt["over_floor"].get(name)
            rows.append([desc.get(name, name), fmt_stats(s, "ms", 1), "—" if name == "floor" else fmt_stats(over, "%"),
                         fmt(rt["max_abs_diff_vs_hooks"].get(name), "", 3)])
        L.append(md_table(["variant", "time per call", "over the floor (paired call)", "max |Δ| vs recipe output"], rows))
        L.append("")
        for name, err in rt.get("errors", {}).items():
            L.append(f"- {name} could not run: {err}")
        L.append(f"- Time spent inside the recipe's hooks, measured by wrapping each hook: {fmt(rt['hook_seconds_per_call'], 'us', 0)} "
                 f"per call = {fmt(rt['hook_share_of_floor'], '%')} of the floor (the noise-free part of the overhead); per hook: "
                 + ", ".join(f"{k} {v * 1e6:.0f} µs" for k, v in rt.get("hook_seconds_split", {}).items()) + ".")
        ci = rt.get("hooks_median_ci95")
        L.append(f"- Target: hooks ≤ {TARGETS['runtime_overhead'] * 100:.0f}% over the floor: {verdict(rt['pass'])} (median of "
                 f"{rt['over_floor'].get('hooks', {}).get('n', 0)} pairs"
                 + (f", 95% CI of the median {fmt(ci[0], '%')} – {fmt(ci[1], '%')}: "
                    + ("conclusive" if rt.get("conclusive") else "the CI straddles the target, so this run cannot "
                       "resolve it; the isolated hook time above is the precise figure") if ci else "")
                 + "). The floor computes exactly what the recipe computes (max |Δ| 0 means bit-identical).")
        L.append("")

    # ---- 3. memory
    L += ["## 3. Memory (weight bytes)", ""]
    if section_ok("memory"):
        b = mem["benchmarked"]
        L.append("'all-half': every floating tensor in the recipe's half dtype (2 bytes); 'fp32': what `torch.autocast` "
                 "keeps in memory. Real SDXL: the shipped SDXL-base configs built on the meta device (parameters only).")
        L.append("")
        rows = [[f"benchmarked pipeline ({cfg['size']}, loaded)", cfg["layout"], fmt(b["recipe"], "MiB"),
                 fmt(b["all_half"], "MiB"), fmt(b["fp32_autocast"], "MiB"), f"{b['recipe_over_half']:.4f}x",
                 f"{b['fp32_over_half']:.3f}x", "—"]]
        for dev, row in mem["real_sdxl"].items():
            plan_note = ("= hp.plan" if row.get("plan_agrees") else
                         f"hp.plan: {fmt(row.get('hf_precision_plan_bytes'), 'MiB')}" if "hf_precision_plan_bytes" in row
                         else row.get("hf_precision_plan_error", "hp.plan unavailable"))
            rows.append([f"real SDXL-base ({row['params']:,} params), recipe for `{dev}`", row["layout"],
                         fmt(row["recipe"], "MiB"), fmt(row["all_half"], "MiB"), fmt(row["fp32_autocast"], "MiB"),
                         f"{row['recipe_over_half']:.4f}x {verdict(row['pass'])}", f"{row['fp32_over_half']:.3f}x", plan_note])
        L.append(md_table(["pipeline", "layout", "recipe", "all-half", "fp32 (autocast)", "recipe / all-half (≤ 1.01x)",
                           "fp32 / all-half", "cross-check"], rows))
        L.append("")
        L.append(f"- The target is judged on the real SDXL configs with the benchmarked layout (`{mem['benchmarked_device']}`): "
                 f"{verdict(mem['pass'])}.")
        L.append("")

    # ---- 4. fidelity
    L += ["## 4. Fidelity (final image vs an fp32 reference)", ""]
    if section_ok("fidelity"):
        L.append(f"{fid['image'][0]}x{fid['image'][1]} image, {fid['steps']} Euler steps, guidance 5, seeds 0..{fid['seeds'] - 1}; "
                 f"images in [0, 1]. Reference: the same weights loaded in fp32, no hooks. Naive: the fp32 pipeline "
                 f"`.to(torch.{fid['naive_cast']})`"
                 + (" (diffusers then upcasts the VAE to fp32 for decoding: force_upcast)." if fid.get("naive_vae_upcast")
                    else " (decodes in that dtype: diffusers upcasts only fp16 VAEs).")
                 + " Both criteria (median max and median mean |Δ|) must hold.")
        L.append("")
        rows = []
        for name, label in (("recipe", f"recipe ({cfg['recipe_device']} layout)"), ("naive", f"naive pipe.to({fid['naive_cast']})")):
            r = fid[name]
            rows.append([label, fmt_stats(r["max_abs"], "", 3), fmt_stats(r["mean_abs"], "", 3), r["nan"], r["inf"]])
        L.append(md_table(["pipeline", "max |Δ|", "mean |Δ|", "NaN count", "inf count"], rows))
        L.append("")
        for name, err in fid.get("errors", {}).items():
            L.append(f"- {name} failed: {err}")
        L.append(f"- Reference non-finite values: {sum(fid['reference_nonfinite'])}. Recipe not worse than the naive cast "
                 f"(median max and mean |Δ|, NaN/inf counts): {verdict(fid['pass'])}.")
        L.append("")

    # ---- 5. scale
    sc = sec.get("scale", {})
    L += ["## 5. Scale (resolve and apply on the meta device, real SDXL configs)", ""]
    if section_ok("scale"):
        cold = sc.get("cold_resolve", {})
        if "error" in cold:
            L.append(f"- Cold resolve failed: {cold['error']}")
        else:
            L.append(f"- Resolve `get_recipe('sdxl', device={sc['device']!r})` in a fresh process: import "
                     f"{fmt(cold['import'], 'ms', 1)}, first resolve (reads the YAML) {fmt(cold['first'], 'ms', 1)}, "
                     f"cached {fmt(stats(cold['warm'])['median'], 'us', 0)}; torch imported: {cold['torch_imported']}.")
        L.append(f"- Resolve with the real component configs (in-process): {fmt_stats(sc['resolve_with_configs'], 'ms', 2)}.")
        p = sc["pipeline"]
        L.append(f"- `apply_recipe` on the whole meta SDXL pipeline ({p['params']:,} parameters, {p['modules']:,} modules): "
                 f"first {fmt(p['first'], 'ms', 1)}, re-apply {fmt_stats(p['reapply'], 'ms', 1)}; {p['hooks']} hook handles; "
                 f"islands {json.dumps({k: v for k, v in p['islands'].items() if v})}.")
        L.append(f"- Meta parameter dtypes before apply {json.dumps(p['dtypes_before'])}, after "
                 f"{json.dumps(p['dtypes_after'])}: " + ("apply_recipe cast them." if p["meta_params_cast"] else
                 "apply_recipe does not cast meta tensors (`_cast_parameters` skips them), so this times the module "
                 "walk, island matching and hook registration; casting on meta would be free anyway."))
        L.append("")
        rows = [[r["label"], f"{r['modules']:,}", f"{r['params']:,}", fmt(r["first"], "ms", 1),
                 fmt_stats(r["reapply"], "ms", 1), f"{r['per_module_us']:.2f} µs"] for r in sc["unets"]]
        L.append(md_table(["UNet (meta)", "modules", "parameters", "first apply", "re-apply", "per module"], rows))
        L.append("")
        if sc.get("growth_exponent") is not None:
            L.append(f"- Growth: apply time ∝ modules^{sc['growth_exponent']:.2f} (log-log fit; 1.0 = linear).")
        L.append("")
    for name, s in sec.items():
        if s.get("traceback"):
            L += [f"<details><summary>{name} traceback</summary>", "", "```", s["traceback"], "```", "</details>", ""]
    return "\n".join(L)


# ============================================================================================ main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", default="mid", help="mid (~287M parameters, default), tiny, or a JSON object / file of "
                   "per-component config overrides for hf_precision.testing.pipelines.make_sdxl")
    p.add_argument("--device", default="cpu", help="where the pipelines run (default cpu)")
    p.add_argument("--recipe-device", default="t4", help="the layout to benchmark: a device preset (default t4: fp16 "
                   "UNet with fp32 islands, fp32 VAE) or 'this' (what --device itself gets)")
    p.add_argument("--repeats", type=int, default=None, help="load repeats per loader and scale repeats (default 6; quick 1)")
    p.add_argument("--rounds", type=int, default=None, help="runtime rounds (default 12, each with 3 hooks/floor pairs and one pair per other variant; quick 2)")
    p.add_argument("--latent", type=int, default=None, help="runtime latent side (default 32 for mid: 2x4x32x32; 16 tiny)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's default)")
    p.add_argument("--out", default="bench_output", help="output folder (benchmark.md, benchmark.json, cache/)")
    p.add_argument("--quick", action="store_true", help="fast smoke run (fewer repeats, fewer steps)")
    p.add_argument("--only", default=None, help="comma list of sections to run (load,runtime,memory,fidelity,scale)")
    # internal: one load in a fresh process
    p.add_argument("--worker-load", choices=["plain", "recipe"], help=argparse.SUPPRESS)
    p.add_argument("--folder", help=argparse.SUPPRESS)
    p.add_argument("--dtypes", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker_load:
        worker_load(args)
        return 0
    os.environ.update({k: v for k, v in _QUIET_ENV.items() if k != "PYTHONWARNINGS"})
    t_start = time.perf_counter()
    import torch

    quiet_libraries()
    threads = args.threads or torch.get_num_threads()
    torch.set_num_threads(threads)
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)

    def log(msg: str) -> None:
        print(f"[{time.perf_counter() - t_start:6.1f}s] {msg}", flush=True)

    size, key = resolve_size(args.size)
    tiny = key == "tiny"
    quick = args.quick
    repeats = args.repeats or (1 if quick else 6)
    ctx: dict[str, Any] = {
        "device": args.device, "recipe_device": args.recipe_device, "threads": threads, "quick": quick,
        "load_repeats": repeats, "scale_repeats": max(repeats, 3),
        "rounds": args.rounds or (2 if quick else 12), "hook_pairs": 1 if quick else 3, "warmup": 1 if quick else 2,
        "batch": 2, "latent": args.latent or (16 if tiny else 32),
        "fid_latent": 16, "fid_steps": 2 if quick else 4, "fid_seeds": 1 if quick else 3,
    }
    sections = [s.strip() for s in (args.only or "load,runtime,memory,fidelity,scale").split(",")]
    recipe = recipe_for(args.recipe_device, args.device)
    ctx["recipe"] = recipe
    prepared = prepare_pipeline(size, key, out_dir / "cache", log)
    ctx["folder"] = prepared["folder"]
    command = "python scripts/benchmark.py " + " ".join(shlex.quote(a) for a in (argv if argv is not None else sys.argv[1:]))
    results: dict[str, Any] = {
        "env": env_info(threads, args.device),
        "config": {"command": command.strip(), "size": key, "size_spec": size,
                   "params": prepared["params"], "folder": prepared["folder"], "recipe_device": args.recipe_device,
                   "recipe_label": recipe.device.label(), "layout": layout(recipe), "recipe": recipe.to_dict(),
                   **{k: v for k, v in ctx.items() if k not in ("recipe",)}},
        "targets": TARGETS,
        "sections": {},
    }
    log(f"layout: {layout(recipe)}")

    def run(name: str, fn: Callable[[], dict[str, Any]]) -> None:
        if name not in sections:
            results["sections"][name] = {"skipped": "not run (--only)"}
            return
        log(f"section {name} ...")
        load0 = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
        t0 = time.perf_counter()
        try:
            results["sections"][name] = fn()
        except Exception as err:
            results["sections"][name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()}
            log(f"section {name} FAILED: {type(err).__name__}: {err}")
        results["sections"][name]["wall_s"] = time.perf_counter() - t0
        if load0 is not None:
            results["sections"][name]["loadavg_1min"] = [load0, os.getloadavg()[0]]
        log(f"section {name} done in {time.perf_counter() - t0:.1f} s")

    run("load", lambda: bench_load(ctx, log))

    pipes: dict[str, Any] = {}
    if {"runtime", "memory", "fidelity"} & set(sections):
        from diffusers import DiffusionPipeline

        from hf_precision.runtime.load import load_pipeline

        pipes["fp32"] = DiffusionPipeline.from_pretrained(ctx["folder"], dtype=torch.float32, use_safetensors=True).to(args.device)
        pipes["recipe"] = load_pipeline(ctx["folder"], args.device, recipe=recipe)
        for p in pipes.values():
            p.set_progress_bar_config(disable=True)
    run("runtime", lambda: bench_runtime(ctx, pipes, log))
    meta: dict[str, Any] = {}
    if {"memory", "scale"} & set(sections):
        meta = build_meta_sdxl(log)
    run("memory", lambda: bench_memory(ctx, pipes, meta, log))
    run("fidelity", lambda: bench_fidelity(ctx, pipes, log))
    pipes.clear()
    gc.collect()
    run("scale", lambda: bench_scale(ctx, meta, log))

    with contextlib.suppress(OSError):
        results["env"]["loadavg_end"] = list(os.getloadavg())
    results["wall_s"] = time.perf_counter() - t_start
    (out_dir / "benchmark.json").write_text(json.dumps(results, indent=2, default=str))
    md = render(results)
    (out_dir / "benchmark.md").write_text(md + "\n")
    print(md)
    log(f"wrote {out_dir / 'benchmark.md'} and {out_dir / 'benchmark.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
