"""Calling a pipeline's own methods outside its ``__call__`` (``encode_prompt``, ``encode_image``): the parameters
still missing, and the guidance state some read. Imports nothing else of the layer, so both encoders can use it.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator
from typing import Any

__all__ = ["required_params", "without_guidance"]


def required_params(params: Any, given: Any) -> list[str]:
    """The parameters of a signature that have no default and are not in ``given``.

    Example:
        >>> import inspect
        >>> required_params(inspect.signature(lambda prompt, image, device=None, *a, **k: 0).parameters, {"prompt"})
        ['image']
    """
    return [k for k, p in params.items() if k not in given and p.default is inspect.Parameter.empty
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


@contextlib.contextmanager
def without_guidance(pipe: Any) -> Iterator[None]:
    """Inside the block, ``do_classifier_free_guidance`` reading ``_guidance_scale`` (set only by ``__call__``;
    I2VGenXL's ``encode_prompt`` reads it) sees scale 1, as training encodes.

    Example:
        >>> class P:
        ...     do_classifier_free_guidance = property(lambda self: self._guidance_scale > 1)
        >>> p = P()
        >>> with without_guidance(p):
        ...     p.do_classifier_free_guidance
        False
        >>> hasattr(p, "_guidance_scale")
        False
    """
    if not isinstance(getattr(type(pipe), "do_classifier_free_guidance", None), property) or hasattr(pipe, "_guidance_scale"):
        yield
        return
    pipe._guidance_scale = 1.0
    try:
        yield
    finally:
        del pipe._guidance_scale
