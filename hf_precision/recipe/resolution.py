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
import difflib
import functools
import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from .devices import DeviceCaps, DeviceProfile, device_caps
from ..errors import Problems, RecipeError, excerpt, override_line
from .files import parse_yaml, read_yaml, recipes_dir

__all__ = ["Recipe", "ComponentPlan", "Decision", "get_recipe", "list_recipes", "parse_set", "pipeline_spec", "placement",
           "recipe_classes", "recipe_components", "recipe_for_class", "resolve", "component_entries", "check_recipe_class",
           "training_overrides"]

SCHEMAS = (1,)
OUTPUTS = ("input", "compute")
# Keys of a component policy, with the type each must have. `dtype` forces the compute dtype.
POLICY_KEYS: dict[str, str] = {
    "use": "str", "class": "list", "dtypes": "dtype-list", "dtype": "dtype", "storage": "dtype",
    "output": "output", "keep_fp32": "str-list", "entry": "str-list", "nan_guard": "bool",
    "upcast_attention": "bool", "why": "str", "select": "select", "no_cast": "str-list", "layerwise_skip": "str-list",
}
OVERRIDE_KEYS = {"dtype", "storage", "output", "keep_fp32", "nan_guard", "upcast_attention", "why", "use", "dtypes", "entry",
                 "no_cast", "layerwise_skip"}
# Float arguments of a component's forward that are moved to its device but never cast: timesteps feed sinusoidal
# projections that diffusers computes in fp32 (unet_2d_condition.py get_time_embed); rounding 999.4 to fp16 first
# would change them. Recipes extend the list per architecture (Flux: guidance, img_ids, txt_ids).
DEFAULT_NO_CAST = ("timestep", "timesteps", "t")
# Modules kept in the compute dtype when weights are stored in another dtype (diffusers layerwise casting): the
# same precision-sensitive families diffusers skips by default (hooks/layerwise_casting.py
# DEFAULT_SKIP_MODULES_PATTERN), written as globs on module names under the one matching rule.
DEFAULT_LAYERWISE_SKIP = ("*pos_embed*", "*patch_embed*", "*norm*")
# `training:` holds what differs when the pipeline is trained (same shape as an override file; hf_precision.training).
PIPELINE_KEYS = {"schema", "kind", "model", "pipelines", "latents_from", "denoiser", "components", "devices", "why",
                 "training"}
