"""tp.check(): find what would fail before the first step, and name the module, its dtypes and its devices.

Static checks first (placement, islands, masters), then one tiny forward and backward with the module stack
traced, so a failure deep inside torch names "unet.down_blocks.0.attentions.0.proj_in: weight float16 on cpu".
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..recipe.patterns import inside
from ..runtime.placement import same_device
from . import denoiser_rows
from .control import control_stand_in
from .rules import TrainingError
from .shard import shard_problems

__all__ = ["preflight", "static_problems"]


def static_problems(tp: Any) -> list[str]:
    """Placement, island and master problems, each naming the module path."""
    problems: list[str] = []
    for comp, module in tp.components.items():
        planned = tp.applied.devices.get(comp)
        islands = frozenset(tp.applied.islands.get(comp, []))
        seen_devices: set[str] = set()
        for name, t in [*module.named_parameters(), *module.named_buffers()]:
            owner = f"{comp}.{name.rpartition('.')[0] or name}"
            if t.device.type == "meta":
                problems.append(f"{owner}: {name.rpartition('.')[2]} is on the meta device (never loaded or offloaded "
                                f"without a hook); load it or move it: pipe.{comp}.to({planned!r})")
            elif planned and not same_device(planned, t.device) and str(t.device) not in seen_devices:
                seen_devices.add(str(t.device))
                problems.append(f"{owner}: on {t.device}, the rest of {comp} is planned on {planned}; move it: "
                                f"pipe.{comp}.to({planned!r})")
            if islands and t.is_floating_point() and not t.requires_grad and t.dtype != torch.float32 \
                    and inside(name.rpartition(".")[0], islands):
                problems.append(f"{owner}: {str(t.dtype).removeprefix('torch.')} inside the fp32 island of {comp}; "
                                f"something cast it after the recipe was applied (re-run prepare_training)")
    problems += shard_problems(tp)
    for name, p in tp.named_parameters():
        if p.dtype != tp.stepper.master_dtype:
            problems.append(f"{name}: trainable but {str(p.dtype).removeprefix('torch.')}, not the master dtype "
                            f"{str(tp.stepper.master_dtype).removeprefix('torch.')}; tp.restore_masters() fixes it")
    return problems


def _describe(module: torch.nn.Module) -> str:
    own = [(n, t) for n, t in module.named_parameters(recurse=False)] or list(module.named_parameters())[:2]
    return ", ".join(f"{n} {str(t.dtype).removeprefix('torch.')} on {t.device}" for n, t in own) or "no parameters"


def _traced_run(tp: Any, module: torch.nn.Module, run: Any) -> None:
    stack: list[str] = []
    names = {id(m): n for n, m in module.named_modules()}

    def pre(m: torch.nn.Module, args: Any) -> None:
        stack.append(names.get(id(m), "?"))

    def post(m: torch.nn.Module, args: Any, out: Any) -> None:
        if stack:
            stack.pop()

    handles = []
    for m in module.modules():
        handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
    try:
        run()
    except Exception as err:  # noqa: BLE001 - re-raised as one error naming the module
        if isinstance(err, TrainingError) and not stack:  # tp.loss's own refusal, outside every module: as it is
            raise TrainingError(f"tp.check: {err}") from err
        where = stack[-1] if stack else ""
        sub = module.get_submodule(where) if where else module
        path = f"{tp.denoiser_name}.{where}" if where else str(tp.denoiser_name)
        raise TrainingError(f"tp.check: a training step fails in {path} ({type(sub).__name__}: {_describe(sub)}): "
                            f"{type(err).__name__}: {err}") from err
    finally:
        for h in handles:
            h.remove()


def preflight(tp: Any, batch: Mapping[str, Any] | None) -> None:
    problems = static_problems(tp)
    if problems:
        raise TrainingError([f"tp.check: {p}" for p in problems])
    if tp.denoiser_name not in tp.components:
        return
    module = tp.components[tp.denoiser_name]
    denoiser_rows.row_of(module)
    if batch is None:
        batch = denoiser_rows.example_batch(module)
        batch.update(control_stand_in(tp, batch["latents"]))  # a trained ControlNet refuses a step without one
    batch = dict(batch)
    batch = {k: (v[:1] if isinstance(v, torch.Tensor) and v.dim() > 0 and k != "sigmas" else v) for k, v in batch.items()}

    def run() -> None:
        loss = tp.loss(batch, generator=torch.Generator().manual_seed(0))
        if not bool(torch.isfinite(loss)):
            raise FloatingPointError(f"the loss is {loss.item()}")
        if loss.requires_grad:
            loss.backward()

    try:
        _traced_run(tp, module, run)
    finally:
        for p in tp.parameters():
            p.grad = None
