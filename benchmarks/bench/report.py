"""The markdown report of one benchmark run (every figure from that run's JSON)."""

from __future__ import annotations

import json
from typing import Any

from .common import LINEAR_SLOPE, TARGETS, fmt, fmt_stats, md_table, stats, verdict


def judged(j: dict[str, Any] | None, unit: str = "%") -> str:
    """The noise beside a judged figure, and what it allows one to say.

    Example:
        >>> judged({"pass": None, "noise": 0.3, "n": 3, "why": "the noise is larger ..."})
        'noise ±30.00% (half the spread, n=3): the noise is larger ...'
    """
    if not j or j.get("noise") is None:
        return (j or {}).get("why", "")
    return f"noise ±{fmt(j['noise'], unit).lstrip('+')} (half the spread, n={j['n']}): {j['why']}"


def judged_verdict(j: dict[str, Any] | None) -> str:
    """PASS / FAIL beyond the noise, or say that the noise cannot decide."""
    ok = (j or {}).get("pass")
    return "**within noise** (no verdict)" if ok is None else verdict(ok)


def header(res: dict[str, Any]) -> list[str]:
    env, cfg, cpu = res["env"], res["config"], res["env"]["cpu"]
    L = [f"# hf_precision benchmark ({cfg['size']} SDXL-shaped pipeline, {cfg['params']['total']:,} parameters)", "",
         f"- Command: `{cfg['command']}`",
         f"- Date: {env['date']}; total wall time {res.get('wall_s', 0):.0f} s "
         f"({res['progress']['steps']} measured steps)",
         f"- CPU: {cpu['model']} ({cpu['logical_cpus']} logical CPUs, {cpu['machine']}); speed flags present: "
         f"{' '.join(cpu['flags']) or '-'}; absent: {' '.join(cpu['absent']) or '-'}; torch CPU capability: "
         f"{env['torch_cpu_capability']}",
         f"- GPU: {env['gpu'] or 'none (not measured: no GPU in this run)'}",
         f"- torch {env['torch']}, diffusers {env['diffusers']}, transformers {env['transformers']}, accelerate "
         f"{env['accelerate']}, Python {env['python']}; torch threads {env['threads']} "
         f"({cfg.get('threads_why', 'torch default')}); device {env['device']}",
         f"- Load average (1, 5, 15 min) at start {env.get('loadavg_start')}, at end {env.get('loadavg_end')} "
         f"(other processes on the machine add noise)"]
    pr = res["probe"]
    ratios = ", ".join(f"{k} {v:.2f}x" if v else f"{k}: cannot compute" for k, v in pr["ratio"].items())
    L.append(f"- Speed probe (a {384}x{384} matmul + a 3x3 conv, time / fp32's time): {ratios}; slow above "
             f"{pr['slow_ratio']}x: {', '.join(k for k, v in pr['slow'].items() if v) or 'none'}")
    L.append(f"- Layout asked: `{cfg['layout']}` ({cfg['layout_label']}): {cfg['asked_layout']}")
    L.append(f"- **{cfg['note'][0].upper() + cfg['note'][1:]}.**")
    if cfg.get("run_layout"):
        L.append(f"- Layout measured in runtime (fidelity computes the layout asked): {cfg['run_layout']}")
    if cfg.get("quick"):
        L.append("- **Smoke run (`--quick`)**: too few repeats to be a measurement; PASS/FAIL here means nothing.")
    L.append("- Figures: median (min – max, n); ratios are taken inside each repeat or pair, then the median.")
    return L + [""]



def _slope_row(label: str, sj: dict[str, Any] | None) -> list[list[str]]:
    """A target row for a log-log slope judged against the spread of repeated calls (``judge_slope``)."""
    if not sj or sj.get("slope") is None:
        return []
    noise = (f"noise ±{sj['noise']:.2f} (from a ±{sj['relative_noise'] * 100:.0f}% spread of repeated calls): "
             if sj.get("noise") is not None else "")
    return [[label, f"{sj['slope']:.2f}; {noise}{sj['why']}", f"≤ {LINEAR_SLOPE}", judged_verdict(sj)]]

