"""Kandinsky 5.0 Image (Kandinsky5T2IPipeline, recipe kandinsky5_image): the Kandinsky 5 video DiT on one latent frame
of a 2D, 16-channel AutoencoderKL. What differs from the video family, each as diffusers 0.42.1 does it: the
output names its pictures ``image``; the latents come 4D from the VAE and the transformer takes (B, 1, H, W, C)
(pipeline_kandinsky_t2i.py:500-506); the rope scale is [1, 1, 1] (:711-712); the latents are scaled without the VAE
config's shift_factor (:804; recipe latent_shift: false); and the call makes only its fixed sizes (:628-631; recipe
sizes:, which the commands refuse others by). The family's generic tests
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
    """A 2-step LoRA train ends with weights diffusers' loader reads (the pipeline has load_lora_weights)."""
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


@pytest.mark.parametrize("command,size", [("generate", ["--height", "32", "--width", "32"]),
                                          ("calibrate", ["--height", "640", "--width", "640"]),
                                          ("generate", ["--height", "1408"])])
def test_a_size_the_call_does_not_make_is_refused_before_loading(command, size, folder, tmp_path, capsys,
                                                                 monkeypatch):
    """The call makes only its `resolutions` and swaps any other size for one of them (pipeline_kandinsky_t2i.py:183,
    :628-631); generate wrote the other size with a note after the run, calibrate measured another size than asked.
    The recipe's sizes: refuse it in one line naming them, before the weights load (a side not given: the call's
    default, 1024: 1408x1024 is not listed)."""
    import hf_precision.runtime.load as load
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    out = ["--prompt", "a cat", "--out", "g.png"] if command == "generate" else ["--out", "i.yaml"]
    assert main([command, str(folder), "--device", "cpu", "--steps", "2", *size, *out]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Kandinsky5T2IPipeline makes only 1024x1024, 640x1408, 1408x640, 768x1280, " \
        "1280x768, 896x1152, 1152x896 (width x height" in err[0] and f"--height {size[1]}" in err[0], err


def test_a_listed_size_passes_and_the_python_api_still_snaps(folder):
    """Only the commands refuse: a listed size (either orientation) passes, and the Python API keeps the
    pipeline's own behaviour (its call snaps, as diffusers documents)."""
    from hf_precision.diagnose.call import size_refused

    assert size_refused("Kandinsky5T2IPipeline", 1408, 640) is None
    assert size_refused("Kandinsky5T2IPipeline", 640, 1408) is None
    assert size_refused("Kandinsky5T2IPipeline", None, None) is None
    assert size_refused("Kandinsky5T2IPipeline", 640, 640) is not None
    import hf_precision as hp

    pipe = hp.load_pipeline(str(folder), "cpu")
    assert pipe(prompt="a cat", num_inference_steps=1, height=48, width=48, output_type="np").image.shape[1:3] == \
        (1024, 1024)


@pytest.mark.parametrize("key,value,message", [
    ("sizes", [{"width": 1024}], "sizes: expected a list of {width, height}"),
    ("sizes", [], "sizes: expected a list of {width, height}"),
    ("latent_shift", "no", "latent_shift: bad value 'no'; allowed: true or false")])
def test_a_bad_sizes_or_latent_shift_is_one_error_naming_file_and_key(key, value, message, tmp_path):
    import yaml

    import hf_precision as hp
    from hf_precision.recipe.catalog import pipeline_spec
    from hf_precision.recipe.files import recipes_dir

    data = yaml.safe_load((recipes_dir() / "kandinsky5_image.yaml").read_text())
    data[key] = value
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(hp.RecipeError) as err:
        pipeline_spec(str(path))
    assert len(err.value.problems) == 1 and err.value.problems[0].startswith(f"{path}: {message}"), err.value


def test_the_latent_shift_is_the_recipe_s_fact_not_code_s(monkeypatch):
    """Which pipelines scale without the VAE's shift_factor is read from the recipe (latent_shift: false), for both
    Kandinsky 5 Image classes it lists; a recipe that said otherwise would be followed."""
    import hf_precision.recipe.catalog as catalog
    import hf_precision.training.encode as encode

    vae = types.SimpleNamespace(config={"scaling_factor": 0.5, "shift_factor": 0.25})
    raw = torch.ones(1, 16, 2, 2)
    monkeypatch.setattr(encode, "vae_latents", lambda *_a, **_k: raw)

    def latents(cls: str) -> float:
        tp = types.SimpleNamespace(components={"vae": vae}, pipe=type(cls, (), {})())
        return encode.encode_images(tp, raw).flatten()[0].item()

    assert latents("Kandinsky5T2IPipeline") == latents("Kandinsky5I2IPipeline") == 0.5
    spec = catalog.pipeline_spec("kandinsky5_image")
    monkeypatch.setattr(catalog, "pipeline_spec", lambda name: {**spec, "latent_shift": True})
    assert latents("Kandinsky5T2IPipeline") == 0.375
