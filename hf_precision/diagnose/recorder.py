"""Recorder: per-module hooks that record what each module really receives, and every dtype change a hook makes."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Recorder", "MAX_MISMATCHES"]

MAX_MISMATCHES = 50  # distinct modules; a cascade through every layer says nothing more after the first few


def _floating(tree: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


# Layers whose forward casts input and weights to fp32 itself, so a bf16 layer fed fp32 on purpose is no mismatch:
# diffusers' FP32LayerNorm (models/normalization.py), fed `hidden_states.float()` by Wan's blocks
# (transformer_wan.py WanTransformerBlock: `self.norm2(hidden_states.float())`).
_UPCASTING = frozenset({"FP32LayerNorm"})


class Recorder:
    """Per-module hooks over a pipeline's components: input/parameter mismatches and dtype changes made by hooks.

    A leaf with parameters gets a pre-hook after every existing one (it sees what the module really receives); a
    module already carrying hooks gets one before and one after them, and the difference is the cast.
    """

    def __init__(self, components: Mapping[str, nn.Module], kinds: Mapping[str, str]):
        self.components = components
        self.kinds = kinds  # module path -> "entry" / "island"
        self.handles: list[Any] = []
        self.mismatches: dict[tuple[str, str, str, str], int] = {}
        self.casts: dict[tuple[str, str, str, str, str], int] = {}
        self.calls: dict[str, int] = {}
        self.stack: dict[int, list[list[Any]]] = {}

    def attach(self) -> None:
        for cname, comp in self.components.items():
            for rel, module in comp.named_modules():
                path = f"{cname}.{rel}" if rel else cname
                hooked = bool(module._forward_pre_hooks or module._forward_hooks)
                leaf = not any(True for _ in module.children()) and any(
                    p is not None and p.is_floating_point() for p in module._parameters.values())
                if hooked:
                    kind = self.kinds.get(path, "hook")
                    self.handles += [
                        module.register_forward_pre_hook(self._before(module), prepend=True, with_kwargs=True),
                        module.register_forward_pre_hook(self._after(path, kind), with_kwargs=True),
                        module.register_forward_hook(self._out_before(module), prepend=True),
                        module.register_forward_hook(self._out_after(module, path, kind)),
                    ]
                if leaf:
                    self.handles.append(module.register_forward_pre_hook(self._inputs(cname, path), with_kwargs=True))

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def _record_casts(self, path: str, kind: str, where: str, before: list[Any], after: list[Any]) -> None:
        if len(before) == len(after):
            pairs = [(b, a) for b, a in zip(before, after) if b != a]
        else:  # a hook changed the structure: compare what kinds of dtypes came in and went out
            pairs = [(b, a) for b in set(before) for a in set(after) if b not in after and a not in before]
        for b, a in dict.fromkeys(pairs):
            key = (path, kind, where, dt.from_torch(b), dt.from_torch(a))
            self.casts[key] = self.casts.get(key, 0) + 1

    def _before(self, module: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self.stack.setdefault(id(module), []).append([[t.dtype for t in _floating((args, kwargs))], None])
        return hook

    def _after(self, path: str, kind: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            frames = self.stack.get(id(mod))
            if frames:
                self._record_casts(path, kind, "input", frames[-1][0], [t.dtype for t in _floating((args, kwargs))])
        return hook

    def _out_before(self, module: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            frames = self.stack.get(id(module))
            if frames:
                frames[-1][1] = [t.dtype for t in _floating(out)]
        return hook

    def _out_after(self, module: nn.Module, path: str, kind: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            frames = self.stack.get(id(module))
            if not frames:
                return
            _, raw = frames.pop()
            if raw is not None:
                self._record_casts(path, kind, "output", raw, [t.dtype for t in _floating(out)])
        return hook

    def _inputs(self, component: str, path: str) -> Callable[..., None]:
        from ..runtime.patches import layerwise_hook

        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self.calls[component] = self.calls.get(component, 0) + 1
            params = [p for p in mod._parameters.values() if p is not None and p.is_floating_point()]
            if not params or any(p.device.type == "meta" for p in params):
                return  # sequential offload: weights arrive inside forward
            if type(mod).__name__ in _UPCASTING:
                return  # it casts its input and weights to fp32 itself: any input dtype is right
            compute = getattr(layerwise_hook(mod), "compute_dtype", None)  # weights are cast inside forward
            dtypes = {compute} if compute is not None else {p.dtype for p in params}
            want_dtype = sorted(dtypes, key=str)[0]
            device = params[0].device
            for t in _floating((args, kwargs)):
                if t.dtype not in dtypes:
                    self._mismatch(path, "dtype", dt.from_torch(t.dtype), dt.from_torch(want_dtype))
                if t.device != device:
                    self._mismatch(path, "device", str(t.device), str(device))
        return hook

    def _mismatch(self, path: str, kind: str, got: str, want: str) -> None:
        key = (path, kind, got, want)
        if key in self.mismatches or len(self.mismatches) < MAX_MISMATCHES:
            self.mismatches[key] = self.mismatches.get(key, 0) + 1
