#!/usr/bin/env python
"""Peak memory of SVD image-to-video against ``--decode-chunk-size``, measured on an SVD-shaped model (no weights).

Builds ``hf_precision.testing.pipelines.make_svd(size="mid")`` (random weights, 168.5M parameters: the SVD UNet's 4 levels
with temporal blocks at 0.3x width, the full-depth temporal VAE decoder at 0.5x width), saves it once, then runs
``scripts/generate_video.py`` in a fresh subprocess per chunk size so every row starts from an empty process and
its peak RSS (``VmHWM``) belongs to that run alone. The folder is saved with an fp16 variant, as SVD-xt is on the
Hub, so loading reads half-size files. Prints a markdown table.

    python benchmarks/video_memory.py                        # 8 frames, 320x320, 1 step, chunks 1 2 4 8, on CPU
    python benchmarks/video_memory.py --device cuda --height 576 --width 1024 --frames 14 --chunks 1,2,4,8,14

On CUDA the numbers are ``torch.cuda.max_memory_allocated`` instead of RSS.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "generate_video.py"
# generate_video.py's summary line; its sizes are format_bytes' (decimal units, e.g. "490.9 MB"), read with parse_size
SIZE = r"[\d.]+ [kMGT]?i?B"
LINE = re.compile(rf"peak memory ({SIZE}) \((?P<kind>[^;]+); ({SIZE}) before decoding\); ([\d.na]+) s per denoising "
                  r"step; decode ([\d.]+) s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--frames", type=int, default=8)
    p.add_argument("--height", type=int, default=320)
    p.add_argument("--width", type=int, default=320)
    p.add_argument("--steps", type=int, default=1)
    p.add_argument("--chunks", default="1,2,4,8", help="decode chunk sizes, comma separated")
    p.add_argument("--device", default="cpu")
    p.add_argument("--size", default="mid", help="synthetic size preset of make_svd (tiny, mid)")
    p.add_argument("--workdir", default=None, help="keep the saved model and outputs here (default: a temp folder)")
    p.add_argument("--set", dest="set_", action="append", default=[], help="passed on to generate_video.py")
    args = p.parse_args(argv)

    import numpy as np
    from PIL import Image

    from hf_precision.testing.pipelines import count_parameters, make_svd, save_pipeline
    from hf_precision.units import parse_size

    work = Path(args.workdir or tempfile.mkdtemp(prefix="hf_precision_video_memory_"))
    model = work / f"svd-{args.size}"
    if not (model / "model_index.json").is_file():
        pipe = make_svd(size=args.size)
        params = count_parameters(pipe)
        save_pipeline(pipe, model, fp16_variant=True)  # like the Hub's SVD-xt: the load reads the half-size files
        del pipe
        print(f"saved make_svd(size={args.size!r}) to {model}: "
              + ", ".join(f"{k} {v / 1e6:.1f}M" for k, v in params.items()), flush=True)
    image = work / "input.png"
    y, x = np.mgrid[0:args.height, 0:args.width]
    Image.fromarray(np.stack([x * 255 // max(1, args.width - 1), y * 255 // max(1, args.height - 1),
                              np.full_like(x, 128)], axis=-1).astype(np.uint8)).save(image)

    rows = []
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    for chunk in [int(c) for c in args.chunks.split(",")]:
        cmd = [sys.executable, str(SCRIPT), "--model", str(model), "--image", str(image),
               "--out", str(work / f"chunk{chunk}.mp4"), "--frames", str(args.frames), "--steps", str(args.steps),
               "--height", str(args.height), "--width", str(args.width), "--decode-chunk-size", str(chunk),
               "--device", args.device, "--quiet", *[f"--set={s}" for s in args.set_]]
        start = time.perf_counter()
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
        wall = time.perf_counter() - start
        found = LINE.search(proc.stdout)
        if proc.returncode or not found:
            print(proc.stdout, proc.stderr, file=sys.stderr)
            return 1
        recipe = next((line for line in proc.stdout.splitlines() if line.startswith("svd recipe")), "")
        peak, kind, before, per_step, decode = found.group(1), found.group("kind"), found.group(3), found.group(4), found.group(5)
        peak, before = parse_size(peak) / 2**20, parse_size(before) / 2**20  # MiB, as the table says
        rows.append((chunk, peak, before, float(decode), float(per_step), wall))
        print(f"chunk {chunk}: peak {peak:.1f} MiB, before decoding {before:.1f} MiB, decode {decode} s, {wall:.1f} s in all",
              file=sys.stderr, flush=True)

    what = "peak RSS" if args.device == "cpu" else "peak allocated"
    print()
    print(f"make_svd(size={args.size!r}), {args.frames} frames at {args.width}x{args.height}, {args.steps} step(s), "
          f"device {args.device} ({platform.processor() or platform.machine()}, {os.cpu_count()} CPUs); {recipe}")
    print(f"memory: {kind}\n")
    print(f"| --decode-chunk-size | {what} (MiB) | {what} before decoding (MiB) | decode (s) | s / step | run (s) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for chunk, peak_, before_, decode_, step_, wall_ in rows:
        print(f"| {chunk} | {peak_:.0f} | {before_:.0f} | {decode_:.1f} | {step_:.1f} | {wall_:.1f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
