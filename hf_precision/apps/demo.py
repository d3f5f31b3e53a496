"""The embedded demo, in five parts, offline and on any machine:

1. the classic failure: a tiny SDXL with the layout a T4 user picks (fp16 UNet and VAE, fp32 text encoders) raises
   in plain diffusers; ``explain`` says where and why; ``load_pipeline`` with the T4 recipe runs the same folder;
2. what the recipes save on the real SDXL and SVD configs (meta device, no weights) for a T4 and an A100;
3. the NaN guard catching a VAE whose activations really overflow fp16, with the override that makes it stick;
4. this machine's own recipe on a small SDXL (the shipped shapes model) and a tiny SVD: plan, check, image and clip,
   difference from an fp32 run;
5. pictures: the shapes model in fp32, in the recipe's layout, and its fp32 latents decoded by the VAE cast to float16
   (it overflows), side by side in one labelled PNG (``demo_pictures``).
"""

from __future__ import annotations

import collections
import json
import re
import tempfile
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

from .demo_pictures import SHAPES_CALL, difference, draw_pictures, one_call_difference, save_gif, save_png
from .outputs import written_atomically
from ..units import format_bytes
from .. import dtypes as dt

__all__ = ["run_demo", "difference", "why_float32", "PICTURE_CALLS"]

# Part 4's calls (SVD's over the tiny model's example kwargs): what sizes its pictures have (the README quotes them).
PICTURE_CALLS: dict[str, dict[str, Any]] = {"sdxl": {"prompt": "a red square", **SHAPES_CALL},
                                            "svd": {"num_frames": 4, "num_inference_steps": 3}}

BANNER = ("hf_precision demo, offline: parts 1 and 3 and the SVD clip of part 4 use RANDOM weights (built from configs "
          "on this machine), so what they show is the machinery: per-component dtypes, fp32 islands, boundary casts; "
          "the SDXL of parts 4 and 5 is a small model shipped with hf_precision, trained on coloured shapes, so its "
          "pictures can be judged: fp32, the recipe's layout and a float16 VAE decode side by side.")
# The layout people pick on a T4 after reading "the SDXL VAE needs fp16-fix, text encoders are small": fp16 where
# the bytes are, fp32 for the rest. Plain diffusers then hands fp32 activations to the fp16 UNet.
T4_USER_LAYOUT = {"unet": "float16", "vae": "float16", "default": "float32"}
PLAN_MODELS, PLAN_DEVICES = ("sdxl", "svd"), ("t4", "a100")


def why_float32(device: Any = None) -> str | None:
    """Why a device's recipes compute in float32 everywhere, quoting the ``devices.yaml`` rules that hold and, for a CPU,
    the flags it lacks that a preset picking half precision has; ``None`` where a half dtype is picked.

    Example:
        >>> why_float32("t4") is None
        True
        >>> "amx_bf16" in why_float32("cpu-avx512")
        True
    """
    from ..recipe.devices import device_caps, list_presets
    from ..dtypes import HALF

    caps = device_caps(device)
    if HALF & set(caps.auto):
        return None
    profile = caps.profile
    rules = " ".join(f"Rule {tag}: {caps.why[tag].rstrip('.')}." for tag in caps.tags if caps.why.get(tag))
    text = f"on {profile.label()} the device rules pick no half-precision dtype unasked, so recipes run float32. {rules}"
    best = None
    for name, preset in list_presets().items():
        other = device_caps(preset)
        if preset.type != profile.type or not HALF & set(other.auto):
            continue
        missing = sorted(preset.cpu_flags - profile.cpu_flags)
        if profile.type == "cpu" and missing and (best is None or len(missing) < len(best[1])):
            best = (name, missing, [t for t in other.tags if t not in caps.tags], other)
    if best is not None:
        name, missing, adds, other = best
        needs = "; ".join(f"rule {t}: {other.why[t].rstrip('.')}" for t in adds if other.why.get(t))
        text += (f" This CPU has no fast half-precision unit: it lacks {', '.join(missing)}, which the rule that picks "
                 f"half precision on a CPU needs ({needs}). See that layout here with `hf-precision demo --layout {name}`.")
    return text


# --------------------------------------------------------------------------------------------- output


