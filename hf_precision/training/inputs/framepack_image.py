"""HunyuanVideo FramePack's clean prefix: the latents of the image the clip starts from, as diffusers 0.42.1
pipelines/hunyuan_video/pipeline_hunyuan_video_framepack.py ``__call__`` makes them from the user's image
(``prepare_image_latents`` :551-564: the VAE's latent sample times ``scaling_factor``, called at :822) and hands
the transformer as the first of ``latents_clean`` (:889, :895). The :mod:`.framepack` builder reads them from the
batch's ``image_latents``; without them it filled the prefix with zeros, a prefix no sampling run has. The image is
the clip's first frame, given as the [-1, 1] tensor ``video_processor.preprocess`` hands on (:806).
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("framepack_image")
def _framepack_image(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> dict[str, torch.Tensor]:
    first = pixels[:, :, 0] if pixels.dim() == 5 else pixels
    with torch.no_grad():
        image_latents = tp.pipe.prepare_image_latents(first, dtype=torch.float32, device=tp.device,
                                                      generator=generator)
    return {"image_latents": image_latents}
