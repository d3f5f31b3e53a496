"""Image-to-video with Stable Video Diffusion through :func:`hf_precision.load_pipeline`.

``scripts/generate_video.py`` and ``hf-precision video`` are thin fronts over :func:`main` / :func:`run`. The
svd recipe decides the dtypes per device (fp16 on CUDA, fp16 with fp32 attention on recent macOS, float32 or
bfloat16 on CPU as ``recipes/devices.yaml`` says). What this module adds on top of the pipeline:

* noise is drawn in the UNet's compute dtype from a CPU generator (imaginAIry#442 drew fp32 noise next to an fp16
  model; a CPU generator gives the same video on every device);
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
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .errors import RecipeError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "FORMATS", "VideoResult", "add_arguments", "build_parser", "generate_video", "load_video_pipeline", "main",
    "plan_outputs", "run", "save_video",
]

SVD_CLASS = "StableVideoDiffusionPipeline"
FORMATS = ("mp4", "gif", "png")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
OFFLOAD = ("none", "model", "sequential")
# SVD's training resolution and the diffusers defaults; the demo model is tiny and uses its own defaults.
DEFAULTS = {"height": 576, "width": 1024, "frames": None, "steps": 25, "decode_chunk_size": 8}
DEMO_DEFAULTS = {"height": 64, "width": 64, "frames": 8, "steps": 4, "decode_chunk_size": 4}

USAGE = """examples:
  %(prog)s --demo --out demo.mp4                      # offline: a tiny random SVD built here
  %(prog)s --model ./stable-video-diffusion-img2vid-xt --image cat.png --out cat.mp4
  %(prog)s --image cat.png --out cat.gif --frames 14 --decode-chunk-size 2 --offload model
  %(prog)s --image photos/ --out videos/ --format gif  # one videos/<stem>.gif per image
  accelerate launch --multi_gpu --num_processes 2 scripts/generate_video.py --image photos/ --out videos/
      (no GPU: N CPU processes over gloo; add --device cpu to stay on CPU on a GPU machine. accelerate 1.15's
       `launch --cpu` starts a single process: see docs/video.md)

outputs:
  --image FILE:   --out x.mp4 (H.264, yuv420p), --out x.gif, or --out DIR (no suffix): DIR/frame_000.png ...
  --image FOLDER: --out is a folder; each image IMG.* gives OUT/IMG.mp4, OUT/IMG.gif or OUT/IMG/frame_000.png
                  (--format, default mp4). Two images with the same stem are refused.
  Existing outputs are replaced; a folder is only replaced if it holds nothing but frame_*.png files.
  Bad input (missing or unreadable image, a model that is not SVD, impossible sizes) exits with code 2 before
  anything is written.
