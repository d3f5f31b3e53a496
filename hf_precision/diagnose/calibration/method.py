"""calibrate: the method of docs/calibrate.md in order: reference run, naive run, search, verify, report.

The pieces live beside it: ``session`` (the pipeline borrowed and handed back), ``record`` (what a run measures),
``search`` (which modules get islands), ``report`` (the result, its YAML and table), ``memory`` (what fits).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import os
import time
import warnings
from collections.abc import Callable, Mapping
from typing import Any

from ... import dtypes as dt
from ...errors import RecipeError
from ...recipe.patterns import inside, resolve_islands
from ..call import call_params, default_negative_prompt, fitted_to_area, frames_argument, sized_inputs, steps_problem
from ..inputs import open_image
from .memory import open_pipeline
from .record import Recorder, Steps, output_array
from .report import HALF_MAX, CalibrationResult, RunError, compare, recipe_notes
from .search import Islands
from .session import Session

__all__ = ["calibrate"]


def calibrate(pipe_or_folder: Any, device: Any = None, call: Mapping[str, Any] | Callable[[Any], Any] | None = None, *,
              target: str | None = None, steps: int | None = None, bound: float = 0.05, progress: bool = True,
              reference: str | None = None, run_on: str | None = None, recipe: str | None = None, seed: int = 0,
              rounds: int = 6, slack: float = 0.25, prompt: str | None = None, image: Any = None,
              size: tuple[int | None, int | None] = (None, None), max_memory: int | None = None,
              frames: int | None = None, options: Mapping[str, Any] | None = None,
              base: str | os.PathLike[str] | None = None, mask: Any = None) -> CalibrationResult:
    """Find the float32 islands a pipeline needs in half precision by measuring it, and verify them.

    Args:
        pipe_or_folder: a diffusers pipeline (handed back as it was found) or a pipeline folder.
        device: the layout to calibrate (a preset such as ``"t4"``, a description or a present device): its recipe
            gives the half dtype (``target`` overrides it) and the islands already kept. The runs happen on ``run_on``
            (default the best present device).
        call (*optional*): call kwargs (a seeded ``generator`` added per run) or ``fn(pipe) -> output``; default
            the call of ``prompt``, ``image``, ``mask``, ``size`` (SD/SDXL img2img's image is resized to it),
            ``frames``, ``steps`` and ``options`` (more kwargs its ``__call__`` takes, e.g. CogVideoX's
            ``{"max_sequence_length": 16}``).
        bound (*optional*): the mean absolute error of the output (images in [0, 1]) to stay within; reported.
        progress (*optional*): a tqdm bar over runs and steps.
        reference (*optional*): ``"float32"`` or ``"bfloat16"`` (ranges only); default float32 if it fits memory.
        recipe, seed, rounds, slack (*optional*): the recipe to start from; every run's seed; how many verification
            runs may add islands; how many more bytes (fraction) a parent may cost to replace siblings.
        max_memory (*optional*): a budget on ``run_on`` in bytes; a reference run that does not fit it whole runs with
            ``enable_model_cpu_offload``, and one whose largest component does not fit is refused with what to do.
        base (*optional*): for a single-file checkpoint, the rest of the pipeline, as ``load_pipeline(file, base=)``.

    Returns a :class:`CalibrationResult` (``islands``, ``evidence``, ``extra_bytes``, ``errors`` of the ``"naive"`` and
    ``"islands"`` runs, ``to_yaml()``, ``write(path)``, ``table()``); RecipeError for a target the layout cannot
    compute, a model that does not fit, or a reference run that is itself not finite.

    Example:
        >>> from hf_precision.testing import PIPELINES, make_pipeline
        >>> from hf_precision.testing.calibration import plant_time_embedding
        >>> pipe = make_pipeline("wan")
        >>> planted = plant_time_embedding(pipe.transformer)
        >>> result = calibrate(pipe, "t4", PIPELINES["wan"].call_kwargs(), progress=False)
        >>> result.islands["transformer"], result.errors["naive"].finite, result.finite
        (['condition_embedder.time_embedder'], False, True)
    """
    from ...recipe.devices import device_caps, device_profile
    from ...runtime.placement import torch_device

    clock = _Clock()
    run_on = str(run_on or device_profile(None).torch_device())
    torch_device(run_on, "run_on")  # a preset such as "t4" is a layout (device=): refused before the model loads
    caps = device_caps(device if device is not None else run_on)  # a layout that does not exist fails before loading
    model = str(pipe_or_folder) if isinstance(pipe_or_folder, (str, os.PathLike)) else type(pipe_or_folder).__name__
    pipe, owned, ref_dtype, offload = open_pipeline(pipe_or_folder, run_on, reference, target, recipe, max_memory,
                                                    base)
    clock.lap("load")
    with Session(pipe, restore=True, offload_on=run_on if offload else None, handback=not owned) as session:
        setting = _Setting.resolve(session, recipe, device, caps, run_on, target)
        kwargs = _call_kwargs(pipe, call, prompt, image, steps, size, frames, options, mask)
        runs = _Runs(session, setting, kwargs, call, seed, progress)
        # 1. The reference run: every component in the reference dtype, every module's range and samples recorded.
        ref_out, ref = runs.reference(ref_dtype, model)
        clock.lap("reference")
        # 2. The naive run: every component in the target dtype, no islands: the "before" of the report.
        errors = {"naive": runs.naive(ref_out)}
        clock.lap("naive")
        # 3. Islands from the reference ranges; 4-5. verification runs that island what overflows or loses most.
        search = Islands.from_ranges({n: session.components[n] for n in setting.names}, ref.stats, setting.limit,
                                     setting.delta, slack, setting.recipe_islands)
        for attempt in range(rounds + 1):
            after, half = runs.verify(search, attempt, ref_out)
            search.remember(after)
            if attempt == rounds or (after.finite and after.mean_abs <= bound):
                break
            if not (search.add_error(half, after, setting.floor) if after.finite else search.add_overflow(half)):
                break
        errors["islands"] = search.fallback(after, bound)
        clock.lap("verify")
    # 6. The report: evidence from the reference ranges, bytes against the half layout, notes against the recipe.
    search.settle(ref.stats)
    island_bytes = {n: {i: setting.net_bytes(search, n, i) for i in v} for n, v in search.islands.items()}
    component_bytes = {n: search.bytes(n) for n in setting.names}
    notes = search.notes + recipe_notes(search.islands, search.whole, setting.recipe_names, setting.recipe_fp32,
                                        ref.stats, setting.limit, setting.target, device or run_on)
    notes += _caveats(errors["islands"], bound, session.offloaded, run_on, ref_dtype)
    return CalibrationResult(
        model=model, layout=str(device if device is not None else run_on), target=setting.target, reference=ref_dtype,
        islands=search.islands, whole=search.whole, evidence=search.evidence, island_bytes=island_bytes,
        extra_bytes=sum(b for per in island_bytes.values() for b in per.values())
        + sum(component_bytes[n] for n in search.whole), component_bytes=component_bytes,
        recipe_islands={n: v for n, v in setting.recipe_islands.items() if n in setting.names},
        recipe_fp32=setting.recipe_fp32, errors=errors, ranges=ref.ranges, notes=notes, bound=bound,
        timings=clock.laps, components=setting.names, wide=search.wide, tolerated=setting.tolerated)


class _Clock:
    """Seconds per phase, each lap from the end of the one before."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._mark = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name], self._mark = now - self._mark, now


@dataclasses.dataclass(frozen=True)
class _Setting:
    """What the layout's recipe says for this pipeline: the target half dtype, its range, the recipe's islands."""

    names: list[str]
    denoiser: str | None
    target: str
    limit: float  # the target's largest finite value
    delta: int  # bytes an island adds per value: float32 over the target
    floor: float  # the target's unit roundoff: a module's error growth is measured against at least this
    recipe: str | None
    layout: Any
    apply_on: str | None  # where apply_recipe places components (None: offload hooks place them)
    recipe_islands: dict[str, list[str]]
    recipe_names: dict[str, list[str]]  # the recipe's keep_fp32 globs as module names
    recipe_fp32: list[str]
    tolerated: dict[str, list[str]]

    @classmethod
    def resolve(cls, session: Session, recipe: str | None, layout: Any, caps: Any, run_on: str,
                target: str | None) -> _Setting:
        import torch

        from ...recipe.resolution import resolve
        from ...runtime.apply import config_dict
        from ...runtime.source import models_of_pipeline

        pipe, comps = session.pipe, session.components
        configs = {n: config_dict(m) for n, m in comps.items()}
        plan = resolve(recipe, pipeline_class=type(pipe).__name__, devices=None if session.offloaded else run_on,
                       layout=layout, configs=configs, components=list(comps), models=models_of_pipeline(pipe))
        if target is None:
            denoiser = plan[plan.denoiser] if plan.denoiser in plan else None
            target = denoiser.compute if denoiser is not None and denoiser.compute in dt.HALF else next(
                (d for d in ("float16", "bfloat16") if d in caps.compute), None)
        target = dt.canonical(target) if target else None
        if target not in dt.HALF or target not in caps.compute:
            raise RecipeError(f"calibrate: target {target!r} cannot be computed on {caps.profile.label()} (it computes "
                              f"{', '.join(caps.compute)}); pass target='float16' or 'bfloat16' that the layout "
                              "computes, or another layout (device='t4', 'a100')")
        # The recipe's islands are kept in every half run, also where the recipe computes the component in float32
        # on this layout: they are what a half compute of it keeps, and the model's code may need them (Kandinsky 5
        # feeds fp32 sinusoids to its `time_embeddings`, transformer_kandinsky.py:169-171: without that island a
        # float16 run raised a dtype mismatch)
        recipe_islands = {p.name: list(p.keep_fp32) for p in plan.policies
                          if p.name in comps and (p.compute in dt.HALF or p.keep_fp32)}
        return cls(
            names=[p.name for p in plan.policies if p.name in comps],
            denoiser=plan.denoiser if plan.denoiser in comps else None, target=target, limit=HALF_MAX[target],
            delta=4 - dt.itemsize(target), floor=torch.finfo(dt.to_torch(target)).eps / 2, recipe=recipe,
            layout=layout, apply_on=None if session.offloaded else run_on, recipe_islands=recipe_islands,
            recipe_names={n: resolve_islands(n, v, [m for m, _ in comps[n].named_modules() if m],
                                             owner=type(comps[n]).__name__, strict=False)
                          for n, v in recipe_islands.items()},
            recipe_fp32=[p.name for p in plan.policies if p.name in comps and p.compute == "float32"],
            tolerated={p.name: list(p.dtypes) for p in plan.policies if p.name in comps})

    def layer(self, dtype: str, islands: Mapping[str, list[str]] = {}, whole: list[str] = (),
              wide: list[str] = ()) -> dict[str, Any]:
        """The override of one run: every component in ``dtype`` (``whole`` ones in float32) with ``islands``."""
        out: dict[str, Any] = {}
        for n in self.names:  # storage = dtype: no layerwise casting, which apply cannot take back between runs
            d = "float32" if n in whole else dtype
            out[n] = {"dtype": d, "storage": d, "keep_fp32": list(islands.get(n, [])), "nan_guard": False}
            if n in wide:
                out[n]["output"] = "float32"
        return out

    def net_bytes(self, search: Islands, comp: str, island: str) -> int:
        """What an island adds to what the recipe's own islands already keep in float32."""
        kept = self.recipe_names.get(comp, [])
        if inside(island, kept):
            return 0
        return search.bytes(comp, island) - sum(search.bytes(comp, r) for r in kept if inside(r, [island]))


def _call_kwargs(pipe: Any, call: Mapping[str, Any] | Callable[[Any], Any] | None, prompt: str | None, image: Any,
                 steps: int | None, size: tuple[int | None, int | None],
                 frames: int | None = None, options: Mapping[str, Any] | None = None,
                 mask: Any = None) -> dict[str, Any] | None:
    """The kwargs of every run (None: ``call`` is a function); numpy output, so runs compare without a PIL round trip."""
    if callable(call):
        return None
    params = call_params(pipe)
    if call is not None:
        kwargs = dict(call)
    else:
        kwargs = {}
        if "prompt" in params or prompt is not None:  # with an image too: Kontext, I2V and img2img calls need one
            kwargs["prompt"] = prompt or "a photo of an astronaut riding a horse"
        if image is not None:
            kwargs["image"] = open_image(image) if isinstance(image, (str, os.PathLike)) else image
        elif "image" in params and params["image"].default is inspect.Parameter.empty:
            raise RecipeError(f"calibrate: {type(pipe).__name__} needs an input image: pass image=... (CLI: --image FILE)")
        if mask is not None:  # inpainting: white where it repaints
            kwargs["mask_image"] = open_image(mask, "mask", "L") if isinstance(mask, (str, os.PathLike)) else mask
        kwargs["num_inference_steps"] = steps or 4
        if "class_labels" in params and params["class_labels"].default is inspect.Parameter.empty:
            kwargs["class_labels"] = [1]  # class-conditioned (DiT): one fixed class, as check's call
        for key, value in zip(("height", "width"), size):
            if value and key in params:
                kwargs[key] = value
        if any(size) and "use_resolution_binning" in params:  # the size asked is the size run (PixArt's binning)
            kwargs["use_resolution_binning"] = False
        kwargs.update(sized_inputs(params, kwargs, size))  # img2img makes the input's size: the size asked
        kwargs.update(fitted_to_area(params, size, kwargs.get("image")))
        frame_arg = frames_argument(params)
        if frames and frame_arg:
            kwargs[frame_arg] = frames
        negative = default_negative_prompt(pipe)
        if negative is not None and "negative_prompt" in params:  # EasyAnimate fails without one
            kwargs["negative_prompt"] = negative
        kwargs.update({k: v for k, v in (options or {}).items() if k in params})
    if steps is not None:
        kwargs["num_inference_steps"] = steps
    count = kwargs.get("num_inference_steps")  # one rule with generate and video: the schedule, and img2img's strength
    problem = steps_problem(pipe, count, kwargs.get("strength")) if isinstance(count, int) else None
    if problem:
        raise RecipeError(problem)
    if "output_type" in params:
        kwargs.setdefault("output_type", "np")
    from ...runtime.progress import quiet_call

    return quiet_call(pipe, kwargs)


class _Runs:
    """calibrate's runs of one pipeline: a recipe layer applied, a ``Recorder`` on, one seeded call; one tqdm bar over
    runs and steps (the pipeline's own is silenced by the session)."""

    def __init__(self, session: Session, setting: _Setting, kwargs: dict[str, Any] | None,
                 call: Callable[[Any], Any] | Any, seed: int, progress: bool):
        self.session, self.setting, self.seed = session, setting, seed
        self.call = kwargs if kwargs is not None else call
        self.steps = Steps(setting.denoiser)
        params = call_params(session.pipe)
        if kwargs is not None and "callback_on_step_end" in params and "callback_on_step_end" not in kwargs:
            kwargs["callback_on_step_end"] = self.steps.on_step_end
            self.steps.callback = True
        self.n_steps = int((kwargs or {}).get("num_inference_steps", 1) or 1)
        self.bar = None
        if progress:
            from tqdm.auto import tqdm

            self.bar = self.steps.bar = tqdm(total=2 * self.n_steps, desc="calibrate", unit="step", leave=True)
            session.on_exit(self.bar.close)
        if self.steps.denoiser:
            session.on_exit(session.components[self.steps.denoiser].register_forward_pre_hook(self.steps.pre).remove)
        self.samples: dict[tuple[str, str], list[Any]] = {}

    def run(self, label: str, layer: dict[str, Any], layout: Any, reference: bool = False,
            compare: bool = False) -> tuple[Any, Recorder]:
        """One run with ``layer`` applied: its output as an array, and what the recorder measured."""
        from ...runtime.apply import apply_recipe

        s = self.setting
        if self.bar is not None:
            self.bar.set_description(f"calibrate: {label}")
        record = apply_recipe(self.session.pipe, s.recipe, device=s.apply_on, overrides=[layer], layout=layout)
        rec = Recorder(self.session.components, s.limit, self.steps.phase, reference,
                       self.samples if reference else None, self.samples if compare else None)
        self.steps.step, self.steps.calls = 0, 0
        return output_array(self.session.run(self.call, self.seed, hooks=(rec, record))), rec

    def reference(self, dtype: str, model: str) -> tuple[Any, Recorder]:
        """The reference run; a reference that is itself not finite is an error no island can fix."""
        out, ref = self.run(f"reference {dtype}", self.setting.layer(dtype), None, reference=True)
        if not compare("reference", out, out).finite:
            raise RecipeError(f"calibrate: the {dtype} reference run of {model} is itself not finite"
                              + (f" (first at {ref.where})" if ref.first_bad else "")
                              + "; no island can fix that: check the weights and the call (prompt, image, steps)")
        return out, ref

    def naive(self, ref_out: Any) -> RunError:
        """Every component in the target dtype; a run that raises (a dtype mismatch) is a result, not a failure."""
        target = self.setting.target
        try:
            with warnings.catch_warnings():
                # all-half also halves the norms a model keeps fp32 itself (Krea 2's `_keep_in_fp32_modules`), whose
                # code then hands them fp32 input: torch's fused-kernel fallback notice is part of this "before" run
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
                out, naive = self.run(f"all {target}", self.setting.layer(target), self.setting.layout)
            return compare(f"all {target} (naive)", ref_out, out, naive.where)
        except Exception as err:
            return RunError(f"all {target} (naive)", False, 1.0, math.nan, math.nan,
                            f"raised {type(err).__name__}: {str(err)[:160]}")

    def verify(self, search: Islands, attempt: int, ref_out: Any) -> tuple[RunError, Recorder]:
        """The target layout with the recipe's islands and the search's (NaN guard off: a finite run is their doing)."""
        s = self.setting
        if self.bar is not None:
            self.bar.total += self.n_steps
            self.bar.refresh()
        got, half = self.run(f"{s.target} + islands" + (f" (round {attempt + 1})" if attempt else ""),
                             s.layer(s.target, search.kept(), search.whole, search.wide), s.layout, compare=True)
        return compare(f"{s.target} + islands", ref_out, got, half.where), half


def _caveats(after: RunError, bound: float, offload: bool, run_on: str, ref_dtype: str) -> list[str]:
    notes = []
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
    return notes
