"""`hf-precision train` on ChronoEdit (issue 34): an image-edit model on Wan 2.1 I2V's architecture whose denoiser
takes 20 channels beyond the latents. Its prepare_latents is Wan I2V's (diffusers 0.42.1
pipeline_chronoedit.py:378-444) with the input image as the clip's first frame, and its call makes 5 frames (:593),
the last the edit. A (reference, target) pair therefore trains as the 5-frame clip reference, target x4; the
condition channels and the CLIP image embedding are the pipeline's own for the reference. Wan-Animate given clips
alone is refused, naming the pose and face videos it needs (tests/test_train_wan_animate.py: with them it trains)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_precision.cli import main


def _image(path: Path, seed: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(path)
    return path


def _pairs(tmp_path: Path, refs: bool = True) -> Path:
    """Two edit pairs in metadata.jsonl: target i.png, instruction, reference src/i.png (none with ``refs=False``)."""
    d = tmp_path / "data"
    lines = []
    for i in range(2):
        _image(d / f"{i}.png", i)
        row = {"file_name": f"{i}.png", "text": f"make it red {i}"}
        if refs:
            row["reference"] = f"src/{i}.png"
            _image(d / "src" / f"{i}.png", 100 + i)
        lines.append(json.dumps(row))
    (d / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _clips(data: Path) -> Path:
    """Two captioned 5-frame GIF clips."""
    data.mkdir()
    for i in range(2):
        frames = [Image.fromarray(np.random.default_rng(10 * i + k).integers(0, 256, (32, 32, 3), dtype=np.uint8))
                  for k in range(5)]
        frames[0].save(data / f"{i}.gif", save_all=True, append_images=frames[1:])
        (data / f"{i}.txt").write_text("a dance")
    return data


def _pipeline_inputs(pipe, reference: Path) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(latents, condition, image_embeds) as ChronoEditPipeline.__call__ makes them for ``reference`` at 32x32 and
    its 5 frames (:636, :645-658)."""
    image = Image.open(reference).convert("RGB")
    pixels = pipe.video_processor.preprocess(image, height=32, width=32).to(dtype=torch.float32)
    with torch.no_grad():
        latents, condition = pipe.prepare_latents(pixels, 1, pipe.vae.config.z_dim, 32, 32, 5, torch.float32,
                                                  torch.device("cpu"), None, None)
        embeds = pipe.encode_image(image, torch.device("cpu"))
    return latents, condition, embeds


