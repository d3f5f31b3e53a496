"""Every tiny random-weight pipeline in one dict, :data:`PIPELINES`, and one way to build any of them.

A row is a :class:`~hf_precision.testing.record.TinyPipeline`; the rows live next to their builders
(:mod:`~hf_precision.testing.pipelines` for the five sized ``core`` ones, :mod:`~hf_precision.testing.families_unet`,
:mod:`~hf_precision.testing.families_dit`, :mod:`~hf_precision.testing.video_families`). Adding a family is a
builder and a row there. Tests pick rows by tag (``image``/``video``, ``unet``/``dit``, ``core``)::

    >>> select("video", "unet")
    ['animatediff', 'animatediff_controlnet', 'i2vgenxl', 'svd']
    >>> type(make_pipeline("dit")).__name__
    'DiTPipeline'
"""

from __future__ import annotations

from typing import Any, Mapping

from . import families_dit, families_unet, pipelines, video_families
from .record import TinyPipeline

__all__ = ["PIPELINES", "TinyPipeline", "make_pipeline", "select"]

PIPELINES: dict[str, TinyPipeline] = {}
for _row in (*pipelines.ROWS, *families_unet.ROWS, *families_dit.ROWS, *video_families.ROWS):
    if _row.name in PIPELINES:  # a second row under one name would silently replace the first
        raise ValueError(f"two tiny pipelines are named {_row.name!r}")
    PIPELINES[_row.name] = _row
del _row


def make_pipeline(name: str, size: str | Mapping[str, Any] = "tiny", seed: int = 0) -> Any:
    """Build the tiny float32 pipeline registered as ``name``, in eval mode, progress bar off, ready to call.

    ``size`` is ``"tiny"``, or for the ``core`` rows a preset (``"mid"``) or a dict of config overrides.

    >>> make_pipeline("sdxl", size={"unet": {"in_channels": 9}}).unet.config.in_channels
    9
    """
    if name not in PIPELINES:
        raise ValueError(f"unknown tiny pipeline {name!r}; use one of {sorted(PIPELINES)}")
    return PIPELINES[name].make(seed=seed, size=size)


def select(*tags: str, exclude: tuple[str, ...] | str = ()) -> list[str]:
    """Names of the rows carrying every tag in ``tags`` and none in ``exclude``, sorted.

    >>> select("image", "dit", exclude="core")[:3]
    ['auraflow', 'flux', 'flux_controlnet']
    """
    excluded = {exclude} if isinstance(exclude, str) else set(exclude)
    return sorted(n for n, row in PIPELINES.items() if set(tags) <= set(row.tags) and not excluded & set(row.tags))