def _say(text: str = "", indent: str = "") -> None:
    if not text:
        print()
    for line in text.splitlines() or [""]:
        print(textwrap.fill(line, width=116, initial_indent=indent, subsequent_indent=indent + "  ",
                            break_long_words=False, break_on_hyphens=False) if line else "")


def _heading(text: str) -> None:
    print(f"\n{'=' * 8} {text} {'=' * max(4, 100 - len(text))}")


def _ran_in(pipe: Any) -> dict[str, str]:
    """Per component, the dtypes its parameters hold now, after the run: ``"float16, float32 in 5.2% of parameters"``
    (a minority float32 share inside a half-precision component is its fp32 islands)."""
    import torch

    out = {}
    for name, module in pipe.components.items():
        if not isinstance(module, torch.nn.Module):
            continue
        counts: collections.Counter[str] = collections.Counter()
        for p in module.parameters():
            counts[dt.from_torch(p.dtype)] += p.numel()
        total = sum(counts.values()) or 1
        ranked = counts.most_common() or [("no parameters", 0)]
        out[name] = ", ".join([ranked[0][0], *(f"{d} in {100 * n / total:.1f}% of parameters" for d, n in ranked[1:])])
    return out


# --------------------------------------------------------------------------------------------- 1. classic failure


def _classic_failure(work: Path, place: str, seed: int) -> dict[str, Any]:
    import numpy as np
    import torch
    from diffusers import DiffusionPipeline

    from .. import testing as synthetic
    from ..runtime.load import load_pipeline
    from ..diagnose.mismatch import MismatchError, explain
    from ..runtime import applied

    _heading("1. the classic failure: plain diffusers with the layout a T4 user picks")
    folder = synthetic.save_pipeline(synthetic.make_pipeline("sdxl", size="tiny", seed=seed), work / "sdxl-tiny")
    kwargs = synthetic.example_call_kwargs("sdxl")
    layout = {k: getattr(torch, v) for k, v in T4_USER_LAYOUT.items()}
    shown = ", ".join(f'"{k}": torch.{v}' for k, v in T4_USER_LAYOUT.items())
    _say(f"pipe = DiffusionPipeline.from_pretrained(folder, dtype={{{shown}}}).to({place!r})")
    pipe = DiffusionPipeline.from_pretrained(str(folder), dtype=layout).to(place)
    pipe.set_progress_bar_config(disable=True)
    result: dict[str, Any] = {"layout": dict(T4_USER_LAYOUT), "error": None, "explained": None, "module": None}
    # One run: explain()'s hooks only watch which module executes; torch's own error is the MismatchError's cause.
    try:
        with explain(pipe):
            pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed))
        _say("plain diffusers ran this layout without an error (this diffusers version casts it itself)")
    except MismatchError as err:
        original = err.__cause__ or err.original
        result.update(error=f"{type(original).__name__}: {original}", explained=str(err), module=err.module,
                      fix=err.fix)
        _say(f"plain diffusers raises:  {result['error']}")
        _say("\nwith hp.explain(pipe): pipe(...)   -> hf_precision.MismatchError:")
        _say(str(err), indent="  ")
    except RuntimeError as err:  # a wording explain() does not know yet: still show torch's error
        result["error"] = f"{type(err).__name__}: {err}"
        _say(f"plain diffusers raises:  {result['error']}\n(explain() does not recognise this wording)")
    del pipe

    _say(f'\nthe same folder through hp.load_pipeline(folder, "{place}", layout="t4"): '
         f"the T4 layout placed on {place}")
    fixed = load_pipeline(folder, place, layout="t4")
    recipe = applied(fixed).recipe
    fixed.set_progress_bar_config(disable=True)
    image = np.asarray(fixed(**kwargs, generator=torch.Generator("cpu").manual_seed(seed)).images, dtype=np.float64)
    finite = bool(np.isfinite(image).all())
    ran_in = _ran_in(fixed)
    result["loader"] = {"recipe": recipe.device.label(), "dtypes": ran_in, "finite": finite,
                        "nonfinite": int((~np.isfinite(image)).sum()), "min": float(np.nanmin(image)),
                        "max": float(np.nanmax(image)), "shape": list(image.shape)}
    _say(f"it runs: image {image.shape[1]}x{image.shape[2]}, "
         f"{'all values finite' if finite else str(result['loader']['nonfinite']) + ' NON-FINITE values'} "
         f"(min {result['loader']['min']:.3f}, max {result['loader']['max']:.3f}); it ran in:")
    for name, dtypes in ran_in.items():
        islands = recipe[name].keep_fp32 if name in recipe else ()
        _say(f"{name}: {dtypes}" + (f" (the fp32 islands {', '.join(islands)})" if islands else ""), indent="  ")
    return result


