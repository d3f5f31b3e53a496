"""One rank of the sharded-training test (tests/test_train_shard.py), started by torchrun: for each case, the sharded
run on this rank's half of a global batch, and on rank 0 the one-process run of the whole batch; results as JSON."""

from __future__ import annotations

import contextlib
import json
import sys

import torch
import torch.distributed as dist

from hf_precision.apps.train.plan import text_tokens
from hf_precision.testing import make_pipeline
from hf_precision.training import prepare_training
from hf_precision.training.denoiser_rows import example_batch
from hf_precision.training.shard import sharded_bytes

# (tiny pipeline, method, steps): SD 1.5 and SDXL (UNets, DDPM), Flux (flow, packed latents, no islands) and Wan
# (video, flow, fp32 islands: time embedder and RoPE); the added families take 2 steps each to keep the launch short
CASES = (("sd15", "lora", 3), ("sdxl", "full", 3), ("flux", "lora", 2), ("wan", "full", 2))


def global_batches(denoiser: torch.nn.Module, steps: int, size: int = 4, tokens: int = 4) -> list[dict[str, torch.Tensor]]:
    """Fixed batches with their noise, timesteps (DDPM) and noise levels (flow), so a slice of a batch gets what the
    whole batch gets; 8x8 latents (2 latent frames for video), ``tokens`` text tokens."""
    out = []
    for step in range(steps):
        batch = example_batch(denoiser, size, seed=step, tokens=tokens)
        gen = torch.Generator().manual_seed(100 + step)
        batch["noise"] = torch.randn(batch["latents"].shape, generator=gen)
        batch["timesteps"] = torch.randint(0, 1000, (size,), generator=gen)
        batch["sigmas"] = torch.rand(size, generator=gen)
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


class TensorPeak:
    """High-water mark of the bytes of tensors allocated inside (``with TensorPeak() as peak``), on any device: every
    op's new outputs (a TorchDispatchMode; outputs that alias an input, in-place and views, are not new), alive while
    Python references them, and FSDP2's unsharded parameters, whose storages it resizes outside any op."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self.refs: dict[int, list[int]] = {}

    def _bump(self, delta: int) -> None:
        self.live += delta
        self.peak = max(self.peak, self.live)

    def add(self, t: torch.Tensor) -> None:
        import weakref

        from torch.distributed.tensor import DTensor

        t = t._local_tensor if isinstance(t, DTensor) else t
        key = t.untyped_storage()._cdata
        entry = self.refs.setdefault(key, [0, 0])
        if entry[1] == 0:
            entry[0] = t.untyped_storage().nbytes()
            self._bump(entry[0])
        entry[1] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is not None:
            entry[1] -= 1
            if entry[1] <= 0:
                self._bump(-entry[0])
                del self.refs[key]

    def resized(self, tensor: torch.Tensor, before: int) -> None:
        delta = tensor.untyped_storage().nbytes() - before
        entry = self.refs.get(tensor.untyped_storage()._cdata)
        if entry is not None:
            entry[0] += delta
        self._bump(delta)

    def __enter__(self) -> "TensorPeak":
        from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten

        tracker = self

        class Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                returns = func._schema.returns
                flat = tree_flatten(out)[0]
                for i, t in enumerate(flat):
                    aliased = i < len(returns) and returns[i].alias_info is not None
                    if isinstance(t, torch.Tensor) and not aliased:
                        tracker.add(t)
                return out

        def counted(original):
            def wrapper(tensor):
                before = tensor.untyped_storage().nbytes()
                original(tensor)
                tracker.resized(tensor, before)
            return wrapper

        self._patched = [(mod, name, getattr(mod, name)) for mod in (_fsdp_param, _fsdp_param_group)
                         for name in ("alloc_storage", "free_storage") if hasattr(mod, name)]
        for mod, name, original in self._patched:
            setattr(mod, name, counted(original))
        self._mode = Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for mod, name, original in self._patched:
            setattr(mod, name, original)


def run(name: str, kind: str, steps: int, shard: bool, rank: int, world: int, size: int) -> tuple[list[float], object]:
    torch.manual_seed(0)  # the LoRA initialisation, the same on every rank and in the one-process run
    pipe = make_pipeline(name)
    den = "unet" if getattr(pipe, "unet", None) is not None else "transformer"
    tp = prepare_training(pipe, layout="t4", train={den: kind}, shard=shard)
    opt = torch.optim.AdamW(tp.parameters(), lr=1e-3 if kind == "lora" else 1e-4)
    losses = []
    tp.held = {}
    per = size // world
    # the text tokens the per-rank plan counts activations for (77 for CLIP pipelines, else 512)
    tokens = text_tokens({n: ["diffusers", type(m).__name__] for n, m in pipe.components.items() if m is not None})
    for i, batch in enumerate(global_batches(tp.components[den], steps, size, tokens)):
        mine = {k: v[rank * per:(rank + 1) * per] for k, v in batch.items()}
        # the last step's tensor peak: what the rank holds before it (weights, AdamW state), and what the step allocates
        before = sum(rank_bytes(tp, opt).values())
        with TensorPeak() if i == steps - 1 else contextlib.nullcontext() as peak:
            loss = tp.loss(mine)
            tp.backward(loss)
            tp.step(opt)
        tp.held = rank_bytes(tp, opt)
        if peak is not None:
            tp.held["peak"] = before + peak.peak
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


def expected_share(module: torch.nn.Module, world: int, rank: int) -> int:
    """This rank's bytes of ``module``'s sharded parameters as the plan computes them (rank_share), from their whole
    shapes: the 3-process test checks FSDP2's uneven split against it."""
    from torch.distributed.tensor import DTensor

    from hf_precision.training.shard import rank_share

    whole = [torch.empty(p.shape, dtype=p.dtype, device="meta") for p in module.parameters() if isinstance(p, DTensor)]
    return rank_share(whole, world, rank=rank)


