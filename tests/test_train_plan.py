"""`hf-precision train --plan`: the training step's predicted memory (meta device, no weights) against a measured
CPU step, and the choice it makes for a budget."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from launch import subprocess_env

# One training step in a fresh process: RSS above the state after a warm-up step (AdamW moments exist by then), so
# what is measured is the step's activations and gradients. glibc returns freed buffers at once with this threshold
# (mallopt(3)), so the RSS high-water mark follows the live tensors; clear_refs 5 resets it (proc(5)).
MEASURE = r"""
import json, sys, torch
import hf_precision as hp
from hf_precision.runtime.memory import proc_bytes
from hf_precision.training import prepare_training
torch.set_num_threads(1)
folder, batch, side = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
pipe = hp.load_pipeline(folder, "cpu", layout="cpu-avx2")
tp = prepare_training(pipe, device="cpu", layout="cpu-avx2", train={"unet": "lora"}, rank=4)
opt = torch.optim.AdamW(tp.parameters(), lr=1e-4)
g = torch.Generator().manual_seed(0)
data = {"latents": torch.randn(batch, 4, side, side, generator=g), **tp.encode_prompt(["a cat"] * batch)}
def step():
    loss = tp.loss(data)
    tp.backward(loss)
    tp.step(opt)
step()
opt.zero_grad(set_to_none=True)
base = proc_bytes("/proc/self/status", "VmRSS")
open("/proc/self/clear_refs", "w").write("5")
step()
print(json.dumps({"measured": proc_bytes("/proc/self/status", "VmHWM") - base}))
"""


@pytest.fixture(scope="module")
def mid_sd15(tmp_path_factory) -> Path:
    from hf_precision.testing.pipelines import make_sd15, save_pipeline

    pipe = make_sd15(size={"unet": {"block_out_channels": [32, 64], "layers_per_block": 1, "norm_num_groups": 8}})
    return save_pipeline(pipe, tmp_path_factory.mktemp("sd15-mid"))


@pytest.mark.heavy
@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc to reset the RSS peak")
def test_predicted_training_step_matches_measured_cpu_step(mid_sd15):
    from hf_precision.apps.train.plan import Options, predict_training

    batch, resolution = 2, 128  # latents 64x64 (VAE factor 2): tens of MiB of activations
    pred = predict_training(str(mid_sd15), "cpu-avx2", rank=4, resolution=resolution,
                            options=Options(batch, False, True))
    predicted = pred.activations + pred.grads
    env = subprocess_env(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(mid_sd15), str(batch), str(resolution // 2)],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    measured = json.loads(proc.stdout.strip().splitlines()[-1])["measured"]
    assert measured > 8 * 2**20, measured  # a phase large enough for RSS to resolve
    print(f"predicted {predicted / 2**20:.1f} MiB, measured {measured / 2**20:.1f} MiB")
    assert abs(predicted - measured) <= 0.15 * measured, (predicted, measured)


def test_plan_chooses_checkpointing_or_smaller_batches_for_a_small_budget(mid_sd15, capsys):
    from hf_precision.apps.train.plan import Options, choose, predict_training
    from hf_precision.cli import main
    from training_checks import assert_plan_output_agrees

    kwargs = dict(method="lora", rank=4, resolution=128, frames=0)
    full = predict_training(str(mid_sd15), "t4", options=Options(4, False, False), **kwargs)
    cached = predict_training(str(mid_sd15), "t4", options=Options(4, False, True), **kwargs)
    ckpt = predict_training(str(mid_sd15), "t4", options=Options(4, True, True), **kwargs)
    assert full.phases["train step"] > cached.phases["train step"]  # the encoders left the device
    assert ckpt.activations < cached.activations  # gradient checkpointing saves less for backward
    budget = (ckpt.peak + cached.peak) // 2
    chosen, tried = choose(str(mid_sd15), "t4", budget, batch_size=4, gradient_checkpointing=False, cached=True,
                           **kwargs)
    assert chosen.options == Options(4, True, True) and chosen.peak <= budget
    assert all(t.peak > budget for t in tried[:-1])
    assert main(["train", "--plan", "--model", str(mid_sd15), "--device", "t4", "--resolution", "128",
                 "--batch-size", "4", "--lora-rank", "4", "--max-memory", f"{budget / 2**20:.3f}MiB"]) == 0
    out = capsys.readouterr().out
    assert "chosen: --gradient-checkpointing" in out and "tried batch size 4, gradient checkpointing off" in out
    assert_plan_output_agrees(out)



def test_the_plan_of_an_edit_model_counts_its_reference_tokens(saved_pipeline, monkeypatch):
    """Flux Kontext trains on (reference, target) pairs: the reference's tokens join the denoiser's sequence, so a
    step holds more activations than a text-to-image step of the same size; the plan counted the latter."""
    import dataclasses

    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.training import denoiser_rows

    folder = str(saved_pipeline("flux_kontext"))
    kwargs = dict(rank=2, resolution=64, options=Options(1, False, True))
    edit = predict_training(folder, "t4", **kwargs)
    real_row = denoiser_rows.row_of
    monkeypatch.setattr(denoiser_rows, "row_of", lambda *a: dataclasses.replace(real_row(*a), reference=False))
    plain = predict_training(folder, "t4", **kwargs)
    assert edit.activations > plain.activations


def test_the_plan_of_an_inpainting_flux_feeds_its_latents_and_conditions_as_the_step_does(saved_pipeline, tiny_pipe):
    """Flux Fill's transformer takes 48 packed channels (16 latents + 16 masked-image latents + 16 mask) and predicts
    16: the plan's batch had in_channels / 4 = 12 latent channels, so its target was 48 wide against a 16-wide
    prediction and --plan crashed with a traceback; the training step itself feeds the VAE's 4 and adds the rest."""
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.training import example_batch

    folder = str(saved_pipeline("flux_fill"))
    transformer = tiny_pipe("flux_fill").transformer
    assert example_batch(transformer, side=4)["latents"].shape[1] == transformer.config.out_channels // 4
    pred = predict_training(folder, "t4", rank=2, resolution=32, options=Options(1, False, True))
    assert pred.activations > 0


