#!/usr/bin/env python
"""Training step through hf_precision.training vs a diffusers-example loop vs all-fp32, paired, in ONE run.

    python benchmarks/bench_training.py                          # tiny + mid SD 1.5 UNet LoRA, bf16 layout (a100), CPU
    python benchmarks/bench_training.py --layout cpu --sizes mid # fp32 layout: measures only the layer's overhead
    python benchmarks/bench_training.py --device cuda --layout a100 --sizes mid,real   # on a GPU

Three loops train the same UNet LoRA (rank 4, AdamW) on one fixed batch (hf_precision.testing.step_work):
  layer:  ``hp.prepare_training(pipe, layout=...)`` then ``tp.loss``/``tp.backward``/``tp.step``.
  hand:   as diffusers' examples/text_to_image/train_text_to_image_lora.py does it: frozen parts ``.to(weight_dtype)``,
          ``unet.add_adapter``, ``cast_training_params(unet, torch.float32)``, the UNet call under
          ``torch.autocast(weight_dtype)``, a GradScaler under fp16 (created on every device type, unlike accelerate).
  fp32:   everything in fp32, no autocast.
After warm-up rounds, each round times one step of each loop, the order rotating from round to round so that
machine load and cache effects hit all three alike; a ratio is the median of the per-round paired ratios, printed
with its quartiles. Beside the times it prints the work of one step of each loop, which does not depend on the
machine or its load: host syncs (``.item()``, ``bool(tensor)``: aten ``_local_scalar_dense``, not counting the
optimizer's own CPU step counters), casts and copies (aten ``_to_copy``/``copy_``, autocast's included), aten ops,
forward-hook calls and Python function calls. Bytes are weights + gradients + optimizer state of the UNet, text
encoder and VAE after the steps.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_precision as hp  # noqa: E402
from hf_precision.testing import make_pipeline  # noqa: E402
from hf_precision.testing.step_work import ExampleLoop, LayerLoop, step_work  # noqa: E402
from hf_precision.training import example_batch  # noqa: E402


def _bytes(modules: list[torch.nn.Module], optimizer: torch.optim.Optimizer) -> int:
    seen: set[int] = set()
    total = 0
    for m in modules:
        for t in (*m.parameters(), *m.buffers()):
            if id(t) not in seen:
                seen.add(id(t))
                total += t.numel() * t.element_size()
                if getattr(t, "grad", None) is not None:
                    total += t.grad.numel() * t.grad.element_size()
    for state in optimizer.state.values():
        total += sum(v.numel() * v.element_size() for v in state.values() if isinstance(v, torch.Tensor))
    return total


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def run(size: str, device: str, layout: str, steps: int, batch_size: int, warmup: int = 3) -> dict[str, Any]:
    base = make_pipeline("sd15", size=size, seed=0)
    layer = LayerLoop(hp.prepare_training(copy.deepcopy(base), device=device, layout=layout, train={"unet": "lora"}))
    hand = ExampleLoop(copy.deepcopy(base), device, layer.dtype)
    fp32 = ExampleLoop(copy.deepcopy(base), device, torch.float32)
    side = 8 if size == "tiny" else 16 if size == "mid" else 64
    batch = example_batch(layer.tp.components["unet"], batch_size, side=side, tokens=77 if size != "tiny" else 4)
    batch = {k: v.to(device) for k, v in batch.items()}
    loops = {"layer": layer, "hand": hand, "fp32": fp32}
    names = list(loops)
    for _ in range(warmup):
        for loop in loops.values():
            loop.step(batch)
    counts = {k: step_work(v, batch) for k, v in loops.items()}
    times: dict[str, list[float]] = {k: [] for k in loops}
    for i in range(steps):
        for name in names[i % 3:] + names[:i % 3]:  # rotate who goes first
            _sync(device)
            start = time.perf_counter()
            loops[name].step(batch)
            _sync(device)
            times[name].append(time.perf_counter() - start)
    nbytes = {k: _bytes(v.modules(), v.opt) for k, v in loops.items()}
    ratios = lambda a, b: _quartiles([x / y for x, y in zip(times[a], times[b])])
    return {"size": size, "compute": str(layer.dtype).removeprefix("torch."), "scaler": layer.tp.scaler is not None,
            "ms": {k: 1e3 * statistics.median(v) for k, v in times.items()},
            "time layer/hand": ratios("layer", "hand"), "time layer/fp32": ratios("layer", "fp32"),
            "time hand/fp32": ratios("hand", "fp32"), "work": counts,
            "bytes": nbytes, "bytes layer/hand": nbytes["layer"] / nbytes["hand"],
            "bytes layer/fp32": nbytes["layer"] / nbytes["fp32"]}


def _ratio(q: tuple[float, float, float]) -> str:
    return f"{q[1]:.3f} [{q[0]:.3f}-{q[2]:.3f}]"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--layout", default="a100", help="device rules for the dtypes (a100: bf16, t4: fp16+scaler, cpu: fp32)")
    parser.add_argument("--sizes", default="tiny,mid")
    parser.add_argument("--steps", type=int, default=10, help="timed rounds (one step of each loop per round)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first")
    parser.add_argument("--batch", type=int, default=2)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    print(f"bench_training: device {args.device}, layout {args.layout}, {args.warmup} warm-up + {args.steps} timed "
          f"rounds, batch {args.batch}; ratios: median [quartiles] of per-round ratios; work per step: layer / hand")
    print("| size | compute | ms/step layer | ms/step hand | ms/step fp32 | time layer/hand | time hand/fp32 "
          "| time layer/fp32 | syncs | casts | aten ops | hook calls | Python calls | MiB layer | MiB hand | MiB fp32 "
          "| bytes layer/hand | bytes layer/fp32 |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for size in args.sizes.split(","):
        r = run(size, args.device, args.layout, args.steps, args.batch, args.warmup)
        mib = {k: v / 2**20 for k, v in r["bytes"].items()}
        w = r["work"]
        pair = lambda key: f"{w['layer'][key]} / {w['hand'][key]}"
        print(f"| {size} | {r['compute']}{' +scaler' if r['scaler'] else ''} | {r['ms']['layer']:.1f} | {r['ms']['hand']:.1f} "
              f"| {r['ms']['fp32']:.1f} | {_ratio(r['time layer/hand'])} | {_ratio(r['time hand/fp32'])} "
              f"| {_ratio(r['time layer/fp32'])} | {pair('syncs')} | {pair('casts')} | {pair('ops')} | {pair('hooks')} "
              f"| {pair('calls')} | {mib['layer']:.1f} | {mib['hand']:.1f} | {mib['fp32']:.1f} "
              f"| {r['bytes layer/hand']:.3f} | {r['bytes layer/fp32']:.3f} |", flush=True)


if __name__ == "__main__":
    main()
