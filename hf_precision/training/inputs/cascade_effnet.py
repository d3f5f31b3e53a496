"""Stable Cascade decoder's ``effnet``: diffusers 0.42.1 pipelines/stable_cascade/pipeline_stable_cascade.py
``__call__`` hands the decoder the prior's ``image_embeddings`` there (:445-449, :489; zeros only as the
unconditional half of classifier-free guidance), which the prior pipeline makes from the caption. The decoder
pipeline has no encoder that makes them from a picture (its components, :96-103: decoder, tokenizer, text_encoder,
scheduler, vqgan; Stable Cascade trained the decoder on an EfficientNet encoder's features of the image), so no
builder here can make them from the training sample: the encode phase refuses, naming what to give, rather than
train the decoder on zeros, an input its pipeline never conditions on alone.
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


@condition("cascade_effnet")
def _cascade_effnet(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> dict[str, torch.Tensor]:
    from ..rules import TrainingError

    channels = tp._denoiser().config.get("effnet_in_channels")
    raise TrainingError(
        f"StableCascadeDecoderPipeline: its decoder takes effnet ({channels} channels), the prior's image_embeddings "
        f"(pipeline_stable_cascade.py:445-449), which this pipeline cannot make from a picture (it has no "
        f"EfficientNet encoder); give batch['effnet'] yourself: the prior pipeline's image_embeddings for the "
        f"caption, or EfficientNet features of the image, (B, {channels}, h, w); batch['effnet'] = None trains on "
        f"zeros on purpose (the pipeline's unconditional input)")
