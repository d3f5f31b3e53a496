"""plan: what a recipe does to a pipeline, worked out from its configs alone (meta device, no weights, no GPU).

Components are built from ``config.json`` on torch's ``meta`` device and counted with the island rule and
per-parameter dtypes :func:`hf_precision.apply_recipe` uses (``recipe.patterns.resolve_islands``,
``runtime.layout.planned_sizes``): ``hf-precision plan sdxl --device t4`` says, before a 7 GB download, that the
SDXL VAE stays float32 on a T4 and what the pipeline takes against plain float32.
"""

from __future__ import annotations

import dataclasses
import json
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt
from ..errors import RecipeError
from ..runtime.meta import build_on_meta
from ..units import format_bytes
from ..runtime.source import composable_models, configs_of, listed_components
from ..recipe.catalog import list_recipes, recipe_classes
from ..recipe.model import ComponentPolicy, Recipe
from ..recipe.requires import loading_note
from ..recipe.resolution import resolve

if TYPE_CHECKING:
    from torch import nn

__all__ = ["plan", "Plan", "PlannedComponent", "Island", "ModuleRow", "build_on_meta"]


# --------------------------------------------------------------------------------------------- results


@dataclasses.dataclass(frozen=True)
class Island:
    """A module that stays float32 inside a half-precision component."""

    module: str
    params: int
    why: str


@dataclasses.dataclass(frozen=True)
class ModuleRow:
    """One module of a component: class, parameters (its own and its children's) and their planned dtype(s)."""

    name: str
    cls: str
    params: int
    dtype: str
    island: bool


@dataclasses.dataclass
class PlannedComponent:
    """One component of a :class:`Plan`: ``bytes_by_dtype`` (canonical dtype -> bytes of its parameters and buffers,
    persistent or not), ``fp32_bytes`` (the same in float32, as plain ``from_pretrained``; integer buffers at their own
    size) and ``params`` (parameters only).
    """

    name: str
    cls: str
    library: str
    params: int
    bytes_by_dtype: dict[str, int]
    total_bytes: int
    fp32_bytes: int
    storage: str
    compute: str
    handed_over: str
    islands: list[Island]
    keep_fp32: tuple[str, ...]
    fp32_why: str | None
    why: str
    modules: list[ModuleRow] | None = None

    @property
    def island_params(self) -> int:
        return sum(i.params for i in self.islands)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)  # the islands and module rows become dicts too
        modules = d.pop("modules")
        d.update(keep_fp32=list(self.keep_fp32), island_params=self.island_params)
        return d if modules is None else {**d, "modules": modules}


