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


def _wan_with_t5(seed: int = 0):
    # diffusers' own Wan tests build the pipeline with a T5EncoderModel (tests/pipelines/wan/test_wan.py,
    # get_dummy_components) where the release has a UMT5EncoderModel: the shipped recipe names the latter.
    from hf_precision.testing import PIPELINES
    from hf_precision.testing.parts import t5_encoder

    wan = PIPELINES["wan"]
    pipe = wan.make(seed)
    return type(pipe)(**{**pipe.components, "text_encoder": t5_encoder(seed)}), wan


def test_a_component_of_another_class_gets_the_recipe_for_its_class(tmp_path):
    from hf_precision.errors import RecipeError
    from hf_precision.testing import save_pipeline

    shipped = hp.get_recipe("wan", device="t4")["text_encoder"]
    assert "T5EncoderModel" not in shipped.classes  # without refitting, apply refused: "would not fit"
    pipe, wan = _wan_with_t5()
    folder = save_pipeline(pipe, tmp_path / "wan-t5")
    loaded = wan.ready(hp.load_pipeline(folder, "cpu", layout="t4"))
    plan = hp.applied(loaded).recipe
    assert plan.name == "wan" and plan["text_encoder"].recipe == "t5.encoder"
    assert "T5EncoderModel" in plan["text_encoder"].classes
    assert plan["transformer"].recipe == hp.get_recipe("wan", device="t4")["transformer"].recipe  # the rest as shipped
    assert str(loaded.transformer.dtype) == f"torch.{plan['transformer'].compute}"
    assert str(loaded.text_encoder.dtype) == f"torch.{plan['text_encoder'].compute}"
    frames = loaded(**wan.call_kwargs(), generator=torch.Generator().manual_seed(0)).frames
    assert np.isfinite(np.asarray(frames)).all()
    # a component recipe the user names is still checked against the class
    with pytest.raises(RecipeError, match="would not fit"):
        hp.load_pipeline(folder, "cpu", layout="t4", overrides={"text_encoder": {"use": "video_text.umt5"}})


def test_composed_vae_entry_points_are_candidates_not_requirements():
    # A VAE class no component recipe lists gets the usual VAE entry points; one built without quant convs
    # (AutoencoderKLFlux2, AutoencoderKL(use_quant_conv=False)) must not be refused for lacking them.
    from hf_precision.runtime.layout import check_user_names

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        recipe = resolve(pipeline_class="NoSuchVAEPipeline", models={"vae": ("NoSuchVAE", "vae")}, layout="t4")
    vae = torch.nn.ModuleDict({"encoder": torch.nn.Linear(2, 2), "decoder": torch.nn.Linear(2, 2)})
    assert "quant_conv" in recipe["vae"].entry
    check_user_names(recipe["vae"], vae)  # raised "name no module of ModuleDict" before


def test_an_unknown_class_keeps_its_own_keep_in_fp32_modules():
    # Kandinsky 5 feeds fp32 sinusoids to `time_embeddings` (transformer_kandinsky.py:169-171) and lists it in
    # `_keep_in_fp32_modules`; a composed recipe knows nothing of the class, so the class's own list is its start.
    # Without it the bf16 run raised "mat1 and mat2 must have the same dtype, but got Float and BFloat16".
    from hf_precision.runtime.layout import component_islands

    class TimeFirst(torch.nn.Module):
        _keep_in_fp32_modules = ["time_embeddings", "modulation"]

        def __init__(self):
            super().__init__()
            self.time_embeddings = torch.nn.Linear(4, 4)
            self.blocks = torch.nn.ModuleList([torch.nn.ModuleDict({"modulation": torch.nn.Linear(4, 4)})])
            self.proj = torch.nn.Linear(4, 4)

        def forward(self, x, t):
            return self.proj(x + self.time_embeddings(t.float()) + self.blocks[0]["modulation"](x))

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plan = resolve(pipeline_class="NoSuchPipeline", models={"transformer": ("TimeFirst", "denoiser")},
                       layout="a100")["transformer"]
    module = TimeFirst()
    assert plan.compute == "bfloat16" and not plan.recipe
    assert component_islands(plan, module) == ["time_embeddings", "blocks.0.modulation"]
    shipped = hp.get_recipe("wan", device="a100")["transformer"]  # a component recipe's islands are its own
    assert "blocks.0.modulation" not in component_islands(shipped, module, strict=False)

    from diffusers import DiffusionPipeline  # the same through apply_recipe, on a pipeline holding that component

    class OnePipeline(DiffusionPipeline):
        def __init__(self, transformer):
            super().__init__()
            self.register_modules(transformer=transformer)

    pipe = OnePipeline(TimeFirst())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hp.apply_recipe(pipe, device="cpu", layout="a100")
    x = torch.randn(2, 4)
    assert torch.isfinite(pipe.transformer(x, torch.ones(2, 4))).all()
    assert pipe.transformer.time_embeddings.weight.dtype == torch.float32
    assert pipe.transformer.proj.weight.dtype == torch.bfloat16
