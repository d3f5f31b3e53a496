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


def _pairs(tmp_path: Path, n: int = 2, refs: bool = True, caption: str | None = None) -> Path:
    """A metadata.jsonl edit dataset: target i.png, instruction (``caption``, else one per target), reference
    src/i.png."""
    d = tmp_path / "data"
    lines = []
    for i in range(n):
        _image(d / f"{i}.png", i)
        if refs:
            _image(d / "src" / f"{i}.png", 100 + i)
        text = caption or f"make it red {i}"
        lines.append(json.dumps({"file_name": f"{i}.png", "text": text, "reference": f"src/{i}.png"}))
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


@pytest.fixture(scope="module")
def trained(kontext, tmp_path_factory) -> dict:
    """One 2-step run on tiny Flux Kontext over two pairs of one caption, recording what the transformer, the
    pipeline's encode_prompt and each step's batch saw. Kontext's encode_prompt takes no image; a stand-in with an
    ``image`` parameter (shifting the embeddings by the image's mean, as a vision-language text encoder reads the
    reference with the instruction: Qwen-Image Edit, whose Qwen2VLProcessor cannot be built here without
    torchvision) shows what the program hands a pipeline that encodes the prompt with the reference."""
    import torch
    from diffusers import FluxKontextPipeline, FluxTransformer2DModel

    import hf_precision.apps.train.batches as train_batches

    seen, calls, batches, checking = [], [], [], []
    forward, original = FluxTransformer2DModel.forward, FluxKontextPipeline.encode_prompt
    encode = train_batches.encode_batch

    def spy(self, hidden_states=None, *args, **kwargs):
        seen.append((hidden_states.shape[1], kwargs["img_ids"].shape[0]))
        return forward(self, hidden_states, *args, **kwargs)

    def encode_prompt(self, prompt, prompt_2=None, device=None, num_images_per_prompt=1, prompt_embeds=None,
                      pooled_prompt_embeds=None, max_sequence_length=512, lora_scale=None, image=None):
        embeds, pooled, ids = original(self, prompt, prompt_2, device, num_images_per_prompt, prompt_embeds,
                                       pooled_prompt_embeds, max_sequence_length, lora_scale)
        if not checking:
            calls.append((list(prompt), image))
        if image is not None:
            embeds = embeds + float(np.asarray(image, dtype=np.float32).mean()) / 255.0
        return embeds, pooled, ids

    def batch_spy(run, indices, *step):
        batch = encode(run, indices, *step)
        checking.append(True)  # the pipeline's own encode_prompt of (caption, reference file), and --no-cache's
        want = torch.cat([run.tp.pipe.encode_prompt([run.data.samples[i].caption], device="cpu",
                                                    image=Image.open(run.data.samples[i].reference),
                                                    max_sequence_length=batch["prompt_embeds"].shape[1])[0]
                          for i in indices])
        batches.extend([(batch["prompt_embeds"], want), (train_batches._encode_text(run, indices)["prompt_embeds"], want)])
        checking.clear()
        return batch

    out, tmp = tmp_path_factory.mktemp("trained") / "out", tmp_path_factory.mktemp("pairs")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(FluxTransformer2DModel, "forward", spy)
        mp.setattr(FluxKontextPipeline, "encode_prompt", encode_prompt)
        mp.setattr(train_batches, "encode_batch", batch_spy)
        assert main(["train", "--model", str(kontext), "--data", str(_pairs(tmp, caption="make it red")), "--out",
                     str(out), "--steps", "2", "--device", "cpu", "--quiet", "--lora-rank", "2"]) == 0
    return {"out": out, "data": tmp / "data", "seen": seen, "calls": calls, "batches": batches}


def test_kontext_trains_on_pairs_with_the_references_as_tokens(trained):
    """2 steps on tiny Flux Kontext: each cache entry holds the target's and the reference's latents, and every
    denoiser call gets the reference's packed tokens after the latents' (twice the tokens of the target alone)."""
    from safetensors.torch import load_file

    out, seen = trained["out"], trained["seen"]
    entries = [load_file(p) for p in (out / "cache" / "latents").glob("*.safetensors")]
    assert len(entries) == 2 and all(set(e) == {"latents", "reference_latents"} for e in entries)
    assert all(e["reference_latents"].shape == e["latents"].shape for e in entries)
    assert not any(torch_equal(e["reference_latents"], e["latents"]) for e in entries)
    tokens = entries[0]["latents"].shape[-1] * entries[0]["latents"].shape[-2] // 4  # 2x2 latent patches
    assert seen and all(s == (2 * tokens, 2 * tokens) for s in seen), seen
    assert any(out.glob("*.safetensors"))


def test_prompt_is_encoded_with_each_samples_reference_where_the_pipeline_takes_one(trained):
    """Where encode_prompt takes an ``image`` (Qwen-Image Edit's __call__ passes it the reference), each caption is
    encoded with its sample's reference, cached per (caption, reference): two pairs of one caption get two
    conditionings, and a step's batch (cached, or encoded as --no-cache does) equals the pipeline's own
    encode_prompt of (caption, reference)."""
    import torch

    refs = sorted((trained["data"] / "src").glob("*.png"))
    images = [im for prompt, im in trained["calls"] if prompt == ["make it red"]]
    assert len(images) == 2 and all(im is not None for im in images), images
    files = sorted(np.asarray(Image.open(r)).tobytes() for r in refs)
    assert sorted(np.asarray(im).tobytes() for im in images) == files
    from safetensors.torch import load_file

    texts = [load_file(p)["prompt_embeds"] for p in (trained["out"] / "cache" / "text").glob("*.safetensors")]
    assert len(texts) == 2 and not torch.allclose(texts[0], texts[1])
    assert trained["batches"]
    for got, want in trained["batches"]:
        assert torch.allclose(got.float(), want.float(), atol=1e-5)


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
