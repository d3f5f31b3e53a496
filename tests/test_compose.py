"""Any pipeline class loads: a recipe is composed from the component recipes when none lists the class."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.recipe import compose_spec, resolve
from hf_precision.runtime.source import models_of_class, role_of


def _pipeline_classes() -> list[str]:
    import diffusers

    return sorted(n for n in dir(diffusers) if n.endswith("Pipeline") and n != "DiffusionPipeline"
                  and isinstance(getattr(diffusers, n), type) and issubclass(getattr(diffusers, n), diffusers.DiffusionPipeline))


def test_no_pipeline_class_diffusers_ships_lacks_a_recipe():
    classes = _pipeline_classes()
    assert len(classes) > 100, "diffusers exports fewer pipeline classes than expected: the scan found nothing"
    failures, composed = [], 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in classes:
            try:
                models = models_of_class(name)
                for device in ("t4", "a100"):
                    recipe = resolve(pipeline_class=name, models=models, layout=device)
                composed += recipe.name.startswith("composed:")
                assert set(recipe.components) == set(models) or not recipe.name.startswith("composed:")
            except hp.RecipeError as err:
                if "names no model class" not in str(err):  # text-diffusion LLMs declare `model: Any`
                    failures.append(f"{name}: {err}"[:300])
            except Exception as err:  # noqa: BLE001 - every failure is collected and reported below
                failures.append(f"{name}: {type(err).__name__}: {err}"[:300])
    assert not failures, "\n".join(failures)
    assert composed > 50


def test_composition_uses_component_recipes_and_finds_the_denoiser_by_role():
    models = models_of_class("StableDiffusionXLControlNetXSPipeline")
    with pytest.warns(UserWarning, match=r"controlnet \(ControlNetXSAdapter\).*--set controlnet.dtype=float32"):
        spec = compose_spec("StableDiffusionXLControlNetXSPipeline", models)
    assert spec["denoiser"] == "unet"
    assert spec["components"]["unet"]["use"].startswith("unet.")
    assert spec["components"]["text_encoder_2"] == {"use": "clip.text"}
    assert spec["components"]["controlnet"]["nan_guard"] is True


def test_roles_come_from_where_diffusers_keeps_the_class():
    from diffusers import AutoencoderKL, ControlNetModel, UNet2DModel
    from transformers import CLIPTextModel

    assert [role_of(c) for c in (UNet2DModel, AutoencoderKL, ControlNetModel, CLIPTextModel)] == \
        ["denoiser", "vae", "controlnet", "encoder"]


@pytest.fixture(scope="module")
def unlisted_folder(tmp_path_factory):
    # An SDXL folder saved as a class no shipped recipe lists (its model_index says so): composition must load it.
    import json

    from hf_precision.testing import make_pipeline, save_pipeline

    folder = save_pipeline(make_pipeline("sdxl", seed=0), tmp_path_factory.mktemp("sdxl-pag"))
    index = json.loads((folder / "model_index.json").read_text())
    index["_class_name"] = "StableDiffusionXLPAGPipeline"
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_a_pipeline_class_without_a_recipe_loads_and_runs(unlisted_folder):
    from hf_precision.testing import example_call_kwargs

    pipe = hp.load_pipeline(unlisted_folder, "cpu", layout="t4")
    record = hp.applied(pipe)
    assert record.recipe.name == "composed:StableDiffusionXLPAGPipeline"
    assert record.recipe.denoiser == "unet"
    planned = record.recipe  # composed from the component recipes of each class
    assert (str(pipe.unet.dtype), str(pipe.vae.dtype)) == (f"torch.{planned['unet'].compute}", f"torch.{planned['vae'].compute}")
    assert planned["unet"].compute == hp.get_recipe("sdxl", device="t4")["unet"].compute  # unet.sdxl, by class
    out = pipe(**example_call_kwargs("sdxl"), generator=torch.Generator().manual_seed(0))
    assert np.isfinite(out.images).all()


def test_show_prints_a_composed_recipe(capsys):
    from hf_precision.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        rc = main(["show", "--class", "ZImageControlNetPipeline", "--device", "a100", "--brief"])
    out = capsys.readouterr().out
    assert rc == 0 and "composed:ZImageControlNetPipeline" in out and "controlnet" in out and "transformer" in out