def targets(sec: dict[str, Any]) -> list[list[str]]:
    rows = []
    ld, rt, ap, fid = (sec.get(k, {}) for k in ("load", "runtime", "apply", "fidelity"))
    if "recipe" in ld:
        rows.append(["Load: load_pipeline peak RSS above baseline / final weight bytes",
                     fmt_stats(ld["recipe"]["rss_over_weights"], "x", 2), f"≤ {TARGETS['load_rss_over_weights']:.2f}x",
                     verdict(ld["pass_rss"])])
        rows.append(["Load: peak anonymous memory / weight bytes, load_pipeline vs plain diffusers",
                     f"{fmt(ld['recipe']['anon_over_weights']['median'], 'x', 2)} vs "
                     f"{fmt(ld['plain']['anon_over_weights']['median'], 'x', 2)}; paired ratio less the "
                     f"{fmt(ld.get('kept_fp32_bytes', 0), 'MiB')} of fp32 islands the recipe keeps "
                     f"{fmt((ld.get('anon_judged') or {}).get('median'), 'x', 3)}, {judged(ld.get('anon_judged'), 'x')}", "≤ plain's", judged_verdict(ld.get("anon_judged"))])
    if "layouts" in rt:
        lay = rt["layouts"]
        rec, isl = lay["recipe"], lay["islands"]
        rows.append(["Runtime: hooks over the no-hook floor, benchmarked layout (paired)",
                     f"{fmt_stats(rec['overhead'], '%')}; {judged(rec.get('judged'))}", "≤ 1%",
                     judged_verdict(rec.get("judged"))])
        rows.append([f"Islands: hooks' own time beyond the casts an island needs / denoiser call, {isl['islands']} islands",
                     f"{fmt(isl['hook_extra_share'], '%')} ({fmt(isl['hook_extra'], 'us', 0)} per call; with the casts "
                     f"{fmt(isl['hook_share'], '%')}); {judged(isl.get('extra_judged'))}", "≤ 1%",
                     judged_verdict(isl.get("extra_judged"))])
        rows.append([f"Islands: hooks over the floor, {isl['islands']} islands (paired)",
                     f"{fmt_stats(isl['overhead'], '%')}; {judged(isl.get('judged'))}", "≤ 1%",
                     judged_verdict(isl.get("judged"))])
        rows += _slope_row("Islands: island hooks' own time linear in islands (log-log slope, every 4th / 2nd / all "
                           "norms)", rt.get("scaling", {}).get("judged"))
    if "rows" in ap:
        worst = max(r["ratio"]["median"] for r in ap["rows"])
        rows.append(["Apply: re-apply / first apply (every norm an island; worst size)", fmt(worst, "x", 2),
                     f"≤ {TARGETS['reapply_over_first']:.1f}x", verdict(ap["pass"])])
        for key, label in (("first", "first apply"), ("reapply", "re-apply")):
            if ap.get(f"judged_{key}") is not None:
                rows += _slope_row(f"Apply: {label} linear in modules (log-log slope)", ap[f"judged_{key}"])
            elif (ap.get(f"fit_{key}") or {}).get("loglog") is not None:  # a JSON written before slopes were judged
                fit = ap[f"fit_{key}"]
                rows.append([f"Apply: {label} linear in modules (log-log slope)", f"{fit['loglog']:.2f}",
                             f"≤ {LINEAR_SLOPE}", verdict(fit["loglog"] <= LINEAR_SLOPE)])
    if "models" in fid:
        t, j = fid["models"]["trained"], fid["judged"]
        noise = (f"; recipe - naive per seed: median {fmt(j['median_diff'])}, noise ±{fmt(j['noise'])} (n={j['n']})"
                 if j.get("noise") is not None else "")
        rows.append(["Fidelity (shipped trained model): recipe image rel L2 vs fp32 not worse than naive pipe.to(half) "
                     "beyond the run-to-run noise (denoiser's own rel L2 beside it)",
                     " / ".join(f"{fmt(t['recipe'][k]['rel_l2']['median'])} vs {fmt(t['naive'][k]['rel_l2']['median'])}"
                                for k in ("image", "denoiser")) + f"{noise}: {j['why']}",
                     "recipe ≤ naive + noise", verdict(fid["pass"])])
    for name, s in sec.items():
        if s.get("error"):
            rows.append([f"section {name}", "ERROR: " + s["error"], "", verdict(False)])
    return rows


