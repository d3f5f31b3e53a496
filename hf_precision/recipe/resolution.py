"""Recipes: read, validate, merge and resolve them for a device. Torch-free.

A pipeline recipe (``recipes/sdxl.yaml``) names its components and points each at a component recipe
(``use: vae.sdxl`` = entry ``sdxl`` of ``recipes/components/vae.yaml``). Resolution merges, per component and
per key, in this order (later wins)::

    component recipe (use:, then select:)  <  pipeline recipe  <  pipeline devices: sections (in tag order)
    <  override files (each with its own devices: sections)  <  override dicts  <  --set flags

then picks the compute dtype: an explicit ``dtype`` (checked against the device), else the first of the
component's ordered ``dtypes`` that the device picks unasked, else float32.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

from .. import dtypes as dt
from ..errors import Problems, RecipeError, excerpt, override_fix, spelled

CPU = "cpu"
from .catalog import (check_recipe_class, component_entry, component_spec, list_recipes, pipeline_file, recipe_for,
                      unknown_recipe)
from .devices import DeviceCaps, TYPES, device_caps, device_profile, rule_ids
from .model import DEFAULT_LAYERWISE_SKIP, DEFAULT_NO_CAST, ComponentPolicy, Decision, Recipe
from .overrides import Layer, as_list, override_layer
from .quantize import canonical_storage, storage_rule
from .requires import requirements
from .schema import OUTPUTS, check_device_sections, check_pipeline, did_you_mean

__all__ = ["get_recipe", "resolve", "placement"]

def _base_policy(ref: str, source: str, path: str, config: Mapping[str, Any] | None,
                 seen: tuple[str, ...] = ()) -> dict[str, tuple[Any, str]]:
    """Follow ``use:`` chains and ``select:`` rules; returns key -> (value, source)."""
    if ref in seen:
        raise RecipeError(f"{source}: {path}.use: cycle {' -> '.join((*seen, ref))}")
    where, policy = component_entry(ref, source, path)
    merged: dict[str, tuple[Any, str]] = {}
    if "use" in policy:
        merged = _base_policy(policy["use"], where, "use", config, (*seen, ref))
    for key, value in policy.items():
        if key not in ("use", "select"):
            merged[key] = (_normalise(key, value), where)
    merged["recipe"] = (ref, where)  # the entry asked for, not the innermost one of its `use:` chain
    for rule in policy.get("select", ()):
        if config is not None and all(config.get(k) == v for k, v in rule["config"].items()):
            merged = _base_policy(rule["use"], where, "select", config, (*seen, ref))
            why = " ".join(str(rule.get("why", "")).split())
            merged["selected"] = (f"{rule['use']} because config has {rule['config']}" + (f" ({why})" if why else ""), where)
            break
    merged.setdefault("recipe", (ref, where))
    return merged


def _normalise(key: str, value: Any) -> Any:
    if key == "dtypes":
        return [dt.canonical(v) for v in value]
    if key == "dtype":
        return dt.canonical(value)
    if key in ("storage", "quantize"):
        if key == "storage":
            return canonical_storage(value)
        return {**value, "storage": [canonical_storage(v) for v in value.get("storage", [])]}
    if key == "output" and value not in OUTPUTS:
        return dt.canonical(value)
    if key == "why":
        return " ".join(str(value).split())
    return value


def _apply_layer(policies: dict[str, dict[str, tuple[Any, str]]], layer_components: Mapping[str, Mapping[str, Any]],
                 source: str, configs: Mapping[str, Mapping[str, Any]] | None) -> None:
    for comp, policy in layer_components.items():
        target = policies[comp]
        if "use" in policy:
            target.clear()
            target.update(_base_policy(policy["use"], source, f"components.{comp}", (configs or {}).get(comp)))
        for key, value in policy.items():
            if key != "use":
                target[key] = (_normalise(key, value), source)


def get_recipe(name: str | Mapping[str, Any] = "sdxl", device: str | DeviceProfile | None = None, overrides: Any = None,
               configs: Mapping[str, Mapping[str, Any]] | None = None) -> Recipe:
    """Resolve a shipped recipe for a device, with optional overrides. Pure data: no torch, no weights.

    Args:
        name (`str` or `dict`): a pipeline recipe (``"sdxl"``; :func:`list_recipes`), a component recipe
            (``"vae.sdxl"``: a one-component recipe), your own recipe file (``"my_arch.yaml"``), or composed data.
        device (`str` or `DeviceProfile`, *optional*): a present device (``"cuda:1"``), a preset (``"t4"``) or a
            description (``"cuda:sm=8.0"``). Defaults to the best present device.
        overrides: a YAML path, a dict, or a list of them, merged in order over the recipe.
        configs (*optional*): component -> its ``config.json`` dict, for recipes that choose by config (the
            fp16-fix VAE is recognised by ``force_upcast: false``).

    Returns a frozen `Recipe`: per component its dtypes, float32 islands and the rule behind each decision. Raises
    RecipeError for an unknown recipe, device, component, key or dtype, or a dtype the device cannot compute.

    Example:
        >>> r = get_recipe("sdxl", device="a100", overrides={"vae": {"dtype": "float32"}})
        >>> r["vae"].compute, r["unet"].compute, r["unet"].keep_fp32
        ('float32', 'float16', ('time_embedding', 'add_embedding'))
    """
    caps = device_caps(device)
    configs = configs or {}
    pipelines = list_recipes("pipeline")
    if isinstance(name, Mapping):  # a composed recipe (recipe.compose) or a shipped one refitted to the classes present
        spec = dict(name)
        label, origin = spec.pop("recipe_name", None), spec.pop("origin", None)
        source, data = check_pipeline(spec, origin or f"composed for {', '.join(spec.get('pipelines') or ['?'])}", rule_ids())
        name = str(label or f"composed:{(data.get('pipelines') or ['?'])[0]}")
    elif (name := str(name)) in pipelines or name.endswith((".yaml", ".yml")):  # before the "." test: a path has a suffix
        source, data = pipeline_file(name)
    elif "." in name and "/" not in name:  # a component recipe (vae.sdxl); a Hub id has a '/'
        stem = name.split(".", 1)[0]
        data = {"schema": 1, "model": None, "pipelines": [], "latents_from": None, "components": {stem: {"use": name}}}
        source = "get_recipe"
        component_entry(name, source, f"components.{stem}")
    else:
        raise unknown_recipe(name)

    components = list(data["components"])
    policies: dict[str, dict[str, tuple[Any, str]]] = {c: {} for c in components}
    _apply_layer(policies, data["components"], source, configs)
    device_sections = check_device_sections(data.get("devices"), set(components), rule_ids(), Problems(source))
    layers = [Layer(source, {}, device_sections)]
    sources = [source]
    for i, item in enumerate(as_list(overrides)):
        layer = override_layer(item, set(components), i)
        layers.append(layer)
        sources.append(layer.source)
    for layer in layers:
        _apply_layer(policies, layer.components, layer.source, configs)
        for tag in caps.tags:
            _apply_layer(policies, layer.devices.get(tag, {}), f"{layer.source} devices.{tag}", configs)

    problems: list[str] = []
    resolved = [_resolve_component(c, policies[c], caps, problems) for c in components]
    if problems:
        raise RecipeError(problems)
    latents_from = data.get("latents_from")
    by_name = {p.name: p for p in resolved}
    final = []
    for p in resolved:
        if p.output == "input":
            src = by_name.get(latents_from) if latents_from else p
            handed = (src or p).compute
            rule = (f"the dtype its input latents arrive in: the pipeline takes it from {latents_from}"
                    if latents_from and latents_from != p.name else "the dtype its inputs arrive in")
        else:
            handed = p.compute if p.output == "compute" else p.output
            rule = "its compute dtype" if p.output == "compute" else f"output: {p.output}"
        decisions = (*p.decisions, Decision("hands over", handed, rule, p.recipe))
        final.append(dataclasses.replace(p, handed_over=handed, decisions=decisions))
    label = caps.profile.label()
    return Recipe(name=name, schema=int(data.get("schema", 1)), model=data.get("model"),
                  pipelines=tuple(data.get("pipelines") or ()), latents_from=latents_from, device=caps.profile,
                  device_tags=caps.tags, policies=tuple(dataclasses.replace(p, resolved_for=label) for p in final),
                  sources=tuple(sources), denoiser=data.get("denoiser"), requires=requirements(data, configs))


def _why_device(caps: DeviceCaps, dtype: str) -> str:
    for tag, why in caps.why.items():
        if dt.short(dtype) in why or dtype in why:
            return f"rule {tag}: {why}"
    return "; ".join(f"rule {t}" for t in caps.tags)


def _resolve_component(name: str, policy: dict[str, tuple[Any, str]], caps: DeviceCaps, problems: list[str]) -> ComponentPolicy:
    get = lambda k, default=None: policy.get(k, (default, ""))[0]
    src = lambda k: policy.get(k, (None, "default"))[1]
    decisions: list[Decision] = []
    if "selected" in policy:
        decisions.append(Decision("recipe", get("recipe"), f"selected {get('selected')}", src("selected")))
    tolerated = list(get("dtypes") or ["float32"])
    device = caps.profile.label()
    forced = get("dtype")
    if forced:
        if forced not in caps.compute:
            fix = next((d for d in tolerated if d in caps.auto), "float32")
            problems.append(
                f"{src('dtype')}: components.{name}.dtype: {forced} cannot be computed on {device}; "
                f"allowed there: {', '.join(caps.compute)} ({_why_device(caps, forced)}); "
                f"fix: {override_fix(src('dtype'), name, 'dtype', fix)}")
        compute = forced
        note = "" if forced in tolerated else f" (outside the tolerated {tolerated}; NaN guard advised)"
        decisions.append(Decision("compute", compute, "forced by dtype" + note, src("dtype")))
    else:
        compute = next((d for d in tolerated if d in caps.auto), "float32")
        if compute in tolerated:
            rule = (f"first of the tolerated dtypes {tolerated} that {caps.profile.type} picks unasked "
                    f"(auto: {list(caps.auto)}; tags {', '.join(caps.tags)})")
        else:
            rule = f"none of the tolerated dtypes {tolerated} is picked unasked on this device (auto: {list(caps.auto)}): float32"
        decisions.append(Decision("compute", compute, rule, src("dtypes")))
    storage = get("storage") or compute
    quant = get("quantize") or {}
    if get("storage"):
        rule = storage_rule(name, storage, compute, quant, caps, problems, src("storage"))
        decisions.append(Decision("storage", storage, rule, src("storage")))
    else:
        decisions.append(Decision("storage", storage, "same as compute", src("dtypes") if not forced else src("dtype")))
    islands = tuple(get("keep_fp32") or ())
    if islands:
        active = compute != "float32"
        decisions.append(Decision("keep_fp32", ", ".join(islands),
                                  "float32 islands" + ("" if active else " (no-op: the component already computes in fp32)"),
                                  src("keep_fp32")))
    nan_guard = bool(get("nan_guard")) and compute in dt.HALF
    if get("nan_guard"):
        decisions.append(Decision("nan_guard", str(nan_guard).lower(),
                                  "re-run in bf16/fp32 when the output is not finite" if nan_guard else "off: not in half precision",
                                  src("nan_guard")))
    explicit_upcast = get("upcast_attention")
    upcast = explicit_upcast if explicit_upcast is not None else (caps.upcast_attention and compute in dt.HALF)
    if upcast:
        decisions.append(Decision("upcast_attention", "true", "set" if explicit_upcast is not None else
                                  _why_device(caps, "attention"), src("upcast_attention") if explicit_upcast is not None else "devices.yaml"))
    for key in ("entry", "layerwise_skip"):
        # a user's names are checked where the modules are known (apply_recipe, plan), through this decision
        if get(key) and not src(key).startswith(("recipes/", "composed for")):
            names = ", ".join(v or "(forward)" for v in get(key))
            decisions.append(Decision(key, names, "set by the user: must name modules of the component", src(key)))
    return ComponentPolicy(name=name, storage=storage, compute=compute, output=get("output") or "compute", handed_over="",
                         keep_fp32=islands, entry=tuple(get("entry") or ("",)), nan_guard=nan_guard,
                         upcast_attention=bool(upcast), dtypes=tuple(tolerated), classes=tuple(get("class") or ()),
                         recipe=str(get("recipe") or ""), why=str(get("why") or ""), decisions=tuple(decisions),
                         no_cast=tuple(DEFAULT_NO_CAST if get("no_cast") is None else get("no_cast")),
                         layerwise_skip=tuple(get("layerwise_skip") or DEFAULT_LAYERWISE_SKIP),
                         quantize=tuple(quant.get("storage") or ()), quantize_keep=tuple(quant.get("keep") or ()))


# ------------------------------------------------------------------------------------- the one door


def placement(devices: Any, names: Iterable[str], also: Iterable[str] = ()) -> dict[str, str | None]:
    """Component -> the torch device string it is placed on (``None``: not placed), checked without torch.

    ``devices``: one device for all (``"cuda:1"``), or component -> device with an optional ``"default"`` (keys may
    name ``also``: unplanned components). Presets (``"t4"``) are devices you plan for: they belong in ``layout=``.

    Example:
        >>> placement({"text_encoder": "cpu", "default": "CUDA:1"}, ["text_encoder", "unet"])
        {'text_encoder': 'cpu', 'unet': 'cuda:1'}
    """
    names = list(names)

    def one(spec: Any, what: str) -> str | None:
        if spec is None:
            return None
        text = str(spec).strip().lower()
        kind, colon, index = text.partition(":")
        if kind in TYPES and (not colon or index.isdigit()):
            return text
        raise RecipeError(f"{what}: {spec!r} is not a device tensors can be placed on ({', '.join(TYPES)}, or with an "
                          f"index: cuda:1). To run the layout of a device you do not have, place the pipeline here and "
                          f"resolve for that device: {spelled(f'layout={spec!r}, device={CPU!r}', f'--layout {spec} --device cpu')}")

    if devices is None:
        return {n: None for n in names}
    if isinstance(devices, Mapping):
        known = [*names, *(a for a in also if a not in names)]
        _check_keys("device", devices, known)
        return {n: one(devices.get(n, devices.get("default")), f"device[{n!r}]") for n in names}
    place = one(devices, "device")
    return {n: place for n in names}


def _check_keys(what: str, mapping: Mapping[Any, Any], known: list[str]) -> None:
    """Refuse a component -> device mapping (``device=``, ``layout=``) that names a component the pipeline lacks."""
    unknown = sorted(str(k) for k in mapping if k not in known and k != "default")
    if unknown:
        raise RecipeError(f"{what} mapping: unknown component(s) {unknown}; components: {', '.join(known)}, "
                          f"or 'default' for the rest{did_you_mean(unknown[0], known)}")


def _fit_classes(name: str, resolved: Recipe, models: Mapping[str, tuple[str, str]]) -> str | dict[str, Any]:
    """The recipe's data with each component whose model class its recipe does not list (diffusers' tests build Wan
    with a T5EncoderModel, the release has UMT5) given its own class's recipe or the unknown-class treatment;
    ``name`` itself when every class fits. ``resolved``: ``name`` with the user's overrides, so a `use:` they set
    is checked too.
    """
    misfits = {p.name: models[p.name] for p in resolved.policies
               if p.name in models and p.classes and models[p.name][0] not in p.classes}
    if not misfits:
        return name
    source, data = pipeline_file(name)
    components = dict(data["components"])
    for comp, (cls, role) in misfits.items():
        fitted = component_spec(comp, cls, role)
        was = resolved[comp]
        fitted["why"] = (f"{name} names {was.recipe} ({', '.join(was.classes)}) for {comp}, but this pipeline's {comp} is "
                         f"a {cls}: " + (f"{fitted['use']}, the component recipe for {cls}" if "use" in fitted
                                         else str(fitted["why"])))
        components[comp] = fitted
    if any("use" not in components[c] for c in misfits):
        unknown = [f"{c} ({misfits[c][0]})" for c in misfits if "use" not in components[c]]
        warnings.warn(f"recipe {name}: no component recipe for {', '.join(unknown)}; kept in a dtype its device picks "
                      f"unasked, with boundary casts and the NaN guard", stacklevel=3)
    return {**data, "components": components, "recipe_name": name, "origin": source}


def resolve(recipe: str | Recipe | None = None, *, pipeline_class: str | None = None, devices: Any = None,
            layout: Any = None, overrides: Any = None, configs: Mapping[str, Mapping[str, Any]] | None = None,
            components: Iterable[str] = (), models: Mapping[str, tuple[str, str]] | None = None,
            force: bool = False) -> Recipe:
    """The one door from "which recipe, which devices, which overrides" to one frozen plan (every program's).

    Args:
        recipe (`str` or `Recipe`, *optional*): a recipe name or a user's recipe file; ``None`` picks it from
            ``pipeline_class``. A resolved :class:`Recipe` is taken as is (only placed): it cannot take overrides.
        pipeline_class (`str`, *optional*): the diffusers pipeline class (``model_index.json``'s ``_class_name``).
        devices (*optional*): where the components sit: ``"cuda"``, ``"cpu"``, or ``{component: device,
            "default": device}``. ``None``: placed nowhere (a plan on the meta device).
        layout (*optional*): the device(s) whose rules choose the dtypes (a preset, a description, a
            :class:`DeviceProfile`, or a mapping like ``devices``); default each component's own device. This is
            how a T4 layout runs on a CPU.
        overrides, configs (*optional*): as :func:`get_recipe` takes them.
        components (*optional*): every component the pipeline has; a ``devices`` mapping may name these too.
        models (*optional*): component -> (model class, role), composed into a recipe where none lists the class
            (:func:`hf_precision.recipe.catalog.recipe_for`).
        force (`bool`, defaults to `False`): accept a pipeline recipe whose ``pipelines`` list does not name
            ``pipeline_class`` (otherwise a ``RecipeError`` names the recipes that do).

    Returns a frozen `Recipe` whose plans record ``device`` and ``resolved_for``. Raises RecipeError for no recipe,
    a preset as ``devices``, a resolved Recipe with overrides or a layout, or what :func:`get_recipe` refuses.

    Example:
        >>> r = resolve(pipeline_class="StableDiffusionXLPipeline", devices="cpu", layout="t4")
        >>> r["unet"].compute, r["unet"].device, r["unet"].resolved_for
        ('float16', 'cpu', 'cuda (Tesla T4, sm 7.5)')
    """
    if isinstance(recipe, Recipe):
        check_recipe_class(recipe.name, recipe.pipelines, pipeline_class, force)
        if overrides:
            raise RecipeError("overrides need a recipe name, not a resolved Recipe: pass recipe='sdxl', overrides=... "
                              "(or resolve with hf_precision.get_recipe(name, device, overrides))")
        if layout is not None:
            raise RecipeError("a resolved Recipe already has its layout; pass the recipe name with layout=..., "
                              "or resolve it for that device with hf_precision.get_recipe(name, device=...)")
        if devices is None:
            return recipe  # nothing to place: the very object (callers may hold on to it)
        place = placement(devices, [p.name for p in recipe.policies], components)
        plans = tuple(dataclasses.replace(p, device=place.get(p.name) or p.device) for p in recipe.policies)
        return dataclasses.replace(recipe, policies=plans)
    chosen = recipe is None  # by class: refitted to the classes present; a recipe the user names is taken as named
    if recipe is None:
        if not pipeline_class:
            raise RecipeError("resolve: name a recipe (recipe='sdxl') or give the pipeline class it is for")
        recipe = recipe_for(str(pipeline_class), models)  # type: ignore[assignment]
    name: Any = recipe if isinstance(recipe, Mapping) else str(recipe)
    best = layout if layout is not None and not isinstance(layout, Mapping) else None
    first = get_recipe(name, device=best, overrides=overrides, configs=configs)
    if chosen and models and not isinstance(name, Mapping):
        fitted = _fit_classes(name, first, models)
        if fitted is not name:  # rare: only then resolve again, from the refitted data
            name = fitted
            first = get_recipe(name, device=best, overrides=overrides, configs=configs)
    check_recipe_class(first.name, first.pipelines, pipeline_class, force)
    names = [p.name for p in first.policies]
    place = placement(devices, names, components)

    def rules_for(component: str) -> Any:
        if isinstance(layout, Mapping):
            chosen = layout.get(component, layout.get("default"))
            if chosen is not None:
                return chosen
        elif layout is not None:
            return layout
        return place[component]  # None: the best present device

    wanted = {n: rules_for(n) for n in names}
    if isinstance(layout, Mapping):
        _check_keys("layout", layout, names)
    by_spec: dict[str, Recipe] = {}
    for spec in wanted.values():
        key = repr(spec)
        if key not in by_spec:
            profile = device_profile(spec)
            by_spec[key] = first if profile == first.device else get_recipe(name, device=profile, overrides=overrides,
                                                                            configs=configs)
    main_name = first.denoiser if first.denoiser in wanted else names[0]
    main = by_spec[repr(wanted[main_name])]
    plans = tuple(dataclasses.replace(by_spec[repr(wanted[p.name])][p.name], device=place[p.name]) for p in main.policies)
    return dataclasses.replace(main, policies=plans)
