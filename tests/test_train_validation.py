"""Validation pictures of models whose call needs more than a prompt: ``hf-precision train --validation-prompt``
gives an image-to-video model the first clip's first frame, an inpainting model the first photo and a middle mask,
a model built for one prompt length (CogVideoX) that length, and refuses, before loading, validation steps an
image-to-image call would denoise none of. Before, each of these trained, then crashed in diffusers at validation."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from PIL import Image

from checks import write_clips
from hf_precision.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def _photos(root, side=32):
    root.mkdir()
    for i in range(2):
        Image.fromarray(np.full((side, side, 3), 60 + 40 * i, np.uint8)).save(root / f"i{i}.png")
        (root / f"i{i}.txt").write_text("a cat")
    return root


def _train(model, data, out, *more):
    return main(["train", "--model", str(model), "--data", str(data), "--out", str(out), "--device", "cpu",
                 "--quiet", "--steps", "1", "--lora-rank", "4", "--validation-prompt", "a cat",
                 "--validation-every", "1", *more])


@pytest.mark.parametrize("kind, video", [("sd_inpaint", False), ("cogvideox_i2v", True)])
def test_validation_of_a_model_whose_call_needs_an_input(kind, video, tmp_path, monkeypatch):
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline(kind)
    folder = save_pipeline(pipe, tmp_path / kind)
    calls = []
    original = type(pipe).__call__

    @functools.wraps(original)  # the program reads the call's parameters
    def recording(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(pipe), "__call__", recording)
    frames = ["--frames", "9", "--resolution", "16"] if video else ["--resolution", "32"]
    data = write_clips(tmp_path / "clips", 9) if video else _photos(tmp_path / "photos")
    out = tmp_path / "out"
    assert _train(folder, data, out, "--validation-inference-steps", "2", *frames) == 0
    assert sorted(p.suffix for p in (out / "validation").iterdir()) == [".gif" if video else ".png"] * 2
    assert calls and all(isinstance(c.get("image"), Image.Image) for c in calls)
    if video:  # the length its joint position table was built for, not the call's default 226
        assert {c["max_sequence_length"] for c in calls} == {pipe.transformer.config.max_text_seq_length}
    else:
        mask = np.asarray(calls[0]["mask_image"].convert("L"))
        assert mask[mask.shape[0] // 2, mask.shape[1] // 2] == 255 and mask[0, 0] == 0


def test_validation_steps_an_image_to_image_call_cannot_denoise_are_refused_before_loading(tmp_path, capsys,
                                                                                           monkeypatch):
    from hf_precision.runtime import load
    from hf_precision.testing import make_pipeline, save_pipeline

    folder = save_pipeline(make_pipeline("sdxl_refiner"), tmp_path / "refiner")
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded before refusing"))
    capsys.readouterr()
    assert _train(folder, _photos(tmp_path / "photos"), tmp_path / "out", "--resolution", "32",
                  "--validation-inference-steps", "2") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--validation-inference-steps 2: StableDiffusionXLImg2ImgPipeline denoises 0" in err[0]
    assert "--validation-inference-steps 4 or more" in err[0] and "--strength" not in err[0]


def test_an_edit_models_validation_starts_from_the_reference_at_the_trained_size(tmp_path, monkeypatch, capsys):
    # Flux Kontext resizes its input to about a megapixel unless told not to (pipeline_flux_kontext.py:938): a
    # validation call of a tiny model ran for minutes at 1024x1024
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("flux_kontext")
    folder = save_pipeline(pipe, tmp_path / "kontext")
    calls = []
    original = type(pipe).__call__

    @functools.wraps(original)
    def recording(self, *args, **kwargs):
        calls.append(kwargs)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(type(pipe), "__call__", recording)
    photos, references = _photos(tmp_path / "photos"), tmp_path / "references"
    references.mkdir()
    for i in range(2):
        Image.fromarray(np.full((32, 32, 3), 250 - 40 * i, np.uint8)).save(references / f"i{i}.png")
    assert _train(folder, photos, tmp_path / "out", "--resolution", "32", "--reference-dir", str(references),
                  "--validation-inference-steps", "2") == 0
    assert len(calls) == 2 and all(c["image"].size == (32, 32) and c["_auto_resize"] is False for c in calls)
    assert np.asarray(calls[0]["image"])[0, 0, 0] == 250  # the reference, not the target (60)
    assert "trained 1 step:" in capsys.readouterr().out  # not "1 steps"
