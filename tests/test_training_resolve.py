"""resolve_training: the training recipe is resolved once, from configs and the device rules, before any weight
loads, and a folder, a pipeline object and a dict of components reach the same one; the training program loads
straight into it and prepare_training only attaches (no component is cast twice)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.training.resolve import resolve_training

pytestmark = pytest.mark.usefixtures("one_thread")


def _configs_only(folder: Path, to: Path) -> Path:
    """A copy of a pipeline folder without a single weight file."""
    shutil.copytree(folder, to, ignore=shutil.ignore_patterns("*.safetensors", "*.bin"))
    assert not list(to.rglob("*.safetensors"))
    return to


@pytest.mark.parametrize("layout", ["t4", "a100"])
def test_folder_pipeline_and_dict_reach_the_same_training_recipe(saved_pipeline, tiny_pipe, tmp_path, layout):
    folder = _configs_only(saved_pipeline("sdxl"), tmp_path / "sdxl")
    pipe = tiny_pipe("sdxl")
    train = {"unet": "lora", "text_encoder_2": "lora"}
    by_folder = resolve_training(folder, layout=layout, train=train)
    by_pipe = resolve_training(pipe, layout=layout, train=train)
    by_dict = resolve_training(dict(pipe.components), layout=layout, train=train)
    assert by_folder.recipe.name == "sdxl"
    assert by_folder.recipe == by_pipe.recipe == by_dict.recipe
    assert by_folder.choices == by_pipe.choices == by_dict.choices
    # the training rule is in the recipe itself: the trainable parts compute in what the rule chose
    for comp, choice in by_folder.choices.items():
        assert by_folder.recipe[comp].compute == choice.dtype
    # and the same set-up through prepare_training ends in that very recipe
    tp = hp.prepare_training(pipe, layout=layout, train=train)
    assert tp.recipe == by_pipe.recipe


def test_user_override_wins_over_the_rule_and_says_so(saved_pipeline, tmp_path):
    folder = _configs_only(saved_pipeline("sd15"), tmp_path / "sd15")
    tr = resolve_training(folder, layout="a100", overrides={"unet": {"dtype": "float32"}})
    assert tr.recipe["unet"].compute == "float32"
    assert "user's override" in tr.choices["unet"].rule and tr.choices["unet"].dtype == "float32"


def test_training_program_resolves_once_and_casts_each_component_once(train_demo, tmp_path, monkeypatch):
    """Before: the program resolved through the planner, load_pipeline applied the inference recipe, and
    prepare_training resolved and applied again (every component cast twice)."""
    from hf_precision.apps.train.prepare import prepare_run
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.runtime import apply as apply_module
    from hf_precision.training import resolve as resolve_module

    applied_to: list[str] = []
    resolutions: list[object] = []
    real_apply, real_resolve = apply_module._apply_component, resolve_module.resolve_training

    def counting_apply(applied, plan, module, device, strict):
        applied_to.append(plan.name)
        return real_apply(applied, plan, module, device, strict)

    def counting_resolve(*args, **kwargs):
        resolutions.append(args[0])
        return real_resolve(*args, **kwargs)

    monkeypatch.setattr(apply_module, "_apply_component", counting_apply)
    monkeypatch.setattr(resolve_module, "resolve_training", counting_resolve)
    model, data = train_demo
    settings = TrainSettings(model=str(model), data=str(data), out=str(tmp_path / "out"), device="cpu", layout="t4",
                             lora_rank=4, steps=1, batch_size=1, resolution=32, quiet=True)
    run = prepare_run(settings)
    assert resolutions == [str(model)]  # once, from the folder, before loading
    assert sorted(applied_to) == sorted(set(applied_to)) and "unet" in applied_to  # each component cast once
    assert run.tp.recipe == hp.applied(run.pipe).recipe
    assert str(run.tp.compute_dtype) == "torch.float16" and run.tp.scaler is not None  # the T4 rule: fp16 + scaler


def test_prepare_training_on_a_pipeline_resolves_once_and_applies_once(tiny_pipe, monkeypatch):
    from hf_precision.runtime import apply as apply_module
    from hf_precision.training import setup as setup_module

    applied_to: list[str] = []
    resolutions: list[object] = []
    real_apply, real_resolve = apply_module._apply_component, setup_module.resolve_training
    monkeypatch.setattr(apply_module, "_apply_component",
                        lambda a, plan, m, d, s: (applied_to.append(plan.name), real_apply(a, plan, m, d, s))[1])
    monkeypatch.setattr(setup_module, "resolve_training",
                        lambda *a, **k: (resolutions.append(a[0]), real_resolve(*a, **k))[1])
    pipe = tiny_pipe("sd15")
    tp = hp.prepare_training(pipe, layout="t4", train={"unet": "lora"})
    assert resolutions == [pipe]
    assert sorted(applied_to) == sorted(set(applied_to)) and "unet" in applied_to
    # a pipeline already in the training recipe is not cast again: prepare_training only attaches
    tr = real_resolve(tiny_pipe("sd15"), layout="t4", train={"unet": "lora"})
    again = tiny_pipe("sd15")
    hp.apply_recipe(again, tr.recipe)
    applied_to.clear()
    hp.prepare_training(again, layout="t4", recipe=tr)
    assert applied_to == [] and tp.recipe == tr.recipe


def test_prepare_training_refuses_settings_other_than_the_training_recipes_own(tiny_pipe):
    """A TrainingRecipe keeps the device, layout, train and overrides it was resolved with: the same again is
    accepted (above), another one is refused with both values and the fix, never silently ignored."""
    from hf_precision.training import TrainingError

    pipe = tiny_pipe("sd15")
    fp32_vae = {"vae": {"dtype": "float32"}}
    tr = resolve_training(pipe, layout="t4", train={"unet": "lora"}, overrides=fp32_vae)
    assert (tr.layout, tr.overrides, tr.device) == ("t4", (fp32_vae,), "cpu")
    for given, said in [({"layout": "a100"}, "layout='a100', but recipe= is a TrainingRecipe resolved with layout='t4'"),
                        ({"overrides": {"vae": {"dtype": "float16"}}}, "overrides={'vae': {'dtype': 'float16'}}, but"),
                        ({"train": {"unet": "full"}}, "train={'unet': 'full'}, but recipe= is a TrainingRecipe resolved "
                                                      "with train={'unet': 'lora'}"),
                        ({"device": "meta"}, "device='meta', but recipe= is a TrainingRecipe resolved with device='cpu'")]:
        with pytest.raises(TrainingError) as err:
            hp.prepare_training(pipe, recipe=tr, **given)
        assert said in str(err.value) and "or resolve again" in str(err.value), str(err.value)
    tp = hp.prepare_training(pipe, recipe=tr, layout="t4", overrides=[fp32_vae], device="cpu")  # the same: accepted
    assert tp.recipe == tr.recipe and tp.recipe["vae"].compute == "float32"
