"""apply_recipe: put each component of a built pipeline in its planned dtype and device, and hook its boundaries."""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from collections.abc import Mapping
from typing import Any

import torch

from . import dtypes as dt
from .devices import device_caps, device_profile
from .errors import RecipeError
from .hooks import EntryHook, IslandHook, attach, nan_guard, warn_switch
from .recipe import ComponentPlan, Recipe, get_recipe, list_recipes, _pipeline_file
from .select import inside, resolve_islands

__all__ = ["apply_recipe", "Applied", "recipe_for_class", "resolve_placement", "component_islands", "planned_dtypes"]

_ATTR = "_hf_precision_applied"
# Modules diffusers' layerwise casting leaves in the compute dtype (besides the islands): precision-sensitive
# embeddings and norms, as in diffusers' own DEFAULT_SKIP_MODULES_PATTERN.
LAYERWISE_SKIP = ("pos_embed", "patch_embed", "norm")


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
            plan = self.recipe[name]
            planned = planned_dtypes(module, plan, self.islands.get(name, []))
            wrong: dict[str, int] = {}
            for pname, param in module.named_parameters():
                if pname not in planned:
                    continue
                want = planned[pname]
                have = dt.from_torch(param.dtype)
                if have != want:
                    key = f"{'island ' if want == 'float32' and plan.storage != 'float32' else ''}{have}!={want}"
                    wrong[key] = wrong.get(key, 0) + 1
            for key, count in wrong.items():
                have, want = key.split(" ")[-1].split("!=")
                what = "float32 island parameters" if key.startswith("island") else "parameters"
                problems.append(f"{name}: {count} {what} are {have}, the plan says {want} "
                                f"(was the pipeline cast with pipe.to(dtype)? reload it, or re-apply: "
                                f"hf_precision.apply_recipe(pipe); override: --set {name}.dtype={have})")
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


def recipe_for_class(class_name: str) -> str:
    """The pipeline recipe whose ``pipelines`` list names this pipeline class."""
    for name in list_recipes("pipeline"):
        if class_name in (_pipeline_file(name)[1].get("pipelines") or ()):
            return name
    known = {n: _pipeline_file(n)[1].get("pipelines") for n in list_recipes("pipeline")}
    raise RecipeError(f"no recipe for pipeline class {class_name!r}; recipes and the classes they cover: "
                      + "; ".join(f"{n}: {', '.join(c)}" for n, c in known.items())
                      + ". Pass one explicitly, e.g. recipe='sdxl' (or --recipe sdxl), or write your own recipe YAML")


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
                          f"recipe=hf_precision.get_recipe(NAME, device={spec!r}), device='cpu'") from None
    return dev


def resolve_placement(device: Any, names: list[str]) -> dict[str, str | None]:
    """Component -> torch device string (``None``: leave it where it is)."""
    if device is None:
        return {n: None for n in names}
    if isinstance(device, Mapping):
        unknown = [k for k in device if k not in names and k != "default"]
        if unknown:
            raise RecipeError(f"device mapping: unknown component(s) {unknown}; components: {', '.join(names)}, "
                              f"or 'default' for the rest")
        out = {}
        for n in names:
            spec = device.get(n, device.get("default"))
            out[n] = None if spec is None else str(torch_device(spec, f"device[{n!r}]"))
        return out
    dev = str(torch_device(device, "device"))
    return {n: dev for n in names}


def _config_dict(module: torch.nn.Module) -> dict[str, Any]:
    config = getattr(module, "config", None)
    if isinstance(config, Mapping):
        return dict(config)
    return config.to_dict() if hasattr(config, "to_dict") else {}


def _module_device(module: torch.nn.Module) -> str:
    for p in module.parameters():
        return str(p.device)
    return "cpu"


def _resolve(pipe: Any, comps: Mapping[str, torch.nn.Module], recipe: Recipe | str | None, placement: Mapping[str, str | None],
             overrides: Any) -> Recipe:
    if isinstance(recipe, Recipe):
        if overrides:
            raise RecipeError("apply_recipe: overrides need a recipe name, not a resolved Recipe: "
                              "pass recipe='sdxl', overrides=... or resolve with get_recipe(name, device, overrides)")
        return recipe
    if recipe is None:
        recipe = recipe_for_class(type(pipe).__name__)
    configs = {n: _config_dict(m) for n, m in comps.items()}
    devices = {n: placement.get(n) or _module_device(m) for n, m in comps.items()}
    return resolve_per_device(recipe, devices, overrides, configs)


