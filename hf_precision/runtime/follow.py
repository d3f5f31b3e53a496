"""Components that reach an applied pipeline after loading get its plan too.

``pipe.vae = AutoencoderKL.from_pretrained(...)``, ``pipe.load_ip_adapter(...)`` and ``from_pipe(pipe,
controlnet=cn)`` otherwise bring a component with no hooks and no planned dtype ("Input type (c10::Half) and bias
type (float) should be the same"), and ``from_pipe`` casts every shared component to float32 unless given a dtype
(diffusers 0.42.1 pipeline_utils.py:2127 and :2225). :func:`install` wraps ``DiffusionPipeline.__setattr__`` (a
component set on a pipeline with a live record gets that name's plan), ``from_pipe`` (shared components keep their
dtypes and the new pipeline gets the plan) and ``to`` (a cast off the plan warns once, with the fix). Pipelines
without a record behave as in diffusers.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import sys
import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["install", "adopt"]

_local = threading.local()  # .keep: inside from_pipe of an applied pipeline (its cast to float32 is skipped)
_installed: list[str] = []  # "base", "auto": what install() wrapped
_api: dict[str, Callable[..., Any]] = {}  # apply_recipe, resolve, apply_component: given by install()


def install(attr: str, apply_recipe: Callable[..., Any], resolve: Callable[..., Any],
            apply_component: Callable[..., None]) -> None:
    """Wrap ``DiffusionPipeline.__setattr__``, ``from_pipe`` and ``to`` once (no-ops for pipelines without a record),
    and the ``AutoPipelineFor*.from_pipe`` methods once their module is imported (importing it costs ~2 s).

    ``apply_recipe`` calls this with the attribute its record lives in and the functions that apply a plan (passed,
    not imported: this module serves that one).

    Example:
        >>> from diffusers import DiffusionPipeline
        >>> from hf_precision.runtime.apply import apply_recipe
        >>> from hf_precision.testing import make_sdxl
        >>> _ = apply_recipe(make_sdxl(), device="cpu")  # calls install(); the wrapping is done once per process
        >>> hasattr(DiffusionPipeline.__setattr__, "__wrapped__"), hasattr(DiffusionPipeline.to.__wrapped__, "__wrapped__")
        (True, False)
    """
    if "base" not in _installed:
        from diffusers import DiffusionPipeline

        _api.update(apply_recipe=apply_recipe, resolve=resolve, apply_component=apply_component)
        _wrap_base(DiffusionPipeline, attr)
        _wrap_ip_adapter_loaders(attr)
        _installed.append("base")
    auto = sys.modules.get("diffusers.pipelines.auto_pipeline")
    if auto is not None and "auto" not in _installed:
        # AutoPipelineFor*.from_pipe build the class directly, without the base class's cast to float32
        for name, owner in vars(auto).items():
            if name.startswith("AutoPipelineFor") and "from_pipe" in vars(owner):
                owner.from_pipe = classmethod(_planned_from_pipe(vars(owner)["from_pipe"].__func__, attr))
        _installed.append("auto")


def _wrap_base(base: type, attr: str) -> None:
    original_setattr, original_to = base.__setattr__, base.to

    @functools.wraps(original_setattr)
    def __setattr__(self: Any, name: str, value: Any) -> None:
        original_setattr(self, name, value)
        record = self.__dict__.get(attr)
        if record is not None and not record.removed:
            adopt(record, name, value)

    @functools.wraps(original_to)
    def to(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "keep", False) and not args and set(kwargs) == {"dtype"}:
            return self  # from_pipe's own cast to float32: the plan decides the dtypes
        out = original_to(self, *args, **kwargs)
        record = self.__dict__.get(attr)
        if record is not None and not record.removed and any(isinstance(a, torch.dtype) for a in (*args, *kwargs.values())):
            _warn_cast(record, args, kwargs)
        return out

    base.__setattr__ = __setattr__  # type: ignore[method-assign]
    base.to = to  # type: ignore[method-assign]
    base.from_pipe = classmethod(_planned_from_pipe(vars(base)["from_pipe"].__func__, attr))  # type: ignore[method-assign]


def _wrap_ip_adapter_loaders(attr: str) -> None:
    """``load_ip_adapter`` registers the image encoder (``adopt`` plans it), then adds projection layers to the
    denoiser in the denoiser's dtype (diffusers 0.42.1 loaders/ip_adapter.py:222 then :245): after it returns, the
    components it changed in place get their plan again."""
    from diffusers.loaders import ip_adapter

    for owner in vars(ip_adapter).values():
        if isinstance(owner, type) and "load_ip_adapter" in vars(owner):
            owner.load_ip_adapter = _replanning(vars(owner)["load_ip_adapter"], attr)  # type: ignore[attr-defined]


def _replanning(original: Any, attr: str) -> Any:
    @functools.wraps(original)
    def load(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = original(self, *args, **kwargs)
        record = self.__dict__.get(attr)
        if record is not None and not record.removed:
            _replan_drifted(record, original.__name__)
        return out

    return load


def _replan_drifted(record: Any, by: str) -> None:
    from .layout import drift

    for name, module in list(record._modules.items()):
        plan = record.recipe[name]
        if drift(name, module, plan, record.islands.get(name, [])):
            record._detach(name)
            _api["apply_component"](record, plan, module, plan.device, record.inputs.get("strict", True))
            record.actions.append(f"{name}: changed in place by {by}, got the plan again ({plan.storage}/{plan.compute})")


def _warn_cast(record: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """One warning per record when ``pipe.to(dtype)`` (diffusers casts every component, islands included) left the
    pipeline off its plan: what drifted, and the call that puts the plan back."""
    problems = record.verify()
    if not problems or record.cast_warned:
        return
    record.cast_warned = True
    call = ", ".join([*map(str, args), *(f"{k}={v}" for k, v in kwargs.items())])
    more = f" (and {len(problems) - 1} more: hf_precision.applied(pipe).verify())" if len(problems) > 1 else ""
    # each problem names the fix (reload, or hf_precision.apply_recipe(pipe), or the override that plans this dtype)
    warnings.warn(f"hf_precision: pipe.to({call}) cast the pipeline off its plan: {problems[0]}{more}",
                  RuntimeWarning, stacklevel=3)


def _planned_from_pipe(original: Any, attr: str) -> Any:
    @functools.wraps(original)
    def from_pipe(cls: type, pipeline: Any, **kwargs: Any) -> Any:
        record = getattr(pipeline, "__dict__", {}).get(attr)
        if record is None or record.removed or kwargs.get("dtype") is not None or kwargs.get("torch_dtype") is not None:
            return original(cls, pipeline, **kwargs)  # a dtype given: the user's cast, as diffusers does it
        with _keeping_dtypes():
            new = original(cls, pipeline, **kwargs)
        _plan_like(record, new)
        return new

    return from_pipe


@contextlib.contextmanager
def _keeping_dtypes() -> Any:
    before = getattr(_local, "keep", False)
    _local.keep = True
    try:
        yield
    finally:
        _local.keep = before


def _plan_like(record: Any, new: Any) -> None:
    """Apply ``record``'s plan to a pipeline built from its pipeline: the same resolved recipe where it lists the new
    class; else the recipe of the new class resolved with the same devices, layout and overrides, the components
    shared with the source keeping the plans they run with there (a composed recipe cannot tell an SDXL VAE)."""
    from ..recipe.model import Recipe

    apply_recipe = _api["apply_recipe"]

    inputs = record.inputs
    if type(new).__name__ in record.recipe.pipelines:
        apply_recipe(new, record.recipe, strict=inputs.get("strict", True)).inputs = inputs
        return
    comps = {n: m for n, m in new.components.items() if isinstance(m, torch.nn.Module)}
    devices = _load_devices(record)
    # a resolved Recipe applied as is keeps its layout: the rules of the device it was resolved for
    layout = inputs.get("layout") or (record.recipe.device if isinstance(inputs.get("recipe"), Recipe) else None)
    resolved = _api["resolve"](new, recipe=None, device=devices, overrides=inputs.get("overrides"), layout=layout,
                               force=False)
    plans = tuple(record.recipe[p.name] if p.name in record.recipe and comps.get(p.name) is record._modules.get(p.name)
                  else p for p in resolved.policies)
    merged = dataclasses.replace(resolved, policies=plans)
    apply_recipe(new, merged, strict=inputs.get("strict", True), force=True).inputs = {**inputs, "recipe": merged}


def _load_devices(record: Any) -> Any:
    """The ``device=`` the record's pipeline was applied with, else each component's planned device (None: none)."""
    planned = {p.name: p.device for p in record.recipe.policies if p.device is not None}
    return record.inputs.get("device") or planned or None


def adopt(record: Any, name: str, value: Any) -> None:
    """Give ``value``, just set as component ``name`` of the pipeline ``record`` was applied to, the plan for ``name``.

    The plan is resolved again with the load's arguments, so the module's own config picks its rule (the fp16-fix
    VAE's ``force_upcast=False`` may run fp16), or taken from a resolved ``Recipe``. The replaced module loses its
    hooks; ``None`` only drops it; the same module or a wrapper of it (``torch.compile``, DDP) changes nothing; a class
    the plan does not fit is left as it is, with one warning.

    Example:
        >>> import hf_precision as hp, tempfile
        >>> from diffusers import AutoencoderKL
        >>> from hf_precision.testing import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> pipe = hp.load_pipeline(folder, "cpu", layout="t4")
        >>> pipe.vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float16)  # adopt runs here
        >>> pipe.vae.dtype, hp.applied(pipe).modules["vae"] is pipe.vae
        (torch.float32, True)
    """
    from ..recipe.model import Recipe

    if name not in record.recipe:
        return
    old = record._modules.get(name)
    if old is not None and isinstance(value, torch.nn.Module) and any(m is old for m in value.modules()):
        return  # the same module, or a wrapper around it (torch.compile, DistributedDataParallel): its hooks hold
    if old is not None:
        record._detach(name)
    if not isinstance(value, torch.nn.Module):
        return
    plan, inputs = record.recipe[name], record.inputs
    pipe = record._owner() if record._owner is not None else None
    if plan.classes and type(value).__name__ not in plan.classes:
        note = (f"{name} was set to a {type(value).__name__} after loading and is left as it is, without the plan's "
                f"dtype and boundary hooks: the component recipe {plan.recipe} is for {', '.join(plan.classes)}; "
                f"to plan it, re-apply with a component recipe for its class: "
                f"hf_precision.apply_recipe(pipe, overrides={{{name!r}: {{'use': '<component recipe>'}}}}) "
                f"(hf-precision recipes lists them)")
        record.skipped.append(note)
        warnings.warn(f"hf_precision: {note}", RuntimeWarning, stacklevel=3)
        return
    what = f"{name}: a {type(value).__name__} set after loading got the plan"
    again = pipe is not None and inputs and not isinstance(inputs.get("recipe"), Recipe)
    if again:
        # Resolved again so the new module's config chooses its rule; only this component is applied, so the others
        # keep their hooks and what their NaN guards decided (a UNet already switched to float32 stays there).
        resolved = _api["resolve"](pipe, recipe=inputs.get("recipe"), device=_load_devices(record),
                                   overrides=inputs.get("overrides"), layout=inputs.get("layout"),
                                   force=inputs.get("force", False))
        plan = resolved[name]
        record.recipe = dataclasses.replace(record.recipe, policies=tuple(plan if p.name == name else p
                                                                       for p in record.recipe.policies))
    _api["apply_component"](record, plan, value, plan.device, inputs.get("strict", True))
    record.actions.append(f"{what} ({plan.storage}/{plan.compute}" + (", resolved again for its config)" if again else ")"))
