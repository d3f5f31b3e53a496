"""The pieces the tiny-pipeline builder shares: one seeded build, the finishing touch, example inputs, a tiny T5.

    >>> import torch
    >>> a = seeded(0, lambda: torch.nn.Linear(2, 2))
    >>> b = seeded(0, lambda: torch.nn.Linear(2, 2))
    >>> torch.equal(a.weight, b.weight)
    True
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["example_image", "finish_pipeline", "seeded", "t5_encoder"]

def seeded(seed: int, build: Callable[[], Any]) -> Any:
    """Build one component from a fixed seed, so its weights do not depend on the order the others were built in."""
    import torch

    torch.manual_seed(seed)
    return build()


def t5_encoder(seed: int, umt5: bool = False, **overrides: Any) -> Any:
    """A tiny T5 encoder (``umt5``: the UMT5 encoder Wan and AuraFlow use): the ``t5`` preset of ``tiny/_presets.yaml``
    plus ``overrides``.

    >>> t5_encoder(0, d_model=24).config.d_model
    24
    """
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    from .rows import presets

    config = dict(presets()["t5"], **overrides)
    if umt5:
        return seeded(seed, lambda: UMT5EncoderModel(UMT5Config(**config)))
    return seeded(seed, lambda: T5EncoderModel(T5Config(**config)))


def finish_pipeline(pipe):
    """Put a freshly built test pipeline in inference form: every model in eval mode, progress bars off.

    Example:
        >>> from hf_precision.testing import PIPELINES
        >>> finish_pipeline(PIPELINES["dit"].build()).transformer.training
        False
    """
    for component in pipe.components.values():
        if hasattr(component, "eval") and hasattr(component, "parameters"):
            component.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


def example_image(size: int = 32, seed: int = 0):
    """A random RGB ``PIL.Image`` of ``size`` x ``size`` pixels, the same for the same ``seed``.

    >>> example_image(16).size
    (16, 16)
    """
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
