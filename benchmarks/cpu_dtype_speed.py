#!/usr/bin/env python
"""How fast this CPU computes fp32, bf16 and fp16: whole UNet calls, single ops, and hook overhead.

    python benchmarks/cpu_dtype_speed.py               # default run: about 1 minute on 2 cores
    python benchmarks/cpu_dtype_speed.py --repeats 15  # tighter medians
    python benchmarks/cpu_dtype_speed.py --no-mid      # skip the 33M-parameter UNet

Prints markdown tables (the ones in docs/facts.md#f9-cpu-speed-fp32-vs-bf16-vs-fp16 came from this script), headed by
the machine: CPU model, the ISA flags that decide half-precision speed (avx512_bf16, avx512_fp16, amx_*),
torch's CPU capability and the thread count.

Timings are paired and interleaved: every repeat runs fp32, bf16 and fp16 back to back in a rotating order, so
drift on a shared machine (other jobs, frequency changes) hits all three alike. Each cell is the median over
repeats; the ratio columns are medians of the per-repeat ratios. The max |diff| column compares each half-precision
output with the fp32 output of the same weights and input (random weights, so it shows rounding, not quality).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch
import torch.nn.functional as F

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16", "amx_fp16")


def machine() -> str:
    """One line naming the CPU, its half-precision ISA flags, torch and the thread count."""
    name, flags = platform.processor() or platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith("model name") and name in ("", platform.machine(), platform.processor()):
                    name = line.split(":", 1)[1].strip()
                if line.startswith(("flags", "Features")):
                    flags |= set(line.split(":", 1)[1].split())
    except OSError:  # macOS / Windows: no /proc
        pass
    present = [f for f in FLAGS if f in flags] or ["(flags not readable)"]
    return (f"{name}; flags: {' '.join(present)}; torch {torch.__version__}, CPU capability "
            f"{torch.backends.cpu.get_cpu_capability()}; {torch.get_num_threads()} threads")


def unet(width: tuple[int, ...]):
    """An SDXL-style UNet (text_time conditioning) with the given block widths, random weights, fp32."""
    from diffusers import UNet2DConditionModel

    levels = len(width)
    torch.manual_seed(0)
    return UNet2DConditionModel(
        block_out_channels=width, layers_per_block=1, norm_num_groups=min(32, width[0]),
        down_block_types=("DownBlock2D",) + ("CrossAttnDownBlock2D",) * (levels - 1),
        up_block_types=("CrossAttnUpBlock2D",) * (levels - 1) + ("UpBlock2D",),
        attention_head_dim=8, use_linear_projection=True, cross_attention_dim=64,
        addition_embed_type="text_time", addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8,
        sample_size=32,
    ).eval()


def unet_inputs(side: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    return {
        "sample": torch.randn(2, 4, side, side, generator=gen),
        "timestep": torch.tensor(500),
        "encoder_hidden_states": torch.randn(2, 77, 64, generator=gen),
        "added_cond_kwargs": {"text_embeds": torch.randn(2, 32, generator=gen), "time_ids": torch.randn(2, 6, generator=gen)},
    }


def cast(value, dtype):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.to(dtype)
    if isinstance(value, dict):
        return {k: cast(v, dtype) for k, v in value.items()}
    return value


def paired(runs: dict[str, callable], repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per variant, and the median per-repeat ratio of each variant to the first one."""
    names = list(runs)
    for name in names:  # warm-up: first calls pick kernels and allocate
        runs[name]()
    times = {name: [] for name in names}
    ratios = {name: [] for name in names}
    for rep in range(repeats):
        order = names[rep % len(names):] + names[:rep % len(names)]
        this = {}
        for name in order:
            start = time.perf_counter()
            runs[name]()
            this[name] = time.perf_counter() - start
        for name in names:
            times[name].append(this[name])
            ratios[name].append(this[name] / this[names[0]])
    return ({n: statistics.median(t) for n, t in times.items()}, {n: statistics.median(r) for n, r in ratios.items()})


def model_row(label: str, model, inputs: dict, repeats: int) -> str:
    copies = {name: (model.to(dtype) if name == "fp32" else _copy(model).to(dtype), cast(inputs, dtype))
              for name, dtype in DTYPES.items()}
    outputs = {}

    def runner(name):
        def run():
            with torch.inference_mode():
                outputs[name] = copies[name][0](**copies[name][1]).sample
        return run

    med, ratio = paired({name: runner(name) for name in DTYPES}, repeats)
    diff = [f"{(outputs[n].float() - outputs['fp32']).abs().max().item():.1e}" for n in ("bf16", "fp16")]
    params = sum(p.numel() for p in model.parameters()) / 1e6
    return (f"| {label} ({params:.2f}M params) | " + " | ".join(f"{med[n] * 1e3:.1f}" for n in DTYPES)
            + f" | {ratio['bf16']:.2f} / {ratio['fp16']:.2f} | {diff[0]} / {diff[1]} |")


