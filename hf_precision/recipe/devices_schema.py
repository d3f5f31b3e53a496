"""What a valid devices.yaml is (recipes/devices.yaml or a user's): its rules, presets, measured speeds and video
defaults, checked like every recipe file by :mod:`.schema`'s checkers. Torch-free.
"""

from __future__ import annotations

import re
from typing import Any

from .. import dtypes as dt
from ..errors import Problems
from .quantize import canonical_storage, is_quantized, storage_names
from .schema import TYPES, check_video, unknown_keys

__all__ = ["DEVICES_TOP_KEYS", "PRESET_KEYS", "RULE_KEYS", "WHEN_KEYS", "check_devices_file"]

# The keys of devices.yaml: an unknown one (`when: {capabilty: ...}`) is an error, never a condition that holds.
DEVICES_TOP_KEYS = ("schema", "kind", "rules", "presets", "measured_speed", "video")
RULE_KEYS = ("id", "when", "compute", "auto", "storage", "transformers_only", "upcast_attention", "why")
WHEN_KEYS = ("type", "capability", "macos", "cpu_flags", "name_contains")
PRESET_KEYS = ("type", "name", "capability", "macos", "cpu_flags", "index")


def _check_measured_speed(entries: Any, problems: Problems) -> None:
    if not isinstance(entries, list):
        problems.add("measured_speed", f"expected a list of {{device, source, relative}} entries, got {entries!r}")
        return
    for i, entry in enumerate(entries):
        where = f"measured_speed[{i}]"
        if not isinstance(entry, dict):
            problems.add(where, f"expected a mapping with device, source and relative, got {entry!r}")
            continue
        unknown_keys(entry, ("device", "source", "relative"), where, problems)
        if entry.get("device") not in TYPES:
            problems.add(f"{where}.device", f"unknown device type {entry.get('device')!r}; allowed: {', '.join(TYPES)}")
        if not isinstance(entry.get("source"), str) or not entry["source"].strip():
            problems.add(f"{where}.source", "name the command and machine that measured these figures")
        relative = entry.get("relative")
        if not isinstance(relative, dict):
            problems.add(f"{where}.relative", f"expected a mapping storage -> time ratio, got {relative!r}")
            continue
        timed = [n for n in storage_names() if is_quantized(n) or n.startswith("float8")]
        for name, ratio in relative.items():
            if canonical_storage(str(name)) != name or name not in timed:
                problems.add(f"{where}.relative.{name}", f"unknown storage {name!r}; allowed: {', '.join(timed)} "
                                                         f"(a quantized or fp8 storage, by its canonical name)")
            if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or ratio <= 0:
                problems.add(f"{where}.relative.{name}", f"expected a positive time ratio such as 1.14, got {ratio!r}")