@dataclasses.dataclass
class Plan:
    """What a recipe does to a pipeline: per component its parameters, bytes per dtype, float32 modules and why.

    Printed, a table in GB/MB; ``to_dict()``/``to_json()`` carry exact bytes. ``name`` (what was asked), ``source``
    (where the configs came from), ``pipeline`` (``model_index.json``'s class), ``recipe`` (resolved), ``components``
    (:class:`PlannedComponent` in recipe order) and ``skipped`` (components not planned, and why).
    """

    name: str
    source: str
    pipeline: str
    recipe: Recipe
    components: dict[str, PlannedComponent]
    skipped: list[str]

    @property
    def params(self) -> int:
        return sum(c.params for c in self.components.values())

    @property
    def total_bytes(self) -> int:
        return sum(c.total_bytes for c in self.components.values())

    @property
    def fp32_bytes(self) -> int:
        return sum(c.fp32_bytes for c in self.components.values())

    def __getitem__(self, name: str) -> PlannedComponent:
        try:
            return self.components[name]
        except KeyError:
            raise KeyError(f"plan has no component {name!r}; it has {list(self.components)}") from None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "source": self.source, "pipeline": self.pipeline,
                "device": self.recipe.device.label(), "params": self.params, "total_bytes": self.total_bytes,
                "fp32_bytes": self.fp32_bytes, "saved_bytes": self.fp32_bytes - self.total_bytes,
                "components": {n: c.to_dict() for n, c in self.components.items()}, "skipped": list(self.skipped),
                "recipe": json.loads(self.recipe.to_json())}  # JSON types (lists, not tuples): to_dict == loads(to_json)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self, modules: bool = False) -> str:
        """The plan as text; ``modules=True`` adds every module of every component (needs ``plan(..., modules=True)``)."""
        head = ("component", "class", "parameters", "storage", "compute", "hands over", "float32 modules", "size",
                "all-fp32")
        rows = []
        for c in self.components.values():
            if c.fp32_why is not None:
                fp32 = "whole component"
            elif len(c.islands) > 3:
                fp32 = f"{len(c.islands)} modules ({', '.join(c.keep_fp32)})"
            else:
                fp32 = ", ".join(i.module for i in c.islands) or "-"
            rows.append((c.name, c.cls, f"{c.params:,}", c.storage, c.compute, c.handed_over, fp32,
                         format_bytes(c.total_bytes), format_bytes(c.fp32_bytes)))
        total = ("total", "", f"{self.params:,}", "", "", "", "", format_bytes(self.total_bytes), format_bytes(self.fp32_bytes))
        right = {2, 7, 8}
        widths = [max(len(r[i]) for r in (head, *rows, total)) for i in range(len(head))]
        line = lambda r: "  ".join(c.rjust(w) if i in right else c.ljust(w)
                                   for i, (c, w) in enumerate(zip(r, widths))).rstrip()
        out = [f"plan: recipe {self.recipe.name} for {self.recipe.device.label()}",
               f"pipeline: {self.pipeline} from {self.source} (built from configs on the meta device, no weights)",
               *filter(None, [loading_note(self.recipe, self.pipeline)]), "", line(head), line(tuple("-" * w for w in widths)), *map(line, rows), line(total), ""]
        saved = self.fp32_bytes - self.total_bytes
        pct = f" ({100 * saved / self.fp32_bytes:.0f}%)" if self.fp32_bytes else ""
        out.append(f"weights: {self.total_bytes:,} bytes ({format_bytes(self.total_bytes)}) with this recipe, "
                   f"{self.fp32_bytes:,} bytes ({format_bytes(self.fp32_bytes)}) all-fp32: saves {format_bytes(saved)}{pct}")
        out.append("(1 GB = 10^9 bytes; parameters and buffers, activations come on top)")
        out += ["", "bytes by dtype:"]
        for c in self.components.values():
            parts = " + ".join(f"{name} {n:,} ({format_bytes(n)})" for name, n in c.bytes_by_dtype.items())
            out.append(f"  {c.name}: {parts}")
        stays = [c for c in self.components.values() if c.fp32_why is not None or c.islands]
        if stays:
            out += ["", "stays float32, and why:"]
            device_notes: list[str] = []
            for c in stays:
                if c.fp32_why is not None:
                    out.append(f"  {c.name} (whole component, {c.params:,} parameters, {format_bytes(c.fp32_bytes)}):")
                    why, _, device = c.fp32_why.partition(". Device: ")
                    out += _wrap(why + ("." if device else ""), "      ")
                    if device and device not in device_notes:
                        device_notes.append(device)
                    continue
                width = max(len(f"{c.name}.{i.module}") for i in c.islands)
                shown = c.islands if len(c.islands) <= 8 else c.islands[:6]
                for i in shown:
                    out.append(f"  {c.name}.{i.module}".ljust(width + 2) + f"  {i.params:>12,} parameters  "
                               f"{format_bytes(i.params * 4)}")
                if len(shown) < len(c.islands):
                    rest = c.islands[len(shown):]
                    out.append(f"  ... and {len(rest)} more ({sum(i.params for i in rest):,} parameters)")
                out += _wrap(c.islands[0].why, "      ")
            for note in device_notes:
                out += _wrap(f"device: {note}", "  ")
        if self.skipped:
            out += ["", "not planned: " + "; ".join(self.skipped)]
        if modules:
            out += ["", "modules:"]
            for c in self.components.values():
                if c.modules is None:
                    out.append(f"  {c.name}: (plan(..., modules=True) lists them)")
                    continue
                rows_m = [(f"{c.name}.{m.name}" if m.name else c.name, m.cls, f"{m.params:,}", m.dtype,
                           "island" if m.island else "") for m in c.modules]
                w = [max(len(r[i]) for r in rows_m) for i in range(5)]
                for r in rows_m:
                    out.append(f"  {r[0].ljust(w[0])}  {r[1].ljust(w[1])}  {r[2].rjust(w[2])}  {r[3].ljust(w[3])}  "
                               f"{r[4]}".rstrip())
        return "\n".join(out)

    def __str__(self) -> str:
        return self.table(modules=any(c.modules is not None for c in self.components.values()))


