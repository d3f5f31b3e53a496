"""Image-to-video with Stable Video Diffusion through :func:`hf_precision.load_pipeline`.

``scripts/generate_video.py`` and ``hf-precision video`` are thin fronts over :func:`main` / :func:`run`. The
svd recipe decides the dtypes per device (fp16 on CUDA, fp16 with fp32 attention on recent macOS, float32 or
bfloat16 on CPU as ``recipes/devices.yaml`` says). What this module adds on top of the pipeline:

* noise is drawn in the UNet's compute dtype from a CPU generator (brycedrennan/imaginAIry#442 drew fp32 noise
  next to an fp16 model; a CPU generator gives the same video on every device);
* the pipeline stops at the latents and the frames are decoded here, ``--decode-chunk-size`` frames at a time, so
  the decode peak is bounded (diffusers#6385: "abnormally high VRAM") and one progress bar covers denoising and
  decoding; frames come back as float32 for saving;
* outputs are written to a temporary file next to the target and renamed, so a failed or interrupted run never
  leaves half a video behind; under ``accelerate launch`` the images are split between processes with
  accelerate's own ``PartialState.split_between_processes`` and every output is written by exactly one process.

Nothing heavy is imported at module import time: torch, diffusers, accelerate and imageio are imported inside the
functions that need them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import RecipeError
from ..runtime.memory import proc_bytes
from .outputs import check_output, written_atomically

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "FORMATS", "Job", "MemorySettings", "VideoResult", "apply_memory_settings", "check_out", "generate_video",
    "load_video_pipeline", "model_class", "model_spec", "plan_outputs", "read_image", "read_prompts", "save_video",
]

SVD_CLASS = "StableVideoDiffusionPipeline"
FORMATS = ("mp4", "gif", "png")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
OFFLOAD = ("none", "model", "group", "sequential")
# The demo model (a tiny SVD) is tiny and uses its own defaults; models use their family's (video_families.py).
DEMO_DEFAULTS = {"height": 64, "width": 64, "frames": 8, "steps": 4, "decode_chunk_size": 4}


# --------------------------------------------------------------------------------------------- arguments


# --------------------------------------------------------------------------------------------- validation


@dataclasses.dataclass(frozen=True)
class Job:
    """One video to make: its prompt and/or input image, and where it goes."""

    image: Path | None
    out: Path
    format: str
    prompt: str | None = None

    @property
    def name(self) -> str:
        return self.image.name if self.image is not None else (self.prompt or "")[:40]


def read_image(path: Path) -> Any:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError) as err:
        raise RecipeError(f"--image {path}: cannot read it as an image ({type(err).__name__}: {err})") from None


def _list_images(image: str) -> tuple[list[Path], bool]:
    path = Path(image).expanduser()
    if path.is_file():
        return [path], False
    if path.is_dir():
        images = sorted(p for p in path.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)
        if not images:
            raise RecipeError(f"--image {path}: the folder holds no images ({', '.join(IMAGE_SUFFIXES)})")
        return images, True
    raise RecipeError(f"--image {path}: no such file or folder")


def read_prompts(path: str) -> list[str]:
    """The prompts of a ``--prompts`` file: one per line; blank lines and lines starting with ``#`` are skipped."""
    file = Path(path).expanduser()
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise RecipeError(f"--prompts {path}: cannot read it as UTF-8 text ({type(err).__name__}: {err})") from None
    prompts = [line.strip() for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    if not prompts:
        raise RecipeError(f"--prompts {path}: no prompts (one per line; # starts a comment)")
    return prompts


def _format_of(out: Path) -> str | None:
    suffix = out.suffix.lower()
    if suffix == "":
        return "png"
    if suffix in (".mp4", ".gif"):
        return suffix[1:]
    return None


def _slug(text: str, limit: int = 40) -> str:
    words = "".join(c.lower() if c.isalnum() else " " for c in text).split()
    return "-".join(words)[:limit].strip("-") or "video"


def plan_outputs(image: str | None, out: str, fmt: str | None = None, *, prompts: Sequence[str] | None = None,
                 existing: str = "error") -> list[Job]:
    """The jobs for ``--image``/``--prompt(s)``/``--out``/``--format``, checked before any model is loaded.

    Inputs: an image file or folder (image-to-video; with one prompt it goes with every image, with a prompt list
    the i-th prompt goes with the i-th image in name order), or prompts alone (text-to-video: one video per prompt,
    ``OUT/000-<words of the prompt>.mp4``). Every image is opened once here, so an unreadable image fails before
    anything is loaded or written. ``existing``: what to do with outputs that are already there: ``"error"`` (one
    RecipeError naming them, the default), ``"skip"`` (drop those jobs) or ``"overwrite"``.

    Example:
        >>> import tempfile; from PIL import Image
        >>> d = Path(tempfile.mkdtemp()); Image.new("RGB", (8, 8)).save(d / "cat.png")
        >>> [(j.out.name, j.format) for j in plan_outputs(str(d), str(d / "videos"), "gif")]
        [('cat.gif', 'gif')]
        >>> [j.out.name for j in plan_outputs(None, str(d / "clips"), prompts=["A cat.", "A dog!"])]
        ['000-a-cat.mp4', '001-a-dog.mp4']
    """
    if existing not in ("error", "skip", "overwrite"):
        raise RecipeError(f"existing={existing!r}: use error, skip or overwrite")
    prompts = list(prompts or [])
    target = Path(out).expanduser()
    if image is None:
        if not prompts:
            raise RecipeError("nothing to do: give --prompt TEXT, --prompts FILE (one per line) or --image")
        jobs = _prompt_jobs(prompts, target, out, fmt)
    else:
        jobs = _image_jobs(image, target, out, fmt)
        if len(prompts) > 1 and len(prompts) != len(jobs):
            raise RecipeError(f"--prompts has {len(prompts)} prompts but --image {image} holds {len(jobs)} images; "
                              f"give one prompt for all images, or one line per image (in name order)")
        jobs = [dataclasses.replace(j, prompt=prompts[i] if len(prompts) > 1 else (prompts[0] if prompts else None))
                for i, j in enumerate(jobs)]
    for job in jobs:
        check_output(job.out, folder=job.format == "png")
        if job.format == "png":
            _check_frame_folder(job.out)
        elif job.out.is_dir():
            raise RecipeError(f"--out: {job.out} is a folder; cannot write a {job.format} file there")
        if job.image is not None:
            read_image(job.image)
    there = [j for j in jobs if j.out.exists()]
    if there and existing == "error":
        names = ", ".join(str(j.out) for j in there[:5]) + (f" and {len(there) - 5} more" if len(there) > 5 else "")
        raise RecipeError(f"--out: {len(there)} output(s) exist already: {names}; add --skip-existing to make only the "
                          f"missing ones, or --overwrite to replace them")
    if existing == "skip":
        jobs = [j for j in jobs if not j.out.exists()]
    return jobs


def _prompt_jobs(prompts: list[str], target: Path, out: str, fmt: str | None) -> list[Job]:
    if len(prompts) == 1 and _format_of(target) in ("mp4", "gif"):
        if fmt is not None and fmt != _format_of(target):
            raise RecipeError(f"--out {out} is a {_format_of(target)} output but --format is {fmt}; drop --format or "
                              f"change the suffix")
        return [Job(None, target, str(_format_of(target)), prompts[0])]
    if _format_of(target) is None or _format_of(target) in ("mp4", "gif"):
        raise RecipeError(f"--out {out}: with {len(prompts)} prompts --out is a folder (one video per prompt); choose "
                          f"the format with --format {'|'.join(FORMATS)}")
    if target.exists() and not target.is_dir():
        raise RecipeError(f"--out {out}: exists and is not a folder")
    fmt = fmt or "mp4"
    digits = max(3, len(str(len(prompts) - 1)))
    names = [f"{i:0{digits}d}-{_slug(p)}" for i, p in enumerate(prompts)]
    return [Job(None, target / (n if fmt == "png" else f"{n}.{fmt}"), fmt, p) for n, p in zip(names, prompts)]


def _image_jobs(image: str, target: Path, out: str, fmt: str | None) -> list[Job]:
    images, folder = _list_images(image)
    if folder:
        if _format_of(target) in ("mp4", "gif"):
            raise RecipeError(f"--out {out}: with a folder of images --out is a folder (one video per image); choose "
                              f"the format with --format {'|'.join(FORMATS)}")
        check_output(target, folder=True)
        fmt = fmt or "mp4"
        stems: dict[str, Path] = {}
        for img in images:
            if img.stem in stems:
                raise RecipeError(f"--image {image}: {stems[img.stem].name} and {img.name} would both write "
                                  f"{img.stem}.{fmt}; rename one")
            stems[img.stem] = img
        return [Job(img, target / (img.stem if fmt == "png" else f"{img.stem}.{fmt}"), fmt) for img in images]
    return [Job(images[0], check_out(out, fmt), str(_format_of(target)))]


def check_out(out: str, fmt: str | None = None) -> Path:
    """Check ``--out`` for one video before anything else runs (``--demo`` builds its model first).

    Example:
        >>> import tempfile
        >>> check_out(str(Path(tempfile.mkdtemp()) / "cat.avi"))  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --out .../cat.avi: unknown output type '.avi'; use .mp4, .gif, or a folder ...
    """
    target = Path(out).expanduser()
    from_suffix = _format_of(target)
    if from_suffix is None:
        raise RecipeError(f"--out {out}: unknown output type {target.suffix!r}; use .mp4, .gif, or a folder "
                          f"name without suffix for PNG frames")
    if fmt is not None and fmt != from_suffix:
        raise RecipeError(f"--out {out} is a{'n' if from_suffix == 'mp4' else ''} {from_suffix} output but "
                          f"--format is {fmt}; drop --format or change the suffix")
    check_output(target, folder=from_suffix == "png")
    if from_suffix == "png":
        _check_frame_folder(target)
    return target


def _check_frame_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(not (p.name.startswith("frame_") and p.suffix == ".png")
                                                       for p in folder.iterdir())):
        raise RecipeError(f"--out {folder}: exists and is not a folder of frame_*.png files; choose a new folder "
                          f"(it would be replaced)")


