"""A LoRA training step for each denoiser family with a recipe, on its tiny pipeline, in the T4 layout (fp16 compute
with loss scaling: the layout where boundaries and masters go wrong most often)."""

from __future__ import annotations

import pytest
import torch

import hf_precision as hp
from hf_precision.training import FAMILIES, example_batch, family_of
from training_checks import run_steps


def _build(name: str):
    from hf_precision.testing import make_pipeline

    return make_pipeline(name, seed=0)


CASES = {"sd15": "UNet2DConditionModel", "sdxl": "UNet2DConditionModel", "svd": "UNetSpatioTemporalConditionModel",
         "sd3": "SD3Transformer2DModel", "flux": "FluxTransformer2DModel", "pixart_sigma": "PixArtTransformer2DModel",
         "sana": "SanaTransformer2DModel", "wan": "WanTransformer3DModel", "cogvideox": "CogVideoXTransformer3DModel",
         "ltx": "LTXVideoTransformer3DModel", "hunyuan_video": "HunyuanVideoTransformer3DModel"}


@pytest.mark.parametrize("name", CASES)
def test_lora_step(name):
    pipe = _build(name)
    tp = hp.prepare_training(pipe, layout="t4")
    denoiser = tp.components[tp.denoiser_name]
    assert type(denoiser).__name__ == CASES[name] and family_of(denoiser) is FAMILIES[CASES[name]]
    assert tp.compute_dtype == torch.float16 and tp.scaler is not None
    losses = run_steps(tp, example_batch(denoiser, 1), steps=2)
    assert all(torch.isfinite(torch.tensor(losses)))


def test_every_family_row_has_a_case():
    assert set(CASES.values()) == set(FAMILIES)


def test_unknown_denoiser_class_is_named():
    with pytest.raises(hp.RecipeError, match="no training row"):
        family_of(torch.nn.Linear(2, 2))


def test_a_pipeline_class_without_recipe_composes_as_inference_does():
    from diffusers import DiffusionPipeline

    from hf_precision.testing import make_pipeline

    class MyPipeline(DiffusionPipeline):  # a custom pipeline no shipped recipe lists
        def __init__(self, unet, vae, scheduler):
            super().__init__()
            self.register_modules(unet=unet, vae=vae, scheduler=scheduler)

    sd15 = make_pipeline("sd15", seed=0)
    pipe = MyPipeline(unet=sd15.unet, vae=sd15.vae, scheduler=sd15.scheduler)
    tp = hp.prepare_training(pipe, layout="t4")
    assert tp.recipe.name.startswith("composed") and tp.denoiser_name == "unet" and tp.kinds["unet"] == "lora" and tp.compute_dtype == torch.float16
    run_steps(tp, example_batch(tp.components["unet"], 1), steps=2)
