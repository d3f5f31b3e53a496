"""check: run a pipeline once, tiny, with recording hooks, and report every dtype and device problem.

:func:`check` runs one small pipeline call (1 step, a few pixels) and reports

- **mismatches**: every leaf module whose floating input differs in dtype or device from its own parameters (torch
  raises for most of these; some promote silently);
- **erased float32 islands**: islands of the applied recipe whose parameters are no longer float32, e.g. after a
  later ``pipe.to(torch.float16)``;
- **drift**: components whose parameters are no longer in the dtype the applied recipe planned;
- **casts**: every place a hook changed a dtype (component entries, island boundaries), with how often;
- **the crash**, if the call raised a mismatch: :func:`hf_precision.diagnose.mismatch` turns it into a finding naming the
  module and the override line that fixes it, instead of a traceback.

``CheckReport.exit_code`` is 0 when all is well and 1 when something is wrong (``hf-precision check`` exits with
it).
"""

from __future__ import annotations

import dataclasses
import inspect
import json
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt
from ..errors import RecipeError, override_line
from .fixes import recorded_fix

if TYPE_CHECKING:
    from torch import nn

__all__ = ["check", "CheckReport", "Mismatch", "ErasedIsland", "Drift", "Cast", "default_call"]

_MAX_MISMATCHES = 50  # distinct modules; a cascade through every layer says nothing more after the first few


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

    Attributes:
        pipeline (`str`): The pipeline class.
        recipe (`str` or `None`): The applied recipe, ``None`` for a pipeline without one.
        device (`str` or `None`): The device the applied recipe was resolved for.
        mismatches (`list[Mismatch]`): Modules whose input dtype or device differs from their parameters.
        erased_islands (`list[ErasedIsland]`): Float32 islands that are float32 no more.
        drift (`list[Drift]`): Components that drifted from the plan.
        casts (`list[Cast]`): Dtype changes made by hooks (recipe boundaries), with call counts.
        error (`Exception` or `None`): What the call raised: a :class:`~hf_precision.MismatchError` (module and
            fix) or any other exception.
        notes (`list[str]`): Things worth knowing that are not problems.
        modules_run (`int`): Parameter-holding module calls observed.
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
        if self.erased_islands:
            out += ["", "erased float32 islands:"]
            for e in self.erased_islands:
                out.append(f"  {e.module}: {e.tensors} parameter tensors are {e.dtype}, the recipe keeps them float32")
                out += _indent(f"fix: {fixed(e.fix)}")
        if self.drift:
            out += ["", "drift from the plan:"]
            for d in self.drift:
                out.append(f"  {d.component}: {d.tensors} parameter tensors are {'on ' if d.what == 'device' else ''}"
                           f"{d.have}, the plan says {d.want}")
                out += _indent(f"fix: {fixed(d.fix)}")
        if self.mismatches:
            out += ["", "mismatches (module: input vs its parameters):"]
            for m in self.mismatches:
                out.append(f"  {m.module}: {m.kind} {m.got} input, {m.expected} parameters ({m.calls} call"
                           f"{'s' if m.calls != 1 else ''})")
                out += _indent(f"fix: {fixed(m.fix)}")
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


# --------------------------------------------------------------------------------------------- the default call


def _denoiser_name(pipe: Any) -> str | None:
    """The denoiser the recipe names (applied, or the one covering this pipeline class), else the largest model."""
    from ..recipe.catalog import pipeline_spec, recipe_classes
    from ..runtime.apply import applied

    record = applied(pipe)
    if record is not None and record.recipe.denoiser:
        return record.recipe.denoiser
    shipped = recipe_classes().get(type(pipe).__name__)
    if shipped is not None:
        return pipeline_spec(shipped).get("denoiser")
    comps = _components(pipe)
    return max(comps, key=lambda n: sum(p.numel() for p in comps[n].parameters()), default=None)


