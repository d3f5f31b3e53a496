"""Device profiles: describe a device (present or not) and derive what it can compute from ``devices.yaml``.

Detection of the present device lives in :class:`SystemProbe`; tests replace it with ``set_probe``. Nothing
here imports torch except the probe's own methods.
"""

from __future__ import annotations

import dataclasses
import functools
import platform
import re
from collections.abc import Mapping
from typing import Any

from .dtypes import canonical
from .errors import RecipeError
from .files import read_yaml, recipes_dir

__all__ = ["DeviceProfile", "DeviceCaps", "SystemProbe", "device_profile", "device_caps", "set_probe",
           "list_presets"]

TYPES = ("cpu", "cuda", "mps", "xpu")


def _version(text: object) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(text))[:3])


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


class SystemProbe:
    """Reads the present machine. Replace it in tests with :func:`set_probe`."""

    def cpu_flags(self) -> frozenset[str]:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("flags"):
                        return frozenset(line.split(":", 1)[1].split())
        except OSError:
            pass
        return frozenset()

    def cpu_name(self) -> str:
        try:
            with open("/proc/cpuinfo", encoding="utf-8") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return platform.processor() or "CPU"

    def macos(self) -> tuple[int, ...] | None:
        release = platform.mac_ver()[0]
        return _version(release) if release else None

    def count(self, kind: str) -> int:
        import torch

        if kind == "cuda":
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        if kind == "mps":
            return int(torch.backends.mps.is_available())
        if kind == "xpu":
            xpu = getattr(torch, "xpu", None)
            return xpu.device_count() if xpu is not None and xpu.is_available() else 0
        return 1

    def cuda(self, index: int) -> tuple[str, tuple[int, int]]:
        import torch

        return torch.cuda.get_device_name(index), tuple(torch.cuda.get_device_capability(index))  # type: ignore[return-value]

    def xpu_name(self, index: int) -> str:
        import torch

        return torch.xpu.get_device_name(index)


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
    if not isinstance(data, dict) or data.get("kind") != "devices":
        raise RecipeError(f"{path}: not a device rules file (expected 'kind: devices')")
    return data


def list_presets() -> dict[str, DeviceProfile]:
    """Named devices you can plan for without having them (``t4``, ``a100``, ``m1-macos13``, ``cpu-amx`` ...)."""
    return {name: _profile_from_fields(spec, f"devices.yaml: presets.{name}")
            for name, spec in _devices_file()["presets"].items()}


def _profile_from_fields(fields: Mapping[str, Any], source: str) -> DeviceProfile:
    kind = fields.get("type")
    if kind not in TYPES:
        raise RecipeError(f"{source}: unknown device type {kind!r}; allowed: {', '.join(TYPES)}")
    cap = fields.get("capability")
    macos = fields.get("macos")
    return DeviceProfile(type=kind, index=fields.get("index"), name=str(fields.get("name", "")),
                         capability=tuple(_version(cap)[:2]) if cap is not None else None,  # type: ignore[arg-type]
                         macos=_version(macos) if macos is not None else None,
                         cpu_flags=frozenset(fields.get("cpu_flags", ())))


_SPEC_HELP = ("use a preset ({presets}), a present device (cpu, cuda, cuda:1, mps, xpu), or describe one: "
              "cuda:sm75, cuda:sm=8.0,name=GeForce GTX 1660, mps:macos=13.6, cpu:amx, cpu:avx2")


def _spec_error(spec: str, why: str) -> RecipeError:
    return RecipeError(f"device {spec!r}: {why}; " + _SPEC_HELP.format(presets=", ".join(list_presets())))


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
        raise _spec_error(text, f"unknown device type {kind!r}")
    if rest == "" or rest.isdigit():
        return _present(kind, int(rest) if rest else (0 if kind in ("cuda", "xpu") else None), text)
    return _described(kind, rest, text)


def _present(kind: str, index: int | None, spec: str) -> DeviceProfile:
    if kind == "cpu":
        return DeviceProfile(type="cpu", name=_probe.cpu_name(), cpu_flags=_probe.cpu_flags(), present=True)
    count = _probe.count(kind)
    if count == 0 or (index is not None and index >= count):
        have = f"{count} {kind} device(s)" if count else f"no {kind} device"
        raise _spec_error(spec, f"this machine has {have}; to plan for a device that is not here, describe it")
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
            fields["cpu_flags"] = {"amx": ["avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"],
                                   "avx512": ["avx2", "avx512f", "avx512_bf16"], "avx2": ["avx2"]}[part]
        elif "=" in part:
            key, value = (s.strip() for s in part.split("=", 1))
            key = {"sm": "capability", "cc": "capability"}.get(key, key)
            if key not in ("capability", "macos", "name", "flags"):
                raise _spec_error(spec, f"unknown field {key!r} (fields: sm/cc, macos, name, flags)")
            if key in ("capability", "macos") and not _version(value):
                raise _spec_error(spec, f"{key}={value!r} is not a version like 8.0")
            fields["cpu_flags" if key == "flags" else key] = value.split("+") if key == "flags" else value
        else:
            raise _spec_error(spec, f"cannot read {part!r}")
    if kind == "cuda" and "capability" not in fields:
        raise _spec_error(spec, "a described CUDA device needs its compute capability (cuda:sm75 or cuda:sm=7.5)")
    if kind == "mps" and "macos" not in fields:
        raise _spec_error(spec, "a described MPS device needs its macOS version (mps:macos=13.6)")
    return _profile_from_fields(fields, f"device {spec!r}")


def _cmp(value: tuple[int, ...] | None, cond: str) -> bool:
    if value is None:
        return False
    m = re.fullmatch(r"\s*(>=|<=|>|<|==)?\s*([\d.]+)\s*", str(cond))
    if not m:
        raise RecipeError(f"devices.yaml: bad version condition {cond!r}; write e.g. '>=8.0'")
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
        return [canonical(c) or str(c) for c in change]
    out = list(current)
    for c in change:
        name = canonical(str(c)[1:]) or str(c)[1:]
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
    # A profile object is used as is, never passed through device_profile's cache: lru_cache would hand back an
    # earlier *equal* profile instead of this one (recipe.device is profile would then fail).
    profile = spec if isinstance(spec, DeviceProfile) else device_profile(spec)
    lists: dict[str, list[str]] = {"compute": [], "auto": [], "storage": []}
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
                      storage=tuple(lists["storage"]), upcast_attention=upcast, tags=tuple(tags), why=why)
