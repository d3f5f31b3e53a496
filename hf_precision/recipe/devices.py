"""Device profiles: describe a device (present or not) and derive what it can compute from ``devices.yaml``.

The present machine is read by :class:`~hf_precision.recipe.probe.SystemProbe` (and its environment variables, which
make this CPU read as another: :mod:`hf_precision.recipe.probe`); tests replace it with ``set_probe``. Torch-free.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError, excerpt, spelled

CPU = "cpu"
from .files import read_yaml, recipes_dir
from .probe import (CPU_FLAG_SETS, CPU_FLAGS_ENV, CPU_NAME_ENV, SystemProbe, cpu_flags_from_env,  # noqa: F401 (API)
                    cpu_name_from_env)
from .probe import version as _version
from .devices_schema import check_devices_file
from .quantize import canonical_storage
from .schema import TYPES

__all__ = ["DeviceProfile", "DeviceCaps", "SystemProbe", "device_profile", "device_caps", "set_probe",
           "measured_speed", "speed_note", "video_defaults", "list_presets", "present_devices", "rule_ids",
           "CPU_FLAGS_ENV", "CPU_NAME_ENV", "CPU_FLAG_SETS", "cpu_flags_from_env", "cpu_name_from_env"]


@dataclasses.dataclass(frozen=True)
class DeviceProfile:
    """What matters about a device for precision decisions. It can describe a device that is not present.

    Example:
        >>> DeviceProfile(type="cuda", capability=(7, 5), name="Tesla T4").label()
        'cuda (Tesla T4, sm 7.5)'
    """

    type: str
    index: int | None = None
    name: str = ""
    capability: tuple[int, int] | None = None
    macos: tuple[int, ...] | None = None
    cpu_flags: frozenset[str] = frozenset()
    present: bool = False

    def label(self) -> str:
        bits = [self.name] if self.name else []
        if self.capability:
            bits.append(f"sm {self.capability[0]}.{self.capability[1]}")
        if self.macos:
            bits.append("macOS " + ".".join(map(str, self.macos)))
        if self.type == "cpu" and self.cpu_flags and not self.name:
            bits.append("+".join(sorted(f for f in self.cpu_flags if f.startswith(("avx512_bf16", "amx")))) or "no bf16 ISA")
        where = self.type if self.index is None else f"{self.type}:{self.index}"
        return f"{where} ({', '.join(bits)})" if bits else where

    def torch_device(self) -> str:
        """The torch device string (``cuda:1``, ``cpu``) for a present device."""
        return self.type if self.index is None else f"{self.type}:{self.index}"

    def to_dict(self) -> dict[str, Any]:
        return {"type": self.type, "index": self.index, "name": self.name,
                "capability": ".".join(map(str, self.capability)) if self.capability else None,
                "macos": ".".join(map(str, self.macos)) if self.macos else None,
                "cpu_flags": sorted(self.cpu_flags), "present": self.present}


@dataclasses.dataclass(frozen=True)
class DeviceCaps:
    """A profile with the rules of ``devices.yaml`` applied."""

    profile: DeviceProfile
    compute: tuple[str, ...]
    auto: tuple[str, ...]
    storage: tuple[str, ...]
    upcast_attention: bool
    tags: tuple[str, ...]
    why: Mapping[str, str]
    # storage only transformers models may use here: diffusers' quantizer refuses the device (devices.yaml)
    transformers_only: tuple[str, ...] = ()


_probe: SystemProbe = SystemProbe()


def set_probe(probe: SystemProbe | None) -> SystemProbe:
    """Replace the machine reader (tests); ``None`` restores the real one. Returns the previous probe."""
    global _probe
    previous, _probe = _probe, probe or SystemProbe()
    device_profile.cache_clear()
    return previous


@functools.lru_cache(maxsize=1)
def _devices_file() -> dict[str, Any]:
    path = recipes_dir() / "devices.yaml"
    data = read_yaml(path)
    check_devices_file(data, str(path))
    return data


def video_defaults() -> dict[str, Any]:
    """devices.yaml's ``video:`` block: the default of every video key a recipe's block leaves out.

    Example:
        >>> video_defaults()["cfg_batch"], sorted(video_defaults()["defaults"])
        (2, ['frames', 'height', 'steps', 'width'])
    """
    data = _devices_file()
    if "video" not in data:
        raise RecipeError(f"{recipes_dir() / 'devices.yaml'}: video: missing; it gives every video key its default "
                          f"(the keys: hf_precision.recipe.schema.VIDEO_KEYS)")
    return data["video"]


def rule_ids() -> list[str]:
    """The ids of the device rules in ``devices.yaml``: the tags a recipe's ``devices:`` section may name.

    Example:
        >>> "cuda" in rule_ids()
        True
    """
    return [r["id"] for r in _devices_file()["rules"]]


def measured_speed(storage: str, device: str | DeviceProfile | None = None) -> tuple[float, str] | None:
    """(time per denoiser call of ``storage`` relative to the half layout, the run that measured it) for the device's
    type (``devices.yaml`` ``measured_speed``); ``None`` where nothing was measured.

    Example:
        >>> ratio, source = measured_speed("int8", "a100")
        >>> ratio > 0 and "bench_quantize" in source
        True
        >>> measured_speed("int8", "m1-macos13") is None
        True
    """
    kind = (device if isinstance(device, DeviceProfile) else device_profile(device)).type
    for entry in _devices_file().get("measured_speed", []):
        if entry["device"] == kind and storage in entry["relative"]:
            return float(entry["relative"][storage]), str(entry["source"])
    return None


def speed_note(quantize: Any, device: Any) -> str:
    """What a memory plan's quantized storage costs per denoiser call, where measured; empty when nothing is.

    Example:
        >>> speed_note([("transformer", "int8")], "rtx3060")  # doctest: +ELLIPSIS
        'speed: transformer int8 1.14x the half layout per call (measured: python benchmarks/bench_quantize.py --device cuda; ...)'
        >>> speed_note([("transformer", "int8")], "m1-macos13")
        'speed: transformer int8: not measured on mps'
    """
    profile = device if isinstance(device, DeviceProfile) else device_profile(device)
    parts, sources = [], []
    for component, storage in quantize:
        if component.startswith(("text_encoder", "image_encoder")):  # the figures are denoiser calls (every step)
            parts.append(f"{component} {storage}: runs once per prompt, not timed")
            continue
        found = measured_speed(storage, profile)
        if found is None:
            parts.append(f"{component} {storage}: not measured on {profile.type}")
            continue
        parts.append(f"{component} {storage} {found[0]:.2f}x the half layout per call")
        if found[1] not in sources:
            sources.append(found[1])
    if not parts:
        return ""
    return "speed: " + ", ".join(parts) + "".join(f" (measured: {src})" for src in sources)


def list_presets() -> dict[str, DeviceProfile]:
    """Named devices you can plan for without having them (``t4``, ``a100``, ``m1-macos13``, ``cpu-amx`` ...)."""
    return {name: _profile_from_fields(spec, f"devices.yaml: presets.{name}")
            for name, spec in _devices_file()["presets"].items()}


def _profile_from_fields(fields: Mapping[str, Any], source: str) -> DeviceProfile:
    kind = fields.get("type")
    if kind not in TYPES:
        raise RecipeError(f"{source}: unknown device type {excerpt(kind)}; allowed: {', '.join(TYPES)}")
    cap = fields.get("capability")
    macos = fields.get("macos")
    return DeviceProfile(type=kind, index=fields.get("index"), name=str(fields.get("name", "")),
                         capability=tuple(_version(cap)[:2]) if cap is not None else None,  # type: ignore[arg-type]
                         macos=_version(macos) if macos is not None else None,
                         cpu_flags=frozenset(fields.get("cpu_flags", ())))


_SPEC_HELP = ("use a preset ({presets}), a present device ({present}), or describe one: "
              "cuda:sm75, cuda:sm=8.0,name=GeForce GTX 1660, mps:macos=13.6, cpu:amx, cpu:avx2")


def present_devices() -> list[str]:
    """The devices this machine has, as ``torch.device`` spells them (``cpu`` always; ``cuda:1`` only with 2 GPUs).

    Example:
        >>> present_devices()[0]
        'cpu'
    """
    out = ["cpu"]
    for kind in ("cuda", "mps", "xpu"):
        n = _probe.count(kind)
        out += [kind] if kind == "mps" and n else [kind if i == 0 else f"{kind}:{i}" for i in range(n)]
    return out


def _spec_error(spec: str, why: str) -> RecipeError:
    return RecipeError(f"device {excerpt(spec)}: {why}; " + _SPEC_HELP.format(presets=", ".join(list_presets()),
                                                                           present=", ".join(present_devices())))


# A preset of each kind, for the "run its layout here" fix of a device that is not here.
_LAYOUT_EXAMPLE = {"cuda": "t4", "mps": "m2-macos15", "xpu": "arc-a770", "cpu": "cpu-amx"}


@functools.lru_cache(maxsize=64)
def device_profile(spec: str | DeviceProfile | None = None) -> DeviceProfile:
    """Profile for a device spec; ``None`` means the best present device (cuda > mps > xpu > cpu).

    Example:
        >>> device_profile("t4").capability
        (7, 5)
        >>> device_profile("cuda:sm=8.0").capability
        (8, 0)
    """
    if isinstance(spec, DeviceProfile):
        return spec
    if spec is None:
        for kind in ("cuda", "mps", "xpu"):
            if _probe.count(kind):
                return _present(kind, 0 if kind != "mps" else None, kind)
        return _present("cpu", None, "cpu")
    text = str(spec).strip()
    presets = list_presets()
    if text.lower() in presets:
        return presets[text.lower()]
    kind, _, rest = text.partition(":")
    kind = kind.lower()
    if kind not in TYPES:
        raise _spec_error(text, f"unknown device type {excerpt(kind)}")
    if rest == "" or rest.isdigit():
        return _present(kind, int(rest) if rest else (0 if kind in ("cuda", "xpu") else None), text)
    return _described(kind, rest, text)


def _present(kind: str, index: int | None, spec: str) -> DeviceProfile:
    if kind == "cpu":
        return DeviceProfile(type="cpu", name=_probe.cpu_name(), cpu_flags=_probe.cpu_flags(), present=True)
    count = _probe.count(kind)
    if count == 0 or (index is not None and index >= count):
        have = f"{count} {kind} device(s)" if count else f"no {kind} device"
        example = _LAYOUT_EXAMPLE.get(kind, "t4")
        raise _spec_error(spec, f"this machine has {have} (present: {', '.join(present_devices())}). To run the dtypes "
                                f"of a {kind} device here, resolve for it and place on a present one: "
                                f"{spelled(f'load_pipeline(..., {CPU!r}, layout={example!r})', f'--layout {example} --device cpu')}; "
                                f"to plan for one, name a preset or describe it")
    if kind == "cuda":
        name, cap = _probe.cuda(index or 0)
        return DeviceProfile(type="cuda", index=index, name=name, capability=cap, present=True)
    if kind == "mps":
        return DeviceProfile(type="mps", name="Apple GPU", macos=_probe.macos(), present=True)
    return DeviceProfile(type="xpu", index=index, name=_probe.xpu_name(index or 0), present=True)


def _described(kind: str, rest: str, spec: str) -> DeviceProfile:
    fields: dict[str, Any] = {"type": kind}
    for part in rest.split(","):
        part = part.strip()
        if m := re.fullmatch(r"sm_?(\d)(\d)", part):
            fields["capability"] = f"{m[1]}.{m[2]}"
        elif part in ("amx", "avx2", "avx512"):
            fields["cpu_flags"] = list(CPU_FLAG_SETS[part])
        elif "=" in part:
            key, value = (s.strip() for s in part.split("=", 1))
            key = {"sm": "capability", "cc": "capability"}.get(key, key)
            if key not in ("capability", "macos", "name", "flags"):
                raise _spec_error(spec, f"unknown field {excerpt(key)} (fields: sm/cc, macos, name, flags)")
            if key in ("capability", "macos") and not _version(value):
                raise _spec_error(spec, f"{key}={excerpt(value)} is not a version like 8.0")
            fields["cpu_flags" if key == "flags" else key] = value.split("+") if key == "flags" else value
        else:
            raise _spec_error(spec, f"cannot read {excerpt(part)}")
    if kind == "cuda" and "capability" not in fields:
        raise _spec_error(spec, "a described CUDA device needs its compute capability (cuda:sm75 or cuda:sm=7.5)")
    if kind == "mps" and "macos" not in fields:
        raise _spec_error(spec, "a described MPS device needs its macOS version (mps:macos=13.6)")
    return _profile_from_fields(fields, f"device {excerpt(spec)}")


def _cmp(value: tuple[int, ...] | None, cond: str) -> bool:
    if value is None:
        return False
    m = re.fullmatch(r"\s*(>=|<=|>|<|==)?\s*([\d.]+)\s*", str(cond))
    if not m:
        raise RecipeError(f"devices.yaml: bad version condition {excerpt(cond)}; write e.g. '>=8.0'")
    op, want = m[1] or "==", _version(m[2])
    have = tuple(value) + (0,) * (len(want) - len(value))
    have = have[: max(len(want), 1)]
    return {">=": have >= want, "<=": have <= want, ">": have > want, "<": have < want, "==": have == want}[op]


def _holds(when: Mapping[str, Any], p: DeviceProfile) -> bool:
    if when.get("type", p.type) != p.type:
        return False
    if "capability" in when and not _cmp(p.capability, when["capability"]):
        return False
    if "macos" in when and not _cmp(p.macos, when["macos"]):
        return False
    if not set(when.get("cpu_flags", ())) <= p.cpu_flags:
        return False
    names = when.get("name_contains")
    return not names or any(n.lower() in p.name.lower() for n in names)


def _edit(current: list[str], change: list[str]) -> list[str]:
    if all(not str(c).startswith(("+", "-")) for c in change):
        return [canonical_storage(c) or str(c) for c in change]

    out = list(current)
    for c in change:
        name = canonical_storage(str(c)[1:]) or str(c)[1:]
        if str(c).startswith("+") and name not in out:
            out.append(name)
        elif str(c).startswith("-") and name in out:
            out.remove(name)
    return out


def device_caps(spec: str | DeviceProfile | None = None) -> DeviceCaps:
    """What a device computes, may pick unasked and can store, from the rules of ``devices.yaml``.

    Example:
        >>> caps = device_caps("t4")
        >>> "bfloat16" in caps.compute, caps.tags
        (False, ('cuda',))
    """
    # not through device_profile's lru_cache, which would hand back an earlier *equal* profile, not this one
    profile = spec if isinstance(spec, DeviceProfile) else device_profile(spec)
    lists: dict[str, list[str]] = {"compute": [], "auto": [], "storage": [], "transformers_only": []}
    tags: list[str] = []
    why: dict[str, str] = {}
    upcast = False
    for rule in _devices_file()["rules"]:
        if not _holds(rule.get("when", {}), profile):
            continue
        tags.append(rule["id"])
        why[rule["id"]] = " ".join(str(rule.get("why", "")).split())
        for key in lists:
            if key in rule:
                lists[key] = _edit(lists[key], list(rule[key]))
        upcast = bool(rule.get("upcast_attention", upcast))
    return DeviceCaps(profile=profile, compute=tuple(lists["compute"]), auto=tuple(lists["auto"]),
                      storage=tuple(lists["storage"]), upcast_attention=upcast, tags=tuple(tags), why=why,
                      transformers_only=tuple(s for s in lists["transformers_only"] if s in lists["storage"]))
