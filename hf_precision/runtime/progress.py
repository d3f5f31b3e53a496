"""A pipeline's own progress bar, silenced for a block: calibrate's runs, check's run and each video clip (which
draws its own bar) need it, and each must hand the caller's settings back as they were."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet_progress"]


@contextlib.contextmanager
def quiet_progress(pipe: Any) -> Iterator[None]:
    """Silence a diffusers pipeline's progress bar inside the block; its settings come back as they were after it.

    Example:
        >>> class Pipe:  # as diffusers' DiffusionPipeline keeps it
        ...     def set_progress_bar_config(self, **kwargs):
        ...         self._progress_bar_config = kwargs
        >>> pipe = Pipe()
        >>> pipe.set_progress_bar_config(desc="denoise")
        >>> with quiet_progress(pipe):
        ...     pipe._progress_bar_config
        {'desc': 'denoise', 'disable': True}
        >>> pipe._progress_bar_config
        {'desc': 'denoise'}
    """
    if not hasattr(pipe, "set_progress_bar_config"):
        yield
        return
    saved = getattr(pipe, "_progress_bar_config", None)
    pipe.set_progress_bar_config(**{**(saved or {}), "disable": True})
    try:
        yield
    finally:
        if saved is None:
            pipe.__dict__.pop("_progress_bar_config", None)
        else:
            pipe._progress_bar_config = saved