def check_devices_file(data: Any, source: str) -> None:
    """Validate a device rules file; every problem is reported at once, each naming the key and the fix.

    Example:
        >>> check_devices_file({"schema": 1, "kind": "devices", "presets": {},
        ...                     "rules": [{"id": "x", "when": {"type": "cuda", "capabilty": ">=8.0"}}]}, "my.yaml")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: my.yaml: rules[0] (x).when.capabilty: unknown key 'capabilty'; allowed: capability, cpu_flags, macos, name_contains, type; did you mean 'capability'?
    """
    problems = Problems(source)
    unknown = lambda mapping, allowed, where: unknown_keys(mapping, allowed, where, problems)

    def version(cond: Any, where: str) -> None:
        if not re.fullmatch(r"\s*(>=|<=|>|<|==)?\s*\d+(\.\d+)*\s*", str(cond)):
            problems.add(where, f"bad version condition {cond!r}; write e.g. '>=8.0' or '<7.0'")

    def dtype_edits(value: Any, where: str) -> None:
        if not isinstance(value, list):
            problems.add(where, f"expected a list of dtypes (a plain list replaces, +name adds, -name removes), got {value!r}")
            return
        for item in value:
            name = str(item)[1:] if str(item).startswith(("+", "-")) else str(item)
            # storage lists may also name quantized layouts (int8, nf4 ...: recipe/quantize.py)
            storage = where.endswith((".storage", ".transformers_only"))
            if (canonical_storage(name) if storage else dt.canonical(name)) is None:
                allowed = ", ".join(storage_names()) if storage else \
                    "float32, bfloat16, float16, float8_e4m3fn or float8_e5m2"
                problems.add(where, f"unknown dtype {item!r}; use {allowed}")

    if not isinstance(data, dict) or data.get("kind") != "devices":
        problems.add("", "not a device rules file (expected a mapping with 'kind: devices')")
        problems.raise_if_any()
    unknown(data, DEVICES_TOP_KEYS, "")
    if data.get("schema") != 1:
        problems.add("schema", f"schema {data.get('schema')!r} is not supported (this hf_precision reads schema 1)")
    rules = data.get("rules")
    if not isinstance(rules, list):
        problems.add("rules", "expected a list of rules")
        rules = []
    seen: set[str] = set()
    for i, rule in enumerate(rules):
        if not isinstance(rule, dict):
            problems.add(f"rules[{i}]", f"expected a mapping with id and when, got {rule!r}")
            continue
        where = f"rules[{i}] ({rule.get('id', '?')})"
        unknown(rule, RULE_KEYS, where)
        if not isinstance(rule.get("id"), str) or not rule.get("id"):
            problems.add(where, "every rule needs an id (it becomes a device tag)")
        elif rule["id"] in seen:
            problems.add(where, f"duplicate id {rule['id']!r}: each rule's id is a distinct device tag")
        seen.add(str(rule.get("id")))
        when = rule.get("when", {})
        if not isinstance(when, dict):
            problems.add(f"{where}.when", f"expected a mapping of conditions, got {when!r}")
            when = {}
        unknown(when, WHEN_KEYS, f"{where}.when")
        if "type" in when and when["type"] not in TYPES:
            problems.add(f"{where}.when.type", f"unknown device type {when['type']!r}; allowed: {', '.join(TYPES)}")
        for key in ("capability", "macos"):
            if key in when:
                version(when[key], f"{where}.when.{key}")
        for key in ("cpu_flags", "name_contains"):
            if key in when and not (isinstance(when[key], list) and all(isinstance(x, str) for x in when[key])):
                problems.add(f"{where}.when.{key}", f"expected a list of strings, got {when[key]!r}")
        for key in ("compute", "auto", "storage", "transformers_only"):
            if key in rule:
                dtype_edits(rule[key], f"{where}.{key}")
        if "upcast_attention" in rule and not isinstance(rule["upcast_attention"], bool):
            problems.add(f"{where}.upcast_attention", f"expected true or false, got {rule['upcast_attention']!r}")
    _check_measured_speed(data.get("measured_speed", []), problems)
    if "video" in data:
        check_video(data["video"], problems, complete=True)
    presets = data.get("presets", {})
    if not isinstance(presets, dict):
        problems.add("presets", "expected a mapping of preset name -> device fields")
        presets = {}
    for name, fields in presets.items():
        if not isinstance(fields, dict):
            problems.add(f"presets.{name}", f"expected device fields such as {{type: cuda, capability: '7.5'}}, got {fields!r}")
            continue
        unknown(fields, PRESET_KEYS, f"presets.{name}")
        if fields.get("type") not in TYPES:
            problems.add(f"presets.{name}.type", f"unknown device type {fields.get('type')!r}; allowed: {', '.join(TYPES)}")
        for key in ("capability", "macos"):
            if key in fields and not re.fullmatch(r"\d+(\.\d+)*", str(fields[key])):
                problems.add(f"presets.{name}.{key}", f"expected a version such as '7.5', got {fields[key]!r}")
    problems.raise_if_any()
