"""The image files of a training folder (targets and :mod:`.references`): suffixes, and a decoding that names a
broken file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import RecipeError, excerpt

__all__ = ["IMAGE_SUFFIXES", "open_image", "file_problem"]

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


def open_image(path: Path) -> Any:
    """The decoded RGB image; a corrupt or truncated file is a RecipeError (PIL decodes lazily: ``load`` forces it).

    Example:
        >>> import tempfile
        >>> from PIL import Image
        >>> path = Path(tempfile.mkdtemp()) / "a.png"
        >>> Image.new("RGB", (4, 2)).save(path)
        >>> open_image(path).size
        (4, 2)
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as err:
        raise RecipeError(f"{path}: cannot decode it as an image ({type(err).__name__}: {err}); the file is corrupt "
                          f"or truncated: re-export it or remove it from the data folder") from None


def file_problem(where: str, name: Any, folder: Path, suffixes: tuple[str, ...], kind: str,
                 label: str = "") -> tuple[Path, str | None]:
    """(the file a data row names inside ``folder``, None) or (it, why it cannot be read): outside the folder, missing,
    or not of ``suffixes``. ``where`` and ``label`` say which line and column named it.

    Example:
        >>> import tempfile
        >>> folder = Path(tempfile.mkdtemp())
        >>> file_problem("metadata.jsonl: line 1:", "../a.png", folder, IMAGE_SUFFIXES, "an image")[1]  # doctest: +ELLIPSIS
        "metadata.jsonl: line 1: '../a.png' points outside ..."
    """
    path = (folder / str(name)).resolve()
    if folder.resolve() not in path.parents:
        return path, f"{where} {label}{excerpt(name)} points outside {folder}"
    if not path.is_file():
        return path, f"{where} {label}{excerpt(name)}: no such file in {folder}"
    if path.suffix.lower() not in suffixes:
        return path, f"{where} {path.name}: not {kind} ({', '.join(suffixes)})"
    return path, None
