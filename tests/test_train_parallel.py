"""`accelerate launch --num_processes 2 scripts/train.py` on CPU (gloo): both processes train on their share of
each batch, and only the main process writes (one LoRA, one log line per step, one training.json)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from launch import ROOT, accelerate_cpu, subprocess_env


@pytest.mark.slow
def test_two_processes_split_the_data_and_write_once(tmp_path):
    from hf_precision.apps.train.demo import make_demo

    model, data = make_demo(tmp_path / "demo")
    out = tmp_path / "lora"
    cmd = [*accelerate_cpu(), str(ROOT / "scripts" / "train.py"),
           "--model", str(model), "--data", str(data), "--out", str(out), "--device", "cpu", "--steps", "3",
           "--lora-rank", "4", "--resolution", "32", "--checkpoint-every", "2", "--quiet",
           "--validation-prompt", "a red square", "--validation-inference-steps", "2"]
    env = subprocess_env(cpu_only=True, HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert sorted(re.findall(r"\[process (\d)/2\] takes 1 of each global batch of 2", proc.stdout)) == ["0", "1"]
    assert proc.stdout.count("wrote ") == 1  # the report line: main process only
    rows = [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000002", "step-000003"]
    assert sorted(p.name for p in (out / "validation").iterdir()) == ["step-000000.png", "step-000003.png"]
    assert (out / "pytorch_lora_weights.safetensors").is_file() and (out / "training.json").is_file()
    assert not [p for p in out.rglob("*") if ".tmp-" in p.name or p.name.startswith(".save-")]


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_exits_130(tmp_path):
    import signal
    import time

    from hf_precision.apps.train.demo import make_demo

    model, data = make_demo(tmp_path / "demo")
    out = tmp_path / "lora"
    env = subprocess_env(OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(ROOT / "scripts" / "train.py"), "--model", str(model), "--data", str(data), "--out",
           str(out), "--device", "cpu", "--steps", "100000", "--lora-rank", "4", "--resolution", "32",
           "--checkpoint-every", "100000", "--quiet"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    log = out / "train_log.jsonl"
    while proc.poll() is None and not (log.exists() and log.read_text().count("\n") >= 2):
        time.sleep(0.2)  # waits for an event (two steps logged), bounds nothing
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr[-2000:]
    assert "interrupted at step" in stderr and "--resume latest" in stderr
    steps = [json.loads(line)["step"] for line in log.read_text().splitlines()]
    assert [p.name for p in (out / "checkpoints").iterdir()] == [f"step-{steps[-1]:06d}"]
    assert not (out / "pytorch_lora_weights.safetensors").exists()
