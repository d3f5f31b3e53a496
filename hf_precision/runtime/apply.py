"""apply_recipe: put each component of a built pipeline in its planned dtype and device, and hook its boundaries."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.devices import device_caps
from ..errors import RecipeError, override_line
from .hooks import EntryHook, IslandHook, attach, nan_guard, warn_switch
from .layout import check_user_names, component_islands, drift, has_layerwise_casting, layerwise_skip_regexes
from ..recipe.resolution import ComponentPlan, Recipe, list_recipes, resolve
from ..recipe.patterns import inside
from ..recipe.quantize import is_quantized
from .quantize import is_quantized_tensor

__all__ = ["apply_recipe", "applied", "Applied", "torch_device"]

_ATTR = "_hf_precision_applied"


@dataclasses.dataclass
class Applied:
    """What :func:`apply_recipe` did, and the hooks it holds.

    ``remove()`` takes the hooks off; it does NOT restore the old dtypes (casting back would not bring back the
    lost precision: reload the pipeline instead). ``verify()`` lists where the pipeline drifted from the plan.
    """

    recipe: Recipe
    devices: dict[str, str]
    actions: list[str]
    hooked: dict[str, list[str]]
    islands: dict[str, list[str]]
    skipped: list[str]
    _handles: list[Any] = dataclasses.field(default_factory=list, repr=False)
    _modules: dict[str, torch.nn.Module] = dataclasses.field(default_factory=dict, repr=False)
    removed: bool = False
    # Seconds per stage: "apply" always; load_pipeline adds "resolve", "stream", "from_pretrained", "reload_islands".
    timings: dict[str, float] = dataclasses.field(default_factory=dict)

    @property
    def modules(self) -> dict[str, torch.nn.Module]:
        """Component name -> the module this application hooked (what ``verify`` and ``hp.check`` inspect)."""
        return dict(self._modules)

    def remove(self) -> None:
        """Remove every hook this application added (dtypes and devices stay as they are)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        for module in self._modules.values():
            if getattr(module, _ATTR, None) is self:
                delattr(module, _ATTR)
        self.removed = True

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
        lines = [f"hf_precision applied recipe {self.recipe.name} ({self.recipe.device.label()}):"]
        for plan in self.recipe.plans:
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


def torch_device(spec: Any, what: str) -> torch.device:
    """A device tensors can be placed on, or a ``RecipeError`` that explains presets are for planning only.

    Example:
        >>> torch_device("cpu", "device")
        device(type='cpu')
    """
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise RecipeError(f"{what}: {spec!r} is not a device this process can place tensors on (cpu, cuda, cuda:1, mps, xpu). "
                          f"To run the layout of a device you do not have, resolve it for that device and place it here: "
                          f"layout={spec!r}, device='cpu' (CLI: --layout {spec} --device cpu)") from None
    return dev


def _config_dict(module: torch.nn.Module) -> dict[str, Any]:
    config = getattr(module, "config", None)
    if isinstance(config, Mapping):
        return dict(config)
    return config.to_dict() if hasattr(config, "to_dict") else {}


def _module_device(module: torch.nn.Module) -> str:
    for p in module.parameters():
        return str(p.device)
    return "cpu"