def _wrap(text: str, indent: str) -> list[str]:
    return textwrap.wrap(text, width=110, initial_indent=indent, subsequent_indent=indent) or []


# --------------------------------------------------------------------------------------------- planning


def plan(name_or_path: str | Path, device: Any = None, *, recipe: Recipe | str | None = None,
         overrides: Any = None, modules: bool = False, force: bool = False, base: str | Path | None = None) -> Plan:
    """Plan a pipeline from its configs (no download, no allocation): per component, parameters, bytes per dtype,
    float32 modules and why, for ``device`` (a preset such as ``"t4"``, a present device, or ``"cuda:sm75"``).

    ``name_or_path``: a recipe alias (configs in ``hf_precision/model_configs/``), a shipped folder's name or Hub id, a
    local folder of ``model_index.json`` and configs, or another Hub id (JSON files only). ``recipe``, ``overrides``,
    ``force`` and ``base`` are ``load_pipeline``'s (a GGUF denoiser counted from its tensor types, as it loads);
    ``modules=True`` lists every module. An unknown name, recipe or device, or a ``keep_fp32`` pattern matching no
    module, is a RecipeError.

    Example:
        >>> p = plan("sdxl", device="t4")
        >>> p["vae"].compute, p["vae"].total_bytes == 83_653_863 * 4
        ('float32', True)
        >>> [(i.module, i.params) for i in p["unet"].islands]
        [('time_embedding', 2050560), ('add_embedding', 5245440)]
        >>> plan("sdxl", device="a100")["vae"].compute
        'bfloat16'
    """
    from ..recipe.devices import device_caps
    from ..runtime.layout import check_user_names, component_islands
    from ..runtime.quantize import refuse_library

    text = str(name_or_path)
    from ..runtime.single_file import split_single_file

    single = split_single_file(text, base, caller="plan")
    single_file, base = single if single is not None else (None, base)
    source, index, configs = configs_of(base if single_file is not None else text)
    if single_file is not None:
        source = f"{single_file} + {source}"
    pipeline = str(index.get("_class_name", "?"))
    if recipe is None and text in list_recipes("pipeline"):
        recipe = text
    # Nothing is placed: the plan is for `device`, built on the meta device. The models compose a recipe when none
    # is named and no shipped recipe lists the class.
    composed = recipe is None and pipeline not in recipe_classes()
    resolved = resolve(recipe, pipeline_class=pipeline, layout=device if not isinstance(recipe, Recipe) else None,
                       overrides=overrides, configs=configs, force=force,
                       models=composable_models(source, index) if composed else None)

    caps = device_caps(resolved.device)
    device_why = "" if set(caps.auto) & dt.HALF else next((caps.why[t] for t in reversed(caps.tags) if caps.why.get(t)), "")
    components: dict[str, PlannedComponent] = {}
    skipped: list[str] = []
    listed = listed_components(index)
    for comp, (_, class_name) in listed.items():
        if comp not in resolved and comp in configs:
            skipped.append(f"{comp} ({class_name}): not in recipe {resolved.name}, left as loaded")
    for cp in resolved.policies:
        if cp.name not in listed:
            note = resolved.absent_note(cp.name, f"{pipeline}'s model_index.json")  # optional: no note unless asked
            if note:
                skipped.append(note)
            continue
        library, class_name = listed[cp.name]
        if cp.name not in configs:
            skipped.append(f"{cp.name} ({class_name}): no {cp.name}/config.json")
            continue
        refuse_library(cp, library, resolved.device, text, loading=False)
        module = build_on_meta(library, class_name, configs[cp.name], pipeline=pipeline)
        check_user_names(cp, module)
        islands = component_islands(cp, module)
        packed: dict[str, tuple[str, int]] = {}
        if single_file is not None and cp.name == resolved.denoiser:
            from ..runtime.gguf import gguf_packed
            from ..runtime.single_file import denoiser_layout, refuse_unreadable

            refuse_unreadable(single_file, type(module), cp.name, str(base))
            if single_file.suffix.lower() == ".gguf":
                packed = gguf_packed(single_file, module, islands)
            else:  # its tensors load in the planned dtypes: the header is checked, the plan is the base's
                denoiser_layout(single_file, module, cp.name, str(base))
        components[cp.name] = _plan_component(cp, module, library, islands, modules, device_why, packed)
        del module
    return Plan(name=text, source=source, pipeline=pipeline, recipe=resolved, components=components, skipped=skipped)


