"""I2VGen-XL's image conditioning, built from the clip's first frame as diffusers 0.42.1
pipelines/deprecated/i2vgen_xl/pipeline_i2vgen_xl.py ``__call__`` builds it from the user's image (:640-656): the CLIP
image embedding of the frame centre-cropped to a square of the clip's width and resized to the feature extractor's
crop size (``_center_crop_wide``, ``_resize_bilinear``, ``_encode_image`` :331-361), and the VAE latents of the frame
cropped to the clip's size (a sample drawn from the latent distribution, times ``scaling_factor``) as latent frame 0,
followed by one constant frame per later frame holding its position ``(i + 1) / (num_frames - 1)``
(``prepare_image_latents`` :452-482). The UNet takes them as ``image_embeddings`` and ``image_latents``, separate
arguments (unet_i2vgen_xl.py:444-446), not channels of the noisy latents; its ``fps`` is :mod:`.fps`'s.

The pipeline's own helpers run here on the frame as the 8-bit picture a user gives ``__call__``, without classifier-free
guidance (its unconditional half is zeros, which training never feeds), so sampling and training see one encoding.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("i2vgen_image")
def _i2vgen_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> dict[str, torch.Tensor]:
    from diffusers.pipelines.deprecated.i2vgen_xl.pipeline_i2vgen_xl import _center_crop_wide, _resize_bilinear

    from ..image_embeds import IMAGE_KEY, pil_frames
    from ..pipeline_methods import without_guidance

    pipe, device = tp.pipe, tp.device
    frames = pixels.shape[2] if pixels.dim() == 5 else 1
    height, width = pixels.shape[-2:]
    embeds, image_latents = [], []
    # one sample at a time: the pipeline's helpers take one picture (a list is read as one prompt's pictures)
    for image in pil_frames(pixels):
        with torch.no_grad(), without_guidance(pipe):
            crop = pipe.feature_extractor.crop_size
            square = _resize_bilinear(_center_crop_wide(image, (width, width)), (crop["width"], crop["height"]))
            embed = pipe._encode_image(square, device, 1)
            resized = pipe.video_processor.preprocess(_center_crop_wide(image, (width, height)))
            image_latents.append(pipe.prepare_image_latents(resized.to(device=device, dtype=embed.dtype), device,
                                                            frames, 1).float())
        embeds.append(embed.float())
    return {IMAGE_KEY: torch.cat(embeds), "image_latents": torch.cat(image_latents)}
