"""`hf-precision train` on an edit dataset (Flux Kontext, Qwen-Image Edit): each target paired with the reference
image it was edited from, through metadata.jsonl's ``reference`` column or ``--reference-dir`` (ai-toolkit's
control_path: the same file names); the references are encoded by the VAE path of the targets, cached with them, and
reach the denoiser as extra tokens. Bad references are one error before any model loads."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hf_precision.cli import main


@pytest.fixture(scope="module")
def kontext(tmp_path_factory) -> Path:
    from hf_precision.testing import make_pipeline, save_pipeline

    return save_pipeline(make_pipeline("flux_kontext"), tmp_path_factory.mktemp("kontext") / "model")


def _image(path: Path, seed: int, size=(32, 32)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def _pairs(tmp_path: Path, n: int = 2, refs: bool = True) -> Path:
    """A metadata.jsonl edit dataset: target i.png, instruction, reference src/i.png."""
    d = tmp_path / "data"
    lines = []
    for i in range(n):
        _image(d / f"{i}.png", i)
        if refs:
            _image(d / "src" / f"{i}.png", 100 + i)
        lines.append(json.dumps({"file_name": f"{i}.png", "text": f"make it red {i}", "reference": f"src/{i}.png"}))
    (d / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _no_loading(monkeypatch):
    import hf_precision.runtime.load as load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was found")

    monkeypatch.setattr(load, "load_pipeline", refuse)


def _fails(capsys, model: Path, data: Path, out: Path, *extra: str) -> str:
    code = main(["train", "--model", str(model), "--data", str(data), "--out", str(out), "--quiet", *extra])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not out.exists()
    return err


def test_kontext_trains_on_pairs_with_the_references_as_tokens(kontext, tmp_path, monkeypatch):
    """2 steps on tiny Flux Kontext: each cache entry holds the target's and the reference's latents, and every
    denoiser call gets the reference's packed tokens after the latents' (twice the tokens of the target alone)."""
    from diffusers import FluxTransformer2DModel
    from safetensors.torch import load_file

    seen = []
    forward = FluxTransformer2DModel.forward

    def spy(self, hidden_states=None, *args, **kwargs):
        seen.append((hidden_states.shape[1], kwargs["img_ids"].shape[0]))
        return forward(self, hidden_states, *args, **kwargs)

    monkeypatch.setattr(FluxTransformer2DModel, "forward", spy)
    out = tmp_path / "out"
    assert main(["train", "--model", str(kontext), "--data", str(_pairs(tmp_path)), "--out", str(out), "--steps", "2",
                 "--device", "cpu", "--quiet", "--lora-rank", "2"]) == 0
    entries = [load_file(p) for p in (out / "cache" / "latents").glob("*.safetensors")]
    assert len(entries) == 2 and all(set(e) == {"latents", "reference_latents"} for e in entries)
    assert all(e["reference_latents"].shape == e["latents"].shape for e in entries)
    assert not any(torch_equal(e["reference_latents"], e["latents"]) for e in entries)
    tokens = entries[0]["latents"].shape[-1] * entries[0]["latents"].shape[-2] // 4  # 2x2 latent patches
    assert seen and all(s == (2 * tokens, 2 * tokens) for s in seen), seen
    assert any(out.glob("*.safetensors"))


def torch_equal(a, b) -> bool:
    import torch

    return bool(torch.equal(a, b))


def test_missing_or_unreadable_reference_is_named_before_loading(kontext, tmp_path, capsys, monkeypatch):
    _no_loading(monkeypatch)
    d = _pairs(tmp_path)
    (d / "src" / "1.png").unlink()
    err = _fails(capsys, kontext, d, tmp_path / "o")
    assert "metadata.jsonl: line 2: reference column 'reference': 'src/1.png': no such file" in err
    (d / "src" / "1.png").write_bytes(b"\x89PNG broken")
    err = _fails(capsys, kontext, d, tmp_path / "o")
    assert "reference of 1.png:" in err and "cannot decode it as an image" in err


def test_reference_dir_pairs_by_file_name_and_names_targets_without_one(kontext, tmp_path, capsys, monkeypatch):
    _no_loading(monkeypatch)
    d, refs = tmp_path / "targets", tmp_path / "controls"
    for i in range(3):
        _image(d / f"{i}.png", i)
        (d / f"{i}.txt").write_text("make it red")
    for i in range(2):
        _image(refs / f"{i}.jpg", 100 + i)  # another suffix, the same name: paired
    err = _fails(capsys, kontext, d, tmp_path / "o", "--reference-dir", str(refs))
    assert "1 of 3 file(s) have no reference image (2.png)" in err and str(refs) in err
    from hf_precision.apps.train.references import find_references

    found = find_references(d, [d / "0.png", d / "1.png"], reference_dir=refs)
    assert found == {(d / f"{i}.png").resolve(): refs / f"{i}.jpg" for i in range(2)}


@pytest.mark.parametrize("pipeline, why", [
    ("FluxPipeline", "it does not edit an input image"),
    # they take an `image`, but start from it (strength), with Kontext's transformer class: pairs trained as
    # reference tokens would not match their call, and `train --plan` counted those tokens
    ("FluxImg2ImgPipeline", "its input image is where denoising starts, noised by strength"),
    ("FluxInpaintPipeline", "its input image is where denoising starts, noised by strength")])
def test_references_for_a_model_that_edits_nothing_are_refused(pipeline, why, kontext, tmp_path, capsys, monkeypatch):
    """FluxPipeline, FluxImg2ImgPipeline and FluxInpaintPipeline share Kontext's transformer class (whose row takes
    references) but read no reference image: one line before loading, naming the fix."""
    from hf_precision.apps.train.references import edits_images

    _no_loading(monkeypatch)
    flux = tmp_path / "flux"
    shutil.copytree(kontext, flux)
    index = {**json.loads((flux / "model_index.json").read_text()), "_class_name": pipeline}
    (flux / "model_index.json").write_text(json.dumps(index))
    assert not edits_images(index)  # train --plan adds no reference tokens either
    err = _fails(capsys, flux, _pairs(tmp_path), tmp_path / "o")
    assert f"the data gives reference images, but {pipeline} takes none: {why}" in err and "FluxKontextPipeline" in err


def test_references_for_sdxl_img2img_are_refused_as_img2img(saved_pipeline, tmp_path, capsys, monkeypatch):
    """An SDXL image-to-image folder (its UNet row takes no references): refused before loading, and told apart from
    a model without an input image (it said "it does not edit an input image")."""
    _no_loading(monkeypatch)
    folder = saved_pipeline("sdxl_refiner")
    assert json.loads((folder / "model_index.json").read_text())["_class_name"] == "StableDiffusionXLImg2ImgPipeline"
    err = _fails(capsys, folder, _pairs(tmp_path), tmp_path / "o", "--resolution", "32")
    assert "StableDiffusionXLImg2ImgPipeline takes none: its input image is where denoising starts" in err, err
