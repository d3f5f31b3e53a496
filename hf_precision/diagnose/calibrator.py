"""calibrate: measure where a pipeline leaves the half dtype's range and write the float32 islands that fix it.

Every tool keeps its fp32 islands by hand (diffusers ``_keep_in_fp32_modules``, ComfyUI's fp16 clamps, A1111's
``--no-half-vae``); a fine-tune or a merge that overflows somewhere else gives black images. This module measures:

1. a reference run (float32, or bfloat16 for ranges only) with a light forward hook on every module that has
   parameters records, per module, the max ``|input|`` and ``|output|``, the denoising step of that maximum and the
   share of values beyond the target dtype's finite range;
2. a module whose input or output leaves the range needs an island around it; an island's output is cast back to
   the half dtype (``runtime.hooks.IslandHook``), so the island is the innermost module (itself or an ancestor)
   whose own input and output fit. Sibling islands collapse into their parent when that adds few bytes;
3. the half-precision run is repeated with the islands (NaN guard off): while it is not finite, the first module
   that produced a non-finite value (post-hook order) gets an island by the same rule;
4. the islands are written as an override file (``keep_fp32`` per component, full-match names as recipes use,
   see ``hf_precision.recipe.patterns``) with the measured numbers as comments and ``why``.

See docs/calibrate.md for the method, its cost and a worked example.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import math
import os
import tempfile
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from .. import dtypes as dt
from ..errors import RecipeError
from ..units import format_bytes
from ..runtime.memory import available_bytes
from ..recipe.patterns import inside, outermost, resolve_islands

__all__ = ["calibrate", "CalibrationResult", "Evidence", "RunError", "Recorder"]

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
        """Why the override runs ``component`` in a dtype its recipe does not tolerate ('' when it does not).

        The SDXL VAE's recipe tolerates bf16 and fp32 only: islands measured on one run keep fp16 finite there, other
        inputs may overflow elsewhere, so the override keeps the NaN guard on for it and says so.
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


# ------------------------------------------------------------------------------------------- recording


@dataclasses.dataclass
class _Stat:
    out_max: float = 0.0
    out_step: str = ""
    out_share: float = 0.0
    in_max: float = 0.0
    in_step: str = ""
    in_share: float = 0.0
    calls: int = 0


def _tensors(tree: Any, depth: int = 0):
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point() and tree.numel():
            yield tree
    elif depth < 4 and isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x, depth + 1)
    elif depth < 4 and isinstance(tree, Mapping):  # dicts and diffusers/transformers output classes
        for x in tree.values():
            yield from _tensors(x, depth + 1)


def _strided(t: Any, n: int = 512) -> Any:
    """At most ``n`` values of a tensor, evenly strided, as float32 on the CPU: what two runs' outputs are compared by."""
    flat = t.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // n)][:n].float().cpu()


def _relative(got: Any, ref: Any) -> float | None:
    """Mean |got - ref| over mean |ref|, or None when the two samples cannot be compared."""
    if got is None or ref is None or got.shape != ref.shape:
        return None
    scale = float(ref.abs().mean())
    diff = float((got - ref).abs().mean())
    if not math.isfinite(diff) or scale == 0.0:
        return None
    return diff / scale


