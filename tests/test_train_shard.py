"""Sharded training (FSDP2) under the recipe, in two CPU processes over gloo (torchrun): the layer
(prepare_training(..., shard=True)) and the program (`hf-precision train --shard`)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from launch import ROOT, free_port, subprocess_env


def torchrun(processes: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
            str(free_port())]


# the cases of tests/shard_worker.py (SD 1.5, SDXL, Flux, Wan), with the pixel frames of their batches' 2 latent
# frames (Wan: 4 frames per latent frame after the first)
CASES = {"sd15-lora": 0, "sdxl-full": 0, "flux-lora": 0, "wan-full": 5}
# fp16 compute (T4 layout): a half batch accumulates its fp16 sums in another order than the whole batch
LOSS_RTOL = 2e-3


def test_frozen_components_sharded_or_replicated_as_the_plan_decides(saved_pipeline, capsys):
    import torch

    from hf_precision.apps.train.shard_plan import training_model
    from hf_precision.cli import main
    from hf_precision.memory.peaks import meta_module
    from hf_precision.testing import make_pipeline
    from hf_precision.training.shard import frozen_choice

    # Flux's real T5-XXL on the meta device, over 8 ranks: its 1/8, its embedding and two of its 24 blocks gathered
    # hold less than the whole, so it is sharded in its storage dtype (bf16)
    m = training_model("flux", "a100")
    t5 = meta_module(m.index, m.configs, "text_encoder_2", torch.bfloat16)
    choice = frozen_choice("text_encoder_2", t5, 8)
    assert choice.sharded and choice.share + choice.running < choice.whole, choice
    assert choice.whole == sum(p.numel() * 2 for p in t5.parameters()) and choice.held == choice.share
    assert "sharded in its storage dtype" in str(choice)
    # cached outputs (it leaves the device after the cache pass) or one process: replicated, saying why
    assert "outputs are cached" in str(frozen_choice("text_encoder_2", t5, 8, cached=True))
    assert not frozen_choice("text_encoder_2", t5, 1).sharded
    # two blocks: gathered whole while it runs, they hold as much as all of it, so replicated
    clip = make_pipeline("sdxl").text_encoder
    tiny = frozen_choice("text_encoder", clip, 2)
    assert not tiny.sharded and tiny.held == tiny.whole and "not less than" in tiny.why
    # the per-rank plan prints each frozen component's choice; the sharded ones count their share only at rest
    assert main(["train", "--plan", "--processes", "2", "--shard", "--model", str(saved_pipeline("sd15")),
                 "--device", "t4", "--resolution", "32", "--lora-rank", "4", "--no-cache"]) == 0
    out = capsys.readouterr().out
    assert "    text_encoder: replicated (" in out and "    vae: sharded in its storage dtype (" in out, out


@pytest.mark.slow
def test_layer_shards_under_the_recipe(tmp_path, train_demo, capsys):
    out = tmp_path / "result"
    env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf_home"))
    model, data = train_demo
    proc = subprocess.run([*torchrun(), str(ROOT / "tests" / "shard_worker.py"), str(out), "--program", str(model),
                           str(data), str(tmp_path / "program")], capture_output=True, text=True, timeout=400, env=env,
                          cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    _program_matches_one_process(proc.stdout, tmp_path, model, data, capsys)
    # no warning of FSDP2's reaches the user: Flux's single blocks and Wan's transformer return views, which FSDP2
    # warned of at every step (training/shard.py hands it tensors of their own)
    fsdp = [line for line in proc.stderr.splitlines() if "FSDP" in line or "torch/distributed" in line]
    assert not fsdp, fsdp[:4]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in (0, 1)]
    for case in CASES:
        got, ref = ranks[0][case]["losses"], ranks[0][case]["reference"]
        assert got == ranks[1][case]["losses"] and len(got) >= 2
        assert all(abs(g - r) <= LOSS_RTOL * abs(r) for g, r in zip(got, ref)), (case, got, ref)
        for r in ranks:  # each rank holds half of what is sharded (the denoiser's parameters)
            assert r[case]["whole"] > 0 and abs(r[case]["local"] / r[case]["whole"] - 0.5) < 0.02, r[case]
            assert r[case]["skipped"] == 0
    # the fp32 islands of SDXL and Wan are units of their own, fp32 shards under an fp32 policy, in full fine-tunes of
    # fp16 compute (Wan's RoPE island holds no parameters: nothing to shard); Flux's recipe has none
    fp32 = ["policy torch.float32", "torch.float32"]
    assert ranks[0]["sdxl-full"]["islands"] == {i: fp32 for i in ("time_embedding", "add_embedding")}
    assert ranks[0]["wan-full"]["islands"] == {"condition_embedder.time_embedder": fp32}
    assert ranks[0]["flux-lora"]["islands"] == {}
    assert "unet.time_embedding: shard unit computes in float16" in ranks[0]["check"]
    # the per-rank plan of the same configs predicts what each rank holds (weights, masters, gradients, AdamW state)
    from hf_precision.apps.train.plan import Options
    from hf_precision.apps.train.shard_plan import predict_rank
    from hf_precision.testing import make_pipeline
    from hf_precision.testing.pipelines import save_pipeline

    for case, frames in CASES.items():
        name, method = case.split("-")
        pipe = make_pipeline(name)
        folder = save_pipeline(pipe, tmp_path / name)
        factor = getattr(pipe, "vae_scale_factor", None) or pipe.vae_scale_factor_spatial
        pred = predict_rank(str(folder), "t4", processes=2, shard=True, method=method, rank=4, resolution=8 * factor,
                            frames=frames, options=Options(2, False, False))  # the worker's 8x8 latents, 2 per rank
        for r in ranks:
            held = sum(v for k, v in r[case]["held"].items() if k != "peak")
            assert abs(pred.at_rest - held) <= 0.1 * held, (case, pred.at_rest, r[case]["held"])
            # the layer shards or replicates each frozen component as the plan decides (the tiny VAEs of SD 1.5,
            # SDXL and Flux are sharded: two of their blocks hold less than all of them)
            assert r[case]["frozen"] == {c.component: c.sharded for c in pred.frozen}, (case, r[case]["frozen"])
            # the train step's peak of tensors on this rank (measured: what it holds before the step, and the most
            # the step's ops and FSDP2's gathers allocate on top) against the plan's: at rest + gathered units +
            # activations of its 2 samples at the same latent size and text tokens
            step = pred.at_rest + pred.gathered + pred.base.activations
            assert abs(step - r[case]["held"]["peak"]) <= 0.1 * r[case]["held"]["peak"], (case, step, r[case]["held"])
    assert ranks[0]["sd15-lora"]["frozen"] == {"text_encoder": False, "vae": True}
    # an inf in rank 1's gradient shard only: both ranks skip the step and halve the scale
    for r in ranks:
        assert r["skip"] == {"stepped": False, "unchanged": True, "scale": [65536.0, 32768.0]}


def _program_matches_one_process(stdout, tmp_path, model, data, capsys):
    """The worker's `hf-precision train --shard --no-cache` (tests/shard_worker.py, program): each frozen component
    sharded or replicated as the per-rank plan says, and the losses of one process taking the whole global batch."""
    from hf_precision.cli import main

    assert main(["train", "--plan", "--processes", "2", "--shard", "--model", str(model), "--device", "t4",
                 "--resolution", "32", "--lora-rank", "4", "--no-cache"]) == 0
    plan = dict(re.findall(r"^    (\w+): (sharded|replicated)\b", capsys.readouterr().out, re.M))
    assert plan == {"text_encoder": "replicated", "vae": "sharded"}, plan  # the tiny VAE: the sharded kind is tested
    held = re.findall(r"^\[process (\d)/2\] holds (.*)$", stdout, re.M)
    assert sorted(r for r, _ in held) == ["0", "1"], stdout
    for _, line in held:
        sharded = dict(re.findall(r"frozen (\w+) ([\d,]+) of [\d,]+ bytes", line))
        replicated = re.findall(r"(\w+) replicated", line)
        assert {**{c: "sharded" for c in sharded}, **{c: "replicated" for c in replicated}} == plan, line
    totals = re.findall(r"frozen vae ([\d,]+) of ([\d,]+) bytes", stdout)
    assert sum(int(a.replace(",", "")) for a, _ in totals) == int(totals[0][1].replace(",", ""))  # two halves
    # one process of --batch-size 2 draws the noise and VAE samples the 2 processes of 1 each take their share of
    assert main(["train", "--model", str(model), "--data", str(data), "--out", str(tmp_path / "one"), "--device", "cpu",
                 "--layout", "t4", "--resolution", "32", "--steps", "3", "--lora-rank", "4", "--quiet", "--no-cache",
                 "--batch-size", "2"]) == 0
    got, ref = ([json.loads(line)["loss"] for line in (tmp_path / name / "train_log.jsonl").read_text().splitlines()]
                for name in ("program", "one"))
    assert len(got) == len(ref) == 3 and all(abs(g - r) <= LOSS_RTOL * abs(r) for g, r in zip(got, ref)), (got, ref)


def _train(tmp_path, out, *extra, processes=2):
    launcher = torchrun(processes) if processes > 1 else [sys.executable]
    cmd = [*launcher, "-m", "hf_precision.cli", "train", "--model", str(tmp_path / "tiny-sdxl"), "--data",
           str(tmp_path / "shapes"), "--out", str(out), "--device", "cpu", "--layout", "t4", "--resolution", "32",
           "--quiet", *extra]
    env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf_home"))
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout, [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def _cut(run, copy, step):
    """A copy of a finished run as a run killed right after its checkpoint of ``step`` would have left it."""
    import shutil

    shutil.copytree(run, copy)
    for entry in copy.iterdir():
        if entry.name not in ("checkpoints", "cache", "train_log.jsonl"):
            shutil.rmtree(entry) if entry.is_dir() else entry.unlink()
    for ck in (copy / "checkpoints").iterdir():
        if int(ck.name.split("-")[1]) > step:
            shutil.rmtree(ck)
    lines = (copy / "train_log.jsonl").read_text().splitlines()[:step]
    (copy / "train_log.jsonl").write_text("".join(line + "\n" for line in lines))


@pytest.mark.slow
@pytest.mark.heavy
def test_sharded_program_on_tiny_sdxl_t4(tmp_path):
    import torch
    from diffusers import StableDiffusionXLPipeline, UNet2DConditionModel

    from hf_precision.apps.train.demo import make_demo
    from hf_precision.testing.pipelines import make_sdxl, save_pipeline

    make_demo(tmp_path)
    save_pipeline(make_sdxl(), tmp_path / "tiny-sdxl")
    # LoRA: each rank holds half of the sharded UNet; the output loads with load_lora_weights
    stdout, lora_log = _train(tmp_path, tmp_path / "lora", "--steps", "4", "--checkpoint-every", "2", "--lora-rank",
                              "4", "--shard")
    held = re.findall(r"\[process (\d)/2\] holds unet ([\d,]+) of ([\d,]+) bytes", stdout)
    assert sorted(r for r, _, _ in held) == ["0", "1"]
    for _, local, whole in held:
        assert abs(int(local.replace(",", "")) / int(whole.replace(",", "")) - 0.5) < 0.02
    pipe = StableDiffusionXLPipeline.from_pretrained(tmp_path / "tiny-sdxl")
    pipe.load_lora_weights(tmp_path / "lora")
    assert any("lora_A" in n for n, _ in pipe.unet.named_parameters())
    # killed after the step-2 checkpoint: the resumed sharded run gives the same losses
    _cut(tmp_path / "lora", tmp_path / "lora-cut", 2)
    _, resumed = _train(tmp_path, tmp_path / "lora-cut", "--steps", "4", "--checkpoint-every", "2", "--lora-rank", "4",
                        "--shard", "--resume", "latest")
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]
    for a, b in zip(resumed, lora_log):
        assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]), (resumed, lora_log)
    # full fine-tune: fp32 islands stay fp32 shards; the UNet is written as a diffusers folder
    stdout, _ = _train(tmp_path, tmp_path / "full", "--method", "full", "--steps", "2", "--checkpoint-every", "1",
                       "--shard")
    assert stdout.count("island shards: unet.time_embedding float32, unet.add_embedding float32") == 2
    unet = UNet2DConditionModel.from_pretrained(tmp_path / "full" / "unet")
    assert {p.dtype for p in unet.parameters()} == {torch.float32}
    assert not torch.equal(unet.conv_in.weight, pipe.unet.conv_in.weight)  # it trained
    # the 2-process checkpoint resumes in one process (no launcher, no sharding)
    _cut(tmp_path / "full", tmp_path / "full-one", 1)
    _, one = _train(tmp_path, tmp_path / "full-one", "--method", "full", "--steps", "2", "--checkpoint-every", "1",
                    "--resume", "latest", processes=1)
    assert [r["step"] for r in one] == [1, 2] and all(r["loss"] == r["loss"] for r in one)
    assert (tmp_path / "full-one" / "unet" / "diffusion_pytorch_model.safetensors").is_file()



def _descendants(pid: int) -> list[int]:
    """Every process started under ``pid``: torchrun starts each rank in a session of its own, so a signal to
    torchrun's process group reaches torchrun alone."""
    from pathlib import Path

    found, todo = [], [pid]
    while todo:
        parent = todo.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            found += children
            todo += children
    return found