def test_a_denoiser_that_reads_its_own_values_is_refused_by_the_plan_in_one_line(saved_pipeline):
    """HiDream's transformer routes tokens among its experts and unpatchifies by sizes it reads with .item(): on the
    meta device nothing has a value, so --plan says it cannot count the step, naming the class, not a traceback."""
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.errors import RecipeError

    with pytest.raises(RecipeError, match=r"^--plan: HiDreamImageTransformer2DModel reads values of its own tensors"):
        predict_training(str(saved_pipeline("hidream")), "t4", rank=2, resolution=32, options=Options(1, False, True))


@pytest.mark.parametrize("raised, refused", [
    (NotImplementedError("Cannot copy out of meta tensor; no data!"), True),  # .tolist() on meta
    (RuntimeError("Expected all tensors to be on the same device, but found meta and cpu"), False),
])
def test_only_a_value_read_on_meta_is_refused_as_one_and_other_meta_errors_show(saved_pipeline, monkeypatch, raised,
                                                                                 refused):
    """A device mix-up mentions "meta" too: it is a defect of the plan to show, not a model to refuse in one line."""
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.errors import RecipeError
    from hf_precision.memory import train_step

    def fails(*args, **kwargs):
        raise raised

    monkeypatch.setattr(train_step, "step_activations", fails)
    with pytest.raises(RecipeError if refused else type(raised)) as info:
        predict_training(str(saved_pipeline("sd15")), "t4", rank=2, resolution=32, options=Options(1, False, True))
    assert ("reads values of its own tensors" in str(info.value)) == refused