class Recorder:
    """Forward hooks on every module with parameters: max |input| and |output| per module, per step, per component.

    One ``aminmax`` pass per new tensor (an input that is the output just measured is not read again); the share
    beyond ``limit`` is counted only when the maximum exceeds it. ``first_bad`` is the first call (in post-hook
    order: inner modules finish first) whose output is not finite.
    """

    def __init__(self, components: Mapping[str, Any], limit: float, phase: Callable[[str], str],
                 reference: bool = False, samples: dict[tuple[str, str], list[Any]] | None = None,
                 compare: Mapping[tuple[str, str], list[Any]] | None = None):
        self.limit, self.phase, self.reference = limit, phase, reference
        # samples: filled with a strided sample of every call's input and output (the reference run); compare: the
        # reference's samples, against which this run's relative errors per module are summed into `errors`.
        self.samples, self.compare = samples, compare
        self.errors: dict[tuple[str, str], list[float]] = {}
        self._calls: dict[tuple[str, str], int] = {}
        self.stats: dict[tuple[str, str], _Stat] = {}
        self.ranges: dict[str, dict[str, float]] = {}
        self.first_bad: tuple[str, str, bool] | None = None
        self.handles: list[Any] = []
        self._seen: dict[int, tuple[Any, float]] = {}
        for comp, root in components.items():
            for name, module in root.named_modules():
                if next(module.parameters(), None) is None:
                    continue
                self.handles.append(module.register_forward_hook(self._hook(comp, name), with_kwargs=True,
                                                                 always_call=True))

    def _measure(self, tree: Any, fills: bool = False) -> tuple[float, float]:
        biggest, tensors = 0.0, []
        for t in _tensors(tree):
            seen = self._seen.get(id(t))
            if seen is not None and seen[0]() is t:
                v = seen[1]  # a module's input is usually the output its producer just had measured
            else:
                low, high = torch.aminmax(t.detach())  # one pass, no |x| copy
                v = max(-float(low), float(high))
                v = math.inf if v != v else v  # NaN: as bad as inf
                if len(self._seen) > 4096:
                    self._seen.clear()
                self._seen[id(t)] = (weakref.ref(t), v)
            if fills and v >= torch.finfo(t.dtype).max:
                # An input at the dtype's extreme in the reference run is a mask's fill value, not an activation:
                # transformers and diffusers fill additive attention masks with torch.finfo(dtype).min or -inf, and
                # the half run builds that mask in its own dtype. Measure the other values.
                t = t.detach()[t.detach().abs() < torch.finfo(t.dtype).max]
                if not t.numel():
                    continue
                v = float(t.abs().max())
            tensors.append(t)
            biggest = max(biggest, v)
        share = 0.0
        if biggest > self.limit:
            beyond = sum(int((~(t.detach().abs() <= self.limit)).sum()) for t in tensors)
            share = beyond / max(1, sum(t.numel() for t in tensors))
        return biggest, share

    def _hook(self, comp: str, name: str) -> Callable[..., None]:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if out is None:
                return None
            o, o_share = self._measure(out)
            # Masks are not activations (a boolean or additive mask of any run: `attention_mask`, `encoder_attention_mask`).
            i, i_share = self._measure((args, {k: v for k, v in kwargs.items() if "mask" not in k}), self.reference)
            step = self.phase(comp)
            s = self.stats.setdefault((comp, name), _Stat())
            s.calls += 1
            if o > s.out_max or not s.out_step:
                s.out_max, s.out_step, s.out_share = o, step, o_share
            if i > s.in_max or not s.in_step:
                s.in_max, s.in_step, s.in_share = i, step, i_share
            per = self.ranges.setdefault(comp, {})
            per[step] = max(per.get(step, 0.0), o)
            if self.first_bad is None and not math.isfinite(o):
                self.first_bad = (comp, name, not math.isfinite(i))
            if self.samples is not None or self.compare is not None:
                self._sample((comp, name), args, kwargs, out)
            return None
        return post

    def _sample(self, key: tuple[str, str], args: Any, kwargs: dict[str, Any], out: Any) -> None:
        # The output, and up to three inputs (a cross-attention reads hidden states and the text encoder's output):
        # a module's own share of the error is its output's relative error over the worst of its inputs'.
        ins = [_strided(t) for t, _ in zip(_tensors((args, {k: v for k, v in kwargs.items() if "mask" not in k})), range(3))]
        first_out = next(_tensors(out), None)
        taken = (None if first_out is None else _strided(first_out), ins)
        k = self._calls[key] = self._calls.get(key, 0) + 1
        if self.samples is not None:
            self.samples.setdefault(key, []).append(taken)
        ref = (self.compare or {}).get(key)
        if ref is None or len(ref) < k or not ins:
            return
        out_rel = _relative(taken[0], ref[k - 1][0])
        in_rel = [_relative(a, b) for a, b in zip(ins, ref[k - 1][1])]
        if out_rel is not None and in_rel and None not in in_rel:
            acc = self.errors.setdefault(key, [0.0, 0.0, 0])
            acc[0], acc[1], acc[2] = acc[0] + out_rel, acc[1] + max(in_rel), acc[2] + 1

    def remove(self) -> None:
        self._seen.clear()
        for h in self.handles:
            h.remove()
        self.handles.clear()


# ------------------------------------------------------------------------------------------- the pipeline