def _killed(tmp_path, out, args, how):
    """Start a sharded 2-process run of ``args`` and stop it once its step-2 checkpoint exists: ``kill`` SIGKILLs
    torchrun and every rank (no handler runs, a save in flight stays half written), ``ctrl-c`` sends SIGINT to
    torchrun as a terminal's Ctrl-C does (torchrun forwards it to the ranks). Returns the run's exit status."""
    import os
    import signal
    import time

    cmd = [*torchrun(), "-m", "hf_precision.cli", "train", "--model", str(tmp_path / "tiny-sdxl"), "--data",
           str(tmp_path / "shapes"), "--out", str(out), "--device", "cpu", "--layout", "t4", "--resolution", "32",
           "--quiet", *args]
    env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1", HF_HOME=str(tmp_path / "hf_home"))
    proc = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    first, deadline = out / "checkpoints" / "step-000002", time.monotonic() + 600
    while not first.is_dir() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    if not first.is_dir():
        proc.kill()
    assert first.is_dir(), f"no step-2 checkpoint in 600 s (the run's status: {proc.poll()})"
    assert proc.poll() is None, f"the run ended ({proc.returncode}) before it could be stopped after step 2"
    if how == "kill":
        ranks = _descendants(proc.pid)
        for pid in [proc.pid, *ranks]:
            os.kill(pid, signal.SIGKILL)
        for pid in ranks:  # the ranks are torchrun's children: gone once /proc no longer lists them
            while os.path.exists(f"/proc/{pid}") and "zombie" not in open(f"/proc/{pid}/status").read():
                time.sleep(0.01)
    else:
        os.kill(proc.pid, signal.SIGINT)
    return proc.wait(timeout=120)


