"""One record type for every tiny pipeline: how to build it, how to call it for two steps, what it returns; built from
a row (:mod:`~hf_precision.testing.rows`) by :mod:`~hf_precision.testing.build`, gathered in
:data:`hf_precision.testing.registry.PIPELINES`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .parts import finish_pipeline
from .rows import Row, known_sizes, resolve_call

__all__ = ["TinyPipeline"]


@dataclass(frozen=True)
class TinyPipeline:
    """One tiny random-weight pipeline, from its row (the fields are the row's: :mod:`~hf_precision.testing.rows`).

    ``make(seed, size=)`` returns it in float32; ``call_kwargs()`` gives fresh 2-step call kwargs without a generator;
    ``ready`` applies what a saved folder does not keep.

    >>> from hf_precision.testing.registry import PIPELINES
    >>> PIPELINES["ltx"].pipeline_class, PIPELINES["ltx"].mode, "video" in PIPELINES["ltx"].tags
    ('LTXPipeline', 't2v', True)
    """

    row: Row = field(repr=False)
    lookup: Callable[[str], "TinyPipeline"] = field(repr=False, compare=False)

    name = property(lambda self: self.row.name)
    pipeline_class = property(lambda self: self.row.data["pipeline"])
    recipe = property(lambda self: self.row.data["recipe"])
    tags = property(lambda self: tuple(self.row.data.get("tags", ())))
    output = property(lambda self: self.row.data.get("output", "images"))
    loads = property(lambda self: bool(self.row.data.get("loads", True)))
    mode = property(lambda self: self.row.data.get("mode", ""))
    time_mlp = property(lambda self: self.row.data.get("time_mlp", ""))
    source = property(lambda self: self.row.source)

    @property
    def sizes(self) -> tuple[str, ...] | None:
        """The size presets (``tiny`` first) of a ``core`` row; None for a row with one size."""
        return tuple(known_sizes(self.row)) if self.row.data.get("sizes") else None

    def build(self, seed: int = 0, size: str | Mapping[str, Any] = "tiny") -> Any:
        """The pipeline as built, not yet finished (models in train mode): what ``make`` and derived rows start from."""
        from .build import build_pipeline

        return build_pipeline(self.row, seed, size, self.lookup)

    def make(self, seed: int = 0, size: str | Mapping[str, Any] = "tiny") -> Any:
        """A fresh float32 pipeline, deterministic given ``seed``, in eval mode and ready to call; ``size`` is ``"tiny"``, a
        ``core`` row's preset (``"mid"``), or a dict of config overrides over ``tiny`` (or over its ``"base"`` preset).
        """
        return self.ready(finish_pipeline(self.build(seed, size)))

    def ready(self, pipe: Any) -> Any:
        """Apply the settings a saved folder does not keep (Allegro's VAE only decodes tiled); returns ``pipe``."""
        from .hooks import HOOKS

        if "prepare" in self.row.data:
            HOOKS["prepare"][self.row.data["prepare"]](pipe)
        return pipe

    def call_kwargs(self, size: str = "tiny", **overrides: Any) -> dict[str, Any]:
        """Fresh kwargs for a 2-step ``output_type="np"`` call (add a ``generator``), at ``size``'s preset, ``overrides`` on top."""
        from .build import call_value

        kwargs = {k: call_value(v) for k, v in resolve_call(self.row, size if self.sizes else "tiny").items()}
        return {**kwargs, **overrides}

    def result(self, out: Any) -> Any:
        """The result array/tensor of a pipeline call (``out.images``, ``out.frames``, ...)."""
        return getattr(out, self.output)
