"""The embedded demo: tiny SDXL and SVD pipelines with random weights, saved, loaded back through
``load_pipeline`` with the recipe for this machine, run, checked and compared with an fp32 reference."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any

__all__ = ["run_demo", "difference"]

BANNER = ("hf_precision demo: the weights are RANDOM (built from configs on this machine, nothing downloaded), "
          "so the pictures are noise; what the demo shows is the machinery: per-component dtypes, fp32 islands, "
          "boundary casts, and how far the recipe's output is from an all-fp32 run.")


def difference(a: Any, b: Any) -> dict[str, float]:
    """Max and mean absolute difference of two image/frame arrays, and their non-finite counts."""
    import numpy as np

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    diff = np.abs(a - b)
    return {"max_abs": float(np.nanmax(diff)), "mean_abs": float(np.nanmean(diff)),
            "nonfinite": int((~np.isfinite(a)).sum())}


def _save_png(array: Any, path: Path) -> None:
    import numpy as np
    from PIL import Image

    tmp = path.with_suffix(".tmp.png")
    Image.fromarray((np.clip(array, 0, 1) * 255).round().astype("uint8")).resize((256, 256), Image.NEAREST).save(tmp)
    os.replace(tmp, path)


def _save_gif(frames: Any, path: Path, fps: int = 4) -> None:
    import numpy as np
    from PIL import Image

    images = [Image.fromarray((np.clip(f, 0, 1) * 255).round().astype("uint8")).resize((256, 256), Image.NEAREST)
              for f in frames]
    tmp = path.with_suffix(".tmp.gif")
    images[0].save(tmp, save_all=True, append_images=images[1:], duration=int(1000 / fps), loop=0)
    os.replace(tmp, path)


def run_demo(out: str | Path = "demo_output", device: str | None = None, layout: str | None = None,
             seed: int = 0, quiet_progress: bool = True) -> dict[str, Any]:
    """Run the demo; returns what it measured (also printed).

    Args:
        out: folder for ``sdxl.png``, ``svd.gif`` and the saved pipelines' plan/check reports.
        device: where to run (default: the best present device).
        layout: run the layout another device would use (``"t4"``, ``"a100"`` ...) on this one; default: this
            machine's own recipe.

    Example:
        >>> result = run_demo(tempfile.mkdtemp())  # doctest: +SKIP
        >>> result["sdxl"]["nonfinite"]  # doctest: +SKIP
        0
    """
    import torch
    from diffusers.utils import logging as dlogging

    from . import synthetic
    from .checker import check
    from .devices import device_profile
    from .load import load_pipeline
    from .planner import plan
    from .recipe import get_recipe

    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()  # loading/saving bars; the demo prints its own report
    from transformers.utils import logging as tlogging

    tlogging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    place = device or device_profile(None).torch_device()
    layout_device = layout or place
    print(BANNER)
    print(f"running on {device_profile(place).label()}; layout: {device_profile(layout_device).label()}\n")
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as work:
        for kind, filename in (("sdxl", "sdxl.png"), ("svd", "svd.gif")):
            start = time.perf_counter()
            reference_pipe = synthetic.make_pipeline(kind, seed=seed)
            folder = synthetic.save_pipeline(reference_pipe, Path(work) / kind)
            kwargs = synthetic.example_call_kwargs(kind)
            if kind == "sdxl":
                kwargs.update(height=64, width=64, num_inference_steps=4)
            else:
                kwargs.update(num_frames=4, num_inference_steps=3)
            recipe = get_recipe(kind, device=layout_device)
            print(f"=== {kind}: plan (meta device, from the saved configs) ===")
            print(plan(folder, device=layout_device).table())
            pipe = load_pipeline(folder, place, recipe=recipe)
            if quiet_progress:
                pipe.set_progress_bar_config(disable=True)
                reference_pipe.set_progress_bar_config(disable=True)
            print(f"\n=== {kind}: loaded through load_pipeline ===")
            print(pipe._hf_precision_applied.report())
            got = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed))
            want = reference_pipe.to(place)(**kwargs, generator=torch.Generator("cpu").manual_seed(seed))
            report = check(pipe)
            print(f"\n=== {kind}: check (one tiny forward pass with recording hooks) ===")
            print(report.table())
            if kind == "sdxl":
                stats = difference(got.images, want.images)
                _save_png(got.images[0], out / filename)
            else:
                stats = difference(got.frames, want.frames)
                _save_gif(got.frames[0], out / filename)
            stats.update(seconds=round(time.perf_counter() - start, 2), check_ok=report.ok,
                         dtypes={p.name: p.compute for p in recipe.plans}, output=str(out / filename))
            results[kind] = stats
            print(f"\n{kind}: max |recipe - fp32| = {stats['max_abs']:.4g}, mean = {stats['mean_abs']:.4g} "
                  f"(pixel values in [0, 1]), non-finite values: {stats['nonfinite']}, wrote {out / filename} "
                  f"({stats['seconds']} s)\n")
    print("summary: " + "; ".join(f"{k}: max diff {v['max_abs']:.3g}, check {'ok' if v['check_ok'] else 'PROBLEMS'}"
                                   for k, v in results.items()))
    return results
