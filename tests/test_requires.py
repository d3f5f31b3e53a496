"""A recipe's ``requires:`` (issue 34, "every command on every family"): a pipeline that plain diffusers cannot build
or run without a package it does not depend on is refused by every command before any weight loads, in one error
naming each missing package, why and how to install it. Cosmos' safety checker (cosmos_guardrail) and its
transformer's padding-mask resize (torchvision) are the shipped case."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

import hf_precision as hp
from hf_precision.recipe.files import recipes_dir

COSMOS = {"cosmos_guardrail": "pip install cosmos_guardrail", "torchvision": "pip install torchvision"}
MISSING = [m for m in COSMOS if importlib.util.find_spec(m) is None]  # what this machine lacks, read, not assumed


@pytest.fixture(scope="module")
def cosmos_folder(tmp_path_factory) -> Path:
    """A Cosmos 2 Video2World folder of configs alone: nothing here can load, so a command that tries fails later."""
    folder = tmp_path_factory.mktemp("cosmos")
    index = {"_class_name": "Cosmos2VideoToWorldPipeline", "_diffusers_version": "0.42.1",
             "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "CosmosTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "safety_checker": ["cosmos_guardrail", "CosmosSafetyChecker"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    configs = {"transformer": {"_class_name": "CosmosTransformer3DModel", "patch_size": [1, 2, 2],
                               "concat_padding_mask": True},
               "vae": {"_class_name": "AutoencoderKLWan", "temperal_downsample": [False, True, True]},
               "text_encoder": {"architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 16}}
    for name, config in configs.items():
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(config))
    return folder


@pytest.mark.parametrize("command", [["plan"], ["check"], ["video", "--prompt", "a cat", "--frames", "5", "--out", "o.mp4"],
                                     ["train", "--plan"]])
def test_every_command_on_a_cosmos_folder_names_the_packages_it_lacks_before_loading(command, cosmos_folder,
                                                                                     tmp_path, capsys, monkeypatch):
    """Plain diffusers raised ImportError inside the pipeline's __init__ (pipeline_cosmos2_video2world.py:201)
    after reading every weight; with the packages present, the check passes and the command goes on."""
    from hf_precision.cli import main

    if not MISSING:
        from hf_precision.recipe.resolution import check_packages

        assert check_packages("cosmos", "Cosmos2VideoToWorldPipeline") is None
        return
    monkeypatch.chdir(tmp_path)
    model = [str(cosmos_folder)] if command[0] in ("plan", "check") else ["--model", str(cosmos_folder)]
    code = main([command[0], *model, *command[1:]])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("hf-precision")]
    assert len(lines) == 1 and "Cosmos2VideoToWorldPipeline cannot be built or run without" in lines[0], err
    for module in MISSING:
        assert COSMOS[module] in lines[0], err
    for module in set(COSMOS) - set(MISSING):
        assert COSMOS[module] not in lines[0], err


def test_load_pipeline_refuses_before_reading_a_weight(cosmos_folder, monkeypatch):
    """load_pipeline resolves the recipe before from_pretrained: a missing package is refused there."""
    import diffusers

    monkeypatch.setattr(diffusers.DiffusionPipeline, "from_pretrained",
                        classmethod(lambda *a, **k: pytest.fail("weights read before the package check")))
    if MISSING:
        with pytest.raises(hp.RecipeError, match="cannot be built or run without"):
            hp.load_pipeline(str(cosmos_folder))
    else:
        from hf_precision.recipe.resolution import check_packages

        assert check_packages("cosmos", "Cosmos2VideoToWorldPipeline") is None


def _user_recipe(tmp_path, requires):
    data = yaml.safe_load((recipes_dir() / "latte.yaml").read_text())
    data["requires"] = requires
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_requires_is_checked_by_class_and_by_what_is_importable(tmp_path):
    """Derived from importlib.util.find_spec, per entry and per class: the same answer on any machine."""
    from hf_precision.recipe.resolution import check_packages

    path = _user_recipe(tmp_path, [
        {"module": "no_such_module_hfp", "install": "pip install no-such", "why": "its call imports it (x.py:1)"},
        {"module": "yaml", "install": "pip install pyyaml", "why": "always here"},
        {"module": "no_such_other_hfp", "install": "pip install other", "why": "w", "pipelines": ["LattePipeline"]}])
    with pytest.raises(hp.RecipeError) as err:
        check_packages(path, "LattePipeline")
    assert str(err.value) == ("LattePipeline cannot be built or run without no_such_module_hfp (its call imports it "
                              "(x.py:1)): pip install no-such; and no_such_other_hfp (w): pip install other; install "
                              "them and run again")
    check_packages(_user_recipe(tmp_path, [{"module": "yaml", "install": "pip install pyyaml", "why": "w"}]),
                   "LattePipeline")


@pytest.mark.parametrize("requires, message", [
    ({"module": "x"}, "requires: expected a list of {module, install, why}"),
    ([{"module": "x", "why": "w"}], "requires[0].install: missing; every row names it"),
    ([{"module": "a b", "install": "pip install x", "why": "w"}], "requires[0].module: bad value 'a b'"),
    ([{"module": "x", "install": "i", "why": "w", "pipelines": ["LatePipeline"]}],
     "requires[0].pipelines: unknown class 'LatePipeline'; this recipe names LattePipeline; did you mean"),
])
def test_a_bad_requires_entry_is_one_error_naming_file_key_and_allowed(tmp_path, requires, message):
    from hf_precision.recipe.catalog import pipeline_spec

    path = _user_recipe(tmp_path, requires)
    with pytest.raises(hp.RecipeError) as err:
        pipeline_spec(path)
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{path}: {message}"), err.value