def model_spec(model: str, configs_only: bool = False) -> tuple[str, Any]:
    """Where a video model is and its :class:`~hf_precision.apps.video_families.VideoSpec` (mode, frame and size
    rules), read from ``model_index.json`` and the component configs; nothing is loaded.

    With ``configs_only`` (``--plan``) the configs shipped in ``hf_precision/model_configs`` also count (``svd``,
    ``stabilityai/stable-video-diffusion-img2vid-xt``), as for :func:`hf_precision.plan`.

    Raises:
        RecipeError: no such model, or not a video pipeline.
    """
    from ..runtime.source import component_configs, configs_of, locate
    from .video_families import video_spec

    if configs_only:
        where = model
        _, index, configs = configs_of(model)
    else:
        where, index, folder = locate(model)
        configs = component_configs(where, index, folder)
    cls = str(index.get("_class_name"))
    try:
        spec = video_spec(cls, index, configs)
    except RecipeError as err:
        raise RecipeError(f"--model {model}: {err}") from None
    return where, spec


def model_class(model: str) -> str:
    """Where a video model is (folder or Hub id), after checking that ``model_index.json`` names a video pipeline."""
    return model_spec(model)[0]


# --------------------------------------------------------------------------------------------- loading


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """The diffusers memory features a run uses; :mod:`hf_precision.apps.video_plan` chooses them for a budget."""

    offload: str = "none"
    vae_tiling: bool = False
    vae_slicing: bool = False
    forward_chunking: bool = False
    decode_chunk_size: int | None = None
    # (component, storage) pairs: quantized or fp8 storage the memory plan chose (loaded as storage overrides)
    quantize: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        parts = [f"offload {self.offload}"]
        parts += [f"{c} {s}" for c, s in self.quantize]
        parts += [name for name, on in (("VAE tiling", self.vae_tiling), ("VAE slicing", self.vae_slicing),
                                        ("feed-forward chunking", self.forward_chunking)) if on]
        if self.decode_chunk_size:
            parts.append(f"decode chunk {self.decode_chunk_size}")
        return ", ".join(parts)