# --------------------------------------------------------------------------------------------- 2. real plans


def _real_plans() -> list[dict[str, Any]]:
    from ..diagnose.planner import plan

    _heading("2. what the recipe buys on the real models (shipped configs, meta device, no weights)")
    rows, whys = [], {}
    for model in PLAN_MODELS:
        for device in PLAN_DEVICES:
            p = plan(model, device=device)
            params = sum(c.params for c in p.components.values())
            fp32 = p.fp32_bytes  # the baseline: every parameter and buffer in float32, plain from_pretrained
            stays = {}
            for c in p.components.values():
                why = " ".join((p.recipe[c.name].why or "kept float32 by the recipe").split())
                if c.compute == "float32" and c.storage == "float32":
                    stays[c.name] = (c.params, why)
                elif c.islands:
                    stays[", ".join(f"{c.name}.{i.module}" for i in c.islands)] = (c.island_params, why)
            rows.append({"model": model, "device": device, "label": p.recipe.device.label(), "params": params,
                         "total_bytes": p.total_bytes, "fp32_bytes": fp32, "saved_bytes": fp32 - p.total_bytes,
                         "compute": {c.name: c.compute for c in p.components.values()},
                         "stays_fp32": {k: {"params": n, "why": w} for k, (n, w) in stays.items()}})
            for what, (n, why) in stays.items():
                whys.setdefault(why, []).append((f"{model}/{device}", what, n))
    head = ("model", "device", "parameters", "all-fp32", "with recipe", "saved", "compute dtypes")
    table = [head] + [(r["model"], r["label"], f"{r['params']:,}", format_bytes(r["fp32_bytes"]), format_bytes(r["total_bytes"]),
                       f"{format_bytes(r['saved_bytes'])} ({100 * r['saved_bytes'] / r['fp32_bytes']:.0f}%)",
                       ", ".join(f"{k} {v}" for k, v in r["compute"].items())) for r in rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(head))]
    for i, r in enumerate(table):
        print("  ".join(c.rjust(w) if 2 <= j <= 5 else c.ljust(w) for j, (c, w) in enumerate(zip(r, widths))).rstrip())
        if i == 0:
            print("  ".join("-" * w for w in widths))
    _say("(all-fp32 = parameters and buffers in float32, what plain from_pretrained without a dtype loads; "
         "activations come on top)")
    _say("\nwhat stays float32, and why:")
    for why, where in whys.items():
        seen = {}
        for plan_name, what, n in where:
            seen.setdefault((what, n), []).append(plan_name)
        for (what, n), plans in seen.items():
            _say(f"{what} ({n:,} parameters) in {', '.join(plans)}:", indent="  ")
        _say(why, indent="      ")
    return rows


# --------------------------------------------------------------------------------------------- 3. NaN guard