COMPONENT_FILE_KEYS = {"schema", "kind", "components"}
OVERRIDE_TOP_KEYS = {"schema", "components", "devices"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """Why a field of a resolved component has its value."""

    field: str
    value: str
    rule: str
    source: str


@dataclasses.dataclass(frozen=True)
class ComponentPlan:
    """One component of a resolved recipe: its dtypes, islands and entry points, and why."""

    name: str
    storage: str
    compute: str
    output: str
    handed_over: str
    keep_fp32: tuple[str, ...]
    entry: tuple[str, ...]
    nan_guard: bool
    upcast_attention: bool
    dtypes: tuple[str, ...]
    classes: tuple[str, ...]
    recipe: str
    why: str
    decisions: tuple[Decision, ...]
    # Where the component sits (a torch device string such as "cuda:0"), or None for a plan placed nowhere yet
    # (a meta-device plan); and the device whose rules chose its dtypes (differs under a layout).
    device: str | None = None
    resolved_for: str = ""
    no_cast: tuple[str, ...] = DEFAULT_NO_CAST
    layerwise_skip: tuple[str, ...] = DEFAULT_LAYERWISE_SKIP

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["decisions"] = [dataclasses.asdict(x) for x in self.decisions]
        return d


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A recipe fully resolved for one device. Frozen; prints as a table; ``to_json()`` for machines.

    Example:
        >>> r = get_recipe("sdxl", device="t4")
        >>> r["vae"].compute, r["unet"].compute
        ('float32', 'float16')
    """

    name: str
    schema: int
    model: str | None
    pipelines: tuple[str, ...]
    latents_from: str | None
    device: DeviceProfile
    device_tags: tuple[str, ...]
    plans: tuple[ComponentPlan, ...]
    sources: tuple[str, ...]
    denoiser: str | None = None

    @property
    def components(self) -> dict[str, ComponentPlan]:
        return {p.name: p for p in self.plans}

    def __getitem__(self, name: str) -> ComponentPlan:
        for p in self.plans:
            if p.name == name:
                return p
        raise KeyError(f"recipe {self.name!r} has no component {name!r}; it has {[p.name for p in self.plans]}")

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self.plans)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "schema": self.schema, "model": self.model, "pipelines": list(self.pipelines),
                "latents_from": self.latents_from, "denoiser": self.denoiser, "device": self.device.to_dict(), "device_tags": list(self.device_tags),
                "components": {p.name: p.to_dict() for p in self.plans}, "sources": list(self.sources)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self, why: bool = True) -> str:
        head = ("component", "storage", "compute", "hands over", "fp32 islands", "notes")
        rows = []
        for p in self.plans:
            notes = [n for n, on in (("nan-guard", p.nan_guard), ("attn-upcast", p.upcast_attention)) if on]
            rows.append((p.name, p.storage, p.compute, p.handed_over, ", ".join(p.keep_fp32) or "-", " ".join(notes) or "-"))
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
        out = [f"recipe {self.name} for {self.device.label()}  [tags: {', '.join(self.device_tags)}]",
               line(head), line(tuple("-" * w for w in widths)), *map(line, rows)]
        if why:
            out.append("")
            out.append("decisions:")
            for p in self.plans:
                for d in p.decisions:
                    out.append(f"  {p.name}.{d.field} = {d.value}: {d.rule} [{d.source}]")
        return "\n".join(out)

    __str__ = table


# --------------------------------------------------------------------------------------------- reading


@dataclasses.dataclass
class _Layer:
    """One source of policy values: component -> key -> value, plus device sections."""

    source: str
    components: dict[str, dict[str, Any]]
    devices: dict[str, dict[str, dict[str, Any]]]


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(recipes_dir().parent))
    except ValueError:
        return str(path)


@functools.lru_cache(maxsize=None)
def _component_file(stem: str) -> tuple[str, dict[str, Any]]:
    path = recipes_dir() / "components" / f"{stem}.yaml"
    if not path.is_file():
        raise KeyError(stem)
    data = read_yaml(path)
    source = _rel(path)
    problems = Problems(source)
    comps = _check_file(data, "components", COMPONENT_FILE_KEYS, set(POLICY_KEYS), source, problems)
    problems.raise_if_any()
    return source, comps


def component_entries(stem: str) -> dict[str, Any]:
    """The validated entries of one component recipe file (``recipes/components/<stem>.yaml``).

    Example:
        >>> sorted(component_entries("clip"))
        ['text', 'vision']
    """
    return _component_file(stem)[1]


def _pipeline_file(name: str) -> tuple[str, dict[str, Any]]:
    if name.endswith((".yaml", ".yml")):
        return _read_pipeline(Path(name), name)  # a user's file is re-read every time: it may have changed
    return _shipped_pipeline(name)


def pipeline_spec(name: str) -> dict[str, Any]:
    """The validated data of a pipeline recipe: a shipped name (``"sdxl"``) or a path to a user's YAML file.

    Example:
        >>> "StableDiffusionXLPipeline" in pipeline_spec("sdxl")["pipelines"]
        True
    """
    return _pipeline_file(name)[1]


@functools.lru_cache(maxsize=None)
def _shipped_pipeline(name: str) -> tuple[str, dict[str, Any]]:
    path = recipes_dir() / f"{name}.yaml"
    return _read_pipeline(path, _rel(path))


def _read_pipeline(path: Path, source: str) -> tuple[str, dict[str, Any]]:
    return _check_pipeline(read_yaml(path), source)


def _check_pipeline(data: Any, source: str) -> tuple[str, dict[str, Any]]:
    problems = Problems(source)
    comps = _check_file(data, "pipeline", PIPELINE_KEYS, set(POLICY_KEYS) - {"select"}, source, problems)
    _check_devices(data.get("devices"), set(comps), problems)
    for key in ("latents_from", "denoiser"):
        if data.get(key) is not None and data[key] not in comps:
            problems.add(key, f"{excerpt(data[key])} is not one of its components {sorted(comps)}")
    problems.raise_if_any()
    if data.get("training") is not None:
        training = data["training"]
        if not isinstance(training, Mapping):
            raise RecipeError(f"{source}: training: expected an override mapping like 'components: {{vae: {{dtypes: "
                              f"[bfloat16, float32]}}}}', got {excerpt(training)}")
        _override_layer({**training, "__source__": f"{source} training"}, set(comps), 0)  # raises on a bad key
    return source, data


def training_overrides(name: str) -> dict[str, Any] | None:
    """The ``training:`` section of a pipeline recipe as an override layer (``None`` when it has none).

    Training merges it over the inference recipe, before the user's overrides.

    Example:
        >>> training_overrides("sd15")["components"]["vae"]["dtypes"]
        ['bfloat16', 'float32']
    """
    training = pipeline_spec(name).get("training")
    return None if training is None else {**training, "__source__": f"recipes/{name}.yaml training"}


def list_recipes(kind: str = "all") -> list[str]:
    """Names of the shipped recipes: pipeline recipes (``sdxl``) and component recipes (``vae.sdxl``).

    Example:
        >>> [n for n in list_recipes("pipeline") if n in ("sdxl", "svd")]
        ['sdxl', 'svd']
    """
    root = recipes_dir()
    pipelines = sorted(p.stem for p in root.glob("*.yaml") if p.stem != "devices")
    components = sorted(f"{p.stem}.{c}" for p in (root / "components").glob("*.yaml") for c in _component_file(p.stem)[1])
    return {"pipeline": pipelines, "component": components}.get(kind, pipelines + components)


def _close(word: str, options: Iterable[str]) -> str:
    if len(str(word)) > 100:  # no name is that long, and difflib's cost grows with it
        return ""
    near = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def _check_file(data: Any, kind: str, top_keys: set[str], policy_keys: set[str], source: str,
                problems: Problems) -> dict[str, Any]:
    """The checks every recipe file gets: a mapping, schema, known top-level keys, its kind, its component policies."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping with 'schema', 'kind: {kind}' and 'components'")
    _check_schema(data, problems)
    _unknown(data, top_keys, "", problems)
    if data.get("kind") != kind:
        where = "recipes/components/" if kind == "components" else "recipes/"
        problems.add("kind", f"{excerpt(data.get('kind'))} is not {kind!r}; {kind} recipes live in {where}")
    comps = data.get("components")
    if not isinstance(comps, dict) or not comps:
        problems.add("components", "missing or empty; give at least one named component policy")
        comps = {}
    for name, policy in comps.items():
        _check_policy(policy, f"components.{name}", problems, allowed=policy_keys)
    return comps