def apply_memory_settings(pipe: Any, settings: MemorySettings, device: Any) -> None:
    """Turn on the diffusers memory features of ``settings`` on a pipeline loaded on the CPU or on ``device``.

    Offload hooks come from diffusers/accelerate (``enable_model_cpu_offload``, ``enable_group_offload`` with CUDA
    streams where there are streams, ``enable_sequential_cpu_offload``); they move weights as they are, so the
    recipe's dtypes and fp32 islands stay as applied.
    """
    import torch

    dev = torch.device(device)
    if settings.offload == "model":
        pipe.enable_model_cpu_offload(device=dev)
    elif settings.offload == "group":
        pipe.enable_group_offload(onload_device=dev, offload_device=torch.device("cpu"), offload_type="leaf_level",
                                  use_stream=dev.type == "cuda")
    elif settings.offload == "sequential":
        pipe.enable_sequential_cpu_offload(device=dev)
    vae = getattr(pipe, "vae", None)
    if settings.vae_tiling and hasattr(vae, "enable_tiling"):
        vae.enable_tiling()
    if settings.vae_slicing and hasattr(vae, "enable_slicing"):
        vae.enable_slicing()
    denoiser = getattr(pipe, "unet", None) or getattr(pipe, "transformer", None)
    if settings.forward_chunking:
        if not hasattr(denoiser, "enable_forward_chunking"):
            raise RecipeError(f"--forward-chunking: {type(denoiser).__name__} has no enable_forward_chunking in "
                              f"diffusers; drop the option")
        denoiser.enable_forward_chunking()