def _nan_guard(place: str) -> dict[str, Any]:
    import torch

    from ..runtime.apply import apply_recipe
    from ..recipe.resolution import get_recipe
    from ..testing import make_overflowing_vae

    _heading("3. the NaN guard: a VAE whose activations really overflow float16")
    vae, latents = make_overflowing_vae()
    vae, latents = vae.to(place), latents.to(place)
    with torch.no_grad():
        peak = float(vae.decoder.conv_in(vae.post_quant_conv(latents)).abs().max())
        reference = vae.decode(latents).sample
    _say(f"tiny AutoencoderKL with decoder.conv_in scaled: its output reaches {peak:.3g} (float16 max: "
         f"{torch.finfo(torch.float16).max:.0f}); the float32 decode is "
         f"{'finite' if torch.isfinite(reference).all() else 'NOT finite'}")
    guarded = get_recipe("vae.fp16_fix", device="t4")
    _say(f"recipe vae.fp16_fix for {guarded.device.label()}: vae computes in {guarded['vae'].compute}, "
         f"NaN guard {'on' if guarded['vae'].nan_guard else 'off'}")

    plain = make_overflowing_vae()[0].to(place)
    apply_recipe(plain, get_recipe("vae.fp16_fix", device="t4", overrides={"vae": {"nan_guard": False}}), device=place)
    with torch.no_grad():
        bad = plain.decode(latents).sample
    unguarded = int((~torch.isfinite(bad)).sum())
    _say(f"without the guard (--set vae.nan_guard=false): {unguarded:,} of {bad.numel():,} output values are inf/NaN")

    apply_recipe(vae, guarded, device=place)
    with warnings.catch_warnings(record=True) as caught, torch.no_grad():
        warnings.simplefilter("always")
        image = vae.decode(latents).sample
    notes = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning) and "hf_precision" in str(w.message)]
    nonfinite = int((~torch.isfinite(image)).sum())
    after = dt.from_torch(vae.decoder.conv_in.weight.dtype)
    override = next(iter(re.findall(r"--set \S+", " ".join(notes))), None)
    result = {"peak_activation": peak, "unguarded_nonfinite": unguarded, "values": bad.numel(), "warning": notes,
              "guarded_nonfinite": nonfinite, "dtype_after": after, "override": override,
              "max_abs_vs_fp32": float((image.float() - reference).abs().max())}
    _say("with the guard:")
    for note in notes or ["(no warning: the guard did not fire)"]:
        _say(f"warning: {note}", indent="  ")
    _say(f"the output is {'finite' if nonfinite == 0 else str(nonfinite) + ' NON-FINITE values'} "
         f"(max |guarded - float32 decode| = {result['max_abs_vs_fp32']:.3g}); the VAE now computes in {after} for "
         f"this session.")
    if override:
        _say(f"make it permanent: {override}  (or in an overrides YAML, or load_pipeline(..., overrides=...))")
    return result


# --------------------------------------------------------------------------------------------- 4. this machine


