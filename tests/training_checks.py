"""What every training test asserts after N steps through the layer (tests/test_training_*.py)."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from hf_precision.recipe.patterns import inside

# Accept the CPU and the CUDA wording of each upstream error.
MATMUL = r"mat1 and mat2 (must|to) have the same dtype"
CONV = r"Input type \((float|c10::Half|c10::BFloat16|torch\.cuda\.\w+)\) and (bias|weight) type"
CLIP_NORM = r"mixed dtype \(CPU\): expect parameter to have scalar type of Float|expected scalar type Float but found Half"
UNSCALE = r"Attempting to unscale FP16 gradients"


def frozen_snapshot(tp: Any) -> dict[str, torch.Tensor]:
    """A copy of every frozen floating tensor of the plan's components (to prove they never change)."""
    return {f"{c}.{n}": t.detach().clone() for c, m in tp.components.items()
            for n, t in m.named_parameters() if not t.requires_grad}


def assert_planned_storage(tp: Any) -> int:
    """Frozen weights are stored as planned (islands fp32, the rest the plan's storage); returns their bytes."""
    total = 0
    for comp, module in tp.components.items():
        if comp not in tp.recipe:
            continue
        plan = tp.recipe[comp]
        islands = frozenset(tp.applied.islands.get(comp, []))
        for name, p in module.named_parameters():
            if p.requires_grad or not p.is_floating_point() or "lora_" in name:
                continue
            want = torch.float32 if inside(name.rpartition(".")[0], islands) else getattr(torch, plan.storage)
            assert p.dtype == want, f"{comp}.{name} is {p.dtype}, planned {want}"
            total += p.numel() * p.element_size()
    return total


def run_steps(tp: Any, batch: Mapping[str, Any], steps: int = 4, lr: float = 1e-2,
              loss_fn: Callable[[], torch.Tensor] | None = None) -> list[float]:
    """N optimizer steps on one fixed batch (same noise and timesteps each step), checking after every step that
    the loss is finite and every trainable parameter is fp32; at the end, that the loss fell and frozen weights are
    bit-identical. Returns the losses."""
    frozen = frozen_snapshot(tp)
    params = tp.parameters()
    assert params, "nothing trains"
    optimizer = torch.optim.AdamW(params, lr=lr)
    losses = []
    for _ in range(steps):
        loss = loss_fn() if loss_fn is not None else tp.loss(batch, generator=torch.Generator().manual_seed(0))
        assert torch.isfinite(loss), f"loss {loss.item()}"
        tp.backward(loss)
        tp.step(optimizer)
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
        assert {p.dtype for p in tp.parameters()} == {tp.stepper.master_dtype}
    assert losses[-1] < losses[0], f"loss did not fall: {losses}"
    for comp, module in tp.components.items():
        for name, t in module.named_parameters():
            key = f"{comp}.{name}"
            if key in frozen:
                assert torch.equal(t, frozen[key]), f"frozen {key} changed"
    return losses


SIZE = r"\d+(?:\.\d+)? [MG]iB"


def _bytes(text: str) -> float:
    number, unit = text.split()
    return float(number) * (2**30 if unit == "GiB" else 2**20)


def assert_plan_output_agrees(out: str) -> dict[str, str]:
    """The printed plan agrees with itself (issue 34: '15.93 GiB > 11.18 GiB', then 'predicted peak: 9.22 GiB fits
    in 11.18 GiB'): each setting tried lists its phases, its peak is the largest of them and names that phase, and its
    verdict follows from that peak; the chosen setting's phase lines, peak and verdict agree the same way. Returns the
    chosen setting's figures (phase -> printed size, and 'peak')."""
    tried = re.findall(rf"^  tried .*?: ((?:[a-z ]+ {SIZE}(?:, )?)+); peak ({SIZE}) \(([a-z ]+)\) (fits in|does NOT fit in) ({SIZE})$",
                       out, re.M)
    for phases_text, peak, phase, verdict, budget in tried:
        phases = dict(re.findall(rf"([a-z][a-z ]*?) ({SIZE})", phases_text))
        assert phases[phase] == peak and _bytes(peak) == max(map(_bytes, phases.values())), phases_text
        assert verdict == "does NOT fit in" and _bytes(peak) > _bytes(budget)  # else it would have been chosen
    assert len(tried) == out.count("  tried "), "a tried line without its phases and verdict"
    phases = dict(re.findall(rf"^  ([a-z ]+?) +peak ({SIZE})$", out, re.M))
    (peak, phase, verdict, budget), = re.findall(rf"^predicted peak: ({SIZE}) \(([a-z ]+)\) (fits in|does NOT fit in) ({SIZE})$",
                                                out, re.M)
    assert set(phases) == {"encode", "train step"} and phases[phase] == peak
    assert _bytes(peak) == max(map(_bytes, phases.values()))
    assert (verdict == "fits in") == (_bytes(peak) <= _bytes(budget))
    return {**phases, "peak": peak}
