"""Architecture facts as recipe data (issue 32 item 3), not class-name tables in code: which video pipelines are
first-frame edit models (``video: first_frame_edit``, ChronoEdit), which inputs training cannot feed
(``video: unfed_inputs``, Wan Animate), the only sizes a call makes (``sizes:``, one reader for the refusal and the
sweep), and which denoisers take ControlNet / T2I-Adapter residuals (their forward's signature, no list). Each key
is checked by the schema, and a family the code never names gets the behaviour from the YAML alone."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from PIL import Image

import hf_precision.recipe.catalog as catalog
from hf_precision.cli import main
from hf_precision.errors import RecipeError
from hf_precision.recipe.files import recipes_dir


def _recipe_with(monkeypatch, tmp_path: Path, name: str, change) -> Path:
    """The shipped recipe ``name`` changed by ``change(data)`` in a user's YAML file, read (and so checked) by the
    catalog, then served as the shipped one: the code sees nothing but the changed YAML."""
    data = yaml.safe_load((recipes_dir() / f"{name}.yaml").read_text())
    change(data)
    path = tmp_path / f"{name}-mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    mine = catalog.pipeline_file(str(path))  # raises if the schema refuses it
    shipped = catalog._shipped_pipeline
    monkeypatch.setattr(catalog, "_shipped_pipeline", lambda n: mine if n == name else shipped(n))
    return path


@pytest.mark.parametrize("where, value, says", [
    (("first_frame_edit",), "yes", "video.first_frame_edit: bad value 'yes'; allowed: true or false"),
    (("classes", "ChronoEditPipeline", "first_frame_edit"), 1,
     "video.classes.ChronoEditPipeline.first_frame_edit: bad value 1; allowed: true or false"),
    (("unfed_inputs",), ["pose"], "video.unfed_inputs: bad value ['pose']; allowed: text naming the denoiser's inputs"),
])
def test_a_bad_fact_in_a_user_recipe_is_one_error_naming_file_key_value_and_what_is_allowed(where, value, says,
                                                                                            tmp_path):
    data = yaml.safe_load((recipes_dir() / "chronoedit.yaml").read_text())
    block = data["video"]
    for key in where[:-1]:
        block = block.setdefault(key, {})
    block[where[-1]] = value
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(RecipeError) as err:
        catalog.pipeline_spec(str(path))
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{path}: {says}"), err.value


def _images(folder: Path, references: bool) -> Path:
    """Two 32x32 targets with captions in metadata.jsonl, each with a reference image under src/ if asked."""
    rows = []
    for i in range(2):
        for name, seed in ((f"{i}.png", i), (f"src/{i}.png", 100 + i))[:2 if references else 1]:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            pixels = np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / name)
        rows.append(json.dumps({"file_name": f"{i}.png", "text": "red", **({"reference": f"src/{i}.png"}
                                                                             if references else {})}))
    (folder / "metadata.jsonl").write_text("\n".join(rows) + "\n")
    return folder


def _geometry(folder: Path):
    from hf_precision.apps.train.data import model_geometry
    from hf_precision.runtime.source import configs_of

    _, index, configs = configs_of(str(folder))
    return model_geometry(index["_class_name"], index, configs)


def test_a_video_pipeline_the_code_never_names_trains_edit_pairs_once_its_recipe_says_first_frame_edit(
        saved_pipeline, tmp_path, monkeypatch, capsys):
    """Wan 2.1 I2V marked a first-frame edit model in wan.yaml (`video.classes`) alone: `train` then refuses its
    targets without references before loading, naming it an edit model, and reads (reference, target) pairs as
    clips of the reference then the target, as ChronoEdit's. Unmarked, it is a clip model."""
    from hf_precision.apps.train.data import read_data

    folder = saved_pipeline("wan_i2v")
    assert not _geometry(folder).first_frame_edit
    _recipe_with(monkeypatch, tmp_path, "wan", lambda d: d["video"].setdefault("classes", {}).update(
        {"WanImageToVideoPipeline": {"first_frame_edit": True}}))
    geometry = _geometry(folder)
    assert geometry.first_frame_edit and not _geometry(saved_pipeline("wan")).first_frame_edit  # that class alone

    data = read_data(_images(tmp_path / "pairs", True), geometry, 32, frames=5)
    clip = data.pixels([0])
    assert clip.shape == (1, 3, 5, 32, 32) and data.samples[0].reference is not None
    assert torch.equal(clip[:, :, 1], clip[:, :, 4]) and not torch.equal(clip[:, :, 0], clip[:, :, 1])

    import hf_precision.runtime.load as load

    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded before the bad data was found"))
    out = tmp_path / "out"
    code = main(["train", "--model", str(folder), "--data", str(_images(tmp_path / "alone", False)), "--out", str(out),
                 "--frames", "5", "--resolution", "32", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1, err
    assert "2 of 2 image(s) have no reference image" in err and "WanImageToVideoPipeline is an edit model" in err, err


def test_the_inputs_training_cannot_feed_are_the_recipes_text(saved_pipeline, tmp_path, monkeypatch, capsys):
    """Wan Animate's refusal is its recipe's `unfed_inputs` text: another text in wan.yaml is what `train` says."""
    from hf_precision.apps.train.prepare import check_trainable
    from hf_precision.runtime.source import configs_of

    _, index, configs = configs_of(str(saved_pipeline("wan_animate")))
    with pytest.raises(RecipeError, match=r"^--model: WanAnimatePipeline: its denoiser .* pose video"):
        check_trainable(index, configs)
    _recipe_with(monkeypatch, tmp_path, "wan", lambda d: d["video"]["classes"]["WanAnimatePipeline"].update(
        unfed_inputs="it wants a dance video; train Wan I2V instead"))
    with pytest.raises(RecipeError, match=r"^--model: WanAnimatePipeline: it wants a dance video; train Wan I2V"):
        check_trainable(index, configs)


class _Residuals(torch.nn.Module):
    """A ControlNet stand-in: residuals of the latents it is called on, one per down block and the mid block."""

    def forward(self, sample, timestep, **kwargs):
        self.seen = sample.shape
        return (sample * 2,), sample * 3


class _NewUNet(torch.nn.Module):
    """A denoiser class no code names, whose forward takes a ControlNet's residuals as the UNets' does."""

    def forward(self, sample, timestep, encoder_hidden_states=None, down_block_additional_residuals=None,
                mid_block_additional_residual=None):
        return sample


class _NoResiduals(torch.nn.Module):
    def forward(self, hidden_states, timestep, encoder_hidden_states=None):
        return hidden_states


@pytest.mark.parametrize("latents", [(2, 4, 8, 8), (2, 4, 3, 8, 8)], ids=["image", "video"])
def test_a_denoiser_gets_controlnet_residuals_when_its_forward_takes_them(latents):
    """No class list: a new denoiser class whose forward takes down_block_additional_residuals gets the ControlNet's
    residuals (a video's run frame by frame, as AnimateDiff's pipeline runs them), and one whose forward takes none,
    or no T2I-Adapter's, is refused naming the argument."""
    from types import SimpleNamespace

    from hf_precision.training.control import side_inputs
    from hf_precision.training.rules import TrainingError

    net = _Residuals()
    tp = SimpleNamespace(components={"controlnet": net}, kinds={})
    sample = torch.randn(latents)
    kwargs = {"sample": sample, "timestep": torch.tensor([5, 7]), "encoder_hidden_states": torch.zeros(2, 3, 8)}
    out = side_inputs(tp, _NewUNet(), kwargs, {"control_image": torch.zeros(2, 3, 64, 64)})
    frames = latents[2] if len(latents) == 5 else 1
    assert net.seen == (2 * frames, *latents[1:2], *latents[-2:])
    assert out["down_block_additional_residuals"][0].shape == out["mid_block_additional_residual"].shape == net.seen
    with pytest.raises(TrainingError, match=r"controlnet \(_Residuals\) beside a _NoResiduals is not fed by tp.loss "
                                            r"\(its forward takes no down_block_additional_residuals\)"):
        side_inputs(tp, _NoResiduals(), kwargs, {"control_image": torch.zeros(2, 3, 64, 64)})
    adapter = SimpleNamespace(components={"adapter": net}, kinds={})
    with pytest.raises(TrainingError, match=r"its forward takes no down_intrablock_additional_residuals"):
        side_inputs(adapter, _NewUNet(), kwargs, {"control_image": torch.zeros(2, 3, 64, 64)})


def test_the_sweep_asks_a_size_the_refusal_accepts_both_read_from_sizes(tmp_path, monkeypatch):
    """`sizes:` has one reader (recipe.catalog.shipped_sizes): the command sweep's image size for a family that lists
    them is one `generate` accepts, and a changed list in the YAML changes both."""
    import importlib.util

    from launch import ROOT

    from hf_precision.diagnose.call import size_refused

    spec = importlib.util.spec_from_file_location("command_sweep", ROOT / "benchmarks" / "command_sweep.py")
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    cls = "Kandinsky5T2IPipeline"
    assert sweep.image_size(cls) == (1408, 640) and size_refused(cls, *sweep.image_size(cls)) is None
    _recipe_with(monkeypatch, tmp_path, "kandinsky5_image", lambda d: d.update(
        sizes=[{"width": 512, "height": 768}, {"width": 1024, "height": 1024}]))
    assert sweep.image_size(cls) == (768, 512) and size_refused(cls, 768, 512) is None
    assert "makes only 512x768, 1024x1024" in size_refused(cls, 640, 1408)
