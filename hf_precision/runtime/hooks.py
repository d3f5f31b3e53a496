"""Boundary casting with native torch forward hooks.

Only component entry points and float32 islands are hooked, never every layer: no-op hooks on every layer added
10-15% to a small UNet's call on CPU, one boundary hook costs one cast of the inputs
(docs/facts.md#f10-hook-overhead-one-entry-hook-vs-a-hook-per-layer). Target dtypes and devices are read from the
module's parameters at call time, so the hooks stay correct after the pipeline moves or upcasts a component
(``upcast_vae``, offloading); ``hf_precision.diagnose.checker`` reports when that drifts from the plan.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_map_only
from torch.utils.hooks import RemovableHandle

from ..errors import override_line
from .. import dtypes as dt
from ..recipe.patterns import inside
from ..recipe.model import DEFAULT_NO_CAST
from .patches import retarget_layerwise
from .quantize import is_quantized_tensor

__all__ = ["cast_tree", "EntryHook", "IslandHook", "attach"]


def cast_tree(tree: Any, dtype: torch.dtype | None, device: torch.device | None = None) -> Any:
    """Cast floating tensors in a nested structure to ``dtype`` and move every tensor to ``device``; integer and bool
    tensors (token ids, timesteps, masks) are moved, never cast, and non-tensors returned as they are.

    Example:
        >>> out = cast_tree({"x": torch.ones(1), "ids": torch.ones(1, dtype=torch.long)}, torch.float16)
        >>> out["x"].dtype, out["ids"].dtype
        (torch.float16, torch.int64)
        >>> cache = [None, torch.ones(1, dtype=torch.float16)]
        >>> cast_tree(cache, torch.float16) is cache  # nothing to change: the very list a model may fill in place
        True
    """
    # This runs on every component call: plain tensors, None, numbers and shallow dicts/tuples (the usual
    # arguments) are handled directly; only other containers go through pytree (~10 us per call).
    if isinstance(tree, torch.Tensor):
        return _fix(tree, dtype, device)
    if tree is None or isinstance(tree, (int, float, bool, str, torch.dtype)):
        return tree
    # A container whose items need no change is handed back as the same object: some models fill a list they are
    # given in place (the causal caches of the Wan and QwenImage 3D VAEs, `feat_cache`/`feat_idx`), and a copy
    # would silently drop what they wrote.
    if type(tree) in (tuple, list):
        items = [cast_tree(x, dtype, device) for x in tree]
        return tree if all(a is b for a, b in zip(items, tree)) else type(tree)(items)
    if type(tree) is dict:
        changed = {k: cast_tree(v, dtype, device) for k, v in tree.items()}
        return tree if all(changed[k] is v for k, v in tree.items()) else changed
    return tree_map_only(torch.Tensor, lambda t: _fix(t, dtype, device), tree)


def _fix(t: torch.Tensor, dtype: torch.dtype | None, device: torch.device | None) -> torch.Tensor:
    want_dtype = dtype if dtype is not None and t.dtype != dtype and t.is_floating_point() else None
    want_device = device if device is not None and t.device != device else None
    if want_dtype is None and want_device is None:
        return t
    return t.to(device=want_device, dtype=want_dtype)


def _first_floating(args: tuple[Any, ...], kwargs: dict[str, Any], skip: frozenset[str]) -> torch.Tensor | None:
    for name, value in kwargs.items():
        if name not in skip and isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    for value in args:
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            return value
    return None


def _rewrite_dtype_kwargs(kwargs: dict[str, Any], dtype: torch.dtype) -> dict[str, Any]:
    # PixArt passes the activation dtype as an argument (AdaLayerNormSingle(hidden_dtype=...)); a cast of the
    # tensors alone would leave the embedder computing in the wrong dtype (diffusers v0.42.1
    # src/diffusers/models/transformers/pixart_transformer_2d.py:309;
    # docs/facts.md#f7-embedders-take-their-dtype-as-an-argument-hidden_dtype).
    if not any(k.endswith("_dtype") for k in kwargs):
        return kwargs
    return {k: dtype if k.endswith("_dtype") and isinstance(v, torch.dtype) and v.is_floating_point else v
            for k, v in kwargs.items()}


class _ParamRef:
    """Finds a reference parameter by path each time: offloading replaces Parameter objects."""

    def __init__(self, root: torch.nn.Module, skip: Callable[[str], bool]):
        self.owner: torch.nn.Module | None = None
        self.leaf = ""
        for name, param in root.named_parameters():
            if param.is_floating_point() and not skip(name):
                path, _, self.leaf = name.rpartition(".")
                self.owner = root.get_submodule(path) if path else root
                break

    def get(self) -> torch.Tensor | None:
        if self.owner is None:
            return None
        return self.owner._parameters.get(self.leaf)


def _execution_device(module: torch.nn.Module, root: torch.nn.Module, ref: _ParamRef) -> torch.device | None:
    for m in (module, root):
        dev = getattr(getattr(m, "_hf_hook", None), "execution_device", None)
        if dev is not None:
            return torch.device(dev)
    param = ref.get()
    if param is not None and param.device.type != "meta":
        return param.device
    # Sequential offload keeps weights on meta and moves them per leaf: ask diffusers where they run.
    from diffusers.utils.torch_utils import get_module_execution_device

    dev = get_module_execution_device(module)
    return None if dev.type == "meta" else dev


class EntryHook:
    """Casts what enters a component to its compute dtype and device; hands outputs over as planned.

    ``output``: ``"input"`` (back to the primary input's dtype and device), ``"compute"`` or a ``torch.dtype``.
    ``compute`` (planned) is used where layerwise casting stores the weights in another dtype, else the weights' dtype.
    """

    def __init__(self, name: str, module: torch.nn.Module, root: torch.nn.Module, *, compute: torch.dtype,
                 storage: torch.dtype, output: str | torch.dtype, islands: list[str], prefix: str = "",
                 nan_guard: Any = None, no_cast: frozenset[str] = frozenset(DEFAULT_NO_CAST)):
        """``prefix`` is ``module``'s dotted name inside ``root`` ("" for the component itself)."""
        self.name, self.module, self.root = name, module, root
        self.planned_compute, self.storage, self.output = compute, storage, output
        full = lambda p: f"{prefix}.{p}" if prefix else p
        island_set = frozenset(islands)
        self.ref = _ParamRef(module, lambda p: inside(full(p), island_set))
        try:
            params = [p for p in inspect.signature(module.forward).parameters if p != "self"]
        except (TypeError, ValueError):
            params = []
        # Arguments the recipe's no_cast names (timesteps, ids, guidance), found once: moved, never cast.
        self.no_cast = no_cast
        self.uncast_positions = frozenset(i for i, p in enumerate(params) if p in no_cast)
        self.nan_guard = nan_guard
        self._arrived: list[tuple[torch.dtype, torch.device] | None] = []
        self._originals: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def dtype(self) -> torch.dtype:
        param = self.ref.get()
        if param is None or self.storage != self.planned_compute and param.dtype == self.storage:
            return self.planned_compute
        return param.dtype

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
        dtype = self.dtype()
        device = _execution_device(module, self.root, self.ref)
        uncast = self.uncast_positions
        primary = _first_floating(tuple(a for i, a in enumerate(args) if i not in uncast), kwargs, self.no_cast)
        self._arrived.append((primary.dtype, primary.device) if primary is not None else None)
        if self.nan_guard is not None:
            self._originals.append((args, kwargs))  # references only: a re-run starts from the uncast inputs
        new_args = tuple(cast_tree(a, None if i in uncast else dtype, device) for i, a in enumerate(args))
        new_kwargs = {k: cast_tree(v, None if k in self.no_cast else dtype, device) for k, v in kwargs.items()}
        return new_args, _rewrite_dtype_kwargs(new_kwargs, dtype)

    def post(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        arrived = self._arrived.pop() if self._arrived else None
        originals = self._originals.pop() if self.nan_guard is not None and self._originals else (args, kwargs)
        if out is None:
            # The forward raised (post hooks are always called): the stacks are popped above, so nothing keeps
            # references to the failed call's inputs; torch re-raises the error after this.
            return None
        if self.nan_guard is not None:
            out = self.nan_guard(self, module, originals[0], originals[1], out)
        if self.output == "compute":
            return out
        if self.output == "input":
            if arrived is None:
                return out
            return cast_tree(out, arrived[0], arrived[1])
        return cast_tree(out, self.output, arrived[1] if arrived else None)


class IslandHook:
    """Runs a float32 island inside a half-precision component: fp32 in, the component's dtype out."""

    def __init__(self, module: torch.nn.Module, outer_dtype: Callable[[], torch.dtype]):
        self.ref = _ParamRef(module, lambda _: False)
        self.outer_dtype = outer_dtype

    def dtype(self) -> torch.dtype:
        param = self.ref.get()
        return torch.float32 if param is None else param.dtype

    def pre(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]] | None:
        param = self.ref.get()
        dtype = torch.float32 if param is None else param.dtype
        # A hook runs for every island on every call (166 islands in the benchmark's stress test), so the usual call,
        # one tensor and no keywords (a norm, an MLP), builds nothing it does not need and returns None (arguments
        # unchanged) when the input already is float32. `.to(dtype=...)` with a keyword skips torch's parse of the
        # positional overloads (device, tensor): ~0.35 us less per cast on CPU, the same cast.
        if not kwargs and len(args) == 1 and type(args[0]) is torch.Tensor:
            a = args[0]
            if a.dtype == dtype or not a.is_floating_point():
                return None
            return (a.to(dtype=dtype),), kwargs
        if not kwargs and all(type(a) is torch.Tensor for a in args):
            if all(a.dtype == dtype or not a.is_floating_point() for a in args):
                return None
            return tuple(a.to(dtype=dtype) if a.dtype != dtype and a.is_floating_point() else a for a in args), kwargs
        return cast_tree(args, dtype), _rewrite_dtype_kwargs(cast_tree(kwargs, dtype), dtype)

    def post(self, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        if out is None:
            return None
        outer = self.outer_dtype()
        if type(out) is torch.Tensor:
            return out.to(dtype=outer) if out.dtype != outer and out.is_floating_point() else None
        return cast_tree(out, outer)


def attach(module: torch.nn.Module, hook: EntryHook | IslandHook) -> list[RemovableHandle]:
    """Register a hook's pre and post functions as native forward hooks; returns the removable handles. The post hook
    runs also when the forward raises, so per-call stacks stay balanced and no failed call's inputs outlive it.
    """
    return [module.register_forward_pre_hook(hook.pre, with_kwargs=True),
            module.register_forward_hook(hook.post, with_kwargs=True, always_call=True)]


def nan_guard(fallbacks: list[torch.dtype], component: str, on_switch: Callable[[str, torch.dtype, torch.dtype], None]):
    """A post-forward check: when an output is not finite, re-run the entry module in the next fallback dtype.

    The whole component is cast (islands stay fp32) and keeps the new dtype for the rest of the session.
    """
    state = {"busy": False}

    def guard(hook: EntryHook, module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        if state["busy"]:
            return out
        while not _finite(out):
            current = hook.dtype()
            remaining = [d for d in fallbacks if d.itemsize >= current.itemsize and d != current]
            if not remaining:
                return out
            if _holds_quantized(hook.root):
                # A backend's quantized weights cannot be re-run in another dtype: say how to store them unquantized.
                if not state.get("warned"):
                    state["warned"] = True
                    warnings.warn(f"hf_precision: {component} produced non-finite values with quantized weights; the "
                                  f"NaN guard cannot re-run quantized weights in another dtype. Store them unquantized: "
                                  f"{override_line(component, 'storage', str(current).removeprefix('torch.'))} "
                                  f"(the guard can then re-run it in {str(remaining[0]).removeprefix('torch.')})",
                                  RuntimeWarning, stacklevel=2)
                return out
            target = remaining[0]
            _cast_component(hook.root, target, current)
            # fp8-stored layers (layerwise casting) keep their fp8 weights; their hooks now compute in the target
            if retarget_layerwise(hook.root, target):
                for follower in (hook, *guard.followers):  # entries and islands cast to what the hooks compute in
                    follower.planned_compute = target
            on_switch(component, current, target)
            state["busy"] = True
            try:
                with torch.no_grad():  # the entry hook itself casts the original inputs to the new dtype
                    out = module(*args, **kwargs)
            finally:
                state["busy"] = False
        return out

    guard.followers = []  # other hooks of the component that read its compute dtype (the island hooks' reader)
    return guard


def _finite(out: Any) -> bool:
    ok = True

    def check(t: torch.Tensor) -> torch.Tensor:
        nonlocal ok
        if ok and t.is_floating_point() and not bool(torch.isfinite(t).all()):
            ok = False
        return t

    tree_map_only(torch.Tensor, check, out)
    return ok


def _holds_quantized(root: torch.nn.Module) -> bool:
    return any(is_quantized_tensor(p) for p in root.parameters())


def _cast_component(root: torch.nn.Module, target: torch.dtype, current: torch.dtype) -> None:
    # Only parameters in the component's current dtype move: float32 islands stay float32.
    with torch.no_grad():
        for tensor in (*root.parameters(), *root.buffers()):
            if tensor.dtype == current:
                tensor.data = tensor.data.to(target)


def warn_switch(component: str, old: torch.dtype, new: torch.dtype) -> None:
    name = dt.from_torch(new)
    warnings.warn(f"hf_precision: {component} produced non-finite values in {str(old).removeprefix('torch.')}; "
                  f"re-ran it in {name} and keeps {name} for this session. Make it permanent with "
                  f"{override_line(component, 'dtype', name)}",
                  RuntimeWarning, stacklevel=2)