"""


# --------------------------------------------------------------------------------------------- arguments


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``scripts/generate_video.py`` and ``hf-precision video`` (one definition for both)."""
    from .cli import _add_recipe_args

    if p.epilog is None:  # the subcommand parser of `hf-precision video` gets the same examples and output rules
        p.epilog = USAGE
        p.formatter_class = argparse.RawDescriptionHelpFormatter
    p.add_argument("--model", default=None,
                   help="local diffusers SVD folder or Hub id (default: svd = stabilityai/stable-video-diffusion-img2vid-xt)")
    p.add_argument("--image", default=None, help="input image file, or a folder of images (png, jpg, webp, bmp, tif)")
    p.add_argument("--out", default=None,
                   help="output: FILE.mp4, FILE.gif or a folder of PNG frames for one image; a folder for a folder of "
                        "images (see 'outputs' below). Default with --demo: demo.mp4")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format for a folder of images (default mp4); for one image it must agree with --out")
    p.add_argument("--height", type=int, default=None, help="frame height in pixels, a multiple of 8 (default 576)")
    p.add_argument("--width", type=int, default=None, help="frame width in pixels, a multiple of 8 (default 1024)")
    p.add_argument("--frames", type=int, default=None,
                   help="number of frames (default: the model's num_frames, 14 for SVD, 25 for SVD-xt)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default 25)")
    p.add_argument("--fps", type=int, default=7, help="frames per second: the video's rate and SVD's fps conditioning (default 7)")
    p.add_argument("--motion-bucket-id", type=int, default=127, help="more motion with higher values (default 127)")
    p.add_argument("--noise-aug-strength", type=float, default=0.02,
                   help="noise added to the conditioning image; more gives more motion, less likeness (default 0.02)")
    p.add_argument("--decode-chunk-size", type=int, default=None,
                   help="frames decoded at once (default 8); 1-2 on 8 GB GPUs: the decode peak grows with it")
    p.add_argument("--offload", choices=OFFLOAD, default="none",
                   help="model: one component at a time on the accelerator (enable_model_cpu_offload); sequential: "
                        "one layer at a time (slowest, least memory; accelerators only)")
    p.add_argument("--forward-chunking", action="store_true",
                   help="UNet feed-forward in chunks (unet.enable_forward_chunking): less memory, slower")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same video on any device")
    _add_recipe_args(p, device_help="device to run on: cpu, cuda, cuda:1, mps, xpu (default: the best present device; "
                                    "under accelerate launch: each process's own device)")
    p.add_argument("--demo", action="store_true",
                   help="build a tiny random SVD pipeline locally and run it (no network, no weights)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog, description="Image-to-video with Stable Video Diffusion, in the dtypes the svd recipe picks for "
                               "your device.")
    add_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``scripts/generate_video.py``: bad input prints one message and returns 2."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except RecipeError as err:
        print(f"{parser.prog}: error: {err}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------- validation


@dataclasses.dataclass(frozen=True)
class Job:
    """One input image and where its video goes."""

    image: Path
    out: Path
    format: str


def _check_numbers(args: argparse.Namespace) -> None:
    problems = []
    for name in ("height", "width"):
        value = getattr(args, name)
        if value is not None and (value <= 0 or value % 8):
            problems.append(f"--{name} {value}: must be a positive multiple of 8 (SVD's VAE works on 8x8 blocks; "
                            f"e.g. {max(8, round(value / 8) * 8)})")
    for name, low in (("frames", 1), ("steps", 1), ("fps", 1), ("decode_chunk_size", 1), ("motion_bucket_id", 0)):
        value = getattr(args, name)
        if value is not None and value < low:
            problems.append(f"--{name.replace('_', '-')} {value}: must be at least {low}")
    if args.noise_aug_strength < 0:
        problems.append(f"--noise-aug-strength {args.noise_aug_strength}: must be >= 0")
    if problems:
        raise RecipeError(problems)


def _read_image(path: Path) -> Any:
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


def _format_of(out: Path) -> str | None:
    suffix = out.suffix.lower()
    if suffix == "":
        return "png"
    if suffix in (".mp4", ".gif"):
        return suffix[1:]
    return None


def plan_outputs(image: str, out: str, fmt: str | None = None) -> list[Job]:
    """The (image, output, format) jobs for ``--image``/``--out``/``--format``, checked before any model is loaded.

    Every image is opened and decoded once here, so an unreadable image fails before anything is loaded or written.

    Example:
        >>> import tempfile; from PIL import Image
        >>> d = Path(tempfile.mkdtemp()); Image.new("RGB", (8, 8)).save(d / "cat.png")
        >>> [(j.out.name, j.format) for j in plan_outputs(str(d), str(d / "videos"), "gif")]
        [('cat.gif', 'gif')]
    """
    images, folder = _list_images(image)
    target = Path(out).expanduser()
    if folder:
        if _format_of(target) in ("mp4", "gif"):
            raise RecipeError(f"--out {out}: with a folder of images --out is a folder (one video per image); choose "
                              f"the format with --format {'|'.join(FORMATS)}")
        if target.exists() and not target.is_dir():
            raise RecipeError(f"--out {out}: exists and is not a folder")
        fmt = fmt or "mp4"
        stems: dict[str, Path] = {}
        for img in images:
            if img.stem in stems:
                raise RecipeError(f"--image {image}: {stems[img.stem].name} and {img.name} would both write "
                                  f"{img.stem}.{fmt}; rename one")
            stems[img.stem] = img
        jobs = [Job(img, target / (img.stem if fmt == "png" else f"{img.stem}.{fmt}"), fmt) for img in images]
    else:
        from_suffix = _format_of(target)
        if from_suffix is None:
            raise RecipeError(f"--out {out}: unknown output type {target.suffix!r}; use .mp4, .gif, or a folder "
                              f"name without suffix for PNG frames")
        if fmt is not None and fmt != from_suffix:
            raise RecipeError(f"--out {out} is a{'n' if from_suffix == 'mp4' else ''} {from_suffix} output but "
                              f"--format is {fmt}; drop --format or change the suffix")
        jobs = [Job(images[0], target, from_suffix)]
    for job in jobs:
        if job.format == "png":
            _check_frame_folder(job.out)
        elif job.out.is_dir():
            raise RecipeError(f"--out: {job.out} is a folder; cannot write a {job.format} file there")
        _read_image(job.image)
    return jobs


def _check_frame_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(not (p.name.startswith("frame_") and p.suffix == ".png")
                                                       for p in folder.iterdir())):
        raise RecipeError(f"--out {folder}: exists and is not a folder of frame_*.png files; choose a new folder "
                          f"(it would be replaced)")