def _this_machine(work: Path, out: Path, place: str, layout_device: str, seed: int,
                  quiet_progress: bool) -> dict[str, Any]:
    import torch
    from diffusers import DiffusionPipeline

    from .. import testing as synthetic
    from .shapes_model import shipped_folder
    from ..diagnose.checker import check
    from ..recipe.devices import device_profile
    from ..runtime import applied
    from ..runtime.load import load_pipeline
    from ..diagnose.planner import plan

    _heading(f"4. the recipe of {device_profile(layout_device).label()} on a small SDXL and a tiny SVD, run on {place}")
    full = why_float32(layout_device)
    if full:
        _say(f"why this part saves nothing and matches fp32 exactly: {full} Nothing to save here; the real-model plans "
             f"in part 2 show the saving on GPUs.")
    results: dict[str, Any] = {"why_float32": full}
    # per model: the file it writes, the output field that holds its pictures, and how they are saved
    models = (("sdxl", "sdxl.png", "images", save_png), ("svd", "svd.gif", "frames", save_gif))
    for kind, filename, field, save in models:
        start = time.perf_counter()
        if kind == "sdxl":  # the shipped shapes model: a picture a person can judge
            folder = shipped_folder()
            reference_pipe = DiffusionPipeline.from_pretrained(str(folder), dtype=torch.float32, use_safetensors=True)
            kwargs = dict(PICTURE_CALLS[kind])
        else:  # random weights: the clip is noise, what counts is the machinery
            reference_pipe = synthetic.make_pipeline(kind, seed=seed)
            folder = synthetic.save_pipeline(reference_pipe, work / kind)
            kwargs = {**synthetic.example_call_kwargs(kind), **PICTURE_CALLS[kind]}
        print(f"\n--- {kind}: plan (meta device, from the saved configs) ---")
        planned = plan(folder, device=layout_device)
        table = planned.table()
        print(table.split("\n\nbytes by dtype:")[0])
        if planned.total_bytes == planned.fp32_bytes and full:
            _say("(saves 0 B: every component computes in float32 on this device; why: see above)")
        pipe = load_pipeline(folder, place, layout=layout_device)
        recipe = applied(pipe).recipe
        if quiet_progress:
            pipe.set_progress_bar_config(disable=True)
            reference_pipe.set_progress_bar_config(disable=True)
        print(f"\n--- {kind}: loaded through load_pipeline ---")
        print(applied(pipe).report())
        got = pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed))
        reference_pipe.to(place)
        want = reference_pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed))
        # For scale: how far two different pictures are (the fp32 run with the next seed). A recipe run should be
        # the same picture as its fp32 reference, i.e. much closer to it than to another sample.
        other = reference_pipe(**kwargs, generator=torch.Generator("cpu").manual_seed(seed + 1))
        report = check(pipe)
        print(f"\n--- {kind}: check (one tiny forward pass with recording hooks) ---")
        print(report.table())
        stats = difference(getattr(got, field), getattr(want, field))
        seeds = difference(getattr(other, field), getattr(want, field))
        stats.update(one_call_difference(pipe, reference_pipe, kwargs, seed))
        size_note = save(getattr(got, field)[0], out / filename)
        stats.update(seconds=round(time.perf_counter() - start, 2), check_ok=report.ok,
                     dtypes={p.name: p.compute for p in recipe.policies}, output=str(out / filename),
                     saved_bytes=planned.fp32_bytes - planned.total_bytes, other_seed_mean_abs=seeds["mean_abs"],
                     other_seed_max_abs=seeds["max_abs"])
        results[kind] = stats
        _say(f"\n{kind}: max |recipe - fp32| = {stats['max_abs']:.4g}, mean = {stats['mean_abs']:.4g} (pixel values "
             f"in [0, 1]; for scale, the fp32 runs with seeds {seed} and {seed + 1} differ by mean "
             f"{seeds['mean_abs']:.3g}, max {seeds['max_abs']:.3g}), non-finite values: {stats['nonfinite']}, "
             f"wrote {out / filename} ({size_note}; {stats['seconds']} s)")
        _say(f"one {'UNet' if hasattr(pipe, 'unet') else 'denoiser'} call on the same inputs: relative L2 "
             f"{stats['call_rel_l2']:.3g} from fp32 (the next seed's inputs: {stats['call_other_seed_rel_l2']:.3g}); "
             f"the picture adds the steps, where random tiny weights amplify rounding")
        if full and stats["max_abs"] < 1e-4:
            _say(f"(difference {stats['max_abs']:.2g}: every component computes in float32 here, like the reference; "
                 "what is left is float32 rounding: the loaded weights are memory-mapped from the saved files, and "
                 "the kernels may sum in another order; why float32: see above)")
        elif stats["max_abs"] == 0:
            _say("(difference 0: the recipe's half-precision steps rounded to the same pixels)")
    return results


# --------------------------------------------------------------------------------------------- entry point


def _places(device: str | None, layout: str | None) -> tuple[str, str]:
    from ..recipe.devices import device_profile
    from ..errors import RecipeError

    profile = device_profile(device)
    if profile.present:
        place = profile.torch_device()
    elif profile.type == "cpu":
        place = "cpu"  # a described CPU (cpu:amx, cpu-amx): its layout, computed on this CPU
    else:
        raise RecipeError(f"demo: --device {device!r} describes a device this machine does not have; to run its "
                          f"layout here, use --layout {device}")
    return place, layout or device or place


