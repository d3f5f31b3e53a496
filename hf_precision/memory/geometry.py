"""Latent geometry: how far a VAE compresses space and time, and the per-axis values of a model config.

One reading of the configs for every program that sizes latents: the video rules (frame steps, size multiples),
the training data's buckets and the training plan's latents. Torch-free.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

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
    """(spatial, temporal) compression of a VAE of class ``cls``, as the diffusers pipelines compute them; an image
    VAE: ``2**(len(block_out_channels)-1)`` (8 without the key) and no temporal compression.

    Example:
        >>> vae_factors("AutoencoderKLWan", {"temperal_downsample": [False, True, True]})
        (8, 4)
        >>> vae_factors("AutoencoderKL", {"block_out_channels": [128, 256, 512, 512]})
        (8, 1)
    """
    if cls == "AutoencoderKLWan":
        # pipeline_wan.py: vae_scale_factor_temporal = 2 ** sum(temperal_downsample), spatial = 2 ** len(...)
        down = list(config.get("temperal_downsample", [False, True, True]))
        return 2 ** len(down), 2 ** sum(bool(d) for d in down)
    if cls == "AutoencoderKLLTXVideo":
        # autoencoder_kl_ltx.py: spatial = patch_size * 2**sum(spatio_temporal_scaling), temporal = patch_size_t * ...
        scaling = list(config.get("spatio_temporal_scaling", [True, True, True, False]))
        n = sum(bool(s) for s in scaling)
        return int(config.get("patch_size", 4)) * 2 ** n, int(config.get("patch_size_t", 1)) * 2 ** n
    if cls in ("AutoencoderKLCogVideoX", "AutoencoderKLHunyuanVideo"):
        blocks = config.get("block_out_channels", [0, 0, 0, 0])
        spatial = int(config.get("spatial_compression_ratio") or 2 ** (len(blocks) - 1))
        return spatial, int(config.get("temporal_compression_ratio", 4))
    if cls == "AutoencoderKLMochi":  # pipeline_mochi.py: vae_spatial_scale_factor = 8, vae_temporal_scale_factor = 6
        return 8, 6
    if cls == "AutoencoderKLTemporalDecoder":  # SVD: 2D spatial, no temporal compression
        return 2 ** (len(config.get("block_out_channels", [0] * 4)) - 1), 1
    blocks = config.get("block_out_channels")
    return (2 ** (len(blocks) - 1) if blocks else 8), int(config.get("temporal_compression_ratio", 1) or 1)
