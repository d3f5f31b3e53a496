"""The tiny Flux pipeline by its old name, for the benchmarks that import it from here; every family is a row of
``tiny/dit.yaml`` (:data:`hf_precision.testing.registry.PIPELINES`).

    >>> type(make_flux()).__name__
    'FluxPipeline'
"""

from __future__ import annotations

from typing import Any

from .registry import make_pipeline

__all__ = ["make_flux"]


def make_flux(seed: int = 0) -> Any:
    """A random-weight ``FluxPipeline`` (dev-style: guidance embedding on), ``make_pipeline("flux", seed=seed)``."""
    return make_pipeline("flux", seed=seed)