def run_demo(out: str | Path = "demo_output", device: str | None = None, layout: str | None = None,
             seed: int = 0, quiet_progress: bool = True) -> dict[str, Any]:
    """Run the demo; returns what it measured (also printed, and written to ``out/report.json``).

    ``out`` gets ``shapes.png`` (part 5's grid), ``sdxl.png``, ``svd.gif`` and ``report.json``. ``device``: where to
    run (a described CPU such as ``cpu-amx`` runs that CPU's layout here); ``layout``: another device's layout for parts
    4 and 5 (default this machine's; part 5 shows the T4's where it has no half dtype); ``seed``: weights and
    generators. The result has ``plain_diffusers``, ``plans``, ``nan_guard``, ``machine`` (``sdxl``, ``svd``),
    ``pictures`` and ``ok`` (False when an output was not finite or a check found problems).

    Example:
        >>> result = run_demo(tempfile.mkdtemp())  # doctest: +SKIP
        >>> result["machine"]["sdxl"]["nonfinite"], result["nan_guard"]["guarded_nonfinite"]  # doctest: +SKIP
        (0, 0)
    """
    import torch
    from diffusers.utils import logging as dlogging
    from transformers.utils import logging as tlogging

    from ..recipe.devices import device_profile

    dlogging.set_verbosity_error()
    dlogging.disable_progress_bar()  # loading/saving bars; the demo prints its own report
    tlogging.set_verbosity_error()
    tlogging.disable_progress_bar()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    place, layout_device = _places(device, layout)
    _say(BANNER)
    _say(f"running on {device_profile(place).label()}; part 4 layout: {device_profile(layout_device).label()}")
    start = time.perf_counter()
    # The tiny models' ops are too small to split across threads: a second intra-op thread only adds its spin-wait,
    # which on a busy 2-core machine tripled the demo's wall time (148 s against 46 s with one thread).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory() as tmp, warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=FutureWarning)  # deprecation notes, not the demo's story
            work = Path(tmp)
            results: dict[str, Any] = {"plain_diffusers": _classic_failure(work, place, seed)}
            results["plans"] = _real_plans()
            results["nan_guard"] = _nan_guard(place)
            results["machine"] = _this_machine(work, out, place, layout_device, seed, quiet_progress)
            _heading("5. pictures: the shapes model in fp32, in the recipe's layout, and with its VAE cast to float16")
            results["pictures"] = draw_pictures(out, place, layout_device, seed, say=_say)
    finally:
        torch.set_num_threads(threads)
    machine = [results["machine"][k] for k in ("sdxl", "svd")]
    results["ok"] = (results["plain_diffusers"]["loader"]["finite"] and results["nan_guard"]["guarded_nonfinite"] == 0
                     and all(r["nonfinite"] == 0 and r["check_ok"] for r in machine)
                     and results["pictures"]["recipe"]["nonfinite"] == 0)
    results["seconds"] = round(time.perf_counter() - start, 1)
    with written_atomically(out / "report.json") as tmp_report:
        tmp_report.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    _heading("summary")
    saved = [r for r in results["plans"] if r["saved_bytes"] > 0]
    _say(f"plain diffusers: {results['plain_diffusers']['error'] or 'no error'}; hf_precision with the T4 layout: "
         f"{'finite image' if results['plain_diffusers']['loader']['finite'] else 'NON-FINITE image'}")
    _say("real-model plans save " + ", ".join(f"{format_bytes(r['saved_bytes'])} ({r['model']}/{r['device']})" for r in saved))
    guard = results["nan_guard"]
    _say(f"NaN guard: {guard['unguarded_nonfinite']:,} inf/NaN without it, {guard['guarded_nonfinite']} with it "
         f"(fell back to {guard['dtype_after']}; {guard['override'] or 'no override line'})")
    _say(f"part 4 ({device_profile(layout_device).label()}): "
         + "; ".join(f"{k}: max diff {v['max_abs']:.3g}, one call {v['call_rel_l2']:.2g} off fp32, "
                     f"check {'ok' if v['check_ok'] else 'PROBLEMS'}" for k, v in zip(("sdxl", "svd"), machine))
         + (" (float32 everywhere here: see part 4)" if results["machine"]["why_float32"] else ""))
    pictures = results["pictures"]
    named = [c["named"] for c in pictures["colours"]]
    right = {k: sum(c[k] == c["named"] for c in pictures["colours"]) for k in ("fp32", "recipe")}
    _say(f"pictures: recipe {pictures['recipe']['layout']} max diff {pictures['recipe']['max_abs']:.3g} from fp32; "
         f"VAE in float16: {pictures['naive']['nonfinite']:,} non-finite values (black); the colour the caption "
         f"names, inside the shape: {right['fp32']}/{len(named)} rows in fp32, {right['recipe']}/{len(named)} in "
         f"the recipe")
    _say(f"wrote {out / 'shapes.png'} (the pictures side by side), {out / 'sdxl.png'}, {out / 'svd.gif'}, "
         f"{out / 'report.json'} in {results['seconds']} s")
    return results
