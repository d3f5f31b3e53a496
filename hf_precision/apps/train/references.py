"""Reference images of an edit dataset (Flux Kontext, Qwen-Image Edit): the picture the edit starts from, beside the
target the model learns to produce, and its caption (the instruction).

Two conventions, both common, pair each target with its reference:
- a **folder of references with the targets' file names** (``--reference-dir``): ai-toolkit's ``control_path``
  (its config/examples/train_lora_flux_kontext_24gb.yaml and the Qwen-Image Edit ones: the control images carry
  the targets' file names, in another folder). The name matches without its suffix (``cat.png`` may pair with
  ``cat.jpg``).
- a **column of ``metadata.jsonl``** (``--reference-column``, default ``reference``): diffusers' image-to-image
  DreamBooth scripts (examples/dreambooth/train_dreambooth_lora_flux_kontext.py, ..._flux2_klein_img2img.py) read
  the reference from a dataset column (``--cond_image_column``), and
  metadata.jsonl is diffusers' ImageFolder: ``{"file_name": "cat.png", "text": "make it blue", "reference":
  "src/cat.png"}``, the reference relative to the data folder as ``file_name`` is.

A reference is scaled and cropped to its target's bucket (as ai-toolkit and the diffusers script resize the control
image to the target's size) and encoded by the same VAE path as the target, cached with it. Every problem (a missing
or unreadable reference, targets without one) is one error before any model loads.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from ...errors import RecipeError, excerpt

__all__ = ["metadata_rows", "find_references", "attach_references", "check_reference_family", "edits_images", "prompt_reads_image",
           "check_pairs", "edit_clip"]

def metadata_rows(folder: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, row) of each line of ``folder``'s metadata.jsonl that is a JSON object with a ``file_name``;
    the lines the caption reader refuses (and names) are skipped, as is a folder without one.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "metadata.jsonl").write_text('{"file_name": "a.png"}\\nnot json\\n{"text": "x"}\\n')
        >>> list(metadata_rows(d)), list(metadata_rows(d / "none"))
        ([(1, {'file_name': 'a.png'})], [])
    """
    meta = folder / "metadata.jsonl"
    if not meta.is_file():
        return
    for n, line in enumerate(meta.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            row = json.loads(line) if line.strip() else None
        except json.JSONDecodeError:
            continue  # named by the caption reader
        if isinstance(row, dict) and "file_name" in row:
            yield n, row


def _from_column(folder: Path, column: str, problems: list[str]) -> dict[Path, Path]:
    """target -> reference from metadata.jsonl's ``column`` (lines _from_metadata refused are skipped here)."""
    from .images import IMAGE_SUFFIXES, file_problem

    meta = folder / "metadata.jsonl"
    found: dict[Path, Path] = {}
    for n, row in metadata_rows(folder):
        if column not in row:
            continue
        where, value = f"{meta}: line {n}: reference column {column!r}", row[column]
        if not (isinstance(value, str) and value.strip()):
            problems.append(f"{where} is {excerpt(value)}; give the reference image's file name relative to {folder}")
            continue
        path, problem = file_problem(f"{where}:", value, folder, IMAGE_SUFFIXES, "an image")
        if problem:
            problems.append(problem)
        else:
            found[(folder / str(row["file_name"])).resolve()] = path
    return found


def _from_folder(folder: Path, references: Path, targets: Sequence[Path], problems: list[str]) -> dict[Path, Path]:
    """target -> the file of ``references`` at the target's path relative to the data folder, any image suffix."""
    from .images import IMAGE_SUFFIXES

    if not references.is_dir():
        problems.append(f"--reference-dir {references}: no such folder; pass the folder of reference images named as "
                        f"the targets in {folder}")
        return {}
    found: dict[Path, Path] = {}
    for target in targets:
        rel = target.resolve().relative_to(folder.resolve())
        same = [p for p in sorted((references / rel).parent.glob(f"{rel.stem}.*")) if p.suffix.lower() in IMAGE_SUFFIXES]
        if same:
            found[target.resolve()] = same[0]
    return found


def find_references(folder: str | Path, targets: Sequence[Path], column: str = "reference",
                    reference_dir: str | Path | None = None) -> dict[Path, Path]:
    """Each target's reference image (resolved paths), from ``reference_dir`` or metadata.jsonl's ``column``; empty
    when the data gives none. Every problem in one :class:`RecipeError`, the metadata line or target named.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> _ = (d / "metadata.jsonl").write_text('{"file_name": "a.png", "text": "x", "reference": "a-src.png"}')
        >>> find_references(d, [d / "a.png"])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: ...metadata.jsonl: line 1: reference column 'reference': 'a-src.png': no such file in ...
    """
    folder = Path(folder).expanduser()
    problems: list[str] = []
    by_column = _from_column(folder, column, problems)
    found = by_column
    if reference_dir is not None:
        if by_column:
            raise RecipeError(f"--reference-dir {reference_dir}: metadata.jsonl gives references too (column "
                              f"{column!r}); give them one way: drop --reference-dir or the column")
        found = _from_folder(folder, Path(reference_dir).expanduser(), targets, problems)
    if problems:
        raise RecipeError(problems)
    missing = [t for t in targets if t.resolve() not in found]
    if found and missing:
        how = (f"a file of the same name in {reference_dir}" if reference_dir is not None else
               f"a {column!r} key on its metadata.jsonl line")
        raise RecipeError(f"--data {folder}: {len(missing)} of {len(targets)} file(s) have no reference image "
                          f"({', '.join(p.name for p in missing[:5])}{' ...' if len(missing) > 5 else ''}); an edit "
                          f"dataset pairs every target with the image it was edited from: give each {how}, or remove "
                          f"those files")
    return found


def attach_references(samples: Sequence[Any], found: Mapping[Path, Path]) -> list[Any]:
    """The samples with their reference set, each reference decoded once (a corrupt file named here, not mid-run)."""
    from .images import open_image

    out, problems = [], []
    for sample in samples:
        ref = found.get(Path(sample.path).resolve())
        if ref is not None:
            try:
                open_image(ref).close()
            except RecipeError as err:
                problems.append(f"reference of {sample.path.name}: {err}")
                continue
        out.append(dataclasses.replace(sample, reference=ref))
    if problems:
        raise RecipeError(problems)
    return out


def check_reference_family(index: Mapping[str, Any], has_references: bool) -> None:
    """Refuse, before loading, reference images for a model that takes none: the training layer's denoiser row says
    whether its call takes ``reference_latents`` (recipes/denoisers.yaml ``reference: true``), and the pipeline
    must read a reference image (:func:`edits_images`), not only its class's transformer (FluxPipeline shares
    Kontext's; FluxImg2ImgPipeline starts from its image). An image-to-image or inpainting pipeline is told apart
    in the message: it does take an image, to noise.

    Example:
        >>> check_reference_family({"_class_name": "StableDiffusionXLPipeline",
        ...                         "unet": ["diffusers", "UNet2DConditionModel"]}, True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --data: the data gives reference images, but StableDiffusionXLPipeline ...
    """
    if not has_references or edits_images(index):
        return
    from ...diagnose.steps import call_params
    from ...training.denoiser_rows import ROWS

    name = str(index.get("_class_name"))
    edits = sorted(c for c, r in ROWS.items() if getattr(r, "reference", False))
    params = call_params(name)
    why = (f"its input image is where denoising starts, noised by strength (image-to-image or inpainting), not a "
           f"reference its denoiser reads beside the target, so a pair trains nothing of it; train on the targets "
           f"alone (its LoRA loads into {name} as into its text-to-image pipeline)" if "image" in params else
           "it does not edit an input image; drop the references")
    raise RecipeError(f"--data: the data gives reference images, but {name} takes none: {why}, or train an edit "
                      f"model on the pairs (the denoiser rows with reference: true: {', '.join(edits)}, in "
                      f"FluxKontextPipeline, QwenImageEditPipeline); references come from the metadata.jsonl "
                      f"reference column or --reference-dir")


def edits_images(index: Mapping[str, Any]) -> bool:
    """Whether the model of ``index`` (its ``model_index.json``) is an edit model: a denoiser row with ``reference:
    true`` and a pipeline whose call reads a reference image beside the latents (FluxKontextPipeline,
    QwenImageEditPipeline), not only its class's transformer: FluxPipeline shares Kontext's, and FluxImg2ImgPipeline
    and FluxInpaintPipeline take an ``image`` they start from (``strength``), not a reference.

    Example:
        >>> edits_images({"_class_name": "FluxPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})
        False
        >>> edits_images({"_class_name": "FluxKontextPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})
        True
        >>> edits_images({"_class_name": "FluxImg2ImgPipeline", "transformer": ["diffusers", "FluxTransformer2DModel"]})
        False
    """
    import diffusers

    from ...runtime.source import listed_components
    from ...training.denoiser_rows import ROWS

    name = str(index.get("_class_name"))
    rows = []
    for _, (library, cls_name) in listed_components(index).items():
        cls = getattr(diffusers, str(cls_name), None) if library == "diffusers" else None
        mro = [c.__name__ for c in cls.__mro__] if isinstance(cls, type) else [str(cls_name)]
        rows += [ROWS[n] for n in mro if n in ROWS][:1]  # the class's own row, else its nearest base's
    return any(getattr(r, "reference", False) for r in rows) and _reads_reference(getattr(diffusers, name, None))


def _reads_reference(pipeline: Any) -> bool:
    """Whether a pipeline's call puts a reference image beside the latents it denoises: an ``image_reference``
    (FluxKontextInpaintPipeline, Flux2KleinInpaintPipeline), or an ``image`` without ``strength``. With
    ``strength`` the ``image`` is where denoising starts, noised to that level (img2img, inpainting:
    FluxImg2ImgPipeline, FluxInpaintPipeline, QwenImageImg2ImgPipeline, SDXL's), not a reference."""
    from ...diagnose.steps import call_params

    params = call_params(pipeline)
    return "image_reference" in params or ("image" in params and "strength" not in params)


def prompt_reads_image(pipeline: Any) -> bool:
    """Whether a pipeline (class or instance) encodes its prompt together with an input image: its
    ``encode_prompt`` takes ``image``. Qwen-Image Edit's vision-language text encoder reads the instruction beside
    the reference (pipeline_qwenimage_edit.py ``encode_prompt(image=prompt_image, ...)`` in ``__call__``), so
    training on an edit pair conditions on (caption, reference), not on the caption alone.

    Example:
        >>> import diffusers
        >>> prompt_reads_image(diffusers.QwenImageEditPipeline), prompt_reads_image(diffusers.FluxKontextPipeline)
        (True, False)
    """
    from ...diagnose.steps import call_params

    return "image" in call_params(pipeline, "encode_prompt")


def check_pairs(geometry: Any, data: Path, samples: Sequence[Any] | None, resolution: int,
                frames: int | None) -> bool:
    """Whether ``geometry``'s model is a first-frame edit model (its recipe's ``video: first_frame_edit``), whose data are
    (reference, target) image pairs, each trained as a clip; for one, refuse before loading a frame count the
    pair's clip cannot be (``geometry``'s rules, as for clips) or a folder without images (``samples`` None: before
    reading it), or targets without a reference (the read ``samples``): a target alone would teach it to ignore its
    input image.

    Example:
        >>> from types import SimpleNamespace
        >>> geometry = SimpleNamespace(first_frame_edit=True, pipeline="ChronoEditPipeline", buckets=lambda *size: [])
        >>> check_pairs(geometry, Path("d"), [], 32, 5), check_pairs(SimpleNamespace(first_frame_edit=False), Path("d"), [], 32, 5)
        (True, False)
        >>> check_pairs(geometry, Path("d"), [], 32, 1)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --frames 1: ChronoEditPipeline trains an edit pair as a clip ...
    """
    from .images import IMAGE_SUFFIXES

    if not geometry.first_frame_edit:
        return False
    pipeline, how = geometry.pipeline, ("give each target its reference in metadata.jsonl's reference column or "
                                        "with --reference-dir")
    if not frames or frames < 2:  # a read without --frames (the pair is at least two frames)
        raise RecipeError(f"--frames {frames}: {pipeline} trains an edit pair as a clip of the reference then the "
                          f"target, the frames its call makes; use --frames 5")
    geometry.buckets(resolution, frames)  # the frame count, checked by the pipeline's rules for clips
    pairs = f"{pipeline} is an edit model that trains on (reference, target) image pairs, each as a clip of the " \
            f"reference then the target: {how}"
    if samples is None and data.is_dir() and not any(p.suffix.lower() in IMAGE_SUFFIXES for p in data.rglob("*")):
        raise RecipeError(f"--data {data}: no images (.png, .jpg, ...) in the folder; {pairs}")
    alone = [s.path.name for s in samples or () if s.reference is None]
    if alone:
        raise RecipeError(f"--data {data}: {len(alone)} of {len(samples)} image(s) have no reference image "
                          f"({', '.join(alone[:5])}{' ...' if len(alone) > 5 else ''}); {pairs}")
    return True


def edit_clip(reference: Any, target: Any, frames: int) -> Any:
    """A first-frame edit model's training clip of an edit pair, (3, frames, H, W), from the ``reference`` and
    ``target`` pixels (3, H, W) at the target's bucket: the reference, then the target in every later frame, the
    video its pipeline's call decodes from the latents it makes (the input image, then the edit; recipes/chronoedit.yaml).

    Example:
        >>> import torch
        >>> clip = edit_clip(torch.zeros(3, 4, 4), torch.ones(3, 4, 4), 5)
        >>> tuple(clip.shape), clip[:, 0].sum().item(), clip[:, 1:].mean().item()
        ((3, 5, 4, 4), 0.0, 1.0)
    """
    import torch

    return torch.cat([reference[:, None], target[:, None].expand(-1, frames - 1, -1, -1)], dim=1)