class _Steps:
    """Which phase a component call belongs to: 'step k' inside the denoising loop, else before/after it."""

    def __init__(self, denoiser: str | None):
        self.denoiser, self.step, self.calls, self.callback = denoiser, 0, 0, False
        self.bar: Any = None
        self.current = ""

    def on_step_end(self, pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.step = i + 1
        if self.bar is not None:
            self.bar.update(1)
        return {}

    def pre(self, *_: Any, **__: Any) -> None:
        if not self.callback:
            self.step = self.calls
            if self.bar is not None and self.calls:
                self.bar.update(1)
        self.calls += 1

    def phase(self, comp: str) -> str:
        if comp != self.current and self.bar is not None:
            self.current = comp
            self.bar.set_postfix_str(comp, refresh=True)  # the bar shows the component that is running
        if comp == self.denoiser:
            return f"step {self.step}"
        if not self.calls:
            return "before denoising"
        return "after denoising"


def _output_array(out: Any) -> Any:
    import numpy as np
    import torch

    value = None
    for attr in ("images", "frames", "videos", "audios"):
        value = getattr(out, attr, None)
        if value is not None:
            break
    if value is None and hasattr(out, "to_tuple"):  # other diffusers outputs (prior embeddings ...): the first field
        value = next((v for v in out.to_tuple() if v is not None), None)
    if value is None:
        value = out[0] if isinstance(out, (tuple, list)) else out
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy().astype(np.float64)
    if isinstance(value, list):
        return np.stack([np.asarray(v, dtype=np.float64) for v in value])
    return np.asarray(value, dtype=np.float64)


def _compare(label: str, ref: Any, got: Any, first_bad: str = "") -> RunError:
    import numpy as np

    finite = np.isfinite(got)
    diff = np.abs(np.where(finite, got, 0.0) - ref)[finite]
    return RunError(label, bool(finite.all()), float(1.0 - finite.mean()), float(diff.mean()) if diff.size else math.nan,
                    float(diff.max()) if diff.size else math.nan, first_bad)


def _default_call(pipe: Any, prompt: str | None, image: Any, steps: int | None,
                  size: tuple[int | None, int | None] = (None, None)) -> dict[str, Any]:
    params = inspect.signature(pipe.__call__).parameters
    kwargs: dict[str, Any] = {}
    if "prompt" in params and image is None or prompt is not None:
        kwargs["prompt"] = prompt or "a photo of an astronaut riding a horse"
    if image is not None:
        from PIL import Image

        kwargs["image"] = Image.open(image).convert("RGB") if isinstance(image, (str, os.PathLike)) else image
    elif "image" in params and params["image"].default is inspect.Parameter.empty:
        raise RecipeError(f"calibrate: {type(pipe).__name__} needs an input image: pass image=... (CLI: --image FILE)")
    kwargs["num_inference_steps"] = steps or 4
    for key, value in zip(("height", "width"), size):
        if value and key in params:
            kwargs[key] = value
    return kwargs


# ------------------------------------------------------------------------------------------- choosing islands


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


class _Chooser:
    """The island rule over one component's reference statistics."""

    def __init__(self, comp: str, root: Any, stats: Mapping[tuple[str, str], _Stat], limit: float, delta: int):
        self.comp, self.root, self.limit, self.delta = comp, root, limit, delta
        self.stats = {name: s for (c, name), s in stats.items() if c == comp}
        self._bytes: dict[str, int] = {}
        # Parameters beyond the target's range cannot even be stored in it (a fine-tune's outlier weight): the module
        # that owns them needs an island, whatever its activations do in the reference run.
        self.heavy: dict[str, tuple[float, float]] = {}
        for name, m in root.named_modules():
            own = [t for t in m._parameters.values() if t is not None and t.is_floating_point() and t.numel()]
            if not own:
                continue
            peak = max(float(t.detach().abs().max()) for t in own)
            if peak > limit:
                beyond = sum(int((t.detach().abs() > limit).sum()) for t in own) / sum(t.numel() for t in own)
                self.heavy[name] = (peak, beyond)

    def fits(self, name: str) -> bool:
        s = self.stats.get(name)
        return s is not None and s.out_max <= self.limit and s.in_max <= self.limit

    def bytes(self, name: str) -> int:
        if name not in self._bytes:
            m = self.root.get_submodule(name) if name else self.root
            self._bytes[name] = self.delta * sum(t.numel() for t in (*m.parameters(), *m.buffers()) if t.is_floating_point())
        return self._bytes[name]

    def island_for(self, name: str, also_bad: Callable[[str], bool] = lambda _: False) -> str:
        """The innermost module, ``name`` or an ancestor, whose input and output fit the range ('' = the component)."""
        while name and (not self.fits(name) or also_bad(name)):
            name = _parent(name)
        return name

    def flagged(self) -> list[str]:
        heavy = [n for n in self.heavy if n in self.stats]  # a module that does not run in this call needs nothing
        return [*heavy, *(n for n, s in self.stats.items() if s.out_max > self.limit or s.in_max > self.limit)]

    def collapse(self, islands: list[str], slack: float) -> list[str]:
        """Replace sibling islands by their parent when it fits the range and adds at most ``slack`` more bytes."""
        islands = outermost(islands)
        changed = True
        while changed:
            changed = False
            groups: dict[str, list[str]] = {}
            for i in islands:
                if i:
                    groups.setdefault(_parent(i), []).append(i)
            for parent, kids in groups.items():
                if len(kids) < 2 or not parent or not self.fits(parent):
                    continue
                if self.bytes(parent) <= (1 + slack) * sum(self.bytes(k) for k in kids):
                    islands = outermost([parent if i in kids else i for i in islands])
                    changed = True
                    break
        return islands


def _evidence(comp: str, island: str, stats: Mapping[tuple[str, str], _Stat], limit: float,
              heavy: Mapping[str, tuple[float, float]] = {}) -> list[Evidence]:
    out = [Evidence(comp, island, name, "weights", peak, "", share) for name, (peak, share) in heavy.items()
           if (comp, name) in stats and (inside(name, [island]) if island else True)]
    for (c, name), s in stats.items():
        if c != comp or not (inside(name, [island]) if island else True):
            continue
        if s.out_max > limit:
            out.append(Evidence(comp, island, name, "output", s.out_max, s.out_step, s.out_share))
        elif s.in_max > limit:
            out.append(Evidence(comp, island, name, "input", s.in_max, s.in_step, s.in_share))
    return sorted(out, key=lambda e: -e.max_abs)


# ------------------------------------------------------------------------------------------- memory


def _folder_numel(folder: Path) -> dict[str, int]:
    """Component -> number of floating values in its default safetensors files (read from the headers only)."""
    out: dict[str, int] = {}
    for comp in sorted(p for p in folder.iterdir() if p.is_dir()):
        for f in comp.glob("*.safetensors"):
            if ".fp16." in f.name or ".bf16." in f.name:
                continue
            with open(f, "rb") as fh:
                header = json.loads(fh.read(int.from_bytes(fh.read(8), "little")))
            for key, info in header.items():
                if key != "__metadata__" and str(info.get("dtype", "")).startswith(("F", "BF")):
                    out[comp.name] = out.get(comp.name, 0) + math.prod(info["shape"])
    return out


def _memory_plan(numel: Mapping[str, int], run_on: str, reference: str | None, target: str,
                 resident: int = 0, max_memory: int | None = None) -> tuple[str, bool]:
    """(reference dtype, offload) that fit this machine, or a RecipeError that says what to do.

    ``resident``: bytes of the pipeline already in memory on ``run_on`` (they are not counted again).
    ``max_memory``: a budget for ``run_on`` (bytes); it counts everything the runs hold there, and with it model
    offload is chosen on any device, the CPU included (there accelerate's hooks keep one component "on" the CPU
    at a time: the same code path, without a memory gain).
    """
    available = available_bytes(run_on)
    if max_memory is not None:
        available, resident = (max_memory if available is None else min(available, max_memory)), 0
    total, largest = sum(numel.values()), max(numel.values(), default=0)
    # The reference weights stay in memory while a half copy of the component runs: 1 + half/reference per value.
    need = lambda dtype, n: max(0, int(n * (dt.itemsize(dtype) + dt.itemsize(target))) - resident)
    choices = [reference] if reference else ["float32", "bfloat16"]
    if available is None:
        return choices[0], False
    accelerator = not run_on.startswith("cpu") or max_memory is not None
    for ref in choices:
        if need(ref, total) <= available:
            return ref, False
        if accelerator and need(ref, largest) <= available:
            return ref, True  # enable_model_cpu_offload: one component on the accelerator at a time
    budget = " within max_memory" if max_memory is not None else ""
    tried = " nor with model offload (enable_model_cpu_offload: one component at a time)" if accelerator else ""
    raise RecipeError(
        f"calibrate: the {choices[0]} reference run needs about {format_bytes(need(choices[0], total))} "
        f"(largest component {format_bytes(need(choices[0], largest))}); {run_on} has {format_bytes(available)} available{budget}, "
        f"so it fits neither whole{tried}. The islands do not depend on the machine that measures them: run "
        f"calibrate where the model fits (run_on='cuda', CLI --device cuda), with a larger budget (max_memory=..., "
        "CLI --max-memory), or with reference='bfloat16' (CLI --reference bfloat16; ranges only, the error vs "
        "reference is then against bf16), or on a smaller input (fewer --steps do not lower memory)")


# ------------------------------------------------------------------------------------------- calibrate


def calibrate(pipe_or_folder: Any, device: Any = None, call: Mapping[str, Any] | Callable[[Any], Any] | None = None, *,
              target: str | None = None, steps: int | None = None, bound: float = 0.05, progress: bool = True,
              reference: str | None = None, run_on: str | None = None, recipe: str | None = None, seed: int = 0,
              rounds: int = 6, slack: float = 0.25, prompt: str | None = None, image: Any = None,
              size: tuple[int | None, int | None] = (None, None), max_memory: int | None = None) -> CalibrationResult:
    """Find the float32 islands a pipeline needs in half precision by measuring it, and verify them.

    Args:
        pipe_or_folder: a diffusers pipeline (left as it was found afterwards) or a pipeline folder.
        device: the layout to calibrate: a preset (``"t4"``), a description or a present device; its recipe gives
            the target half dtype and the islands already kept. The runs happen on ``run_on``.
        call (*optional*): call kwargs (a fresh seeded ``generator`` is added per run) or ``fn(pipe) -> output``.
            Default: ``prompt``/``image`` with ``steps`` steps.
        target (*optional*): ``"float16"`` or ``"bfloat16"``; default: the layout's denoiser half dtype, else float16.
        steps (*optional*): ``num_inference_steps`` of the runs.
        bound (*optional*): the mean absolute error of the final output (images in [0, 1]) that the islands
            should stay within; reported as met or not.
        progress (*optional*): show a tqdm bar over runs and steps.
        reference (*optional*): ``"float32"`` or ``"bfloat16"`` (ranges only); default: float32 if it fits memory.
        run_on (*optional*): where the runs happen; default the best present device.
        recipe, seed, rounds, slack (*optional*): the recipe to start from; the seed of every run; how many
            verification runs may add islands; how many more bytes (fraction) a parent may cost to replace siblings.
        prompt, image, size (*optional*): the default call's prompt, input image and (height, width).
        max_memory (*optional*): a memory budget on ``run_on`` in bytes. When the reference run does not fit it
            (or the device's free memory) whole, it runs with ``enable_model_cpu_offload`` (one component on the
            device at a time); when even the largest component does not fit, calibrate refuses and says what to do.

    Returns:
        `CalibrationResult`: ``islands`` {component: [module names]}, ``evidence``, ``extra_bytes``, ``errors``
        (``"naive"`` all-half and ``"islands"``), ``to_yaml()``, ``write(path)`` and ``table()``.

    Raises:
        RecipeError: a target the layout cannot compute, a model that does not fit this machine (with what to do),
            a reference run that is itself not finite.

    Example:
        >>> from hf_precision.testing.calibration import make_wan, plant_time_embedding, wan_call_kwargs
        >>> pipe = make_wan()
        >>> planted = plant_time_embedding(pipe.transformer)
        >>> result = calibrate(pipe, "t4", wan_call_kwargs(), progress=False)
        >>> result.islands["transformer"], result.errors["naive"].finite, result.finite
        (['condition_embedder.time_embedder'], False, True)
    """
    import torch

    from ..recipe.devices import device_caps, device_profile
    from ..recipe.resolution import resolve
    from ..runtime.apply import apply_recipe, applied
    from ..runtime.source import models_of_pipeline

    clock = {"start": time.perf_counter()}
    run_on = str(run_on or device_profile(None).torch_device())
    layout = device
    caps = device_caps(layout if layout is not None else run_on)
    model = str(pipe_or_folder) if isinstance(pipe_or_folder, (str, os.PathLike)) else type(pipe_or_folder).__name__

    if isinstance(pipe_or_folder, (str, os.PathLike)):
        from ..runtime.load import load_pipeline
        from ..runtime.source import locate

        where, _, folder = locate(pipe_or_folder)
        numel = _folder_numel(folder) if folder is not None else {}
        ref_dtype, offload = _memory_plan(numel, run_on, reference, target or "float16", max_memory=max_memory)
        pipe = load_pipeline(where, "cpu" if offload else run_on, recipe=recipe, dtype=dt.to_torch(ref_dtype))
        owned = True
    else:
        pipe, owned = pipe_or_folder, False
        models = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
        numel = {n: sum(t.numel() for t in m.parameters() if t.is_floating_point()) for n, m in models.items()}
        resident = sum(t.numel() * t.element_size() for m in models.values() for t in m.parameters()
                       if t.is_floating_point() and t.device.type == torch.device(run_on).type)
        ref_dtype, offload = _memory_plan(numel, run_on, reference, target or "float16", resident, max_memory)
    clock["load"] = time.perf_counter() - clock["start"]
    comps = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    placed = {n: next((t.device for t in m.parameters()), None) for n, m in comps.items()}
    ours = offload and not any(hasattr(m, "_hf_hook") for m in comps.values())
    if offload:
        pipe.enable_model_cpu_offload(device=run_on)
    # A pipeline already offloaded (accelerate hooks) stays where it is: the hooks move each component when it runs.
    offload = offload or any(hasattr(m, "_hf_hook") for m in comps.values())
    previous = applied(pipe)
    configs = {n: (dict(m.config) if isinstance(getattr(m, "config", None), Mapping) else
                   (m.config.to_dict() if hasattr(getattr(m, "config", None), "to_dict") else {})) for n, m in comps.items()}
    plan = resolve(recipe, pipeline_class=type(pipe).__name__, devices=None if offload else run_on, layout=layout,
                   configs=configs, components=list(comps), models=models_of_pipeline(pipe))
    names = [p.name for p in plan.plans if p.name in comps]
    if target is None:
        denoiser = plan[plan.denoiser] if plan.denoiser in plan else None
        target = denoiser.compute if denoiser is not None and denoiser.compute in dt.HALF else next(
            (d for d in ("float16", "bfloat16") if d in caps.compute), None)
    target = dt.canonical(target) if target else None
    if target not in dt.HALF or target not in caps.compute:
        raise RecipeError(f"calibrate: target {target!r} cannot be computed on {caps.profile.label()} (it computes "
                          f"{', '.join(caps.compute)}); pass target='float16' or 'bfloat16' that the layout computes, "
                          "or another layout (device='t4', 'a100')")
    limit = HALF_MAX[target]
    delta = 4 - dt.itemsize(target)
    recipe_islands = {p.name: list(p.keep_fp32) for p in plan.plans if p.name in comps and p.compute in dt.HALF}
    # The recipe's islands as module names (its keep_fp32 are globs): what the measured islands are compared with.
    recipe_names = {n: resolve_islands(n, v, [m for m, _ in comps[n].named_modules() if m], owner=type(comps[n]).__name__,
                                       strict=False) for n, v in recipe_islands.items()}
    recipe_fp32 = [p.name for p in plan.plans if p.name in comps and p.compute == "float32"]

    # What each run changes, so that the pipeline can be handed back as it came.
    saved = [(t_owner, kind, leaf, tensor.data) for m in comps.values() for t_owner in m.modules()
             for kind in ("_parameters", "_buffers") for leaf, tensor in getattr(t_owner, kind).items() if tensor is not None]
    upcast = {n: m.config.force_upcast for n, m in comps.items() if hasattr(getattr(m, "config", None), "force_upcast")}

    def restore() -> None:
        for owner, kind, leaf, data in saved:
            current = getattr(owner, kind).get(leaf)
            if current is not None and current.data is not data:
                current.data = data
        for n, value in upcast.items():
            comps[n].register_to_config(force_upcast=value)

    steps_of = _Steps(plan.denoiser if plan.denoiser in comps else None)
    kwargs: dict[str, Any] | None = None
    if not callable(call):
        kwargs = dict(call) if call is not None else _default_call(pipe, prompt, image, steps, size)
        if steps is not None:
            kwargs["num_inference_steps"] = steps
        params = inspect.signature(pipe.__call__).parameters
        if "output_type" in params:
            kwargs.setdefault("output_type", "np")
        if "callback_on_step_end" in params and "callback_on_step_end" not in kwargs:
            kwargs["callback_on_step_end"] = steps_of.on_step_end
            steps_of.callback = True
    n_steps = int((kwargs or {}).get("num_inference_steps", 1) or 1)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=2 * n_steps, desc="calibrate", unit="step", leave=True)
        steps_of.bar = bar
    bar_config = dict(getattr(pipe, "_progress_bar_config", {}) or {})
    if hasattr(pipe, "set_progress_bar_config"):
        pipe.set_progress_bar_config(**{**bar_config, "disable": True})  # one bar: ours, over runs and steps
    pre_handle = comps[steps_of.denoiser].register_forward_pre_hook(steps_of.pre) if steps_of.denoiser else None

    samples: dict[tuple[str, str], list[Any]] = {}

    def run(label: str, layer: dict[str, Any], run_layout: Any, reference: bool = False,
            compare: bool = False) -> tuple[Any, Recorder]:
        if bar is not None:
            bar.set_description(f"calibrate: {label}")
        record = apply_recipe(pipe, recipe, device=None if offload else run_on, overrides=[layer], layout=run_layout)
        rec = Recorder(comps, limit, steps_of.phase, reference, samples if reference else None,
                       samples if compare else None)
        steps_of.step, steps_of.calls = 0, 0
        try:
            torch.manual_seed(seed)
            with torch.no_grad():
                if kwargs is None:
                    out = call(pipe)  # type: ignore[misc, operator]
                else:
                    args = dict(kwargs)
                    gen = args.get("generator")
                    where = gen.device if isinstance(gen, torch.Generator) else "cpu"
                    args["generator"] = torch.Generator(where).manual_seed(seed)  # every run: the same noise
                    out = pipe(**args)
            return _output_array(out), rec
        finally:
            rec.remove()
            record.remove()
            restore()

    def layer(dtype: str, islands: Mapping[str, list[str]], whole: list[str] = (), wide: list[str] = ()) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for n in names:  # storage = dtype: no layerwise casting, which apply cannot take back between runs
            d = "float32" if n in whole else dtype
            out[n] = {"dtype": d, "storage": d, "keep_fp32": list(islands.get(n, [])), "nan_guard": False}
            if n in wide:
                out[n]["output"] = "float32"
        return out

    notes: list[str] = []
    try:
        ref_out, ref = run(f"reference {ref_dtype}", layer(ref_dtype, {}), None, reference=True)
        floor = torch.finfo(dt.to_torch(target)).eps / 2  # the half dtype's own rounding: unit roundoff
        clock["reference"] = time.perf_counter() - clock["start"] - clock["load"]
        if not _compare("reference", ref_out, ref_out).finite:
            bad = ref.first_bad
            raise RecipeError(f"calibrate: the {ref_dtype} reference run of {model} is itself not finite"
                              + (f" (first at {bad[0]}.{bad[1]})" if bad else "")
                              + "; no island can fix that: check the weights and the call (prompt, image, steps)")
        mark = time.perf_counter()
        try:
            naive_out, naive = run(f"all {target}", layer(target, {}), layout)
            errors = {"naive": _compare(f"all {target} (naive)", ref_out, naive_out, _where(naive.first_bad))}
        except Exception as err:  # the all-half run may raise (a dtype mismatch): that is a result, not a failure
            errors = {"naive": RunError(f"all {target} (naive)", False, 1.0, math.nan, math.nan,
                                        f"raised {type(err).__name__}: {str(err)[:160]}")}
        clock["naive"] = time.perf_counter() - mark

        choosers = {n: _Chooser(n, comps[n], ref.stats, limit, delta) for n in names}
        islands: dict[str, list[str]] = {}
        whole: list[str] = []
        wide: list[str] = []
        evidence: dict[str, dict[str, list[Evidence]]] = {}
        for n in names:
            ch = choosers[n]
            chosen = [ch.island_for(m) for m in ch.flagged()]
            if "" in chosen:
                whole.append(n)
            else:
                islands[n] = ch.collapse(chosen, slack)
        mark = time.perf_counter()
        after = None
        base: tuple[RunError, dict[str, list[str]], list[str], dict[str, dict[str, list[Evidence]]]] | None = None
        last: tuple[str, str, float] | None = None  # the island the error search added last, and the error before it
        for attempt in range(rounds + 1):
            merged = {n: outermost([*recipe_islands.get(n, []), *islands.get(n, [])]) for n in names}
            if bar is not None:
                bar.total += n_steps
                bar.refresh()
            got, half = run(f"{target} + islands" + (f" (round {attempt + 1})" if attempt else ""),
                            layer(target, merged, whole, wide), layout, compare=True)
            after = _compare(f"{target} + islands", ref_out, got, _where(half.first_bad))
            if after.finite and base is None:
                base = (after, {n: list(v) for n, v in islands.items()}, list(whole),
                        {n: {i: list(e) for i, e in per.items()} for n, per in evidence.items()})
            if attempt == rounds or (after.finite and after.mean_abs <= bound):
                break
            if after.finite:
                # Finite, but further from the reference than `bound`: find where the error grows, island it.
                added = _localise(half, choosers, islands, merged, whole, evidence, floor, slack, last, after)
                if added is None:
                    break
                last = (*added, after.mean_abs)
                continue
            if half.first_bad is None:
                break
            comp, name, input_bad = half.first_bad
            ch = choosers[comp] if comp in choosers else None
            if ch is not None and comp in whole and comp not in wide:
                # Everything in the component computes in float32: what went inf is its output, cast to the half dtype
                # on the way out. Hand it on in float32 (the pipeline's latents follow the denoiser's output dtype).
                wide.append(comp)
                evidence.setdefault(comp, {}).setdefault("", []).append(Evidence(
                    comp, "", name or "(output)", "half run", math.inf, half.stats[(comp, name)].out_step, 1.0))
                continue
            if ch is None or comp in whole:
                notes.append(f"{comp}{'.' + name if name else ''} is not finite although {comp} is float32: the "
                             "overflow is outside the modules calibrate can island (pipeline code between components)")
                break
            half_bad = {nm for (c, nm), s in half.stats.items() if c == comp and not math.isfinite(s.in_max)}
            start = _parent(name) if input_bad else name
            island = ch.island_for(start, lambda m: m in half_bad)
            grown = [i for i in islands.get(comp, []) if inside(island, [i])]
            if grown and island:
                # An island's own output overflowed when cast back to the half dtype: take the next level up.
                island = ch.island_for(_parent(grown[0]))
            if island == "":
                whole.append(comp)
                islands.pop(comp, None)
                step = half.stats[(comp, name)].out_step
                evidence.setdefault(comp, {})[""] = [Evidence(comp, "", name, "half run", math.inf, step, 1.0)]
            else:
                islands[comp] = ch.collapse([*islands.get(comp, []), island], slack)
                evidence.setdefault(comp, {}).setdefault(island, []).append(
                    Evidence(comp, island, name, "half run", math.inf, half.stats[(comp, name)].out_step, 1.0))
        if base is not None and after.finite and after.mean_abs > bound and after.mean_abs > 0.7 * base[0].mean_abs \
                and base[1] != islands:
            notes.append(f"the islands the error search added ({_moved(base[1], islands)}) brought the mean error only "
                         f"from {base[0].mean_abs:.3g} to {after.mean_abs:.3g}: not kept")
            after, islands, whole, evidence = base[0], base[1], base[2], base[3]
        clock["verify"] = time.perf_counter() - mark
    finally:
        if pre_handle is not None:
            pre_handle.remove()
        if bar is not None:
            bar.close()
        if hasattr(pipe, "set_progress_bar_config"):
            pipe._progress_bar_config = bar_config
        restore()
        if ours and not owned:  # the caller's pipeline goes back without our offload hooks, where it was
            pipe.remove_all_hooks()
            for n, where in placed.items():
                if where is not None:
                    comps[n].to(where)
        if previous is not None and not owned:
            apply_recipe(pipe, previous.recipe)

    assert after is not None
    errors["islands"] = after
    for n in names:
        for island in islands.get(n, []):
            found = _evidence(n, island, ref.stats, limit, choosers[n].heavy)
            evidence.setdefault(n, {})[island] = found + [e for e in evidence.get(n, {}).get(island, []) if e.where in ("half run", "error")]
        if n in whole:
            measured = [e for e in evidence.get(n, {}).get("", []) if e.where == "half run"]
            evidence.setdefault(n, {})[""] = _evidence(n, "", ref.stats, limit, choosers[n].heavy) + measured
    islands = {n: v for n, v in islands.items() if v}
    component_bytes = {n: choosers[n].bytes("") for n in names}

    def net(n: str, i: str) -> int:  # what an island adds to what the recipe's own islands keep in float32
        if inside(i, recipe_names.get(n, [])):
            return 0
        return choosers[n].bytes(i) - sum(choosers[n].bytes(r) for r in recipe_names.get(n, []) if inside(r, [i]))

    island_bytes = {n: {i: net(n, i) for i in v} for n, v in islands.items()}
    extra = sum(b for per in island_bytes.values() for b in per.values())
    extra += sum(component_bytes[n] for n in whole)
    notes += _compare_recipe(islands, whole, recipe_names, recipe_fp32, ref.stats, limit, target, layout or run_on)
    if after.finite and after.mean_abs > bound:
        notes.append(f"the half run with the islands is finite but its mean error {after.mean_abs:.3g} exceeds the bound "
                     f"{bound:g}, and no single module's error stands out (per module, output error over input error): "
                     "rounding spread over many modules, not an overflow; compare it with the naive run's error, or "
                     "keep the component that matters in float32")
    if offload:
        notes.append(f"runs with model offload (accelerate hooks, enable_model_cpu_offload on {run_on}): one component "
                     "on the device at a time")
    if ref_dtype != "float32":
        notes.append(f"reference run in {ref_dtype}: the ranges are exact, the errors are measured against {ref_dtype}")
    clock.pop("start")
    return CalibrationResult(
        model=model, layout=str(layout if layout is not None else run_on), target=target, reference=ref_dtype,
        islands=islands, whole=whole, evidence=evidence, extra_bytes=extra, island_bytes=island_bytes,
        component_bytes=component_bytes, recipe_islands={n: v for n, v in recipe_islands.items() if n in names},
        recipe_fp32=recipe_fp32, errors=errors, ranges=ref.ranges, notes=notes, bound=bound, timings=clock,
        components=names, wide=wide, tolerated={p.name: list(p.dtypes) for p in plan.plans if p.name in names})


