"""`hf-precision train` end to end on a tiny SD 1.x (CPU): the demo learns, a LoRA trained under the T4 and A100
layouts changes an hf_precision pipeline after load_lora_weights, a killed run resumes on the same loss curve,
Ctrl-C saves and exits 130, a NaN loss names the step and component, and the cache is keyed by the plan."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hf_precision.apps.train.loop import train
from hf_precision.apps.train.settings import TrainSettings
from hf_precision.cli import main
from hf_precision.errors import RecipeError


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: one thread is faster


def _settings(train_demo, out: Path, **kw) -> TrainSettings:
    model, data = train_demo
    base = dict(model=str(model), data=str(data), out=str(out), device="cpu", lora_rank=4, steps=4, batch_size=2,
                learning_rate=5e-3, resolution=32, checkpoint_every=2, quiet=True)
    base.update(kw)
    return TrainSettings(**base)


def test_demo_command_trains_and_its_loss_falls(tmp_path, capsys):
    out = tmp_path / "demo-lora"
    assert main(["train", "--demo", "--out", str(out), "--quiet"]) == 0
    printed = capsys.readouterr().out
    record = json.loads((out / "training.json").read_text())
    before, after = (float(x) for x in
                     __import__("re").search(r"([\d.]+) before, ([\d.]+) after", printed).groups())
    assert after < before, printed
    assert (out / "pytorch_lora_weights.safetensors").is_file()
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step-000000.png", f"step-{record['steps']:06d}.png"]
    assert record["settings"]["method"] == "lora" and record["fingerprint"]
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, record["steps"] + 1))
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name or p.name.startswith(".save-")]


def _pipeline_output(model: Path, layout: str, lora: Path | None) -> tuple[np.ndarray, list[str]]:
    """The pipeline's image, and the text encoder's LoRA parameters once ``load_lora_weights`` read ``lora``."""
    import hf_precision as hp

    pipe = hp.load_pipeline(str(model), "cpu", layout=layout)
    pipe.set_progress_bar_config(disable=True)
    if lora is not None:
        pipe.load_lora_weights(str(lora))
    out = pipe("a red square", num_inference_steps=2, height=32, width=32, output_type="np",
               generator=torch.Generator().manual_seed(0))
    return out.images[0], [n for n, _ in pipe.text_encoder.named_parameters() if "lora_" in n]


@pytest.mark.parametrize("layout", ["t4", "a100"])
def test_lora_trained_under_a_layout_changes_the_pipeline(train_demo, tmp_path, layout):
    """Through the command. T4: --train-text-encoder (fp16 text encoder + GradScaler, fp32 masters). A100: on a
    quanto qint8 UNet (issue 23's QLoRA-style run), loaded for the training rule's bf16 (inference picks fp16), and
    the LoRA then applied to the unquantized pipeline."""
    from safetensors import safe_open

    out = tmp_path / layout
    text = layout == "t4"
    assert main(["train", "--model", str(train_demo[0]), "--data", str(train_demo[1]), "--out", str(out), "--layout", layout,
                 "--device", "cpu", "--quiet", "--steps", "3", "--lora-rank", "4", "--batch-size", "2",
                 "--learning-rate", "5e-3", "--resolution", "32",
                 *(["--train-text-encoder"] if text else ["--set", "unet.storage=quanto-int8"])]) == 0
    record = json.loads((out / "training.json").read_text())
    assert np.isfinite(record["final_loss"])
    rows = {line.split()[0]: line.split() for line in record["plan"].splitlines()[2:] if line[:1].isalpha()}
    assert rows["text_encoder"][1:3] == (["lora", "r=4"] if text else ["frozen", "float16"])
    if text:
        assert rows["text_encoder"][3:7] == ["float16", "float16", "512", "float32"]  # the text encoder's LoRA masters (base float16)
    else:
        assert rows["unet"][3:5] == ["quanto-int8", "bfloat16"] and "kept from loading" not in record["plan"]
        assert "quantized base: unet quanto-int8 (quanto int8)" in record["plan"]
    with safe_open(str(out / "pytorch_lora_weights.safetensors"), "pt") as f:
        keys = list(f.keys())
        assert keys and all(f.get_tensor(k).dtype == torch.float16 for k in keys)  # --save-dtype default
        assert any(k.startswith("text_encoder.") for k in keys) == text
    before, _ = _pipeline_output(train_demo[0], layout, None)
    after, text_lora = _pipeline_output(train_demo[0], layout, out)
    assert np.isfinite(after).all()
    assert np.abs(after - before).max() > 1e-3
    assert bool(text_lora) == text  # load_lora_weights put the trained text-encoder LoRA in


def test_resume_after_a_kill_continues_the_same_loss_curve(train_demo, tmp_path):
    # T4 layout: fp16 compute, GradScaler state, AdamW moments and the RNG all have to come back exactly.
    whole = train(_settings(train_demo, tmp_path / "whole", layout="t4", steps=6, checkpoint_every=3))
    first = train(_settings(train_demo, tmp_path / "cut", layout="t4", steps=6, checkpoint_every=10, stop_after=2))
    assert first.exit_code == 130 and first.step == 2
    assert (tmp_path / "cut" / "checkpoints" / "step-000002").is_dir()
    assert not (tmp_path / "cut" / "pytorch_lora_weights.safetensors").exists()
    rest = train(_settings(train_demo, tmp_path / "cut", layout="t4", steps=6, checkpoint_every=10, resume="latest"))
    assert rest.exit_code == 0 and rest.step == 6
    assert rest.losses == whole.losses  # steps 1-2 from the checkpoint, 3-6 computed again: bit for bit


def test_resume_refuses_other_settings_and_other_data(train_demo, tmp_path, capsys):
    import shutil

    model, data = train_demo
    own = tmp_path / "data"
    shutil.copytree(data, own)
    train(_settings((model, own), tmp_path / "o", steps=2, checkpoint_every=2))
    code = main(["train", "--model", str(model), "--data", str(own), "--out", str(tmp_path / "o"), "--resume",
                 "latest", "--lora-rank", "8", "--resolution", "32", "--device", "cpu", "--quiet", "--steps", "4"])
    err = capsys.readouterr().err
    assert code == 2 and "lora_rank: 4 -> 8" in err
    shutil.copy(own / "red-square.png", own / "zz-extra.png")  # one more image: the batch order would change
    (own / "zz-extra.txt").write_text("a red square")
    with pytest.raises(RecipeError, match=r"the data folder changed .*8 files then, 9 now.*new: \['zz-extra.png'\]"):
        train(_settings((model, own), tmp_path / "o", steps=4, resume="latest"))


def test_nan_loss_names_step_and_component_then_stops_or_skips(train_demo, tmp_path, capsys):
    # A learning rate so large that the weights after step 1 overflow float32: the loss of step 2 is not finite.
    model, data = train_demo
    args = ["train", "--model", str(model), "--data", str(data), "--resolution", "32", "--device", "cpu", "--quiet",
            "--lora-rank", "4", "--steps", "3", "--learning-rate", "1e30", "--checkpoint-every", "1"]
    assert main([*args, "--out", str(tmp_path / "stop")]) == 1
    err = capsys.readouterr().err
    assert "step 2: the loss is" in err and "not finite" in err and "unet" in err and "--on-nan skip" in err
    assert not (tmp_path / "stop" / "pytorch_lora_weights.safetensors").exists()
    assert (tmp_path / "stop" / "checkpoints" / "step-000001").is_dir()  # the last finite step is kept
    assert main([*args, "--out", str(tmp_path / "skip"), "--on-nan", "skip"]) == 0
    out = capsys.readouterr().out
    assert "step 2: loss not finite" in out and "batch skipped" in out
    rows = [json.loads(line) for line in (tmp_path / "skip" / "train_log.jsonl").read_text().splitlines()]
    assert rows[1]["loss"] is None and rows[0]["loss"] is not None


def test_a_family_without_a_training_recipe_is_refused_before_loading(tmp_path, capsys, monkeypatch):
    import hf_precision.runtime.load as load
    from hf_precision.testing.pipelines import make_dit, save_pipeline

    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("loaded a model"))
    model = save_pipeline(make_dit(), tmp_path / "dit")
    # Every shipped recipe's denoiser has a training row now: name a diffusers model class that has none (aMUSEd's)
    index = json.loads((model / "model_index.json").read_text())
    index["transformer"] = ["diffusers", "UVit2DModel"]
    (model / "model_index.json").write_text(json.dumps(index))
    data = tmp_path / "d"
    data.mkdir()
    from PIL import Image

    Image.new("RGB", (32, 32)).save(data / "a.png")
    (data / "a.txt").write_text("a cat")
    code = main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "o"), "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and "UVit2DModel" in err and "has no denoiser with a training row" in err, err
    assert not (tmp_path / "o").exists()


def test_cache_written_under_the_t4_plan_is_not_read_under_the_a100_plan(tmp_path):
    # kohya-ss/sd-scripts PR #1413: fp16 text-encoder outputs reused in a bf16 run gave NaN. The key holds the plan.
    from hf_precision.apps.train.cache import EncodingCache
    from hf_precision.testing.pipelines import make_sd15
    from hf_precision.training import prepare_training

    prints = {layout: prepare_training(make_sd15(), layout=layout, train={"unet": "lora"}).fingerprint()
              for layout in ("t4", "a100")}
    assert prints["t4"] != prints["a100"]
    EncodingCache(tmp_path, prints["t4"]).put("text", ("a cat",), {"prompt_embeds": torch.ones(1, 2, dtype=torch.float16)})
    assert EncodingCache(tmp_path, prints["t4"]).get("text", ("a cat",)) is not None
    assert EncodingCache(tmp_path, prints["a100"]).get("text", ("a cat",)) is None


def test_fsdp1_and_deepspeed_are_refused_and_fsdp2_shards(monkeypatch, tmp_path):
    import accelerate

    from hf_precision.apps.train import prepare
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.errors import RecipeError

    real = accelerate.Accelerator

    # what `accelerate launch` puts in the environment decides, before an Accelerator exists: on the CPU accelerate's
    # state says MULTI_CPU whatever the config asked for
    class Cpu:
        def __init__(self, **kwargs):
            pass

    monkeypatch.setattr(accelerate, "Accelerator", Cpu)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    for version, shards in (("2", True), ("1", False), ("", False)):  # no FSDP_VERSION: accelerate's default, 1
        monkeypatch.setenv("FSDP_VERSION", version)
        s = TrainSettings(model="m", data="d", out=str(tmp_path))
        if shards:
            prepare._accelerator(tmp_path, "cpu", s)
            assert s.shard
        else:
            with pytest.raises(RecipeError, match=r"FSDP version 1: FSDP1 flattens .*use `hf-precision train --shard` "
                                                  r"under `torchrun --nproc_per_node N` or `accelerate launch` with "
                                                  r"an FSDP2 config"):
                prepare._accelerator(tmp_path, "cpu", s)
    # the real Accelerator under a DeepSpeed or Megatron-LM launch: refused before accelerate acts on the config (it
    # raised "DeepSpeed is not installed" first, which sends the user to install what is then refused)
    monkeypatch.setattr(accelerate, "Accelerator", real)
    monkeypatch.delenv("ACCELERATE_USE_FSDP")
    for env, name in (("ACCELERATE_USE_DEEPSPEED", "DEEPSPEED"), ("ACCELERATE_USE_MEGATRON_LM", "MEGATRON_LM")):
        monkeypatch.setenv(env, "true")
        with pytest.raises(RecipeError, match=f"selects {name}: .*use `hf-precision train --shard`"):
            prepare._accelerator(tmp_path, "cpu", TrainSettings(model="m", data="d", out=str(tmp_path)))
        monkeypatch.delenv(env)


def test_shard_refuses_a_quantized_trained_part_before_loading(train_demo, tmp_path, monkeypatch):
    import hf_precision.runtime.load as load
    from hf_precision.apps.train.loop import train
    from hf_precision.errors import RecipeError

    def never(*args, **kwargs):
        raise AssertionError("the model was loaded")

    monkeypatch.setattr(load, "load_pipeline", never)
    settings = _settings(train_demo, tmp_path / "o", shard=True, overrides=[{"unet": {"storage": "int8"}}])
    with pytest.raises(RecipeError, match=r"shard: unet is stored in int8, which FSDP2 cannot shard .*without sharding"):
        train(settings)