@pytest.mark.slow
@pytest.mark.heavy
def test_sharded_run_killed_or_interrupted_resumes_the_same_curve(tmp_path):
    from hf_precision.apps.train.checkpoint import Checkpoints
    from hf_precision.apps.train.demo import make_demo
    from hf_precision.testing.pipelines import make_sdxl, save_pipeline

    make_demo(tmp_path)
    save_pipeline(make_sdxl(), tmp_path / "tiny-sdxl")
    args = ["--steps", "10", "--checkpoint-every", "2", "--lora-rank", "4", "--shard"]
    _, whole = _train(tmp_path, tmp_path / "whole", *args)
    for how in ("kill", "ctrl-c"):
        out = tmp_path / how
        status = _killed(tmp_path, out, args, how)
        assert status != 0 and not (out / "pytorch_lora_weights.safetensors").exists(), (how, status)
        done = Checkpoints(out).all()
        assert done and all(int(p.name.split("-")[1]) < 10 for p in done), (how, done)
        if how == "ctrl-c":  # the ranks finish the step they are in and checkpoint it together
            logged = (out / "train_log.jsonl").read_text().splitlines()
            assert int(done[-1].name.split("-")[1]) == len(logged), (done, logged)
        _, resumed = _train(tmp_path, out, *args, "--resume", "latest")
        assert [r["step"] for r in resumed] == list(range(1, 11)), (how, resumed)
        for a, b in zip(resumed, whole):
            assert abs(a["loss"] - b["loss"]) <= 1e-6 * abs(b["loss"]), (how, resumed, whole)
        assert (out / "pytorch_lora_weights.safetensors").is_file()
        assert not list((out / "checkpoints").glob(".step-*")), "a killed save's temporary folder was not cleared"


