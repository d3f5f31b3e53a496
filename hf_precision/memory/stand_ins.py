"""Meta stand-ins: forwards that replace a submodule's own while a step is counted on the meta device, for modules
whose forward decides its tensors' sizes from values (a mixture of experts routes each token by its scores), which
a meta tensor does not have. A stand-in does what the module's forward does, op for op, with the sizes a value
would give replaced by their expectation; :data:`STAND_INS` holds them by module class name, and
:func:`standing_in` puts them in place around a count (:func:`hf_precision.memory.train_step.step_activations`).
A module that reads values and has no stand-in is still refused by the plan, naming it.
"""

from __future__ import annotations

import contextlib
import functools
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..errors import RecipeError

__all__ = ["STAND_INS", "StandIn", "stand_in", "standing_in"]

StandIn = Callable[..., Any]  # (the module, then the arguments of its forward) -> what its forward returns
STAND_INS: dict[str, StandIn] = {}


def stand_in(class_name: str) -> Callable[[StandIn], StandIn]:
    """Register a meta stand-in for the forward of every module whose class is named ``class_name``; registering a
    name again replaces the earlier one. A user's own is registered the same way, before ``train --plan`` runs.

    Example:
        >>> @stand_in("MyRouter")
        ... def _my_router(module, x):
        ...     return x
        >>> sorted(n for n in STAND_INS if n == "MyRouter")
        ['MyRouter']
        >>> del STAND_INS["MyRouter"]
        >>> stand_in("my router")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: stand_in('my router'): bad class name; allowed: a Python identifier, the module's class name as type(module).__name__ gives it, e.g. 'MOEFeedForwardSwiGLU'
    """
    if not (isinstance(class_name, str) and class_name.isidentifier()):
        raise RecipeError(f"stand_in({class_name!r}): bad class name; allowed: a Python identifier, the module's "
                          f"class name as type(module).__name__ gives it, e.g. 'MOEFeedForwardSwiGLU'")
    return functools.partial(_register, class_name)


def _register(class_name: str, fn: StandIn) -> StandIn:
    STAND_INS[class_name] = fn
    return fn


@contextlib.contextmanager
def standing_in(module: Any) -> Iterator[list[str]]:
    """Within the block, every submodule of ``module`` whose class has a stand-in runs it as its forward; yields the
    names of the submodules replaced, and puts their own forwards back on leaving.

    Example:
        >>> import torch
        >>> @stand_in("Identity")
        ... def _doubled(module, x):
        ...     return 2 * x
        >>> net = torch.nn.Sequential(torch.nn.Identity())
        >>> with standing_in(net) as replaced:
        ...     inside = net(torch.ones(1)).item()
        >>> del STAND_INS["Identity"]
        >>> replaced, inside, net(torch.ones(1)).item()
        (['0'], 2.0, 1.0)
    """
    missing = object()
    replaced: list[tuple[str, Any, Any]] = []
    for name, sub in module.named_modules():
        fn = STAND_INS.get(type(sub).__name__)
        if fn is not None:
            replaced.append((name, sub, sub.__dict__.get("forward", missing)))
            sub.forward = types.MethodType(fn, sub)
    try:
        yield [name for name, _, _ in replaced]
    finally:
        for _, sub, own in replaced:
            if own is missing:
                del sub.forward
            else:
                sub.forward = own


def _share(total: int, experts: int, i: int) -> int:
    """Rows expert ``i`` gets when ``total`` are split as evenly as whole rows allow."""
    return total // experts + (1 if i < total % experts else 0)


@stand_in("MOEFeedForwardSwiGLU")
def _balanced_moe(self: Any, x: Any) -> Any:
    # HiDream's mixture of experts (diffusers 0.42.1 models/transformers/transformer_hidream_image.py:365-404): each
    # token goes to its top_k experts by the gate's scores, so how many rows each expert computes is a value. Here
    # each of the n experts gets tokens * top_k / n rows: the split the gate's auxiliary loss is minimal at (:317-335,
    # alpha * sum over experts of mean score x fraction routed x n: a load-balancing loss, lowest when every expert
    # takes an equal share), the one a router pretrained with it is pushed toward. diffusers' own training path
    # computes that loss and does not apply it (:379 commented out), so a fine-tune's split is the pretrained one;
    # what the step saves for backward does not hang on it anyway: the experts' saved inputs and activations add up
    # to tokens * top_k rows whatever the split, only the transient of the busiest expert moves with it.
    import torch

    wtype, identity, orig_shape = x.dtype, x, x.shape
    _, topk_weight, _ = self.gate(x)  # the gate runs as is: logits, scores, top-k and its aux loss are counted
    x = x.view(-1, x.shape[-1])
    n, k = len(self.experts), self.num_activated_experts
    if self.training and not self._force_inference_output:
        x = x.repeat_interleave(k, dim=0)
        y = torch.empty_like(x, dtype=wtype)
        start = 0
        for i, expert in enumerate(self.experts):
            rows = torch.arange(start, start + _share(x.shape[0], n, i), device=x.device)
            y[rows] = expert(x[rows]).to(dtype=wtype)
            start += rows.shape[0]
        y = (y.view(*topk_weight.shape, -1) * topk_weight.unsqueeze(-1)).sum(dim=1)
        y = y.view(*orig_shape).to(dtype=wtype)
    else:
        y = _balanced_moe_infer(self, x, topk_weight.view(-1, 1)).view(*orig_shape)
    return y + self.shared_experts(identity)


def _balanced_moe_infer(self: Any, x: Any, weights: Any) -> Any:
    # MOEFeedForwardSwiGLU.moe_infer (transformer_hidream_image.py:383-404), no_grad as it is, with the balanced
    # split: each expert gathers its share of the token-expert pairs, weighs them and adds them into the output.
    import torch

    with torch.no_grad():
        cache = torch.zeros_like(x)
        n, k, tokens = len(self.experts), self.num_activated_experts, x.shape[0]
        start = 0
        for i, expert in enumerate(self.experts):
            pairs = torch.arange(start, start + _share(tokens * k, n, i), device=x.device)
            token_idx = pairs // k
            out = expert(x[token_idx])
            out.mul_(weights[pairs])
            cache = cache.to(out.dtype)
            cache.scatter_reduce_(0, token_idx.view(-1, 1).repeat(1, x.shape[-1]), out, reduce="sum")
            start += pairs.shape[0]
    return cache
