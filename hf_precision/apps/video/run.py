"""Making clips: one generator for every video family, and the batch loop over the jobs of a run.

:func:`generate_clip` draws the noise from a CPU generator (the same clip on every device), with one progress bar
and each phase's peak memory. Where the recipe's video: block says ``decode_chunks`` (SVD) the noise is drawn in
the denoiser's compute dtype (brycedrennan/imaginAIry#442 drew fp32 beside an fp16 model) and the latents decoded
here, ``decode_chunk_size`` at a time (diffusers#6385: "abnormally high VRAM"). :func:`generate_batch` loads once
and makes every job, split between ``accelerate launch`` processes (``PartialState.split_between_processes``), each
output written by one process; a failed clip is reported and the batch goes on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from ...diagnose.steps import call_params
from ...errors import RecipeError, override_line
from ...runtime.progress import quiet_call, quiet_loading, quiet_progress
from ...units import format_bytes
from .io import Job, read_image, save_video
from .load import MemorySettings, components_by_role, load_video_pipeline
from .memory import PhaseMemory, phase_hooks, weight_bytes

__all__ = ["BatchOptions", "ClipResult", "generate_batch", "generate_clip"]


@dataclasses.dataclass
class ClipResult:
    """Float32 frames ``(frames, height, width, 3)`` in [0, 1], what they cost, and the peak memory of each phase.

    ``decode_seconds`` is None unless the program decoded the frames itself (SVD's chunked decode).
    """

    frames: Any
    seconds: float
    peaks: dict[str, int]
    memory_kind: str
    seconds_per_step: float = float("nan")
    peak_memory: int = 0
    peak_before_decode: int = 0
    run_memory_kind: str = ""
    decode_seconds: float | None = None

    def summary(self) -> str:
        phases = ", ".join(f"{p} {format_bytes(b)}" for p, b in self.peaks.items()) + f" ({self.memory_kind})"
        if self.decode_seconds is None:
            return f"peak memory per phase: {phases}; {self.seconds:.2f} s"
        return (f"peak memory {format_bytes(self.peak_memory)} ({self.run_memory_kind}; "
                f"{format_bytes(self.peak_before_decode)} before decoding); "
                f"{self.seconds_per_step:.3f} s per denoising step; decode {self.decode_seconds:.2f} s\n"
                f"peak memory per phase: {phases}")


def _compute_dtype(pipe: Any, component: str) -> Any:
    import torch

    from ... import dtypes as dt
    from ...runtime import applied

    record = applied(pipe)
    if record is not None and component in record.recipe:
        return dt.to_torch(record.recipe[component].compute)
    module = pipe.components[component]
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def _decode(pipe: Any, latents: Any, chunk: int, memory: PhaseMemory, bar: Any) -> Any:
    """The pipeline's own decode_latents, ``chunk`` frames at a time so the bar can follow it; float32 frames."""
    import torch

    vae = components_by_role(pipe, "vae")[0][1]
    latents = latents.flatten(0, 1) / vae.config.scaling_factor
    accepts = "num_frames" in inspect.signature(vae.forward).parameters
    out = []
    for i in range(0, latents.shape[0], chunk):
        part = latents[i: i + chunk]
        if bar is not None:
            bar.set_postfix_str("decoding")
        decoded = vae.decode(part, **({"num_frames": part.shape[0]} if accepts else {})).sample
        out.append((decoded.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1).cpu())
        del decoded
        memory.sample()
        if bar is not None:
            bar.update(1)
    pipe.maybe_free_model_hooks()
    return torch.cat(out).numpy()


@contextlib.contextmanager
def _each_step(pipe: Any, on_step_end: Callable[..., Any]) -> Iterator[dict[str, Any]]:
    # diffusers' callback_on_step_end where __call__ takes it; the guider pipelines (HunyuanVideo 1.5,
    # pipeline_hunyuan_video1_5.py:544) do not, and passing it raised TypeError. Every pipeline calls
    # scheduler.step once per denoising step, so there the step is counted by wrapping that instead.
    if "callback_on_step_end" in call_params(pipe):
        yield {"callback_on_step_end": on_step_end}
        return
    scheduler, step = pipe.scheduler, pipe.scheduler.step

    def counted(*args: Any, **kwargs: Any) -> Any:
        out = step(*args, **kwargs)
        on_step_end(pipe, None, None, {})
        return out

    scheduler.step = counted
    try:
        yield {}
    finally:
        del scheduler.step  # the class's own method again


def generate_clip(pipe: Any, spec: Any, *, prompt: str | None = None, image: Any = None, height: int, width: int,
                  frames: int | None = None, steps: int, seed: int = 0, guidance_scale: float | None = None,
                  decode_chunk_size: int = 8, bar: Any = None, memory: PhaseMemory | None = None,
                  **extra: Any) -> ClipResult:
    """One clip from any video pipeline, its noise from a CPU generator seeded with ``seed`` (the same clip everywhere).

    ``bar`` (tqdm) advances per denoising step and VAE decoder call (per chunk for SVD); ``memory`` records each
    phase's peak; ``extra`` goes to the call (SVD's ``fps``, ``motion_bucket_id`` ...).

    Example:
        >>> from hf_precision.testing.pipelines import make_svd, example_image
        >>> from hf_precision.apps.video.spec import spec_of
        >>> pipe = make_svd()
        >>> r = generate_clip(pipe, spec_of(pipe), image=example_image(32), height=32, width=32, frames=3, steps=2)
        >>> r.frames.shape, r.frames.dtype, r.peak_memory >= r.peak_before_decode > 0
        ((3, 32, 32, 3), dtype('float32'), True)
    """
    import numpy as np
    import torch

    row = spec.row
    frames = int(frames or spec.defaults["frames"])
    problems = spec.check(height=height, width=width, frames=frames)
    if problems:
        raise RecipeError(problems)
    generator = torch.Generator("cpu").manual_seed(seed)
    kwargs: dict[str, Any] = {"height": height, "width": width, spec.frames_arg: frames, "num_inference_steps": steps,
                              "output_type": "np", **{**spec.extra, **extra}}
    if spec.takes_prompt:
        kwargs["prompt"] = prompt or ""
    if spec.takes_image and (image is not None or not spec.image_optional):
        if image is None:
            raise RecipeError(f"{spec.pipeline} is image-to-video: give --image")
        kwargs["image"] = image
    if guidance_scale is not None and getattr(pipe, "guider", None) is not None \
            and "guidance_scale" not in call_params(pipe):
        # guider pipelines (HunyuanVideo 1.5) take the scale from their guider (pipeline_hunyuan_video1_5.py:766):
        # passed to the call, it raised TypeError
        pipe.guider = pipe.guider.new(guidance_scale=guidance_scale)
    elif guidance_scale is not None:
        kwargs["guidance_scale"] = guidance_scale
    device = pipe._execution_device
    if row.decode_chunks:  # the noise in the denoiser's compute dtype, drawn on the CPU; the frames decoded here
        den = pipe.components[spec.denoiser]
        shape = row.noise_shape(den.config, *spec.latent_shape(height, width, frames))
        kwargs["latents"] = torch.randn(shape, generator=generator, dtype=_compute_dtype(pipe, spec.denoiser)).to(device)
        kwargs["output_type"] = "latent"
    memory = memory or PhaseMemory(device, weights=weight_bytes(pipe))
    timing: dict[str, float] = {}

    def on_step_end(p: Any, i: int, t: Any, kw: dict[str, Any]) -> dict[str, Any]:
        timing["end"] = time.perf_counter()
        memory.sample()
        if bar is not None:
            bar.set_postfix_str("denoising")
            bar.update(1)
        return {}

    def first_step(module: Any, args: Any) -> None:  # a pre-hook that returns None leaves the arguments as they are
        timing.setdefault("start", time.perf_counter())

    handles = [m.register_forward_pre_hook(first_step) for _, m in components_by_role(pipe, "denoiser")]
    start = time.perf_counter()
    decode_seconds = None
    try:
        with torch.no_grad(), quiet_progress(pipe), phase_hooks(pipe, memory, None if row.decode_chunks else bar), \
                _each_step(pipe, on_step_end) as callback:
            out = pipe(**quiet_call(pipe, kwargs), generator=generator, **callback).frames
            if row.decode_chunks:
                decoding = time.perf_counter()
                out = _decode(pipe, out, decode_chunk_size, memory, bar)
                decode_seconds = time.perf_counter() - decoding
    finally:
        for handle in handles:
            handle.remove()
    video = np.asarray(out[0] if isinstance(out, (list, tuple)) or getattr(out, "ndim", 0) == 5 else out,
                       dtype=np.float32)
    per_step = (timing.get("end", 0.0) - timing["start"]) / steps if "start" in timing else float("nan")
    return ClipResult(frames=video, seconds=time.perf_counter() - start, peaks=dict(memory.peaks),
                      memory_kind=memory.kind, seconds_per_step=per_step, peak_memory=memory.run_peak,
                      peak_before_decode=memory.before_decode, run_memory_kind=memory.run_kind,
                      decode_seconds=decode_seconds)


@dataclasses.dataclass(frozen=True)
class BatchOptions:
    """What every clip of a batch shares: sizes, steps and seed, the family's call options, and where it runs.
    ``device``: None (the best present one), a device, or set by the ``device_map="balanced"`` placement.
    ``context_parallel``: GPUs to split each clip's tokens over (every rank makes every clip, the main one writes it).
    """

    height: int
    width: int
    frames: int | None
    steps: int
    seed: int = 0
    fps: int = 7
    guidance_scale: float | None = None
    negative_prompt: str | None = None
    motion_bucket_id: int = 127
    noise_aug_strength: float = 0.02
    decode_chunk_size: int = 8
    device: str | None = None
    layout: str | None = None
    overrides: Any = None
    context_parallel: int | None = None
    device_map: str | None = None
    fail_fast: bool = False
    quiet: bool = False
    single_file: str | None = None  # a single-file checkpoint for the model's denoiser (load_pipeline(file, base=))


def _print(text: str) -> None:
    print(text, flush=True)


def _warn(text: str) -> None:
    # stderr holds only the command's own lines, which say whose they are (as the CLI prints a RecipeError)
    print(f"hf-precision video: {text}", file=sys.stderr, flush=True)


def _want_cpu(device: str | None) -> bool:
    if device is not None:
        return device.split(":")[0].strip().lower() == "cpu"
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    import torch

    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def _one(pipe: Any, spec: Any, job: Job, options: BatchOptions, bar: Any) -> ClipResult:
    image = read_image(job.image) if job.image is not None else None
    extra = {name: getattr(options, name) for name in spec.row.call_options}
    negative = options.negative_prompt if options.negative_prompt is not None else spec.row.negative_prompt
    if negative is not None:  # the recipe's where the pipeline fails without one (EasyAnimate)
        extra["negative_prompt"] = negative
    return generate_clip(pipe, spec, prompt=job.prompt, image=image, height=options.height, width=options.width,
                         frames=options.frames, steps=options.steps, seed=options.seed,
                         guidance_scale=options.guidance_scale, decode_chunk_size=options.decode_chunk_size,
                         bar=bar, **extra)


def _placement(model: str, spec: Any, options: BatchOptions, say: Callable[[str], None]) -> dict[str, str]:
    """The component -> device mapping of ``device_map="balanced"``, said before anything is loaded."""
    from . import devices

    placement = devices.plan_placement(model, spec, devices.device_rooms(), layout=options.layout,
                                       overrides=options.overrides)
    say(placement.describe())
    return placement.mapping()


def generate_batch(model: str, spec: Any, jobs: Sequence[Job], options: BatchOptions, *,
                   settings: Callable[[str], MemorySettings] | None = None, say: Callable[[str], None] = _print,
                   warn: Callable[[str], None] = _warn) -> int:
    """Make every job with one pipeline; returns 0, or 1 when a clip failed or an output is missing. ``settings(device)``
    gives the memory settings once the device is known; ``say`` and ``warn`` get progress lines and errors
    (``[process i/n]`` in front under several processes).

    Example:
        >>> import tempfile; from pathlib import Path
        >>> from hf_precision.testing.pipelines import make_svd, save_pipeline, example_image
        >>> from hf_precision.apps.video.spec import model_spec
        >>> d = Path(tempfile.mkdtemp()); example_image(32).save(d / "cat.png")
        >>> where, spec = model_spec(str(save_pipeline(make_svd(), d / "svd")))
        >>> jobs = [Job(d / "cat.png", d / "cat.gif", "gif")]
        >>> generate_batch(where, spec, jobs, BatchOptions(32, 32, 3, 2, device="cpu", quiet=True), say=lambda s: None)
        0
    """
    from accelerate import PartialState

    cpu = _want_cpu(options.device)
    # cpu=True is what makes PartialState see a CPU run started by torchrun/accelerate as MULTI_CPU (gloo).
    state = PartialState(cpu=cpu)
    distributed = state.num_processes > 1
    device = options.device
    if distributed:
        device = "cpu" if cpu else str(state.device)  # each process its own GPU
    elif device is None and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        device = "cpu"  # `accelerate launch --cpu`
    tag = f"[process {state.process_index}/{state.num_processes}] " if distributed else ""
    tell: Callable[[str], None] = lambda text: say(f"{tag}{text}")
    complain: Callable[[str], None] = lambda text: warn(f"{tag}{text}")
    parallel = options.context_parallel
    if parallel:  # before loading: one clear error on a CPU or for a transformer diffusers cannot split
        from . import parallel as cp

        cp.check_context_parallel(parallel, transformer_class=cp.denoiser_class(model, spec),
                                  device_type="cpu" if cpu else "cuda", world_size=state.num_processes)
        mine = list(jobs)  # every rank runs every clip on its share of the tokens
    else:
        with state.split_between_processes(list(jobs)) as mine:
            mine = list(mine)  # accelerate's split: contiguous, uneven counts allowed, no job twice
    failed: list[str] = []
    if options.device_map:
        if distributed:
            raise RecipeError("--device-map balanced spreads one model over this process's GPUs; under accelerate "
                              "launch/torchrun each process has its own GPU: start one process")
        device = _placement(model, spec, options, say)
    if mine:
        failed = _run_jobs(model, spec, mine, device, options, settings, state, say, tell, complain)
    state.wait_for_everyone()
    if failed:
        warn(f"{tag}error: {len(failed)} clip(s) failed: {', '.join(failed)}")
    if state.is_main_process:
        missing = [str(j.out) for j in jobs if not j.out.exists()]
        if missing:
            warn(f"error: {len(missing)} output(s) missing: {', '.join(missing)}")
            return 1
        if len(jobs) > 1 or distributed:
            tell(f"done: {len(jobs)} video(s) from {state.num_processes} process(es) in {jobs[0].out.parent}")
    return 1 if failed else 0


def _run_jobs(model: str, spec: Any, mine: list[Job], device: Any, options: BatchOptions,
              settings: Callable[[str], MemorySettings] | None, state: Any, say: Callable[[str], None],
              tell: Callable[[str], None], complain: Callable[[str], None]) -> list[str]:
    """Load the pipeline once and make this process's jobs; returns the outputs that failed, each cause sent to
    ``complain`` (stderr), so a script reading it sees why.
    """
    from tqdm import tqdm

    import numpy as np

    from ...diagnose.call import steps_problem
    from ...recipe.devices import device_profile
    from ...runtime import applied as applied_record

    parallel = options.context_parallel
    failed: list[str] = []
    # the device a run without --device uses: the best present one
    asked = settings(device or str(device_profile(None).torch_device())) if settings is not None else MemorySettings()
    chosen = spec.required(asked)
    if chosen is not asked:
        say(f"VAE tiling: on ({spec.pipeline}'s VAE only decodes tiled)")
    extra = {"layout": options.layout} if options.layout else {}  # unset: the offload branch resolves for the device
    with quiet_loading(options.quiet):
        pipe = load_video_pipeline(model, device, overrides=options.overrides, settings=chosen,
                                   single_file=options.single_file, **extra)
    if parallel:
        from . import parallel as cp

        cp.enable_context_parallel(pipe, parallel)
    problem = steps_problem(pipe, options.steps)  # before any clip: every clip would fail the same way
    if problem:
        raise RecipeError(problem)
    applied = applied_record(pipe)
    plans = ", ".join(f"{p.name} {p.compute}" for p in applied.recipe.policies if p.name in applied.devices)
    tell(f"{applied.recipe.name} recipe for {applied.recipe.device.label()}: {plans}; {chosen.label()}")
    chunks = -(-(options.frames or 0) // options.decode_chunk_size) if spec.row.decode_chunks else 0
    bar = tqdm(total=(options.steps + chunks) * len(mine), unit="step", leave=False,
               disable=options.quiet or not state.is_local_main_process)
    # Under --context-parallel every rank makes every clip; the main process alone writes it and says so.
    writes = not parallel or state.is_main_process
    with bar:
        for n, job in enumerate(mine, 1):
            bar.set_description(f"video {n}/{len(mine)}")
            try:
                result = _one(pipe, spec, job, options, bar)
                if not np.isfinite(result.frames).all():
                    raise RecipeError(f"the frames hold inf/NaN (an fp16 overflow the recipe did not catch); try "
                                      f"{override_line(spec.denoiser, 'dtype', 'float32')} and report the model")
                if writes:
                    save_video(result.frames, job.out, fps=options.fps, format=job.format)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as err:  # one bad clip must not end the batch: report it and go on
                if options.fail_fast:
                    raise
                failed.append(str(job.out))
                complain(f"error: {job.out} ({job.name}) failed: {type(err).__name__}: {err}")
                continue
            f, h, w, _ = result.frames.shape
            if writes:
                tell(f"wrote {job.out} ({f} frames, {w}x{h}, {job.format})")
            if options.frames and f != options.frames:  # FramePack makes whole sections of its window, whatever asked
                tell(f"note: {spec.pipeline} made {f} frames, not the asked {options.frames}: the pipeline chooses "
                     f"its frame count itself")
            tell(result.summary())
    return failed
