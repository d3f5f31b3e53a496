"""Output paths checked before any work: a run that cannot write its result must fail before loading a model.

The image and video programs write under a temporary name beside the target and rename it, so a failed run
leaves nothing; this module makes the failures that writing would hit (a parent that is a file, a folder where a
file goes, an unknown suffix, a read-only folder) happen first, in a second, with the fix.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from ..errors import RecipeError, excerpt

__all__ = ["check_output", "written_atomically"]


def check_output(path: str | os.PathLike[str], *, flag: str = "--out", suffixes: Iterable[str] | None = None,
                 folder: bool = False, create_parents: bool = True, what: str = "output") -> Path:
    """``path`` as a ``Path`` if a run can write it there, else a ``RecipeError`` naming the flag, the path and the fix.

    Args:
        path: the file (or, with ``folder=True``, the folder) a run will write.
        flag: the option the path came from, for the message.
        suffixes (*optional*): the suffixes a file output may have (``(".png", ".jpg")``).
        folder: the output is a folder (PNG frames, one video per image): an existing file there is refused.
        create_parents: missing parent folders will be created (their nearest existing ancestor must be a
            writable folder); when False the parent folder must exist.
        what: what the file is (``"image"``), for the message.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp())
        >>> check_output(d / "cat.png", suffixes=(".png",)).name
        'cat.png'
        >>> _ = (d / "a_file").write_text("x")
        >>> check_output(d / "a_file" / "cat.png")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --out .../a_file/cat.png: .../a_file is a file, not a folder; ...
    """
    target = Path(path).expanduser()
    shown = excerpt(str(path), 200).strip("'\"")
    if suffixes is not None and not folder:
        allowed = tuple(s.lower() for s in suffixes)
        if target.suffix.lower() not in allowed:
            raise RecipeError(f"{flag} {shown}: unsupported {what} type {target.suffix or '(no suffix)'!r}; allowed: "
                              f"{', '.join(allowed)}")
    if target.is_dir() and not folder:
        raise RecipeError(f"{flag} {shown}: is a folder; name a file in it")
    if target.exists() and folder and not target.is_dir():
        raise RecipeError(f"{flag} {shown}: exists and is not a folder; choose another name or remove the file")
    parent = target.parent
    while not parent.exists() and parent != parent.parent:
        if not create_parents:
            raise RecipeError(f"{flag} {shown}: folder {target.parent} does not exist; create it first "
                              f"(mkdir -p {target.parent})")
        parent = parent.parent
    if not parent.is_dir():
        raise RecipeError(f"{flag} {shown}: {parent} is a file, not a folder; choose an output path whose folders "
                          f"are folders")
    if not _writable(parent):
        raise RecipeError(f"{flag} {shown}: cannot write in {parent} (permission denied or read-only); choose a "
                          f"folder you can write to")
    return target


def _writable(folder: Path) -> bool:
    if not os.access(folder, os.W_OK | os.X_OK):
        return False
    try:  # os.access says yes to root even on a read-only mount: try it (the file is gone when closed)
        with tempfile.TemporaryFile(dir=folder):
            return True
    except OSError:
        return False


@contextlib.contextmanager
def written_atomically(target: Path, *, folder: bool = False) -> Iterator[Path]:
    """A temporary file or folder next to ``target``, renamed onto it on success and removed on failure.

    The one way the programs write results (images, videos, frame folders, reports): Ctrl-C or an error leaves
    neither a partial file nor a stray temporary one, and an existing target is replaced only by a complete one.

    Example:
        >>> d = Path(tempfile.mkdtemp())
        >>> with written_atomically(d / "out.txt") as tmp:
        ...     _ = tmp.write_text("done")
        >>> (d / "out.txt").read_text(), sorted(p.name for p in d.iterdir())
        ('done', ['out.txt'])
    """
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