def _model_class(model: str) -> str:
    from .load import locate

    where, index, _ = locate(model)
    cls = str(index.get("_class_name"))
    if cls != SVD_CLASS:
        raise RecipeError(f"--model {model}: this is a {cls} (model_index.json), not a Stable Video Diffusion "
                          f"pipeline ({SVD_CLASS}); pass an SVD folder or Hub id, e.g. "
                          f"stabilityai/stable-video-diffusion-img2vid-xt")
    return where


# --------------------------------------------------------------------------------------------- loading


def load_video_pipeline(model: str, device: Any = None, *, overrides: Any = None, offload: str = "none",
                        forward_chunking: bool = False, **kwargs: Any) -> Any:
    """Load an SVD pipeline with the svd recipe for ``device``, optionally offloaded.

    With ``offload="model"``/``"sequential"`` the recipe is resolved for ``device`` (fp16 on CUDA) but the weights are
    loaded on the CPU and moved to ``device`` by accelerate's offload hooks, so a GPU too small for the whole pipeline
    never holds it at once.

    Raises:
        RecipeError: not an SVD pipeline, unknown device, bad overrides, sequential offload on CPU.
    """
    from .apply import torch_device
    from .devices import device_profile
    from .load import component_configs, load_pipeline, locate
    from .recipe import get_recipe

    if offload not in OFFLOAD:
        raise RecipeError(f"offload={offload!r}: use one of {', '.join(OFFLOAD)}")
    where = _model_class(model)
    dev = torch_device(device if device is not None else device_profile(None).torch_device(), "--device")
    layers = overrides if isinstance(overrides, (list, tuple)) else ([overrides] if overrides is not None else [])
    if offload == "none":
        pipe = load_pipeline(where, str(dev), recipe="svd", overrides=list(layers) or None, **kwargs)
    else:
        if dev.type == "cpu" and offload == "sequential":
            raise RecipeError("--offload sequential needs an accelerator (cuda, xpu, mps): it streams weights from "
                              "the CPU to one, and on a CPU there is nowhere to stream them to (accelerate's "
                              "sequential hooks also fail there). Use --offload none or model")
        _, index, folder = locate(where)
        recipe = get_recipe("svd", device=device_profile(str(dev)), overrides=list(layers),
                            configs=component_configs(where, index, folder))
        pipe = load_pipeline(where, "cpu", recipe=recipe, **kwargs)
        if offload == "model":
            pipe.enable_model_cpu_offload(device=dev)
        else:
            pipe.enable_sequential_cpu_offload(device=dev)
    if forward_chunking:
        pipe.unet.enable_forward_chunking()
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
        return peak_rss(), "peak RSS of the process"