def section_note(s: dict[str, Any]) -> str:
    la = s.get("loadavg") or [None, None]
    return (f"_Section wall time {s.get('wall_s', 0):.0f} s; 1-minute load average "
            f"{la[0][0] if la[0] else '?'} at its start, {la[1][0] if la[1] else '?'} at its end._")


def load_section(ld: dict[str, Any]) -> list[str]:
    L = [section_note(ld), "",
         f"Each load runs in a fresh process, order alternating, page cache warm, fp32 safetensors on disk cast while "
         f"loading, layout `{ld['layout']}` (loading does not compute, so the exact layout is loaded). Plain diffusers "
         f"gets `dtype={json.dumps(ld['dtype_map'])}` (`hf_precision.runtime.load.from_pretrained_dtypes` of the same "
         f"recipe). Baseline: memory after every import, before the load.", ""]
    rows = []
    for loader, label in (("plain", "plain `DiffusionPipeline.from_pretrained`"), ("recipe", "`hf_precision.load_pipeline`")):
        r = ld[loader]
        rows.append([label, fmt_stats(r["seconds"], "s", 2), fmt_stats(r["rss_over_weights"], "x", 2),
                     fmt_stats(r["anon_over_weights"], "x", 2), fmt(r["weight_bytes"], "MiB")])
    L += [md_table(["loader", "wall time", "peak RSS / weights", "peak anonymous / weights", "final weight bytes"], rows), ""]
    st = ld["stages"]
    L.append("- Stages inside load_pipeline (from `hf_precision.applied(pipe).timings`): "
             + ", ".join(f"{k} {fmt(v['median'], 'ms', 1)}" for k, v in st.items() if v.get("median") is not None)
             + f"; time load_pipeline / plain {fmt_stats(ld['time_ratio'], 'x', 2)}.")
    L.append("- **Peak RSS** (`VmHWM`, reset before the load, minus the baseline) counts every resident page, including the pages of the "
             "memory-mapped safetensors files plain diffusers reads through; those pages are file-backed and the kernel "
             "can drop them under pressure. **Peak anonymous memory** (`RssAnon` from `/proc/self/status`, sampled every "
             "5 ms) counts the process's private memory only: what must fit in RAM. load_pipeline reads tensor by tensor "
             "into their final dtype, so its RSS is close to its anonymous memory.")
    return L + [""]


