"""A recipe's ``requires:``: a pipeline that plain diffusers cannot build or run without a package it does not depend
on (Cosmos' safety checker, cosmos_guardrail, and its transformer's padding-mask resize, torchvision) is refused where
the package is needed, before any weight is read: by the loader (load_pipeline, and every command that loads through
it) and by the training program, in one error naming each missing package, why and how to install it. Planning (plan,
show) needs none of them: it works, and says in one line what loading will need (issue 32)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import yaml

import hf_precision as hp
from hf_precision.recipe.files import recipes_dir
from hf_precision.recipe.requires import check_packages

COSMOS = {"cosmos_guardrail": "pip install cosmos_guardrail", "torchvision": "pip install torchvision"}


@pytest.fixture
def lacking(monkeypatch):
    """This Python without Cosmos' two packages, whether or not they are installed: only their lookup says so."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] in COSMOS else real(name, *a, **k))


@pytest.fixture
def no_weights(monkeypatch):
    """Reading any weight fails the test: a refusal must come before."""
    import diffusers
    import transformers

    def read(*_a, **_k):
        pytest.fail("weights read before the package check")

    for cls in (diffusers.DiffusionPipeline, diffusers.ModelMixin, transformers.PreTrainedModel):
        monkeypatch.setattr(cls, "from_pretrained", classmethod(read))


@pytest.fixture(scope="module")
def cosmos_folder(tmp_path_factory) -> Path:
    """A Cosmos 2 Video2World folder of configs alone (a one-block transformer: planned in a blink)."""
    folder = tmp_path_factory.mktemp("cosmos")
    index = {"_class_name": "Cosmos2VideoToWorldPipeline", "_diffusers_version": "0.42.1",
             "text_encoder": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "CosmosTransformer3DModel"], "vae": ["diffusers", "AutoencoderKLWan"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "safety_checker": ["cosmos_guardrail", "CosmosSafetyChecker"]}
    (folder / "model_index.json").write_text(json.dumps(index))
    configs = {"transformer": {"_class_name": "CosmosTransformer3DModel", "patch_size": [1, 2, 2],
                               "concat_padding_mask": True, "num_layers": 1, "num_attention_heads": 2,
                               "attention_head_dim": 12, "text_embed_dim": 16},
               "vae": {"_class_name": "AutoencoderKLWan", "temperal_downsample": [False, True, True]},
               "text_encoder": {"architectures": ["T5EncoderModel"], "model_type": "t5", "d_model": 16}}
    for name, config in configs.items():
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(config))
    return folder


NOTE = ("note: loading Cosmos2VideoToWorldPipeline needs cosmos_guardrail and torchvision, which this Python cannot "
        "import (pip install cosmos_guardrail; pip install torchvision); planning does not")


def test_planning_a_cosmos_folder_needs_neither_package_and_says_so_in_one_line(cosmos_folder, lacking, no_weights,
                                                                                 capsys):
    """Planning builds on the meta device and never makes the safety checker or runs the transformer: resolve used
    to refuse it too, so plan and show were refused for a package only loading needs."""
    from hf_precision.cli import main

    assert main(["plan", str(cosmos_folder), "--device", "t4"]) == 0
    out, err = capsys.readouterr()
    assert [line for line in out.splitlines() if "cannot import" in line] == [NOTE] and not err, (out, err)
    assert main(["show", "--class", "Cosmos2VideoToWorldPipeline", "--brief"]) == 0
    out, err = capsys.readouterr()
    assert err.splitlines() == [f"hf-precision show: {NOTE}"] and "cannot" not in out, (out, err)
    plan = hp.plan(str(cosmos_folder), device="t4")
    assert [r.module for r in plan.recipe.requires] == list(COSMOS) and plan["transformer"].params > 0


