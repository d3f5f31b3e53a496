"""apply_recipe: put each component of a built pipeline in its planned dtype and device, and hook its boundaries."""

from __future__ import annotations

import dataclasses
import time
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.devices import device_caps
from ..errors import RecipeError, override_line
from . import follow, patches
from .hooks import EntryHook, IslandHook, attach, nan_guard, warn_switch
from .layout import (check_user_names, component_islands, drift, dtype_anchors, has_layerwise_casting,
                     layerwise_skip_regexes)
from ..recipe.catalog import component_recipes_listing, list_recipes
from ..recipe.model import ComponentPolicy, Recipe
from ..recipe.resolution import resolve
from ..recipe.patterns import inside
from ..recipe.quantize import is_quantized
from .quantize import is_quantized_tensor
from .placement import check_placeable
from .source import models_of_pipeline

__all__ = ["apply_recipe", "applied", "Applied", "config_dict"]

_ATTR = "_hf_precision_applied"


@dataclasses.dataclass
class Applied:
    """What :func:`apply_recipe` did, and the hooks it holds. ``remove()`` takes the hooks off but does NOT restore old
    dtypes (casting back cannot bring back lost precision: reload); ``verify()`` lists drift from the plan.
    """

    recipe: Recipe
    devices: dict[str, str]
    actions: list[str]
    hooked: dict[str, list[str]]
    islands: dict[str, list[str]]
    skipped: list[str]
    _handles: list[Any] = dataclasses.field(default_factory=list, repr=False)
    _modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict, repr=False)
    # The pipeline the record was left on (weakly: the pipeline holds the record), so remove() can take it off too.
    _owner: Any = dataclasses.field(default=None, repr=False)
    removed: bool = False
    # Seconds per stage: "apply" always; load_pipeline adds "resolve", "stream", "from_pretrained", "reload_islands".
    timings: dict[str, float] = dataclasses.field(default_factory=dict)
    # The arguments it was applied with (load_pipeline's own), for a pipeline built from this one (from_pipe).
    inputs: dict[str, Any] = dataclasses.field(default_factory=dict, repr=False)
    _by_name: dict[str, list[Any]] = dataclasses.field(default_factory=dict, repr=False)  # component -> its handles
    cast_warned: bool = dataclasses.field(default=False, repr=False)  # pipe.to(dtype) drift warned once (follow.py)

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        """Component name -> the module this application hooked (what ``verify`` and ``hp.check`` inspect)."""
        return dict(self._modules)

    def remove(self) -> None:
        """Remove every hook this application added (dtypes and devices stay as they are)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        owner = self._owner() if self._owner is not None else None
        for module in [*self._modules.values(), *([owner] if owner is not None else [])]:
            if getattr(module, _ATTR, None) is self:
                delattr(module, _ATTR)
        self.removed = True

    def _detach(self, name: str) -> None:
        """Take this record's hooks off component ``name`` (replaced on the pipeline) and forget the module."""
        handles = self._by_name.pop(name, [])
        for handle in handles:
            handle.remove()
        self._handles = [h for h in self._handles if all(h is not d for d in handles)]
        module = self._modules.pop(name, None)
        if module is not None and getattr(module, _ATTR, None) is self:
            delattr(module, _ATTR)

    def verify(self) -> list[str]:
        """Problems where parameters no longer match the plan (e.g. islands erased by ``pipe.to(torch.float16)``)."""
        problems = []
        for name, module in self._modules.items():
            for d in drift(name, module, self.recipe[name], self.islands.get(name, [])):
                what = "float32 island parameters" if d.island is not None else "parameters"
                problems.append(f"{name}: {d.count} {what} are {d.have}, the plan says {d.want} "
                                f"(was the pipeline cast with pipe.to(dtype)? reload it, or re-apply: "
                                f"hf_precision.apply_recipe(pipe); to plan it in {d.have}: {override_line(name, 'dtype', d.have)})")
        return problems

    def report(self) -> str:
        if self.removed:  # the hooks are gone: a report of them would say what no longer holds
            return (f"hf_precision recipe {self.recipe.name} ({self.recipe.device.label()}): removed; no hooks on "
                    f"{', '.join(self._modules) or 'any component'} (dtypes stay as cast: reload to undo a cast)")
        lines = [f"hf_precision applied recipe {self.recipe.name} ({self.recipe.device.label()}):"]
        for plan in self.recipe.policies:
            if plan.name not in self._modules:
                continue
            islands = self.islands.get(plan.name) or []
            lines.append(f"  {plan.name}: {plan.storage}/{plan.compute} on {self.devices.get(plan.name)}, hands over "
                         f"{plan.handed_over}; entry hooks on {', '.join(self.hooked[plan.name]) or '-'}"
                         + (f"; fp32 islands: {', '.join(islands)}" if islands else ""))
        lines += [f"  {a}" for a in self.actions]
        lines += [f"  skipped: {s}" for s in self.skipped]
        return "\n".join(lines)

    __str__ = report