def _copy(model):
    import copy

    return copy.deepcopy(model)


def op_rows(repeats: int) -> list[str]:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(2, 128, 32, 32, generator=gen)
    conv = torch.randn(128, 128, 3, 3, generator=gen) * 0.02
    tokens = torch.randn(2, 1024, 640, generator=gen)
    lin = torch.randn(2560, 640, generator=gen) * 0.02
    q = torch.randn(2, 10, 1024, 64, generator=gen)
    ops = {  # tensors are cast once per dtype, outside the timed call
        "conv2d 3x3, 128 ch, 32x32": ((x, conv), lambda a, w: F.conv2d(a, w, padding=1)),
        "linear 640->2560, 2048 tokens": ((tokens, lin), F.linear),
        "group_norm 32 groups, 128 ch, 32x32": ((x,), lambda a: F.group_norm(a, 32)),
        "scaled_dot_product_attention, 1024 tokens": ((q, q, q), F.scaled_dot_product_attention),
    }
    rows = []
    for label, (tensors, op) in ops.items():
        runs = {}
        for name, dtype in DTYPES.items():
            cast_tensors = [t.to(dtype) for t in tensors]
            runs[name] = lambda op=op, ts=cast_tensors: op(*ts)
        med, ratio = paired(runs, repeats)
        rows.append(f"| {label} | " + " | ".join(f"{med[n] * 1e3:.2f}" for n in DTYPES)
                    + f" | {ratio['bf16']:.2f} / {ratio['fp16']:.2f} |")
    return rows


def hook_rows(model, inputs: dict, repeats: int) -> list[str]:
    """fp32 UNet call: bare, with one input-casting pre-hook on the whole model, with no-op hooks on every leaf."""
    leaves = [m for m in model.modules() if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d, torch.nn.GroupNorm, torch.nn.LayerNorm))]
    half_inputs = cast(inputs, torch.float16)

    def boundary(module, args, kwargs):  # what one entry hook does: cast float inputs to the weights' dtype
        return cast(args, torch.float32), cast(kwargs, torch.float32)

    def run_with(handles_factory, call_inputs):
        def run():
            handles = handles_factory()
            try:
                with torch.inference_mode():
                    model(**call_inputs)
            finally:
                for handle in handles:
                    handle.remove()
        return run

    runs = {
        "no hooks (fp32 inputs)": run_with(lambda: [], inputs),
        "1 entry hook casting fp16 inputs": run_with(
            lambda: [model.register_forward_pre_hook(boundary, with_kwargs=True)], half_inputs),
        f"no-op hook on each of {len(leaves)} leaves": run_with(
            lambda: [m.register_forward_pre_hook(lambda mod, args: None) for m in leaves], inputs),
    }
    med, ratio = paired(runs, repeats)
    return [f"| {name} | {med[name] * 1e3:.1f} | {ratio[name]:.2f} |" for name in runs]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7, help="paired repeats per row (default 7)")
    parser.add_argument("--no-mid", action="store_true", help="skip the 33M-parameter UNet")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's choice)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    from diffusers.utils import logging

    logging.set_verbosity_error()  # ModelMixin.to warns on every dtype cast, even with no fp32 modules

    print(f"Machine: {machine()}\n")
    print("| UNet call, batch 2 | fp32 ms | bf16 ms | fp16 ms | bf16 / fp16 time vs fp32 | max abs diff vs fp32 (bf16 / fp16) |")
    print("|---|---|---|---|---|---|")
    small = unet((32, 64))
    print(model_row("small SDXL-style UNet (32/64), 16x16 latents", small, unet_inputs(16), args.repeats), flush=True)
    mid = None
    if not args.no_mid:
        mid = unet((64, 128, 256))
        print(model_row("mid SDXL-style UNet (64/128/256), 32x32 latents", mid, unet_inputs(32), args.repeats), flush=True)

    print("\n| op | fp32 ms | bf16 ms | fp16 ms | bf16 / fp16 time vs fp32 |")
    print("|---|---|---|---|---|")
    for row in op_rows(args.repeats):
        print(row, flush=True)

    print("\n| fp32 UNet call | hooks | ms | time vs no hooks |")
    print("|---|---|---|---|")
    for label, model, side in (("small", small, 16), ("mid", mid, 32)):
        if model is not None:
            for row in hook_rows(model.float(), unet_inputs(side), args.repeats):
                print(f"| {label} ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params) " + row, flush=True)


if __name__ == "__main__":
    main()
