"""An architecture is data: a recipe written only in a temporary folder, for a component family the package
does not ship (diffusers' UNet2DModel in an unconditional DDPMPipeline), loads and runs with no Python changes.
This is the docs/DESIGN.md "Adding an architecture" checklist, steps 1-2, carried out by a user."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.recipe import recipe_for_class

RECIPE = """\
schema: 1
kind: pipeline
pipelines: [DDPMPipeline]
denoiser: unet
latents_from: unet
components:
  unet:
    class: [UNet2DModel]
    dtypes: [float16, float32]
    keep_fp32: [time_embedding]
    no_cast: [timestep]
    output: input
    why: an unconditional pixel-space UNet; its timestep MLP stays fp32 like the SD UNets'
"""


@pytest.fixture(scope="module")
def ddpm_folder(tmp_path_factory):
    from diffusers import DDPMPipeline, DDPMScheduler, UNet2DModel

    torch.manual_seed(0)
    unet = UNet2DModel(sample_size=8, in_channels=3, out_channels=3, layers_per_block=1, block_out_channels=(8, 16),
                       norm_num_groups=4, down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                       up_block_types=("AttnUpBlock2D", "UpBlock2D"), attention_head_dim=4)
    folder = tmp_path_factory.mktemp("ddpm")
    DDPMPipeline(unet=unet, scheduler=DDPMScheduler(num_train_timesteps=10)).save_pretrained(folder)
    return folder


@pytest.fixture
def recipe_file(tmp_path):
    path = tmp_path / "ddpm.yaml"
    path.write_text(RECIPE)
    return path


def test_the_package_ships_nothing_for_this_family():
    assert not any("UNet2DModel" in str(hp.get_recipe(n).to_dict()) for n in hp.list_recipes("pipeline"))
    with pytest.raises(hp.RecipeError, match="no recipe for pipeline class 'DDPMPipeline'"):
        recipe_for_class("DDPMPipeline")


def test_a_recipe_from_a_temporary_folder_loads_and_runs(ddpm_folder, recipe_file):
    pipe = hp.load_pipeline(ddpm_folder, "cpu", recipe=str(recipe_file), layout="t4")
    record = hp.applied(pipe)
    assert record.recipe["unet"].compute == "float16" and record.recipe.denoiser == "unet"
    assert pipe.unet.conv_in.weight.dtype == torch.float16
    assert {p.dtype for p in pipe.unet.time_embedding.parameters()} == {torch.float32}
    assert record.islands["unet"] == ["time_embedding"]
    out = pipe(batch_size=1, num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0))
    assert np.isfinite(out.images).all() and out.images.shape == (1, 8, 8, 3)


def test_the_same_family_fails_without_the_recipes_casts(ddpm_folder):
    # What the recipe buys: the same fp16 UNet with the same fp32 island, made by hand, fails in plain diffusers.
    from diffusers import DDPMPipeline

    pipe = DDPMPipeline.from_pretrained(ddpm_folder, dtype=torch.float16)
    pipe.unet.time_embedding.to(torch.float32)
    with pytest.raises(RuntimeError, match="dtype|type"):
        pipe(batch_size=1, num_inference_steps=2, output_type="np")


def test_a_wrong_class_is_refused_with_the_recipe_and_class_named(tiny_pipe, recipe_file):
    pipe = tiny_pipe("sd15")
    with pytest.raises(hp.RecipeError, match=r"is for DDPMPipeline, not StableDiffusionPipeline"):
        hp.apply_recipe(pipe, str(recipe_file), device="cpu")
    # forced past the pipeline class, the component class is still checked
    with pytest.raises(hp.RecipeError, match=r"unet is a UNet2DConditionModel.*for UNet2DModel"):
        hp.apply_recipe(pipe, str(recipe_file), device="cpu", force=True)
