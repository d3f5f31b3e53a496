"""One record type for every tiny pipeline: how to build it, how to call it for two steps, what it returns.

The records are gathered in :data:`hf_precision.testing.registry.PIPELINES`; the builder modules
(``pipelines``, ``families_unet``, ``families_dit``, ``video_families``) each hold their builders and a ``ROWS``
tuple of records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from .parts import finish_pipeline

__all__ = ["TinyPipeline"]


@dataclass(frozen=True)
class TinyPipeline:
    """One tiny random-weight pipeline.

    ``pipeline_class`` is the diffusers class, ``recipe`` the shipped recipe that names it, ``build(seed)`` (or
    ``build(size=, seed=)`` where ``sizes`` holds presets) returns it in float32, ``kwargs()`` (``kwargs(size)``)
    gives fresh call kwargs for a 2-step run without a generator, and ``output`` is the attribute of the pipeline
    output holding the result. ``tags`` say what it is: ``image``/``video``, ``unet``/``dit``, and ``core`` for the
    five pipelines with size presets. ``loads`` is False where diffusers cannot load the saved folder back with
    ``from_pretrained``; ``prepare`` applies what a saved folder does not keep; ``mode`` (``t2v``, ``i2v``, ...) and
    ``time_mlp`` (the denoiser's timestep-embedding MLP) describe video pipelines.

    >>> from hf_precision.testing.registry import PIPELINES
    >>> PIPELINES["ltx"].pipeline_class, PIPELINES["ltx"].mode, "video" in PIPELINES["ltx"].tags
    ('LTXPipeline', 't2v', True)
    """

    name: str
    pipeline_class: str
    recipe: str
    build: Callable[..., Any] = field(repr=False)
    kwargs: Callable[..., dict[str, Any]] = field(repr=False)
    tags: tuple[str, ...] = ()
    output: str = "images"
    loads: bool = True
    prepare: Callable[[Any], Any] | None = field(default=None, repr=False)
    mode: str = ""
    time_mlp: str = ""
    sizes: Mapping[str, Any] | None = field(default=None, repr=False)

    def make(self, seed: int = 0, size: str | Mapping[str, Any] = "tiny") -> Any:
        """A fresh float32 pipeline, deterministic given ``seed``, in eval mode and ready to call."""
        if self.sizes is not None:
            pipe = self.build(size=size, seed=seed)
        elif size != "tiny":
            raise ValueError(f"{self.name} has one size, 'tiny'; sized pipelines: those tagged 'core'")
        else:
            pipe = self.build(seed)
        return self.ready(finish_pipeline(pipe))

    def ready(self, pipe: Any) -> Any:
        """Apply the settings a saved folder does not keep (Allegro's VAE only decodes tiled); returns ``pipe``."""
        if self.prepare is not None:
            self.prepare(pipe)
        return pipe

    def call_kwargs(self, size: str = "tiny", **overrides: Any) -> dict[str, Any]:
        """Fresh kwargs for a 2-step call with ``output_type="np"`` (add a ``generator``), ``overrides`` on top."""
        kwargs = self.kwargs(size) if self.sizes is not None else self.kwargs()
        return {**kwargs, **overrides}

    def result(self, out: Any) -> Any:
        """The result array/tensor of a pipeline call (``out.images``, ``out.frames``, ...)."""
        return getattr(out, self.output)
