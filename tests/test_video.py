"""scripts/generate_video.py (``hf-precision video``) on the tiny SVD, on CPU: outputs read back, two processes under
``accelerate launch``, and each bad input giving one message, exit code 2 and nothing written."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from launch import ROOT, accelerate_cpu, subprocess_env

SCRIPT = ROOT / "scripts" / "generate_video.py"
SMALL = ["--height", "32", "--width", "48", "--frames", "3", "--steps", "2", "--decode-chunk-size", "2", "--quiet"]


@pytest.fixture(scope="session")
def svd_folder(saved_pipeline) -> Path:
    """The tiny SVD saved once per session (conftest's session cache)."""
    return saved_pipeline("svd")


@pytest.fixture(scope="session")
def images(tmp_path_factory) -> Path:
    """A folder of three small input images."""
    from PIL import Image

    folder = tmp_path_factory.mktemp("images")
    for i, color in enumerate(["red", "green", "blue"]):
        Image.new("RGB", (40 + 8 * i, 40), color).save(folder / f"img{i}.png")
    return folder


def script(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=180,
                          cwd=cwd, env=subprocess_env(), check=False)


def _ffmpeg_missing() -> str | None:
    """Why mp4 cannot be written here (no imageio-ffmpeg, or no ffmpeg binary it can find), or None."""
    try:
        import imageio_ffmpeg

        imageio_ffmpeg.get_ffmpeg_exe()
    except (ImportError, RuntimeError) as e:
        return f"mp4 needs an ffmpeg backend (pip install imageio-ffmpeg): {type(e).__name__}: {e}"
    return None


FFMPEG_MISSING = _ffmpeg_missing()
needs_ffmpeg = pytest.mark.skipif(FFMPEG_MISSING is not None, reason=FFMPEG_MISSING or "")

# What the script's peak-memory line says it measured, per device type it ran on (apps/video/memory.py, run_kind).
MEMORY_WORDING = {"cpu": "peak RSS of the process", "cuda": "torch.cuda.max_memory_allocated on cuda",
                  "xpu": "torch.xpu.max_memory_allocated on xpu", "mps": "torch.mps.driver_allocated_memory"}


def device_it_ran_on(stdout: str) -> str:
    """The device type from the script's ``svd recipe for <device label>: ...`` line."""
    found = re.search(r"^svd recipe for (cpu|cuda|mps|xpu)\b", stdout, re.MULTILINE)
    assert found, stdout
    return found[1]


def read_video(path: Path) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(path, index=None, **({"plugin": "FFMPEG"} if path.suffix == ".mp4" else {}))


def leftovers(folder: Path) -> list[str]:
    """Temporary files or folders of an interrupted write (``.NAME.tmp-*``, ``.NAME.old-*``)."""
    return [p.name for p in folder.rglob("*") if p.name.startswith(".") or ".tmp-" in p.name or ".old-" in p.name]


# --------------------------------------------------------------------------------------------- outputs


@pytest.mark.slow
def test_script_writes_video_with_asked_frames_and_size(svd_folder, images, tmp_path):
    """No --device: the script runs on the best present device (a GPU where there is one) and its memory line names
    what it measured there."""
    _script_writes(svd_folder, images, tmp_path, ".gif")


@needs_ffmpeg
def test_script_writes_an_mp4(svd_folder, images, tmp_path, capsys):
    """The same program in this process (the script's own start-up is the gif test's)."""
    from hf_precision.cli.video import main

    out = tmp_path / "clip.mp4"
    code = main(["--model", str(svd_folder), "--image", str(images / "img0.png"), "--out", str(out), *SMALL,
                 "--fps", "5"])
    captured = capsys.readouterr()
    _wrote(out, tmp_path, code, captured.out, captured.err)


def _script_writes(svd_folder, images, tmp_path, suffix):
    out = tmp_path / f"clip{suffix}"
    proc = script("--model", str(svd_folder), "--image", str(images / "img0.png"), "--out", str(out), *SMALL,
                  "--fps", "5")
    _wrote(out, tmp_path, proc.returncode, proc.stdout, proc.stderr)


def _wrote(out, tmp_path, code, stdout, stderr):
    from hf_precision.recipe.devices import device_profile

    assert code == 0, stderr
    assert "Traceback" not in stderr
    frames = read_video(out)
    assert frames.shape[:3] == (3, 32, 48), frames.shape  # frames, height, width
    assert frames.shape[3] in (3, 4) and frames.dtype == np.uint8
    assert frames.std() > 0  # not a blank video
    ran_on = device_it_ran_on(stdout)
    assert ran_on == device_profile(None).type  # the same choice this process makes
    assert re.search(rf"peak memory [\d.]+ [kMG]?B \({re.escape(MEMORY_WORDING[ran_on])}", stdout), stdout
    assert re.search(r"[\d.]+ s per denoising step", stdout)
    assert oct(out.stat().st_mode & 0o777) != oct(0o600)  # not left with mkstemp's private mode
    assert leftovers(tmp_path) == []


def test_png_frames_in_process_with_model_offload(svd_folder, images, tmp_path, capsys):
    from PIL import Image

    from hf_precision.cli.video import main

    out = tmp_path / "frames"
    rc = main(["--model", str(svd_folder), "--image", str(images / "img1.png"), "--out", str(out), *SMALL,
               "--device", "cpu", "--offload", "model", "--forward-chunking"])
    assert rc == 0, capsys.readouterr().err
    names = sorted(p.name for p in out.iterdir())
    assert names == ["frame_000.png", "frame_001.png", "frame_002.png"]
    assert {Image.open(out / n).size for n in names} == {(48, 32)}
    printed = capsys.readouterr().out
    assert "offload model" in printed
    # The measured phases, in the order the plan predicts them (tests/test_video_families.py checks the plan's).
    assert re.search(r"peak memory per phase: image encoding [\d.]+ [kMG]?B, denoising [\d.]+ [kMG]?B, VAE decode", printed), printed
    assert leftovers(tmp_path) == []


@pytest.mark.probe
def test_noise_in_compute_dtype_and_same_seed_same_video(tiny_pipe, monkeypatch):
    import torch
    from diffusers import StableVideoDiffusionPipeline

    from hf_precision import apply_recipe, get_recipe
    from hf_precision.testing.pipelines import example_image
    from hf_precision.apps.video.spec import spec_of
    from hf_precision.apps.video.run import generate_clip

    pipe = tiny_pipe("svd")
    apply_recipe(pipe, get_recipe("svd", device="cpu", overrides={"unet": {"dtype": "bfloat16"}}), device="cpu")
    spec = spec_of(pipe)  # before the spy below hides __call__'s signature
    seen = []
    original = StableVideoDiffusionPipeline.__call__

    def spy(self, *args, **kwargs):
        seen.append((kwargs["latents"].dtype, kwargs["output_type"]))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(StableVideoDiffusionPipeline, "__call__", spy)
    kwargs = {"height": 32, "width": 32, "frames": 3, "steps": 2, "decode_chunk_size": 2, "seed": 7}
    first = generate_clip(pipe, spec, image=example_image(32), **kwargs)
    second = generate_clip(pipe, spec, image=example_image(32), **kwargs)
    assert seen == [(torch.bfloat16, "latent")] * 2  # noise drawn in the UNet's compute dtype, decoded here
    assert first.frames.dtype == np.float32 and first.frames.shape == (3, 32, 32, 3)
    assert 0.0 <= first.frames.min() and first.frames.max() <= 1.0
    np.testing.assert_array_equal(first.frames, second.frames)
    assert first.seconds_per_step > 0 and first.peak_memory >= first.peak_before_decode > 0


def test_save_video_refuses_odd_mp4_and_keeps_old_file_on_failure(tmp_path, monkeypatch):
    from hf_precision import RecipeError
    from hf_precision.apps.video.io import save_video

    with pytest.raises(RecipeError, match="even width and height"):
        save_video(np.zeros((2, 31, 32, 3), np.float32), tmp_path / "odd.mp4")
    target = tmp_path / "keep.gif"
    target.write_bytes(b"old")

    class Boom(Exception):
        pass

    def broken(*args, **kwargs):
        raise Boom()

    from PIL import Image

    monkeypatch.setattr(Image.Image, "save", broken)
    with pytest.raises(Boom):
        save_video(np.zeros((2, 8, 8, 3), np.float32), target)
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.gif"]


def test_a_prompt_and_an_image_out_checked_alike(tmp_path, images):
    """One --out for one clip is checked by check_out whatever the input: the same words for a prompt and an image."""
    from hf_precision import RecipeError
    from hf_precision.apps.video.io import plan_outputs

    for image, prompts in ((None, ["a cat"]), (str(images / "img0.png"), None)):
        with pytest.raises(RecipeError, match="is an mp4 output but --format is gif; drop --format"):
            plan_outputs(image, str(tmp_path / "cat.mp4"), "gif", prompts=prompts)
def test_cpu_phase_figures_count_quantized_weights_by_what_they_hold():
    """The CPU phase figures add the loaded weight bytes: an int8 component holds its int8 data and per-row scales
    (as plan and module_bytes count it), not its logical float size."""
    import torch
    from types import SimpleNamespace
    from torchao.quantization import Int8WeightOnlyConfig, quantize_

    from hf_precision.apps.video.memory import weight_bytes
    from hf_precision.runtime.quantize import module_bytes

    layer = torch.nn.Sequential(torch.nn.Linear(64, 64))
    quantize_(layer, Int8WeightOnlyConfig())
    pipe = SimpleNamespace(components={"transformer": layer, "scheduler": object()})
    assert weight_bytes(pipe) == module_bytes(layer) < 64 * 64 * 2  # below even a float16 copy of the weight


def test_the_rss_a_phase_starts_from_is_the_current_one_where_proc_has_none(monkeypatch):
    """Without /proc (macOS, Windows) rss() returned the peak RSS, so a CPU phase's figure (peak minus the RSS at its
    start) left out what the phase added above an earlier, higher peak."""
    from hf_precision.apps.video import memory

    monkeypatch.setattr(memory, "proc_bytes", lambda path, key: None)
    block = np.ones(64 * 2**20, dtype=np.uint8)  # touched pages: 64 MiB resident, then given back
    del block
    assert memory.rss() < memory.peak_rss() - 32 * 2**20


def test_the_plan_budget_reads_the_free_ram_where_proc_has_none(monkeypatch):
    """Without /proc/meminfo --plan's default budget came from os.sysconf("SC_AVPHYS_PAGES"), a name macOS does not
    know (ValueError) and Windows has no os.sysconf for."""
    import os

    from hf_precision.apps.video import plan

    sysconf = os.sysconf

    def macos(name):
        if name == "SC_AVPHYS_PAGES":
            raise ValueError("unrecognized configuration name")
        return sysconf(name)

    monkeypatch.setattr(plan, "available_bytes", lambda device: None)
    monkeypatch.setattr(os, "sysconf", macos)
    assert plan.free_memory("cpu") > 0


def test_the_plan_budget_is_the_free_memory_of_the_device_the_clip_runs_on(monkeypatch):
    """Without --device, --plan plans for the best present device (a GPU on a GPU machine), and its default budget
    was the CPU's free RAM: the plan chose settings for the wrong memory."""
    import argparse

    from hf_precision.apps.video import plan
    from hf_precision.cli.video import print_plan
    from hf_precision.recipe import devices

    class OneGPU(devices.SystemProbe):
        def count(self, kind: str) -> int:
            return 1 if kind == "cuda" else 0 if kind in ("mps", "xpu") else super().count(kind)

        def cuda(self, index: int):
            return "NVIDIA A100-SXM4-80GB", (8, 0)

    class Chosen(Exception):
        pass

    def choose(where, spec, *, layout, budget, **sizes):  # the meta build is not what is tested here
        asked.append((layout, budget))
        raise Chosen

    asked = []
    monkeypatch.setattr(plan, "free_memory", lambda device: asked.append(str(device)) or 80 * 2**30)
    monkeypatch.setattr(plan, "choose", choose)
    previous = devices.set_probe(OneGPU())
    try:
        args = argparse.Namespace(layout=None, device=None, max_memory=None, height=480, width=832, frames=81,
                                  decode_chunk_size=None)
        with pytest.raises(Chosen):
            print_plan("unused", None, args)
    finally:
        devices.set_probe(previous)
    assert asked == ["cuda:0", ("cuda:0", 80 * 2**30)], asked


# --------------------------------------------------------------------------------------------- two processes


@pytest.mark.slow
def test_accelerate_two_processes_write_each_output_once(svd_folder, images, tmp_path):
    # The split between processes does not depend on the encoder: without an ffmpeg backend the clips are gifs.
    fmt = "mp4" if FFMPEG_MISSING is None else "gif"
    out = tmp_path / "videos"
    cmd = [*accelerate_cpu(), str(SCRIPT), "--model", str(svd_folder), "--image", str(images), "--out", str(out), "--device", "cpu",
           "--format", fmt, *SMALL]
    env = subprocess_env(cpu_only=True, HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = [f"img{i}.{fmt}" for i in range(3)]
    assert sorted(p.name for p in out.iterdir()) == names
    wrote = re.findall(r"\[process (\d)/2\] wrote (\S+)", proc.stdout)
    assert sorted(Path(w).name for _, w in wrote) == names  # once each
    assert {rank for rank, _ in wrote} == {"0", "1"}  # both processes worked
    assert "done: 3 video(s) from 2 process(es)" in proc.stdout
    for name in names:
        assert read_video(out / name).shape[:3] == (3, 32, 48)
    assert leftovers(tmp_path / "videos") == []


# --------------------------------------------------------------------------------------------- bad input


@pytest.fixture(scope="session")
def bad_inputs(tmp_path_factory, saved_pipeline) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    (folder / "text.png").write_text("this is not a png\n")
    mixed = folder / "mixed"
    mixed.mkdir()
    shutil.copy(folder / "text.png", mixed / "b.png")
    from PIL import Image

    Image.new("RGB", (16, 16)).save(mixed / "a.png")
    return {"text": folder / "text.png", "mixed": mixed, "sdxl": saved_pipeline("sdxl")}


CASES = {
    "missing image": (lambda b, svd: ["--model", str(svd), "--image", str(b["text"].parent / "nope.png")],
                      "nope.png: no such file or folder"),
    "unreadable image": (lambda b, svd: ["--model", str(svd), "--image", str(b["text"])],
                         "cannot read it as an image"),
    "unreadable image in a folder": (lambda b, svd: ["--model", str(svd), "--image", str(b["mixed"])],
                                     "b.png: cannot read it as an image"),
    "non-SVD model folder": (lambda b, svd: ["--model", str(b["sdxl"]), "--image", str(b["mixed"] / "a.png")],
                             "model_index.json names StableDiffusionXLPipeline, which is not a diffusers video pipeline"),
    "height not a multiple of 8": (lambda b, svd: ["--model", str(svd), "--image", str(b["mixed"] / "a.png"),
                                                   "--height", "30"], "--height 30: must be a positive multiple of 8"),
    "zero frames": (lambda b, svd: ["--model", str(svd), "--image", str(b["mixed"] / "a.png"), "--frames", "0"],
                    "--frames 0: must be at least 1"),
}


@pytest.mark.slow
@pytest.mark.parametrize(("case", "out_name"), [(c, o) for c in CASES for o in ("out.mp4", "outdir")
                                                if not (o == "out.mp4" and "folder" in c and "model" not in c)])
def test_bad_input_exit_2_and_nothing_written(case, out_name, bad_inputs, svd_folder, tmp_path, monkeypatch, capsys):
    make_args, message = CASES[case]
    work = tmp_path / "work"
    work.mkdir()
    # in this process, as the script's main (a subprocess each would cost a Python start and imports per case; the
    # script's own start-up is run by test_script_writes_video_with_asked_frames_and_size)
    from hf_precision.cli.video import main

    monkeypatch.chdir(work)
    try:
        code = main([*make_args(bad_inputs, svd_folder), "--out", str(work / out_name)], prog="generate_video.py")
    except SystemExit as exit_:
        code = exit_.code
    _, err = capsys.readouterr()
    assert code == 2, err
    assert "Traceback" not in err
    assert message in err
    assert err.strip().splitlines()[-1].startswith("generate_video.py: error:")
    assert list(work.iterdir()) == []  # no output, no temporary file


@pytest.mark.slow
def test_subcommand_shares_the_options_and_the_errors(tmp_path):
    exe = Path(sys.executable).parent / "hf-precision"
    cli = [str(exe)] if exe.exists() else [sys.executable, "-m", "hf_precision.cli"]
    helped = subprocess.run([*cli, "video", "--help"], capture_output=True, text=True, timeout=60, check=False)
    assert helped.returncode == 0
    for option in ("--decode-chunk-size", "--offload", "--forward-chunking", "--motion-bucket-id", "--demo",
                   "OUT/IMG.mp4"):
        assert option in helped.stdout
    proc = subprocess.run([*cli, "video", "--image", str(tmp_path / "nope.png"), "--out", str(tmp_path / "x.mp4")],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("hf-precision video: error: --image")
    assert list(tmp_path.iterdir()) == []


def test_a_pipeline_without_step_callbacks_runs_and_counts_its_steps(tiny_pipe):
    """HunyuanVideo 1.5's __call__ takes no callback_on_step_end nor guidance_scale (pipeline_hunyuan_video1_5.py:544):
    video passed them and every clip failed with TypeError. Its steps are counted at scheduler.step, which is the
    class's again after; --guidance-scale sets its guider's scale."""
    from hf_precision import apply_recipe, get_recipe
    from hf_precision.apps.video.run import generate_clip
    from hf_precision.apps.video.spec import spec_of

    pipe = tiny_pipe("hunyuan_video15")
    apply_recipe(pipe, get_recipe("hunyuan_video15", device="cpu"), device="cpu")
    clip = generate_clip(pipe, spec_of(pipe), prompt="a cat", height=16, width=16, frames=5, steps=2, seed=0,
                         guidance_scale=3.0)
    assert clip.frames.shape == (5, 16, 16, 3) and np.isfinite(clip.frames).all()
    assert clip.seconds_per_step > 0 and "step" not in vars(pipe.scheduler)
    assert pipe.guider.guidance_scale == 3.0  # its guider's scale: the call takes none


def test_a_pipeline_that_names_its_frame_count_frames_runs_at_the_size_asked(tiny_pipe):
    """Sana-Video's __call__ takes the frame count as `frames` (pipeline_sana_video.py:725): video refused it as no
    video pipeline ('takes no num_frames or video_length'). Its resolution binning raised 'Invalid sample size' for a
    transformer without a bin table and would swap the size for a table's: video asks the size it checked. Its
    check_inputs takes multiples of 32 only, which the recipe's video block says before any load."""
    from hf_precision import apply_recipe, get_recipe
    from hf_precision.apps.video.run import generate_clip
    from hf_precision.apps.video.spec import spec_of

    pipe = tiny_pipe("sana_video")
    apply_recipe(pipe, get_recipe("sana_video", device="cpu"), device="cpu")
    spec = spec_of(pipe)
    assert spec.frames_arg == "frames" and spec.extra["use_resolution_binning"] is False
    assert [p.split(":")[0] for p in spec.check(height=16, width=32, frames=5)] == ["--height 16"]
    clip = generate_clip(pipe, spec, prompt="a cat", height=32, width=32, frames=1, steps=1, seed=0)
    assert clip.frames.shape == (1, 32, 32, 3) and np.isfinite(clip.frames).all()


def test_a_call_that_fixes_its_frame_count_refuses_another_before_loading(tmp_path):
    """ChronoEdit's call makes 5 frames unless enable_temporal_reasoning (diffusers pipeline_chronoedit.py:593), an
    option `video` does not pass: `--frames 9` wrote a 5-frame clip without a word. The recipe's video row says so
    (call_frames), and the spec refuses another count with the fix, from model_index.json and configs alone."""
    from hf_precision.apps.video.spec import video_spec

    idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "ChronoEditTransformer3DModel"],
           "image_encoder": ["transformers", "CLIPVisionModel"]}
    spec = video_spec("ChronoEditPipeline", idx, {"transformer": {"patch_size": [1, 2, 2]}})
    problems = spec.check(height=32, width=32, frames=9)
    assert len(problems) == 1 and "--frames 9" in problems[0] and "use --frames 5" in problems[0], problems
    assert spec.check(height=32, width=32, frames=5) == []
    assert spec.within(height=32, width=32, frames=9)[2] == 5
    wan = video_spec("WanImageToVideoPipeline", {**idx, "transformer": ["diffusers", "WanTransformer3DModel"]},
                     {"transformer": {"patch_size": [1, 2, 2]}})
    assert wan.check(height=32, width=32, frames=9) == []  # a count the call keeps is no problem


def test_frames_past_the_diffusion_forcing_window_are_refused_before_loading():
    """SkyReels-V2's diffusion-forcing calls make at most base_num_frames (97) frames unless given overlap_history
    (pipeline_skyreels_v2_diffusion_forcing.py:344-348), which no command passes: `video --frames 101` loaded the
    model and failed in diffusers with a ValueError naming an option the program does not have. The recipe's class
    entry (call_max_frames) refuses it from the configs alone, and the sweep's size stays inside; the T2V class,
    whose call has no window, is not bounded."""
    from hf_precision.apps.video.spec import video_spec

    idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "SkyReelsV2Transformer3DModel"],
           "text_encoder": ["transformers", "UMT5EncoderModel"]}
    configs = {"transformer": {"patch_size": [1, 2, 2], "rope_max_seq_len": 1024}}
    for cls in ("SkyReelsV2DiffusionForcingPipeline", "SkyReelsV2DiffusionForcingImageToVideoPipeline"):
        spec = video_spec(cls, idx, configs)
        problems = spec.check(height=32, width=32, frames=101)
        assert len(problems) == 1 and problems[0].startswith("--frames 101: ") and "use --frames 97" in problems[0]
        assert spec.check(height=32, width=32, frames=97) == []
        assert spec.within(height=32, width=32, frames=121)[2] == 97
    assert video_spec("SkyReelsV2Pipeline", idx, configs).check(height=32, width=32, frames=101) == []


