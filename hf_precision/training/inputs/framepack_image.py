"""HunyuanVideo FramePack's clean prefix: the latents of the image the clip starts from, as diffusers 0.42.1
pipelines/hunyuan_video/pipeline_hunyuan_video_framepack.py ``__call__`` makes them from the user's image
(``prepare_image_latents`` :551-564: the VAE's latent sample times ``scaling_factor``, called at :822) and hands
the transformer as the first of ``latents_clean`` (:889, :895). The :mod:`.framepack` builder reads them from the
batch's ``image_latents`` (the row's ``prefix_frame``); ``tp.loss`` refuses a batch without them, for zeros there are
a prefix no sampling run has. The image is the clip's first frame, given as the [-1, 1] tensor
``video_processor.preprocess`` hands on (:806).

The clip's own first latent frame is no stand-in for them: models/autoencoders/autoencoder_kl_hunyuan_video.py pads
its convolutions causally (:63-70) and masks its mid-block attention causally (:33-43), but its GroupNorms
(:156, :159, :489) take their statistics over every frame of the clip, so the first latent frame depends on the
frames after it (on the tiny VAE, a 9-frame clip's differs from the first frame's own encoding by up to 0.12 where
the latents reach 0.70; a still clip's by 7e-7).
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