def peak_rss() -> int:
    """The process's peak resident set size in bytes.

    Linux: ``VmHWM`` of ``/proc/self/status`` (the high-water mark of this process image; ``ru_maxrss`` would also count
    the parent's pages a forked child had before ``exec``). macOS: ``ru_maxrss`` (bytes there). Windows: psutil's peak
    working set.
    """
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
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

    from . import dtypes as dt

    applied = getattr(pipe, "_hf_precision_applied", None)
    if applied is not None and component in applied.recipe:
        return dt.to_torch(applied.recipe[component].compute)
    module = getattr(pipe, component)
    return next((p.dtype for p in module.parameters() if p.is_floating_point()), torch.float32)


def generate_video(pipe: Any, image: Any, *, height: int, width: int, frames: int | None = None, steps: int = 25,
                   fps: int = 7, motion_bucket_id: int = 127, noise_aug_strength: float = 0.02,
                   decode_chunk_size: int = 8, seed: int = 0, progress: bool = True, desc: str = "") -> VideoResult:
    """Generate one video from ``image`` (a PIL image) with an SVD ``pipe`` loaded by :func:`load_video_pipeline`.

    The noise is drawn from a CPU generator seeded with ``seed`` in the UNet's compute dtype; the pipeline returns
    latents and they are decoded here ``decode_chunk_size`` frames at a time; one progress bar counts the denoising
    steps and the decode chunks.

    Returns:
        `VideoResult`: float32 frames ``(frames, height, width, 3)`` in [0, 1], seconds per denoising step, decode
        time and the device's peak memory.

    Example:
        >>> from hf_precision.synthetic import make_svd, _image
        >>> from hf_precision import apply_recipe
        >>> pipe = make_svd(); _ = apply_recipe(pipe, device="cpu")
        >>> r = generate_video(pipe, _image(32), height=32, width=32, frames=3, steps=2, progress=False)
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
    # Noise in the UNet's compute dtype (imaginAIry#442 drew fp32 noise for an fp16 model); drawn on the CPU so the
    # same seed gives the same video on CUDA, MPS and CPU.
    latents = torch.randn(shape, generator=generator, dtype=_compute_dtype(pipe, "unet")).to(device)
    chunks = -(-frames // decode_chunk_size)
    timing: dict[str, float] = {}

    def first_step(module: Any, args: Any) -> None:
        timing.setdefault("start", time.perf_counter())

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
        with bar, torch.no_grad():
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


@contextlib.contextmanager
def _temporary_beside(target: Path, *, folder: bool) -> Iterator[Path]:
    """A temporary file or folder next to ``target``, renamed onto it on success and removed on failure."""
    target.parent.mkdir(parents=True, exist_ok=True)
    prefix = f".{target.name}.tmp-"
    if folder:
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=prefix))
    else:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=prefix, suffix=target.suffix)
        os.close(fd)
        tmp = Path(name)
    try:
        yield tmp
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(tmp, (0o777 if folder else 0o666) & ~mask)  # mkstemp/mkdtemp create private (0600/0700) entries
        if folder:
            trash = None
            if target.exists():
                trash = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.old-"))
                os.replace(target, trash / "old")
            os.replace(tmp, target)
            if trash is not None:
                shutil.rmtree(trash, ignore_errors=True)
        else:
            os.replace(tmp, target)
    except BaseException:
        if tmp.is_dir():
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.unlink(missing_ok=True)
        raise


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

        with _temporary_beside(target, folder=False) as tmp:
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
        with _temporary_beside(target, folder=False) as tmp:
            images[0].save(tmp, format="GIF", save_all=True, append_images=images[1:], duration=max(1, round(1000 / fps)),
                           loop=0)
    else:
        from PIL import Image

        digits = max(3, len(str(n - 1)))
        with _temporary_beside(target, folder=True) as tmp:
            for i, frame in enumerate(data):
                Image.fromarray(frame).save(tmp / f"frame_{i:0{digits}d}.png")
    return target


# --------------------------------------------------------------------------------------------- the command


def _demo_inputs(workdir: Path, image: str | None) -> tuple[str, str]:
    """Save a tiny random SVD pipeline and (unless one was given) a synthetic input image under ``workdir``."""
    import numpy as np
    from PIL import Image

    from .synthetic import make_svd, save_pipeline

    model = save_pipeline(make_svd(), workdir / "tiny-svd")
    if image is None:
        y, x = np.mgrid[0:128, 0:128] / 127.0
        rgb = np.stack([x, y, 1 - (x - 0.5) ** 2 * 4 * (y > 0.5)], axis=-1)
        image = str(workdir / "demo.png")
        Image.fromarray((rgb * 255).astype(np.uint8)).save(image)
    return str(model), image


def _want_cpu(device: str | None) -> bool:
    if device is not None:
        return device.split(":")[0].strip().lower() == "cpu"
    if os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        return True
    import torch

    return not (torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available()))


def run(args: argparse.Namespace) -> int:
    """Run the video command from parsed arguments (``hf-precision video`` calls this). Raises RecipeError on bad input."""
    if args.demo and args.model:
        raise RecipeError("--demo builds its own tiny model; drop --model (or drop --demo to use your model)")
    if not args.demo and not args.image:
        raise RecipeError("--image is required (a file or a folder of images); or try --demo")
    if not args.demo and not args.out:
        raise RecipeError("--out is required: FILE.mp4, FILE.gif, or a folder")
    defaults = DEMO_DEFAULTS if args.demo else DEFAULTS
    for key, value in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    _check_numbers(args)
    out = args.out or "demo.mp4"
    with contextlib.ExitStack() as stack:
        if args.demo:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hf_precision_video_")))
            model, image = _demo_inputs(workdir, args.image)
        else:
            model, image = args.model or "svd", args.image
        jobs = plan_outputs(image, out, args.format)
        if not args.demo:
            _model_class(model)
        return _generate_all(args, model, jobs)


def _generate_all(args: argparse.Namespace, model: str, jobs: list[Job]) -> int:
    from accelerate import PartialState

    from .cli import overrides_from

    cpu = _want_cpu(args.device)
    # cpu=True is what makes PartialState see a CPU run started by torchrun/accelerate as MULTI_CPU (gloo).
    state = PartialState(cpu=cpu)
    distributed = state.num_processes > 1
    device = args.device
    if distributed:
        device = "cpu" if cpu else str(state.device)  # each process its own GPU
    elif device is None and os.environ.get("ACCELERATE_USE_CPU", "").lower() in ("1", "true", "yes"):
        device = "cpu"  # `accelerate launch --cpu`
    tag = f"[process {state.process_index}/{state.num_processes}] " if distributed else ""
    say: Callable[[str], None] = lambda text: print(f"{tag}{text}", flush=True)

    with state.split_between_processes(jobs) as mine:
        mine = list(mine)  # accelerate's split: contiguous, uneven counts allowed, no image twice
    if mine:
        pipe = load_video_pipeline(model, device, overrides=overrides_from(args) or None, offload=args.offload,
                                   forward_chunking=args.forward_chunking)
        applied = pipe._hf_precision_applied
        plans = ", ".join(f"{p.name} {p.compute}" for p in applied.recipe.plans if p.name in applied.devices)
        say(f"svd recipe for {applied.recipe.device.label()}: {plans}; offload {args.offload}")
    for job in mine:
        image = _read_image(job.image)
        result = generate_video(pipe, image, height=args.height, width=args.width, frames=args.frames,
                                steps=args.steps, fps=args.fps, motion_bucket_id=args.motion_bucket_id,
                                noise_aug_strength=args.noise_aug_strength, decode_chunk_size=args.decode_chunk_size,
                                seed=args.seed, progress=not args.quiet and state.is_local_main_process,
                                desc=job.image.name)
        save_video(result.frames, job.out, fps=args.fps, format=job.format)
        n, h, w, _ = result.frames.shape
        say(f"wrote {job.out} ({n} frames, {w}x{h}, {job.format})")
        say(result.summary())
    state.wait_for_everyone()
    if state.is_main_process:
        missing = [str(j.out) for j in jobs if not j.out.exists()]
        if missing:
            print(f"error: {len(missing)} output(s) missing: {', '.join(missing)}", file=sys.stderr)
            return 1
        if len(jobs) > 1 or distributed:
            say(f"done: {len(jobs)} video(s) from {state.num_processes} process(es) in {jobs[0].out.parent}")
    return 0
