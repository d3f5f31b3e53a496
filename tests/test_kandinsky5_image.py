"""Kandinsky 5.0 Image (Kandinsky5T2IPipeline, recipe kandinsky5_image): the Kandinsky 5 video DiT on one latent frame
of a 2D, 16-channel AutoencoderKL. What differs from the video family, each as diffusers 0.42.1 does it: the
output names its pictures ``image``; the latents come 4D from the VAE and the transformer takes (B, 1, H, W, C)
(pipeline_kandinsky_t2i.py:500-506); the rope scale is [1, 1, 1] (:711-712); the latents are scaled without the VAE
config's shift_factor (:804); and the call makes only its fixed sizes (:628-631). The family's generic tests
(tests/test_families_dit.py) run it under every layout."""

from __future__ import annotations

import json
import types

import pytest
import torch

from hf_precision.testing.parts import example_image


@pytest.fixture(scope="module")
def folder(saved_pipeline):
    return saved_pipeline("kandinsky5_t2i")


def test_channels_last_takes_an_image_vae_s_latents_as_one_frame():
    """Without the frame axis, training failed in permute (a traceback: 4 dims, 5 asked)."""
    from hf_precision.training.inputs.registry import model_layout

    row = types.SimpleNamespace(layout="channels_last")
    x = torch.arange(2 * 16 * 3 * 5, dtype=torch.float32).reshape(2, 16, 3, 5)
    out = model_layout(row, x)
    assert out.shape == (2, 1, 3, 5, 16) and torch.equal(out[:, 0], x.permute(0, 2, 3, 1))


@pytest.mark.parametrize("latents, pixels, scale", [((1, 16, 4, 4), 32, (1.0, 1.0, 1.0)),
                                                    ((1, 16, 1, 4, 4), 32, (1, 3.16, 3.16)),
                                                    ((1, 16, 1, 64, 64), 512, (1, 2, 2))])
def test_rope_scale_follows_the_pipeline_that_made_the_latents(latents, pixels, scale):
    """Kandinsky 5 Image passes scale_factor [1, 1, 1] (pipeline_kandinsky_t2i.py:711-712); the video pipelines scale
    by size (pipeline_kandinsky.py:209-227). The image model trained with the video scale before."""
    from hf_precision.training.inputs import kandinsky5_rope  # noqa: F401  (registers the builder)
    from hf_precision.training.inputs.registry import BUILDERS, model_layout

    row = types.SimpleNamespace(layout="channels_last")
    batch = {"latents": torch.zeros(latents), "prompt_embeds": torch.zeros(1, 3, 16), "vae_scale_factor": 8}
    module = types.SimpleNamespace(config={"patch_size": [1, 2, 2]})
    got = BUILDERS["kandinsky5_rope"](row, module, batch, model_layout(row, batch["latents"]))
    assert tuple(got["scale_factor"]) == scale and len(got["visual_rope_pos"][1]) == latents[-2] // 2


def test_training_latents_are_scaled_without_the_shift_the_pipeline_never_applies(monkeypatch):
    """The pipeline decodes latents / scaling_factor (pipeline_kandinsky_t2i.py:804); training subtracted the config's
    shift_factor first, so it learnt latents offset by 0.1159 * 0.3611 from those it denoises."""
    import hf_precision.training.encode as encode

    vae = types.SimpleNamespace(config={"scaling_factor": 0.5, "shift_factor": 0.25})
    raw = torch.ones(1, 16, 2, 2)
    monkeypatch.setattr(encode, "vae_latents", lambda *_a, **_k: raw)
    for cls, expected in (("Kandinsky5T2IPipeline", 0.5), ("FluxPipeline", 0.375)):
        tp = types.SimpleNamespace(components={"vae": vae}, pipe=type(cls, (), {})())
        assert torch.allclose(encode.encode_images(tp, raw), torch.full_like(raw, expected)), cls


def test_train_and_generate_run_through_the_command_line(folder, tmp_path, capsys, monkeypatch):
    """A 2-step LoRA train ends with weights diffusers' loader reads (the pipeline has load_lora_weights), and
    generate says that the pipeline made another size than asked instead of writing it silently."""
    from hf_precision.cli import main

    data = tmp_path / "data"
    data.mkdir()
    for i in range(2):
        example_image(32, seed=i).save(data / f"{i}.png")
        (data / f"{i}.txt").write_text("a cat")
    monkeypatch.chdir(tmp_path)
    assert main(["train", "--model", str(folder), "--data", str(data), "--device", "cpu", "--resolution", "32",
                 "--steps", "2", "--out", "lora"]) == 0
    out, err = capsys.readouterr()
    assert "trained 2 steps" in out and "Traceback" not in err, err
    assert json.loads((tmp_path / "lora" / "training.json").read_text())
    assert (tmp_path / "lora" / "pytorch_lora_weights.safetensors").is_file()
    assert main(["generate", str(folder), "--prompt", "a cat", "--steps", "2", "--height", "32", "--width", "32",
                 "--device", "cpu", "--out", "g.png"]) == 0
    out, err = capsys.readouterr()
    assert ("note: Kandinsky5T2IPipeline made a 1024x1024 picture, not the asked 32x32: the pipeline chooses its "
            "output size itself") in out.splitlines(), out
