"""check: run a pipeline once, tiny, with recording hooks, and report every dtype and device problem.

Findings: mismatches (a leaf module's floating input in another dtype or device than its parameters: torch raises
for most, some promote silently), erased float32 islands, drift from the planned dtypes, the casts hooks made, and a
mismatch the call raised, explained with its fix instead of a traceback. ``hf-precision check`` exits with
``CheckReport.exit_code``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt
from ..errors import override_line
from .call import default_call, pipeline_modules
from .fixes import compute_dtype, recorded_fix
from .recorder import Recorder

if TYPE_CHECKING:
    from torch import nn

__all__ = ["check", "CheckReport", "Mismatch", "ErasedIsland", "Drift", "Cast", "default_call"]

# --------------------------------------------------------------------------------------------- findings


@dataclasses.dataclass(frozen=True)
class Mismatch:
    """A module whose input differs in dtype (or device) from its own parameters."""

    module: str
    component: str
    kind: str
    got: str
    expected: str
    calls: int
    fix: str


@dataclasses.dataclass(frozen=True)
class ErasedIsland:
    """A float32 island of the applied recipe whose parameters are no longer float32."""

    module: str
    component: str
    dtype: str
    tensors: int
    fix: str


@dataclasses.dataclass(frozen=True)
class Drift:
    """A component whose parameters are no longer where the applied recipe put them (dtype or device)."""

    component: str
    what: str
    have: str
    want: str
    tensors: int
    fix: str


@dataclasses.dataclass(frozen=True)
class Cast:
    """A place where a hook changed the dtype of what enters or leaves a module."""

    module: str
    kind: str
    where: str
    from_dtype: str
    to_dtype: str
    calls: int


@dataclasses.dataclass
class CheckReport:
    """What :func:`check` found. ``ok`` is true when nothing is wrong; ``exit_code`` is 0 (ok) or 1.

    ``pipeline`` (class name), ``recipe`` and ``device`` (the applied recipe's, None without one), ``mismatches``,
    ``erased_islands``, ``drift``, ``casts`` (hook dtype changes with call counts), ``error`` (what the call raised: a
    :class:`~hf_precision.MismatchError`, or any other exception), ``notes`` (worth knowing, not problems) and
    ``modules_run`` (parameter-holding module calls observed).
    """

    pipeline: str
    recipe: str | None
    device: str | None
    mismatches: list[Mismatch]
    erased_islands: list[ErasedIsland]
    drift: list[Drift]
    casts: list[Cast]
    error: BaseException | None
    notes: list[str]
    modules_run: int

    @property
    def ok(self) -> bool:
        return not (self.mismatches or self.erased_islands or self.drift or self.error is not None)

    @property
    def exit_code(self) -> int:
        return 0 if self.ok else 1

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "exit_code": self.exit_code, "pipeline": self.pipeline, "recipe": self.recipe,
                "device": self.device, "modules_run": self.modules_run,
                "error": _error_dict(self.error),
                "mismatches": [dataclasses.asdict(m) for m in self.mismatches],
                "erased_islands": [dataclasses.asdict(e) for e in self.erased_islands],
                "drift": [dataclasses.asdict(d) for d in self.drift],
                "casts": [dataclasses.asdict(c) for c in self.casts], "notes": list(self.notes)}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    def table(self, rewrite: Any = None) -> str:
        """The report as text; ``rewrite`` (str -> str) turns each fix into the words of the caller's interface
        (``check --plain`` takes ``--dtype C=D``, not ``--set``)."""
        fixed = rewrite or (lambda text: text)
        recipe = f"recipe {self.recipe} ({self.device})" if self.recipe else "no hf_precision recipe"
        problems = (len(self.mismatches) + len(self.erased_islands) + len(self.drift)
                    + (self.error is not None))
        verdict = "OK" if self.ok else f"{problems} problem{'s' if problems != 1 else ''}"
        out = [f"check {self.pipeline}, {recipe}: {verdict} ({self.modules_run} module calls recorded)"]
        if self.error is not None:
            out += ["", "the call failed:"]
            info = _error_dict(self.error) or {}
            if info.get("fix"):
                out.append(f"  {info['message']}")
                out += _indent(f"fix: {fixed(info['fix'])}")
            else:
                out.append(f"  {info['type']}: {info['message']}")
                out += _indent("not a dtype or device mismatch: run the call yourself for the traceback, or pass "
                               "your own: hf_precision.check(pipe, call=lambda pipe: pipe(...))")
        # each finding: its line, then the fix that goes with it
        for title, found, line in (
                ("erased float32 islands:", self.erased_islands,
                 lambda e: f"{e.module}: {e.tensors} parameter tensors are {e.dtype}, the recipe keeps them float32"),
                ("drift from the plan:", self.drift,
                 lambda d: f"{d.component}: {d.tensors} parameter tensors are {'on ' if d.what == 'device' else ''}"
                           f"{d.have}, the plan says {d.want}"),
                ("mismatches (module: input vs its parameters):", self.mismatches,
                 lambda m: f"{m.module}: {m.kind} {m.got} input, {m.expected} parameters ({m.calls} call"
                           f"{'s' if m.calls != 1 else ''})")):
            out += ["", title] if found else []
            for item in found:
                out += [f"  {line(item)}", *_indent(f"fix: {fixed(item.fix)}")]
        if self.casts:
            out += ["", "casts (hooks that changed a dtype):"]
            width = max(len(c.module) for c in self.casts)
            for c in self.casts:
                out.append(f"  {c.module.ljust(width)}  {c.kind:<6}  {c.where:<6}  {c.from_dtype} -> {c.to_dtype}  "
                           f"x{c.calls}")
        if self.notes:
            out += ["", "notes:"]
            for n in self.notes:
                out += _indent(n, first="  - ", rest="    ")
        return "\n".join(out)

    __str__ = table


def _indent(text: str, first: str = "    ", rest: str = "      ") -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=116, initial_indent=first, subsequent_indent=rest) or [first.rstrip()]


def _error_dict(err: BaseException | None) -> dict[str, Any] | None:
    if err is None:
        return None
    from .mismatch import MismatchError

    out: dict[str, Any] = {"type": type(err).__name__, "message": str(err).splitlines()[0] if str(err) else ""}
    if isinstance(err, MismatchError):
        out.update(kind=err.kind, module=err.module, component=err.component, got=err.got, expected=err.expected,
                   fix=err.fix)
    return out


# --------------------------------------------------------------------------------------------- checking


def _drift(pipe: Any, comps: Mapping[str, nn.Module], applied: Any) -> tuple[list[ErasedIsland], list[Drift], list[str]]:
    from collections import Counter

    from ..runtime.placement import same_device
    from ..runtime.layout import drift

    erased: list[ErasedIsland] = []
    drifted: list[Drift] = []
    notes: list[str] = []
    for c, module in applied.modules.items():
        if comps.get(c) is not module:
            notes.append(f"{c} was replaced after the recipe was applied, so it has no boundary hooks: re-apply "
                         f"with hf_precision.apply_recipe(pipe)")
            continue
        islands = applied.islands.get(c, [])
        for d in drift(c, module, applied.recipe[c], islands):  # grouped already: one finding per group
            if d.island is not None:
                erased.append(ErasedIsland(
                    module=f"{c}.{d.island}", component=c, dtype=d.have, tensors=d.count,
                    fix=(f"a cast after loading (pipe.to(torch.{d.have})?) erased it: move pipelines with "
                         f"pipe.to(device), not pipe.to(dtype). Reload with hf_precision.load_pipeline(...) or "
                         f"re-apply: hf_precision.apply_recipe(pipe, hf_precision.applied(pipe).recipe); to run it in "
                         f"{d.have} on purpose, leave it out: "
                         f"{override_line(c, 'keep_fp32', [i for i in islands if i != d.island])}")))
            else:
                drifted.append(Drift(component=c, what="dtype", have=d.have, want=d.want, tensors=d.count, fix=(
                    f"reload with hf_precision.load_pipeline(...) or re-apply: hf_precision.apply_recipe(pipe, "
                    f"hf_precision.applied(pipe).recipe); to plan {c} in {d.have} instead: "
                    f"{override_line(c, 'dtype', d.have)}")))
        want = applied.devices.get(c)
        moved = Counter(str(p.device) for p in module.parameters()
                        if want and p.device.type != "meta" and not same_device(want, p.device))
        drifted += [Drift(component=c, what="device", have=have, want=str(want), tensors=n, fix=(
            f"{c} was moved after the recipe was applied (the hooks follow it, so this runs); to plan for {have}, "
            f"re-apply: hf_precision.apply_recipe(pipe, device='{have}')")) for have, n in moved.items()]
    return erased, drifted, notes


def check(pipe: Any, *, call: Callable[[Any], Any] | None = None) -> CheckReport:
    """Run one tiny pipeline call with recording hooks and report every dtype and device problem (the findings of this
    module), each with its fix; a plain diffusers pipeline gets the runtime checks only. ``call(pipe)`` defaults to
    :func:`default_call`. Hooks come off afterwards, also on error.

    Example:
        >>> import torch
        >>> from hf_precision import apply_recipe, get_recipe
        >>> from hf_precision.testing.pipelines import make_sdxl
        >>> pipe = make_sdxl()
        >>> _ = apply_recipe(pipe, get_recipe("sdxl", device="t4"), device="cpu")
        >>> check(pipe).exit_code
        0
        >>> pipe.to(torch.float16)  # doctest: +ELLIPSIS
        StableDiffusionXLPipeline...
        >>> report = check(pipe)
        >>> report.exit_code, [e.module for e in report.erased_islands]
        (1, ['unet.time_embedding', 'unet.add_embedding'])
    """
    from ..runtime.apply import Applied
    from ..runtime.apply import applied as applied_record
    from .calibration.session import Session
    from .mismatch import explain

    comps = pipeline_modules(pipe)
    applied = applied_record(pipe)
    if not isinstance(applied, Applied) or applied.removed:
        applied = None
    run = call if call is not None else default_call(pipe)

    kinds: dict[str, str] = {}
    if applied is not None:
        for cname, entries in applied.hooked.items():
            for e in entries:
                kinds[cname if e == "(forward)" else f"{cname}.{e}"] = "entry"
        for cname, islands in applied.islands.items():
            for i in islands:
                kinds[f"{cname}.{i}"] = "island"
    recorder = Recorder(comps, kinds)
    error: BaseException | None = None
    output = None
    try:
        with Session(pipe) as session, explain(pipe):  # the pipeline's progress bar silenced, no gradients
            recorder.attach()
            output = session.run(run, hooks=(recorder,))  # the hooks come off after the run, also when it raised
    except Exception as err:  # the report is the point: a crash is a finding, not a traceback
        error = err

    mismatches = []
    crashed = getattr(error, "module", None), getattr(error, "kind", None), getattr(error, "got", None)
    for (path, kind, got, want), n in recorder.mismatches.items():
        if (path, kind, got) == crashed:
            continue  # the crash itself: reported once, as the error
        component, _, rel = path.partition(".")
        mismatches.append(Mismatch(module=path, component=component, kind=kind, got=got, expected=want, calls=n,
                                   fix=recorded_fix(component, rel, kind, got, want, applied is not None,
                                                    compute_dtype(comps[component]) if component in comps else None)))
    casts = [Cast(module=p, kind=k, where=w, from_dtype=a, to_dtype=b, calls=n)
             for (p, k, w, a, b), n in recorder.casts.items()]
    notes: list[str] = []
    erased: list[ErasedIsland] = []
    drift: list[Drift] = []
    if applied is not None:
        erased, drift, notes = _drift(pipe, comps, applied)
        for s in applied.skipped:
            notes.append(f"not in the recipe: {s}")
    else:
        notes.append("no hf_precision recipe is applied to this pipeline, so only runtime mismatches were checked; "
                     "hf_precision.apply_recipe(pipe) (or hf_precision.load_pipeline(path)) gives each component its "
                     "recipe dtype and casts at the boundaries; hf_precision.plan(path) shows the plan")
    if error is None:
        for cname in comps:
            if not recorder.calls.get(cname):
                notes.append(f"{cname} did not run in this call, so it was not checked at runtime")
        if not _finite(output):
            notes.append(f"the output has NaN or inf values (a black image): a component overflowed its dtype; "
                         f"try {override_line('vae', 'dtype', 'float32')} (or bfloat16), or keep the overflowing "
                         f"modules in keep_fp32")
    return CheckReport(pipeline=type(pipe).__name__, recipe=applied.recipe.name if applied else None,
                       device=applied.recipe.device.label() if applied else None, mismatches=mismatches,
                       erased_islands=erased, drift=drift, casts=casts, error=error, notes=notes,
                       modules_run=sum(recorder.calls.values()))


def _finite(output: Any) -> bool:
    import numpy as np

    for attr in ("images", "image", "frames"):  # `image`: Kandinsky 5 Image's KandinskyImagePipelineOutput
        value = getattr(output, attr, None)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            return False
    return True
