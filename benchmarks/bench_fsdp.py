#!/usr/bin/env python
"""Sharded training (FSDP2 under the recipe) vs data parallel vs a hand-written FSDP2 loop, paired, in ONE run.

    python benchmarks/bench_fsdp.py                             # 2 CPU processes (gloo), mid SDXL UNet, full fine-tune
    python benchmarks/bench_fsdp.py --processes 2 --size tiny --method lora --layout t4
    torchrun --nproc_per_node 8 benchmarks/bench_fsdp.py --device cuda --size mid    # on GPUs, one per process

Without a launcher it starts itself under ``torch.distributed.run`` with ``--processes`` processes (OMP_NUM_THREADS=1
each). Every rank builds the same pipeline three times and trains it three ways on its half of one fixed global batch:
  ddp:   ``prepare_training(pipe, layout=...)``, gradients all-reduced and averaged by hand (what
         ``hf-precision train`` does under ``accelerate launch``);
  shard: ``prepare_training(pipe, layout=..., shard=True)``: per-block FSDP2 units in the recipe's dtypes, fp32 island
         units, fp32 reductions;
  hand:  the UNet trained as a hand-written FSDP2 loop would: fp32 weights, ``fully_shard`` on every block and the root
         with ONE ``MixedPrecisionPolicy(param_dtype=<the layout's compute dtype>, reduce_dtype=float32)``, the loss
         written out (noise, DDPM timesteps, MSE), a GradScaler under fp16. (LoRA: adapters injected with peft, the
         frozen base in the same uniform policy.)
After warm-up, each round times one step of each setup, rotating the order from round to round; a ratio is the median
of the per-round paired ratios (quartiles beside it). Bytes per rank: weights (local shards), gradients and AdamW state
held after a step, which do not depend on the machine's load.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--processes", type=int, default=2)
    p.add_argument("--size", default="mid", help="tiny or mid (hf_precision.testing sizes)")
    p.add_argument("--method", choices=("full", "lora"), default="full")
    p.add_argument("--layout", default="a100", help="whose dtype rules (a100: bf16 compute; t4: fp16 + scaler)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch", type=int, default=2, help="per process")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    return p.parse_args(argv)


def _batch(unet: Any, size: int, rank: int, device: str) -> dict[str, Any]:
    import torch

    from hf_precision.training.denoiser_rows import example_batch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    batch = example_batch(unet, size * world, side=16, seed=0)
    gen = torch.Generator().manual_seed(1)
    batch["noise"] = torch.randn(batch["latents"].shape, generator=gen)
    batch["timesteps"] = torch.randint(0, 1000, (size * world,), generator=gen)
    return {k: v[rank * size:(rank + 1) * size].to(device) for k, v in batch.items()}


class Setup:
    """One way of training: ``step()`` runs one optimizer step; ``held()`` the bytes this rank holds."""

    def __init__(self, name: str, args: argparse.Namespace, rank: int):
        import torch

        from hf_precision.testing import make_pipeline
        from hf_precision.training import prepare_training

        self.name = name
        torch.manual_seed(0)
        pipe = make_pipeline("sdxl", size=args.size)
        self.scaler = None
        if name == "hand":
            self._hand(pipe, args)
        else:
            self.tp = prepare_training(pipe, device=args.device, layout=args.layout, train={"unet": args.method},
                                       shard=name == "shard")
            self.unet = self.tp.components["unet"]
            self.params = self.tp.parameters()
            self.others = [m for n, m in self.tp.components.items() if n != "unet"]
        self.opt = torch.optim.AdamW(self.params, lr=1e-5)
        self.batch = _batch(self.unet, args.batch, rank, args.device)

    def _hand(self, pipe: Any, args: argparse.Namespace) -> None:
        import torch
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from hf_precision.recipe import get_recipe
        from hf_precision.training.shard import block_paths

        compute = getattr(torch, get_recipe("sdxl", device=args.layout)["unet"].compute)
        unet = pipe.unet.to(args.device, torch.float32)
        if args.method == "lora":
            from peft import LoraConfig

            unet.requires_grad_(False)
            unet.to(compute)
            unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                        target_modules=["to_q", "to_k", "to_v", "to_out.0"]))
            for p in unet.parameters():
                if p.requires_grad:
                    p.data = p.data.float()
        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
        for path in block_paths(unet):
            fully_shard(unet.get_submodule(path), mp_policy=policy)
        fully_shard(unet, mp_policy=policy)
        self.unet, self.compute = unet, compute
        self.params = [p for p in unet.parameters() if p.requires_grad]
        self.others = [pipe.vae.to(args.device), pipe.text_encoder.to(args.device), pipe.text_encoder_2.to(args.device)]
        alphas = pipe.scheduler.alphas_cumprod.to(args.device)
        self.alphas, self.vae_factor = alphas, pipe.vae_scale_factor
        if compute == torch.float16:
            self.scaler = torch.amp.GradScaler(args.device)

    def _hand_loss(self) -> Any:
        import torch

        b = self.batch
        a = self.alphas[b["timesteps"]].view(-1, 1, 1, 1)
        noisy = a.sqrt() * b["latents"] + (1 - a).sqrt() * b["noise"]
        side = b["latents"].shape[-1] * self.vae_factor  # SDXL's micro-conditioning: pixel sizes, as the pipeline
        time_ids = torch.tensor([[side, side, 0, 0, side, side]], device=noisy.device).repeat(noisy.shape[0], 1)
        added = {"text_embeds": b["pooled_prompt_embeds"].to(self.compute), "time_ids": time_ids.to(self.compute)}
        pred = self.unet(noisy.to(self.compute), b["timesteps"], b["prompt_embeds"].to(self.compute),
                         added_cond_kwargs=added, return_dict=False)[0]
        return torch.nn.functional.mse_loss(pred.float(), b["noise"].float())

    def step(self) -> float:
        import torch.distributed as dist

        if self.name == "hand":
            loss = self._hand_loss()
            if self.scaler is not None:
                self.scaler.scale(loss).backward()
                self.scaler.step(self.opt)
                self.scaler.update()
            else:
                loss.backward()
                self.opt.step()
        else:
            loss = self.tp.loss(self.batch)
            self.tp.backward(loss)
            if self.name == "ddp":
                world = dist.get_world_size()
                for p in self.params:
                    if p.grad is not None:
                        dist.all_reduce(p.grad)
                        p.grad.div_(world)
            self.tp.step(self.opt)
        self.last_held = self.held()
        self.opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    def held(self) -> int:
        import torch
        from torch.distributed.tensor import DTensor

        def local(t: Any) -> int:
            t = t.to_local() if isinstance(t, DTensor) else t
            return t.numel() * t.element_size()

        weights = sum(local(p) for m in [self.unet, *self.others] for p in m.parameters())
        grads = sum(local(p.grad) for p in self.params if p.grad is not None)
        state = sum(local(v) for s in self.opt.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v))
        return weights + grads + state


def worker(args: argparse.Namespace) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo" if args.device == "cpu" else "nccl")
    rank = dist.get_rank()
    setups = [Setup(n, args, rank) for n in ("ddp", "shard", "hand")]
    times: dict[str, list[float]] = {s.name: [] for s in setups}
    for r in range(args.warmup + args.rounds):
        order = setups[r % 3:] + setups[:r % 3]
        for s in order:
            dist.barrier()
            start = time.perf_counter()
            s.step()
            if args.device != "cpu":
                torch.cuda.synchronize()
            elapsed = torch.tensor([time.perf_counter() - start])
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
            if r >= args.warmup:
                times[s.name].append(float(elapsed))
    if rank == 0:
        report(args, setups, times)
    dist.destroy_process_group()


def _ratio(a: list[float], b: list[float]) -> str:
    ratios = sorted(x / y for x, y in zip(a, b))
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return f"{statistics.median(ratios):.2f} (quartiles {q[0]:.2f}-{q[2]:.2f})"


def report(args: argparse.Namespace, setups: list[Setup], times: dict[str, list[float]]) -> None:
    import platform

    import torch

    world = int(os.environ.get("WORLD_SIZE", "1"))
    print(f"bench_fsdp: SDXL UNet ({args.size}) {args.method}, layout {args.layout}, {world} processes on "
          f"{args.device} ({platform.processor() or platform.machine()}, {os.cpu_count()} cores, torch "
          f"{torch.__version__}), batch {args.batch} per process, {args.rounds} paired rounds")
    held = {s.name: s.last_held for s in setups}
    for s in setups:
        print(f"  {s.name:<5} step {statistics.median(times[s.name]) * 1e3:8.1f} ms (median)   rank 0 holds "
              f"{held[s.name] / 2**20:8.2f} MiB (weights, gradients, AdamW state)")
    print(f"  shard / ddp:  step time {_ratio(times['shard'], times['ddp'])}, bytes held {held['shard'] / held['ddp']:.2f}")
    print(f"  shard / hand: step time {_ratio(times['shard'], times['hand'])}, bytes held {held['shard'] / held['hand']:.2f}")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if "RANK" in os.environ:
        worker(args)
        return 0
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                       os.environ.get("PYTHONPATH")]))}
    if args.device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(args.processes), "--master_port",
           str(_free_port()), __file__, *(argv if argv is not None else sys.argv[1:])]
    return subprocess.run(cmd, env=env, check=False).returncode


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


if __name__ == "__main__":
    sys.exit(main())