def _cast_parameters(module: torch.nn.Module, storage: torch.dtype, islands: list[str], device: str | None) -> int:
    """Cast floating parameters and buffers in place: islands to fp32, the rest to storage. Returns how many changed."""
    changed = 0
    island_set = frozenset(islands)
    in_island = lambda name: inside(name, island_set)
    with torch.no_grad():
        for mod_name, mod in module.named_modules():
            for kind in ("_parameters", "_buffers"):
                for leaf, tensor in getattr(mod, kind).items():
                    if tensor is None or tensor.device.type == "meta" or is_quantized_tensor(tensor):
                        continue  # a backend's quantized weight: casting it would dequantize it
                    target = tensor.dtype
                    if tensor.is_floating_point():
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

    Args:
        pipe: a diffusers pipeline, or a bare model (then name a component recipe, e.g. ``recipe="video.wan"``).
        recipe (`Recipe` or `str`, *optional*): a resolved recipe (its layout is applied as is, whatever device it
            was resolved for), a recipe name, or ``None`` to choose by pipeline class.
        device (*optional*): ``"cpu"``, ``"cuda:1"`` ..., or a mapping component -> device (``"default"`` for the
            rest). ``None`` leaves components where they are. Each component is resolved for its own device.
        overrides (*optional*): YAML path, dict or a list of them (see ``get_recipe``).
        layout (*optional*): the device whose rules choose the dtypes when it is not where the pipeline runs
            (``layout="t4", device="cpu"`` runs the T4 layout on this CPU); see :func:`hf_precision.recipe.resolution`.
        strict (`bool`, defaults to `True`): a ``keep_fp32`` pattern that matches no module is an error.
        force (`bool`, defaults to `False`): apply a pipeline recipe whose ``pipelines`` list does not name this
            pipeline's class (otherwise a ``RecipeError`` names the recipes that do).

    Returns:
        `Applied`: a report of what was done; ``.remove()`` takes the hooks off, ``.verify()`` checks for drift.
        Applying again replaces the previous hooks instead of stacking them.

    Example:
        >>> from hf_precision.testing.pipelines import make_sdxl
        >>> pipe = make_sdxl()
        >>> applied = apply_recipe(pipe, device="cpu", layout="t4")
        >>> pipe.unet.conv_in.weight.dtype, pipe.unet.time_embedding.linear_1.weight.dtype, pipe.vae.dtype
        (torch.float16, torch.float32, torch.float32)
    """
    comps = _components(pipe)
    if "" in comps:
        if not isinstance(recipe, (str, Recipe)) or (isinstance(recipe, str) and recipe in list_recipes("pipeline")):
            got = f"{recipe!r} is a pipeline recipe; " if isinstance(recipe, str) else ""
            raise RecipeError(f"apply_recipe: {got}name a component recipe for a bare {type(comps['']).__name__}, "
                              f"e.g. recipe='video.wan'; component recipes: {', '.join(list_recipes('component'))}")
        stem = recipe.plans[0].name if isinstance(recipe, Recipe) else str(recipe).split(".")[0]
        comps = {stem: comps[""]}
    if device is None and not isinstance(recipe, Recipe):
        device = {n: _module_device(m) for n, m in comps.items()}  # resolve each for where it sits
    for spec in (device.values() if isinstance(device, Mapping) else [device]):
        if spec is not None:
            torch_device(spec, "device")
    from .source import models_of_pipeline

    resolved = resolve(recipe, pipeline_class=type(pipe).__name__, devices=device, layout=layout, overrides=overrides,
                       configs={n: _config_dict(m) for n, m in comps.items()}, components=list(comps),
                       models=models_of_pipeline(pipe) if "" not in comps else None, force=force)

    previous = getattr(pipe, _ATTR, None)
    if isinstance(previous, Applied) and not previous.removed:
        previous.remove()
    started = time.perf_counter()
    applied = Applied(recipe=resolved, devices={}, actions=[], hooked={}, islands={}, skipped=[])
    for name in comps:
        if name not in resolved:
            applied.skipped.append(f"{name} ({type(comps[name]).__name__}) is not in recipe {resolved.name}: left as it is")
    for plan in resolved.plans:
        module = comps.get(plan.name)
        if module is None:
            applied.skipped.append(f"{plan.name}: not in this pipeline")
            continue
        _apply_component(applied, plan, module, plan.device, strict)
    try:
        object.__setattr__(pipe, _ATTR, applied)
    except (AttributeError, TypeError):
        pass
    applied.timings["apply"] = time.perf_counter() - started
    return applied


def _apply_component(applied: Applied, plan: ComponentPlan, module: torch.nn.Module, device: str | None, strict: bool) -> None:
    old = getattr(module, _ATTR, None)
    if isinstance(old, Applied) and not old.removed:
        # The module is shared with another pipeline (from_pipe): its previous hooks go, they never stack.
        old.remove()
    if plan.classes and type(module).__name__ not in plan.classes:
        raise RecipeError(f"recipe {applied.recipe.name}: component {plan.name} is a {type(module).__name__}, but its "
                          f"component recipe {plan.recipe} is for {', '.join(plan.classes)}; its islands and entry points "
                          f"would not fit. Use a recipe for this class, or override the component recipe: "
                          f"{override_line(plan.name, 'use', '<component recipe>')} (hf-precision recipes lists them)")
    if strict:
        check_user_names(plan, module)
    islands = component_islands(plan, module, strict=strict)
    quantized = is_quantized(plan.storage) or any(is_quantized_tensor(p) for p in module.parameters())
    compute = dt.to_torch(plan.compute)
    storage = compute if is_quantized(plan.storage) else dt.to_torch(plan.storage)
    if quantized and device is not None and _module_device(module) != str(torch.device(device)):
        module.to(device)  # quantized tensors move as a whole (their data, scales and zero points together)
    if islands and has_layerwise_casting(module):
        # Layerwise-cast leaves recast their own weights on every call; an island around them cannot hold fp32.
        taken = [i for i in islands if has_layerwise_casting(module.get_submodule(i))]
        islands = [i for i in islands if i not in taken]
        if taken:
            applied.actions.append(f"{plan.name}: islands {taken} left to the layerwise casting already enabled on them")
    if is_quantized(plan.storage):
        # The backend quantized the weights at load (runtime/quantize.py); what it kept holds compute or fp32.
        changed = _cast_parameters(module, compute, islands, device)
        applied.actions.append(f"{plan.name}: weights stored {plan.storage}, computed in {plan.compute}")
    elif plan.storage != plan.compute:
        # Storage differs from compute: weights are cast per layer on use (diffusers layerwise casting).
        # Cast everything to compute first so the islands and non-hooked layers hold the compute dtype.
        changed = _cast_parameters(module, compute, islands, device)
        if has_layerwise_casting(module):
            applied.actions.append(f"{plan.name}: layerwise casting was already enabled: kept as it is")
        else:
            from diffusers.hooks import apply_layerwise_casting

            apply_layerwise_casting(module, storage_dtype=storage, compute_dtype=compute,
                                    skip_modules_pattern=layerwise_skip_regexes(islands, plan.layerwise_skip))
            applied.actions.append(f"{plan.name}: weights stored in {plan.storage}, cast to {plan.compute} per layer on use")
    else:
        changed = _cast_parameters(module, storage, islands, device)
    if changed:
        applied.actions.append(f"{plan.name}: cast/moved {changed} tensors")
    applied.devices[plan.name] = device or _module_device(module)
    applied.islands[plan.name] = islands

    if plan.compute == "float16" and _config_dict(module).get("force_upcast") and hasattr(module, "register_to_config"):
        # The recipe owns the VAE dtype: SDXL/SVD pipelines would otherwise flip the whole VAE to fp32 and back on
        # every call (erasing islands and doubling memory); the NaN guard covers overflow instead.
        module.register_to_config(force_upcast=False)
        applied.actions.append(f"{plan.name}: config.force_upcast True -> False (the recipe decides; NaN guard on)")
    if plan.upcast_attention:
        count = _upcast_attention(module)
        applied.actions.append(f"{plan.name}: attention softmax in fp32 in {count} attention modules")

    guard = None
    if plan.nan_guard:
        computable = device_caps(applied.recipe.device).compute
        fallbacks = [d for d in (torch.bfloat16, torch.float32) if dt.from_torch(d) in computable and d != compute]
        guard = nan_guard(fallbacks, plan.name, warn_switch)
    output: Any = plan.output if plan.output in ("input", "compute") else dt.to_torch(plan.output)
    entries = []
    for entry in plan.entry:
        try:
            sub = module.get_submodule(entry) if entry else module
        except AttributeError:
            continue  # e.g. AutoencoderKL(use_post_quant_conv=False) has no post_quant_conv
        hook = EntryHook(plan.name, sub, module, compute=compute, storage=storage, output=output, islands=islands,
                         prefix=entry, nan_guard=guard, no_cast=frozenset(plan.no_cast))
        applied._handles += attach(sub, hook)
        entries.append(entry or "(forward)")
    applied.hooked[plan.name] = entries
    if islands:
        outer = EntryHook(plan.name, module, module, compute=compute, storage=storage, output="compute", islands=islands)
        for island in islands:
            applied._handles += attach(module.get_submodule(island), IslandHook(module.get_submodule(island), outer.dtype))
    applied._modules[plan.name] = module
    object.__setattr__(module, _ATTR, applied)


def _upcast_attention(module: torch.nn.Module) -> int:
    # SDPA processors ignore `upcast_attention`; the classic processor honours it and computes softmax in fp32,
    # which is what fixes half-precision attention on MPS >= 14.5.
    from diffusers.models.attention_processor import Attention, AttnProcessor

    class UpcastAttnProcessor(AttnProcessor):
        """The classic processor with fp32 scores; the mask is made fp32 too (diffusers mixes them in baddbmm)."""

        def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None, attention_mask: Any = None,
                     *args: Any, **kwargs: Any) -> Any:
            if attention_mask is not None and attention_mask.is_floating_point():
                attention_mask = attention_mask.float()
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)

    count = 0
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.upcast_attention = sub.upcast_softmax = True
            sub.set_processor(UpcastAttnProcessor())
            count += 1
    return count
