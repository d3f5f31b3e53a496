"""A dict of components trains under the recipe and plan its pipeline object gets (issue 32 item 1): the recipe is
chosen by one function (``recipe_of``) from the components' classes and configs; ``recipe=`` names it; a dict that
does not tell two recipes apart is refused, never given another family's recipe; a component the recipe does not
plan gets a row saying so."""

from __future__ import annotations

import itertools

import pytest

import hf_precision as hp
from hf_precision.recipe.catalog import _denoiser_index, list_recipes, pipeline_spec
from hf_precision.recipe.recognise import recognised_by
from hf_precision.runtime.choose import recipe_of
from hf_precision.testing import PIPELINES


def _train(name: str, tiny_pipe):
    """prepare_training on the pipeline object and on its components as a dict (tokenizers, schedulers included)."""
    as_pipe = hp.prepare_training(tiny_pipe(name), layout="t4")
    as_dict = hp.prepare_training(dict(tiny_pipe(name).components), layout="t4")
    return as_pipe, as_dict


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_a_dict_of_components_gets_the_recipe_and_plan_of_its_pipeline(name, tiny_pipe):
    pipe = tiny_pipe(name)
    assert recipe_of(dict(pipe.components)) == recipe_of(pipe) == PIPELINES[name].recipe
    as_pipe, as_dict = _train(name, tiny_pipe)
    assert as_dict.recipe.name == as_pipe.recipe.name == PIPELINES[name].recipe
    # the printed table is the per-component plan: storage, compute, what trains, islands and each rule
    assert str(as_dict) == str(as_pipe)
    assert as_dict.kinds == as_pipe.kinds and as_dict.objective == as_pipe.objective


def test_sdxl_components_as_a_dict_get_sdxl_not_sd15(tiny_pipe):
    """The issue's case: diffusers' SDXL training scripts hold the parts in a dict."""
    pipe = tiny_pipe("sdxl")
    parts = {k: getattr(pipe, k) for k in ("unet", "text_encoder", "text_encoder_2", "vae", "tokenizer", "tokenizer_2")}
    tp = hp.prepare_training(parts, layout="t4")
    assert tp.recipe.name == "sdxl"
    assert tp.applied.islands["unet"] == ["time_embedding", "add_embedding"]
    assert "text_encoder_2  frozen    float16" in str(tp)


def test_a_dict_that_does_not_tell_the_recipes_apart_is_refused(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    config = dict(pipe.unet.config)
    del config["addition_embed_type"]  # a UNet whose config does not say what it is (a third-party build)
    pipe.unet._internal_dict = config
    with pytest.raises(hp.RecipeError, match=r"configs do not tell which .*sdxl wants unet\.addition_embed_type = "
                                             r"'text_time' \(given: unet\.addition_embed_type = '<missing>'\).*recipe="):
        hp.prepare_training({"unet": pipe.unet, "vae": pipe.vae})
    tp = hp.prepare_training({"unet": pipe.unet, "vae": pipe.vae}, layout="t4", recipe="sdxl")
    assert tp.recipe.name == "sdxl" and tp.applied.islands["unet"] == ["time_embedding", "add_embedding"]
    with pytest.raises(hp.RecipeError, match=r"no shipped recipe has a denoiser of the classes given \(vae: "
                                             r"AutoencoderKL, text_encoder: CLIPTextModel\).*recipe=.*sd15.*sdxl"):
        hp.prepare_training({"vae": pipe.vae, "text_encoder": pipe.text_encoder})


def test_every_recipe_sharing_a_denoiser_class_is_told_apart_by_its_config():
    """Recipes that plan the same denoiser class each say (``recognise:``) config values no other one holds: the same
    key of the same component (the denoiser, or another: Kandinsky 5 Video and Image by their VAEs), another value."""
    for (comp, cls), names in _denoiser_index().items():
        for a, b in itertools.combinations(names, 2):
            ra, rb = recognised_by(a), recognised_by(b)
            assert any(k in rb.get(c, {}) and rb[c][k] != v for c in ra for k, v in ra[c].items()), \
                f"{a} and {b} both plan {comp}: {cls}"


def test_recipe_argument_is_checked(tiny_pipe):
    pipe = tiny_pipe("sd15")
    with pytest.raises(hp.RecipeError, match=r"recipe 'sdxll': unknown; did you mean 'sdxl'"):
        hp.prepare_training(pipe, recipe="sdxll")
    with pytest.raises(hp.RecipeError, match=r"'vae\.sdxl' is a component recipe.*name a pipeline recipe"):
        hp.prepare_training(pipe, recipe="vae.sdxl")
    with pytest.raises(hp.RecipeError, match=r"recipe 'sdxl' is for StableDiffusionXLPipeline.*force=True"):
        hp.prepare_training(pipe, recipe="sdxl")


def test_a_component_the_recipe_does_not_plan_gets_a_row(tiny_pipe):
    pipe = tiny_pipe("sdxl")
    tp = hp.prepare_training(dict(pipe.components), layout="t4", recipe="sd15",
                             train={"unet": "lora", "text_encoder_2": "embedding"}, tokens={"text_encoder_2": ["<x>"]})
    row = next(line for line in str(tp).splitlines() if line.startswith("text_encoder_2"))
    assert "embedding" in row and "float32" in row
    assert "not in recipe sd15: CLIPTextModelWithProjection left as it was given; recipe='animatediff_sdxl' plans it" in row
    assert "sdxl" in row


def test_recognise_sections_are_checked(tmp_path):
    spec = pipeline_spec("sdxl")
    assert set(recognised_by("sdxl")) <= set(spec["components"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("schema: 1\nkind: pipeline\npipelines: [X]\ndenoiser: unet\ncomponents:\n  unet: {use: unet.sdxl}\n"
                   "recognise:\n  unett: {addition_embed_type: text_time}\n  unet: [1]\n")
    with pytest.raises(hp.RecipeError, match=r"recognise\.unett: unknown component 'unett'.*did you mean.*unet"
                                             r"(.|\n)*recognise\.unet: expected \{config key: value\}"):
        hp.get_recipe(str(bad))
    assert all(isinstance(recognised_by(n), dict) for n in list_recipes("pipeline"))