def _components(pipe: Any) -> dict[str, torch.nn.Module]:
    if isinstance(pipe, torch.nn.Module):
        return {"": pipe}
    comps = getattr(pipe, "components", None)
    if not isinstance(comps, Mapping):
        raise RecipeError(f"apply_recipe: expected a diffusers pipeline or an nn.Module, got {type(pipe).__name__}")
    return {k: v for k, v in comps.items() if isinstance(v, torch.nn.Module)}


def config_dict(module: Any) -> dict[str, Any]:
    """A component's config as recipes select on it: the shipped ``force_upcast``, not the one this library patched.

    Example:
        >>> import torch
        >>> config_dict(torch.nn.Linear(2, 2))
        {}
    """
    config = getattr(module, "config", None)
    if isinstance(config, Mapping):
        out = dict(config)
    else:
        out = config.to_dict() if hasattr(config, "to_dict") else {}
    if getattr(module, patches.FORCE_UPCAST_WAS, False):  # recipes select on the shipped flag, not on our patch
        out["force_upcast"] = True
    return out


def _module_device(module: torch.nn.Module) -> str:
    for p in module.parameters():
        return str(p.device)
    return "cpu"


def _rescaled(tensor: torch.Tensor, dtype: torch.dtype) -> torch.nn.Parameter | None:
    """An optimum-quanto weight in another compute dtype (same data, scale cast), or ``None`` to leave it: quanto's
    weight takes its dtype from its scale and refuses ``.to(dtype)``, so a component re-applied in another dtype
    (calibrate's fp16 runs) gave float32 outputs beside fp16 norms ('mixed dtype (CPU)'). torchao's follow the input.
    """
    scale = getattr(tensor, "_scale", None)
    if (tensor.dtype == dtype or not isinstance(scale, torch.Tensor) or not hasattr(tensor, "activation_qtype")
            or type(tensor).__name__ != "WeightQBytesTensor"):
        return None
    new = type(tensor)(tensor.qtype, tensor.axis, tensor.size(), tensor.stride(), tensor._data, scale.to(dtype),
                       tensor.activation_qtype)
    return torch.nn.Parameter(new, requires_grad=False)


def _cast_parameters(module: torch.nn.Module, storage: torch.dtype, islands: list[str], device: str | None) -> int:
    """Cast floating parameters and buffers in place: islands to fp32, the rest to storage. Returns how many changed."""
    changed = 0
    island_set = frozenset(islands)
    in_island = lambda name: inside(name, island_set)
    with torch.no_grad():
        for mod_name, mod in module.named_modules():
            # A layer under layerwise casting already holds its storage dtype (a recipe applied again, e.g. by
            # prepare_training): upcasting it here would hold the whole component in the compute dtype.
            stored = getattr(patches.layerwise_hook(mod), "storage_dtype", None)
            for kind in ("_parameters", "_buffers"):
                for leaf, tensor in getattr(mod, kind).items():
                    if tensor is None or tensor.device.type == "meta":
                        continue
                    if is_quantized_tensor(tensor):  # casting a backend's weight would dequantize it
                        recast = _rescaled(tensor, torch.float32 if in_island(mod_name) else storage)
                        if recast is not None:
                            getattr(mod, kind)[leaf] = recast
                            changed += 1
                        continue
                    target = tensor.dtype
                    if tensor.is_floating_point() and not (kind == "_parameters" and tensor.dtype == stored):
                        target = torch.float32 if in_island(mod_name) else storage
                    dev = torch.device(device) if device is not None else tensor.device
                    if tensor.dtype != target or tensor.device != dev:
                        tensor.data = tensor.data.to(device=dev, dtype=target)
                        changed += 1
    return changed


