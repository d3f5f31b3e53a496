"""Training data: a folder of images (or clips) with a caption beside each, or a ``metadata.jsonl``; checked whole
before any model loads, sorted into aspect-ratio buckets, and served in an order that is a pure function of
(seed, epoch), so a resumed run sees the batches an uninterrupted one would.

Conventions followed (nothing new to learn):
- ``cat.png`` + ``cat.txt`` (kohya sd-scripts, OneTrainer): the caption file sits beside the image, same stem.
- ``metadata.jsonl`` (diffusers ``ImageFolder``, used by ``examples/text_to_image``): one JSON object per line with
  ``file_name`` (relative to the folder) and the caption column (default ``text``).
- Buckets as kohya's ``BucketManager``: sizes that are multiples of the model's pixel multiple (VAE factor x patch
  size), area at most ``resolution**2``, aspect ratio up to 2:1; each image goes to the bucket of nearest aspect
  ratio, is scaled to cover it and centre-cropped.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import RecipeError, excerpt
from ..video.limits import SizeLimits
from .animate import animates, attach_animate
from .images import IMAGE_SUFFIXES, file_problem, open_image
from .references import attach_references, check_pairs, edit_clip, find_references

__all__ = ["IMAGE_SUFFIXES", "CLIP_SUFFIXES", "ModelGeometry", "model_geometry", "Sample", "TrainData", "read_data",
           "make_buckets", "epoch_batches"]

CLIP_SUFFIXES = (".mp4", ".webm", ".mov", ".mkv", ".gif")
MAX_RATIO = 2.0


@dataclasses.dataclass(frozen=True)
class ModelGeometry:
    """What sizes a model takes: ``multiple`` (pixels per side, VAE factor x patch size), for video models the
    frame rule (``frame_step*k + 1`` frames, or exactly ``fixed_frames``), the bounds its position tables put
    on both (``limits``: the video program's, :mod:`hf_precision.apps.video.limits`); ``vae_factor``: pixels per
    latent side; ``first_frame_edit``: it trains image pairs as clips (its recipe's ``video:``, ``check_pairs``);
    ``prefix_frame``: the batch key of the clean first latent frame its denoiser trains beside, not on (FramePack's
    ``image_latents``: a clip then needs 2 latent frames or more)."""

    pipeline: str
    multiple: int
    video: bool = False
    frame_step: int = 1
    fixed_frames: int = 0
    limits: SizeLimits = SizeLimits()
    vae_factor: int = 8
    first_frame_edit: bool = False
    prefix_frame: str | None = None

    def frame_problem(self, frames: int) -> str | None:
        """Why ``frames`` does not fit this model (None when it does), with the nearest counts that do."""
        past = [p for p in self.limits.problems(self.pipeline, height=0, width=0, frames=frames) if p[:8] == "--frames"]
        if self.fixed_frames and frames != self.fixed_frames:
            return past[0].split(": ", 1)[1] if past else (
                f"{self.pipeline} was built for exactly {self.fixed_frames} frames; use --frames {self.fixed_frames}")
        if frames < 1:
            return "must be at least 1"
        if self.prefix_frame and frames <= self.frame_step:  # one latent frame: the prefix alone, no window
            return (f"{self.pipeline} trains the latent frames after a clip's first, which its pipeline gives clean "
                    f"as {self.prefix_frame}, so a clip needs 2 latent frames or more; e.g. --frames "
                    f"{self.frame_step + 1}")
        if self.frame_step > 1 and (frames - 1) % self.frame_step:
            k = (frames - 1) // self.frame_step
            return (f"{self.pipeline}'s VAE compresses time by {self.frame_step} and keeps the first frame, so frames "
                    f"must be {self.frame_step}*k+1; e.g. --frames {self.frame_step * k + 1} or "
                    f"{self.frame_step * (k + 1) + 1}")
        return past[0].split(": ", 1)[1] if past else None

    def default_resolution(self, resolution: int) -> int:
        """A default ``--resolution`` within the position tables' bounds (the fixed size's side, or the largest)."""
        fixed, most = self.limits.fixed_size, self.limits.max_side
        if fixed[0]:
            return self.fitting(fixed)
        return min(resolution, most) if most else resolution

    def configured_resolution(self, configs: Mapping[str, Mapping[str, Any]]) -> int:
        """The ``--resolution`` of a run that gives none: the VAE's ``sample_size`` (else 512), within what the
        position tables hold (:meth:`default_resolution`); ``train`` and ``train --plan`` both take it."""
        from ...memory.geometry import axis_value

        return self.default_resolution(axis_value(configs.get("vae", {}).get("sample_size") or 512, 0))

    def fitting(self, size: tuple[int, int]) -> int:
        """The smallest ``--resolution`` whose buckets hold ``size`` = (height, width)."""
        r = self.multiple
        while (size[1], size[0]) not in make_buckets(r, self.multiple) and r < 4 * max(size):
            r += self.multiple
        return r

    def buckets(self, resolution: int, frames: int | None = None) -> list[tuple[int, int]]:
        """The (width, height) buckets of ``resolution`` this model takes, ``frames`` checked for a video model:
        what ``train`` and ``train --plan`` both check before loading. Refused (one line, the rule and the fix) for
        a resolution that is no multiple of the model's, a frame count it cannot take, and sizes past its position
        tables.

        Example:
            >>> from hf_precision.apps.video.limits import SizeLimits
            >>> geo = ModelGeometry("P", 16, True, 4, limits=SizeLimits(fixed_size=(16, 16), side_why="x"))
            >>> geo.buckets(16, 9)
            [(16, 16)]
            >>> geo.buckets(32, 9)
            Traceback (most recent call last):
            hf_precision.errors.RecipeError: --resolution 32: P's x, so it takes 16x16 only; use --resolution 16
        """
        multiple = self.multiple
        if resolution <= 0 or resolution % multiple:
            near = max(multiple, round(resolution / multiple) * multiple)
            raise RecipeError(f"--resolution {resolution}: {self.pipeline} needs a positive multiple of {multiple} "
                              f"(VAE factor x patch size, from its configs); e.g. --resolution {near}")
        if self.video and frames is not None:
            problem = self.frame_problem(frames)
            if problem:
                raise RecipeError(f"--frames {frames}: {problem}")
        buckets = make_buckets(resolution, self.multiple)
        fixed, most = self.limits.fixed_size, self.limits.max_side
        if fixed[0]:
            buckets = [b for b in buckets if b == (fixed[1], fixed[0])]
        if most:
            buckets = [b for b in buckets if max(b) <= most]
        if not buckets and fixed[0]:
            raise RecipeError(f"--resolution {resolution}: {self.pipeline}'s {self.limits.side_why}, so it takes "
                              f"{fixed[0]}x{fixed[1]} only; use --resolution {self.fitting(fixed)}")
        if not buckets:
            raise RecipeError(f"--resolution {resolution}: {self.pipeline}'s {self.limits.side_why}, so a side can be "
                              f"at most {most}; use --resolution {most} or lower")
        return buckets


def model_geometry(pipeline: str, index: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> ModelGeometry:
    """The size rules of a model from ``model_index.json`` and its component configs (nothing loaded).

    Video pipelines use the video program's rules (:func:`hf_precision.apps.video.spec.video_spec`); image
    pipelines: the VAE's factor (:func:`hf_precision.memory.geometry.vae_factors`) x the denoiser's ``patch_size``
    (x2 where the pipeline packs latents).

    Example:
        >>> idx = {"vae": ["diffusers", "AutoencoderKL"], "unet": ["diffusers", "UNet2DConditionModel"]}
        >>> model_geometry("StableDiffusionPipeline", idx, {"vae": {"block_out_channels": [1, 2, 3, 4]}}).multiple
        8
        >>> flux = {**idx, "transformer": ["diffusers", "FluxTransformer2DModel"]}  # its pipeline packs 2x2 patches
        >>> model_geometry("FluxPipeline", flux, {"vae": {"block_out_channels": [1, 2, 3, 4]}}).multiple
        16
        >>> zimage = {**idx, "transformer": ["diffusers", "ZImageTransformer2DModel"]}  # it patchifies 2x2 itself
        >>> model_geometry("ZImagePipeline", zimage, {"vae": {"block_out_channels": [1, 2, 3, 4]},
        ...                                           "transformer": {"all_patch_size": [2]}}).multiple
        16
    """
    from ...memory.geometry import axis_value, vae_factors
    from ..video.spec import video_spec

    try:
        spec = video_spec(pipeline, index, configs)
    except RecipeError:
        spec = None
    denoiser = "transformer" if "transformer" in index else "unet"
    row = _denoiser_row(str((index.get(denoiser) or [None, ""])[1]))
    if spec is not None:
        fixed = spec.row.call_frames or spec.fixed_frames  # the one count a call makes whatever asked (ChronoEdit)
        return ModelGeometry(pipeline, spec.size_multiple, True, spec.frame_step, fixed, spec.limits, spec.spatial,
                             spec.row.first_frame_edit, row.prefix_frame if row is not None else None)
    factor = vae_factors(str((index.get("vae") or [None, ""])[1]), configs.get("vae", {}))[0]
    own = configs.get(denoiser, {})
    # Z-Image names the patch sizes it takes (all_patch_size) and its pipeline calls it with the default, 2
    patch = axis_value(own.get("patch_size", own.get("all_patch_size", 1))) if denoiser == "transformer" else 1
    # The pipeline packs 2x2 latent patches into tokens, not the model (diffusers pipeline_flux.py and
    # pipeline_qwenimage.py: `vae_scale_factor * 2` in check_inputs; the config says patch_size 1), or into channels
    # (pipeline_ernie_image.py): the training family row says so (pack="flux", "patch"), so a new family is one row
    # there.
    packs = 2 if row is not None and row.pack in ("flux", "patch") else 1
    return ModelGeometry(pipeline, factor * patch * packs, vae_factor=factor)


def _denoiser_row(denoiser_class: str) -> Any:
    # the training family row of the denoiser class (None: none). Imported here: it needs torch, which the callers
    # have already loaded.
    from ...training.denoiser_rows import ROWS

    return ROWS.get(denoiser_class)


def make_buckets(resolution: int, multiple: int, max_ratio: float = MAX_RATIO) -> list[tuple[int, int]]:
    """(width, height) buckets: multiples of ``multiple``, area <= ``resolution**2``, aspect ratio <= ``max_ratio``.

    Example:
        >>> (64, 64) in make_buckets(64, 16), max(w / h for w, h in make_buckets(64, 16))
        (True, 2.0)
    """
    area = resolution * resolution
    out = set()
    w = multiple
    while w <= resolution * max_ratio:
        h = (area // w) // multiple * multiple
        h = min(h, int(w * max_ratio) // multiple * multiple)
        if h >= multiple and max(w / h, h / w) <= max_ratio:
            out.add((w, h))
            out.add((h, w))
        w += multiple
    return sorted(out)


@dataclasses.dataclass(frozen=True)
class Sample:
    """One training example: its file, caption, size as stored (w, h), frames (clips), bucket (w, h) and, in an edit
    dataset, the reference image it was edited from (:mod:`.references`); for Wan Animate, the clip's character
    image (``reference``), pose video and face video (:mod:`.animate`)."""

    path: Path
    caption: str
    size: tuple[int, int]
    bucket: tuple[int, int]
    frames: int = 0
    reference: Path | None = None
    pose: Path | None = None
    face: Path | None = None


# --------------------------------------------------------------------------------------------- reading the folder


def _captions_beside(folder: Path, media: list[Path], caption_ext: str, problems: list[str]) -> list[tuple[Path, str]]:
    items = []
    missing, empty = [], []
    for path in media:
        cap = path.with_suffix(caption_ext)
        if not cap.is_file():
            missing.append(path.name)
            continue
        try:
            text = cap.read_text(encoding="utf-8-sig").strip()  # a BOM (Windows editors) is not part of the caption
        except (OSError, UnicodeDecodeError) as err:
            problems.append(f"{cap}: cannot read the caption as UTF-8 text ({type(err).__name__}); save it as UTF-8")
            continue
        if not text:
            empty.append(cap.name)
            continue
        items.append((path, text))
    if missing:
        problems.append(f"--data {folder}: {len(missing)} file(s) have no caption file beside them ({_names(missing)}); "
                        f"write the caption in <name>{caption_ext} next to each (kohya/OneTrainer convention), or list "
                        f"them in metadata.jsonl, or pass --caption TEXT to give every file the same caption")
    if empty:
        problems.append(f"--data {folder}: {len(empty)} caption file(s) are empty ({_names(empty)}); write a caption "
                        f"in each, or pass --caption TEXT")
    return items


def _names(names: Sequence[str]) -> str:
    shown = ", ".join(names[:5])
    return shown + (f" and {len(names) - 5} more" if len(names) > 5 else "")


def _from_metadata(folder: Path, meta: Path, column: str, suffixes: Sequence[str],
                   problems: list[str]) -> list[tuple[Path, str]]:
    items = []
    for n, line in enumerate(meta.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        where = f"{meta}: line {n}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            # json's own message ends where its position would follow ("Unterminated string starting at")
            problems.append(f"{where}, column {err.colno}: not valid JSON ({err.msg}: column {err.colno}); each line is "
                            f"one object such as "
                            f'{{"file_name": "0001.png", "{column}": "a photo of a cat"}}')
            continue
        if not isinstance(row, dict) or "file_name" not in row:
            problems.append(f"{where}: needs a \"file_name\" key (diffusers ImageFolder convention)")
            continue
        caption = row.get(column)
        if not isinstance(caption, str) or not caption.strip():
            problems.append(f"{where}: caption column {column!r} is missing or empty (got {excerpt(caption)}); write "
                            f"the caption there, or pass --caption-column NAME for another column")
            continue
        path, problem = file_problem(f"{where}:", row["file_name"], folder, suffixes, "a supported file type",
                                     "file_name ")
        if problem:
            problems.append(problem)
        else:
            items.append((path, caption.strip()))
    return items


def list_items(data: str | Path, *, video: bool = False, caption_ext: str = ".txt", caption_column: str = "text",
               caption: str | None = None) -> list[tuple[Path, str]]:
    """(file, caption) pairs of a data folder; every problem of the folder in one :class:`RecipeError`.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> list_items(d)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --data ...: no images (.png, .jpg, ...) in the folder; ...
    """
    folder = Path(data).expanduser()
    suffixes = CLIP_SUFFIXES if video else IMAGE_SUFFIXES
    kind = "clips" if video else "images"
    if not folder.exists():
        raise RecipeError(f"--data {folder}: no such folder; pass a folder of {kind} with a caption .txt beside each")
    if not folder.is_dir():
        raise RecipeError(f"--data {folder}: is a file, not a folder; pass the folder that holds the {kind}")
    problems: list[str] = []
    meta = folder / "metadata.jsonl"
    if meta.is_file():
        items = _from_metadata(folder, meta, caption_column, suffixes, problems)
    else:
        media = sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix.lower() in suffixes
                       and not any(part.startswith(".") for part in p.relative_to(folder).parts))
        if caption is not None:
            items = [(p, caption) for p in media]
        else:
            items = _captions_beside(folder, media, caption_ext, problems)
        if not media:
            other = sorted({p.suffix.lower() for p in folder.rglob("*") if p.is_file()} - {caption_ext})
            hint = f" (found {', '.join(other[:6])})" if other else ""
            wrong = (" this model is a video model: it trains on clips" if video and any(s in IMAGE_SUFFIXES for s in other)
                     else " this model is an image model: it trains on images" if any(s in CLIP_SUFFIXES for s in other)
                     and not video else "")
            raise RecipeError(f"--data {folder}: no {kind} ({', '.join(suffixes)}) in the folder{hint};"
                              f"{wrong and wrong + ';'} add {kind} with a caption .txt beside each, or a metadata.jsonl")
    if problems:
        raise RecipeError(problems)
    if not items:
        raise RecipeError(f"--data {folder}: metadata.jsonl lists no {kind}")
    return items


# --------------------------------------------------------------------------------------------- decoding and checking


def _read_clip(path: Path, frames: int | None = None) -> Any:
    """The clip's frames as a uint8 array (F, H, W, 3); the first ``frames`` when given."""
    import imageio.v3 as iio
    import numpy as np

    try:
        if path.suffix.lower() == ".gif":
            arr = iio.imread(path, index=None, plugin="pillow", mode="RGB")
        else:
            arr = iio.imread(path, index=None, plugin="FFMPEG")
    except Exception as err:  # imageio raises plugin-specific types for a damaged container
        first = (str(err).strip().splitlines() or [""])[0]  # ffmpeg appends its whole stderr
        raise RecipeError(f"{path}: cannot decode it as a video ({type(err).__name__}: {first}); the file is corrupt or "
                          f"truncated: re-encode it (ffmpeg -i in -c:v libx264 out.mp4) or remove it") from None
    arr = np.asarray(arr)
    if arr.ndim == 3:  # one frame
        arr = arr[None]
    return arr[:frames] if frames else arr


def inspect_items(items: Sequence[tuple[Path, str]], geometry: ModelGeometry, resolution: int,
                  frames: int | None = None) -> list[Sample]:
    """Decode every file once, check its size (and frame count) and give it a bucket; all problems in one error."""
    multiple = geometry.multiple
    problems = []
    buckets = geometry.buckets(resolution, (frames or 0) if geometry.video else None)
    samples = []
    for path, caption in items:
        try:
            if geometry.video:
                arr = _read_clip(path)
                size, count = (int(arr.shape[2]), int(arr.shape[1])), int(arr.shape[0])
                if count < (frames or 1):
                    problems.append(f"{path}: has {count} frame(s), --frames is {frames}; use a longer clip, remove it, "
                                    f"or lower --frames (allowed counts: {geometry.frame_step}*k+1)")
                    continue
            else:
                with open_image(path) as im:
                    size, count = im.size, 0
        except RecipeError as err:
            problems.append(str(err))
            continue
        ratio = math.log(size[0] / size[1])  # the bucket of nearest aspect ratio, the larger of two as near
        bucket = min(buckets, key=lambda b: (abs(math.log(b[0] / b[1]) - ratio), -b[0] * b[1]))
        if size[0] < bucket[0] or size[1] < bucket[1]:
            fits = max(multiple, min(size) // multiple * multiple)
            problems.append(f"{path}: {size[0]}x{size[1]} is smaller than its {bucket[0]}x{bucket[1]} bucket at "
                            f"--resolution {resolution} (training never upscales); use --resolution {fits} or a larger "
                            f"image")
            continue
        samples.append(Sample(path, caption, size, bucket, count))
    if problems:
        raise RecipeError(problems)
    return samples


def to_pixels(sample: Sample, frames: int | None = None) -> Any:
    """The sample as a float tensor in [-1, 1]: (3, H, W) for an image, (3, F, H, W) for a clip, at its bucket size
    (scaled to cover the bucket, centre-cropped)."""
    import numpy as np
    import torch
    from PIL import Image

    w, h = sample.bucket

    def fit(im: Any) -> Any:
        scale = max(w / im.size[0], h / im.size[1])
        size = (max(w, round(im.size[0] * scale)), max(h, round(im.size[1] * scale)))
        im = im.resize(size, Image.Resampling.BICUBIC)
        left, top = (size[0] - w) // 2, (size[1] - h) // 2
        return np.asarray(im.crop((left, top, left + w, top + h)), dtype=np.float32)

    if frames:
        arr = np.stack([fit(Image.fromarray(f)) for f in _read_clip(sample.path, frames)])  # F, H, W, 3
        t = torch.from_numpy(arr).permute(3, 0, 1, 2)
    else:
        t = torch.from_numpy(fit(open_image(sample.path))).permute(2, 0, 1)
    return t / 127.5 - 1.0


def to_pictures(pixels: Any) -> list[Any]:
    """:func:`to_pixels`' inverse: (3, H, W) or (3, F, H, W) in [-1, 1] -> a PIL image per frame, as a pipeline's
    ``__call__`` takes its input pictures.

    Example:
        >>> import torch
        >>> [p.size for p in to_pictures(torch.zeros(3, 2, 8, 16))], to_pictures(torch.ones(3, 4, 4))[0].getpixel((0, 0))
        ([(16, 8), (16, 8)], (255, 255, 255))
    """
    from PIL import Image

    frames = pixels.unbind(1) if pixels.dim() == 4 else [pixels]
    return [Image.fromarray(((f.float() + 1) * 127.5).round().clamp(0, 255).byte().permute(1, 2, 0).numpy())
            for f in frames]


# --------------------------------------------------------------------------------------------- order


def epoch_batches(samples: Sequence[Sample], batch_size: int, seed: int, epoch: int,
                  world: int = 1) -> list[list[int]]:
    """The global batches of one epoch: indices grouped by bucket, ``batch_size * world`` each (a short last group
    of a bucket is filled from its start, so every process gets ``batch_size``), in an order fixed by (seed, epoch).

    Example:
        >>> s = [Sample(Path(str(i)), "c", (64, 64), (64, 64)) for i in range(5)]
        >>> epoch_batches(s, 2, 0, 0) == epoch_batches(s, 2, 0, 0), [len(b) for b in epoch_batches(s, 2, 0, 0)]
        (True, [2, 2, 2])
    """
    rng = random.Random(f"{seed}:{epoch}")
    by_bucket: dict[tuple[int, int], list[int]] = {}
    for i, s in enumerate(samples):
        by_bucket.setdefault(s.bucket, []).append(i)
    size = batch_size * world
    batches = []
    for bucket in sorted(by_bucket):
        idx = by_bucket[bucket]
        rng.shuffle(idx)
        for start in range(0, len(idx), size):
            chunk = idx[start:start + size]
            while len(chunk) < size:
                chunk += idx[: size - len(chunk)]
            batches.append(chunk)
    rng.shuffle(batches)
    return batches


@dataclasses.dataclass
class TrainData:
    """The checked data of a run: samples with buckets, the frame count (clips) and where they came from."""

    folder: Path
    samples: list[Sample]
    geometry: ModelGeometry
    resolution: int
    frames: int | None = None

    def __len__(self) -> int:
        return len(self.samples)

    def pixels(self, indices: Sequence[int]) -> Any:
        """One batch of pixels in [-1, 1] (all from one bucket)."""
        import torch

        samples = [self.samples[i] for i in indices]  # an edit pair of a first-frame edit model: its clip (.references)
        return torch.stack([edit_clip(to_pixels(dataclasses.replace(s, path=s.reference)), to_pixels(s), self.frames)
                            if s.reference and self.geometry.first_frame_edit else to_pixels(s, self.frames)
                            for s in samples])

    def captions(self, indices: Sequence[int]) -> list[str]:
        return [self.samples[i].caption for i in indices]

    def reference_pixels(self, indices: Sequence[int]) -> Any:
        """The batch's reference images in [-1, 1], each at its target's bucket; None when the data has none."""
        import torch

        refs = [self.samples[i] for i in indices]
        return None if any(s.reference is None for s in refs) else \
            torch.stack([to_pixels(dataclasses.replace(s, path=s.reference)) for s in refs])

    def animate_inputs(self, i: int) -> dict[str, Any]:
        """Sample ``i``'s Wan Animate inputs as its pipeline's ``__call__`` takes them (``image``, ``pose_video``,
        ``face_video``: PIL), the pose video scaled and cropped to the clip's bucket as the clip is (the skeleton
        stays on the body), the face video and the image as stored (the pipeline sizes them); ``{}`` without."""
        from PIL import Image

        s = self.samples[i]
        if s.pose is None or s.face is None or s.reference is None:
            return {}
        return {"image": open_image(s.reference),
                "pose_video": to_pictures(to_pixels(dataclasses.replace(s, path=s.pose), self.frames)),
                "face_video": [Image.fromarray(f) for f in _read_clip(s.face, self.frames)]}

    def reference_image(self, i: int) -> Any:
        """Sample ``i``'s reference as a PIL image at its target's bucket (the pixels its reference latents come
        from), for a pipeline that encodes the prompt with it; None when it has none."""
        s = self.samples[i]
        return None if s.reference is None else to_pictures(to_pixels(dataclasses.replace(s, path=s.reference)))[0]


def read_data(data: str | Path, geometry: ModelGeometry, resolution: int, *, frames: int | None = None,
              caption_ext: str = ".txt", caption_column: str = "text", caption: str | None = None,
              reference_column: str = "reference", reference_dir: str | Path | None = None) -> TrainData:
    """Read and check a data folder against a model's size rules; every bad file named in one :class:`RecipeError`.
    An edit dataset's reference images come from ``reference_dir`` or metadata.jsonl's ``reference_column``.

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> d = Path(tempfile.mkdtemp())
        >>> Image.new("RGB", (48, 32)).save(d / "a.png"); _ = (d / "a.txt").write_text("a cat")
        >>> read_data(d, ModelGeometry("StableDiffusionPipeline", 8), 32).samples[0].bucket
        (40, 24)
    """
    pairs = check_pairs(geometry, Path(data), None, resolution, frames)  # a first-frame edit model: image pairs
    look = dataclasses.replace(geometry, video=False) if pairs else geometry
    items = list_items(data, video=look.video, caption_ext=caption_ext, caption_column=caption_column, caption=caption)
    samples = inspect_items(items, look, resolution, frames)
    if animates(geometry.pipeline):  # Wan Animate: each clip's reference, pose and face videos (.animate)
        samples = attach_animate(Path(data).expanduser(), samples, reference_column, reference_dir, _read_clip)
    found = find_references(data, [p for p, _ in items], reference_column, reference_dir)
    samples = attach_references(samples, found) if found else samples
    check_pairs(geometry, Path(data), samples, resolution, frames)
    return TrainData(Path(data).expanduser(), samples, geometry, resolution, frames if geometry.video else None)
