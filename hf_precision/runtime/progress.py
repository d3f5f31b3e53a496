"""Progress bars silenced for a block, handing the caller's settings back: the loading bars (``--quiet``) and a
pipeline's own (where the caller draws its own bar); and :func:`quiet_call`'s keywords that keep a call from
logging what is not the user's business.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

__all__ = ["quiet_call", "quiet_progress", "quiet_loading"]


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


def quiet_call(pipe: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` for ``pipe(**kwargs)`` with ``clean_caption=False`` where the pipeline would clean captions but cannot:
    PixArt, Allegro and Latte need Beautiful Soup and ftfy for it, and without them diffusers logs two warnings a call
    and turns it off itself. Same result, less noise; a caller's own ``clean_caption`` is kept.

    Example:
        >>> class Pipe:
        ...     def __call__(self, prompt, clean_caption=True): ...
        >>> from diffusers.utils import is_bs4_available, is_ftfy_available
        >>> quiet_call(Pipe(), {"prompt": "a cat"}) == (
        ...     {"prompt": "a cat"} if is_bs4_available() and is_ftfy_available()
        ...     else {"prompt": "a cat", "clean_caption": False})
        True
    """
    import inspect

    from diffusers.utils import is_bs4_available, is_ftfy_available

    if "clean_caption" in kwargs or (is_bs4_available() and is_ftfy_available()):
        return kwargs
    try:
        params = inspect.signature(pipe.__call__).parameters
    except (TypeError, ValueError):
        return kwargs
    return {**kwargs, "clean_caption": False} if "clean_caption" in params else kwargs


@contextlib.contextmanager
def quiet_loading(quiet: bool = True) -> Iterator[None]:
    """Inside the block (``quiet=True``), no loading bars of diffusers, transformers or the Hub (each library's own switch);
    each comes back as it was after it.

    Example:
        >>> from diffusers.utils import logging as dl
        >>> before = dl.is_progress_bar_enabled()
        >>> with quiet_loading():
        ...     dl.is_progress_bar_enabled()
        False
        >>> dl.is_progress_bar_enabled() == before
        True
    """
    if not quiet:
        yield
        return
    from diffusers.utils import logging as diffusers_logging
    from huggingface_hub import utils as hub_utils
    from transformers.utils import logging as transformers_logging

    switches = [(diffusers_logging.is_progress_bar_enabled(), diffusers_logging.disable_progress_bar,
                 diffusers_logging.enable_progress_bar),
                (transformers_logging.is_progress_bar_enabled(), transformers_logging.disable_progress_bar,
                 transformers_logging.enable_progress_bar),
                (not hub_utils.are_progress_bars_disabled(), hub_utils.disable_progress_bars,
                 hub_utils.enable_progress_bars)]
    for _, off, _on in switches:
        off()
    try:
        yield
    finally:
        for was_on, _off, on in switches:
            if was_on:
                on()
