"""Fidelity: the recipe layout and a naive ``pipe.to(half)`` against fp32, on the demo's shipped trained model.

Random weights are chaotic (a rounding difference grows over the blocks and the sampling steps), so their errors
measure that chaos as much as precision. The section therefore measures the small SDXL that ships with hf_precision
(``hf_precision.apps.shapes_model``: UNet trained by ``hf-precision train`` on the demo's coloured shapes, rebuilt by
``python scripts/build_shapes_model.py``; nothing is trained here), and the same structure with random weights beside
it, so the report shows what random weights would have said. Two things are compared with the fp32 reference of the
same weights: the final image of a short sampling run, and the denoiser's output on the exact inputs the fp32 run fed
it at each step (precision only, no trajectory drift). The target is judged against the run-to-run noise measured
here: the spread over the seeds of the per-seed difference between the recipe's error and the naive cast's.
"""

from __future__ import annotations

import copy
import gc
import math
import statistics
import tempfile
from pathlib import Path
from typing import Any

from .common import stats

# The shipped model's captions (hf_precision.apps.shapes_model.PROMPTS): what it was trained to draw.
PROMPTS = ("a red square", "a blue circle", "a green circle", "a yellow square")
KINDS = ("image", "denoiser")
METRICS = ("psnr_db", "rel_l2", "max_abs")


