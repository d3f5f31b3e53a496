"""Sweep quantized set-ups on CPU over every tiny pipeline: load, plan exactly, run finite, keep islands out.

Usage: python benchmarks/quant_sweep.py [--quick] [--only NAME ...] [--forms quantize,set,user,gguf] [--json FILE]

Every row of ``hf_precision.testing.registry`` is saved with ``save_pretrained`` and loaded back through
``hp.load_pipeline(folder, "cpu", ...)`` with one component (the denoiser, each text encoder, the VAE) or two at once
quantized, for each storage that runs on CPU (torchao ``int8``, ``quanto-int8``, ``quanto-float8``, fp8 storage
``float8_e4m3fn``/``float8_e5m2``), asked three ways: ``quantize={...}``, the ``--set C.storage=...`` override, and a
user's own diffusers ``PipelineQuantizationConfig``; and the denoiser from a GGUF file (Q8_0, Q4_0, the K-quants Q2_K
to Q6_K with llama.cpp's fallback type for rows that do not fill 256 weights, F16, BF16) written by
``hf_precision.testing.gguf_file.write_gguf``, where diffusers reads that model class from a single file (each GGUF
case names the types its file holds: the tiny rows seldom fill a K-quant block). Each case checks:
plan bytes == measured bytes (every component), a 2-step call is finite, no island/embedder/final projection layer
is quantized (under torchao's exact names), ``hp.check`` passes. ``--quick`` takes a few families; the NaN guard,
``calibrate`` and ``explain_error`` are checked once per backend on the first pipeline.

One line per case (``PASS``/``FAIL <class>``) and a summary by failure class.
"""

from __future__ import annotations

import argparse
import collections
import fnmatch
import json
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

import torch

STORAGES = ("int8", "quanto-int8", "quanto-float8", "quanto-int4", "quanto-int2", "float8_e4m3fn", "float8_e5m2")
# compute layouts by storage: bf16 compute (cpu-amx preset) for half, fp32 for the rest, fp16 (t4) for pairs
LAYOUT = {"int8": "cpu-amx", "quanto-int8": None, "quanto-float8": "cpu-amx", "quanto-int4": "cpu-amx",
          "quanto-int2": None, "float8_e4m3fn": "cpu-amx", "float8_e5m2": None}
