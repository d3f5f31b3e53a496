"""benchmarks/benchmark.py: a smoke run end to end, and the pure helpers it decides with.

No timing value is asserted (the machine may be busy): the smoke run checks that every section ran and that the
report carries both memory figures, the speed probe and the machine; the unit tests feed the helpers fake timings.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "benchmark.py"
sys.path.insert(0, str(ROOT / "benchmarks"))

from bench import fidelity, memory, progress, report, runtime, speed, trained  # noqa: E402
from launch import subprocess_env  # noqa: E402

SECTIONS = ("load", "runtime", "apply", "weights", "fidelity")


# ------------------------------------------------------------------------------------------ pure helpers


@pytest.mark.parametrize(("seconds", "text"), [(0, "0s"), (59.4, "59s"), (61, "1m01s"), (3599, "59m59s"),
                                               (3661, "1h01m"), (None, "?"), (-1, "?")])
def test_format_duration(seconds, text):
    assert progress.format_duration(seconds) == text


def test_eta_follows_the_measured_steps_of_each_kind():
    now = [0.0]
    p = progress.Progress(clock=lambda: now[0], out=io.StringIO())
    p.plan("load", 2, guess=100.0)
    p.plan("call", 4, guess=1.0)
    assert p.eta() == 2 * 100.0 + 4 * 1.0  # guesses until something is measured
    with p.step("load", "first load"):
        now[0] += 10.0
    assert p.eta() == 1 * 10.0 + 4 * 1.0  # the remaining load at its measured time, the calls still guessed
    with p.step("call", "a call"):
        now[0] += 3.0
    assert p.eta() == 10.0 + 3 * 3.0
    assert (p.done, p.total) == (2, 6)


def test_progress_line_shows_count_elapsed_and_time_left():
    now = [0.0]
    out = io.StringIO()
    p = progress.Progress(clock=lambda: now[0], out=out)
    p.plan("load", 3, guess=20.0)
    with p.step("load", "loading"):
        now[0] += 5.0
    p.say("next")
    assert out.getvalue().splitlines()[-1] == "[  1/3  5s elapsed, ~10s left] next"


def test_unplanned_steps_and_skips_keep_the_count_right():
    p = progress.Progress(clock=lambda: 0.0, out=None)
    with p.step("extra", "not planned"):
        pass
    p.plan("load", 2, 1.0)
    p.skip("load")
    assert (p.done, p.total, p.eta()) == (1, 2, 1.0)


@pytest.mark.parametrize(("dtype_s", "fp32_s", "slow"), [(0.29, 0.01, True), (0.02, 0.01, False),
                                                       (0.008, 0.01, False), (0.01, 0.0, False)])
def test_is_slow_compares_with_float32(dtype_s, fp32_s, slow):
    assert speed.is_slow(dtype_s, fp32_s) is slow


def test_slow_dtype_is_replaced_keeping_the_layout_structure():
    from hf_precision import get_recipe

    t4 = get_recipe("sdxl", device="t4")
    over, note = speed.effective_layout(t4, {"float16": True, "bfloat16": False}, exact=False)
    comps = over["components"]
    assert {n: c["dtype"] for n, c in comps.items()} == {
        p.name: ("bfloat16" if p.compute == "float16" else p.compute) for p in t4.plans}
    assert {n: tuple(c["keep_fp32"]) for n, c in comps.items()} == {p.name: p.keep_fp32 for p in t4.plans}
    assert "slowly" in note and "bfloat16" in note
    # both half dtypes slow: the structure is measured in float32
    over, _ = speed.effective_layout(t4, {"float16": True, "bfloat16": True}, exact=False)
    assert {c["dtype"] for c in over["components"].values()} == {"float32"}


def test_exact_layout_or_fast_dtypes_are_measured_as_asked():
    from hf_precision import get_recipe

    t4 = get_recipe("sdxl", device="t4")
    over, note = speed.effective_layout(t4, {"float16": True, "bfloat16": False}, exact=True)
    assert over is None and "--layout" in note and "slowly" in note
    over, note = speed.effective_layout(t4, {"float16": False, "bfloat16": False}, exact=False)
    assert over is None and "fast" in note


def test_substitute_resolves_for_this_cpu():
    """The overrides the benchmark builds are valid for the device it runs on (here: this CPU)."""
    from hf_precision import RecipeError, get_recipe

    over, _ = speed.effective_layout(get_recipe("sdxl", device="t4"), {"float16": True, "bfloat16": True}, exact=False)
    recipe = get_recipe("sdxl", device="cpu", overrides=over)
    assert recipe["unet"].compute == "float32" and recipe["unet"].keep_fp32 == ("time_embedding", "add_embedding")
    over, _ = speed.effective_layout(get_recipe("sdxl", device="t4"), {"float16": True, "bfloat16": False}, exact=False)
    try:
        assert get_recipe("sdxl", device="cpu", overrides=over)["unet"].compute == "bfloat16"
    except RecipeError as err:  # a CPU whose rules refuse bf16: the benchmark falls back to float32 (said in the note)
        assert "bfloat16" in str(err)


def test_read_status_parses_rss_fields():
    text = "Name:\tpython\nVmRSS:\t  4096 kB\nRssAnon:\t  1024 kB\nRssFile:\t  3072 kB\nThreads:\t4\n"
    assert memory.read_status(text) == {"VmRSS": 4 << 20, "RssAnon": 1 << 20, "RssFile": 3 << 20}


def test_linear_fit_and_loglog_slope():
    fit = runtime.linear_fit([100, 200, 400], [1.0, 2.0, 4.0])
    assert fit["slope"] == pytest.approx(0.01) and fit["loglog"] == pytest.approx(1.0)
    assert runtime.linear_fit([1, 2, 4], [1.0, 4.0, 16.0])["loglog"] == pytest.approx(2.0)
    assert runtime.linear_fit([5], [1.0]) is None


def test_norm_globs_name_exactly_the_norms_of_an_sdxl_unet():
    from hf_precision.testing.pipelines import make_sdxl

    unet = make_sdxl().unet
    over, count = runtime.all_norms_override(unet)
    assert count == len(runtime.norm_modules(unet)) > 0
    assert over["components"]["unet"]["keep_fp32"] == runtime.NORM_GLOBS


def test_compare_gives_psnr_rel_l2_max_abs_and_counts_nonfinite():
    import numpy as np

    ref = np.array([0.5, 1.0, 0.25, 0.0])
    assert fidelity.compare(ref, ref, peak=1.0)["psnr_db"] == float("inf")
    r = fidelity.compare(ref + np.array([0.0, -0.1, 0.0, 0.0]), ref)  # peak defaults to max |ref| = 1
    assert r["psnr_db"] == pytest.approx(10 * np.log10(1 / (0.01 / 4)))
    assert r["rel_l2"] == pytest.approx(0.1 / np.linalg.norm(ref)) and r["max_abs"] == pytest.approx(0.1)
    bad = fidelity.compare(np.array([np.nan, 1.0, 0.25, 0.0]), ref)
    assert bad["nonfinite"] == 1 and bad["max_abs"] == float("inf") and bad["psnr_db"] == -float("inf")


def test_fingerprint_changes_with_any_training_setting():
    base = {"model": {"size": "tiny"}, "steps": 4, "seed": 0}
    assert trained.fingerprint(base) == trained.fingerprint(dict(reversed(base.items())))
    assert len({trained.fingerprint({**base, k: v}) for k, v in (("steps", 5), ("seed", 1), ("model", "mid"))}) == 3


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
    for layout in data["sections"]["runtime"]["layouts"].values():
        assert layout["max_abs_diff_floor"] == 0.0  # the floor computes exactly what the hooks compute
        assert layout["hook_time"]["hook_calls_per_call"] > 0
    islands = data["sections"]["runtime"]["layouts"]["islands"]
    from hf_precision.testing.pipelines import make_sdxl

    # every norm is an island, on every CPU: where the probe made the benchmarked UNet float32, the islands
    # layout still computes in a half dtype (and says so)
    assert islands["islands"] == len(runtime.norm_modules(make_sdxl().unet))
    assert islands["compute"] in ("float16", "bfloat16")
    substituted = data["sections"]["runtime"]["layouts"]["recipe"]["compute"] == "float32"
    assert ("island_note" in data["sections"]["runtime"]) == substituted
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
