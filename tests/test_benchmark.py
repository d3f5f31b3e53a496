"""benchmarks/benchmark.py run as a user runs it: a smoke run end to end.

No timing value is asserted (the machine may be busy): the smoke run checks that every section ran and that the
report carries both memory figures, the speed probe and the machine. The helpers the benchmark decides with are
checked by their own doctests (benchmarks/bench/, collected by pytest like hf_precision's).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "benchmark.py"

from launch import subprocess_env

SECTIONS = ("load", "runtime", "apply", "weights", "fidelity")


# ------------------------------------------------------------------------------------------ smoke run


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    env = subprocess_env()
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--size", "tiny", "--out", str(out)],
                          capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (out / "stdout.txt").write_text(proc.stdout)
    return out


@pytest.mark.slow
def test_smoke_run_has_every_section_without_errors(quick_run):
    data = json.loads((quick_run / "benchmark.json").read_text())
    for name in SECTIONS:
        assert "error" not in data["sections"][name], (name, data["sections"][name].get("traceback"))
    load = data["sections"]["load"]
    for loader in ("plain", "recipe"):  # both memory figures, for both loaders
        assert load[loader]["rss_over_weights"]["median"] > 0
        assert load[loader]["anon_over_weights"]["median"] is not None
    assert set(load["stages"]) >= {"resolve", "apply"} and load["stages"]["apply"]["median"] > 0
    # the apply slopes are judged against the spread of the repeated calls too (medians alone swung from -0.2 to 2.4
    # between two runs of the same code on a busy machine, a FAIL from noise)
    for key in ("judged_first", "judged_reapply"):
        judged = data["sections"]["apply"][key]
        assert judged["slope"] is not None and judged["noise"] is not None and "why" in judged, judged
    for layout in data["sections"]["runtime"]["layouts"].values():
        assert layout["max_abs_diff_floor"] == 0.0  # the floor computes exactly what the hooks compute
        assert layout["hook_time"]["hook_calls_per_call"] > 0
    islands = data["sections"]["runtime"]["layouts"]["islands"]
    import torch
    from diffusers import UNet2DConditionModel

    # every norm is an island, on every CPU: where the probe made the benchmarked UNet float32, the islands
    # layout still computes in a half dtype (and says so). The norms are counted on the saved UNet's config, built
    # on the meta device (building the whole pipeline again took 45 s of this test on a busy machine).
    with torch.device("meta"):
        unet = UNet2DConditionModel.from_config(UNet2DConditionModel.load_config(quick_run / "cache" / "sdxl-tiny" / "unet"))
    norms = [m for m in unet.modules() if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm))]
    assert islands["islands"] == len(norms)
    assert islands["compute"] in ("float16", "bfloat16")
    substituted = data["sections"]["runtime"]["layouts"]["recipe"]["compute"] == "float32"
    assert ("island_note" in data["sections"]["runtime"]) == substituted
    # the island scaling runs on the islands layout, where island hooks run (on an fp32 UNet they would be none),
    # at more than one island count, each subset a stride of the norms; every paired figure carries its noise
    scaling = data["sections"]["runtime"]["scaling"]
    assert len(scaling["rows"]) >= 2 and all(r["island_s"] > 0 for r in scaling["rows"]), scaling["rows"]
    assert scaling["rows"][-1]["islands"] == islands["islands"] and scaling["judged"]["slope"] is not None
    for layout in data["sections"]["runtime"]["layouts"].values():
        assert {"pass", "why"} <= set(layout["judged"]) and layout["hook_time"]["per_call"]["n"] == layout["overhead"]["n"]
    assert data["probe"]["ratio"].keys() == {"float16", "bfloat16"}
    assert data["config"]["command"].startswith("python benchmarks/benchmark.py")


@pytest.mark.slow
def test_smoke_run_reports_progress_and_the_slow_dtype_decision(quick_run):
    stdout = (quick_run / "stdout.txt").read_text()
    data = json.loads((quick_run / "benchmark.json").read_text())
    assert "left]" in stdout and "probe:" in stdout
    slow = [d for d, s in data["probe"]["slow"].items() if s]
    t4_dtypes = {"float16"}  # the default layout (t4) computes in fp16
    if t4_dtypes & set(slow):
        assert "slowly" in data["config"]["note"] and data["config"]["overrides"]
    else:
        assert not data["config"]["overrides"]
    md = (quick_run / "benchmark.md").read_text()
    for heading in ("## Targets", "## 1. Load", "## 2. Runtime", "## 3. Apply", "## 4. Weight bytes", "## 5. Fidelity"):
        assert heading in md
    assert "Peak RSS" in md and "Peak anonymous memory" in md and "- CPU:" in md and "Speed probe" in md


@pytest.mark.slow
def test_smoke_run_fidelity_is_on_the_shipped_trained_model_beside_random_weights(quick_run):
    from hf_precision.apps.shapes_model import FOLDER, fingerprint

    fid = json.loads((quick_run / "benchmark.json").read_text())["sections"]["fidelity"]
    info = fid["trained"]
    assert info["fingerprint"] == fingerprint() and Path(info["folder"]) == FOLDER  # the demo's model, not trained here
    assert not (quick_run / "trained").exists()
    assert set(fid["models"]) == {"trained", "random weights"}
    for model in fid["models"].values():
        assert not model["errors"]
        for name in ("recipe", "naive"):
            for kind, calls in (("image", fid["seeds"]), ("denoiser", fid["seeds"] * fid["steps"])):
                assert model[name][kind]["rel_l2"]["n"] == calls  # every image and every captured denoiser call
                assert model[name][kind]["rel_l2"]["median"] >= 0 and model[name][kind]["nonfinite"] == 0
    trained = fid["models"]["trained"]  # its VAE overflows float16 as the SDXL VAE does: a float16 decode is inf/NaN
    assert trained["decoder_peak"] > 65504
    assert fid["naive_dtype"] == "float16" and trained["vae_half"]["image"]["nonfinite"] > 0  # the default t4 layout
    assert fid["judged"]["n"] == fid["seeds"] == 1 and fid["pass"] is None  # one seed: no noise, no verdict
    md = (quick_run / "benchmark.md").read_text()
    assert "`hf-precision train --method full`" in md and "| random weights | naive |" in md
    assert "recipe ≤ naive + noise" in md and "VAE decode in float16" in md
