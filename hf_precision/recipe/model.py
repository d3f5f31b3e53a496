"""The resolved recipe as values: ``Recipe``, one ``ComponentPolicy`` per component, the ``Decision`` behind each field.

Frozen, torch-free, built only by :mod:`hf_precision.recipe.resolution`. A plan prints in one line, in the manner of
jmp's ``Policy`` (``p=f32,c=f16,o=f16``): ``unet: s=f16 c=f16 o=f16 fp32=[time_embedding, add_embedding]`` reads as
storage, compute, hands over, float32 islands.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, NamedTuple

from .devices import DeviceProfile

__all__ = ["Recipe", "ComponentPolicy", "Decision", "Requirement", "DEFAULT_NO_CAST", "DEFAULT_LAYERWISE_SKIP"]

# Float forward arguments moved but never cast: timesteps feed sinusoidal projections diffusers computes in fp32
# (unet_2d_condition.py get_time_embed), which fp16 rounding changes. Recipes extend it (Flux: guidance, img_ids).
DEFAULT_NO_CAST = ("timestep", "timesteps", "t")
# Modules kept in the compute dtype under layerwise casting: diffusers' own defaults (hooks/layerwise_casting.py
# DEFAULT_SKIP_MODULES_PATTERN), as globs.
DEFAULT_LAYERWISE_SKIP = ("*pos_embed*", "*patch_embed*", "*norm*")
# The short dtype spellings of a plan's one-line form (jmp writes f32/bf16/f16).
_SHORT = {"float32": "f32", "bfloat16": "bf16", "float16": "f16", "float8_e4m3fn": "f8e4m3", "float8_e5m2": "f8e5m2"}


@dataclasses.dataclass(frozen=True)
class Decision:
    """Why a field of a resolved component has its value."""

    field: str
    value: str
    rule: str
    source: str


@dataclasses.dataclass(frozen=True)
class ComponentPolicy:
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
    # Where it sits ("cuda:0"; None: placed nowhere, a meta plan), and the device whose rules chose its dtypes
    device: str | None = None
    resolved_for: str = ""
    no_cast: tuple[str, ...] = DEFAULT_NO_CAST
    layerwise_skip: tuple[str, ...] = DEFAULT_LAYERWISE_SKIP
    # its recipe's quantize.storage and quantize.keep (recipe/quantize.py)
    quantize: tuple[str, ...] = ()
    quantize_keep: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["decisions"] = [dataclasses.asdict(x) for x in self.decisions]
        return d

    def __str__(self) -> str:
        """One line: storage, compute, hands over, float32 islands, and the guards that are on.

        Example:
            >>> from hf_precision.recipe import get_recipe
            >>> print(get_recipe("sdxl", device="t4")["unet"])
            unet: s=f16 c=f16 o=f16 fp32=[time_embedding, add_embedding]
        """
        short = lambda name: _SHORT.get(name, name)
        text = f"{self.name}: s={short(self.storage)} c={short(self.compute)} o={short(self.handed_over or self.output)}"
        if self.keep_fp32:
            text += f" fp32=[{', '.join(self.keep_fp32)}]"
        flags = [n for n, on in (("nan_guard", self.nan_guard), ("upcast_attention", self.upcast_attention)) if on]
        return text + "".join(f" +{f}" for f in flags)


class Requirement(NamedTuple):
    """One ``requires:`` row of a pipeline recipe: the module, how to install it, why, the pipeline classes it holds
    for (empty: all), and the config values that make it unneeded (``unless``); see :mod:`.requires`.

    Example:
        >>> Requirement("torchvision", "pip install torchvision", "the transformer resizes a mask with it").module
        'torchvision'
    """

    module: str
    install: str
    why: str
    pipelines: tuple[str, ...] = ()
    # (component, config key, value) each: a folder whose configs hold all of them does not need the package
    unless: tuple[tuple[str, str, Any], ...] = ()


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A recipe fully resolved for one device. Frozen; prints as a table; ``to_json()`` for machines.

    Example:
        >>> from hf_precision.recipe import get_recipe
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
    policies: tuple[ComponentPolicy, ...]
    sources: tuple[str, ...]
    denoiser: str | None = None
    # the packages loading or running it needs beyond diffusers' own (recipe `requires:`), checked by the loader
    requires: tuple[Requirement, ...] = ()

    @property
    def components(self) -> dict[str, ComponentPolicy]:
        return {p.name: p for p in self.policies}

    def __getitem__(self, name: str) -> ComponentPolicy:
        for p in self.policies:
            if p.name == name:
                return p
        raise KeyError(f"recipe {self.name!r} has no component {name!r}; it has {[p.name for p in self.policies]}")

    def __contains__(self, name: object) -> bool:
        return any(p.name == name for p in self.policies)

    def absent_note(self, name: str, where: str) -> str | None:
        """What to say of planned component ``name`` that ``where`` lacks, or None: a recipe covers its whole family
        (wan.yaml plans transformer_2), so absence is news only where an override decided something for it.

        Example:
            >>> from hf_precision.recipe import get_recipe
            >>> from hf_precision.recipe.overrides import Override, parse_set
            >>> get_recipe("wan", device="t4").absent_note("transformer_2", "this pipeline") is None
            True
            >>> get_recipe("wan", device="t4", overrides=[Override("--set", parse_set(["transformer_2.dtype=float32"]))]
            ...            ).absent_note("transformer_2", "this pipeline")
            'transformer_2: not in this pipeline, so --set changes nothing'
        """
        asked = sorted({d.source for d in self[name].decisions} & set(self.sources[1:]))
        return f"{name}: not in {where}, so {', '.join(asked)} changes nothing" if asked else None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "schema": self.schema, "model": self.model, "pipelines": list(self.pipelines),
                "latents_from": self.latents_from, "denoiser": self.denoiser, "device": self.device.to_dict(), "device_tags": list(self.device_tags),
                "components": {p.name: p.to_dict() for p in self.policies}, "sources": list(self.sources)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self, why: bool = True) -> str:
        head = ("component", "storage", "compute", "hands over", "fp32 islands", "notes")
        rows = []
        for p in self.policies:
            notes = [n for n, on in (("nan-guard", p.nan_guard), ("attn-upcast", p.upcast_attention)) if on]
            rows.append((p.name, p.storage, p.compute, p.handed_over, ", ".join(p.keep_fp32) or "-", " ".join(notes) or "-"))
        widths = [max(len(r[i]) for r in (head, *rows)) for i in range(len(head))]
        line = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip()
        out = [f"recipe {self.name} for {self.device.label()}  [tags: {', '.join(self.device_tags)}]",
               line(head), line(tuple("-" * w for w in widths)), *map(line, rows)]
        if why:
            out.append("")
            out.append("decisions:")
            for p in self.policies:
                for d in p.decisions:
                    out.append(f"  {p.name}.{d.field} = {d.value}: {d.rule} [{d.source}]")
        return "\n".join(out)

    __str__ = table
