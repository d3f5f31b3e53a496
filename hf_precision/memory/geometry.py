"""Latent geometry: how far a VAE compresses space and time, and the per-axis values of a model config.

One reading of the configs for every program that sizes latents: the video rules (frame steps, size multiples),
the training data's buckets and the training plan's latents. Torch-free; the per-class facts are recipe data
(recipes/denoisers.yaml ``latents:``).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError

__all__ = ["axis_value", "vae_factors"]


def axis_value(value: Any, index: int = -1) -> int:
    """One axis of a per-axis config value (``patch_size`` as ``[t, h, w]`` or one number; missing is 1).

    Example:
        >>> axis_value([1, 2, 2]), axis_value([1, 2, 2], 0), axis_value(2), axis_value(None)
        (2, 1, 2, 1)
    """
    if isinstance(value, (list, tuple)):
        return int(value[index])
    return int(value or 1)


def vae_factors(cls: str, config: Mapping[str, Any]) -> tuple[int, int]:
    """(spatial, temporal) compression of a VAE of class ``cls``: its row of ``latents:`` in recipes/denoisers.yaml
    (``other`` for a class without one), computed from its config as the diffusers pipelines do.

    Example:
        >>> vae_factors("AutoencoderKLWan", {"temperal_downsample": [False, True, True]})
        (8, 4)
        >>> vae_factors("AutoencoderKL", {"block_out_channels": [128, 256, 512, 512]})
        (8, 1)
    """
    from ..recipe.calls import latent_factor

    row = _rows().get(cls) or _rows()["other"]
    try:
        return tuple(latent_factor(row[axis], config, row.get("defaults")) for axis in ("spatial", "temporal"))
    except RecipeError as err:
        raise RecipeError(f"{cls}: recipes/denoisers.yaml latents: {err}") from None


@functools.lru_cache(maxsize=1)
def _rows() -> dict[str, dict[str, Any]]:
    from ..recipe.calls import read_latents

    return read_latents()
