"""Robustness sweep of calibrate: plant an fp16 overflow in one module of many tiny pipelines, calibrate, record.

Usage: python benchmarks/calibrate_sweep.py [family ...] [--json FILE]

For every family (UNet, DiT and video pipelines of ``hf_precision.testing``) and every module category that the
family has (attention q/k, attention v/out, feed-forward, norm, conv_in/conv_out, time embedding, text-encoder
layers, VAE encoder/decoder blocks), a fresh pipeline gets :func:`hf_precision.testing.calibration.plant_overflow`
on the first matching module, then ``calibrate(pipe, "t4")``. A case counts when the float32 run is finite and the
all-fp16 run is not; it passes when the islands make the fp16 run finite with fewer extra bytes than keeping each
affected component whole in float32. The numbers are in docs/calibrate.md ("Robustness sweep").
"""

from __future__ import annotations

import json
import re
import sys
import time
import traceback
import warnings

import torch

# (category, component pattern, module-name regex): the first match in each component is planted.
CATEGORIES = (
    ("attn q/k", r"(unet|transformer|prior|decoder)", r"(.*\.)?(attn1?|attn_1|attention)\.to_q"),
    ("attn v/out", r"(unet|transformer|prior|decoder)", r"(.*\.)?(attn1?|attn_1|attention)\.to_v"),
    ("cross-attn v/out", r"(unet|transformer)", r"(.*\.)?(attn2|cross_attn|attn_2)\.to_v"),
    ("feed-forward", r"(unet|transformer|prior|decoder)", r"(.*\.)?(ff|ffn|feed_forward|mlp)\.(net\.0\.proj|fc1|w1|proj_in|linear_1)"),
    ("norm", r"(unet|transformer|prior|decoder)", r"(.*\.)?(norm1|norm2|norm|ln_1|norm1\.norm)"),
    ("conv_in", r"(unet|transformer)", r"(conv_in|x_embedder|pos_embed\.proj|patch_embed\.proj|proj_in|img_in|embedding\.proj|x_embedder\.proj)"),
    ("conv_out", r"(unet|transformer)", r"(conv_out|proj_out|norm_out\.linear)"),
    ("time embedding", r"(unet|transformer)", r"(.*\.)?(time_embedding|timestep_embedder|time_embedder|t_embedder|time_proj_mlp)\.linear_1"),
    ("text enc attn", r"text_encoder(_\d)?", r".*(layers?|block)\.0\..*(q_proj|\.q|to_q)"),
    ("text enc mlp", r"text_encoder(_\d)?", r".*(layers?|block)\.0\..*(fc1|wi_0|wi|gate_proj|up_proj|dense_h_to_4h|w1|intermediate\.dense)"),
    ("vae decoder", r"vae|movq", r"decoder\.(up_blocks|mid_block)\.0\..*conv1"),
    ("vae decoder conv_in", r"vae|movq", r"decoder\.conv_in(\.conv)?"),
    ("vae encoder", r"vae|movq", r"encoder\.(down_blocks|mid_block)\.0\..*conv1"),
)


def families():
    from hf_precision.testing import PIPELINES

    names = ("sd15", "sdxl", "pixart", "dit", "svd", "sd3", "flux", "pixart_sigma", "sana", "auraflow", "lumina2",
             "hunyuandit", "qwenimage", "kandinsky3", "animatediff", "i2vgenxl", "cascade_prior", "wan", "ltx",
             "cogvideox", "hunyuan_video", "mochi", "allegro", "latte")
    return {name: (PIPELINES[name].make, PIPELINES[name].call_kwargs) for name in names}


def cases(pipe):
    found = []
    for comp, m in pipe.components.items():
        if not isinstance(m, torch.nn.Module):
            continue
        names = [n for n, mod in m.named_modules() if n and isinstance(getattr(mod, "weight", None), torch.nn.Parameter)]
        for cat, comp_re, mod_re in CATEGORIES:
            if not re.fullmatch(comp_re, comp):
                continue
            hit = next((n for n in names if re.fullmatch(mod_re, n)), None)
            if hit:
                found.append((cat, comp, hit))
    return found