def _gguf_storage(packed: Mapping[str, tuple[str, int]], rest: str) -> str:
    """The storage column of a denoiser read from a GGUF file: its packed types, most bytes first, then the rest.

    Example:
        >>> _gguf_storage({"a.weight": ("Q4_K", 144), "b.weight": ("Q5_0", 22), "c.weight": ("Q4_K", 144)}, "bfloat16")
        'gguf Q4_K+Q5_0, rest bfloat16'
    """
    sizes: dict[str, int] = {}
    for qtype, size in packed.values():
        sizes[qtype] = sizes.get(qtype, 0) + size
    return f"gguf {'+'.join(sorted(sizes, key=lambda t: (-sizes[t], t)))}, rest {rest}"


def _decision(cp: ComponentPolicy, field: str) -> Any:
    return next((d for d in cp.decisions if d.field == field), None)


def _plan_component(cp: ComponentPolicy, module: nn.Module, library: str, islands: list[str], with_modules: bool,
                    device_why: str, packed: Mapping[str, tuple[str, int]] | None = None) -> PlannedComponent:
    from ..recipe.patterns import inside
    from ..runtime.layout import planned_sizes

    sizes = {**planned_sizes(module, cp, islands), **(packed or {})}  # a GGUF file's blocks, as stored
    params = 0
    fp32_bytes = 0
    by_dtype: dict[str, int] = {}
    own: dict[str, list[tuple[int, str]]] = {}
    # buffers, persistent or not (PixArt's pos_embed table, CLIP's position_ids), are held like the weights
    for tname, tensor in [*module.named_parameters(), *module.named_buffers()]:
        name, size = sizes[tname]
        by_dtype[name] = by_dtype.get(name, 0) + size
        fp32_bytes += tensor.numel() * 4 if tensor.is_floating_point() else size
    for pname, param in module.named_parameters():
        params += param.numel()
        own.setdefault(pname.rpartition(".")[0], []).append((param.numel(), sizes[pname][0]))
    order = {name: i for i, name in enumerate(dt.DTYPES)}
    by_dtype = dict(sorted(by_dtype.items(), key=lambda kv: (order.get(kv[0], 99), kv[0])))

    island_why = cp.why or "kept float32 by the recipe"
    keep = _decision(cp, "keep_fp32")
    if keep is not None:
        island_why = f"keep_fp32 [{keep.source}]: {island_why}"
    counts = {i: sum(p.numel() for p in module.get_submodule(i).parameters()) for i in islands}
    island_rows = [Island(i, counts[i], island_why) for i in islands]

    storage = _gguf_storage(packed, cp.storage) if packed else cp.storage
    fp32_why = None
    compute_decision = _decision(cp, "compute")
    if cp.compute == "float32" and cp.storage == "float32" and not packed:
        fp32_why = f"compute float32: {compute_decision.rule if compute_decision else 'the recipe says so'}"
        if device_why:
            fp32_why += f". Device: {device_why}"  # the device picks no half dtype unasked: the device decided
        elif cp.why:
            fp32_why += f". {cp.why}"  # the device would take half precision: the recipe decided

    rows = None
    if with_modules:
        totals: dict[str, int] = {}
        dtypes_of: dict[str, set[str]] = {}
        for owner, items in own.items():
            parts = owner.split(".") if owner else []
            for k in range(len(parts) + 1):
                prefix = ".".join(parts[:k])
                totals[prefix] = totals.get(prefix, 0) + sum(n for n, _ in items)
                dtypes_of.setdefault(prefix, set()).update(d for _, d in items)
        rows = [ModuleRow(name=n, cls=type(m).__name__, params=totals.get(n, 0),
                          dtype="+".join(sorted(dtypes_of.get(n, ()), key=lambda d: order.get(d, 99))) or "-",
                          island=inside(n, islands))
                for n, m in module.named_modules()]
    return PlannedComponent(name=cp.name, cls=type(module).__name__, library=library, params=params,
                            bytes_by_dtype=by_dtype, total_bytes=sum(by_dtype.values()), fp32_bytes=fp32_bytes,
                            storage=storage, compute=cp.compute, handed_over=cp.handed_over, islands=island_rows,
                            keep_fp32=tuple(cp.keep_fp32), fp32_why=fp32_why,
                            why=compute_decision.rule if compute_decision else "", modules=rows)
