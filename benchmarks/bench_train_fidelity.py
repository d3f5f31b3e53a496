#!/usr/bin/env python
"""Fidelity of ``hf-precision train``: a LoRA trained under each layout against the same LoRA trained in fp32.

    python benchmarks/bench_train_fidelity.py [--steps 20] [--layouts fp32,a100,int8] [--out bench_train_fidelity.json]
    python benchmarks/bench_train_fidelity.py --quick     # a few seconds' check of the script itself

The model is the trained Flux of ``benchmarks/bench/trained.py`` (fitted in fp32 first, so that differences measure
precision rather than the chaos of random weights; shared cache with ``benchmarks/bench_quantize.py``). Each layout
trains the same LoRA (rank 4, same data, seed, noise and timesteps) through the command's own ``train``:

- ``fp32``: the reference (``--layout cpu``);
- ``a100``: the recipe's bf16 layout (bf16 frozen parts and compute, fp32 LoRA masters);
- ``t4``: fp16 compute with a GradScaler (slow on CPUs without fp16 instructions: not in the default set);
- ``int8`` / ``quanto-int8``: the fp32 layout on a quantized base (``--set transformer.storage=...``).

Per layout: the loss per step and its gap to fp32's (mean and max absolute difference over the steps, the mean
relative difference), the relative L2 distance of the trained LoRA weights from fp32's, and the PSNR of a sample
from the fp32 pipeline with that LoRA loaded (``load_lora_weights``) against the sample with fp32's LoRA; and, for
scale, how far fp32's LoRA moves the sample from the base model's.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

LAYOUTS = {  # name -> (--layout, --set overrides)
    "fp32": ("cpu", []),
    "a100": ("a100", []),
    "t4": ("t4", []),
    "int8": ("cpu", ["transformer.storage=int8"]),
    "quanto-int8": ("cpu", ["transformer.storage=quanto-int8"]),
}


def _lora(path: Path) -> dict:
    from safetensors.torch import load_file

    return {k: v.float() for k, v in load_file(str(path / "pytorch_lora_weights.safetensors")).items()}


def main(argv: list[str] | None = None) -> int:
    import numpy as np
    import torch

    import hf_precision as hp
    from bench.trained import trained_flux
    from hf_precision.apps.train.demo import make_demo
    from hf_precision.apps.train.loop import train
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.recipe.overrides import Override, parse_set

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default=None)
    p.add_argument("--steps", type=int, default=20, help="LoRA training steps per layout")
    p.add_argument("--layouts", default="fp32,a100,int8,quanto-int8", help=f"from {', '.join(LAYOUTS)} (fp32 first)")
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--trained-steps", type=int, default=100, help="steps the base model was fitted (cached)")
    p.add_argument("--resolution", type=int, default=32)
    p.add_argument("--sample-steps", type=int, default=4)
    p.add_argument("--quick", action="store_true", help="check the script: width 64, 2 base steps, 2 LoRA steps")
    args = p.parse_args(argv)
    if args.quick:
        args.width, args.trained_steps, args.steps, args.sample_steps = 64, 2, 2, 2
    names = ["fp32", *[n for n in args.layouts.split(",") if n and n != "fp32"]]
    unknown = [n for n in names if n not in LAYOUTS]
    if unknown:
        p.error(f"--layouts: unknown {unknown}; choose from {', '.join(LAYOUTS)}")
    warnings.simplefilter("ignore")
    work = Path(tempfile.mkdtemp(prefix="bench_train_fidelity-"))
    folder, trained = trained_flux(args.width, args.trained_steps, resolution=args.resolution,
                                   **({"cache": work / "trained"} if args.quick else {}))
    _, data = make_demo(work, size=args.resolution)
    runs = {}
    for name in names:
        layout, sets = LAYOUTS[name]
        start = time.perf_counter()
        result = train(TrainSettings(model=str(folder), data=str(data), out=str(work / name), steps=args.steps,
                                     batch_size=4, learning_rate=1e-3, lora_rank=4, resolution=args.resolution,
                                     device="cpu", layout=layout, save_dtype="float32", checkpoint_every=10**9,
                                     quiet=True, overrides=[Override("--set", parse_set(sets))] if sets else []))
        runs[name] = {"losses": [result.losses[k] for k in sorted(result.losses)], "skipped": result.skipped,
                      "seconds": round(time.perf_counter() - start, 1)}
    pipe = hp.load_pipeline(str(folder), "cpu")
    pipe.set_progress_bar_config(disable=True)
    samples, loras = {}, {}
    with torch.no_grad():  # the base model's sample: how far the fp32 LoRA itself moves it (the size of the effect)
        base = np.asarray(pipe(prompt="a red square", num_inference_steps=args.sample_steps, height=args.resolution,
                               width=args.resolution, max_sequence_length=16, output_type="np",
                               generator=torch.Generator().manual_seed(0)).images, dtype=np.float64)
    for name in names:
        pipe.load_lora_weights(str(work / name), adapter_name=name.replace("-", "_"))
        pipe.set_adapters([name.replace("-", "_")])
        with torch.no_grad():
            image = pipe(prompt="a red square", num_inference_steps=args.sample_steps, height=args.resolution,
                         width=args.resolution, max_sequence_length=16, output_type="np",
                         generator=torch.Generator().manual_seed(0)).images
        samples[name] = np.asarray(image, dtype=np.float64)
        loras[name] = _lora(work / name)
    ref = runs["fp32"]["losses"]
    rows = []
    for name in names:
        losses = runs[name]["losses"]
        gap = np.abs(np.asarray(losses) - np.asarray(ref))
        num = sum(float((loras[name][k] - v).norm() ** 2) for k, v in loras["fp32"].items())
        den = sum(float(v.norm() ** 2) for v in loras["fp32"].values())
        mse = float(np.mean((np.nan_to_num(samples[name], nan=1e3) - samples["fp32"]) ** 2))
        rows.append({"layout": name, "final_loss": losses[-1], "loss_gap_mean": float(gap.mean()),
                     "loss_gap_max": float(gap.max()), "loss_gap_rel": float((gap / np.asarray(ref)).mean()),
                     "lora_rel_l2": (num / den) ** 0.5 if den else float("nan"),
                     "sample_psnr_db": float("inf") if mse == 0 else 10 * float(np.log10(1 / mse)),
                     "skipped": runs[name]["skipped"], "seconds": runs[name]["seconds"]})
    machine = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(), "torch": torch.__version__,
               "threads": torch.get_num_threads()}
    print(f"LoRA rank 4, {args.steps} steps, batch 4, lr 1e-3, on the Flux of width {args.width} fitted "
          f"{trained['steps']} steps (loss {trained['loss_first_tenth']:.3f} -> {trained['loss_last_tenth']:.3f}); "
          f"{machine['cpu']} ({machine['threads']} threads), torch {machine['torch']}")
    effect = float(np.mean((base - samples["fp32"]) ** 2))
    print(f"the fp32 LoRA moves the sample from the base model's by PSNR {10 * np.log10(1 / effect):.1f} dB (the size "
          f"of what is compared below)")
    print("| layout | final loss | loss gap vs fp32 (mean / max / mean rel) | LoRA rel L2 vs fp32 | "
          "sample PSNR vs fp32 LoRA | skipped | s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(f"| {r['layout']} | {r['final_loss']:.4f} | {r['loss_gap_mean']:.2e} / {r['loss_gap_max']:.2e} / "
              f"{100 * r['loss_gap_rel']:.2f}% | {r['lora_rel_l2']:.2e} | {r['sample_psnr_db']:.1f} dB | "
              f"{r['skipped']} | {r['seconds']} |")
    if args.out:
        tmp = Path(args.out).with_suffix(".tmp")
        tmp.write_text(json.dumps({"machine": machine, "trained": trained, "steps": args.steps, "runs": runs,
                                   "lora_effect_psnr_db": 10 * float(np.log10(1 / effect)),
                                   "rows": rows}, indent=2))
        os.replace(tmp, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
