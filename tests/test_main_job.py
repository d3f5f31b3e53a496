"""The main job through the CLI, as a user runs it: `hf-precision demo` and `hf-precision generate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

CLI = [sys.executable, "-m", "hf_precision.cli"]
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": ""}


def run(*args, cwd=None):
    return subprocess.run([*CLI, *map(str, args)], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)


def test_demo_writes_an_image_and_a_clip_and_reports(tmp_path):
    from PIL import Image

    result = run("demo", "--out", tmp_path / "out", "--json")
    assert result.returncode == 0, result.stderr[-3000:]
    text = result.stdout
    assert "RANDOM" in text  # says plainly the weights are random
    for section in ("plan: recipe sdxl", "plan: recipe svd", "check StableDiffusionXLPipeline", "max |recipe - fp32|"):
        assert section in text, section
    measured = json.loads(text[text.rindex("\n{") + 1:])
    for kind in ("sdxl", "svd"):
        assert measured[kind]["nonfinite"] == 0 and measured[kind]["check_ok"]
        assert 0 <= measured[kind]["max_abs"] < 0.5
    with Image.open(tmp_path / "out" / "sdxl.png") as image:
        assert image.size == (256, 256)
    with Image.open(tmp_path / "out" / "svd.gif") as clip:
        assert clip.n_frames == 4
    assert not list((tmp_path / "out").glob("*.tmp*"))


def test_demo_runs_another_devices_layout(tmp_path):
    result = run("demo", "--out", tmp_path, "--layout", "t4")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "layout: cuda (Tesla T4, sm 7.5)" in result.stdout
    assert "vae: float32/float32" in result.stdout and "unet: float16/float16" in result.stdout


def test_generate_writes_a_png(saved_pipeline, tmp_path):
    from PIL import Image

    out = tmp_path / "cat.png"
    result = run("generate", saved_pipeline("sdxl"), "--prompt", "a cat", "--out", out, "--steps", "2",
                 "--height", "32", "--width", "32", "--device", "cpu")
    assert result.returncode == 0, result.stderr[-3000:]
    with Image.open(out) as image:
        assert image.size == (32, 32)
    assert "100%" in result.stderr  # the pipeline's progress bar


@pytest.mark.parametrize("args, message", [
    (["/no/such/folder"], "no such folder"),
    (["{sdxl}", "--out", "x.bmp"], "unsupported image type"),
    (["{sdxl}", "--height", "30"], "multiple of 8"),
    (["{svd}"], "not a text-to-image pipeline"),
    (["{sdxl}", "--set", "vae.dtype=half"], "ambiguous"),
])
def test_generate_bad_input(saved_pipeline, tmp_path, args, message):
    args = [a.format(sdxl=saved_pipeline("sdxl"), svd=saved_pipeline("svd")) for a in args]
    if "--out" not in args:
        args += ["--out", str(tmp_path / "img.png")]
    result = run("generate", *args, "--prompt", "x", "--steps", "1", "--device", "cpu", cwd=tmp_path)
    assert result.returncode == 2, result.stdout + result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert not list(tmp_path.glob("*.png")) and not list(tmp_path.glob(".*tmp*"))
