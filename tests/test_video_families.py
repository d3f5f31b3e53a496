"""The video script on every video family (Wan, LTX-Video, CogVideoX, HunyuanVideo; T2V and I2V), tiny random
weights on CPU: the pipeline class from the folder, the mode from the arguments, frame/size rules checked before
loading, batch safety (exists -> error, --skip-existing, a failed clip does not end the batch), offload keeping the
recipe's dtypes, and the memory plan."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from video_tiny import BUILDERS

# The smallest call each tiny family runs: (height, width, frames) that satisfy its own rules.
SIZES = {"wan": (16, 16, 5), "ltx": (32, 32, 9), "ltx_i2v": (32, 32, 9), "cogvideox": (16, 16, 9),
         "cogvideox_i2v": (32, 32, 9), "hunyuan": (16, 16, 5)}
I2V = {"ltx_i2v", "cogvideox_i2v"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every tiny family saved once for this module."""
    from hf_precision.testing.pipelines import save_pipeline

    cache: dict[str, Path] = {}

    def get(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = save_pipeline(BUILDERS[kind](), tmp_path_factory.mktemp(kind))
        return cache[kind]

    return get


@pytest.fixture(scope="module")
def image(tmp_path_factory) -> Path:
    from hf_precision.testing.pipelines import example_image

    path = tmp_path_factory.mktemp("img") / "in.png"
    example_image(32).save(path)
    return path


def _args(kind: str, folder: Path, out: Path, image: Path, *extra: str) -> list[str]:
    h, w, f = SIZES[kind]
    inputs = ["--image", str(image), "--prompt", "slow pan"] if kind in I2V else ["--prompt", "a cat"]
    return ["--model", str(folder), *inputs, "--out", str(out), "--height", str(h), "--width", str(w),
            "--frames", str(f), "--steps", "2", "--device", "cpu", "--quiet", *extra]


def _gif_frames(path: Path) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(path, index=None)


# --------------------------------------------------------------------------------------------- every family


@pytest.mark.parametrize("kind,layout,expect", [
    ("wan", "t4", "float16"), ("ltx", "t4", "float16"), ("cogvideox", "t4", "float16"),
    ("hunyuan", "t4", "float16"), ("ltx_i2v", "a100", "bfloat16"), ("cogvideox_i2v", "cpu", None),
    ("wan", "a100", "bfloat16"),
])
def test_family_end_to_end_under_layout(kind, layout, expect, folders, image, tmp_path, capsys):
    """The class comes from model_index.json, the mode from the arguments; the layout's dtypes are used and the
    clip is finite and written atomically."""
    from hf_precision.cli.video import main
    from hf_precision.recipe.devices import device_caps, device_profile

    out = tmp_path / "clip.gif"
    rc = main(_args(kind, folders(kind), out, image, "--layout", layout))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    h, w, f = SIZES[kind]
    frames = _gif_frames(out)
    assert frames.shape[:3] == (f, h, w)
    recipe_line = next(line for line in captured.out.splitlines() if " recipe for " in line)
    if expect is None:  # the CPU's own rule: what this CPU computes fast (derived here, not hard-coded)
        expect = "bfloat16" if "bfloat16" in device_caps(device_profile("cpu")).auto[:1] else "float32"
    assert f"transformer {expect}" in recipe_line, recipe_line
    assert re.search(r"denoising [\d.]+ MiB", captured.out) and re.search(r"VAE decode [\d.]+ MiB", captured.out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.gif"]  # no temporary file left


# --------------------------------------------------------------------------------------------- checked up front


@pytest.mark.parametrize("extra,message", [
    (["--frames", "6"], "frames must be 4*k+1; e.g. --frames 5 or 9"),
    (["--height", "24"], "needs a positive multiple of 16"),
    (["--image", "IMAGE"], "is text-to-video: it takes no --image"),
])
def test_bad_arguments_one_message_before_loading(extra, message, folders, image, tmp_path, capsys, monkeypatch):
    from hf_precision.apps import video
    from hf_precision.cli.video import main

    monkeypatch.setattr(video, "load_video_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    extra = [str(image) if e == "IMAGE" else e for e in extra]
    assert main(_args("wan", folders("wan"), tmp_path / "x.gif", image) + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_existing_output_refused_then_skipped_or_overwritten(folders, image, tmp_path, capsys, monkeypatch):
    from hf_precision.cli import video as cli
    from hf_precision.cli.video import main

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\n\n# a comment\na dog\n")
    out = tmp_path / "clips"
    out.mkdir()
    (out / "000-a-cat.gif").write_bytes(b"old")
    base = _args("wan", folders("wan"), out, image)
    base[base.index("--prompt"):base.index("--prompt") + 2] = ["--prompts", str(prompts)]
    base[base.index("--out") + 1:base.index("--out") + 2] = [str(out), "--format", "gif"]
    loads = []
    real = cli.load_video_pipeline
    monkeypatch.setattr(cli, "load_video_pipeline", lambda *a, **k: loads.append(1) or real(*a, **k))
    assert main(base) == 2
    assert "1 output(s) exist already" in capsys.readouterr().err and loads == []  # refused before loading
    assert (out / "000-a-cat.gif").read_bytes() == b"old"
    assert main([*base, "--skip-existing"]) == 0
    assert (out / "000-a-cat.gif").read_bytes() == b"old"  # kept
    assert _gif_frames(out / "001-a-dog.gif").shape[0] == 5  # made
    assert main([*base, "--overwrite"]) == 0
    assert _gif_frames(out / "000-a-cat.gif").shape[0] == 5  # replaced


def test_failed_clip_reported_and_batch_goes_on(folders, image, tmp_path, capsys, monkeypatch):
    from hf_precision.apps import video_run
    from hf_precision.cli.video import main

    real = video_run.generate_clip

    def flaky(pipe, spec, *, prompt=None, **kw):
        if prompt == "bad":
            raise RuntimeError("out of memory (simulated)")
        return real(pipe, spec, prompt=prompt, **kw)

    monkeypatch.setattr(video_run, "generate_clip", flaky)
    prompts = tmp_path / "p.txt"
    prompts.write_text("first\nbad\nlast\n")
    args = _args("wan", folders("wan"), tmp_path / "out", image)
    args[args.index("--prompt"):args.index("--prompt") + 2] = ["--prompts", str(prompts)]
    assert main([*args, "--format", "gif"]) == 1
    captured = capsys.readouterr()
    assert "failed: " in captured.out and "out of memory (simulated)" in captured.out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000-first.gif", "002-last.gif"]


# --------------------------------------------------------------------------------------------- offload


@pytest.mark.parametrize("offload", ["model", "group"])
def test_offload_keeps_recipe_dtypes_and_agrees(offload, folders):
    """diffusers' offload hooks move weights as they are: the T4 layout's fp16 weights and fp32 modules stay, and
    the clip matches the one without offload."""
    import torch

    from hf_precision.apps.video import MemorySettings, load_video_pipeline, model_spec
    from hf_precision.apps.video_run import generate_clip

    folder = str(folders("wan"))
    _, spec = model_spec(folder)
    clips, dtypes = [], []
    for settings in (MemorySettings(), MemorySettings(offload=offload)):
        pipe = load_video_pipeline(folder, "cpu", settings=settings, layout="t4")
        dtypes.append({n: p.dtype for n, p in pipe.transformer.named_parameters()})
        clips.append(generate_clip(pipe, spec, prompt="a cat", height=16, width=16, frames=5, steps=2).frames)
    assert dtypes[0] == dtypes[1] and torch.float16 in set(dtypes[0].values())
    assert np.isfinite(clips[1]).all()
    np.testing.assert_allclose(clips[0], clips[1], atol=1e-3)
