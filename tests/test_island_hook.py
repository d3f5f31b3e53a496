"""The float32 island hook's per-call path: what it casts, what it leaves alone, and the form of its casts.

An island hook runs on every call of every island (166 in the benchmark's every-norm stress test), so its fast path
must stay both cheap and exactly as correct as the general one.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode

from hf_precision.runtime.hooks import EntryHook, IslandHook, attach


def _island() -> tuple[torch.nn.Module, IslandHook]:
    torch.manual_seed(0)
    root = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.LayerNorm(4)).to(torch.bfloat16)
    root[1].float()
    reader = EntryHook("unet", root, root, compute=torch.bfloat16, storage=torch.bfloat16, output="compute",
                       islands=["1"])
    return root, IslandHook(root[1], reader.dtype)


class _Casts(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[tuple, dict]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.to:
            self.calls.append((args[1:], dict(kwargs)))
        return func(*args, **kwargs)


def test_a_hooked_island_computes_in_float32_and_hands_back_the_components_dtype():
    root, hook = _island()
    x = torch.randn(2, 4, dtype=torch.bfloat16)
    want = root[1](x.float()).to(torch.bfloat16)
    handles = attach(root[1], hook)
    got = root[1](x)
    assert got.dtype == torch.bfloat16 and torch.equal(got, want)
    for h in handles:
        h.remove()
    assert not root[1]._forward_pre_hooks and not root[1]._forward_hooks  # both removed through their handles


@pytest.mark.parametrize("x", [torch.ones(2, 4), torch.ones(2, 4, dtype=torch.long)], ids=["float32", "int64"])
def test_inputs_that_need_no_cast_are_left_as_they_are(x):
    _, hook = _island()
    assert hook.pre(None, (x,), {}) is None


def test_several_tensors_and_keywords_are_cast_too():
    _, hook = _island()
    a, ids = torch.ones(1, dtype=torch.bfloat16), torch.ones(1, dtype=torch.long)
    args, _ = hook.pre(None, (a, ids), {})
    assert [t.dtype for t in args] == [torch.float32, torch.long]
    args, kwargs = hook.pre(None, (a,), {"scale": torch.ones(1, dtype=torch.float16), "hidden_dtype": torch.bfloat16})
    assert args[0].dtype == kwargs["scale"].dtype == kwargs["hidden_dtype"] == torch.float32


def test_the_island_dtype_is_read_again_after_its_parameters_are_replaced():
    # Offloading replaces Parameter objects: the hook must cast to what the layer holds now, not what it held.
    root, hook = _island()
    norm = root[1]
    norm._parameters["weight"] = torch.nn.Parameter(norm.weight.detach().to(torch.float16))
    args, _ = hook.pre(norm, (torch.ones(1, 4, dtype=torch.bfloat16),), {})
    assert args[0].dtype == torch.float16


def test_the_post_hook_runs_when_the_forward_raises_and_passes_the_error_on():
    root, hook = _island()
    seen = []
    post = hook.post
    hook.post = lambda *a: seen.append(a[-1]) or post(*a)
    attach(root[1], hook)
    with pytest.raises(RuntimeError):
        root[1](torch.ones(2, 3, dtype=torch.bfloat16))  # wrong width: LayerNorm raises
    assert seen == [None]


def test_one_tensor_is_cast_once_each_way_with_dtype_as_a_keyword():
    # `t.to(torch.float32)` makes torch try its positional overloads (device, other tensor) before the dtype one;
    # `t.to(dtype=...)` goes straight to it: the same cast, ~0.35 us less per island call on CPU.
    _, hook = _island()
    x = torch.ones(2, 4, dtype=torch.bfloat16)
    with _Casts() as casts:
        (y,), _ = hook.pre(None, (x,), {})
        out = hook.post(None, (y,), {}, y)
    assert out.dtype == torch.bfloat16
    assert casts.calls == [((), {"dtype": torch.float32}), ((), {"dtype": torch.bfloat16})]
