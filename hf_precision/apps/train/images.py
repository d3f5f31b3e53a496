"""The image files of a training folder: which suffixes are images, and one decoding that names a broken file.

Shared by the data reader (targets) and the references of edit models (:mod:`.references`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ...errors import RecipeError

__all__ = ["IMAGE_SUFFIXES", "open_image"]

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
