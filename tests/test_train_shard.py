"""Sharded training (FSDP2) under the recipe, in two CPU processes over gloo (torchrun): the layer
(prepare_training(..., shard=True)) and the program (`hf-precision train --shard`)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from launch import ROOT, free_port, subprocess_env


def torchrun(processes: int = 2) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(processes), "--master_port",
            str(free_port())]


# fp16 compute (T4 layout): a half batch accumulates its fp16 sums in another order than the whole batch
LOSS_RTOL = 2e-3


@pytest.mark.slow
def test_layer_shards_under_the_recipe(tmp_path):
    out = tmp_path / "result"
    env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1")
    proc = subprocess.run([*torchrun(), str(ROOT / "tests" / "shard_worker.py"), str(out)], capture_output=True,
                          text=True, timeout=400, env=env, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in (0, 1)]
    for case in ("sd15-lora", "sdxl-full"):
        got, ref = ranks[0][case]["losses"], ranks[0][case]["reference"]
        assert got == ranks[1][case]["losses"]
        assert all(abs(g - r) <= LOSS_RTOL * abs(r) for g, r in zip(got, ref)), (case, got, ref)
        for r in ranks:  # each rank holds half of what is sharded (the UNet's parameters)
            assert r[case]["whole"] > 0 and abs(r[case]["local"] / r[case]["whole"] - 0.5) < 0.02, r[case]
            assert r[case]["skipped"] == 0
    # SDXL's fp32 islands are units of their own, fp32 shards under an fp32 policy, in a full fine-tune of fp16 compute
    assert ranks[0]["sdxl-full"]["islands"] == {i: ["policy torch.float32", "torch.float32"]
                                               for i in ("time_embedding", "add_embedding")}
    assert "unet.time_embedding: shard unit computes in float16" in ranks[0]["check"]
    # an inf in rank 1's gradient shard only: both ranks skip the step and halve the scale
    for r in ranks:
        assert r["skip"] == {"stepped": False, "unchanged": True, "scale": [65536.0, 32768.0]}