GGUF_TYPES = ("Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "F16", "BF16")
QUICK = ("flux", "sdxl", "wan", "sd3", "ltx", "pixart")
FORMS = ("quantize", "set", "user", "gguf")


class Fail(Exception):
    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def components_of(pipe, recipe):
    """(denoiser, text encoders, vae) names present in both the pipeline and its recipe."""
    mods = {n for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    names = [p.name for p in recipe.policies if p.name in mods]
    den = recipe.denoiser if recipe.denoiser in names else None
    texts = [n for n in names if n.startswith("text_encoder")]
    vae = [n for n in names if n in ("vae", "movq", "vqgan")]
    return den, texts, vae


def case_list(name, pipe, recipe, forms):
    den, texts, vaes = components_of(pipe, recipe)
    out = []
    comps = ([den] if den else []) + texts + vaes
    for form in forms:
        if form == "gguf":
            if den:
                out += [(form, ((den, q),), "cpu-amx") for q in GGUF_TYPES]
            continue
        for comp in comps:
            storages = STORAGES if form == "quantize" else (("int8", "quanto-int8") if form == "set" else ("quanto-int8",))
            for s in storages:
                out.append((form, ((comp, s),), LAYOUT[s] if form != "user" else None))
        if form == "quantize" and den and texts:  # two at once, fp16 compute (t4 layout on CPU)
            out.append((form, ((den, "int8"), (texts[-1], "quanto-int8")), "t4"))
            out.append((form, ((den, "float8_e4m3fn"), (texts[0], "int8")), "cpu-amx"))
    return out


def _quiet():
    warnings.simplefilter("ignore")


def run_case(row, folder, form, pairs, layout, tmp):
    import hf_precision as hp
    from hf_precision.recipe.overrides import Override, parse_set
    from hf_precision.recipe.quantize import DEFAULT_KEEP, is_quantized
    from hf_precision.runtime.quantize import module_bytes
    from hf_precision.runtime.quantize_load import quantized_in

    quant = dict(pairs)
    kw = {"layout": layout}
    base, note = None, ""
    if form == "quantize":
        kw["quantize"] = quant
    elif form == "set":
        kw["overrides"] = [Override("--set", parse_set([f"{c}.storage={s}" for c, s in pairs]))]
    elif form == "user":
        import diffusers
        import transformers

        from hf_precision.runtime.quantize import library_of

        probe = row.make()
        mapping = {}
        for c, s in pairs:
            if library_of(getattr(probe, c)) == "transformers":  # transformers' QuantoConfig says `weights`
                mapping[c] = transformers.QuantoConfig(weights=s.split("-")[1])
            else:
                mapping[c] = diffusers.QuantoConfig(weights_dtype=s.split("-")[1])
        kw["quantization_config"] = diffusers.PipelineQuantizationConfig(quant_mapping=mapping)
    elif form == "gguf":
        from hf_precision.testing.gguf_file import FALLBACK, write_gguf

        (comp, qtype), = pairs
        probe = row.make()
        path = Path(tmp) / f"{row.name}-{qtype}.gguf"
        try:
            types = write_gguf(getattr(probe, comp), path, (qtype, FALLBACK[qtype]) if qtype in FALLBACK else qtype)
        except Exception as err:
            raise Fail("gguf-write", f"{type(err).__name__}: {str(err)[:160]}")
        held = collections.Counter(types.values())
        note = " (file: " + ", ".join(f"{t} {n}" for t, n in sorted(held.items())) + ")"
        base, folder = folder, path
        kw["base"] = base
    t0 = time.perf_counter()
    try:
        with warnings.catch_warnings():
            _quiet()
            pipe = hp.load_pipeline(folder, "cpu", **kw)
    except Exception as err:
        from hf_precision.errors import RecipeError

        if isinstance(err, RecipeError) and "cannot be read from a single file" in str(err):
            return "refused"  # one clear error before loading: diffusers has no single-file loader for the class
        raise Fail("load", f"{type(err).__name__}: {str(err)[:300]}")
    row.ready(pipe)
    pipe.set_progress_bar_config(disable=True)
    record = hp.applied(pipe)
    # plan bytes == measured bytes, every component
    if form in ("quantize", "set", "gguf"):
        try:
            if form == "gguf":  # the denoiser from the file's header, the rest from the base folder
                planned = hp.plan(folder, device=layout or "cpu", base=base)
            else:
                planned = hp.plan(folder, device=layout or "cpu", overrides={c: {"storage": s} for c, s in pairs})
        except Exception as err:
            raise Fail("plan", f"{type(err).__name__}: {str(err)[:300]}")
        for comp in planned.components if hasattr(planned, "components") else []:
            module = getattr(pipe, comp, None)
            if not isinstance(module, torch.nn.Module):
                continue
            want, got = planned[comp].total_bytes, module_bytes(module)
            if want != got:
                kind = ("gguf-bytes" if form == "gguf" else "plan-bytes") if comp in quant else "plan-bytes-plain"
                raise Fail(kind, f"{comp}: planned {want} measured {got} (diff {got - want})")
        acts = "\n".join(record.actions)
        for c, s in pairs:
            if form != "gguf" and is_quantized(s) and "as planned" not in acts:
                raise Fail("plan-layers", acts[-300:])
    else:
        if not any("quantization_config from the caller" in a for a in record.actions):
            raise Fail("user-report", "; ".join(record.actions)[-200:])
    # islands / embedders / final projection not quantized
    for c, s in pairs:
        module = getattr(pipe, c)
        q = quantized_in(module)
        has_linear = any(isinstance(m, torch.nn.Linear) for m in module.modules())
        if is_quantized(s) and form != "gguf" and not q and has_linear:
            raise Fail("nothing-quantized", c)
        for island in record.islands.get(c, []):
            bad = [n for n in q if n == island or n.startswith(island + ".")]
            if bad:
                raise Fail("island-quantized", f"{c}.{bad[0]}")
            if record.recipe[c].compute != "float32" and form != "gguf":
                dts = {p.dtype for p in module.get_submodule(island).parameters()}
                if dts - {torch.float32}:
                    raise Fail("island-dtype", f"{c}.{island}: {dts}")
        if s == "int8" and form != "user":  # exact names: every default-kept layer stays plain
            keep = [n for n in q if any(fnmatch.fnmatchcase(p, g) for g in DEFAULT_KEEP
                                        for p in (".".join(n.split(".")[:i]) for i in range(1, n.count(".") + 2)))]
            if keep:
                raise Fail("kept-quantized", f"{c}.{keep[0]}")
        if s.startswith("float8"):
            if not any(p.dtype == getattr(torch, s) for p in module.parameters()):
                raise Fail("fp8-not-stored", c)
        if s.startswith("quanto-") and form != "gguf":  # the quanto type asked for, not the backend's default
            want = {"quanto-int8": "qint8", "quanto-float8": "qfloat8_e4m3fn", "quanto-int4": "qint4",
                    "quanto-int2": "qint2"}[s]
            got = {p.qtype.name for p in module.parameters() if hasattr(p, "qtype")}
            if got and got != {want}:
                raise Fail("quanto-type", f"{c}: {got}")
    # one 2-step call through hp.check: finite, no finding
    outs = []

    def call(p):
        out = p(**row.call_kwargs(), generator=torch.Generator().manual_seed(0))
        outs.append(out)
        return out

    try:
        with warnings.catch_warnings():
            _quiet()
            report = hp.check(pipe, call=call)
    except Exception as err:
        raise Fail("run", f"{type(err).__name__}: {str(err)[:300]}")
    if not outs:
        raise Fail("run", "the call failed inside check: " + str(report).replace("\n", " | ")[:400])
    res = torch.as_tensor(row.result(outs[0]) if not isinstance(row.result(outs[0]), list) else
                          __import__("numpy").asarray(row.result(outs[0])))
    if not torch.isfinite(res.float()).all():
        raise Fail("not-finite", f"{torch.isfinite(res.float()).float().mean():.3f} finite")
    if not report.ok:
        raise Fail("check", str(report).replace("\n", " | ")[:300])
    return f"{time.perf_counter() - t0:.1f}s{note}"


def extra_checks(row, folder):
    """The NaN guard, calibrate and explain_error on quantized components (once per backend)."""
    import hf_precision as hp
    from hf_precision.runtime.quantize_load import quantized_in

    results = []
    den = hp.get_recipe(row.recipe, device="cpu").denoiser
    for storage in ("int8", "quanto-int8", "float8_e4m3fn"):
        label = f"{row.name} nan-guard {den}={storage}"
        try:
            with warnings.catch_warnings():
                _quiet()
                pipe = hp.load_pipeline(folder, "cpu", layout="cpu-amx", quantize={den: storage},
                                        overrides={den: {"nan_guard": True}})
            row.ready(pipe)
            module = getattr(pipe, den)
            # an overflow the guard must see: a kept (plain) output bias set to inf
            # a plain layer in the compute dtype (fp8-stored biases cannot hold inf)
            target = next(m for n, m in reversed(list(module.named_modules()))
                          if isinstance(m, torch.nn.Linear) and n not in quantized_in(module)
                          and getattr(m, "bias", None) is not None and type(m.weight) in (torch.nn.Parameter,)
                          and m.bias.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2))
            with torch.no_grad():
                target.bias.fill_(float("inf"))
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    pipe(**row.call_kwargs(), generator=torch.Generator().manual_seed(0))
                except Exception as err:  # the guard may refuse loudly; a crash inside it is a failure
                    if "nan" not in str(err).lower() and "finite" not in str(err).lower():
                        raise
            said = " ".join(str(w.message) for w in caught)
            ok = "storage=" in said or storage.startswith("float8")
            results.append((label, "PASS" if ok else "FAIL nan-guard", said[:200]))
        except Exception as err:
            results.append((label, "FAIL nan-guard", f"{type(err).__name__}: {str(err)[:200]}"))
    for storage in ("int8", "quanto-int8"):
        label = f"{row.name} calibrate {den}={storage}"
        try:
            with warnings.catch_warnings():
                _quiet()
                pipe = hp.load_pipeline(folder, "cpu", quantize={den: storage})
                row.ready(pipe)
                result = hp.calibrate(pipe, "t4", row.call_kwargs(), progress=False, rounds=1)
            results.append((label, "PASS", str(result.islands)[:120]))
        except Exception as err:
            results.append((label, "FAIL calibrate", f"{type(err).__name__}: {str(err)[:200]}"))
    from hf_precision.diagnose.mismatch import explain_error

    for message, want in (("Promotion for Float8 Types is not supported", "storage=float8_e4m3fn"),
                          ("\"cat_cuda\" not implemented for 'Float8_e4m3fn'", "storage=float8_e4m3fn"),
                          ("Expected is_sm80 || is_sm90 to be true, but got false.", "storage=int8"),
                          ("Trying to convert Float8_e4m3fn to the MPS backend but it does not have support for that "
                           "dtype.", "storage=quanto-int8")):
        err = explain_error(RuntimeError(message), f"{den}.blocks.0")
        fix = getattr(err, "fix", "") or ""
        results.append((f"explain {message[:30]!r}", "PASS" if want in fix else "FAIL explain", fix[:120]))
    return results


def refusals():
    """Choices the device cannot run are refused before loading, one error naming key/value/allowed/fix."""
    import hf_precision as hp
    from hf_precision.errors import RecipeError

    out = []
    for device, storage in (("cpu", "nf4"), ("cpu", "bnb-int8"), ("cpu", "fp8-compute"), ("m1-macos13", "float8_e5m2"),
                            ("m2-macos15", "quanto-float8"), ("t4", "fp8-compute"), ("arc-a770", "float8_e4m3fn")):
        label = f"refuse {storage} on {device}"
        try:
            hp.plan("flux", device=device, overrides={"transformer": {"storage": storage}})  # library refusals too
            out.append((label, "FAIL not-refused", ""))
        except RecipeError as err:
            msg = str(err)
            ok = all(w in msg for w in ("transformer.storage", storage, "allowed", "fix:"))
            out.append((label, "PASS" if ok else "FAIL refusal-text", msg[:160]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--forms", default=",".join(FORMS))
    ap.add_argument("--json")
    ap.add_argument("--no-extra", action="store_true")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    import diffusers
    import transformers

    diffusers.utils.logging.disable_progress_bar()
    transformers.utils.logging.disable_progress_bar()
    diffusers.utils.logging.set_verbosity_error()
    transformers.utils.logging.set_verbosity_error()
    from hf_precision.testing import save_pipeline
    from hf_precision.testing.registry import PIPELINES
    import hf_precision as hp

    names = args.only or (QUICK if args.quick else [n for n, r in PIPELINES.items() if r.loads])
    forms = tuple(args.forms.split(","))
    lines, start = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i, name in enumerate(names):
            row = PIPELINES[name]
            folder = save_pipeline(row.make(), Path(tmp) / name)
            recipe = hp.get_recipe(row.recipe, device="cpu")
            for form, pairs, layout in case_list(name, row.make(), recipe, forms):
                label = f"{name} {form} {'+'.join(f'{c}={s}' for c, s in pairs)} @{layout or 'cpu'}"
                try:
                    said = run_case(row, folder, form, pairs, layout, tmp)
                    status, detail = "PASS", said if said != "refused" else "refused before loading"
                except Fail as f:
                    status, detail = f"FAIL {f.kind}", f.detail
                except Exception as err:
                    status, detail = "FAIL crash", f"{type(err).__name__}: {str(err)[:200]} " + \
                        traceback.format_exc().splitlines()[-3][:120]
                print(f"{status:24s} {label}  {detail}", flush=True)
                lines.append((label, status, detail))
            if i == 0 and not args.no_extra:
                for label, status, detail in extra_checks(row, folder) + refusals():
                    print(f"{status:24s} {label}  {detail}", flush=True)
                    lines.append((label, status, detail))
    counts = collections.Counter(s for _, s, _ in lines)
    print(f"\n{len(lines)} cases, {counts['PASS']} pass, {len(lines) - counts['PASS']} fail "
          f"({time.perf_counter() - start:.0f}s)")
    for status, n in sorted(counts.items()):
        if status != "PASS":
            print(f"  {status}: {n}")
    if args.json:
        Path(args.json).write_text(json.dumps([dict(case=c, status=s, detail=d) for c, s, d in lines], indent=1))
    return 0 if counts["PASS"] == len(lines) else 1


if __name__ == "__main__":
    sys.exit(main())