def test_condition_and_image_embeds_equal_the_pipelines_own(tmp_path):
    """The training clip's condition (wan_first_frame on the clip reference, target x4) and image embedding are what
    the pipeline's prepare_latents and encode_image make from the reference, and the target's latents have the
    shape of the latents the call denoises (2 latent frames). Without the row's ChronoEditPipeline condition,
    encode_condition raises (no builder makes the 20 channels)."""
    import hf_precision as hp
    from hf_precision.apps.train.data import Sample, to_pixels
    from hf_precision.apps.train.references import edit_clip
    from hf_precision.testing import make_pipeline

    data = _pairs(tmp_path)
    pipe = make_pipeline("chronoedit")
    tp = hp.prepare_training(pipe, device="cpu", train={"transformer": "lora"}, rank=2)
    sample = Sample(data / "0.png", "x", (32, 32), (32, 32), reference=data / "src" / "0.png")
    clip = edit_clip(to_pixels(Sample(sample.reference, "x", (32, 32), (32, 32))), to_pixels(sample), 5)[None]
    assert torch.equal(clip[:, :, 2], clip[:, :, 4]) and not torch.equal(clip[:, :, 0], clip[:, :, 1])
    latents = tp.encode_images(clip)
    made = tp.encode_condition(clip, latents)
    want_latents, want_condition, want_embeds = _pipeline_inputs(pipe, sample.reference)
    assert latents.shape == want_latents.shape == (1, 16, 2, 4, 4)
    assert made["condition_latents"].shape == want_condition.shape == (1, 20, 2, 4, 4)
    torch.testing.assert_close(made["condition_latents"], want_condition.float(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(made["image_embeds"], want_embeds.float(), atol=1e-4, rtol=1e-4)


@pytest.fixture(scope="module")
def trained(saved_pipeline, tmp_path_factory) -> dict:
    """A 2-step CLI run on the tiny ChronoEdit over two edit pairs, recording what the transformer was called with."""
    from diffusers import ChronoEditTransformer3DModel

    seen = []
    forward = ChronoEditTransformer3DModel.forward

    def spy(self, hidden_states=None, *args, **kwargs):
        seen.append((hidden_states.detach().float().clone(), kwargs["encoder_hidden_states_image"].shape))
        return forward(self, hidden_states, *args, **kwargs)

    tmp = tmp_path_factory.mktemp("chrono")
    model, data, out = saved_pipeline("chronoedit"), _pairs(tmp), tmp / "out"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ChronoEditTransformer3DModel, "forward", spy)
        code = main(["train", "--model", str(model), "--data", str(data), "--out", str(out), "--steps", "2",
                     "--device", "cpu", "--frames", "5", "--resolution", "32", "--quiet", "--lora-rank", "2"])
    assert code == 0
    return {"model": model, "data": data, "out": out, "seen": seen}


def test_cli_trains_chronoedit_on_pairs_with_the_pipelines_condition(trained):
    """2 steps: each cached sample holds the clip's latents (2 latent frames), the condition channels and the CLIP
    embedding the loaded pipeline's own prepare_latents / encode_image make from that sample's reference; every
    transformer call got 16 + 20 channels with that condition after the noisy latents, and the LoRA was written."""
    from diffusers import DiffusionPipeline
    from safetensors.torch import load_file

    pipe = DiffusionPipeline.from_pretrained(trained["model"], torch_dtype=torch.float32)
    wants = [_pipeline_inputs(pipe, r) for r in sorted((trained["data"] / "src").glob("*.png"))]
    entries = [load_file(p) for p in (trained["out"] / "cache" / "latents").glob("*.safetensors")]
    assert len(entries) == 2 and all("reference_latents" not in e for e in entries)
    for entry in entries:
        assert entry["latents"].shape == (1, 16, 2, 4, 4)
        match = [w for w in wants if torch.allclose(entry["condition_latents"].float(), w[1].float(), atol=2e-2)]
        assert len(match) == 1, "the cached condition is no reference's prepare_latents condition"
        torch.testing.assert_close(entry["image_embeds"].float(), match[0][2].float(), atol=2e-2, rtol=2e-2)
    conditions = [e["condition_latents"].float() for e in entries]
    assert trained["seen"]
    for hidden, image_shape in trained["seen"]:
        assert hidden.shape[1:] == (36, 2, 4, 4) and image_shape[1:] == entries[0]["image_embeds"].shape[1:]
        assert any(torch.allclose(hidden[0, 16:], c[0], atol=2e-2) for c in conditions)
    assert any(trained["out"].glob("*.safetensors"))


def _no_loading(monkeypatch):
    import hf_precision.runtime.load as load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was found")

    monkeypatch.setattr(load, "load_pipeline", refuse)


@pytest.mark.parametrize("refs, frames, says", [
    (False, "5", "2 of 2 image(s) have no reference image"),
    (True, "9", "--frames 9"),
    (False, None, "2 of 2 image(s) have no reference image"),  # no --frames: its one count, 5, as train --plan takes
    ("clips", "5", "no images (.png, .jpg, ...) in the folder; ChronoEditPipeline is an edit model"),
])
def test_chronoedit_without_pairs_or_with_other_frames_is_refused_before_loading(
        refs, frames, says, saved_pipeline, tmp_path, capsys, monkeypatch):
    """Targets alone would teach the edit model to ignore its input image; another frame count is not the clip its
    call makes (5); clips are not its pairs of images: one error each, naming the fix, before any model loads."""
    _no_loading(monkeypatch)
    out = tmp_path / "out"
    data = _clips(tmp_path / "clips") if refs == "clips" else _pairs(tmp_path, refs)
    code = main(["train", "--model", str(saved_pipeline("chronoedit")), "--data", str(data),
                 "--out", str(out), *(["--frames", frames] if frames else []), "--resolution", "32", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("error:") == 1 and "Traceback" not in err and says in err, err
    assert not out.exists()


def test_wan_animate_is_refused_naming_the_data_it_would_need(saved_pipeline, tmp_path, capsys, monkeypatch):
    """Wan-Animate's denoiser takes a reference character image, a pose video and a face video beside each clip
    (pipeline_wan_animate.py __call__), which clips with captions beside them do not give: refused before loading,
    the message naming that data and the metadata.jsonl columns that give it."""
    _no_loading(monkeypatch)
    data, out = _clips(tmp_path / "clips"), tmp_path / "out"
    code = main(["train", "--model", str(saved_pipeline("wan_animate")), "--data", str(data), "--out", str(out),
                 "--frames", "5", "--resolution", "32", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1 and "Traceback" not in err, err
    assert all(w in err for w in ("WanAnimatePipeline", "reference image", "pose video", "face video",
                                  "metadata.jsonl columns 'reference'")), err
    assert not out.exists()


def test_validation_of_an_edit_model_gets_the_first_pairs_reference(saved_pipeline, tmp_path, capsys, monkeypatch):
    """`--validation-prompt` on ChronoEdit: the prompt went positionally into the call's first parameter, its image
    ('`image` has to be of type torch.Tensor or PIL.Image.Image but is str', a traceback before step 1); the call now
    gets the prompt by keyword and the first pair's reference as its image, and a clip is written per validation."""
    import functools

    from diffusers import ChronoEditPipeline

    seen = []
    call = ChronoEditPipeline.__call__

    @functools.wraps(call)  # the program reads the call's parameters
    def spy(self, *args, **kwargs):
        seen.append((args, kwargs.get("prompt"), kwargs.get("image")))
        return call(self, *args, **kwargs)

    monkeypatch.setattr(ChronoEditPipeline, "__call__", spy)
    data, out = _pairs(tmp_path), tmp_path / "out"
    code = main(["train", "--model", str(saved_pipeline("chronoedit")), "--data", str(data), "--out", str(out),
                 "--steps", "1", "--device", "cpu", "--frames", "5", "--resolution", "32", "--quiet", "--lora-rank", "2",
                 "--validation-prompt", "make it red", "--validation-inference-steps", "1"])
    assert code == 0, capsys.readouterr().err
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step-000000.gif", "step-000001.gif"]
    reference = np.asarray(Image.open(data / "src" / "0.png").convert("RGB"))
    for args, prompt, image in seen:
        assert args == () and prompt == "make it red" and np.array_equal(np.asarray(image), reference)