def _check_schema(data: Mapping[str, Any], problems: Problems) -> None:
    schema = data.get("schema")
    if schema is None:
        problems.add("schema", "missing; add 'schema: 1' at the top")
    elif schema not in SCHEMAS:
        problems.add("schema", f"{excerpt(schema)} is not supported (this hf_precision reads schema {', '.join(map(str, SCHEMAS))}); "
                     "upgrade hf_precision or rewrite the file for schema 1")


def _unknown(data: Mapping[str, Any], allowed: set[str], path: str, problems: Problems) -> None:
    for key in data:
        if key not in allowed:
            problems.add(f"{path}{'.' if path else ''}{key}",
                         f"unknown key {excerpt(key)}; allowed: {', '.join(sorted(allowed))}{_close(key, allowed)}")


def _check_value(kind: str, value: Any, path: str, problems: Problems) -> Any:
    """Validate one policy value and return it normalised (canonical dtype names)."""
    def bad(allowed: str) -> None:
        problems.add(path, f"bad value {excerpt(value)} ({type(value).__name__}); allowed: {allowed}")

    if kind == "dtype":
        canon = dt.canonical(value) if isinstance(value, str) else None
        if canon is None:
            suggestion = _close(str(value), [a for n, al in dt.DTYPES.items() for a in (n, *al)])
            if str(value).lower() == "half":
                suggestion = " ('half' is ambiguous: write float16 or bfloat16)"
            problems.add(path, f"unknown dtype {excerpt(value)}; allowed: {dt.allowed_names()}{suggestion}")
        return canon
    if kind == "dtype-list":
        if not isinstance(value, list) or not value:
            bad("a non-empty list of dtype names, e.g. [float16, bfloat16, float32]")
            return None
        return [_check_value("dtype", v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if kind in ("str-list", "list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            bad("a list of strings, e.g. [time_embedding, 'down_blocks.*.norm*']")
            return None
        return list(value)
    if kind == "str":
        if not isinstance(value, str):
            bad("a string")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            bad("true or false")
        return value
    if kind == "output":
        if isinstance(value, str) and value in OUTPUTS:
            return value
        canon = dt.canonical(value) if isinstance(value, str) else None
        if canon is None:
            bad(f"{' or '.join(OUTPUTS)} or a dtype name ({', '.join(dt.DTYPES)})")
        return canon
    if kind == "select":
        if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("config"), dict)
                                                  and isinstance(v.get("use"), str) for v in value):
            bad("a list of {config: {key: value}, use: file.entry, why: text}")
        return value
    raise AssertionError(kind)


def _check_policy(policy: Any, path: str, problems: Problems, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(policy, dict):
        problems.add(path, f"expected a mapping of policy keys, got {excerpt(policy)}; e.g. {{dtype: float16}}")
        return {}
    _unknown(policy, allowed, path, problems)
    return {k: _check_value(POLICY_KEYS[k], v, f"{path}.{k}", problems) for k, v in policy.items() if k in allowed}


def _known_tags() -> list[str]:
    from .devices import rule_ids

    return rule_ids()


def _check_devices(devices: Any, components: set[str] | None, problems: Problems) -> dict[str, dict[str, dict[str, Any]]]:
    if devices is None:
        return {}
    if not isinstance(devices, dict):
        problems.add("devices", f"expected a mapping of device tag -> components, got {excerpt(devices)}")
        return {}
    tags = _known_tags()
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for tag, comps in devices.items():
        if tag not in tags:
            problems.add(f"devices.{tag}", f"unknown device tag {excerpt(tag)}; allowed: {', '.join(tags)}{_close(tag, tags)}")
            continue
        if not isinstance(comps, dict):
            problems.add(f"devices.{tag}", f"expected component -> policy, got {excerpt(comps)}")
            continue
        out[tag] = {}
        for comp, policy in comps.items():
            if components is not None and comp not in components:
                problems.add(f"devices.{tag}.{comp}", f"unknown component {excerpt(comp)}; this recipe has {', '.join(sorted(components))}"
                             f"{_close(comp, components)}")
                continue
            out[tag][comp] = _check_policy(policy, f"devices.{tag}.{comp}", problems, allowed=OVERRIDE_KEYS)
    return out


# ------------------------------------------------------------------------------------------ overrides


def parse_set(flags: Iterable[str]) -> dict[str, Any]:
    """Turn ``--set component.key=value`` flags into an override dict; values are YAML scalars or lists.

    Example:
        >>> parse_set(["unet.dtype=fp16", "unet.keep_fp32=[time_embedding]"])
        {'components': {'unet': {'dtype': 'fp16', 'keep_fp32': ['time_embedding']}}}
    """
    out: dict[str, Any] = {"components": {}}
    problems = Problems("--set")
    for flag in flags:
        key, eq, raw = str(flag).partition("=")
        parts = key.strip().split(".")
        if not eq or len(parts) not in (2, 4) or (len(parts) == 4 and parts[0] != "devices") or not all(parts):
            problems.add(excerpt(flag), "expected component.key=value (e.g. --set vae.dtype=float32) "
                         "or devices.TAG.component.key=value")
            continue
        try:
            value = parse_yaml(raw, f"--set {excerpt(flag)}")
        except RecipeError as err:
            problems.add(excerpt(flag), str(err))
            continue
        if len(parts) == 2:
            out["components"].setdefault(parts[0], {})[parts[1]] = value
        else:
            out.setdefault("devices", {}).setdefault(parts[1], {}).setdefault(parts[2], {})[parts[3]] = value
    problems.raise_if_any()
    return out


def _override_layer(item: str | Path | Mapping[str, Any], components: set[str], index: int) -> _Layer:
    if isinstance(item, (str, Path)):
        source = str(item)
        data = read_yaml(item)
        if data is None:
            data = {}
        file = True
    elif isinstance(item, Mapping):
        source = str(item.get("__source__") or ("overrides dict" + (f" #{index + 1}" if index else "")))
        data = {k: v for k, v in item.items() if k != "__source__"}
        file = False
    else:
        raise RecipeError(f"overrides: expected a YAML path, a dict or a list of them, got {type(item).__name__} {excerpt(item)}")
    problems = Problems(source)
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping like 'components: {{vae: {{dtype: float32}}}}', got {type(data).__name__}")
    if file or "schema" in data:
        _check_schema(data, problems)
    if not file and not (set(data) & OVERRIDE_TOP_KEYS):
        data = {"components": data}  # a dict may give components directly: {"unet": {"dtype": "float16"}}
    _unknown(data, OVERRIDE_TOP_KEYS, "", problems)
    comps: dict[str, dict[str, Any]] = {}
    raw = data.get("components") or {}
    if not isinstance(raw, dict):
        problems.add("components", f"expected component -> policy, got {excerpt(raw)}")
        raw = {}
    for comp, policy in raw.items():
        if comp not in components:
            problems.add(f"components.{comp}", f"unknown component {excerpt(comp)}; this recipe has {', '.join(sorted(components))}"
                         f"{_close(comp, components)}")
            continue
        comps[comp] = _check_policy(policy, f"components.{comp}", problems, allowed=OVERRIDE_KEYS)
    devices = _check_devices(data.get("devices"), components, problems)
    problems.raise_if_any()
    return _Layer(source, comps, devices)


def _as_list(overrides: Any) -> list[Any]:
    if overrides is None:
        return []
    if isinstance(overrides, (str, Path, Mapping)):
        return [overrides]
    if not isinstance(overrides, (list, tuple)):
        raise RecipeError(f"overrides: expected a YAML path, a dict or a list of them, got {type(overrides).__name__} "
                          f"{excerpt(overrides)}; e.g. overrides={{'vae': {{'dtype': 'float32'}}}}")
    return list(overrides)


# ----------------------------------------------------------------------------------------- resolving


def _component_entry(ref: str, source: str, path: str) -> tuple[str, dict[str, Any]]:
    stem, _, entry = ref.partition(".")
    try:
        file_source, comps = _component_file(stem)
    except KeyError:
        files = sorted(p.stem for p in (recipes_dir() / "components").glob("*.yaml"))
        raise RecipeError(f"{source}: {path}.use: no component recipe file {excerpt(stem)}; allowed: {', '.join(files)}"
                          f"{_close(stem, files)}") from None
    if entry not in comps:
        raise RecipeError(f"{source}: {path}.use: {file_source} has no entry {excerpt(entry)}; allowed: "
                          f"{', '.join(f'{stem}.{c}' for c in comps)}{_close(ref, [f'{stem}.{c}' for c in comps])}")
    return f"{file_source}:{entry}", comps[entry]


def _base_policy(ref: str, source: str, path: str, config: Mapping[str, Any] | None,
                 seen: tuple[str, ...] = ()) -> dict[str, tuple[Any, str]]:
    """Follow ``use:`` chains and ``select:`` rules; returns key -> (value, source)."""
    if ref in seen:
        raise RecipeError(f"{source}: {path}.use: cycle {' -> '.join((*seen, ref))}")
    where, policy = _component_entry(ref, source, path)
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
    if key in ("dtype", "storage"):
        return dt.canonical(value)
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
        name (`str` or `dict`): a pipeline recipe (``"sdxl"``, ``"svd"`` ...; see :func:`list_recipes`), a component
            recipe (``"vae.sdxl"``), which resolves to a one-component recipe, the path of your own pipeline recipe
            file (``"my_arch.yaml"``, same schema as the shipped ones), or a composed recipe's data.
        device (`str` or `DeviceProfile`, *optional*): a present device (``"cuda:1"``), a preset (``"t4"``,
            ``"m1-macos13"``) or a description (``"cuda:sm=8.0"``). Defaults to the best present device.
        overrides: a YAML path, a dict, or a list of them, merged in order over the recipe.
        configs (*optional*): component -> its ``config.json`` dict, for recipes that choose by config (the
            fp16-fix VAE is recognised by ``force_upcast: false``).

    Returns:
        `Recipe`: frozen; per component its storage, compute and output dtypes, float32 islands and the rule
        behind each decision.

    Raises:
        RecipeError: unknown recipe, device, component, key or dtype; a dtype the device cannot compute.

    Example:
        >>> r = get_recipe("sdxl", device="a100", overrides={"vae": {"dtype": "float32"}})
        >>> r["vae"].compute, r["unet"].compute, r["unet"].keep_fp32
        ('float32', 'float16', ('time_embedding', 'add_embedding'))
    """
    caps = device_caps(device)
    configs = configs or {}
    pipelines = list_recipes("pipeline")
    composed = isinstance(name, Mapping)
    if composed:  # a composed recipe (recipe.compose) or a shipped one refitted to the classes present: data
        spec = dict(name)  # type: ignore[arg-type]
        label, origin = spec.pop("recipe_name", None), spec.pop("origin", None)
        source, data = _check_pipeline(spec, origin or f"composed for {', '.join(spec.get('pipelines') or ['?'])}")
        name = label or f"composed:{(data.get('pipelines') or ['?'])[0]}"
    name = str(name)
    if composed:
        pass  # read above
    elif name in pipelines or name.endswith((".yaml", ".yml")):  # before the "." test: a path has a suffix
        source, data = _pipeline_file(name)
    elif "." in name:
        stem = name.split(".", 1)[0]
        data = {"schema": 1, "model": None, "pipelines": [], "latents_from": None, "components": {stem: {"use": name}}}
        source = "get_recipe"
        _component_entry(name, source, f"components.{stem}")
    else:
        options = pipelines + list_recipes("component")
        raise RecipeError(f"recipe {excerpt(name)}: unknown; allowed: {', '.join(options)}{_close(name, options)}")

    components = list(data["components"])
    policies: dict[str, dict[str, tuple[Any, str]]] = {c: {} for c in components}
    _apply_layer(policies, data["components"], source, configs)
    device_sections = _check_devices(data.get("devices"), set(components), Problems(source))
    layers = [_Layer(source, {}, device_sections)]
    sources = [source]
    for i, item in enumerate(_as_list(overrides)):
        layer = _override_layer(item, set(components), i)
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
                  device_tags=caps.tags, plans=tuple(dataclasses.replace(p, resolved_for=label) for p in final),
                  sources=tuple(sources), denoiser=data.get("denoiser"))


def _why_device(caps: DeviceCaps, dtype: str) -> str:
    for tag, why in caps.why.items():
        if dt.short(dtype) in why or dtype in why:
            return f"rule {tag}: {why}"
    return "; ".join(f"rule {t}" for t in caps.tags)


def _resolve_component(name: str, policy: dict[str, tuple[Any, str]], caps: DeviceCaps, problems: list[str]) -> ComponentPlan:
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
                f"fix: {override_line(name, 'dtype', fix)}")
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
    if get("storage"):
        if storage not in caps.storage:
            problems.append(f"{src('storage')}: components.{name}.storage: {storage} cannot be stored on {device}; "
                            f"allowed there: {', '.join(caps.storage)}; fix: {override_line(name, 'storage', compute)}")
        decisions.append(Decision("storage", storage, "set by storage (cast to the compute dtype on use)", src("storage")))
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
        # Shipped recipes' names are checked against the real configs by the tests; the user's are checked where the
        # modules are known (apply_recipe, load_pipeline, plan), which find them through this decision.
        if get(key) and not src(key).startswith(("recipes/", "composed for")):
            names = ", ".join(v or "(forward)" for v in get(key))
            decisions.append(Decision(key, names, "set by the user: must name modules of the component", src(key)))
    return ComponentPlan(name=name, storage=storage, compute=compute, output=get("output") or "compute", handed_over="",
                         keep_fp32=islands, entry=tuple(get("entry") or ("",)), nan_guard=nan_guard,
                         upcast_attention=bool(upcast), dtypes=tuple(tolerated), classes=tuple(get("class") or ()),
                         recipe=str(get("recipe") or ""), why=str(get("why") or ""), decisions=tuple(decisions),
                         no_cast=tuple(DEFAULT_NO_CAST if get("no_cast") is None else get("no_cast")),
                         layerwise_skip=tuple(get("layerwise_skip") or DEFAULT_LAYERWISE_SKIP))


# ------------------------------------------------------------------------------------- the one door


def recipe_classes() -> dict[str, str]:
    """Pipeline class -> the first shipped pipeline recipe (in name order) whose ``pipelines`` list names it.

    Example:
        >>> recipe_classes()["StableDiffusionXLImg2ImgPipeline"]
        'sdxl'
    """
    covered: dict[str, str] = {}
    for name in list_recipes("pipeline"):
        for cls in pipeline_spec(name).get("pipelines") or ():
            covered.setdefault(str(cls), name)
    return covered


def recipe_for_class(class_name: str) -> str:
    """The shipped pipeline recipe whose ``pipelines`` list names this diffusers pipeline class.

    Example:
        >>> recipe_for_class("StableDiffusionXLImg2ImgPipeline")
        'sdxl'
    """
    covered = recipe_classes()
    if class_name in covered:
        return covered[class_name]
    # Every family's class list would make a page-long line: name the close classes and the recipes only.
    near = difflib.get_close_matches(class_name, list(covered), n=3, cutoff=0.8)
    hint = (f"did you mean {', '.join(f'{c!r} (recipe {covered[c]})' for c in near)}? " if near else "")
    raise RecipeError(f"no recipe for pipeline class {class_name!r}; {hint}pipeline recipes: "
                      f"{', '.join(list_recipes('pipeline'))} "
                      f"(`hf-precision recipes` lists the classes each covers). To use one anyway, name it and force it: recipe='sdxl', force=True (CLI: --recipe sdxl "
                      "--force); or write your own recipe YAML that lists the class under pipelines:")


def check_recipe_class(recipe: str, listed: Iterable[str], pipeline_class: str | None, force: bool = False) -> None:
    """Refuse a pipeline recipe for a pipeline class it does not list (its islands and entry points may not fit).

    Component recipes (``listed`` empty) fit any pipeline; ``force=True`` opts in.

    Example:
        >>> check_recipe_class("sdxl", ["StableDiffusionXLPipeline"], "StableVideoDiffusionPipeline")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: recipe 'sdxl' is for StableDiffusionXLPipeline, not \
StableVideoDiffusionPipeline: its components, float32 islands and entry points may not fit. The recipe that lists \
StableVideoDiffusionPipeline: svd: pass recipe='svd' (CLI: --recipe svd), or leave the recipe out to have it \
chosen; to apply 'sdxl' anyway: force=True (CLI: --force)
    """
    listed = tuple(listed)
    if force or not pipeline_class or not listed or pipeline_class in listed:
        return
    others = [n for n in list_recipes("pipeline") if pipeline_class in (pipeline_spec(n).get("pipelines") or ())]
    if others:
        fix = (f"The recipe{'s' if len(others) > 1 else ''} that list{'' if len(others) > 1 else 's'} {pipeline_class}: "
               f"{', '.join(others)}: pass recipe={others[0]!r} (CLI: --recipe {others[0]}), or leave the recipe out to "
               f"have it chosen")
    else:
        fix = (f"No shipped recipe lists {pipeline_class}: leave the recipe out and one is composed from the "
               f"pipeline's components")
    raise RecipeError(f"recipe {excerpt(recipe)} is for {', '.join(listed)}, not {pipeline_class}: its components, "
                      f"float32 islands and entry points may not fit. {fix}; to apply {excerpt(recipe)} anyway: "
                      f"force=True (CLI: --force)")


def recipe_components(recipe: str | Recipe) -> list[str]:
    """The component names a recipe plans, without resolving it (a resolved Recipe, a pipeline or component recipe).

    Example:
        >>> recipe_components("svd"), recipe_components("vae.sdxl")
        (['image_encoder', 'unet', 'vae'], ['vae'])
    """
    if isinstance(recipe, Recipe):
        return [p.name for p in recipe.plans]
    if isinstance(recipe, Mapping):
        return list(recipe["components"])
    name = str(recipe)
    if name in list_recipes("pipeline") or name.endswith((".yaml", ".yml")):
        return list(pipeline_spec(name)["components"])
    return [name.split(".", 1)[0]]


def placement(devices: Any, names: Iterable[str], also: Iterable[str] = ()) -> dict[str, str | None]:
    """Component -> the torch device string it is placed on (``None``: not placed), checked without torch.

    ``devices`` is one device for all (``"cuda:1"``) or a mapping component -> device with an optional
    ``"default"``; its keys may also name ``also`` (other components of the pipeline, which no recipe plans and
    which stay where they are). Presets and descriptions (``"t4"``, ``"cuda:sm=7.5"``) are devices you plan for, not ones
    tensors can sit on: they belong in ``layout=``.

    Example:
        >>> placement({"text_encoder": "cpu", "default": "CUDA:1"}, ["text_encoder", "unet"])
        {'text_encoder': 'cpu', 'unet': 'cuda:1'}
    """
    from .devices import TYPES

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
                          f"resolve for that device: layout={spec!r}, device='cpu' (CLI: --layout {spec} --device cpu)")

    if devices is None:
        return {n: None for n in names}
    if isinstance(devices, Mapping):
        known = [*names, *(a for a in also if a not in names)]
        unknown = sorted(str(k) for k in devices if k not in known and k != "default")
        if unknown:
            raise RecipeError(f"device mapping: unknown component(s) {unknown}; components: {', '.join(known)}, "
                              f"or 'default' for the rest{_close(unknown[0], known)}")
        return {n: one(devices.get(n, devices.get("default")), f"device[{n!r}]") for n in names}
    place = one(devices, "device")
    return {n: place for n in names}


def _fit_classes(name: str, resolved: Recipe, models: Mapping[str, tuple[str, str]]) -> str | dict[str, Any]:
    """The recipe, with each component whose component recipe is for another model class given its own class's.

    A pipeline may hold a model class other than the one its recipe names (diffusers' own tests build Wan with a
    T5EncoderModel where the release has a UMT5EncoderModel): that component gets the component recipe listing its
    class, or the unknown-class treatment, instead of islands and entry points that would not fit. ``resolved`` is
    ``name`` resolved with the user's overrides, which still apply on top of the refitted data, so a `use:` they set
    is still checked against the class (and one that fits leaves nothing to refit). Returns ``name`` itself when
    every class fits.
    """
    from .compose import component_spec

    misfits = {p.name: models[p.name] for p in resolved.plans
               if p.name in models and p.classes and models[p.name][0] not in p.classes}
    if not misfits:
        return name
    source, data = _pipeline_file(name)
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
    """The one door from "which recipe, which devices, which overrides" to one frozen plan.

    ``load_pipeline``, ``apply_recipe``, ``plan``, ``check``, the demo and the video program each call this once.

    Args:
        recipe (`str` or `Recipe`, *optional*): a recipe name or a user's recipe file; ``None`` picks it from
            ``pipeline_class``. A resolved :class:`Recipe` is taken as is (only placed): it cannot take overrides.
        pipeline_class (`str`, *optional*): the diffusers pipeline class (``model_index.json``'s ``_class_name``).
        devices (*optional*): where the components sit: ``"cuda"``, ``"cpu"``, or ``{component: device,
            "default": device}``. ``None``: placed nowhere (a plan on the meta device).
        layout (*optional*): the device(s) whose rules choose the dtypes, when they are not where the components
            sit: a preset (``"t4"``), a description (``"cuda:sm=7.5"``), a :class:`DeviceProfile`, or a mapping
            like ``devices``. Default: each component's own device (the best present device when unplaced). This
            is "resolve for that device, place on this one": how a T4 layout runs on a CPU.
        overrides (*optional*): a YAML path, a dict, or a list of them, merged over the recipe.
        configs (*optional*): component -> its ``config.json`` dict, for recipes that choose by config.
        components (*optional*): every component the pipeline has; a ``devices`` mapping may name these too.
        models (*optional*): component -> (model class, role) of the pipeline's ``nn.Module`` components; when no
            shipped recipe lists ``pipeline_class``, the recipe is composed from them (:mod:`hf_precision.recipe.compose`).
        force (`bool`, defaults to `False`): accept a pipeline recipe whose ``pipelines`` list does not name
            ``pipeline_class`` (otherwise a ``RecipeError`` names the recipes that do).

    Returns:
        `Recipe`: frozen; each component's plan records its device (``plan.device``) and the device its dtypes were
        chosen for (``plan.resolved_for``).

    Raises:
        RecipeError: no recipe for the class, a device that cannot hold tensors passed as ``devices``, a resolved
            Recipe with overrides or a layout, or anything :func:`get_recipe` refuses.

    Example:
        >>> r = resolve(pipeline_class="StableDiffusionXLPipeline", devices="cpu", layout="t4")
        >>> r["unet"].compute, r["unet"].device, r["unet"].resolved_for
        ('float16', 'cpu', 'cuda (Tesla T4, sm 7.5)')
    """
    from .devices import device_profile

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
        place = placement(devices, [p.name for p in recipe.plans], components)
        plans = tuple(dataclasses.replace(p, device=place.get(p.name) or p.device) for p in recipe.plans)
        return dataclasses.replace(recipe, plans=plans)
    chosen = recipe is None  # by class: refitted to the classes present; a recipe the user names is taken as named
    if recipe is None:
        if not pipeline_class:
            raise RecipeError("resolve: name a recipe (recipe='sdxl') or give the pipeline class it is for")
        try:
            recipe = recipe_for_class(str(pipeline_class))
        except RecipeError:
            if models is None:
                raise
            from .compose import compose_spec

            recipe = compose_spec(str(pipeline_class), models)  # type: ignore[assignment]
    name: Any = recipe if isinstance(recipe, Mapping) else str(recipe)
    best = layout if layout is not None and not isinstance(layout, Mapping) else None
    first = get_recipe(name, device=best, overrides=overrides, configs=configs)
    if chosen and models and not isinstance(name, Mapping):
        fitted = _fit_classes(name, first, models)
        if fitted is not name:  # rare: only then resolve again, from the refitted data
            name = fitted
            first = get_recipe(name, device=best, overrides=overrides, configs=configs)
    check_recipe_class(first.name, first.pipelines, pipeline_class, force)
    names = [p.name for p in first.plans]
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
        unknown = sorted(str(k) for k in layout if k not in names and k != "default")
        if unknown:
            raise RecipeError(f"layout mapping: unknown component(s) {unknown}; components: {', '.join(names)}, "
                              f"or 'default' for the rest{_close(unknown[0], names)}")
    by_spec: dict[str, Recipe] = {}
    for spec in wanted.values():
        key = repr(spec)
        if key not in by_spec:
            profile = device_profile(spec)
            by_spec[key] = first if profile == first.device else get_recipe(name, device=profile, overrides=overrides,
                                                                            configs=configs)
    main_name = first.denoiser if first.denoiser in wanted else names[0]
    main = by_spec[repr(wanted[main_name])]
    plans = tuple(dataclasses.replace(by_spec[repr(wanted[p.name])][p.name], device=place[p.name]) for p in main.plans)
    return dataclasses.replace(main, plans=plans)