def load_video_pipeline(model: str, device: Any = None, *, overrides: Any = None, offload: str = "none",
                        forward_chunking: bool = False, settings: MemorySettings | None = None,
                        **kwargs: Any) -> Any:
    """Load a video pipeline (SVD, Wan, LTX-Video, CogVideoX, HunyuanVideo, ...) with its recipe for ``device``.

    The pipeline class comes from ``model_index.json`` and the recipe from the class (``load_pipeline``). With an
    offload mode the recipe is resolved for ``device`` (fp16 on a T4) but the weights are loaded on the CPU and moved
    by diffusers' offload hooks, so a GPU too small for the whole pipeline never holds it at once. ``device`` may also
    be a mapping component -> device (``--device-map balanced``, :mod:`hf_precision.apps.video_devices`): each
    component then gets the dtypes of its own device, without offload.

    Raises:
        RecipeError: not a video pipeline, unknown device, bad overrides, sequential offload on CPU.
    """
    from ..recipe.devices import device_profile
    from ..runtime.apply import torch_device
    from ..runtime.load import load_pipeline

    settings = settings or MemorySettings(offload=offload, forward_chunking=forward_chunking)
    if settings.offload not in OFFLOAD:
        raise RecipeError(f"offload={settings.offload!r}: use one of {', '.join(OFFLOAD)}")
    where = model_class(model)
    layers = overrides if isinstance(overrides, (list, tuple)) else ([overrides] if overrides is not None else [])
    if settings.quantize:  # the storage the memory plan chose: the same as --set C.storage=...
        from ..recipe.overrides import Override

        layers = [*layers, Override("memory plan (--max-memory)",
                                    {"components": {c: {"storage": s} for c, s in settings.quantize}})]
    if isinstance(device, Mapping):  # a device per component (--device-map balanced): each resolved for its own
        if settings.offload != "none":
            raise RecipeError(f"offload {settings.offload} with a device per component: offload moves every "
                              f"component onto one device; use one or the other")
        pipe = load_pipeline(where, dict(device), overrides=list(layers) or None, **kwargs)
        apply_memory_settings(pipe, settings, pipe._execution_device)
        return pipe
    dev = torch_device(device if device is not None else device_profile(None).torch_device(), "--device")
    if settings.offload == "none":
        pipe = load_pipeline(where, str(dev), overrides=list(layers) or None, **kwargs)
    else:
        if dev.type == "cpu" and settings.offload == "sequential":
            raise RecipeError("--offload sequential needs an accelerator (cuda, xpu, mps): it streams weights from "
                              "the CPU to one, and on a CPU there is nowhere to stream them to (accelerate's "
                              "sequential hooks also fail there). Use --offload none, model or group")
        # Resolved for the accelerator, loaded on the CPU: the offload hooks move each component when it runs.
        kwargs.setdefault("layout", str(dev))
        pipe = load_pipeline(where, "cpu", overrides=list(layers) or None, **kwargs)
    apply_memory_settings(pipe, settings, dev)
    return pipe


# --------------------------------------------------------------------------------------------- generation


@dataclasses.dataclass
class VideoResult:
    """Frames as float32 ``(frames, height, width, 3)`` in [0, 1], and what it cost."""

    frames: np.ndarray
    seconds_per_step: float
    decode_seconds: float
    peak_memory: int
    peak_before_decode: int
    memory_kind: str

    def summary(self) -> str:
        return (f"peak memory {self.peak_memory / 2**20:.1f} MiB ({self.memory_kind}; "
                f"{self.peak_before_decode / 2**20:.1f} MiB before decoding); "
                f"{self.seconds_per_step:.3f} s per denoising step; decode {self.decode_seconds:.2f} s")