def applied(pipe: Any) -> Applied | None:
    """The record :func:`apply_recipe` (or :func:`~hf_precision.load_pipeline`) left on ``pipe``, or ``None``.

    Works for a pipeline and for a bare component that was applied on its own.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> pipe = make_pipeline("dit")
        >>> applied(pipe) is None
        True
        >>> record = apply_recipe(pipe, device="cpu")
        >>> applied(pipe) is record
        True
    """
    record = getattr(pipe, _ATTR, None)
    return record if isinstance(record, Applied) else None


def apply_recipe(pipe: Any, recipe: Recipe | str | None = None, device: Any = None, overrides: Any = None,
                 *, layout: Any = None, strict: bool = True, force: bool = False) -> Applied:
    """Apply a recipe to a pipeline you built: dtypes, placement, float32 islands and boundary hooks, in place.

    ``pipe``: a diffusers pipeline, or a bare model with a component recipe (``recipe="video.wan"``). ``recipe``,
    ``overrides``, ``layout`` and ``force`` are :func:`~hf_precision.load_pipeline`'s (a resolved recipe's layout is
    applied as is); ``device`` None leaves components where they are; ``strict`` makes a ``keep_fp32`` pattern that
    matches no module an error. Returns :class:`Applied` (``.remove()`` the hooks, ``.verify()`` drift). Applying again
    replaces the hooks, never stacks them; with no recipe, device, overrides or layout it re-applies the plan the
    pipeline was loaded with: the fix after ``pipe.to(dtype)``.

    Example:
        >>> from hf_precision.testing.pipelines import make_sdxl
        >>> pipe = make_sdxl()
        >>> applied = apply_recipe(pipe, device="cpu", layout="t4")
        >>> pipe.unet.conv_in.weight.dtype, pipe.unet.time_embedding.linear_1.weight.dtype, pipe.vae.dtype
        (torch.float16, torch.float32, torch.float32)
    """
    comps = _components(pipe)
    live = isinstance(previous := getattr(pipe, _ATTR, None), Applied) and not previous.removed
    if live and recipe is None and device is None and overrides is None and layout is None:
        recipe = previous.recipe  # re-applied as it was (after pipe.to(dtype), a swap): its layout and overrides kept
    inputs = dict(recipe=recipe, device=device, overrides=overrides, layout=layout, strict=strict, force=force)
    if "" in comps:
        if not isinstance(recipe, (str, Recipe)) or (isinstance(recipe, str) and recipe in list_recipes("pipeline")):
            got = f"{recipe!r} is a pipeline recipe; " if isinstance(recipe, str) else ""
            cls = type(comps[""]).__name__
            fitting = component_recipes_listing(cls)  # all of them would be a page (80 entries)
            offer = (f", e.g. recipe={fitting[0]!r}; the component recipes that list {cls}: {', '.join(fitting)}"
                     if fitting else f"; no component recipe lists {cls}: `hf-precision recipes` lists them all (recipes/components/)")
            raise RecipeError(f"apply_recipe: {got}name a component recipe for a bare {cls}{offer}")
        stem = recipe.policies[0].name if isinstance(recipe, Recipe) else str(recipe).split(".")[0]
        comps = {stem: comps[""]}
    resolved = resolve_for(pipe, comps, recipe, device, overrides, layout, force)
    if live:
        previous.remove()
    started = time.perf_counter()
    applied = Applied(recipe=resolved, devices={}, actions=[], hooked={}, islands={}, skipped=[],
                      inputs=previous.inputs if live and recipe is previous.recipe else inputs)
    for name in comps:
        if name not in resolved:
            applied.skipped.append(f"{name} ({type(comps[name]).__name__}) is not in recipe {resolved.name}: left as it is")
    for plan in resolved.policies:
        module = comps.get(plan.name)
        if module is None:
            note = resolved.absent_note(plan.name, "this pipeline")  # an optional component: no note unless asked
            if note:
                applied.skipped.append(note)
            continue
        _apply_component(applied, plan, module, plan.device, strict)
    applied.actions += [f"{name}: tiling on ({type(module).__name__} encodes and decodes only tiled)"
                        for name, module in comps.items() if patches.tile_where_required(module)]
    applied.actions += [f"{name}: text_model names the encoder itself ({type(module).__name__} has no text_model "
                        f"wrapper in this transformers; diffusers reads it for clip_skip)"
                        for name, module in comps.items() if patches.text_model_alias(module)]
    if "" not in comps:
        applied.actions += [f"ftfy is not installed: {m} cleans prompts without it, as WanPipeline does"
                            for m in patches.ftfy_stand_in(pipe)]
    try:
        object.__setattr__(pipe, _ATTR, applied)
        applied._owner = weakref.ref(pipe)
    except (AttributeError, TypeError):
        pass
    if "" not in comps:
        follow.install(_ATTR, apply_recipe, lambda p, **kw: resolve_for(p, _components(p), **kw), _apply_component)  # components set later get the plan too
    applied.timings["apply"] = time.perf_counter() - started
    return applied