def test_nothing_missing_no_note(cosmos_folder, monkeypatch):
    """With both packages importable, the plan says nothing of them (the note reads find_spec, not the recipe)."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda *_a, **_k: object())
    assert "cannot import" not in hp.plan(str(cosmos_folder), device="t4").table()
    assert check_packages("cosmos", "Cosmos2VideoToWorldPipeline") is None


@pytest.mark.parametrize("command", [["check", "{m}"],
                                     ["video", "--model", "{m}", "--prompt", "a cat", "--frames", "5", "--out", "o.mp4"],
                                     ["train", "--model", "{m}", "--data", "{m}", "--out", "out"]])
def test_every_loading_command_names_the_packages_it_lacks_before_loading(command, cosmos_folder, lacking, no_weights,
                                                                         tmp_path, capsys, monkeypatch):
    """Plain diffusers raised ImportError inside the pipeline's __init__ (pipeline_cosmos2_video2world.py:201)
    after reading every weight."""
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    code = main([part.format(m=cosmos_folder) for part in command])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("hf-precision")]
    assert len(lines) == 1 and "Cosmos2VideoToWorldPipeline cannot be built or run without" in lines[0], err
    for install in COSMOS.values():
        assert install in lines[0], err


def test_load_pipeline_refuses_before_reading_a_weight(cosmos_folder, lacking, no_weights):
    with pytest.raises(hp.RecipeError, match="cannot be built or run without cosmos_guardrail .*: pip install "
                                             "cosmos_guardrail; and torchvision .*: pip install torchvision"):
        hp.load_pipeline(str(cosmos_folder), "cpu")


def test_a_user_recipe_file_s_requires_reaches_the_loader_through_the_resolved_recipe(cosmos_folder, tmp_path,
                                                                                         no_weights):
    """A recipe file of the user's (not found by class) is checked from what resolve returns: Recipe.requires."""
    data = yaml.safe_load((recipes_dir() / "cosmos.yaml").read_text())
    data["requires"] = [{"module": "no_such_module_hfp", "install": "pip install no-such", "why": "w"}]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    from hf_precision.recipe import resolve

    resolved = resolve(str(path), pipeline_class="Cosmos2VideoToWorldPipeline", layout="t4")  # planning: no refusal
    assert [r.module for r in resolved.requires] == ["no_such_module_hfp"]
    with pytest.raises(hp.RecipeError) as err:
        hp.load_pipeline(str(cosmos_folder), "cpu", recipe=str(path))
    assert str(err.value) == ("Cosmos2VideoToWorldPipeline cannot be built or run without no_such_module_hfp (w): pip "
                              "install no-such; install it and run again")


def _user_recipe(tmp_path, requires):
    data = yaml.safe_load((recipes_dir() / "latte.yaml").read_text())
    data["requires"] = requires
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return str(path)


def test_requires_is_checked_by_class_and_by_what_is_importable(tmp_path):
    """Derived from importlib.util.find_spec, per entry and per class: the same answer on any machine."""
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


def test_generate_refuses_a_missing_package_of_the_recipe_it_loads_with(tmp_path, no_weights, capsys, monkeypatch):
    """generate loads through load_pipeline: a user recipe's requires: is refused there, in one line, nothing read."""
    from hf_precision.apps.shapes_model import FOLDER
    from hf_precision.cli import main

    data = yaml.safe_load((recipes_dir() / "sdxl.yaml").read_text())
    data["requires"] = [{"module": "no_such_module_hfp", "install": "pip install no-such", "why": "w"}]
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    code = main(["generate", str(FOLDER), "--prompt", "a cat", "--recipe", str(path), "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.splitlines() == [
        "hf-precision generate: error: StableDiffusionXLPipeline cannot be built or run without no_such_module_hfp (w): "
        "pip install no-such; install it and run again"], err


@pytest.fixture(scope="module")
def cosmos_no_mask_folder(cosmos_folder, tmp_path_factory) -> Path:
    """The Cosmos folder with its transformer's concat_padding_mask off: nothing in it calls torchvision."""
    import shutil

    folder = tmp_path_factory.mktemp("cosmos_no_mask") / "model"
    shutil.copytree(cosmos_folder, folder)
    config = folder / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "concat_padding_mask": False}))
    return folder


@pytest.mark.parametrize("command", [["check", "{m}"], ["train", "--model", "{m}", "--data", "{m}", "--out", "out"]])
def test_torchvision_is_asked_of_cosmos_only_where_its_config_concatenates_the_padding_mask(
        command, cosmos_no_mask_folder, lacking, no_weights, tmp_path, capsys, monkeypatch):
    """transformer_cosmos.py:734-736 resizes the padding mask with torchvision only under concat_padding_mask; a
    folder with it off was told to install torchvision too (the row held for every folder)."""
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    code = main([part.format(m=cosmos_no_mask_folder) for part in command])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("hf-precision")]
    assert code == 2 and len(lines) == 1 and "without cosmos_guardrail" in lines[0], err
    assert "torchvision" not in err, err


def test_cosmos_plan_notes_only_what_its_configs_need(cosmos_folder, cosmos_no_mask_folder, lacking):
    """The plan resolves with the folder's configs: its note and Recipe.requires drop the row the configs rule out."""
    assert [r.module for r in hp.plan(str(cosmos_folder), device="t4").recipe.requires] == list(COSMOS)
    plan = hp.plan(str(cosmos_no_mask_folder), device="t4")
    assert [r.module for r in plan.recipe.requires] == ["cosmos_guardrail"]
    assert "needs cosmos_guardrail, which" in plan.table() and "torchvision" not in plan.table()


