"""Bytes, time per denoiser call and output difference of each storage layout of one model, side by side in one run.

    python scripts/bench_quantize.py [--out bench_quantize.json] [--calls 20] [--width 256]

The model is a Flux transformer with random weights (``hf_precision.testing.families_dit.make_flux`` widened by
``--width``; no trained tiny Flux ships offline), saved once and loaded per layout through
``hf_precision.load_pipeline``: fp32, the recipe's half layout (bf16), fp8 storage (diffusers layerwise casting),
torchao int8 weight-only, optimum-quanto qint8 and qfloat8, and a GGUF Q8_0 file written with the ``gguf`` package.
Per layout: the transformer's planned bytes (``hf_precision.plan``, or the GGUF file's) and measured bytes (the
backends' tensors), the median seconds per transformer call on the same captured inputs, and the mean absolute
difference of the transformer output from the fp32 one (random weights: it shows the size of the storage error,
not image quality). Prints a markdown table; ``--out`` writes JSON atomically.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LAYOUTS = [  # (label, layout device, quantize=, gguf)
    ("fp32", "cpu", None, False),
    ("bf16 (recipe half)", "cpu-amx", None, False),
    ("fp8 storage e4m3 / bf16", "cpu-amx", "float8_e4m3fn", False),
    ("int8 torchao / bf16", "cpu-amx", "int8", False),
    ("quanto qint8 / bf16", "cpu-amx", "quanto-int8", False),
    ("quanto qfloat8 / bf16", "cpu-amx", "quanto-float8", False),
    ("GGUF Q8_0 / bf16", "cpu-amx", None, True),
]


def _wide_flux(width: int):
    """The tiny Flux pipeline with a wider transformer (so that matmuls, not Python, dominate a call)."""
    import torch
    from diffusers import FluxTransformer2DModel

    from hf_precision.testing.families_dit import make_flux

    pipe = make_flux()
    torch.manual_seed(0)
    heads = max(2, width // 64)
    pipe.transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4,
                                              attention_head_dim=width // heads, num_attention_heads=heads,
                                              joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True,
                                              axes_dims_rope=[4, 4, width // heads - 8])
    return pipe


def _capture(pipe):
    """The kwargs of one transformer call of a short pipeline run."""
    import torch

    seen = {}

    def grab(module, args, kwargs):
        if not seen:
            seen.update({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})

    handle = pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    pipe(prompt="a cat", num_inference_steps=1, height=64, width=64, max_sequence_length=16, output_type="latent",
         generator=torch.Generator().manual_seed(0))
    handle.remove()
    return seen


def main(argv: list[str] | None = None) -> int:
    import torch

    import hf_precision as hp
    from hf_precision.runtime.gguf import gguf_planned_bytes
    from hf_precision.runtime.quantize import module_bytes
    from hf_precision.testing import save_pipeline
    from hf_precision.testing.gguf_file import write_gguf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--width", type=int, default=256)
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run only the layouts whose label contains TEXT (repeatable; fp32 always runs: the reference)")
    args = p.parse_args(argv)
    layouts = [row for row in LAYOUTS if row[0] == "fp32" or not args.only or any(t in row[0] for t in args.only)]
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="bench_quantize-"))
    folder = save_pipeline(_wide_flux(args.width), work / "flux")
    gguf_path = work / "transformer-Q8_0.gguf"
    write_gguf(hp.load_pipeline(folder, "cpu").transformer, gguf_path)
    inputs, reference, rows = None, None, []
    for label, layout, storage, gguf in layouts:
        kwargs = {"quantize": {"transformer": storage}} if storage else {}
        where = str(gguf_path) if gguf else folder
        pipe = hp.load_pipeline(where, "cpu", layout=layout, base=folder if gguf else None, **kwargs)
        if inputs is None:
            inputs = _capture(pipe)
        if gguf:
            planned = sum(gguf_planned_bytes(gguf_path, "bfloat16").values())
        else:
            planned = hp.plan(folder, device=layout, overrides={"transformer": {"storage": storage}} if storage
                              else None)["transformer"].total_bytes
        times = []
        with torch.no_grad():
            out = pipe.transformer(**inputs)[0].float()
            for _ in range(args.calls):
                start = time.perf_counter()
                pipe.transformer(**inputs)
                times.append(time.perf_counter() - start)
        if reference is None:
            reference = out
        rows.append({"layout": label, "planned_bytes": planned, "measured_bytes": module_bytes(pipe.transformer),
                     "ms_per_call": 1000 * statistics.median(times),
                     "mean_abs_diff_vs_fp32": float((out - reference).abs().mean()),
                     "finite": bool(torch.isfinite(out).all())})
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "python": platform.python_version()}
    print(f"Flux transformer, random weights, width {args.width}; median of {args.calls} calls; "
          f"{machine['cpu']} ({machine['threads']} threads), torch {machine['torch']}")
    print("| layout | planned bytes | measured bytes | ms / call | mean abs diff vs fp32 |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layout']} | {r['planned_bytes']:,} | {r['measured_bytes']:,} | {r['ms_per_call']:.1f} | "
              f"{r['mean_abs_diff_vs_fp32']:.2e} |")
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps({"machine": machine, "width": args.width, "rows": rows}, indent=2))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
