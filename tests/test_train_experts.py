"""`hf-precision train --expert high|low|both` on a two-expert model (Wan 2.2 A14B's layout: transformer for high
noise, transformer_2 for low noise, switched at boundary_ratio): the plan and the run say which expert trains, each run
trains that one only, and its LoRA loads into it with plain diffusers (`load_into_transformer_2=True` for the
low-noise one). A model with one denoiser refuses --expert before loading."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_precision.cli import main


@pytest.fixture(scope="module")
def wan22(tmp_path_factory) -> tuple[Path, Path]:
    """(a tiny Wan 2.2 folder with two experts, a folder of two 5-frame clips with captions)."""
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("wan")
    torch.manual_seed(1)
    pipe.register_modules(transformer_2=type(pipe.transformer).from_config(pipe.transformer.config).eval())
    pipe.register_to_config(boundary_ratio=0.875)
    tmp = tmp_path_factory.mktemp("wan22")
    data = tmp / "clips"
    data.mkdir()
    rng = np.random.default_rng(0)
    for n in range(2):
        frames = [Image.fromarray(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8)) for _ in range(5)]
        frames[0].save(data / f"{n}.gif", save_all=True, append_images=frames[1:], duration=100)
        (data / f"{n}.txt").write_text("a cat walking")
    return save_pipeline(pipe, tmp / "model"), data


def test_both_experts_by_default_each_loadable_by_plain_diffusers(wan22, tmp_path, capsys):
    """The default trains both experts, as ai-toolkit's does: one run each into OUT/high_noise and OUT/low_noise;
    the high-noise LoRA loads into transformer, the low-noise one with load_into_transformer_2=True, and neither
    touches the other expert. The plan names the expert(s) for each choice."""
    from diffusers import DiffusionPipeline

    model, data = wan22
    plan = ["train", "--plan", "--model", str(model), "--device", "cpu", "--frames", "5", "--resolution", "16"]
    assert main(plan + ["--expert", "low"]) == 0
    assert "this run trains the low-noise expert transformer_2 (timesteps below 0.875" in capsys.readouterr().out
    assert main(plan) == 0
    assert "trains both experts, one run each" in capsys.readouterr().out
    out = tmp_path / "both"
    assert main(["train", "--model", str(model), "--data", str(data), "--out", str(out), "--steps", "2", "--frames",
                 "5", "--resolution", "16", "--device", "cpu", "--lora-rank", "2", "--quiet"]) == 0
    printed = capsys.readouterr().out
    assert "trains the high-noise expert transformer (timesteps from 0.875" in printed
    assert f"pipe.load_lora_weights('{out / 'low_noise'}', load_into_transformer_2=True)" in printed
    for expert, into, other in (("high", "transformer", "transformer_2"), ("low", "transformer_2", "transformer")):
        pipe = DiffusionPipeline.from_pretrained(str(model))
        pipe.load_lora_weights(str(out / f"{expert}_noise"), load_into_transformer_2=expert == "low")
        trained = [v for k, v in getattr(pipe, into).state_dict().items() if "lora_B" in k]
        assert trained and all(v.abs().max() > 0 for v in trained), f"the {expert}-noise LoRA holds no update"
        assert getattr(getattr(pipe, other), "peft_config", None) is None  # the other expert untouched


def test_expert_on_a_model_with_one_denoiser_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import hf_precision.runtime.load as load
    from hf_precision.testing import make_pipeline, save_pipeline

    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: (_ for _ in ()).throw(AssertionError("loaded")))
    model = save_pipeline(make_pipeline("sd15"), tmp_path / "sd15")
    data = tmp_path / "d"
    data.mkdir()
    Image.new("RGB", (32, 32)).save(data / "a.png")
    (data / "a.txt").write_text("a cat")
    code = main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o"), "--expert", "low",
                 "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1
    assert "--expert low: StableDiffusionPipeline has one denoiser" in err


def test_both_experts_resume_each_its_own_checkpoint_with_the_same_loss_curve(wan22, tmp_path):
    """`--expert both --resume latest` after a stop in either expert's run (Ctrl-C: a checkpoint and exit 130): the
    expert that was cut resumes its own checkpoint, one already finished is not trained again, one not started yet
    starts fresh, and each loss curve equals an uninterrupted run's."""
    import dataclasses

    from hf_precision.apps.train.experts import expert_runs
    from hf_precision.apps.train.loop import train
    from hf_precision.apps.train.settings import TrainSettings

    model, data = wan22
    base = TrainSettings(model=str(model), data=str(data), out="", device="cpu", lora_rank=2, steps=2, frames=5,
                         resolution=16, checkpoint_every=1000, learning_rate=5e-3, quiet=True)

    def run_all(out, resume=None, stop_in=None):  # as `hf-precision train` runs them: the first stop ends the command
        results = {}
        for s in expert_runs(dataclasses.replace(base, out=str(out), resume=resume)):
            r = results[Path(s.out).name] = train(dataclasses.replace(s, stop_after=1 if s.expert == stop_in else None))
            if r.exit_code:
                break
        return results

    whole = run_all(tmp_path / "whole")
    assert sorted(whole) == ["high_noise", "low_noise"] and all(len(r.losses) == 2 for r in whole.values())
    out = tmp_path / "cut"
    first = run_all(out, stop_in="high")  # Ctrl-C in the high-noise run: the low-noise one never started
    assert list(first) == ["high_noise"] and first["high_noise"].exit_code == 130
    second = run_all(out, resume="latest", stop_in="low")  # high resumes its checkpoint; low starts, then is cut
    assert list(second) == ["high_noise", "low_noise"] and second["low_noise"].exit_code == 130
    third = run_all(out, resume="latest")  # the finished high-noise run is not loaded again
    assert list(third) == ["low_noise"] and third["low_noise"].exit_code == 0
    for name, done in (("high_noise", second), ("low_noise", third)):
        assert done[name].losses == whole[name].losses, (name, done[name].losses, whole[name].losses)
        assert (out / name / "pytorch_lora_weights.safetensors").is_file()


def test_both_experts_give_a_checkpoint_path_to_the_expert_that_owns_it(wan22, tmp_path):
    """`--expert both --resume PATH`: the expert whose folder holds PATH resumes it, the other its latest (or it is
    skipped when finished); a path in neither folder is refused before loading (no model is read here)."""
    import json

    from hf_precision.apps.train.experts import expert_runs
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.errors import RecipeError

    model, data = wan22
    (tmp_path / "o" / "high_noise").mkdir(parents=True)
    (tmp_path / "o" / "low_noise").mkdir()
    (tmp_path / "o" / "high_noise" / "training.json").write_text(json.dumps({"steps": 4}))
    path = str(tmp_path / "o" / "low_noise" / "checkpoints" / "step-000002")
    said = []
    s = TrainSettings(model=str(model), data=str(data), out=str(tmp_path / "o"), steps=4, resume=path)
    runs = expert_runs(s, say=said.append)
    assert [(r.expert, r.resume) for r in runs] == [("low", path)] and "finished its 4 steps" in said[0]
    s.steps = 6  # more steps than the finished run made: it continues from its latest checkpoint
    assert [(r.expert, r.resume) for r in expert_runs(s)] == [("high", "latest"), ("low", path)]
    s.resume = str(tmp_path / "elsewhere")
    with pytest.raises(RecipeError, match="trains each expert from its own checkpoints"):
        expert_runs(s)
