"""Jobs and outputs of the video program: which clips to make from ``--image``/``--prompt(s)``/``--out``, and writing
them. Everything is checked before any model loads; outputs are written to a temporary file and renamed, so a
failed run never leaves half a video. PIL, numpy and imageio are imported inside the functions.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...errors import RecipeError
from ..outputs import check_output, written_atomically

if TYPE_CHECKING:
    import numpy as np

__all__ = ["FORMATS", "Job", "check_out", "plan_outputs", "read_image", "read_prompts", "save_video"]

FORMATS = ("mp4", "gif", "png")
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
# The demo model (a tiny SVD) is tiny and uses its own defaults; models use their recipe's (its video: block, spec.py).
DEMO_DEFAULTS = {"height": 64, "width": 64, "frames": 8, "steps": 4, "decode_chunk_size": 4}


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
    """The jobs for ``--image``/``--prompt(s)``/``--out``/``--format``, checked (each image opened once) before loading.

    An image file or folder is image-to-video (one prompt for every image, or the i-th prompt with the i-th image by
    name); prompts alone are text-to-video (``OUT/000-<words of the prompt>.mp4``). ``existing`` outputs:
    ``"error"`` (one RecipeError naming them), ``"skip"`` or ``"overwrite"``.

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
        _check_target(job.out, job.format)
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
        return [Job(None, check_out(out, fmt), str(_format_of(target)), prompts[0])]
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
    _check_target(target, from_suffix)
    return target


def _check_target(out: Path, fmt: str) -> None:
    """``out`` can be written as ``fmt``; a PNG frame folder replaces only a folder of frames."""
    check_output(out, folder=fmt == "png")
    if fmt == "png" and out.exists() and (not out.is_dir() or any(
            not (p.name.startswith("frame_") and p.suffix == ".png") for p in out.iterdir())):
        raise RecipeError(f"--out {out}: exists and is not a folder of frame_*.png files; choose a new folder "
                          f"(it would be replaced)")


def _to_uint8(frames: np.ndarray) -> np.ndarray:
    import numpy as np

    frames = np.asarray(frames)
    if frames.dtype != np.uint8:
        frames = (np.clip(frames.astype(np.float32), 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if frames.ndim != 4 or frames.shape[-1] != 3:
        raise RecipeError(f"frames must be (frames, height, width, 3), got shape {tuple(frames.shape)}")
    return frames


def save_video(frames: np.ndarray, out: str | os.PathLike[str], fps: int = 7, format: str | None = None) -> Path:
    """Write frames (float in [0, 1] or uint8, ``(frames, height, width, 3)``) as mp4, gif or a PNG folder (``format``, or
    the suffix; none: ``frame_000.png``...), under a temporary name renamed at the end. MP4 is H.264 yuv420p through
    imageio-ffmpeg, which needs even sizes: odd sizes are refused.
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