def runtime_section(rt: dict[str, Any]) -> list[str]:
    L = [section_note(rt), "",
         f"UNet {rt['params']:,} parameters, {rt['modules']} modules, one call = batch 2 (CFG), 77 tokens, inputs "
         "arriving in the pipeline's latents dtype, `torch.inference_mode()`. Floor: the same UNet object with the hooks "
         "removed (`hf_precision.applied(pipe).remove()`), each island wrapped in a hand-written fp32 cast, inputs cast "
         "beforehand; hooks back with `apply_recipe`. Pairs run back to back, order alternating; they stop once the ratio is "
         "resolved against its target at the noise measured (half the spread of the pairs' ratios), else at --pairs. "
         "Hooks' own time, in the same pairs: the registered `EntryHook`/`IslandHook` pre/post callables wrapped with a "
         "timer (only time inside the hooks), while the floor times its hand-written casts the same way.", ""]
    rows = []
    for name, r in rt["layouts"].items():
        label = "benchmarked layout" if name == "recipe" else f"every norm an island ({r['islands']})"
        rows.append([label, f"{r['compute']} ({r['islands']} islands)", fmt_stats(r["floor_s"], "ms", 0),
                     fmt_stats(r["overhead"], "%"), fmt(r["hook_time"]["per_call"]["median"], "us", 0),
                     fmt(r["floor_cast_time"]["median"], "us", 0), fmt(r["hook_extra_share"], "%"),
                     r["hook_time"]["hook_calls_per_call"], fmt(r["max_abs_diff_floor"])])
    L += [md_table(["variant", "compute", "floor time per call", "hooks over floor (paired)", "hooks' own time per call",
                    "floor's hand-written casts per call", "hooks beyond the casts / call", "hook calls per call",
                    "max |Δ| floor vs hooks"], rows), ""]
    L.append("- The hooks' own time includes the casts they perform (activations to fp32 and back at every island). "
             "The floor performs the same casts in its hand-written wrapper; their time, taken the same way, is "
             "subtracted to give what the hooks cost beyond the casts any island needs. Both are the calling thread's CPU "
             "time (time.thread_time), so a shared machine's descheduling does not count as hook cost.")
    L.append("")
    sc = rt.get("scaling", {})
    if sc.get("rows"):
        L.append("Island hooks' own time against the number of islands (every 4th, every 2nd and every norm an island, "
                 "so that each subset holds norms of every block and size; all of them from the pairs above):")
        L.append("")
        L.append(md_table(["islands", "island hooks per call", "calls", "per island"],
                          [[r["islands"], fmt_stats(stats(r["samples"]), "us", 0), len(r["samples"]),
                            fmt(r["per_island_s"], "us", 2)] for r in sc["rows"]]))
        fit = sc.get("fit") or {}
        if fit:
            L.append("")
            L.append(f"- Fit: {fmt(fit['slope'], 'us', 2)} per island + {fmt(fit['intercept'], 'us', 0)}; log-log slope "
                     f"{fit.get('loglog', float('nan')):.2f} (1.0 = linear); {(sc.get('judged') or {}).get('why', '')}.")
    return L + [""]


def apply_section(ap: dict[str, Any]) -> list[str]:
    L = [section_note(ap), "",
         "`apply_recipe` on meta-device SDXL UNets (real config, `hf_precision.diagnose.planner.build_on_meta`) with "
         "every norm a `keep_fp32` island: a first apply on a fresh module, then `apply_recipe` again on the applied "
         "module (re-apply: the previous hooks are removed and replaced). Wall time of the call, resolve included.", ""]
    rows = [[r["label"], f"{r['modules']:,}", r["islands"], fmt_stats(r["first"], "ms", 1), fmt_stats(r["reapply"], "ms", 1),
             fmt_stats(r["ratio"], "x", 2), fmt(r["reapply"]["median"] / r["modules"], "us", 2)] for r in ap["rows"]]
    L += [md_table(["UNet (meta)", "modules", "islands", "first apply", "re-apply", "re-apply / first", "re-apply per module"],
                   rows), ""]
    return L


def weights_section(w: dict[str, Any], cfg: dict[str, Any]) -> list[str]:
    L = [f"- Loaded pipeline (measured layout): {fmt(w['loaded_total'], 'MiB')} against {fmt(w['loaded_fp32'], 'MiB')} "
         f"in fp32.", "- Real SDXL-base from `hf_precision.plan` (meta device, shipped configs):", ""]
    rows = [[f"`{d}` ({r['label']})", r["layout"], fmt(r["bytes"], "MiB"), fmt(r["fp32_bytes"], "MiB"),
             f"{r['saving'] * 100:.1f}%" + (" (this device's rules pick no half dtype: see `hf-precision recipes`)"
                                            if r["saving"] <= 0 else "")] for d, r in w["real_sdxl"].items()]
    return L + [md_table(["layout", "compute dtypes", "weights", "fp32", "saved"], rows), ""]