def resolve_per_device(recipe: str, devices: Mapping[str, str], overrides: Any,
                       configs: Mapping[str, Mapping[str, Any]]) -> Recipe:
    """Resolve a recipe with each component on its own device ("text encoders on the CPU, UNet on the GPU")."""
    by_device = {spec: get_recipe(recipe, device=device_profile(spec), overrides=overrides, configs=configs)
                 for spec in sorted(set(devices.values()))}
    main = by_device[devices.get("unet") or devices.get("transformer") or next(iter(devices.values()))]
    if len(by_device) == 1:
        return main
    plans = tuple(by_device[devices[p.name]][p.name] if p.name in devices else p for p in main.plans)
    return dataclasses.replace(main, plans=plans)


def _cast_parameters(module: torch.nn.Module, storage: torch.dtype, islands: list[str], device: str | None) -> int:
    """Cast floating parameters and buffers in place: islands to fp32, the rest to storage. Returns how many changed."""
    changed = 0
    in_island = lambda name: inside(name, islands)
    with torch.no_grad():
        for mod_name, mod in module.named_modules():
            for kind in ("_parameters", "_buffers"):
                for leaf, tensor in getattr(mod, kind).items():
                    if tensor is None or tensor.device.type == "meta":
                        continue
                    target = tensor.dtype
                    if tensor.is_floating_point():
                        target = torch.float32 if in_island(mod_name) else storage
                    dev = torch.device(device) if device is not None else tensor.device
                    if tensor.dtype != target or tensor.device != dev:
                        tensor.data = tensor.data.to(device=dev, dtype=target)
                        changed += 1
    return changed


def _glob_regex(patterns: list[str]) -> list[str]:
    return [fnmatch.translate(p).replace(r"\Z", "$") for p in patterns]


def component_islands(plan: ComponentPlan, module: torch.nn.Module, *, strict: bool = True) -> list[str]:
    """The float32 islands of a built component under a plan (outermost matched modules; none in fp32)."""
    names = [n for n, _ in module.named_modules() if n]
    return resolve_islands(plan.name, plan.keep_fp32, names, owner=type(module).__name__,
                           active=plan.compute != "float32", strict=strict)


def _layerwise_layers(module: torch.nn.Module, islands: list[str]) -> set[str]:
    """Modules diffusers' ``apply_layerwise_casting`` stores in the storage dtype (its traversal, with our skips)."""
    try:
        from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS as supported
    except ImportError:  # older diffusers: the same list
        nn = torch.nn
        supported = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)
    patterns = _glob_regex(islands) + list(LAYERWISE_SKIP)
    found: set[str] = set()

    def walk(mod: torch.nn.Module, prefix: str) -> None:
        if any(re.search(p, prefix) for p in patterns):
            return
        if isinstance(mod, supported):
            found.add(prefix)
            return
        for child_name, child in mod.named_children():
            walk(child, f"{prefix}.{child_name}" if prefix else child_name)

    walk(module, "")
    return found


def planned_dtypes(module: torch.nn.Module, plan: ComponentPlan, islands: list[str]) -> dict[str, str]:
    """Floating parameter name -> the dtype :func:`apply_recipe` keeps it in, between forward passes.

    Islands are float32. With ``storage == compute`` every other parameter is in the storage dtype; otherwise the
    layers diffusers' layerwise casting handles are in the storage dtype and the rest in the compute dtype. Works
    on the meta device (no weights needed); tied parameters are listed once.
    """
    layerwise = _layerwise_layers(module, islands) if plan.storage != plan.compute else set()
    out: dict[str, str] = {}
    for pname, param in module.named_parameters():
        if not param.is_floating_point():
            continue
        owner = pname.rpartition(".")[0]
        if inside(owner, islands):
            out[pname] = "float32"
        elif plan.storage == plan.compute or inside(owner, layerwise):
            out[pname] = plan.storage
        else:
            out[pname] = plan.compute
    return out


