"""The activation peak of each inference phase, counted on torch's ``meta`` device (shapes, no storage).

Each helper runs the phase's forward as the pipelines run it and returns the bytes it keeps alive at most
(:func:`hf_precision.memory.counting.count_live_bytes`): text encoder, image encoder, VAE encode and decode, one
denoiser call. Inputs are made before counting (an earlier phase made them), so a figure is what the forward adds.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from .counting import count_live_bytes

__all__ = ["meta_module", "text_encode_peak", "image_encode_peak", "vae_encode_peak",
           "vae_decode_peak", "denoise_peak"]


def meta_module(index: Mapping[str, Any], configs: Mapping[str, Any], name: str, dtype: Any) -> Any:
    """Component ``name`` of a pipeline (``model_index.json`` and its configs) built on meta in ``dtype``.

    Example:
        >>> import torch
        >>> index = {"vae": ["diffusers", "AutoencoderKL"]}
        >>> config = {"block_out_channels": [8], "norm_num_groups": 8, "latent_channels": 4}
        >>> vae = meta_module(index, {"vae": config}, "vae", torch.float16)
        >>> next(vae.parameters()).device.type, next(vae.parameters()).dtype
        ('meta', torch.float16)
    """
    from ..runtime.meta import build_on_meta
    from ..runtime.source import listed_components

    return build_on_meta(*listed_components(index)[name], configs[name], dtype, pipeline=index.get("_class_name"))


def _peak(forward: Callable[[], Any], cpu: bool = False) -> int:
    """The bytes ``forward()`` keeps alive at its peak; what it returns is freed before the count ends."""
    with count_live_bytes(cpu) as live:
        out = forward()
        del out
    return live.peak


def text_encode_peak(module: Any, length: int, hidden_states: bool = False) -> int:
    """A text encoder on one prompt of ``length`` tokens (at most its position table); ``hidden_states`` keeps every
    layer's output, as pipelines that read ``hidden_states[-2]`` ask for.

    Example:
        >>> from transformers import CLIPTextConfig, CLIPTextModel
        >>> import torch
        >>> with torch.device("meta"):
        ...     clip = CLIPTextModel(CLIPTextConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        ...                                         num_attention_heads=2, vocab_size=49408, max_position_embeddings=77))
        >>> text_encode_peak(clip, 1000) == text_encode_peak(clip, 77) > text_encode_peak(clip, 10)
        True
    """
    import torch

    kwargs: dict[str, Any] = {"output_hidden_states": True} if hidden_states else {}
    length = min(length, int(getattr(module.config, "max_position_embeddings", length) or length))
    # no mask: an all-ones mask is the same, and reading it needs values
    return _peak(lambda: module(input_ids=torch.zeros(1, length, dtype=torch.long, device="meta"), **kwargs))


def image_encode_peak(module: Any, dtype: Any) -> int:
    """A CLIP vision encoder on one image at its configured size (SVD resizes to 224 itself,
    pipeline_stable_video_diffusion.py `_encode_image`; Wan I2V reads ``hidden_states[-2]``, pipeline_wan_i2v.py
    `encode_image`, so every layer's output is kept).

    Example:
        >>> from transformers import CLIPVisionConfig, CLIPVisionModel
        >>> import torch
        >>> with torch.device("meta"):
        ...     clip = CLIPVisionModel(CLIPVisionConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        ...                                             num_attention_heads=2, image_size=32, patch_size=8))
        >>> image_encode_peak(clip, torch.float32) > 0
        True
    """
    import torch

    size = int(getattr(module.config, "image_size", 224))
    # The input exists before the encoder's forward (the pipeline's preprocessing): the measured phase, which starts
    # at that forward, does not include it, so neither does the count.
    pixels = torch.empty(1, 3, size, size, device="meta", dtype=dtype)
    return _peak(lambda: module(pixel_values=pixels, output_hidden_states=True))


def _latent_dist(vae: Any, pixels: Any) -> Any:
    return vae.encode(pixels).latent_dist


def vae_encode_peak(vae: Any, shape: tuple[int, ...], dtype: Any, *, cpu: bool = False,
                    encode: Callable[[Any, Any], Any] | None = None) -> int:
    """The VAE's encode of pixels of ``shape``: ``encode(vae, pixels)`` (default ``vae.encode(pixels).latent_dist``,
    what the image-to-video pipelines call; training passes its own, which samples). ``cpu`` counts the transient
    workspace of PyTorch's CPU conv3d.

    Example:
        >>> import torch
        >>> from diffusers import AutoencoderKL
        >>> with torch.device("meta"):
        ...     vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4)
        >>> vae_encode_peak(vae, (1, 3, 16, 16), torch.float32) < vae_encode_peak(vae, (1, 3, 32, 32), torch.float32)
        True
    """
    import torch

    pixels = torch.empty(*shape, device="meta", dtype=dtype)  # made by the pipeline before the phase
    return _peak(lambda: (encode or _latent_dist)(vae, pixels), cpu)


def vae_decode_peak(vae: Any, dtype: Any, latent: tuple[int, int, int], *, frames_per_call: int | None = None,
                    cpu: bool = False) -> int:
    """The VAE's decode of ``latent`` = (frames, height, width) latent positions, and the float32 frames the pipeline
    post-processes: the clip at once (``frames_per_call=None``), or that many latent frames a call, each chunk to
    float32 (the pipelines' ``decode_latents`` loop, SVD's ``decode_chunk_size``).

    Example:
        >>> import torch
        >>> from diffusers import AutoencoderKL
        >>> with torch.device("meta"):
        ...     vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, latent_channels=4)
        >>> one = vae_decode_peak(vae, torch.float32, (4, 8, 8), frames_per_call=1)
        >>> one < vae_decode_peak(vae, torch.float32, (4, 8, 8), frames_per_call=4)
        True
    """
    import torch

    f, h, w = latent
    c = vae.config.latent_channels if "latent_channels" in vae.config else vae.config.z_dim
    meta = {"device": "meta", "dtype": dtype}
    with count_live_bytes(cpu) as live:
        if frames_per_call is not None:
            z = torch.empty(f, c, h, w, **meta)
            n = frames_per_call
            accepts = "num_frames" in inspect.signature(vae.forward).parameters
            outs = []
            for i in range(0, f, n):  # frames go to the CPU as float32
                extra = {"num_frames": min(n, f - i)} if accepts else {}
                part = vae.decode(z[i:i + n], **extra).sample
                outs.append(part.float())
                del part
            out = torch.cat(outs)
        else:
            z = torch.empty(1, c, f, h, w, **meta)
            kwargs = {}
            if getattr(vae.config, "timestep_conditioning", False):
                kwargs["temb"] = torch.zeros(1, **meta)
            out = vae.decode(z, return_dict=False, **kwargs)[0]
            out = out.float()  # video_processor.postprocess_video works in float32
        del out
    return live.peak


def denoise_peak(module: Any, make_call: Callable[[], dict[str, Any]]) -> int:
    """One denoiser call with the keyword arguments ``make_call()`` builds (meta tensors, made before counting).

    Example:
        >>> import torch
        >>> class Denoiser(torch.nn.Module):
        ...     def forward(self, hidden_states, return_dict=True):
        ...         return (hidden_states * 2,)
        >>> denoise_peak(Denoiser(), lambda: {"hidden_states": torch.empty(8, 64, device="meta")})  # the product
        2048
    """
    call = make_call()
    return _peak(lambda: module(**call, return_dict=False))
