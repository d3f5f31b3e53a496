"""Bytes, time per denoiser call and output difference of each storage layout of one model, side by side in one run.

    python benchmarks/bench_quantize.py [--out bench_quantize.json] [--calls 20] [--width 128] [--trained-steps 100]
    python benchmarks/bench_quantize.py --quick        # a few seconds' check of the script itself (tiny, 1 call)

The model is the Flux transformer of ``benchmarks/bench/trained.py`` (``hf_precision.testing.make_pipeline("flux")``
widened by ``--width``), fitted first by ``hf-precision train --method full`` in fp32 for ``--trained-steps`` steps
on generated coloured shapes (cached under ``bench_output/trained/``; ``--trained-steps 0``: random weights), saved
once and loaded per layout through ``hf_precision.load_pipeline``: fp32, the recipe's half layout (bf16), fp8
storage (diffusers layerwise casting), torchao int8 weight-only, optimum-quanto qint8 and qfloat8, and a GGUF Q8_0
file written with the ``gguf`` package. Per layout: the transformer's planned bytes (``hf_precision.plan``, or the
GGUF file's) and measured bytes (the backends' tensors), the median seconds per transformer call on the same
captured inputs, and the output difference from fp32: mean absolute and relative L2 of the transformer output on
those inputs, and the PSNR of a ``--sample-steps`` sample (the decoded image, same seed) against fp32's and against
the half layout's (the storage alone: the same text encoders and VAE). Prints a markdown table; ``--out`` writes JSON
atomically.
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
sys.path.insert(0, str(ROOT / "benchmarks"))

# The fp32 rows name a CPU without bf16 instructions ("cpu-avx2"): "cpu" is this machine's CPU, which on an AMX
# Xeon picks bf16 unasked (on the H200 machine's host the first CUDA run's "fp32" row was bf16 that way).
LAYOUTS = [  # (label, layout device, quantize=, gguf)
    ("fp32", "cpu-avx2", None, False),
    ("bf16 (recipe half)", "cpu-amx", None, False),
    ("fp8 storage e4m3 / bf16", "cpu-amx", "float8_e4m3fn", False),
    ("int8 torchao / bf16", "cpu-amx", "int8", False),
    ("quanto qint8 / bf16", "cpu-amx", "quanto-int8", False),
    ("quanto qfloat8 / bf16", "cpu-amx", "quanto-float8", False),
    ("GGUF Q8_0 / bf16", "cpu-amx", None, True),
    # the storage error alone, without bf16 compute's (what a CPU without bf16 kernels runs)
    ("int8 torchao / fp32", "cpu-avx2", "int8", False),
    ("quanto qint8 / fp32", "cpu-avx2", "quanto-int8", False),
]
# --device cuda: the same model on the GPU, its half layout chosen by the GPU's own rules (layout None), plus the
# backends that need CUDA (bitsandbytes, fp8 matmuls from sm 8.9)
CUDA_LAYOUTS = [
    ("fp32", "cpu-avx2", None, False),
    ("bf16 (recipe half)", None, None, False),
    ("fp8 storage e4m3 / bf16", None, "float8_e4m3fn", False),
    ("int8 torchao / bf16", None, "int8", False),
    ("quanto qint8 / bf16", None, "quanto-int8", False),
    ("GGUF Q8_0 / bf16", None, None, True),
    ("nf4 bitsandbytes / bf16", None, "nf4", False),
    ("int8 bitsandbytes / bf16", None, "bnb-int8", False),
    ("fp8 compute e4m3", None, "fp8-compute", False),
]


PROMPT = "a red square"  # one of the captions the trained model was fitted to


def _sample(pipe, side: int, steps: int):
    """A ``steps``-step image (fixed seed) as float64 in [0, 1]."""
    import numpy as np
    import torch

    pipe.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipe(prompt=PROMPT, num_inference_steps=steps, height=side, width=side, max_sequence_length=16,
                   output_type="np", generator=torch.Generator().manual_seed(0)).images
    return np.asarray(out, dtype=np.float64)


def _psnr(image, reference) -> float:
    import numpy as np

    mse = float(np.mean((np.nan_to_num(image, nan=1e3) - reference) ** 2))
    return float("inf") if mse == 0 else 10 * float(np.log10(1.0 / mse))


def _capture(pipe, side: int):
    """The kwargs of one transformer call of a short pipeline run."""
    import torch

    seen = {}

    def grab(module, args, kwargs):
        if not seen:
            seen.update({k: (v.detach().clone() if isinstance(v, torch.Tensor) else v) for k, v in kwargs.items()})

    handle = pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    pipe(prompt=PROMPT, num_inference_steps=1, height=side, width=side, max_sequence_length=16, output_type="latent",
         generator=torch.Generator().manual_seed(0))
    handle.remove()
    return seen


def main(argv: list[str] | None = None) -> int:
    import torch

    import hf_precision as hp
    from hf_precision.runtime.quantize import module_bytes
    from hf_precision.testing import save_pipeline
    from hf_precision.testing.gguf_file import write_gguf

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--calls", type=int, default=20)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--trained-steps", type=int, default=100,
                   help="fit the model this many steps first (cached; 0: random weights)")
    p.add_argument("--resolution", type=int, default=32, help="image side of training, capture and sample")
    p.add_argument("--sample-steps", type=int, default=4, help="steps of the sample compared with fp32's")
    p.add_argument("--quick", action="store_true", help="check the script: width 64, 2 training steps, 1 call")
    p.add_argument("--device", default="cpu", help="where the layouts run (cuda: the GPU rows)")
    p.add_argument("--only", action="append", default=[], metavar="TEXT",
                   help="run only the layouts whose label contains TEXT (repeatable; fp32 always runs: the reference)")
    args = p.parse_args(argv)
    if args.quick:
        args.width, args.calls, args.trained_steps, args.sample_steps = 64, 1, min(args.trained_steps, 2), 2
    table = CUDA_LAYOUTS if args.device.startswith("cuda") else LAYOUTS
    layouts = [row for row in table if row[0] == "fp32" or not args.only or any(t in row[0] for t in args.only)]
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="bench_quantize-"))
    trained = None
    if args.trained_steps:
        from bench.trained import trained_flux

        cache = work / "trained" if args.quick else None
        folder, trained = trained_flux(args.width, args.trained_steps, resolution=args.resolution,
                                       **({"cache": cache} if cache else {}))
    else:
        from bench.trained import wide_flux

        folder = save_pipeline(wide_flux(args.width), work / "flux")
    gguf_path = work / "transformer-Q8_0.gguf"
    write_gguf(hp.load_pipeline(folder, "cpu", layout="cpu-avx2").transformer, gguf_path)
    inputs, reference, ref_image, rows = None, None, None, []
    half_image, half_layout = None, None
    for label, layout, storage, gguf in layouts:
        kwargs = {"quantize": {"transformer": storage}} if storage else {}
        where = str(gguf_path) if gguf else folder
        try:
            pipe = hp.load_pipeline(where, args.device, layout=layout, base=folder if gguf else None, **kwargs)
        except Exception as err:  # noqa: BLE001 - a backend missing on this machine is a row, not the end of the run
            print(f"{label}: not loaded: {type(err).__name__}: {str(err).splitlines()[0][:200]}")
            continue
        layout = layout or args.device
        sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)
        if inputs is None:
            inputs = _capture(pipe, args.resolution)
        if gguf:  # the file's header and the base folder's configs, as loading reads them
            planned = hp.plan(gguf_path, device=layout, base=folder)["transformer"].total_bytes
        else:
            planned = hp.plan(folder, device=layout, overrides={"transformer": {"storage": storage}} if storage
                              else None)["transformer"].total_bytes
        times = []
        with torch.no_grad():
            out = pipe.transformer(**inputs)[0].float().cpu()
            for _ in range(args.calls):
                sync()
                start = time.perf_counter()
                pipe.transformer(**inputs)
                sync()
                times.append(time.perf_counter() - start)
        image = _sample(pipe, args.resolution, args.sample_steps)
        if reference is None:
            reference, ref_image = out, image
        elif label.startswith("bf16 (recipe half)"):  # its text encoders and VAE are those of the rows in its layout
            half_image, half_layout = image, layout
        rows.append({"layout": label, "planned_bytes": planned, "measured_bytes": module_bytes(pipe.transformer),
                     "ms_per_call": 1000 * statistics.median(times),
                     "mean_abs_diff_vs_fp32": float((out - reference).abs().mean()),
                     "rel_l2_vs_fp32": float((out - reference).norm() / reference.norm()),
                     "sample_psnr_db_vs_fp32": _psnr(image, ref_image),
                     # the storage's own effect on the picture: same text encoders, VAE and compute dtype
                     "sample_psnr_db_vs_half": _psnr(image, half_image) if layout == half_layout else None,
                     "finite": bool(torch.isfinite(out).all())})
    machine = {"cpu": (torch.cuda.get_device_name() if args.device.startswith("cuda") else
                       platform.processor() or platform.machine()), "cores": os.cpu_count(), "torch": torch.__version__,
               "threads": torch.get_num_threads(), "python": platform.python_version()}
    weights = (f"trained {trained['steps']} steps (loss {trained['loss_first_tenth']:.3f} -> "
               f"{trained['loss_last_tenth']:.3f}, first/last tenth)" if trained else "random weights")
    print(f"Flux transformer, width {args.width}, {weights}; {args.resolution}px; median of {args.calls} calls; "
          f"sample {args.sample_steps} steps; {machine['cpu']} ({machine['threads']} threads), torch {machine['torch']}")
    print("| layout | planned bytes | measured bytes | ms / call | mean abs diff vs fp32 | rel L2 vs fp32 | "
          "sample PSNR vs fp32 | sample PSNR vs half |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        vs_half = "" if r["sample_psnr_db_vs_half"] is None else f"{r['sample_psnr_db_vs_half']:.1f} dB"
        print(f"| {r['layout']} | {r['planned_bytes']:,} | {r['measured_bytes']:,} | {r['ms_per_call']:.1f} | "
              f"{r['mean_abs_diff_vs_fp32']:.2e} | {r['rel_l2_vs_fp32']:.2e} | {r['sample_psnr_db_vs_fp32']:.1f} dB | "
              f"{vs_half} |")
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps({"machine": machine, "width": args.width, "trained": trained, "rows": rows}, indent=2))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