def apply_recipe(pipe: Any, recipe: Recipe | str | None = None, device: Any = None, overrides: Any = None,
                 *, strict: bool = True) -> Applied:
    """Apply a recipe to a pipeline you built: dtypes, placement, float32 islands and boundary hooks, in place.

    Args:
        pipe: a diffusers pipeline, or a bare model (then name a component recipe, e.g. ``recipe="dit.video"``).
        recipe (`Recipe` or `str`, *optional*): a resolved recipe (its layout is applied as is, whatever device it
            was resolved for), a recipe name, or ``None`` to choose by pipeline class.
        device (*optional*): ``"cpu"``, ``"cuda:1"`` ..., or a mapping component -> device (``"default"`` for the
            rest). ``None`` leaves components where they are. Each component is resolved for its own device.
        overrides (*optional*): YAML path, dict or a list of them (see ``get_recipe``).
        strict (`bool`, defaults to `True`): a ``keep_fp32`` pattern that matches no module is an error.

    Returns:
        `Applied`: a report of what was done; ``.remove()`` takes the hooks off, ``.verify()`` checks for drift.
        Applying again replaces the previous hooks instead of stacking them.

    Example:
        >>> from hf_precision import get_recipe
        >>> from hf_precision.synthetic import make_sdxl
        >>> pipe = make_sdxl()
        >>> applied = apply_recipe(pipe, get_recipe("sdxl", device="t4"), device="cpu")
        >>> pipe.unet.conv_in.weight.dtype, pipe.unet.time_embedding.linear_1.weight.dtype, pipe.vae.dtype
        (torch.float16, torch.float32, torch.float32)
    """
    comps = _components(pipe)
    if "" in comps:
        if not isinstance(recipe, (str, Recipe)):
            raise RecipeError(f"apply_recipe: name a component recipe for a bare {type(comps['']).__name__}, "
                              f"e.g. recipe='dit.video'; component recipes: {', '.join(list_recipes('component'))}")
        stem = recipe.plans[0].name if isinstance(recipe, Recipe) else str(recipe).split(".")[0]
        comps = {stem: comps[""]}
    placement = resolve_placement(device, list(comps))
    resolved = _resolve(pipe, comps, recipe, placement, overrides)

    previous = getattr(pipe, _ATTR, None)
    if isinstance(previous, Applied) and not previous.removed:
        previous.remove()
    applied = Applied(recipe=resolved, devices={}, actions=[], hooked={}, islands={}, skipped=[])
    for name in comps:
        if name not in resolved:
            applied.skipped.append(f"{name} ({type(comps[name]).__name__}) is not in recipe {resolved.name}: left as it is")
    for plan in resolved.plans:
        module = comps.get(plan.name)
        if module is None:
            applied.skipped.append(f"{plan.name}: not in this pipeline")
            continue
        _apply_component(applied, plan, module, placement.get(plan.name), strict)
    try:
        object.__setattr__(pipe, _ATTR, applied)
    except (AttributeError, TypeError):
        pass
    return applied


def _apply_component(applied: Applied, plan: ComponentPlan, module: torch.nn.Module, device: str | None, strict: bool) -> None:
    old = getattr(module, _ATTR, None)
    if isinstance(old, Applied) and not old.removed:
        # The module is shared with another pipeline (from_pipe): its previous hooks go, they never stack.
        old.remove()
    islands = component_islands(plan, module, strict=strict)
    compute, storage = dt.to_torch(plan.compute), dt.to_torch(plan.storage)
    if islands and _has_layerwise_casting(module):
        # Layerwise-cast leaves recast their own weights on every call; an island around them cannot hold fp32.
        taken = [i for i in islands if _has_layerwise_casting(module.get_submodule(i))]
        islands = [i for i in islands if i not in taken]
        if taken:
            applied.actions.append(f"{plan.name}: islands {taken} left to the layerwise casting already enabled on them")
    if plan.storage != plan.compute:
        # Storage differs from compute: weights are cast per layer on use (diffusers layerwise casting).
        # Cast everything to compute first so the islands and non-hooked layers hold the compute dtype.
        changed = _cast_parameters(module, compute, islands, device)
        if _has_layerwise_casting(module):
            applied.actions.append(f"{plan.name}: layerwise casting was already enabled: kept as it is")
        else:
            from diffusers.hooks import apply_layerwise_casting

            apply_layerwise_casting(module, storage_dtype=storage, compute_dtype=compute,
                                    skip_modules_pattern=_glob_regex(islands) + list(LAYERWISE_SKIP))
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
                         prefix=entry, nan_guard=guard)
        applied._handles += attach(sub, hook)
        entries.append(entry or "(forward)")
    applied.hooked[plan.name] = entries
    if islands:
        outer = EntryHook(plan.name, module, module, compute=compute, storage=storage, output="compute", islands=islands)
        for island in islands:
            applied._handles += attach(module.get_submodule(island), IslandHook(module.get_submodule(island), outer.dtype))
    applied._modules[plan.name] = module
    object.__setattr__(module, _ATTR, applied)


def _has_layerwise_casting(module: torch.nn.Module) -> bool:
    # diffusers refuses to add the hook twice and cannot remove it (its deinitalize_hook raises).
    return any(getattr(getattr(m, "_diffusers_hook", None), "hooks", {}).get("layerwise_casting") is not None
               for m in module.modules())


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
