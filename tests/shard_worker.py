"""One rank of the sharded-training test (tests/test_train_shard.py), started by torchrun: for each case, the sharded
run on this rank's half of a global batch, and on rank 0 the one-process run of the whole batch; results as JSON."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from hf_precision.testing import make_pipeline
from hf_precision.training import prepare_training
from hf_precision.training.families import example_batch
from hf_precision.training.shard import sharded_bytes

GLOBAL = 4
# (tiny pipeline, method, steps): SD 1.5 and SDXL (UNets, DDPM), Flux (flow, packed latents, no islands) and Wan
# (video, flow, fp32 islands: time embedder and RoPE); the added families take 2 steps each to keep the launch short
CASES = (("sd15", "lora", 3), ("sdxl", "full", 3), ("flux", "lora", 2), ("wan", "full", 2))


def global_batches(denoiser: torch.nn.Module, steps: int) -> list[dict[str, torch.Tensor]]:
    """Fixed batches with their noise, timesteps (DDPM) and noise levels (flow), so a slice of a batch gets what the
    whole batch gets."""
    out = []
    for step in range(steps):
        batch = example_batch(denoiser, GLOBAL, seed=step)
        gen = torch.Generator().manual_seed(100 + step)
        batch["noise"] = torch.randn(batch["latents"].shape, generator=gen)
        batch["timesteps"] = torch.randint(0, 1000, (GLOBAL,), generator=gen)
        batch["sigmas"] = torch.rand(GLOBAL, generator=gen)
        out.append(batch)
    return out


def denoiser_of(tp) -> str:
    return "unet" if "unet" in tp.components else "transformer"


def rank_bytes(tp, opt) -> dict[str, int]:
    """What this rank holds at rest after a backward: every component's weights (the local shards of the sharded
    ones), the trainable gradients and AdamW's state."""
    from torch.distributed.tensor import DTensor

    def local(t):
        t = t.to_local() if isinstance(t, DTensor) else t
        return t.numel() * t.element_size()

    weights = sum(local(p) for m in tp.components.values() for p in m.parameters())
    grads = sum(local(p.grad) for p in tp.parameters() if p.grad is not None)
    state = sum(local(v) for s in opt.state.values() for k, v in s.items() if k != "step" and torch.is_tensor(v))
    return {"weights": weights, "grads": grads, "optimizer": state}


def run(name: str, kind: str, steps: int, shard: bool, rank: int, world: int) -> tuple[list[float], object]:
    torch.manual_seed(0)  # the LoRA initialisation, the same on every rank and in the one-process run
    pipe = make_pipeline(name)
    den = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    tp = prepare_training(pipe, layout="t4", train={den: kind}, shard=shard)
    opt = torch.optim.AdamW(tp.parameters(), lr=1e-3 if kind == "lora" else 1e-4)
    losses = []
    tp.held = {}
    per = GLOBAL // world
    for batch in global_batches(tp.components[den], steps):
        mine = {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}
        loss = tp.loss(mine)
        tp.backward(loss)
        tp.step(opt)
        tp.held = rank_bytes(tp, opt)
        opt.zero_grad(set_to_none=True)
        value = loss.detach().float()
        if shard:
            dist.all_reduce(value)
            value /= world
        losses.append(float(value))
    return losses, tp


def islands(tp) -> dict[str, list[str]]:
    from torch.distributed.fsdp import FSDPModule

    out = {}
    den = denoiser_of(tp)
    for island in tp.applied.islands.get(den, []):
        module = tp.components[den].get_submodule(island)
        if not any(True for _ in module.parameters()):
            continue  # Wan's RoPE: buffers only, nothing to shard
        policy = module._get_fsdp_state()._fsdp_param_group.mp_policy if isinstance(module, FSDPModule) else None
        out[island] = sorted({str(p.to_local().dtype) for p in module.parameters()} | {f"policy {policy.param_dtype}"})
    return out


def skip_together(rank: int) -> dict[str, object]:
    """fp16 LoRA: an inf in rank 1's gradient shard only; every rank must skip the step and halve the scale."""
    torch.manual_seed(0)
    tp = prepare_training(make_pipeline("sd15"), layout="t4", train={"unet": "lora"}, shard=True)
    opt = torch.optim.AdamW(tp.parameters(), lr=1e-3)
    batch = global_batches(tp.components["unet"], 1)[0]
    mine = {k: v[rank * 2:(rank + 1) * 2] for k, v in batch.items()}
    tp.backward(tp.loss(mine))
    if rank == 1:
        first = next(p for p in tp.parameters() if p.grad is not None)
        first.grad.to_local().view(-1)[0] = float("inf")
    before = [p.detach().to_local().clone() for p in tp.parameters()]
    scale = tp.scaler.get_scale()
    stepped = tp.step(opt)
    same = all(torch.equal(b, p.detach().to_local()) for b, p in zip(before, tp.parameters()))
    return {"stepped": stepped, "unchanged": same, "scale": [scale, tp.scaler.get_scale()]}


def check_names_bad_unit(tp) -> str:
    from hf_precision.training.rules import TrainingError

    group = tp.components["unet"].get_submodule("time_embedding")._get_fsdp_state()._fsdp_param_group
    group.mp_policy = dataclasses_replace(group.mp_policy, param_dtype=torch.float16)
    try:
        tp.check()
    except TrainingError as err:
        return str(err)
    return ""


def dataclasses_replace(obj, **kw):
    import dataclasses

    return dataclasses.replace(obj, **kw)


def main() -> None:
    out_path = sys.argv[1]
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    result: dict[str, object] = {}
    for name, kind, steps in CASES:
        losses, tp = run(name, kind, steps, True, rank, world)
        local, whole = sharded_bytes(tp.components[denoiser_of(tp)])
        tp.check()  # the plan's shards pass the preflight
        result[f"{name}-{kind}"] = {"losses": losses, "local": local, "whole": whole, "islands": islands(tp),
                                    "skipped": tp.skipped_steps, "held": tp.held}
        if name == "sdxl":
            result["check"] = check_names_bad_unit(tp)
        if rank == 0:
            result[f"{name}-{kind}"]["reference"] = run(name, kind, steps, False, 0, 1)[0]
        dist.barrier()
    result["skip"] = skip_together(rank)
    with open(f"{out_path}.{rank}.json", "w", encoding="utf-8") as f:
        json.dump(result, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