def _moved(before: Mapping[str, list[str]], now: Mapping[str, list[str]]) -> str:
    return ", ".join(f"{c}.{i}" for c, v in now.items() for i in v if i not in before.get(c, [])) or "none"


def _localise(half: Recorder, choosers: Mapping[str, _Chooser], islands: dict[str, list[str]],
              merged: Mapping[str, list[str]], whole: list[str], evidence: dict[str, dict[str, list[Evidence]]],
              floor: float, slack: float, last: tuple[str, str, float] | None,
              after: RunError) -> tuple[str, str] | None:
    """Add one island where a finite half run's error vs the reference grows most: (component, island), or None.

    Per module, the relative error of its output (half run against the reference, on strided samples of every
    call) over the relative error of its input, at least the half dtype's unit roundoff: a module that rounds
    like any other has about 1, one that loses what its input held (an underflow, a large offset that swallows
    a small signal) far more. When the island added last did not lower the error (its input already carried the
    loss), it grows one level instead: the module that produced that input is then inside it.
    """
    if last is not None and after.mean_abs > 0.7 * last[2]:
        comp, island, _ = last
        parent = choosers[comp].island_for(_parent(island))
        ev = evidence.get(comp, {}).pop(island, [])
        if not parent:
            whole.append(comp)
            islands.pop(comp, None)
            evidence.setdefault(comp, {})[""] = ev
            return comp, ""
        islands[comp] = choosers[comp].collapse([parent if i == island else i for i in islands.get(comp, [])], slack)
        evidence.setdefault(comp, {}).setdefault(parent, []).extend(ev)
        return comp, parent
    scored = []
    for (comp, name), (out_rel, in_rel, calls) in half.errors.items():
        if comp not in choosers or comp in whole or not name or inside(name, merged.get(comp, [])):
            continue
        scored.append((out_rel / calls / max(in_rel / calls, floor), out_rel / calls, comp, name))
    if not scored:
        return None
    top = max(a for a, _, _, _ in scored)
    if top < 8:  # rounding, spread evenly: no module stands out
        return None
    amp, out_rel, comp, name = max((x for x in scored if x[0] >= 0.9 * top), key=lambda x: x[3].count("."))
    island = choosers[comp].island_for(name)
    if not island:
        return None
    islands[comp] = choosers[comp].collapse([*islands.get(comp, []), island], slack)
    evidence.setdefault(comp, {}).setdefault(island, []).append(
        Evidence(comp, island, name, "error", amp, half.stats[(comp, name)].out_step, out_rel))
    return comp, island


def _where(bad: tuple[str, str, bool] | None) -> str:
    return f"{bad[0]}.{bad[1]}" if bad else ""


def _compare_recipe(islands: Mapping[str, list[str]], whole: list[str], recipe_islands: Mapping[str, list[str]],
                    recipe_fp32: list[str], stats: Mapping[tuple[str, str], _Stat], limit: float, target: str,
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