def resolve_for(pipe: Any, comps: dict[str, torch.nn.Module], recipe: Any, device: Any, overrides: Any,
                layout: Any, force: bool) -> Recipe:
    """The recipe ``apply_recipe`` applies to ``pipe`` (components ``comps``), resolved from their configs."""
    if device is None and not isinstance(recipe, Recipe):
        device = {n: _module_device(m) for n, m in comps.items()}  # resolve each for where it sits
    check_placeable(device, recipe)
    return resolve(recipe, pipeline_class=type(pipe).__name__, devices=device, layout=layout, overrides=overrides,
                   configs={n: config_dict(m) for n, m in comps.items()}, components=list(comps),
                   models=models_of_pipeline(pipe) if "" not in comps else None, force=force)


@dataclasses.dataclass
class _Component:
    """One component on its way through :data:`STEPS`: the plan, the module, and what earlier steps decided."""

    applied: Applied
    plan: ComponentPolicy
    module: torch.nn.Module
    device: str | None
    strict: bool
    islands: list[str] = dataclasses.field(default_factory=list)
    guard: Any = None  # the NaN guard the entry hooks share (the island hooks follow its dtype switches)

    @property
    def compute(self) -> torch.dtype:
        return dt.to_torch(self.plan.compute)

    @property
    def storage(self) -> torch.dtype:
        # Quantized storage belongs to the backend (runtime/quantize.py); what it kept holds the compute dtype.
        return self.compute if is_quantized(self.plan.storage) else dt.to_torch(self.plan.storage)

    def did(self, action: str) -> None:
        self.applied.actions.append(f"{self.plan.name}: {action}")


def _check_class(c: _Component) -> None:
    old = getattr(c.module, _ATTR, None)
    if isinstance(old, Applied) and not old.removed and old is not c.applied:
        # Shared with another pipeline (from_pipe): its hooks from there go, never stack; its other components keep theirs
        for name in [n for n, m in old._modules.items() if m is c.module]:
            old._detach(name)
    plan = c.plan
    if plan.classes and type(c.module).__name__ not in plan.classes:
        raise RecipeError(f"recipe {c.applied.recipe.name}: component {plan.name} is a {type(c.module).__name__}, but its "
                          f"component recipe {plan.recipe} is for {', '.join(plan.classes)}; its islands and entry points "
                          f"would not fit. Use a recipe for this class, or override the component recipe: "
                          f"{override_line(plan.name, 'use', '<component recipe>')} (hf-precision recipes lists them)")
    if c.strict:
        check_user_names(plan, c.module)


def _find_islands(c: _Component) -> None:
    islands = component_islands(c.plan, c.module, strict=c.strict)
    if islands and has_layerwise_casting(c.module):
        # Layerwise-cast leaves recast their own weights on every call; an island around them cannot hold fp32.
        taken = [i for i in islands if has_layerwise_casting(c.module.get_submodule(i))]
        islands = [i for i in islands if i not in taken]
        if taken:
            c.did(f"islands {taken} left to the layerwise casting already enabled on them")
    c.islands = islands
    c.applied.islands[c.plan.name] = islands


def _place_and_cast(c: _Component) -> None:
    # Everything goes to the compute dtype (islands to fp32), also when weights are stored in another dtype: the
    # layerwise step then stores the hooked layers, and the islands and other layers keep the compute dtype.
    quantized = is_quantized(c.plan.storage) or any(is_quantized_tensor(p) for p in c.module.parameters())
    if quantized and c.device is not None and _module_device(c.module) != str(torch.device(c.device)):
        c.module.to(c.device)  # quantized tensors move as a whole (their data, scales and zero points together)
    changed = _cast_parameters(c.module, c.compute, c.islands, c.device)
    if changed:
        c.did(f"cast/moved {changed} tensors")
    c.applied.devices[c.plan.name] = c.device or _module_device(c.module)