class _Memory:
    """Peak memory of the device the pipeline runs on (CUDA/XPU allocator peak, MPS driver, else process RSS)."""

    def __init__(self, device: Any):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.mps_peak = 0
        self.cpu_peak = 0
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.device.type == "xpu" and hasattr(torch, "xpu"):
            torch.xpu.reset_peak_memory_stats(self.device)

    def sample(self) -> None:
        if self.device.type == "mps":
            self.mps_peak = max(self.mps_peak, int(self.torch.mps.driver_allocated_memory()))

    def peak(self) -> tuple[int, str]:
        torch = self.torch
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device)), f"torch.cuda.max_memory_allocated on {self.device}"
        if self.device.type == "xpu":
            return int(torch.xpu.max_memory_allocated(self.device)), f"torch.xpu.max_memory_allocated on {self.device}"
        if self.device.type == "mps":
            self.sample()
            return self.mps_peak, "torch.mps.driver_allocated_memory, sampled per step and chunk"
        # The per-phase figures reset the process's high-water mark (video_run.PhaseMemory clears VmHWM at each
        # phase), so the peak of the run is the largest figure read so far, never only the last one.
        self.cpu_peak = max(self.cpu_peak, peak_rss())
        return self.cpu_peak, "peak RSS of the process"


def peak_rss() -> int:
    """The process's peak resident set size in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status`` (the high-water mark of this process image; ``ru_maxrss`` would also count
    the parent's pages a forked child had before ``exec``). macOS: ``ru_maxrss`` (bytes there). Windows: psutil's peak
    working set.
    """
    peak = proc_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss if sys.platform == "darwin" else rss * 1024)


def _execution_device(pipe: Any) -> Any:
    return pipe._execution_device


