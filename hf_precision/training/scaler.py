"""Backward and optimizer steps: a GradScaler iff compute is fp16, checked masters, counted skips, bf16 rounding.

torch's ``GradScaler`` refuses fp16 gradients deep inside ``unscale_`` ("Attempting to unscale FP16 gradients");
this module checks every optimizer parameter first and names the one at fault. accelerate turns fp16 autocast and
the scaler off on CPU without a word (accelerate src/accelerate/accelerator.py, ``self.device.type != "cpu"``);
here the scaler runs on every device type, CPU included (``torch.amp.GradScaler("cpu")``).
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Iterable
from itertools import chain
from typing import Any

import torch

from .rules import TrainingError

__all__ = ["Stepper", "stochastic_round_"]

_PARAMS, _DTYPE, _GRAD = operator.itemgetter("params"), operator.attrgetter("dtype"), operator.attrgetter("grad")
_NOT_NONE = functools.partial(operator.is_not, None)


def stochastic_round_(target: torch.Tensor, value: torch.Tensor, generator: torch.Generator | None = None) -> None:
    """Write fp32 ``value`` into bf16 ``target``, rounding up or down with probability by distance, so updates below
    half a bf16 step survive in expectation (as OneTrainer's bf16_stochastic_rounding.py and SimpleTuner do).

    Example:
        >>> t = torch.ones(10000, dtype=torch.bfloat16)
        >>> stochastic_round_(t, torch.full((10000,), 1.0 + 1e-3), torch.Generator().manual_seed(0))
        >>> abs(t.float().mean().item() - 1.001) < 2e-4
        True
    """
    bits = value.detach().float().contiguous().view(torch.int32)
    noise = torch.randint(0, 1 << 16, bits.shape, dtype=torch.int32, device=bits.device, generator=generator)
    rounded = ((bits + noise) & -65536).view(torch.float32)  # clear the 16 bits bf16 drops, after a random carry
    target.copy_(rounded.to(torch.bfloat16))


class Stepper:
    """Owns loss scaling and the master-dtype check for one training plan."""

    def __init__(self, device_type: str, fp16: bool, master: str):
        self.master = master
        self.master_dtype = torch.bfloat16 if master == "bf16-sr" else torch.float32
        self.scaler = torch.amp.GradScaler(device_type) if fp16 else None
        self.skipped = 0
        self.steps = 0
        self.generator: torch.Generator | None = None

    def backward(self, loss: torch.Tensor, accelerator: Any = None) -> None:
        if accelerator is not None and getattr(accelerator, "scaler", None) is not None:
            accelerator.backward(loss)  # accelerate's own scaler scales; its optimizer wrapper unscales and counts
            return
        scaled = self.scaler.scale(loss) if self.scaler is not None else loss
        if accelerator is not None:
            accelerator.backward(scaled)
        else:
            scaled.backward()

    def check(self, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> None:
        """Raise naming every optimizer parameter that is not in the master dtype (before torch would)."""
        # Runs before every step: one pass in C (map/attrgetter); names are looked up only when something is wrong.
        params = list(chain.from_iterable(map(_PARAMS, optimizer.param_groups)))
        dtypes = set(map(_DTYPE, params))
        dtypes.update(map(_DTYPE, filter(_NOT_NONE, map(_GRAD, params))))
        if dtypes <= {self.master_dtype}:
            return
        bad = [f"{names.get(id(p), '<a parameter not planned for training>')} ({str(p.dtype).removeprefix('torch.')})"
               for group in optimizer.param_groups for p in group["params"]
               if p.dtype != self.master_dtype or (p.grad is not None and p.grad.dtype != self.master_dtype)]
        if bad:
            want = str(self.master_dtype).removeprefix("torch.")
            raise TrainingError(
                f"tp.step: {len(bad)} optimizer parameter(s) are not {want} master weights: {', '.join(bad[:5])}"
                f"{' ...' if len(bad) > 5 else ''}. Something cast them after prepare_training (pipe.to(dtype) during "
                f"validation: huggingface/diffusers#13124; a resume that casts: #6482); use `with tp.sampling()` for "
                f"validation and tp.load_state_dict for resume, or call tp.restore_masters() before stepping")

    def step(self, optimizer: torch.optim.Optimizer, names: dict[int, str]) -> bool:
        """One optimizer step; False when the scaler skipped it (non-finite gradients)."""
        self.check(optimizer, names)
        self.steps += 1
        inner_scaler = getattr(optimizer, "scaler", None)  # accelerate's AcceleratedOptimizer with its own scaler
        if inner_scaler is not None:
            optimizer.step()
            skipped = bool(getattr(optimizer, "step_was_skipped", False))
        elif self.scaler is not None:
            skipped = self._scaled_step(optimizer)
        elif self.master == "bf16-sr":
            self._rounded_step(optimizer)
            skipped = False
        else:
            optimizer.step()
            skipped = False
        self.skipped += int(skipped)
        return not skipped

    def _scaled_step(self, optimizer: torch.optim.Optimizer) -> bool:
        # GradScaler calls optimizer.step only for finite gradients (grad_scaler.py, _maybe_opt_step): seeing the
        # call costs no host sync, comparing get_scale() two. Optimizers that take the scaler into their own step
        # (`_step_supports_amp_scaling`, fused Adam) are always called, so for them the scale says it.
        scaler = self.scaler
        assert scaler is not None
        own = getattr(optimizer, "__dict__", {}).get("step")  # a step someone set on the instance before: restored
        if getattr(optimizer, "_step_supports_amp_scaling", False) or not hasattr(optimizer, "__dict__"):
            before = scaler.get_scale()
            scaler.step(optimizer)
            scaler.update()
            return scaler.get_scale() < before
        called: list[bool] = []
        step = optimizer.step

        def counted(*args: Any, **kwargs: Any) -> Any:
            called.append(True)
            return step(*args, **kwargs)

        optimizer.step = counted  # type: ignore[method-assign]  # as accelerate's patch_optimizer_step does
        try:
            scaler.step(optimizer)
        finally:
            if own is None:
                del optimizer.step
            else:
                optimizer.step = own  # type: ignore[method-assign]
        scaler.update()
        return not called

    def _rounded_step(self, optimizer: torch.optim.Optimizer) -> None:
        # The optimizer steps an fp32 view of each bf16 weight; the result goes back with stochastic rounding.
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        stored = [(p, p.data, p.grad) for p in params]
        for p in params:
            p.data = p.data.float()
            p.grad = p.grad.float()
        try:
            optimizer.step()
        finally:
            for p, data, grad in stored:
                stochastic_round_(data, p.data, self.generator)
                p.data, p.grad = data, grad

    def state_dict(self) -> dict[str, Any]:
        return {"scaler": self.scaler.state_dict() if self.scaler is not None else None,
                "skipped_steps": self.skipped, "steps": self.steps, "master": self.master}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if (state.get("scaler") is None) != (self.scaler is None):
            have = "uses" if self.scaler is not None else "does not use"
            raise TrainingError(f"tp.load_state_dict: the saved state was made by a plan that "
                                f"{'did not use' if state.get('scaler') is None else 'used'} a GradScaler; this plan "
                                f"{have} one (another device layout?). Resume with the layout it was saved under")
        if self.scaler is not None:
            self.scaler.load_state_dict(state["scaler"])
        self.skipped = int(state.get("skipped_steps", 0))
        self.steps = int(state.get("steps", 0))


def parameter_names(named: Iterable[tuple[str, torch.Tensor]]) -> dict[int, str]:
    return {id(p): n for n, p in named}
