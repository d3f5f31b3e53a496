"""Fidelity: the recipe layout and a naive ``pipe.to(half)`` against fp32, on a model trained by this program.

Random weights are chaotic (a rounding difference grows over the blocks and the sampling steps), so their errors
measure that chaos as much as precision. The section therefore fits a small SDXL pipeline's UNet first with
``hf-precision train --method full`` in fp32 (``bench/trained.py``, cached under ``<out>/trained/``) and measures
that model, and the same pipeline before training beside it, so the report shows what random weights would have said.
Two things are compared with the fp32 reference of the same weights: the final image of a short sampling run, and
the denoiser's output on the exact inputs the fp32 run fed it at each step (precision only, no trajectory drift).
"""

from __future__ import annotations

import copy
import gc
import math
from typing import Any

from .common import stats
from .trained import trained_pipeline

# The model per benchmark size: "tiny" trains the tiny SDXL; every other size trains the SDXL-base structure of
# "mid" (3 levels, 1/2/5 transformer layers, head dim 32) at a quarter of mid's UNet width (20.5M UNet parameters),
# which fits hundreds of steps in a few CPU minutes; mid's own 242M-parameter UNet took 49 s a step on a shared
# 2-core CPU.
MODELS = {
    "tiny": {"size": "tiny", "resolution": 32, "steps": 300, "quick_steps": 4},
    "small": {"size": {"base": "mid", "unet": {"block_out_channels": [32, 64, 128], "attention_head_dim": [1, 2, 4]}},
              "resolution": 64, "steps": 200, "quick_steps": 4},
}
PROMPTS = ("a red square", "a blue circle", "a green circle", "a yellow square")  # captions the model was fitted to (hf_precision.apps.train.demo)
KINDS = ("image", "denoiser")
METRICS = ("psnr_db", "rel_l2", "max_abs")


def compare(out: Any, ref: Any, peak: float | None = None) -> dict[str, float]:
    """PSNR (dB, against ``peak``, default max |ref|), relative L2 and max |Δ| of ``out`` against ``ref``.

    Example:
        >>> import numpy as np
        >>> r = compare(np.array([0.5, 1.0]), np.array([0.5, 0.9]), peak=1.0)
        >>> round(r["psnr_db"], 2), round(r["max_abs"], 2), r["nonfinite"]
        (23.01, 0.1, 0)
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

    fp32 = DiffusionPipeline.from_pretrained(folder, dtype=torch.float32, use_safetensors=True).to(ctx["device"])
    # the layout asked, computed as asked: a fast substitute dtype (what runtime measures) would not be its precision
    recipe = hp.load_pipeline(folder, ctx["device"], layout=ctx["load_layout"])
    half = hdt.to_torch(hp.applied(recipe).recipe["unet"].compute)
    half = torch.bfloat16 if half == torch.float32 else half
    pipes = {"fp32": fp32, "recipe": recipe, "naive": copy.deepcopy(fp32).to(half)}
    for p in pipes.values():
        p.set_progress_bar_config(disable=True)
    side = ctx["fid_side"]
    per = {n: {k: {m: [] for m in METRICS} | {"nonfinite": 0} for k in KINDS} for n in ("recipe", "naive")}
    errors: dict[str, str] = {}

    def add(name: str, kind: str, result: dict[str, float]) -> None:
        for m in METRICS:
            per[name][kind][m].append(result[m])
        per[name][kind]["nonfinite"] += result["nonfinite"]

    for seed in range(ctx["fid_seeds"]):
        kwargs = {"prompt": PROMPTS[seed % len(PROMPTS)], "height": side, "width": side, "guidance_scale": 5.0,
                  "num_inference_steps": ctx["fid_steps"], "output_type": "np"}
        images, calls = {}, []
        for name, p in pipes.items():
            if name == "fp32":
                calls, handle = _record_calls(p.unet)
            with progress.step("image", f"fidelity ({label}): {name} image, seed {seed}"):
                try:
                    with torch.inference_mode():
                        images[name] = p(**kwargs, generator=torch.Generator("cpu").manual_seed(seed)).images
                except Exception as err:  # a layout that cannot run is reported, never hidden
                    errors[name] = f"{type(err).__name__}: {err}"
                finally:
                    if name == "fp32":
                        handle.remove()
        if "fp32" not in images:
            break
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
    for name, kinds in per.items():
        out[name] = {k: {m: stats(v[m]) for m in METRICS} | {"nonfinite": v["nonfinite"]} for k, v in kinds.items()}
    pipes.clear()
    gc.collect()
    return out


def fidelity_model(ctx: dict[str, Any], progress: Any) -> tuple[str, dict[str, Any]]:
    """The trained pipeline for this run (trained once, then read from ``<out>/trained/``) and its training record."""
    from hf_precision.testing.pipelines import make_sdxl

    key = "tiny" if ctx["size_key"] == "tiny" else "small"
    m = MODELS[key]
    steps = ctx["train_steps"] if ctx["train_steps"] is not None else m["quick_steps" if ctx["quick"] else "steps"]
    ctx["fid_side"] = m["resolution"]
    with progress.step("train", f"fidelity: the {key} SDXL UNet trained {steps} steps (hf-precision train, "
                                f"--method full, fp32; once, then cached) ..."):
        folder, info = trained_pipeline(f"sdxl-{key}", lambda: make_sdxl(m["size"], seed=0),
                                        {"family": "sdxl", "size": m["size"], "seed": 0}, steps,
                                        resolution=m["resolution"], cache=ctx["trained_cache"])
    return str(folder), {**info, "size": key}


def bench_fidelity(ctx: dict[str, Any], progress: Any) -> dict[str, Any]:
    """The section: train (or reuse) the model, measure it and its untrained weights, judge the trained one."""
    folder, info = fidelity_model(ctx, progress)
    out: dict[str, Any] = {"image": ctx["fid_side"], "steps": ctx["fid_steps"], "seeds": ctx["fid_seeds"],
                           "trained": info, "models": {}}
    for label, where in (("trained", folder), ("random weights", info["untrained"])):
        out["models"][label] = measure_model(where, ctx, progress, label)
    t = out["models"]["trained"]
    out["naive_dtype"] = t["naive_dtype"]
    # Judged on the image (what a user sees); the denoiser's own error is reported beside it: the recipe differs from
    # the naive cast there only by its fp32 islands, so the two are equal up to noise.
    med = lambda name: t[name]["image"]["rel_l2"]["median"]  # noqa: E731
    if "recipe" in t["errors"] or med("recipe") is None:
        out["pass"] = False
    elif med("naive") is None:
        out["pass"] = True
    else:
        out["pass"] = med("recipe") <= med("naive") and all(
            t["recipe"][k]["nonfinite"] <= t["naive"][k]["nonfinite"] for k in KINDS)
    return out