def test_per_rank_plan_splits_uneven_rows_as_fsdp2_chunks(tiny_pipe):
    """The plan's share of each rank (rank_share) against FSDP2's own chunking (``_chunk_with_empty``, what
    fully_shard calls), without launching: rows that do not divide give the last ranks less, or nothing."""
    from torch.distributed.fsdp._fully_shard._fsdp_common import _chunk_with_empty

    from hf_precision.training.shard import rank_share

    params = [p.detach() for p in tiny_pipe("sd15").unet.parameters()]
    assert any(p.shape[0] % 3 for p in params)  # 32-channel convs, 4-channel conv_out: uneven over 3
    for world in (2, 3, 8):
        fsdp = [sum(_chunk_with_empty(p, world, 0)[r].numel() * p.element_size() for p in params) for r in range(world)]
        assert [rank_share(params, world, rank=r) for r in range(world)] == fsdp, world
        assert rank_share(params, world) == max(fsdp)  # the plan's per-rank figure: rank 0, the largest share
        assert sum(fsdp) == sum(p.numel() * p.element_size() for p in params)


@pytest.mark.slow
@pytest.mark.heavy
def test_three_processes_shard_unevenly_and_resume_at_another_world_size(tmp_path):
    from hf_precision.apps.train.demo import make_demo
    from hf_precision.testing.pipelines import make_sdxl, save_pipeline

    out = tmp_path / "result"
    env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1")
    proc = subprocess.run([*torchrun(3), str(ROOT / "tests" / "shard_worker.py"), str(out), "sd15-lora,sdxl-full"],
                          capture_output=True, text=True, timeout=900, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in (0, 1, 2)]
    for case in ("sd15-lora", "sdxl-full"):  # a global batch of 6, 2 per rank, against one process
        got, ref = ranks[0][case]["losses"], ranks[0][case]["reference"]
        assert got == ranks[1][case]["losses"] == ranks[2][case]["losses"]
        assert all(abs(g - r) <= LOSS_RTOL * abs(r) for g, r in zip(got, ref)), (case, got, ref)
        whole = ranks[0][case]["whole"]
        assert sum(r[case]["local"] for r in ranks) == whole
        for r in ranks:
            # FSDP2 splits as the plan's rank_share says (torch.chunk of each parameter's rows); about 1/3 within 0.1
            # of the whole: the tiny UNets' parameters have 4 to 64 rows, and a 4-row one splits 2, 2, 0 (real models'
            # thousands of rows split within a row of 1/3)
            assert r[case]["local"] == r[case]["expected"], (case, r[case])
            assert abs(r[case]["local"] / whole - 1 / 3) <= 0.1, (case, r[case])
        assert len({r[case]["local"] for r in ranks}) > 1  # uneven indeed
    # the program: a 3-process checkpoint resumes at 2 processes (sharded) and in one process
    make_demo(tmp_path)
    save_pipeline(make_sdxl(), tmp_path / "tiny-sdxl")
    args = ["--method", "full", "--steps", "2", "--checkpoint-every", "1"]
    _, three = _train(tmp_path, tmp_path / "three", *args, "--shard", processes=3)
    for processes, extra in ((2, ["--shard"]), (1, [])):
        copy = tmp_path / f"at-{processes}"
        _cut(tmp_path / "three", copy, 1)
        _, log = _train(tmp_path, copy, *args, *extra, "--resume", "latest", processes=processes)
        assert [r["step"] for r in log] == [1, 2] and log[0] == three[0], (processes, log, three)
        assert log[1]["loss"] == log[1]["loss"]  # step 2 trained (finite) on the re-sliced shards
        assert (copy / "unet" / "diffusion_pytorch_model.safetensors").is_file()


