"""The other methods and a video family through `hf-precision train`: textual inversion (only the token's file),
a full fine-tune (the denoiser folder loads back), and a Wan LoRA on clips with validation GIFs."""

from __future__ import annotations

import pytest
import torch

from checks import write_clips
from hf_precision.cli import main


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster


def _common(model, data):
    return ["train", "--model", str(model), "--data", str(data), "--resolution", "32", "--device", "cpu", "--quiet",
            "--steps", "2", "--lora-rank", "4"]


def test_textual_inversion_writes_the_token_and_refuses_captions_without_it(train_demo, tmp_path, capsys):
    args = [*_common(*train_demo), "--embedding", "<my-sq>", "--init-token", "a"]
    assert main([*args, "--out", str(tmp_path / "no")]) == 2
    assert "do not contain the token" in capsys.readouterr().err and not (tmp_path / "no").exists()
    assert main([*args, "--out", str(tmp_path / "ti"), "--caption", "a photo of <my-sq>"]) == 0
    files = sorted(p.name for p in (tmp_path / "ti").glob("*.safetensors"))
    assert files == ["text_encoder.my-sq.safetensors"]


def test_full_fine_tune_saves_a_denoiser_that_loads(train_demo, tmp_path):
    from diffusers import UNet2DConditionModel

    # --no-cache: nothing else makes the output folder before the first log line (it raised FileNotFoundError)
    assert main([*_common(*train_demo), "--out", str(tmp_path / "full"), "--method", "full", "--layout", "t4",
                 "--no-cache"]) == 0
    unet = UNet2DConditionModel.from_pretrained(str(tmp_path / "full" / "unet"))
    before = UNet2DConditionModel.from_pretrained(str(train_demo[0] / "unet"))
    changed = [n for (n, a), (_, b) in zip(unet.named_parameters(), before.named_parameters()) if not torch.equal(a, b)]
    assert changed


def test_wan_lora_on_clips(tmp_path):
    from hf_precision.testing import make_pipeline, save_pipeline

    wan = save_pipeline(make_pipeline("wan"), tmp_path / "wan")
    clips = write_clips(tmp_path / "clips")
    out = tmp_path / "wan-lora"
    assert main(["train", "--model", str(wan), "--data", str(clips), "--out", str(out), "--frames", "5",
                 "--resolution", "16", "--device", "cpu", "--quiet", "--steps", "2", "--lora-rank", "4",
                 "--validation-prompt", "a cat", "--validation-inference-steps", "2"]) == 0
    assert (out / "pytorch_lora_weights.safetensors").is_file()
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step-000000.gif", "step-000002.gif"]


def test_a_registered_method_trains_through_the_program_with_no_edit(train_demo, tmp_path, monkeypatch, capsys):
    """A new method is one file: a Method subclass and register_method. Here, a toy that trains only the denoiser's
    biases: the command line offers it, --plan predicts it, and a 1-step run trains and saves it, with no edit of
    the program (settings, prepare, results, plan, CLI)."""
    from diffusers import UNet2DConditionModel

    from hf_precision.training import methods

    class Bias(methods.Method):
        name = "bias"
        trains_weights = True
        every_weight = True  # its masters are the denoiser's own weights (not an adapter): computed under autocast

        def owns(self, parameter: str) -> bool:
            return parameter.endswith(".bias")

    monkeypatch.setattr(methods, "_REGISTRY", dict(methods._REGISTRY))  # the registration ends with the test
    methods.register_method(Bias())
    model = str(train_demo[0])
    assert main(["train", "--plan", "--model", model, "--device", "t4", "--method", "bias", "--resolution", "32"]) == 0
    plan = capsys.readouterr().out
    assert "(StableDiffusionPipeline), bias, 32px" in plan and "predicted peak" in plan
    out = tmp_path / "bias"
    assert main([*_common(*train_demo), "--out", str(out), "--method", "bias", "--steps", "1"]) == 0
    assert "from_pretrained on the denoiser's subfolder" in capsys.readouterr().out
    unet = UNet2DConditionModel.from_pretrained(str(out / "unet"))
    before = UNet2DConditionModel.from_pretrained(str(train_demo[0] / "unet"))
    changed = {n for (n, a), (_, b) in zip(unet.named_parameters(), before.named_parameters()) if not torch.equal(a, b)}
    assert changed and all(n.endswith(".bias") for n in changed)
