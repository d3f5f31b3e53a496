"""Conditioning a denoiser takes as arguments of their own, built in training as its pipeline's __call__ builds them
from the sample: I2VGen-XL's image latents and CLIP image embedding of the clip's first frame (it trained on zeros).
The reference is the pipeline's own __call__ on the same picture: what it hands the UNet is captured by a hook."""

from __future__ import annotations

import numpy as np
import torch
from PIL import Image

import hf_precision as hp
from hf_precision.testing import make_pipeline
from hf_precision.training import denoiser_rows

SIDE, FRAMES = 32, 3


def _clip() -> tuple[Image.Image, torch.Tensor]:
    """A first frame as the 8-bit picture a user hands __call__, and the (1, 3, FRAMES, H, W) clip in [-1, 1] the
    data loader makes with it as frame 0 (the later frames differ: only the first conditions)."""
    rng = np.random.default_rng(0)
    shots = [rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(FRAMES)]
    clip = torch.stack([torch.from_numpy(s).permute(2, 0, 1).float() / 127.5 - 1 for s in shots], dim=1)
    return Image.fromarray(shots[0]), clip[None]


def _call_inputs_of_pipeline(image: Image.Image, seed: int) -> dict:
    """The UNet's keyword arguments at the first step of I2VGenXLPipeline.__call__ for ``image`` (no guidance)."""
    from hf_precision.runtime.patches import text_model_alias

    pipe = make_pipeline("i2vgenxl", seed=0)
    text_model_alias(pipe.text_encoder)  # diffusers reads text_encoder.text_model, which transformers 5's CLIP lacks
    seen: dict = {}

    def grab(module, args, kwargs):
        seen.update(kwargs) if not seen else None
        raise StopIteration  # one call is enough

    pipe.unet.register_forward_pre_hook(grab, with_kwargs=True)
    torch.manual_seed(seed)  # the VAE's latent sample in prepare_image_latents draws from the global generator
    try:
        pipe(prompt="a cat", image=image, height=SIDE, width=SIDE, num_frames=FRAMES, guidance_scale=1.0,
             num_inference_steps=1, output_type="pt")
    except StopIteration:
        pass
    return seen


def test_i2vgenxl_trains_on_the_first_frames_image_latents_and_embedding_as_call_builds_them():
    image, clip = _clip()
    expected = _call_inputs_of_pipeline(image, seed=7)
    tp = hp.prepare_training(make_pipeline("i2vgenxl", seed=0), device="cpu", train={"unet": "lora"}, rank=2)
    batch = {"latents": tp.encode_images(clip), "prompt_embeds": torch.zeros(1, 4, 4)}
    torch.manual_seed(7)
    batch.update(tp.encode_condition(clip, batch["latents"]))
    module = tp._denoiser()
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective,
                                           tp.alphas_cumprod, torch.Generator().manual_seed(0))
    for arg in ("image_latents", "image_embeddings"):
        assert kwargs[arg].abs().sum() > 0, f"{arg} is zeros"
        torch.testing.assert_close(kwargs[arg].float(), expected[arg].float(), msg=arg)
    # frame 0 is the image's latents, later frames their position (i + 1) / (F - 1), as prepare_image_latents
    later = kwargs["image_latents"][0, :, 1:].transpose(0, 1).flatten(1)
    torch.testing.assert_close(later, torch.tensor([[0.5], [1.0]]).expand_as(later))
    torch.testing.assert_close(kwargs["fps"].float(), torch.full((1,), 16.0))  # __call__'s target_fps default
