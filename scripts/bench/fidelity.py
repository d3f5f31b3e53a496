"""Final image of the recipe layout and of a naive ``pipe.to(half)`` against an fp32 reference of the same weights.

On random weights the denoiser is chaotic (small differences grow over the steps): the errors compare layouts
with each other on the same weights, they are not a quality figure for a trained model.
"""

from __future__ import annotations

import copy
import gc
from typing import Any

from .common import stats


def bench_fidelity(ctx: dict[str, Any], pipes: dict[str, Any], progress: Any) -> dict[str, Any]:
    import numpy as np
    import torch

    import hf_precision as hp
    from hf_precision import dtypes as hdt

    record = hp.applied(pipes["recipe"])
    half = hdt.to_torch(record.recipe["unet"].compute)
    if half == torch.float32:
        half = torch.bfloat16
    naive = copy.deepcopy(pipes["fp32"]).to(half)
    vae_factor = 2 ** (len(pipes["fp32"].vae.config.block_out_channels) - 1)
    side = vae_factor * ctx["fid_latent"]
    kwargs = {"prompt": "a photo of a cat", "negative_prompt": "blurry", "height": side, "width": side,
              "num_inference_steps": ctx["fid_steps"], "guidance_scale": 5.0, "output_type": "np"}
    per = {n: {"max": [], "mean": [], "nonfinite": 0} for n in ("recipe", "naive")}
    errors: dict[str, str] = {}
    for seed in range(ctx["fid_seeds"]):
        images = {}
        for name, p in (("fp32", pipes["fp32"]), ("recipe", pipes["recipe"]), ("naive", naive)):
            with progress.step("image", f"fidelity: {name} image, seed {seed}"):
                try:
                    with torch.inference_mode():
                        img = p(**kwargs, generator=torch.Generator("cpu").manual_seed(seed)).images
                    images[name] = np.asarray(img, dtype=np.float64)
                except Exception as err:  # a layout that cannot run is reported, never hidden
                    errors[name] = f"{type(err).__name__}: {err}"
        ref = images.get("fp32")
        if ref is None:
            break
        for name in ("recipe", "naive"):
            if name in images:
                img = images[name]
                diff = np.abs(np.nan_to_num(img, nan=np.inf) - ref)
                per[name]["max"].append(float(diff.max()))
                per[name]["mean"].append(float(diff[np.isfinite(diff)].mean()) if np.isfinite(diff).any() else float("inf"))
                per[name]["nonfinite"] += int((~np.isfinite(img)).sum())
    out: dict[str, Any] = {"image": side, "steps": ctx["fid_steps"], "seeds": ctx["fid_seeds"],
                           "naive_dtype": hdt.from_torch(half), "errors": errors,
                           "note": "random weights: chaotic, compares layouts on the same weights only"}
    for name, r in per.items():
        out[name] = {"max_abs": stats(r["max"]), "mean_abs": stats(r["mean"]), "nonfinite": r["nonfinite"]}
    if "recipe" in errors or not per["recipe"]["mean"]:
        out["pass"] = False
    elif not per["naive"]["mean"]:
        out["pass"] = True
    else:
        out["pass"] = (out["recipe"]["mean_abs"]["median"] <= out["naive"]["mean_abs"]["median"]
                       and out["recipe"]["nonfinite"] <= out["naive"]["nonfinite"])
    del naive
    gc.collect()
    return out
