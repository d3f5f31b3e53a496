"""Override layers: what a user puts over a recipe (files, dicts, ``--set`` flags), each checked and named. Torch-free.

Every layer carries its source (a file's path, ``"overrides dict #2"``, ``"--set"``), which each decision it makes
records. A caller that knows better than "overrides dict" where a layer comes from wraps it in :class:`Override`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import Problems, RecipeError, excerpt
from .devices import rule_ids
from .files import parse_yaml, read_yaml
from .schema import OVERRIDE_KEYS, OVERRIDE_TOP_KEYS, check_device_sections, check_policy, check_schema, did_you_mean, unknown_keys

__all__ = ["Override", "Layer", "parse_set", "override_layer", "as_list"]


@dataclasses.dataclass(frozen=True)
class Override:
    """An override dict with the name its decisions report (``"--set"``, ``"load_pipeline dtype="``).

    Example:
        >>> from hf_precision.recipe import get_recipe
        >>> r = get_recipe("sdxl", device="t4", overrides=Override("--set", parse_set(["vae.dtype=fp32"])))
        >>> r.sources[-1], r["vae"].compute
        ('--set', 'float32')
    """

    source: str
    data: Mapping[str, Any]


@dataclasses.dataclass
class Layer:
    """One source of policy values: component -> key -> value, plus device sections."""

    source: str
    components: dict[str, dict[str, Any]]
    devices: dict[str, dict[str, dict[str, Any]]]


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


def override_layer(item: str | Path | Override | Mapping[str, Any], components: set[str], index: int) -> Layer:
    """One override (a YAML path, an :class:`Override`, or a dict) checked against the recipe's components.

    Example:
        >>> override_layer(Override("--set", parse_set(["vae.dtype=fp32"])), {"vae", "unet"}, 0)
        Layer(source='--set', components={'vae': {'dtype': 'float32'}}, devices={})
    """
    if isinstance(item, (str, Path)):
        source = str(item)
        data = read_yaml(item)
        if data is None:
            data = {}
        file = True
    elif isinstance(item, (Override, Mapping)):
        source = item.source if isinstance(item, Override) else "overrides dict" + (f" #{index + 1}" if index else "")
        data = item.data if isinstance(item, Override) else item
        data = dict(data) if isinstance(data, Mapping) else data
        file = False
    else:
        raise RecipeError(f"overrides: expected a YAML path, a dict or a list of them, got {type(item).__name__} {excerpt(item)}")
    problems = Problems(source)
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping like 'components: {{vae: {{dtype: float32}}}}', got {type(data).__name__}")
    if file or "schema" in data:
        check_schema(data, problems)
    if not file and not (set(data) & OVERRIDE_TOP_KEYS):
        data = {"components": data}  # a dict may give components directly: {"unet": {"dtype": "float16"}}
    unknown_keys(data, OVERRIDE_TOP_KEYS, "", problems)
    comps: dict[str, dict[str, Any]] = {}
    raw = data.get("components") or {}
    if not isinstance(raw, dict):
        problems.add("components", f"expected component -> policy, got {excerpt(raw)}")
        raw = {}
    for comp, policy in raw.items():
        if comp not in components:
            problems.add(f"components.{comp}", f"unknown component {excerpt(comp)}; this recipe has {', '.join(sorted(components))}"
                         f"{did_you_mean(comp, components)}")
            continue
        comps[comp] = check_policy(policy, f"components.{comp}", problems, allowed=OVERRIDE_KEYS)
    devices = check_device_sections(data.get("devices"), components, rule_ids(), problems)
    problems.raise_if_any()
    return Layer(source, comps, devices)


def as_list(overrides: Any) -> list[Any]:
    """The override layers given as one item or a list of them, in merge order."""
    if overrides is None:
        return []
    if isinstance(overrides, (str, Path, Mapping, Override)):
        return [overrides]
    if not isinstance(overrides, (list, tuple)):
        raise RecipeError(f"overrides: expected a YAML path, a dict or a list of them, got {type(overrides).__name__} "
                          f"{excerpt(overrides)}; e.g. overrides={{'vae': {{'dtype': 'float32'}}}}")
    return list(overrides)