def _compute_dtype(pipe: Any, component: str) -> Any:
    import torch

    from .. import dtypes as dt

    from ..runtime import applied

    record = applied(pipe)
    if record is not None and component in record.recipe:
        return dt.to_torch(record.recipe[component].compute)
    module = getattr(pipe, component)
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def generate_video(pipe: Any, image: Any, *, height: int, width: int, frames: int | None = None, steps: int = 25,
                   fps: int = 7, motion_bucket_id: int = 127, noise_aug_strength: float = 0.02,
                   decode_chunk_size: int = 8, seed: int = 0, progress: bool = True, desc: str = "",
                   bar: Any = None) -> VideoResult:
    """Generate one video from ``image`` (a PIL image) with an SVD ``pipe`` loaded by :func:`load_video_pipeline`.

    The noise is drawn from a CPU generator seeded with ``seed`` in the UNet's compute dtype; the pipeline returns
    latents and they are decoded here ``decode_chunk_size`` frames at a time; one progress bar counts the denoising
    steps and the decode chunks.

    Returns:
        `VideoResult`: float32 frames ``(frames, height, width, 3)`` in [0, 1], seconds per denoising step, decode
        time and the device's peak memory.

    Example:
        >>> from hf_precision.testing.pipelines import make_svd, example_image
        >>> from hf_precision import apply_recipe
        >>> pipe = make_svd(); _ = apply_recipe(pipe, device="cpu")
        >>> r = generate_video(pipe, example_image(32), height=32, width=32, frames=3, steps=2, progress=False)
        >>> r.frames.shape, r.frames.dtype
        ((3, 32, 32, 3), dtype('float32'))
    """
    import inspect

    import torch
    from tqdm import tqdm

    if height <= 0 or width <= 0 or height % 8 or width % 8:
        raise RecipeError(f"height {height} x width {width}: both must be positive multiples of 8")
    frames = int(frames or pipe.unet.config.num_frames)
    if min(frames, steps, decode_chunk_size, fps) < 1:
        raise RecipeError("frames, steps, decode_chunk_size and fps must all be at least 1")
    device = _execution_device(pipe)
    memory = _Memory(device)
    scale = pipe.vae_scale_factor
    shape = (1, frames, pipe.unet.config.in_channels // 2, height // scale, width // scale)
    generator = torch.Generator("cpu").manual_seed(seed)
    # Noise in the UNet's compute dtype (brycedrennan/imaginAIry#442 drew fp32 noise for an fp16 model); drawn on
    # the CPU so the same seed gives the same video on CUDA, MPS and CPU.
    latents = torch.randn(shape, generator=generator, dtype=_compute_dtype(pipe, "unet")).to(device)
    chunks = -(-frames // decode_chunk_size)
    timing: dict[str, float] = {}

    def first_step(module: Any, args: Any) -> None:
        timing.setdefault("start", time.perf_counter())

    own_bar = bar is None  # the batch's bar when the caller has one: steps, decode chunks and items on one bar
    if own_bar:
        bar = tqdm(total=steps + chunks, desc=desc or "video", unit="step", disable=not progress, leave=False)
    bar.set_postfix_str("denoising")

    def on_step_end(p: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        timing["end"] = time.perf_counter()
        memory.sample()
        bar.update(1)
        return {}

    bar_config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    handle = pipe.unet.register_forward_pre_hook(first_step)
    try:
        with (bar if own_bar else contextlib.nullcontext()), torch.no_grad():
            latents = pipe(image, height=height, width=width, num_frames=frames, num_inference_steps=steps, fps=fps,
                           motion_bucket_id=motion_bucket_id, noise_aug_strength=noise_aug_strength,
                           generator=generator, latents=latents, output_type="latent",
                           callback_on_step_end=on_step_end).frames
            before_decode, _ = memory.peak()
            # The pipeline's own decode_latents, chunked here so the bar can follow it.
            start = time.perf_counter()
            latents = latents.flatten(0, 1) / pipe.vae.config.scaling_factor
            accepts = "num_frames" in inspect.signature(pipe.vae.forward).parameters
            out = []
            for i in range(0, latents.shape[0], decode_chunk_size):
                chunk = latents[i: i + decode_chunk_size]
                bar.set_postfix_str("decoding")
                decoded = pipe.vae.decode(chunk, **({"num_frames": chunk.shape[0]} if accepts else {})).sample
                decoded = (decoded.float() / 2 + 0.5).clamp(0, 1).permute(0, 2, 3, 1)
                out.append(decoded.cpu())
                del decoded
                memory.sample()
                bar.update(1)
            pipe.maybe_free_model_hooks()
            decode_seconds = time.perf_counter() - start
    finally:
        handle.remove()
        pipe._progress_bar_config = bar_config
    video = torch.cat(out).numpy()
    per_step = (timing.get("end", 0.0) - timing.get("start", 0.0)) / steps if "start" in timing else float("nan")
    peak, kind = memory.peak()
    return VideoResult(frames=video, seconds_per_step=per_step, decode_seconds=decode_seconds, peak_memory=peak,
                       peak_before_decode=before_decode, memory_kind=kind)


# --------------------------------------------------------------------------------------------- saving




def _to_uint8(frames: np.ndarray) -> np.ndarray:
    import numpy as np

    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        frames = (np.clip(frames.astype(np.float32), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise RecipeError(f"frames must be (frames, height, width, 3), got shape {tuple(frames.shape)}")
    return frames


def save_video(frames: np.ndarray, out: str | os.PathLike[str], fps: int = 7, format: str | None = None) -> Path:
    """Write frames (float in [0, 1] or uint8, ``(frames, height, width, 3)``) as mp4, gif or a PNG folder.

    The format comes from ``format`` or the suffix (``.mp4``, ``.gif``, none = folder of ``frame_000.png``...). The
    file is written under a temporary name in the same folder and renamed, so ``out`` is either complete or absent.
    MP4 is H.264 in yuv420p through imageio-ffmpeg, which needs even sizes: odd sizes are refused.
    """
    target = Path(out)
    fmt = format or _format_of(target)
    if fmt not in FORMATS:
        raise RecipeError(f"{target}: unknown output type; use .mp4, .gif or a folder for PNG frames")
    data = _to_uint8(frames)
    n, h, w, _ = data.shape
    if fmt == "mp4":
        if h % 2 or w % 2:
            raise RecipeError(f"{target}: H.264 in yuv420p needs an even width and height, got {w}x{h}; use .gif or PNG frames")
        import imageio.v2 as imageio

        with written_atomically(target, folder=False) as tmp:
            writer = imageio.get_writer(str(tmp), format="FFMPEG", mode="I", fps=fps, codec="libx264",
                                        pixelformat="yuv420p", macro_block_size=1, quality=8, ffmpeg_log_level="error")
            try:
                for frame in data:
                    writer.append_data(frame)
            finally:
                writer.close()
    elif fmt == "gif":
        from PIL import Image

        images = [Image.fromarray(frame) for frame in data]
        with written_atomically(target, folder=False) as tmp:
            images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)),
                           loop=0)
    else:
        from PIL import Image

        digits = max(3, len(str(n - 1)))
        with written_atomically(target, folder=True) as tmp:
            for i, frame in enumerate(data):
                Image.fromarray(frame).save(tmp / f"frame_{i:0{digits}d}.png")
    return target


# --------------------------------------------------------------------------------------------- the command