def test_a_config_value_of_another_type_does_not_rule_a_row_out():
    """`unless: {transformer: {concat_padding_mask: false}}` is the boolean: a config's 0 or a missing key keeps it."""
    from hf_precision.recipe.requires import requirements

    data = yaml.safe_load((recipes_dir() / "cosmos.yaml").read_text())
    kept = lambda configs: [r.module for r in requirements(data, configs)]
    assert kept({"transformer": {"concat_padding_mask": False}}) == ["cosmos_guardrail"]
    for configs in (None, {}, {"transformer": {}}, {"transformer": {"concat_padding_mask": 0}},
                    {"transformer": {"concat_padding_mask": True}}):
        assert kept(configs) == ["cosmos_guardrail", "torchvision"], configs


@pytest.fixture(scope="module")
def qwen_edit_folder(tmp_path_factory) -> Path:
    """A Qwen-Image-Edit folder: the tiny Qwen-Image pipeline saved, its index naming the edit class and the
    Qwen2VLProcessor the edit pipelines take (pipeline_qwenimage_edit.py:192), whose files cannot be written here."""
    from hf_precision.testing import PIPELINES

    folder = tmp_path_factory.mktemp("qwen_edit") / "model"
    PIPELINES["qwenimage"].make().save_pretrained(folder)
    index = json.loads((folder / "model_index.json").read_text())
    index.update(_class_name="QwenImageEditPipeline", processor=["transformers", "Qwen2VLProcessor"])
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_qwen2vl_processor_needs_torchvision_in_transformers_5(tmp_path):
    """The fact the qwenimage row rests on: transformers 5 falls back to Qwen2VLImageProcessorPil without torchvision,
    but Qwen2VLProcessor also loads Qwen2VLVideoProcessor, which has no fallback (video_processing_auto.py:435)."""
    import transformers

    from hf_precision.testing.tokenizers import make_qwen2_tokenizer

    make_qwen2_tokenizer().save_pretrained(tmp_path)
    transformers.Qwen2VLImageProcessorPil().save_pretrained(tmp_path)
    if importlib.util.find_spec("torchvision") is not None:  # with it, the processor builds: nothing to refuse
        assert transformers.Qwen2VLProcessor.from_pretrained(tmp_path).video_processor is not None
        return
    with pytest.raises(ImportError, match="Qwen2VLVideoProcessor requires the Torchvision library"):
        transformers.Qwen2VLProcessor.from_pretrained(tmp_path)


@pytest.mark.parametrize("pipeline_class, refused", [("QwenImageEditPipeline", True),
                                                     ("QwenImageEditPlusPipeline", True),
                                                     ("QwenImagePipeline", False)])
def test_qwen_image_edit_without_torchvision_is_refused_before_a_weight_is_read(
        pipeline_class, refused, qwen_edit_folder, tmp_path, monkeypatch):
    """QwenImageEditPipeline.from_pretrained reads the VAE's and the text encoder's weights before it loads the
    processor, which then fails (transformers' ImportError, above); the refusal comes first. The text-to-image class
    takes no processor and is not asked for torchvision."""
    _refused_without(monkeypatch, "torchvision", pipeline_class, refused,
                     r"\(the pipeline's processor \(Qwen2VLProcessor\).* pip install torchvision")
    if pipeline_class == "QwenImageEditPipeline":
        import diffusers

        monkeypatch.setattr(diffusers.ModelMixin, "from_pretrained",
                            classmethod(lambda *_a, **_k: pytest.fail("weights read before the package check")))
        with pytest.raises(hp.RecipeError, match="QwenImageEditPipeline cannot be built or run without torchvision"):
            hp.load_pipeline(str(qwen_edit_folder), "cpu")


@pytest.mark.parametrize("pipeline_class, refused", [("LTX2ImageToVideoPipeline", True), ("LTX2Pipeline", False)])
def test_ltx2_image_to_video_without_av_is_refused_before_loading(pipeline_class, refused, monkeypatch):
    """LTX-2's image-to-video call re-compresses the image as H.264 unless image_crf=0, which no command passes, and
    raises diffusers' ImportError without PyAV after every weight is read (ltx2/utils.py:350-354): the recipe refuses it
    first. The text-to-video class needs no av."""
    _refused_without(monkeypatch, "av", pipeline_class, refused,
                     r"\(the image-to-video call re-compresses.* pip install av")


def _refused_without(monkeypatch, module, pipeline_class, refused, why):
    """Without ``module`` (its lookup finds nothing), ``pipeline_class`` is refused in one error naming it and
    ``why``, or, where not ``refused``, passes."""
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name.split(".")[0] == module else real(name, *a, **k))
    if not refused:
        assert check_packages(None, pipeline_class) is None
        return
    with pytest.raises(hp.RecipeError, match=f"^{pipeline_class} cannot be built or run without {module} {why}; "
                                             "install it and run again$"):
        check_packages(None, pipeline_class)
