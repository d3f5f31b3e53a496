"""calibrate's report: why each island exists (`Evidence`), how each run compares with the reference (`RunError`),
and the result (`CalibrationResult`) as an override file (YAML) and a table.

Torch-free: the runs hand over numpy arrays (``record.output_array``) and plain numbers.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...recipe.files import shared_mode
from ...recipe.patterns import inside, outermost
from ...units import format_bytes

__all__ = ["HALF_MAX", "Evidence", "RunError", "CalibrationResult", "compare", "recipe_notes", "moved"]

HALF_MAX = {"float16": 65504.0, "bfloat16": 3.3895313892515355e38}


@dataclasses.dataclass(frozen=True)
class Evidence:
    """Why an island exists: the module whose activations left the range, where and how far."""

    component: str
    island: str
    module: str
    # "output" or "input" (reference run), "weights" (parameters beyond the range), "half run" (first non-finite
    # value of a half run), "error" (where a finite half run's error vs the reference grows most)
    where: str
    max_abs: float
    step: str
    share: float  # share of the values beyond the target's range in that call ("error": the output's relative error)

    def line(self, target: str) -> str:
        if self.where == "half run":
            return f"{self.module}: first non-finite output of the {target} run ({self.step})"
        if self.where == "weights":
            return (f"{self.module} weights max |w| {self.max_abs:.3g} > {target} max {HALF_MAX[target]:.6g} "
                    f"({self.share:.2%} of them beyond: not storable in {target})")
        if self.where == "error":
            return (f"{self.module}: the {target} run's error grows {self.max_abs:.3g}x here (relative error of its "
                    f"output {self.share:.3g} over that of its input; {self.step})")
        return (f"{self.module} {self.where} max |x| {self.max_abs:.3g} > {target} max {HALF_MAX[target]:.6g} "
                f"({self.share:.2%} of values beyond; {self.step})")


@dataclasses.dataclass(frozen=True)
class RunError:
    """One run's final output against the reference: finite or not, mean and max absolute error."""

    label: str
    finite: bool
    nonfinite_share: float
    mean_abs: float
    max_abs: float
    first_nonfinite: str = ""  # component.module that first produced inf/NaN, when not finite

    def line(self) -> str:
        if not self.finite:
            where = f"; first non-finite at {self.first_nonfinite}" if self.first_nonfinite else ""
            return f"{self.label}: NOT finite ({self.nonfinite_share:.1%} of values inf/NaN{where})"
        return f"{self.label}: finite, error vs reference mean {self.mean_abs:.3g}, max {self.max_abs:.3g}"