def _store_layerwise(c: _Component) -> None:
    if is_quantized(c.plan.storage):
        c.did(f"weights stored {c.plan.storage}, computed in {c.plan.compute}")
        return
    if has_layerwise_casting(c.module):  # diffusers cannot remove it: its layers compute in the planned dtype now
        retargeted = patches.retarget_layerwise(c.module, c.compute)
        c.did("layerwise casting was already enabled: kept as it is"
              + (f", its {retargeted} layers now compute in {c.plan.compute}" if retargeted else ""))
        return
    if c.plan.storage == c.plan.compute:
        return
    kept = [*c.islands, *dtype_anchors(c.module)]  # the modules a transformers model's `.dtype` is read from stay
    patches.store_layerwise(c.module, c.storage, c.compute, layerwise_skip_regexes(kept, c.plan.layerwise_skip))
    c.did(f"weights stored in {c.plan.storage}, cast to {c.plan.compute} per layer on use")


def _patch_diffusers(c: _Component) -> None:
    if c.plan.compute == "float16" and patches.disable_force_upcast(c.module):
        c.did("config.force_upcast True -> False (the recipe decides; NaN guard on)")
    elif patches.disable_force_upcast(c.module):
        # SDXL img2img/inpaint's prepare_latents runs vae.to(float32) and then vae.to(the UNet's dtype): diffusers
        # refuses that cast on a quantized model, it drops fp8 storage for good, it leaves a fp32 or bf16 VAE in fp16
        c.did(f"config.force_upcast True -> False (vae {c.plan.storage} stored, {c.plan.compute} compute: the "
              f"pipeline's round trip through float32 would cast it to the denoiser's dtype)")
    if c.plan.upcast_attention:
        c.did(f"attention softmax in fp32 in {patches.upcast_attention(c.module)} attention modules")


def _hook_entries(c: _Component) -> None:
    plan, guard = c.plan, None
    if plan.nan_guard:
        computable = device_caps(c.applied.recipe.device).compute
        fallbacks = [d for d in (torch.bfloat16, torch.float32) if dt.from_torch(d) in computable and d != c.compute]
        guard = c.guard = nan_guard(fallbacks, plan.name, warn_switch)
    output: Any = plan.output if plan.output in ("input", "compute") else dt.to_torch(plan.output)
    entries = []
    for entry in plan.entry:
        try:
            sub = c.module.get_submodule(entry) if entry else c.module
        except AttributeError:
            continue  # e.g. AutoencoderKL(use_post_quant_conv=False) has no post_quant_conv
        hook = EntryHook(plan.name, sub, c.module, compute=c.compute, storage=c.storage, output=output,
                         islands=c.islands, prefix=entry, nan_guard=guard, no_cast=frozenset(plan.no_cast))
        c.applied._handles += attach(sub, hook)
        entries.append(entry or "(forward)")
    c.applied.hooked[plan.name] = entries


def _hook_islands(c: _Component) -> None:
    if not c.islands:
        return
    # An island hands back the dtype the component computes in now (read from its parameters, as the entry hook does).
    reader = EntryHook(c.plan.name, c.module, c.module, compute=c.compute, storage=c.storage, output="compute",
                       islands=c.islands)
    if c.guard is not None:  # fp8-stored weights keep their dtype when the guard switches: it tells this reader too
        c.guard.followers.append(reader)
    outer = reader.dtype
    for island in c.islands:
        sub = c.module.get_submodule(island)
        c.applied._handles += attach(sub, IslandHook(sub, outer))


# What apply_recipe does to each component, in order; each step records what it did on Applied. A new technique
# is a new step (and, when it patches diffusers, a function in runtime/patches.py).
STEPS: tuple[Callable[[_Component], None], ...] = (
    _check_class, _find_islands, _place_and_cast, _store_layerwise, _patch_diffusers, _hook_entries, _hook_islands)


def _apply_component(applied: Applied, plan: ComponentPolicy, module: torch.nn.Module, device: str | None, strict: bool) -> None:
    component = _Component(applied, plan, module, device, strict)
    first = len(applied._handles)
    for step in STEPS:
        step(component)
    applied._by_name[plan.name] = applied._handles[first:]
    applied._modules[plan.name] = module
    object.__setattr__(module, _ATTR, applied)
