"""Wan 2.2 Animate's training data: beside each clip, the character's reference image, its pose video and its face
video, the three inputs WanAnimatePipeline's ``__call__`` takes (``image``, ``pose_video``, ``face_video``), which
Wan 2.2 Animate's preprocessing (Wan-Video/Wan2.2 wan/modules/animate/preprocess) writes per clip: the skeleton
drawn over every frame of the clip at the clip's size, and each frame's face crop, square.

They are columns of ``metadata.jsonl`` beside ``file_name``, relative to the data folder as it is (the reference in
the reference column, ``reference`` by default, as an edit dataset's: :mod:`.references`)::

    {"file_name": "dance.mp4", "text": "a woman dancing", "reference": "dance-ref.png",
     "pose": "dance-pose.mp4", "face": "dance-face.mp4"}

Every problem (a clip without one of them, a pose or face video of another frame count than its clip's, a pose
video of another size than the clip, a face video that is not square) is one line per clip, before loading.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from ...errors import RecipeError, excerpt

__all__ = ["COLUMNS", "animates", "attach_animate"]

COLUMNS = ("pose", "face")  # metadata.jsonl columns of the pose and face videos (the reference has its own)
_CALL = {"pose": "pose_video", "face": "face_video"}  # WanAnimatePipeline.__call__'s names for them
_LAYOUT = ('{"file_name": "a.mp4", "text": "...", "reference": "a-ref.png", "pose": "a-pose.mp4", '
           '"face": "a-face.mp4"}')


def animates(pipeline: str) -> bool:
    """Whether ``pipeline``'s call takes a pose video and a face video beside its image (Wan Animate).

    Example:
        >>> animates("WanAnimatePipeline"), animates("WanImageToVideoPipeline")
        (True, False)
    """
    from ...diagnose.steps import call_params

    params = call_params(pipeline)
    return all(name in params for name in _CALL.values())


def _columns(folder: Path, names: Sequence[str]) -> dict[Path, dict[str, Any]]:
    """file_name (resolved) -> its metadata.jsonl row's values of the columns ``names`` (lines the caption reader
    refused are skipped: it names them)."""
    from .references import metadata_rows

    return {(folder / str(row["file_name"])).resolve(): {c: row[c] for c in names if c in row}
            for _, row in metadata_rows(folder)}


def attach_animate(folder: Path, samples: Sequence[Any], reference_column: str, reference_dir: Any,
                   read_clip: Callable[[Path], Any]) -> list[Any]:
    """The samples with their pose and face videos set, every clip checked against them (``read_clip`` decodes a
    video to (F, H, W, 3)) and against its reference (the column's; ``reference_dir``'s are checked by
    :func:`.references.find_references`, which runs after); unchanged when the data names none of the three inputs
    (``train`` then refuses the model with its recipe's text, which names these columns). One
    :class:`RecipeError`, a line per bad clip.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> attach_animate(d, [], "reference", None, None)
        []
    """
    columns = _columns(folder, (*COLUMNS, reference_column))
    if not any(columns.values()) and reference_dir is None:
        return list(samples)
    fix = (f"Wan Animate trains each clip beside the three inputs its pipeline takes: give them as metadata.jsonl "
           f"columns, e.g. {_LAYOUT} (docs/train-program.md, Wan Animate)")
    out, problems = [], []
    for sample in samples:
        row, found = columns.get(Path(sample.path).resolve(), {}), {}
        where = f"--data: clip {sample.path.name}"
        if reference_dir is None and not (isinstance(row.get(reference_column), str) and row[reference_column].strip()):
            problems.append(f"{where}: no reference image (column {reference_column!r}); {fix}")
        for column in COLUMNS:
            found[column], problem = _video(folder, where, column, row.get(column), sample, read_clip, fix)
            if problem:
                problems.append(problem)
        out.append(dataclasses.replace(sample, **found))
    if problems:
        raise RecipeError(problems)
    return out


def _video(folder: Path, where: str, column: str, value: Any, sample: Any, read_clip: Callable[[Path], Any],
           fix: str) -> tuple[Path | None, str | None]:
    """(the clip's pose or face video, None) or (None, why it cannot go beside the clip)."""
    from .images import file_problem

    what = f"{column} video (column {column!r})"
    if not (isinstance(value, str) and value.strip()):
        got = "" if value is None else f" (got {excerpt(value)})"
        return None, f"{where}: no {what}{got}; {fix}"
    path, problem = file_problem(f"{where}: {what}", value, folder, (".mp4", ".webm", ".mov", ".mkv", ".gif"),
                                 "a video")
    if problem:
        return None, f"{problem}; give the {column} video's file name relative to {folder}"
    try:
        arr = read_clip(path)
    except RecipeError as err:
        return None, f"{where}: {what}: {err}"
    count, (height, width) = int(arr.shape[0]), (int(arr.shape[1]), int(arr.shape[2]))
    if count != sample.frames:
        return None, (f"{where}: {what} {path.name} has {count} frame(s), the clip {sample.frames}; its frames go "
                      f"beside the clip's one for one: write the {column} video from the same frames as the clip")
    if column == "pose" and (width, height) != tuple(sample.size):
        return None, (f"{where}: {what} {path.name} is {width}x{height}, the clip {sample.size[0]}x{sample.size[1]}; "
                      f"the skeleton is drawn over the clip's frames and cropped with them: write it at the clip's "
                      f"size")
    if column == "face" and width != height:
        return None, (f"{where}: {what} {path.name} is {width}x{height}; the pipeline scales each face to the "
                      f"transformer's square motion_encoder_size, so a face crop that is not square is distorted: "
                      f"write square face crops")
    return path, None