@dataclasses.dataclass
class CalibrationResult:
    """What :func:`calibrate` measured and chose. ``to_yaml()`` is the override; ``table()`` the report."""

    model: str
    layout: str
    target: str
    reference: str
    islands: dict[str, list[str]]
    whole: list[str]
    evidence: dict[str, dict[str, list[Evidence]]]
    extra_bytes: int
    island_bytes: dict[str, dict[str, int]]
    component_bytes: dict[str, int]
    recipe_islands: dict[str, list[str]]
    recipe_fp32: list[str]
    errors: dict[str, RunError]
    ranges: dict[str, dict[str, float]]
    notes: list[str]
    bound: float
    timings: dict[str, float]
    components: list[str]
    # Whole float32 components whose own output leaves the half range: they hand it on in float32 (`output:`).
    wide: list[str] = dataclasses.field(default_factory=list)
    # Per component, the dtypes its recipe says it tolerates (``dtypes:``); a target outside them is a departure.
    tolerated: dict[str, list[str]] = dataclasses.field(default_factory=dict)

    @property
    def finite(self) -> bool:
        """Whether the half-precision run with the islands gave a finite output."""
        return self.errors["islands"].finite

    def whole_component_bytes(self) -> int:
        """Extra bytes of keeping every affected component whole in float32 instead (what islands avoid)."""
        return sum(self.component_bytes[c] for c in self.components if self.islands.get(c) or c in self.whole)

    def keep_fp32(self, component: str) -> list[str]:
        """The component's ``keep_fp32`` in the override: the recipe's islands and the measured ones, outermost."""
        return outermost([*self.recipe_islands.get(component, []), *self.islands.get(component, [])])

    def departs(self, component: str) -> str:
        """Why the override runs ``component`` in a dtype its recipe does not tolerate ('' when it does not): islands
        measured on one run keep fp16 finite there (the SDXL VAE's recipe tolerates bf16 and fp32 only), other inputs may
        overflow elsewhere, so the NaN guard stays on for it.
        """
        allowed = self.tolerated.get(component)
        if component in self.whole or not allowed or self.target in allowed:
            return ""
        return (f"departs from the recipe, which tolerates {', '.join(allowed)} only for {component}: these islands "
                f"kept {self.target} finite on the calibration run, other inputs may overflow elsewhere, so the NaN "
                f"guard stays on (a non-finite output is recomputed in a tolerated dtype); to follow the recipe, "
                f"leave {component} out of this file")

    def overrides(self) -> dict[str, Any]:
        """The override as a dict (what ``load_pipeline(..., overrides=...)`` takes)."""
        comps: dict[str, Any] = {}
        for c in self.components:
            if c in self.whole:
                comps[c] = {"dtype": "float32", **({"output": "float32"} if c in self.wide else {})}
            else:
                comps[c] = {"dtype": self.target, "keep_fp32": self.keep_fp32(c),
                            **({"nan_guard": True} if self.departs(c) else {})}
        return {"schema": 1, "components": comps}

    def to_yaml(self) -> str:
        """The override file: per component its dtype and ``keep_fp32``, each island with its measured numbers."""
        q = json.dumps  # a JSON string is a valid YAML scalar: no quoting rules to get wrong
        out = [f"# hf-precision calibrate: float32 islands measured on {self.model}",
               f"# layout {self.layout}, target {self.target}, reference {self.reference}; extra bytes "
               f"{format_bytes(self.extra_bytes)} (whole affected components in float32: {format_bytes(self.whole_component_bytes())})",
               f"# {self.errors['naive'].line()}", f"# {self.errors['islands'].line()}",
               "# use: hp.load_pipeline(folder, device, overrides='this.yaml') or hf-precision ... --overrides this.yaml",
               "schema: 1", "components:"]
        for c in self.components:
            out.append(f"  {c}:")
            if c in self.whole:
                ev = [e.line(self.target) for e in self.evidence.get(c, {}).get("", [])][:3]
                out.append("    dtype: float32")
                if c in self.wide:
                    out.append("    output: float32  # its output leaves the half range: handed on in float32")
                out.append(f"    why: {q('calibrate: no island inside fits the range: ' + '; '.join(ev))}")
                continue
            out.append(f"    dtype: {self.target}")
            departs = self.departs(c)
            if departs:
                out.append("    nan_guard: true")
            keep = self.keep_fp32(c)
            if not keep:
                out.append("    keep_fp32: []")
                if departs:
                    out.append(f"    why: {q('calibrate: ' + departs)}")
                continue
            out.append("    keep_fp32:")
            whys = []
            for island in keep:
                ev = self.evidence.get(c, {}).get(island)
                if ev:
                    text = f"{ev[0].line(self.target)}" + (f" (+{len(ev) - 1} more inside)" if len(ev) > 1 else "")
                    out.append(f"      - {q(island)}  # {text}; +{format_bytes(self.island_bytes.get(c, {}).get(island, 0))}")
                    whys.append(f"{island}: {text}")
                else:
                    out.append(f"      - {q(island)}  # from the shipped recipe")
            if whys or departs:
                out.append(f"    why: {q('; '.join(t for t in ('calibrate measured: ' + ' | '.join(whys) if whys else '', departs) if t))}")
        return "\n".join(out) + "\n"

    def write(self, path: str | os.PathLike[str]) -> Path:
        """Write :meth:`to_yaml` atomically (a temporary file in the same folder, then renamed)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.to_yaml())
            shared_mode(tmp)  # an override file people share, not a private one
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    def table(self) -> str:
        """A readable report: islands with their evidence and bytes, errors before and after, notes."""
        out = [f"calibrate {self.model}: layout {self.layout}, target {self.target}, reference {self.reference}"]
        out.append("max |activation| per component and phase (reference run):")
        for c, per in self.ranges.items():
            cells = ", ".join(f"{k} {v:.3g}" for k, v in per.items())
            out.append(f"  {c}: {cells}")
        out.append("islands:")
        if not any(self.islands.values()) and not self.whole:
            out.append("  none needed: every activation fits the range and the half run is finite")
        for c in self.components:
            if c in self.whole:
                out.append(f"  {c}: whole component float32 (+{format_bytes(self.component_bytes[c])})"
                           + (", output handed on in float32" if c in self.wide else ""))
            for island in self.islands.get(c, []):
                ev = self.evidence[c][island]
                out.append(f"  {c}.{island}: +{format_bytes(self.island_bytes.get(c, {}).get(island, 0))} "
                           f"(whole {c}: +{format_bytes(self.component_bytes[c])}); {ev[0].line(self.target)}"
                           + (f" (+{len(ev) - 1} more inside)" if len(ev) > 1 else ""))
        out.append(f"extra bytes: {format_bytes(self.extra_bytes)} ({self.extra_bytes} B); whole affected components in "
                   f"float32 instead: {format_bytes(self.whole_component_bytes())}")
        for key in ("naive", "islands"):
            out.append(self.errors[key].line())
        out += [f"note: {n}" for n in self.notes]
        out += [f"note: {c}: {self.departs(c)}" for c in self.components if self.departs(c)]
        out.append("timings: " + ", ".join(f"{k} {v:.2f}s" for k, v in self.timings.items()))
        return "\n".join(out)

    __str__ = table


# ------------------------------------------------------------------------------------------- runs against the reference


def compare(label: str, ref: Any, got: Any, first_bad: str = "") -> RunError:
    """A run's final output (``got``) against the reference run's: finite or not, mean and max absolute error."""
    import numpy as np

    finite = np.isfinite(got)
    diff = np.abs(np.where(finite, got, 0.0) - ref)[finite]
    return RunError(label, bool(finite.all()), float(1.0 - finite.mean()), float(diff.mean()) if diff.size else math.nan,
                    float(diff.max()) if diff.size else math.nan, first_bad)


def recipe_notes(islands: Mapping[str, list[str]], whole: list[str], recipe_islands: Mapping[str, list[str]],
                    recipe_fp32: list[str], stats: Mapping[tuple[str, str], Any], limit: float, target: str,
                    layout: Any) -> list[str]:
    """How the measured islands relate to what the shipped recipe keeps in float32 for this layout."""
    notes = []
    for comp, found in islands.items():
        for island in found:
            if comp in recipe_fp32:
                notes.append(f"{comp}.{island}: inside what the recipe keeps in float32 for {layout} (the whole {comp}); "
                             f"the override runs {comp} in {target} with this island instead")
            elif any(inside(island, [m]) or inside(m, [island]) for m in recipe_islands.get(comp, [])):
                notes.append(f"{comp}.{island}: overlaps the recipe's own islands {recipe_islands[comp]}")
            else:
                notes.append(f"{comp}.{island}: NOT kept by the shipped recipe: these weights need it where the "
                             f"released ones do not (the recipe's islands come from the released model)")
    for comp in whole:
        notes.append(f"{comp}: whole component float32" + (" (the recipe does the same)" if comp in recipe_fp32 else
                                                          " (the recipe runs it in half precision)"))
    for comp, kept in recipe_islands.items():
        for island in kept:
            peak = max((max(s.out_max, s.in_max) for (c, n), s in stats.items() if c == comp and inside(n, [island])),
                       default=None)
            if peak is not None and peak <= limit and not any(inside(i, [island]) for i in islands.get(comp, [])):
                notes.append(f"{comp}.{island}: kept by the recipe, not needed on this run (max |x| {peak:.3g} <= "
                             f"{limit:.6g}); it stays in the override, since other prompts and weights may need it")
    return notes


def moved(before: Mapping[str, list[str]], now: Mapping[str, list[str]]) -> str:
    """The islands of ``now`` that ``before`` lacks, as ``component.island`` (for a note)."""
    return ", ".join(f"{c}.{i}" for c, v in now.items() for i in v if i not in before.get(c, [])) or "none"
