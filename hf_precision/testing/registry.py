"""Every tiny random-weight pipeline in one mapping, :data:`PIPELINES`, and one way to build any of them.

Each is a row of ``hf_precision/testing/tiny/*.yaml`` (schema: :mod:`~hf_precision.testing.rows`) built by
:mod:`~hf_precision.testing.build`, with what cannot be data in :mod:`~hf_precision.testing.hooks`; adding a
family is a row. Rows load on first use. More rows: YAML files in ``$HF_PRECISION_TINY_PIPELINES``
(``os.pathsep``-separated), or :func:`tiny_pipelines` (``tiny_pipelines("my_rows.yaml")["my_row"].make()``). Tests
pick rows by tag (``image``/``video``, ``unet``/``dit``, ``core``)::

    >>> select("video", "unet")
    ['animatediff', 'animatediff_controlnet', 'i2vgenxl', 'svd']
    >>> type(make_pipeline("dit")).__name__
    'DiTPipeline'
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from typing import Any

from .record import TinyPipeline

__all__ = ["PIPELINES", "TinyPipeline", "TinyPipelines", "make_pipeline", "select", "tiny_pipelines"]


class TinyPipelines(Mapping):
    """Name -> :class:`TinyPipeline`, read from the row files on first use (the shipped ones, then ``extra``).

    >>> rows = TinyPipelines()
    >>> rows._rows is None, rows["dit"].recipe, rows._rows is None
    (True, 'dit', False)
    """

    def __init__(self, *extra: str | os.PathLike[str]):
        self._extra = extra
        self._rows: dict[str, TinyPipeline] | None = None

    def _loaded(self) -> dict[str, TinyPipeline]:
        if self._rows is None:
            from .rows import load_rows

            self._rows = {name: TinyPipeline(row, self.__getitem__) for name, row in load_rows(*self._extra).items()}
        return self._rows

    def __getitem__(self, name: str) -> TinyPipeline:
        return self._loaded()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._loaded())

    def __len__(self) -> int:
        return len(self._loaded())

    def __repr__(self) -> str:
        return f"TinyPipelines({sorted(self._loaded())})"


PIPELINES = TinyPipelines()


def tiny_pipelines(*extra: str | os.PathLike[str]) -> TinyPipelines:
    """The shipped rows plus the rows of the YAML files ``extra`` (same schema); a bad row raises one clear error.

    >>> sorted(tiny_pipelines()) == sorted(PIPELINES)
    True
    """
    mapping = TinyPipelines(*extra)
    mapping._loaded()  # check the files now, where the caller named them
    return mapping


def make_pipeline(name: str, size: str | Mapping[str, Any] = "tiny", seed: int = 0) -> Any:
    """Build the tiny float32 pipeline registered as ``name`` (eval mode, progress bar off) at ``size``, as
    :meth:`TinyPipeline.make` takes it.

    >>> make_pipeline("sdxl", size={"unet": {"in_channels": 9}}).unet.config.in_channels
    9
    """
    if name not in PIPELINES:
        raise ValueError(f"unknown tiny pipeline {name!r}; use one of {sorted(PIPELINES)}")
    return PIPELINES[name].make(seed=seed, size=size)


def select(*tags: str, exclude: tuple[str, ...] | str = ()) -> list[str]:
    """Names of the rows carrying every tag in ``tags`` and none in ``exclude``, sorted.

    >>> names = select("image", "dit", exclude="core")  # what holds as rows are added
    >>> names == sorted(names), {"flux", "sd3"} <= set(names), "sdxl" in names
    (True, True, False)
    """
    excluded = {exclude} if isinstance(exclude, str) else set(exclude)
    return sorted(n for n, row in PIPELINES.items() if set(tags) <= set(row.tags) and not excluded & set(row.tags))
