"""Which module was executing: module names of a pipeline or a model, and the watch ``explain`` keeps on a call.

A mismatch error says nothing of where it happened. The name comes from one of three places: torch's global module
hooks while :func:`hf_precision.diagnose.mismatch.explain` is active (:class:`Session`), the ``self`` of the
``forward`` frames in a caught error's traceback, or a module path the caller gives. :class:`Names` turns the
chain of executing modules into ``component.path`` (``unet.time_embedding.linear_1``).

Nothing is imported at import time except the standard library; torch is imported inside functions.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt
from .wordings import parse_mismatch

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Names", "Session", "first_dtype", "module_at", "submodule", "pipeline_components", "pipeline_models"]


def first_dtype(values: Any) -> str | None:
    """Dtype of the first floating tensor among ``values`` (a forward's arguments), looking one level into
    tuples (``_call_impl``'s ``args``)."""
    import torch

    for v in values:
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                return dt.from_torch(t.dtype)
    return None


def module_at(target: Any, path: str) -> tuple[str | None, str | None, Any, Any]:
    """(component, path inside it, module, component module) for a dotted path in a pipeline or module.

    Example:
        >>> import torch
        >>> unet = torch.nn.Sequential(torch.nn.Linear(2, 2))
        >>> component, rel, module, root = module_at(unet, "unet.0")  # a bare model: the first segment names it
        >>> component, rel, type(module).__name__, root is unet
        ('unet', '0', 'Linear', True)
    """
    from torch import nn

    first, _, rest = path.partition(".")
    components = pipeline_components(target)
    if components is not None:
        root = components.get(first)
        if isinstance(root, nn.Module):
            return first, rest, submodule(root, rest), root
        return first, rest, None, None
    if isinstance(target, nn.Module):
        module = submodule(target, path)
        if module is not None:
            return None, path, module, target
        if rest:  # "unet.time_embedding" against the bare unet: the first segment names the component
            return first, rest, submodule(target, rest), target
    return first, rest, None, None


def submodule(root: nn.Module, rel: str) -> nn.Module | None:
    """``root.get_submodule(rel)``, ``root`` itself for ``""``, ``None`` when there is no such module."""
    try:
        return root.get_submodule(rel) if rel else root
    except AttributeError:
        return None


def pipeline_components(target: Any) -> Mapping[str, Any] | None:
    """The ``components`` mapping of a pipeline-like object, else ``None``.

    Example:
        >>> from types import SimpleNamespace
        >>> pipeline_components(SimpleNamespace(components={"unet": None}))
        {'unet': None}
        >>> pipeline_components(object()) is None
        True
    """
    from torch import nn

    if isinstance(target, nn.Module):
        return None
    try:
        components = getattr(target, "components", None)
    except Exception:  # a property that fails is not a pipeline
        return None
    return components if isinstance(components, Mapping) else None


def pipeline_models(pipe: Any) -> dict[str, nn.Module] | None:
    """The pipeline's models in data-flow order (diffusers' ``model_cpu_offload_seq``, then the rest); ``None`` for
    what is not a pipeline."""
    from torch import nn

    components = pipeline_components(pipe)
    if components is None:
        return None
    order = [n for n in str(getattr(pipe, "model_cpu_offload_seq", "") or "").split("->") if n]
    names = [n for n in order if n in components] + [n for n in components if n not in order]
    return {n: components[n] for n in names if isinstance(components[n], nn.Module)}


class Names:
    """Module names of a target: a pipeline (``component.path``), an ``nn.Module``, or lazily the outermost module."""

    def __init__(self, target: Any, component: str | None):
        from torch import nn

        # id(module) -> (component, path inside the component); roots: component -> component module
        self.names: dict[int, tuple[str | None, str]] = {}
        self.roots: dict[str | None, nn.Module] = {}
        self.components = pipeline_models(target)  # the pipeline's models, for fixes that name them
        self.lazy = target is None  # name modules relative to the outermost executing module
        if self.components is not None:
            for cname, comp in self.components.items():
                self.roots.setdefault(cname, comp)
                for n, m in comp.named_modules():
                    self.names.setdefault(id(m), (cname, n))
        elif target is not None:
            self.roots[component] = target
            for n, m in target.named_modules():
                self.names.setdefault(id(m), (component, n))

    def locate(self, chain: list[nn.Module]) -> tuple[str | None, str | None, str | None, Any, Any]:
        """(module path, component, path inside the component, module, component module) of the innermost module."""
        if not chain:
            return None, None, None, None, None
        inner = chain[-1]
        if self.lazy and id(chain[0]) not in self.names:
            self.roots[None] = chain[0]
            for n, m in chain[0].named_modules():
                self.names.setdefault(id(m), (None, n))
        hit = self.names.get(id(inner))
        if hit is None:  # not in the target: name it inside the nearest known module that contains it
            for outer in reversed(chain[:-1]):
                known = self.names.get(id(outer))
                if known is None:
                    continue
                rel = next((n for n, m in outer.named_modules() if m is inner), None)
                if rel is not None:
                    hit = (known[0], ".".join(p for p in (known[1], rel) if p))
                    break
        if hit is None:
            return type(inner).__name__, None, None, inner, None
        component, rel = hit
        path = ".".join(p for p in (component, rel) if p) or type(inner).__name__
        return path, component, rel, inner, self.roots.get(component)


class Session(Names):
    """One active explain context: global module hooks, the stack of executing modules, the failures seen."""

    def __init__(self, target: Any, component: str | None):
        super().__init__(target, component)
        self.thread = threading.get_ident()
        # (module, exception being handled when it was entered, its arguments); see post()
        self.stack: list[tuple[nn.Module, BaseException | None, Any]] = []
        # (exception, modules executing outermost first, dtype of the innermost one's first floating input)
        self.failures: list[tuple[BaseException, list[nn.Module], str | None]] = []
        self.handles: list[Any] = []

    def start(self) -> None:
        from torch.nn.modules import module as torch_module

        self.handles.append(torch_module.register_module_forward_pre_hook(self.pre))
        # always_call: the hook also runs when forward raises, so the stack stays balanced even if the caller
        # catches the error and goes on; the failure is recorded there, at the innermost module first.
        self.handles.append(torch_module.register_module_forward_hook(self.post, always_call=True))

    def stop(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def pre(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() == self.thread:
            self.stack.append((module, sys.exc_info()[1], args))

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self.thread:
            return
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                break
        else:
            return
        # torch calls always_call hooks from its `except` block when forward raised, so sys.exc_info() is the
        # escaping exception; on a normal return it is whatever was already being handled when the module was
        # entered (usually None). The first module to see a new exception is the innermost one.
        exc = sys.exc_info()[1]
        if exc is not None and exc is not stack[i][1] and not any(f[0] is exc for f in self.failures):
            self.failures.append((exc, [m for m, _, _ in stack[: i + 1]], first_dtype(stack[i][2])))
            del self.failures[:-8]
        del stack[i:]

    def chain_for(self, exc: BaseException) -> tuple[list[nn.Module], str | None] | None:
        """Modules executing (outermost first) where ``exc`` began, and the innermost one's input dtype; ``None`` when the
        hooks saw nothing of it. Of a cause chain (``raise RuntimeError(...) from err``), the deepest mismatch wins: there
        torch raised.
        """
        found: tuple[list[nn.Module], str | None] | None = None
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            for f, modules, input_dtype in self.failures:
                if f is e and (e is exc or parse_mismatch(str(e)) is not None):
                    found = modules, input_dtype
            e = e.__cause__ or e.__context__
        if found is not None:
            return found
        if self.stack:  # hooks did not run on the way out (e.g. under torch.compile)
            return [m for m, _, _ in self.stack], first_dtype(self.stack[-1][2])
        return None  # the caller reads the traceback