@pytest.mark.slow
@pytest.mark.heavy
def test_bench_fsdp_bytes_are_the_docs():
    """docs/train-program.md's benchmark table: the bytes each setup's rank 0 holds and their ratios are what
    `benchmarks/bench_fsdp.py` measures now (one paired round: the bytes held after a step do not depend on the
    rounds or the machine's load; the step times do, and are not checked)."""
    docs = (ROOT / "docs" / "train-program.md").read_text(encoding="utf-8")
    cmd = re.search(r"`python (benchmarks/bench_fsdp\.py --size tiny[^`]*)` on this machine", docs).group(1).split()
    cmd[cmd.index("--rounds") + 1], cmd[cmd.index("--warmup") + 1] = "1", "0"
    proc = subprocess.run([sys.executable, *cmd], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=subprocess_env(cpu_only=True, OMP_NUM_THREADS="1"), check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    measured = dict(re.findall(r"^  (\w+) +step .* holds +([\d.]+) MiB", proc.stdout, re.M))
    table = dict(re.findall(r"^\| (data parallel|`--shard`|hand-written)[^|]*\| [\d.]+ ms \| ([\d.]+) MiB \|$", docs,
                            re.M))
    assert {"data parallel": measured["ddp"], "`--shard`": measured["shard"], "hand-written": measured["hand"]} == table
    ratios = re.findall(r"bytes held ([\d.]+)", proc.stdout)
    assert re.findall(r"bytes ([\d.]+)[;.]", docs[docs.index("Paired ratios: shard"):])[:2] == ratios, proc.stdout


def test_per_rank_ladder_counts_each_one_process_step_once(saved_pipeline, monkeypatch):
    """Data parallel and sharded at the same options share one one-process step (the meta forward + backward of the
    whole denoiser, ~10 s for Flux): `train --plan --processes N --max-memory` asks both, and ran it twice. (Other
    options are other steps: test_plan_chooses_checkpointing_or_smaller_batches_for_a_small_budget.)"""
    from hf_precision.apps.train.plan import Options
    from hf_precision.apps.train.shard_plan import predict_rank, training_model
    from hf_precision.memory import train_step

    steps = []
    real = train_step.step_activations
    monkeypatch.setattr(train_step, "step_activations", lambda *a, **k: steps.append(a[3]) or real(*a, **k))
    folder = str(saved_pipeline("sd15"))
    m = training_model(folder, "t4")
    kwargs = dict(processes=2, rank=2, resolution=32, _cached_model=m)
    ddp = predict_rank(folder, "t4", shard=False, options=Options(1, False, True), **kwargs)
    fsdp = predict_rank(folder, "t4", shard=True, options=Options(1, False, True), **kwargs)
    assert steps == [False] and fsdp.base is ddp.base