def _side(pipe: Any) -> int:
    """The smallest image side that runs every level of the denoiser: VAE factor x its downsampling x 2, >= 32."""
    vae_factor = int(getattr(pipe, "vae_scale_factor", 8) or 8)
    down = 1
    denoiser = getattr(pipe, _denoiser_name(pipe) or "", None)
    config = getattr(denoiser, "config", None)
    if config is not None:
        blocks = config.get("block_out_channels") if hasattr(config, "get") else None
        if blocks:
            down = 2 ** (len(blocks) - 1)
        patch = config.get("patch_size") if hasattr(config, "get") else None
        if patch:
            down = max(down, int(patch))
    side = max(32, vae_factor * down * 2)
    return -(-side // 16) * 16


def default_call(pipe: Any) -> Callable[[Any], Any]:
    """The smallest call that runs every component of a known pipeline once: 1 step, a few pixels, fixed seed.

    Text-to-image pipelines (SDXL, SD 1.x/2.x, PixArt) get ``prompt="check"``; SVD a small image, 2 frames and
    ``decode_chunk_size=1``; DiT ``class_labels=[1]``. Image-to-image and inpainting variants also get an image
    (and a mask) with ``strength=1``. Outputs are numpy (``output_type="np"``).

    Raises:
        RecipeError: The pipeline's ``__call__`` takes neither a prompt, an image nor class labels: pass
            ``call=lambda pipe: pipe(...)`` to :func:`check`.
    """
    import torch

    try:
        params = inspect.signature(pipe.__call__).parameters
    except (TypeError, ValueError):
        params = {}
    side = _side(pipe)
    name = type(pipe).__name__

    def image(fill: tuple[int, int, int] = (120, 90, 60)) -> Any:
        from PIL import Image

        return Image.new("RGB", (side, side), fill)

    # PixArt pipelines index a 1-step DPM-Solver result as a tuple (diffusers 0.42 IndexError): they get 2 steps.
    kwargs: dict[str, Any] = {"num_inference_steps": 2 if name.startswith("PixArt") else 1, "output_type": "np"}
    if "class_labels" in params:
        kwargs["class_labels"] = [1]
    elif name.startswith("StableVideoDiffusion") or ("image" in params and "prompt" not in params):
        kwargs.update(image=image(), num_frames=2, decode_chunk_size=1)
    elif "prompt" in params:
        kwargs["prompt"] = "check"
        if "image" in params:
            kwargs["image"] = image()
        if "mask_image" in params:
            kwargs["mask_image"] = image((255, 255, 255))
        if "strength" in params:
            kwargs["strength"] = 1.0
    else:
        raise RecipeError(f"check: no default call for {name} (its __call__ takes no prompt, image or class_labels); "
                          f"pass one: hf_precision.check(pipe, call=lambda pipe: pipe(...))")
    if "height" in params and "width" in params:
        kwargs.update(height=side, width=side)
    for key, value in (("use_resolution_binning", False), ("clean_caption", False), ("max_sequence_length", 16)):
        if key in params:
            kwargs[key] = value
    accepts_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
    kwargs = {k: v for k, v in kwargs.items() if accepts_any or k in params or not params}

    def call(p: Any) -> Any:
        if "generator" in params or accepts_any:
            return p(**kwargs, generator=torch.Generator("cpu").manual_seed(0))
        return p(**kwargs)

    call.kwargs = kwargs  # type: ignore[attr-defined]
    return call


# --------------------------------------------------------------------------------------------- recording


def _floating(tree: Any) -> list[Any]:
    import torch
    from torch.utils._pytree import tree_leaves

    return [t for t in tree_leaves(tree) if isinstance(t, torch.Tensor) and t.is_floating_point()]


def _layerwise_compute(module: nn.Module) -> Any:
    """The compute dtype of diffusers' layerwise casting on this layer (weights are cast inside forward)."""
    registry = getattr(module, "_diffusers_hook", None)
    get = getattr(registry, "get_hook", None)
    hook = get("layerwise_casting") if get is not None else None
    return getattr(hook, "compute_dtype", None)


class _Recorder:
    """Per-module hooks over a pipeline's components: input/parameter mismatches and dtype changes made by hooks.

    Leaf modules with parameters get a pre-hook appended after every existing one, so it sees what the module
    really receives. Modules that already carry forward hooks (hf_precision's entry and island hooks, or any other)
    get a pre-hook prepended and one appended, and the same for forward hooks: the difference is the cast.
    """

    def __init__(self, components: Mapping[str, nn.Module], kinds: Mapping[str, str]):
        self.components = components
        self.kinds = kinds  # module path -> "entry" / "island"
        self.handles: list[Any] = []
        self.mismatches: dict[tuple[str, str, str, str], int] = {}
        self.casts: dict[tuple[str, str, str, str, str], int] = {}
        self.calls: dict[str, int] = {}
        self.stack: dict[int, list[list[Any]]] = {}

    def attach(self) -> None:
        for cname, comp in self.components.items():
            for rel, module in comp.named_modules():
                path = f"{cname}.{rel}" if rel else cname
                hooked = bool(module._forward_pre_hooks or module._forward_hooks)
                leaf = not any(True for _ in module.children()) and any(
                    p is not None and p.is_floating_point() for p in module._parameters.values())
                if hooked:
                    kind = self.kinds.get(path, "hook")
                    self.handles += [
                        module.register_forward_pre_hook(self._before(module), prepend=True, with_kwargs=True),
                        module.register_forward_pre_hook(self._after(path, kind), with_kwargs=True),
                        module.register_forward_hook(self._out_before(module), prepend=True),
                        module.register_forward_hook(self._out_after(module, path, kind)),
                    ]
                if leaf:
                    self.handles.append(module.register_forward_pre_hook(self._inputs(cname, path), with_kwargs=True))

    def remove(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def _record_casts(self, path: str, kind: str, where: str, before: list[Any], after: list[Any]) -> None:
        if len(before) == len(after):
            pairs = [(b, a) for b, a in zip(before, after) if b != a]
        else:  # a hook changed the structure: compare what kinds of dtypes came in and went out
            pairs = [(b, a) for b in set(before) for a in set(after) if b not in after and a not in before]
        for b, a in dict.fromkeys(pairs):
            key = (path, kind, where, dt.from_torch(b), dt.from_torch(a))
            self.casts[key] = self.casts.get(key, 0) + 1

    def _before(self, module: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self.stack.setdefault(id(module), []).append([[t.dtype for t in _floating((args, kwargs))], None])
        return hook

    def _after(self, path: str, kind: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            frames = self.stack.get(id(mod))
            if frames:
                self._record_casts(path, kind, "input", frames[-1][0], [t.dtype for t in _floating((args, kwargs))])
        return hook

    def _out_before(self, module: nn.Module) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            frames = self.stack.get(id(module))
            if frames:
                frames[-1][1] = [t.dtype for t in _floating(out)]
        return hook

    def _out_after(self, module: nn.Module, path: str, kind: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, out: Any) -> None:
            frames = self.stack.get(id(module))
            if not frames:
                return
            _, raw = frames.pop()
            if raw is not None:
                self._record_casts(path, kind, "output", raw, [t.dtype for t in _floating(out)])
        return hook

    def _inputs(self, component: str, path: str) -> Callable[..., None]:
        def hook(mod: nn.Module, args: Any, kwargs: Any) -> None:
            self.calls[component] = self.calls.get(component, 0) + 1
            params = [p for p in mod._parameters.values() if p is not None and p.is_floating_point()]
            if not params or any(p.device.type == "meta" for p in params):
                return  # sequential offload: weights arrive inside forward
            compute = _layerwise_compute(mod)
            dtypes = {compute} if compute is not None else {p.dtype for p in params}
            want_dtype = sorted(dtypes, key=str)[0]
            device = params[0].device
            for t in _floating((args, kwargs)):
                if t.dtype not in dtypes:
                    self._mismatch(path, "dtype", dt.from_torch(t.dtype), dt.from_torch(want_dtype))
                if t.device != device:
                    self._mismatch(path, "device", str(t.device), str(device))
        return hook

    def _mismatch(self, path: str, kind: str, got: str, want: str) -> None:
        key = (path, kind, got, want)
        if key in self.mismatches or len(self.mismatches) < _MAX_MISMATCHES:
            self.mismatches[key] = self.mismatches.get(key, 0) + 1


# --------------------------------------------------------------------------------------------- checking


def _components(pipe: Any) -> dict[str, nn.Module]:
    import torch

    comps = getattr(pipe, "components", None)
    if not isinstance(comps, Mapping):
        raise RecipeError(f"check: expected a diffusers pipeline (an object with a `components` mapping), "
                          f"got {type(pipe).__name__}")
    return {k: v for k, v in comps.items() if isinstance(v, torch.nn.Module)}


def _main_dtype(module: nn.Module) -> str | None:
    """The dtype most of a component's floating parameters are in (by element count)."""
    sizes: dict[str, int] = {}
    for p in module.parameters():
        if p.is_floating_point():
            sizes[dt.from_torch(p.dtype)] = sizes.get(dt.from_torch(p.dtype), 0) + p.numel()
    return max(sizes, key=sizes.__getitem__) if sizes else None


def _drift(pipe: Any, comps: Mapping[str, nn.Module], applied: Any) -> tuple[list[ErasedIsland], list[Drift], list[str]]:
    from ..runtime.layout import drift

    erased: dict[tuple[str, str, str], int] = {}
    drifted: dict[tuple[str, str, str, str], int] = {}
    notes: list[str] = []
    for name, module in applied.modules.items():
        current = comps.get(name)
        if current is not module:
            notes.append(f"{name} was replaced after the recipe was applied, so it has no boundary hooks: re-apply "
                         f"with hf_precision.apply_recipe(pipe)")
            continue
        for d in drift(name, module, applied.recipe[name], applied.islands.get(name, [])):
            if d.island is not None:
                erased[(name, d.island, d.have)] = erased.get((name, d.island, d.have), 0) + d.count
            else:
                drifted[(name, "dtype", d.have, d.want)] = drifted.get((name, "dtype", d.have, d.want), 0) + d.count
        want_device = applied.devices.get(name)
        for param in module.parameters():
            if want_device and param.device.type != "meta" and str(param.device) != str(want_device):
                key = (name, "device", str(param.device), str(want_device))
                drifted[key] = drifted.get(key, 0) + 1
    out_erased = []
    for (c, island, have), n in erased.items():
        out_erased.append(ErasedIsland(
            module=f"{c}.{island}", component=c, dtype=have, tensors=n,
            fix=(f"a cast after loading (pipe.to(torch.{have})?) erased it: move pipelines with pipe.to(device), "
                 f"not pipe.to(dtype). Reload with hf_precision.load_pipeline(...) or re-apply: "
                 f"hf_precision.apply_recipe(pipe, hf_precision.applied(pipe).recipe); to run it in {have} on "
                 f"purpose, leave it out: {override_line(c, 'keep_fp32', [i for i in applied.islands.get(c, []) if i != island])}")))
    out_drift = []
    for (c, what, have, want), n in drifted.items():
        if what == "dtype":
            fix = (f"reload with hf_precision.load_pipeline(...) or re-apply: hf_precision.apply_recipe(pipe, "
                   f"hf_precision.applied(pipe).recipe); to plan {c} in {have} instead: {override_line(c, 'dtype', have)}")
        else:
            fix = (f"{c} was moved after the recipe was applied (the hooks follow it, so this runs); to plan for "
                   f"{have}, re-apply: hf_precision.apply_recipe(pipe, device='{have}')")
        out_drift.append(Drift(component=c, what=what, have=have, want=want, tensors=n, fix=fix))
    return out_erased, out_drift, notes


def check(pipe: Any, *, call: Callable[[Any], Any] | None = None) -> CheckReport:
    """Run one tiny pipeline call with recording hooks and report every dtype and device problem.

    Reported: every leaf module whose floating input differs in dtype or device from its own parameters; every
    float32 island of the applied recipe that is float32 no more (e.g. after ``pipe.to(torch.float16)``); every
    component that drifted from the plan; every cast the boundary hooks made; and, if the call raised a dtype or
    device mismatch, that error explained (module path and fix) instead of a traceback. Each problem comes with the
    override line that fixes it. Hooks are removed afterwards, also on error.

    Without an applied recipe (a plain diffusers pipeline) only runtime mismatches are checked.

    Args:
        pipe: A diffusers pipeline, loaded with :func:`~hf_precision.load_pipeline` or
            :func:`~hf_precision.apply_recipe`, or a plain one.
        call (*optional*): ``call(pipe)`` runs the pipeline; defaults to :func:`default_call`: 1 step, a small
            image, a fixed seed, numpy output.

    Returns:
        `CheckReport`: ``ok``, ``exit_code`` (0 or 1), the findings; print it for a report.

    Raises:
        RecipeError: No default call is known for this pipeline class and ``call`` is not given.

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

    comps = _components(pipe)
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
    recorder = _Recorder(comps, kinds)
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
                                                    _main_dtype(comps[component]) if component in comps else None)))
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

    for attr in ("images", "frames"):
        value = getattr(output, attr, None)
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and not np.isfinite(value).all():
            return False
    return True