def one(fam, build, kwargs, cat, comp, name):
    import hf_precision as hp
    from hf_precision.testing.calibration import plant_overflow

    pipe = build()
    # PixArt-Alpha: 1 step is DMD only; Mochi: its linear-quadratic schedule divides by zero at 1 step
    call = {**kwargs(), "num_inference_steps": 2 if fam in ("pixart", "mochi") else 1}
    run = lambda: pipe(**call, generator=torch.Generator().manual_seed(0))
    try:
        planted = plant_overflow(pipe, comp, name, run)
    except ValueError as err:
        return {"status": "not planted", "detail": str(err)}
    start = time.perf_counter()
    try:
        r = hp.calibrate(pipe, "t4", call, progress=False, run_on="cpu")
    except hp.RecipeError as err:
        return {"status": "reference not finite" if "itself not finite" in str(err) else "error",
                "detail": str(err)[:300], "planted": planted}
    row = {"planted": planted, "naive_finite": r.errors["naive"].finite, "finite": r.finite,
           "islands": r.islands, "whole": r.whole, "extra_bytes": r.extra_bytes,
           "whole_bytes": r.whole_component_bytes(), "mean_abs": r.errors["islands"].mean_abs,
           "naive_first": r.errors["naive"].first_nonfinite, "notes": [n for n in r.notes if "NOT kept" not in n
                                                                       and "not needed" not in n][:4],
           "seconds": round(time.perf_counter() - start, 1)}
    if r.errors["naive"].finite:
        row["status"] = "plant did not overflow fp16"
    elif planted["spread"] and r.finite:
        row["status"] = "spread: finite"  # the float32 run leaves the range outside the planted module too
    elif r.finite and r.extra_bytes < row["whole_bytes"]:
        row["status"] = "pass"
    elif r.finite:
        row["status"] = "finite, not cheaper than whole"
    else:
        row["status"] = "FAIL: not finite"
    return row


def main(argv):
    warnings.simplefilter("ignore")
    out_json = None
    if "--json" in argv:
        i = argv.index("--json")
        out_json = argv[i + 1]
        argv = argv[:i] + argv[i + 2:]
    fams = families()
    chosen = argv or list(fams)
    rows = []
    for fam in chosen:
        build, kwargs = fams[fam]
        try:
            todo = cases(build())
        except Exception as err:  # noqa: BLE001 - a sweep records what broke and goes on
            print(f"{fam}: cannot build: {err}")
            continue
        for cat, comp, name in todo:
            try:
                row = one(fam, build, kwargs, cat, comp, name)
            except Exception as err:  # noqa: BLE001
                row = {"status": "error", "detail": f"{type(err).__name__}: {err}"[:300],
                       "trace": traceback.format_exc()[-1500:]}
            row.update(family=fam, category=cat, component=comp, module=name)
            rows.append(row)
            isl = row.get("islands", {})
            extra = f"+{row['extra_bytes']} B vs whole {row['whole_bytes']} B" if "extra_bytes" in row else row.get("detail", "")
            print(f"{row['status']:<30} {fam:<14} {cat:<18} {comp}.{name}: {isl or row.get('whole', '')} {extra}",
                  flush=True)
    counted = [r for r in rows if r["status"] in ("pass", "finite, not cheaper than whole", "FAIL: not finite")
               and not r["planted"]["spread"]]
    passed = [r for r in counted if r["status"] == "pass"]
    print(f"\n{len(rows)} cases, {len(counted)} local planted overflows (fp32 finite, fp16 not), {len(passed)} pass; "
          + ", ".join(f"{s}: {sum(r['status'] == s for r in rows)}" for s in sorted({r['status'] for r in rows})))
    if out_json:
        with open(out_json, "w") as f:
            json.dump(rows, f, indent=1, default=str)


if __name__ == "__main__":
    main(sys.argv[1:])