PROGRAM_STEPS = 3


def program(model: str, data: str, out: str) -> int:
    """`hf-precision train --shard --no-cache` in this launch's process group: the frozen VAE and text encoder run at
    every step, sharded or replicated as the per-rank plan decides (a sharded VAE encodes under FSDP2); 1 sample per
    rank, as one process with --batch-size 2 (the test's reference)."""
    from hf_precision.cli import main as cli

    return cli(["train", "--model", model, "--data", data, "--out", out, "--device", "cpu", "--layout", "t4",
                "--resolution", "32", "--steps", str(PROGRAM_STEPS), "--lora-rank", "4", "--quiet", "--shard",
                "--no-cache"])


def main() -> None:
    """``shard_worker.py OUT [CASE,...] [--program MODEL DATA RUN_OUT]``: the cases named (``sd15-lora``), or all;
    each rank takes 2 samples of a global batch of 2 x world; ``--program``: then :func:`program` on MODEL."""
    args = sys.argv[1:]
    run_program = None
    if "--program" in args:
        at = args.index("--program")
        run_program, args = args[at + 1:at + 4], args[:at]
    out_path = args[0]
    only = args[1].split(",") if len(args) > 1 else None
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    size = 2 * world
    result: dict[str, object] = {}
    for name, kind, steps in CASES:
        if only is not None and f"{name}-{kind}" not in only:
            continue
        losses, tp = run(name, kind, steps, True, rank, world, size)
        den = tp.components[denoiser_of(tp)]
        local, whole = sharded_bytes(den)
        tp.check()  # the plan's shards pass the preflight
        result[f"{name}-{kind}"] = {"losses": losses, "local": local, "whole": whole, "islands": islands(tp),
                                    "skipped": tp.skipped_steps, "held": tp.held,
                                    "frozen": {c: f.sharded for c, f in tp.shard.frozen.items()},
                                    "expected": expected_share(den, world, rank)}
        if name == "sdxl":
            result["check"] = check_names_bad_unit(tp)
        if rank == 0:
            result[f"{name}-{kind}"]["reference"] = run(name, kind, steps, False, 0, 1, size)[0]
        dist.barrier()
    if only is None:
        result["skip"] = skip_together(rank)
    if run_program is not None:
        result["program"] = program(*run_program)
    with open(f"{out_path}.{rank}.json", "w", encoding="utf-8") as f:
        json.dump(result, f)
    if dist.is_initialized():  # the program (--program) ends the group it ran in
        dist.destroy_process_group()

if __name__ == "__main__":
    main()