def compare(out: Any, ref: Any, peak: float | None = None) -> dict[str, float]:
    """PSNR (dB, against ``peak``, default max |ref|), relative L2 and max |Δ| of ``out`` against ``ref``.

    Example:
        >>> import numpy as np
        >>> r = compare(np.array([0.5, 1.0]), np.array([0.5, 0.9]), peak=1.0)
        >>> round(r["psnr_db"], 2), round(r["max_abs"], 2), r["nonfinite"]
        (23.01, 0.1, 0)
        >>> bad = compare(np.array([np.nan, 1.0]), np.array([0.5, 1.0]))  # a NaN counts, and is infinitely off
        >>> bad["nonfinite"], bad["max_abs"], bad["psnr_db"]
        (1, inf, -inf)
    """
    import numpy as np

    out, ref = np.asarray(out, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    nonfinite = int((~np.isfinite(out)).sum())
    diff = np.nan_to_num(out, nan=np.inf) - ref
    mse = float(np.mean(diff ** 2))
    peak = float(np.abs(ref).max()) if peak is None else peak
    return {"psnr_db": math.inf if mse == 0 else 10 * math.log10(peak ** 2 / mse) if math.isfinite(mse) else -math.inf,
            "rel_l2": float(np.sqrt(np.sum(diff ** 2)) / max(np.sqrt(np.sum(ref ** 2)), 1e-30)),
            "max_abs": float(np.abs(diff).max()), "nonfinite": nonfinite}


def _cast(value: Any, dtype: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor):
        return value.to(dtype) if value.is_floating_point() else value
    if isinstance(value, dict):
        return {k: _cast(v, dtype) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _record_calls(unet: Any) -> tuple[list[tuple[Any, Any, Any]], Any]:
    """Every (args, kwargs, output) of ``unet`` from now on, cloned; and the hook handle to remove."""
    import torch

    calls: list[tuple[Any, Any, Any]] = []

    def clone(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clone(x) for k, x in v.items()}
        return v.detach().clone() if isinstance(v, torch.Tensor) else v

    def keep(module: Any, args: Any, kwargs: Any, output: Any) -> None:
        calls.append((clone(list(args)), clone(kwargs), clone(output[0] if isinstance(output, tuple) else output.sample)
                      .float()))

    return calls, unet.register_forward_hook(keep, with_kwargs=True)


def measure_model(folder: str, ctx: dict[str, Any], progress: Any, label: str) -> dict[str, Any]:
    """Image and denoiser errors of the recipe pipeline and of fp32 ``.to(half)`` against fp32, on ``folder``."""
    import torch
    from diffusers import DiffusionPipeline

    import hf_precision as hp
    from hf_precision import dtypes as hdt
    from hf_precision.apps.demo_pictures import SHAPES_CALL
    from hf_precision.apps.shapes_model import decoder_peak

    fp32 = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32, use_safetensors=True).to(ctx["device"])
    # the layout asked, computed as asked: a fast substitute dtype (what runtime measures) would not be its precision
    recipe = hp.load_pipeline(folder, ctx["device"], layout=ctx["load_layout"])
    half = hdt.to_torch(hp.applied(recipe).recipe["unet"].compute)
    half = torch.bfloat16 if half == torch.float32 else half
    pipes = {"fp32": fp32, "recipe": recipe, "naive": copy.deepcopy(fp32).to(half)}
    for p in pipes.values():
        p.set_progress_bar_config(disable=True)
    per = {n: {k: {m: [] for m in METRICS} | {"nonfinite": 0} for k in KINDS} for n in ("recipe", "naive")}
    per["vae_half"] = {"image": {m: [] for m in METRICS} | {"nonfinite": 0}}
    vae_half = copy.deepcopy(fp32.vae).to(half)
    errors: dict[str, str] = {}

    def add(name: str, kind: str, result: dict[str, float]) -> None:
        for m in METRICS:
            per[name][kind][m].append(result[m])
        per[name][kind]["nonfinite"] += result["nonfinite"]

    for seed in range(ctx["fid_seeds"]):
        kwargs = {**SHAPES_CALL, "prompt": PROMPTS[seed % len(PROMPTS)], "num_inference_steps": ctx["fid_steps"],
                  "output_type": "np"}
        images, calls, decoded = {}, [], []
        for name, p in pipes.items():
            if name == "fp32":
                calls, handle = _record_calls(p.unet)
                decoder = p.vae.decoder.register_forward_hook(lambda m, a, o: decoded.append((a[0].clone(), o.clone())))
            with progress.step("image", f"fidelity ({label}): {name} image, seed {seed}"):
                try:
                    with torch.inference_mode():
                        images[name] = p(**kwargs, generator=torch.Generator("cpu").manual_seed(seed)).images
                except Exception as err:  # a layout that cannot run is reported, never hidden
                    errors[name] = f"{type(err).__name__}: {err}"
                finally:
                    if name == "fp32":
                        handle.remove()
                        decoder.remove()
        if "fp32" not in images:
            break
        # the fp32 run's final latents through the VAE decoder in the half dtype: what a decode without
        # diffusers' force_upcast (the SDXL VAE's flag for this overflow) or without the recipe's fp32 VAE gives
        with torch.inference_mode():
            for z, want in decoded:
                got = vae_half.decoder(z.to(half)).float()
                add("vae_half", "image", compare((got / 2 + 0.5).clamp(0, 1).cpu().numpy(),
                                                 (want / 2 + 0.5).clamp(0, 1).cpu().numpy(), peak=1.0))
        for name in ("recipe", "naive"):
            if name not in images:
                continue
            add(name, "image", compare(images[name], images["fp32"], peak=1.0))
            # the naive pipeline feeds its UNet half inputs; the recipe's entry hook casts what it gets
            dtype = half if name == "naive" else torch.float32
            with torch.inference_mode():
                for args, kw, ref in calls:
                    out = pipes[name].unet(*_cast(args, dtype), **_cast(kw, dtype))[0]
                    add(name, "denoiser", compare(out.float().cpu().numpy(), ref.cpu().numpy()))
    out: dict[str, Any] = {"naive_dtype": hdt.from_torch(half), "errors": errors}
    out["decoder_peak"] = decoder_peak(fp32.vae, decoded[0][0]) if decoded else None
    for name, kinds in per.items():
        out[name] = {k: {m: stats(v[m]) for m in METRICS} | {"nonfinite": v["nonfinite"]} for k, v in kinds.items()}
    pipes.clear()
    gc.collect()
    return out


def judge(t: dict[str, Any]) -> dict[str, Any]:
    """The target on the trained model's image rel L2: the recipe's at most the naive cast's, within the run-to-run
    noise measured (half the spread over the seeds of the per-seed difference recipe - naive), and finite.

    Example:
        >>> row = lambda xs, bad=0: {"image": {"rel_l2": {"samples": xs}, "nonfinite": bad}}
        >>> j = judge({"errors": {}, "recipe": row([1.0, 1.3, 1.2]), "naive": row([1.1, 1.2, 1.3])})
        >>> j["pass"], round(j["median_diff"], 3), round(j["noise"], 3)
        (True, -0.1, 0.1)
        >>> judge({"errors": {}, "recipe": row([2.0, 2.1]), "naive": row([1.0, 1.0])})["pass"]
        False
        >>> judge({"errors": {}, "recipe": row([2.0]), "naive": row([1.0])})["pass"] is None
        True
    """
    recipe, naive = t["recipe"]["image"], t["naive"]["image"]
    if "recipe" in t["errors"] or not recipe["rel_l2"]["samples"] or recipe["nonfinite"]:
        return {"pass": False, "why": "the recipe's image failed or was not finite"}
    if "naive" in t["errors"] or naive["nonfinite"]:
        return {"pass": True, "why": "the naive cast failed or was not finite; the recipe's image is finite"}
    diffs = [r - n for r, n in zip(recipe["rel_l2"]["samples"], naive["rel_l2"]["samples"])
             if math.isfinite(r) and math.isfinite(n)]
    if len(diffs) < 2:  # one seed (--quick) measures no spread: no verdict
        return {"pass": None, "median_diff": diffs[0] if diffs else None, "noise": None, "n": len(diffs),
                "why": "one seed measures no run-to-run noise: no verdict (run without --quick)"}
    median, noise = statistics.median(diffs), (max(diffs) - min(diffs)) / 2
    verdict = "better than" if median < -noise else "equal within noise to" if median <= noise else "worse than"
    return {"pass": median <= noise, "median_diff": median, "noise": noise, "n": len(diffs),
            "why": f"recipe {verdict} the naive cast"}


def fidelity_model(ctx: dict[str, Any], progress: Any, work: Path) -> tuple[str, dict[str, Any]]:
    """The shipped shapes model (nothing trained here), its record, and the same structure with random weights."""
    from hf_precision.apps.shapes_model import SPEC, shipped_folder, shipped_record
    from hf_precision.testing.pipelines import make_sdxl, save_pipeline

    folder, record = shipped_folder(), shipped_record()
    with progress.step("prepare", "fidelity: the shipped shapes model, and its structure with random weights ..."):
        random = save_pipeline(make_sdxl(SPEC, seed=record["training"]["seed"]), work / "random")
    return str(folder), {**record, "folder": str(folder), "untrained": str(random)}


def bench_fidelity(ctx: dict[str, Any], progress: Any) -> dict[str, Any]:
    """The section: measure the shipped trained model and its structure with random weights, judge the trained one."""
    import torch

    from hf_precision.apps.demo_pictures import SHAPES_CALL

    # The shapes model's ops are too small to split across threads: on a busy 2-core machine a second thread only
    # waits for its sibling. The section measures precision, not speed, so it runs on one.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            folder, info = fidelity_model(ctx, progress, Path(tmp))
            out: dict[str, Any] = {"image": SHAPES_CALL["height"], "steps": ctx["fid_steps"], "seeds": ctx["fid_seeds"],
                                   "guidance": SHAPES_CALL["guidance_scale"], "trained": info, "models": {},
                                   "threads": 1}
            for label, where in (("trained", folder), ("random weights", info["untrained"])):
                out["models"][label] = measure_model(where, ctx, progress, label)
    finally:
        torch.set_num_threads(threads)
    t = out["models"]["trained"]
    out["naive_dtype"] = t["naive_dtype"]
    # Judged on the image (what a user sees); the denoiser's own error is reported beside it: the recipe differs from
    # the naive cast there only by its fp32 islands, so the two are equal up to noise.
    out["judged"] = judge(t)
    out["pass"] = out["judged"]["pass"]
    return out