def fidelity_section(fid: dict[str, Any]) -> list[str]:
    tr = fid["trained"]
    unet, vae = tr["training"]["unet"], tr["training"]["vae"]
    peak = fid["models"]["trained"].get("decoder_peak")
    peak_text = "n/a" if peak is None else f"{peak:.3g}"
    L = [section_note(fid), "",
         f"Model: the small SDXL shipped with hf_precision (`hf_precision/apps/shapes_sdxl`, fingerprint "
         f"{tr['fingerprint']}; nothing is trained here, whatever `--size` says), rebuilt by `{tr['command']}`: its UNet "
         f"trained by `hf-precision train --method {unet['method']}` (fp32, CPU, seed {tr['training']['seed']}) on the "
         f"demo's generated coloured shapes, {unet['steps']} steps, batch {unet['batch_size']}, learning rate "
         f"{unet['learning_rate']}, {tr['training']['resolution']}px (loss, mean of the first / last tenth "
         f"{tr['unet']['loss_first_tenth']:.3f} -> {tr['unet']['loss_last_tenth']:.3f}); its VAE fitted to the shapes "
         f"({vae['steps']} steps) and its decoder scaled so its activations leave the float16 range, as the real SDXL "
         f"VAE's do (its decoder peaks at {peak_text}; float16 stops at 65504). Random weights: the same structure "
         f"before any training.", "",
         f"{fid['image']}x{fid['image']} image, {fid['steps']} Euler steps, guidance {fid['guidance']}, one torch thread, seeds "
         f"0..{fid['seeds'] - 1} (prompts the model was trained on), images in [0, 1]; reference: the same weights in "
         f"fp32. Naive: the fp32 pipeline `.to({fid['naive_dtype']})` (diffusers still upcasts this VAE to float32 for "
         f"the decode: its config says force_upcast). VAE in {fid['naive_dtype']}: fp32's final latents through the "
         f"decoder in {fid['naive_dtype']}, what a decode without force_upcast or the recipe gives. Denoiser: the "
         f"UNet's output on the exact inputs the fp32 run fed it at each step (no trajectory drift); its PSNR is "
         f"against max |fp32 output|. The target is judged against the run-to-run noise: half the spread over the "
         f"seeds of the per-seed difference recipe - naive.", ""]
    rows = []
    for label, m in fid["models"].items():
        for name in ("recipe", "naive", "vae_half"):
            kinds = [k for k in ("image", "denoiser") if k in m[name]]
            cells = [fmt_stats(m[name][k][metric]) if k in m[name] else "-" for k in ("image", "denoiser")
                     for metric in ("psnr_db", "rel_l2", "max_abs")]
            title = f"VAE decode in {fid['naive_dtype']}" if name == "vae_half" else name
            rows.append([label, title] + cells + [sum(m[name][k]["nonfinite"] for k in kinds)])
    L += [md_table(["weights", "pipeline", "image PSNR (dB)", "image rel L2", "image max |Δ|", "denoiser PSNR (dB)",
                    "denoiser rel L2", "denoiser max |Δ|", "non-finite"], rows), ""]
    L += [f"- {label}: {k} failed: {v}" for label, m in fid["models"].items() for k, v in m.get("errors", {}).items()]
    return L + [""]


def render(res: dict[str, Any]) -> str:
    sec = res["sections"]
    L = header(res)
    L += ["## Targets", "", md_table(["target", "measured", "target value", "result"], targets(sec)), ""]
    for name, title, fn in (("load", "1. Load: memory and time", load_section),
                            ("runtime", "2. Runtime: hooks and islands", runtime_section),
                            ("apply", "3. Apply and re-apply", apply_section),
                            ("weights", "4. Weight bytes", lambda s: weights_section(s, res["config"])),
                            ("fidelity", "5. Fidelity", fidelity_section)):
        s = sec.get(name, {})
        L += [f"## {title}", ""]
        if s.get("skipped") or s.get("error"):
            L += [s.get("skipped") or f"ERROR: {s['error']}", ""]
            if s.get("traceback"):
                L += ["```", s["traceback"], "```", ""]
            continue
        L += fn(s)
    return "\n".join(L)
