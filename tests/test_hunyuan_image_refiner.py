"""HunyuanImage 2.1 Refiner (HunyuanImageRefinerPipeline, recipe hunyuan_image_refiner): the HunyuanImage DiT on one
latent frame of its own 3D VAE, taking the noised input image's latents beside the latents. Its generic tests
(tests/test_families_dit.py) run it under every layout and beside plain diffusers; here what the commands do with
it: check and generate run it from its folder, and train / train --plan run it, its transformer taking the
sample's own latents noised as the pipeline noises its input image (pipeline_hunyuanimage_refiner.py prepare_latents,
:372-373; hf_precision/training/inputs/hunyuan_image_refiner.py)."""

from __future__ import annotations

import pytest

from hf_precision.testing.parts import example_image


@pytest.fixture(scope="module")
def folder(saved_pipeline):
    return saved_pipeline("hunyuan_image_refiner")


def test_check_and_generate_run_it_from_its_folder(folder, tmp_path, capsys, monkeypatch):
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    example_image(32, seed=3).save(tmp_path / "in.png")
    assert main(["check", str(folder), "--device", "cpu"]) == 0
    assert main(["generate", str(folder), "--prompt", "a cat", "--image", "in.png", "--steps", "2", "--height", "32",
                 "--width", "32", "--device", "cpu", "--out", "g.png"]) == 0
    out, err = capsys.readouterr()
    assert "check HunyuanImageRefinerPipeline, recipe hunyuan_image_refiner" in out and "wrote g.png" in out, out
    assert "Traceback" not in err, err


@pytest.mark.parametrize("command", ["generate", "calibrate"])
def test_a_run_without_its_image_is_refused_before_loading(command, folder, tmp_path, capsys, monkeypatch):
    """Its docstring calls the image *optional*; the call fails without one inside diffusers' image processor
    ("Input is in incorrect format", the command sweep's FAIL). The recipe's call_needs makes every command ask."""
    import hf_precision.runtime.load as load
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    args = [command, str(folder), "--device", "cpu", "--steps", "2", "--height", "32", "--width", "32",
            *(["--prompt", "a cat", "--out", "g.png"] if command == "generate" else ["--out", "i.yaml"])]
    assert main(args) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "--image" in err[0] and "HunyuanImageRefinerPipeline" in err[0], err


def test_the_training_condition_is_what_prepare_latents_builds(folder):
    """The sample's latents are _encode_vae_image's (its frame folded into channels, scaled) and the condition
    channels are prepare_latents' cond_latents for that image, noise and strength (pipeline_hunyuanimage_refiner.py
    :334-375, :405-418): the same generator seed gives the same noise."""
    import torch

    import hf_precision as hp

    pipe = hp.load_pipeline(str(folder), "cpu")
    tp = hp.prepare_training(pipe, device="cpu", train={"transformer": "lora"}, rank=2)
    pixels = torch.rand(2, 3, 32, 32) * 2 - 1
    latents = tp.encode_images(pixels, torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = pipe._encode_vae_image(pixels.unsqueeze(2), torch.Generator().manual_seed(0))
    assert latents.shape == (2, 4, 2, 2) and torch.allclose(latents, want.squeeze(2), atol=1e-6)
    cond = tp.encode_condition(pixels, latents, torch.Generator().manual_seed(5))["condition_latents"]
    _, expected = pipe.prepare_latents(want, 2, 4, 32, 32, torch.float32, "cpu", torch.Generator().manual_seed(5),
                                       latents=torch.zeros(2, 4, 1, 2, 2))
    assert torch.allclose(cond, expected.squeeze(2), atol=1e-6), (cond - expected.squeeze(2)).abs().max()
    # a step runs on it: folded latents and condition, the frame axis the transformer patches
    loss = tp.loss({"latents": latents, "condition_latents": cond, **tp.encode_prompt(["a cat", "a dog"])})
    assert loss.isfinite() and loss.item() > 0


@pytest.mark.parametrize("plan", [True, False])
def test_train_runs_two_steps_from_its_folder(plan, folder, tmp_path, capsys, monkeypatch):
    from hf_precision.cli import main

    data = tmp_path / "data"
    data.mkdir()
    example_image(32, seed=1).save(data / "a.png")
    (data / "a.txt").write_text("a cat")
    monkeypatch.chdir(tmp_path)
    args = ["train", *(["--plan"] if plan else []), "--model", str(folder), "--data", str(data), "--device", "cpu",
            "--resolution", "32", "--steps", "2", "--out", "lora"]
    assert main(args) == 0
    out, err = capsys.readouterr()
    assert "error" not in err and "Traceback" not in err, err
    assert (tmp_path / "lora").exists() != plan, out


def test_its_vae_gets_a_recipe_of_its_own_not_the_composed_fallback(folder):
    """Before the recipe, a composed one kept AutoencoderKLHunyuanImageRefiner in the first dtype a T4 picks, fp16,
    with a 'no component recipe for vae' warning; the release runs it in bf16 (pipeline_hunyuanimage_refiner.py:50-52)
    and no fp16 run is published, so without bf16 it is fp32."""
    import warnings

    import torch

    import hf_precision as hp

    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*no component recipe.*")
        pipe = hp.load_pipeline(str(folder), "cpu", layout="t4")
    recipe = hp.applied(pipe).recipe
    assert recipe.name == "hunyuan_image_refiner" and recipe["vae"].recipe == "hunyuan_image.refiner_vae"
    assert recipe["vae"].compute == "float32" and pipe.vae.dtype == torch.float32


@pytest.mark.parametrize("value", ["image", [], ["an image"], [3]])
def test_a_bad_call_needs_is_one_error_naming_file_and_key(value, tmp_path):
    import yaml

    import hf_precision as hp
    from hf_precision.recipe.catalog import pipeline_spec
    from hf_precision.recipe.files import recipes_dir

    data = yaml.safe_load((recipes_dir() / "hunyuan_image_refiner.yaml").read_text())
    data["call_needs"] = value
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    with pytest.raises(hp.RecipeError) as err:
        pipeline_spec(str(path))
    assert len(err.value.problems) == 1, err.value
    assert err.value.problems[0].startswith(f"{path}: call_needs: expected a list of __call__ argument names"), err.value