def _kandinsky5_configs(folder: Path, pipeline: str) -> Path:
    """A Kandinsky 5 video folder of configs alone (no weights: what `video` reads before loading)."""
    import json

    index = {"_class_name": pipeline, "_diffusers_version": "0.42.1",
             "transformer": ["diffusers", "Kandinsky5Transformer3DModel"],
             "vae": ["diffusers", "AutoencoderKLHunyuanVideo"],
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "Qwen2_5_VLForConditionalGeneration"],
             "text_encoder_2": ["transformers", "CLIPTextModel"]}
    configs = {"transformer": {"_class_name": "Kandinsky5Transformer3DModel", "patch_size": [1, 2, 2],
                               "visual_cond": pipeline.endswith("I2VPipeline")},
               "vae": {"_class_name": "AutoencoderKLHunyuanVideo", "temporal_compression_ratio": 4,
                       "spatial_compression_ratio": 8}}
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps(index))
    for name, config in configs.items():
        (folder / name).mkdir()
        (folder / name / "config.json").write_text(json.dumps(config))
    return folder


def test_a_frame_count_the_i2v_call_makes_nan_of_is_refused_before_loading(tmp_path, images, capsys):
    """Kandinsky 5 I2V's call renormalises its first 4 latent frames by the std of an empty slice for 2 to 4 latent
    frames (diffusers 0.42.1 pipeline_kandinsky_i2v.py:433-452): `video --frames 9` ran the whole clip and blamed
    an fp16 overflow for the NaN frames. Its recipe's `classes:` entry refuses those counts for the I2V class alone,
    in `video` before any weight is read (this folder has none), in the sweep's size and check's default call."""
    from hf_precision.apps.video.spec import model_spec
    from hf_precision.cli.video import main
    from hf_precision.diagnose.call import _frames

    folder = _kandinsky5_configs(tmp_path / "i2v", "Kandinsky5I2VPipeline")
    code = main(["--model", str(folder), "--prompt", "a cat", "--image", str(images / "img0.png"), "--height", "32",
                 "--width", "32", "--frames", "9", "--out", str(tmp_path / "out")], prog="hf-precision video")
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and not (tmp_path / "out").exists(), err
    assert "--frames 9: 3 latent frames, a count Kandinsky5I2VPipeline's call cannot make" in err, err
    assert "use --frames 17" in err and "normalize_first_frame" in err, err
    _, spec = model_spec(str(folder))
    assert spec.check(height=32, width=32, frames=17) == [] and spec.within(height=32, width=32, frames=9)[2] == 17
    assert spec.check(height=32, width=32, frames=1)  # 1 latent frame: the call fails on a tuple (:437-438, :1020)
    _, t2v = model_spec(str(_kandinsky5_configs(tmp_path / "t2v", "Kandinsky5T2VPipeline")))
    assert t2v.check(height=32, width=32, frames=9) == []  # the T2V call has no such step
    pipe = lambda cls: type(cls, (), {"vae_scale_factor_temporal": 4})()  # noqa: E731
    assert (_frames(pipe("Kandinsky5I2VPipeline"), {}), _frames(pipe("Kandinsky5T2VPipeline"), {})) == (17, 5)


def test_a_pipeline_that_fails_without_a_negative_prompt_gets_the_recipes(tiny_pipe):
    """EasyAnimate's call iterates a None negative prompt under guidance (pipeline_easyanimate.py:347-362): video,
    check and calibrate, which pass none unless asked, failed with TypeError. Its recipe's video block gives '', which
    each command's call passes when none is given."""
    from hf_precision.apps.video.spec import spec_of
    from hf_precision.diagnose.calibration.method import _call_kwargs
    from hf_precision.diagnose.call import default_call

    pipe = tiny_pipe("easyanimate")
    with pytest.raises(TypeError, match="not iterable"):  # plain diffusers, no negative prompt
        pipe(prompt="a cat", height=16, width=16, num_frames=1, num_inference_steps=1, output_type="np")
    assert spec_of(pipe).row.negative_prompt == ""  # video's, when --negative-prompt is not given
    assert _call_kwargs(pipe, None, None, None, 1, (16, 16), 1, None)["negative_prompt"] == ""  # calibrate's
    frames = default_call(pipe)(pipe).frames  # check's
    assert np.isfinite(np.asarray(frames)).all()
