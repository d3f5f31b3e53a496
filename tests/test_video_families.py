"""The video script on every video family (Wan, LTX-Video, CogVideoX, HunyuanVideo; T2V and I2V), tiny random
weights on CPU: the pipeline class from the folder, the mode from the arguments, frame/size rules checked before
loading, batch safety (exists -> error, --skip-existing, a failed clip does not end the batch), offload keeping the
recipe's dtypes, and the memory plan."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from hf_precision.recipe.catalog import list_recipes, pipeline_spec
from hf_precision.testing import PIPELINES, make_pipeline
from hf_precision.testing.calibration import plant_fp16_overflow
from hf_precision.units import parse_size

# The tiny family, and (height, width, frames) that satisfy its own rules (frames t*k+1, size multiples).
SIZES = {"wan": (16, 16, 5), "ltx": (32, 32, 9), "ltx_i2v": (32, 32, 9), "cogvideox": (16, 16, 9),
         "cogvideox_i2v": (16, 16, 9), "hunyuan_video": (16, 16, 5), "wan_i2v": (16, 16, 5),
         "mochi": (16, 16, 7), "allegro": (32, 32, 9), "latte": (16, 16, 2)}
# LattePipeline takes no max_sequence_length and counts frames as video_length (its transformer's config fixes it).
NO_SEQUENCE_LENGTH = {"latte"}
I2V = {"ltx_i2v", "cogvideox_i2v", "wan_i2v"}


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Every tiny family saved once for this module (``overflow=True``: with the fp16 overflow planted)."""
    from hf_precision.testing.pipelines import save_pipeline

    cache: dict[tuple[str, bool], Path] = {}

    def get(kind: str, overflow: bool = False) -> Path:
        if (kind, overflow) not in cache:
            pipe = make_pipeline(kind)
            if overflow:
                plant_fp16_overflow(pipe, kind)
            cache[kind, overflow] = save_pipeline(pipe, tmp_path_factory.mktemp(kind))
        return cache[kind, overflow]

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
            "--frames", str(f), "--steps", "2", "--device", "cpu",
            *([] if kind in NO_SEQUENCE_LENGTH else ["--max-sequence-length", "16"]), "--quiet", *extra]


def _gif_frames(path: Path) -> np.ndarray:
    import imageio.v3 as iio

    return iio.imread(path, index=None)


# --------------------------------------------------------------------------------------------- every family


@pytest.mark.parametrize("kind,layout", [
    ("wan", "t4"), ("ltx", "t4"), ("cogvideox", "t4"), ("hunyuan_video", "t4"), ("ltx_i2v", "a100"),
    ("cogvideox_i2v", "cpu"), ("hunyuan_video", "cpu"),
    # Mochi, Allegro (a VAE that only decodes tiled: the program turns tiling on) and Latte (video_length)
    ("mochi", "t4"), ("allegro", "t4"), ("latte", "a100"),
])
def test_family_end_to_end_under_layout(kind, layout, folders, image, tmp_path, capsys):
    """The class comes from model_index.json, the mode from the arguments; the layout's dtypes are used and the
    clip is finite and written atomically."""
    from hf_precision import plan
    from hf_precision.cli.video import main

    out = tmp_path / "clip.gif"
    rc = main(_args(kind, folders(kind), out, image, "--layout", layout))
    captured = capsys.readouterr()
    assert rc == 0, captured.err
    h, w, f = SIZES[kind]
    assert re.search(rf"wrote .*clip\.gif \({f} frames, {w}x{h}, gif\)", captured.out), captured.out
    frames = _gif_frames(out)  # GIF merges identical frames (Allegro's tiny tiled decode): count from the line above
    assert frames.shape[1:3] == (h, w) and 1 <= frames.shape[0] <= f
    recipe_line = next(line for line in captured.out.splitlines() if " recipe for " in line)
    expect = plan(str(folders(kind)), device=layout)  # what the family's recipe says for this layout
    for name in ("transformer", "vae"):
        assert f"{name} {expect[name].compute}" in recipe_line, recipe_line
    assert not recipe_line.startswith("composed:"), recipe_line  # the family's named recipe, not a composed one
    assert re.search(r"denoising [\d.]+ [kMG]?B", captured.out)
    if kind != "allegro":  # Allegro's tiled decode calls no decoder forward that a phase hook sees
        assert re.search(r"VAE decode [\d.]+ [kMG]?B", captured.out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["clip.gif"]  # no temporary file left


def test_a_frame_count_the_pipeline_overrides_is_said(folders, image, tmp_path, capsys):
    """HunyuanVideo FramePack makes whole sections of its latent window whatever --frames asks
    (pipeline_hunyuan_video_framepack.py: num_latent_sections): the run says so, as generate does for a size."""
    from hf_precision.cli.video import main

    rc = main(["--model", str(folders("hunyuan_video_framepack")), "--image", str(image), "--prompt", "slow pan",
               "--out", str(tmp_path / "clip.gif"), "--height", "32", "--width", "32", "--frames", "5", "--steps", "1",
               "--device", "cpu", "--max-sequence-length", "16", "--quiet"])
    out = capsys.readouterr().out
    assert rc == 0
    made = re.search(r"wrote .*clip\.gif \((\d+) frames", out)
    assert made and int(made[1]) != 5, out
    assert f"note: HunyuanVideoFramepackPipeline made {made[1]} frames, not the asked 5" in out, out


# --------------------------------------------------------------------------------------------- checked up front


@pytest.mark.parametrize("extra,message", [
    (["--frames", "6"], "frames must be 4*k+1; e.g. --frames 5 or 9"),
    (["--height", "24"], "needs a positive multiple of 16"),
    (["--image", "IMAGE"], "is text-to-video: it takes no --image"),
])
def test_bad_arguments_one_message_before_loading(extra, message, folders, image, tmp_path, capsys, monkeypatch):
    from hf_precision.apps.video import run
    from hf_precision.cli.video import main

    monkeypatch.setattr(run, "load_video_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    extra = [str(image) if e == "IMAGE" else e for e in extra]
    assert main(_args("wan", folders("wan"), tmp_path / "x.gif", image) + extra) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []


def test_existing_output_refused_then_skipped_or_overwritten(folders, image, tmp_path, capsys, monkeypatch):
    from hf_precision.apps.video import run as cli
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
    from hf_precision.apps.video import run as video_run
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
    # the cause is on stderr beside the count, in our words, and stdout has no failure line
    assert "001-bad.gif (bad) failed: RuntimeError: out of memory (simulated)" in captured.err
    assert "1 clip(s) failed" in captured.err and "simulated" not in captured.out
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000-first.gif", "002-last.gif"]


def test_ctrl_c_keeps_finished_outputs_and_leaves_no_partial_file(folders, image, tmp_path, capsys, monkeypatch):
    from PIL import Image

    from hf_precision.cli.video import main

    real = Image.Image.save
    calls = []

    def interrupted(self, fp, *a, **k):  # Ctrl-C while the second clip's GIF is being written
        calls.append(fp)
        if len(calls) == 2:
            Path(fp).write_bytes(b"GIF89a half")
            raise KeyboardInterrupt
        return real(self, fp, *a, **k)

    monkeypatch.setattr(Image.Image, "save", interrupted)
    prompts = tmp_path / "p.txt"
    prompts.write_text("one\ntwo\nthree\n")
    args = _args("wan", folders("wan"), tmp_path / "out", image)
    args[args.index("--prompt"):args.index("--prompt") + 2] = ["--prompts", str(prompts)]
    assert main([*args, "--format", "gif"]) == 130
    assert "interrupted" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["000-one.gif"]  # no half file, no temp file


# --------------------------------------------------------------------------------------------- offload


@pytest.mark.parametrize("offload", ["model", "group"])
def test_offload_keeps_recipe_dtypes_and_agrees(offload, folders):
    """diffusers' offload hooks move weights as they are: the T4 layout's fp16 weights and fp32 modules stay, and
    the clip matches the one without offload."""
    import torch

    from hf_precision.apps.video import MemorySettings, generate_clip, load_video_pipeline, model_spec

    folder = str(folders("wan"))
    _, spec = model_spec(folder)
    spec = dataclasses.replace(spec, extra={"max_sequence_length": 16})
    clips, dtypes = [], []
    for settings in (MemorySettings(), MemorySettings(offload=offload)):
        pipe = load_video_pipeline(folder, "cpu", settings=settings, layout="t4")
        dtypes.append({n: p.dtype for n, p in pipe.transformer.named_parameters()})
        clips.append(generate_clip(pipe, spec, prompt="a cat", height=16, width=16, frames=5, steps=2).frames)
    assert dtypes[0] == dtypes[1] and torch.float16 in set(dtypes[0].values())
    assert np.isfinite(clips[1]).all()
    np.testing.assert_allclose(clips[0], clips[1], atol=1e-3)


# --------------------------------------------------------------------------------------------- fp16 that holds


@pytest.mark.parametrize("kind", ["wan", "ltx", "cogvideox", "hunyuan_video"])
def test_planted_fp16_overflow_naive_nan_recipe_finite(kind, folders, tmp_path, capsys):
    """The time-embedding MLP overflows fp16 as in the real models: plain diffusers in fp16 gives inf/NaN frames;
    the script under the T4 layout (the transformer in fp16, that MLP kept fp32 by the recipe) writes finite frames."""
    import torch
    from diffusers import DiffusionPipeline

    from hf_precision.cli.video import main

    folder = folders(kind, overflow=True)
    # Naive: every weight cast to fp16 with .to() (from_pretrained(torch_dtype=fp16) would keep diffusers'
    # _keep_in_fp32_modules, e.g. Wan's time_embedder, in fp32 already).
    naive = DiffusionPipeline.from_pretrained(str(folder)).to(torch.float16)
    h, w, f = SIZES[kind]
    kwargs = PIPELINES[kind].call_kwargs(height=h, width=w, num_frames=f)
    with np.errstate(invalid="ignore"):
        frames = naive(**kwargs, generator=torch.Generator().manual_seed(0)).frames
    assert not np.isfinite(np.asarray(frames, dtype=np.float32)).all()
    out = tmp_path / "ok.gif"
    assert main(_args(kind, folder, out, tmp_path, "--layout", "t4")) == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    assert "half" not in captured.err
    recipe_line = next(line for line in captured.out.splitlines() if " recipe for " in line)
    assert "transformer float16" in recipe_line, recipe_line  # fp16 itself, not an fp32 fallback
    assert _gif_frames(out).shape[0] == f


# --------------------------------------------------------------------------------------------- two processes


@pytest.mark.heavy
@pytest.mark.slow
def test_accelerate_two_processes_split_a_prompt_file(folders, tmp_path):
    """`accelerate launch --num_processes 2` over gloo on CPU: each prompt's video is written once, by one process."""
    import subprocess

    from launch import ROOT, accelerate_cpu, subprocess_env

    prompts = tmp_path / "prompts.txt"
    prompts.write_text("a cat\na dog\na fox\n")
    out = tmp_path / "videos"
    args = _args("wan", folders("wan"), out, tmp_path)
    args[args.index("--prompt"):args.index("--prompt") + 2] = ["--prompts", str(prompts)]
    cmd = [*accelerate_cpu(), str(ROOT / "scripts" / "generate_video.py"),
           *args, "--format", "gif", "--layout", "t4"]
    env = subprocess_env(cpu_only=True, HF_HOME=str(tmp_path / "hf_home"), OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    names = ["000-a-cat.gif", "001-a-dog.gif", "002-a-fox.gif"]
    assert sorted(p.name for p in out.iterdir()) == names
    wrote = re.findall(r"\[process (\d)/2\] wrote (\S+)", proc.stdout)
    assert sorted(Path(w).name for _, w in wrote) == names  # each once
    assert {rank for rank, _ in wrote} == {"0", "1"}
    assert all(_gif_frames(out / n).shape[0] == 5 for n in names)


# --------------------------------------------------------------------------------------------- the memory plan

WAN_1_3B = Path(__file__).parent / "fixtures" / "wan2.1-t2v-1.3b-configs"


def test_plan_of_real_wan_configs_chooses_for_8gb_and_24gb(capsys):
    """Wan 2.1 1.3B's real configs, no weights, for a T4: the choice is the first candidate (fastest first) whose
    predicted peak fits, and 8 GB (less than the weights) needs offload while 24 GB does not need as much."""
    from hf_precision.apps.video import choose, model_spec
    from hf_precision.cli.video import main

    where, spec = model_spec(str(WAN_1_3B), configs_only=True)
    kwargs = {"layout": "t4", "height": 256, "width": 256, "frames": 9}
    choices = {gb: choose(where, spec, budget=gb * 10**9, **kwargs) for gb in (8, 24)}
    for gb, c in choices.items():
        assert c.fits and c.prediction.peak <= gb * 10**9
        assert all(t.peak > gb * 10**9 for t in c.tried[:-1]) and c.tried[-1] is c.prediction
        assert set(c.prediction.phases) == {"text encoding", "denoising", "VAE decode"}
    weights = sum(choices[8].prediction.weights.values())
    assert weights > 8 * 10**9 and choices[8].settings.offload != "none"  # the weights alone do not fit
    assert len(choices[24].tried) < len(choices[8].tried)  # 24 GB stops at a faster candidate
    assert main(["--model", str(WAN_1_3B), "--prompt", "x", "--plan", "--layout", "t4", "--max-memory", "8GB",
                 "--height", "256", "--width", "256", "--frames", "9"]) == 0
    out = capsys.readouterr().out
    assert "WanPipeline (text-to-video) for cuda (Tesla T4, sm 7.5)" in out
    assert f"chosen for 8.00 GB: {choices[8].settings.label()}" in out


def test_plan_predicts_measured_tiny_run_within_bounds(folders):
    """The prediction for the tiny Wan counts activations the run really makes (not zero, and not above what
    the run measured above its pre-load RSS)."""
    from hf_precision.apps.video import MemorySettings, load_video_pipeline, model_spec, predict

    where, spec = model_spec(str(folders("wan")))
    pred = predict(where, spec, layout="cpu", height=16, width=16, frames=5)
    assert 0 < pred.phases["denoising"] and pred.phases["VAE decode"] > sum(pred.weights.values())
    pipe_settings = MemorySettings(vae_tiling=True)
    tiled = predict(where, spec, layout="cpu", height=16, width=16, frames=5, settings=pipe_settings)
    assert tiled.phases["VAE decode"] <= pred.phases["VAE decode"]
    assert load_video_pipeline(where, "cpu", settings=pipe_settings).vae.use_tiling


def test_plan_predicts_the_image_encoding_phase_of_image_to_video(folders):
    """Image-to-video pipelines get an "image encoding" phase (CLIP vision encoder, VAE encode of the image) that
    text-to-video ones do not. Wan I2V encodes the image followed by frames-1 empty frames, so its phase grows with
    the frames; LTX I2V encodes one frame, so its does not. SVD gets the phase too; that a real SVD run measures it is
    checked on the run tests/test_video.py makes anyway (test_png_frames_in_process_with_model_offload)."""
    from hf_precision.apps.video import model_spec, predict

    def image_phase(kind, frames, h=16, w=16):
        where, spec = model_spec(str(folders(kind)))
        p = predict(where, spec, layout="cpu", height=h, width=w, frames=frames)
        return p.phases.get("image encoding"), sum(p.weights.values()), list(p.phases)

    assert image_phase("wan", 5)[0] is None
    short, weights, order = image_phase("wan_i2v", 5)
    assert order == ["text encoding", "image encoding", "denoising", "VAE decode"] and short > weights
    assert image_phase("wan_i2v", 13)[0] > short
    assert image_phase("ltx_i2v", 9, 32, 32)[0] == image_phase("ltx_i2v", 17, 32, 32)[0]
    where, spec = model_spec("svd", configs_only=True)  # the shipped SVD configs, on the meta device
    assert list(predict(where, spec, layout="cpu", height=32, width=32, frames=2).phases) == [
        "image encoding", "denoising", "VAE decode"]


def test_context_parallel_refused_on_cpu_with_the_reason_and_the_gpu_command(folders, tmp_path, capsys, monkeypatch):
    """diffusers 0.42.1 cannot run context parallelism over gloo on CPUs (it maps rank r to accelerator
    r % torch.accelerator.device_count(), 0 without an accelerator): the script says so before loading, and names the
    torchrun command. A transformer without a _cp_plan (CogVideoX) is refused for that reason instead."""
    import torch
    from diffusers import WanTransformer3DModel

    from hf_precision.apps.video import run
    from hf_precision.cli.video import main

    if torch.accelerator.device_count() == 0:  # the failure the check prevents, as plain diffusers meets it
        with pytest.raises(ZeroDivisionError):
            _ = 0 % torch.accelerator.device_count()
    assert WanTransformer3DModel._cp_plan is not None
    monkeypatch.setattr(run, "load_video_pipeline", lambda *a, **k: pytest.fail("loaded the model"))
    assert main(_args("wan", folders("wan"), tmp_path / "x.gif", tmp_path, "--context-parallel", "2")) == 2
    err = capsys.readouterr().err
    assert "--context-parallel 2 needs GPUs" in err and "modeling_utils.py:1718" in err and "torchrun" in err
    assert "Traceback" not in err
    assert main(_args("cogvideox", folders("cogvideox"), tmp_path / "y.gif", tmp_path, "--context-parallel", "2")) == 2
    assert "CogVideoXTransformer3DModel declares no _cp_plan" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("rank", [0, 1])
def test_context_parallel_only_the_main_process_writes_and_says_wrote(rank, folders, tmp_path, capsys, monkeypatch):
    """Every rank makes every clip under --context-parallel; rank 0 alone writes it and prints "wrote". The GPU parts
    (the refusal on CPU, diffusers' enable_parallelism) are stubbed and rank/world size come from a stand-in for
    accelerate's PartialState, so one CPU process plays rank 0 or rank 1 of 2."""
    import accelerate

    from hf_precision.apps.video import parallel as video_parallel
    from hf_precision.cli.video import main

    class Rank:
        def __init__(self, cpu=False):
            self.process_index, self.num_processes, self.device = rank, 2, "cpu"
            self.is_main_process = self.is_local_main_process = rank == 0

        def wait_for_everyone(self):
            pass

    calls = []
    monkeypatch.setattr(accelerate, "PartialState", Rank)
    monkeypatch.setattr(video_parallel, "check_context_parallel", lambda *a, **k: None)
    monkeypatch.setattr(video_parallel, "enable_context_parallel", lambda pipe, n: calls.append(n))
    out = tmp_path / "x.gif"
    rc = main(_args("wan", folders("wan"), out, tmp_path, "--context-parallel", "2"))
    printed = capsys.readouterr().out
    assert calls == [2] and "peak memory per phase" in printed  # this rank ran the clip
    assert ("wrote " in printed) == out.exists() == (rank == 0), printed
    assert rc == 0


@pytest.mark.parametrize("alias", [pytest.param("wan", marks=pytest.mark.heavy), "ltx"])
def test_plan_of_the_shipped_real_configs_for_a_preset_device(alias, capsys):
    """`--plan --device t4` plans a device this process does not have, offline, from the configs that ship."""
    from hf_precision.cli.video import main

    rc = main(["--model", alias, "--prompt", "a cat", "--out", "unused.mp4", "--plan", "--device", "t4",
               "--max-memory", "8GB"])
    out = capsys.readouterr().out
    assert rc == 0, out
    chosen = re.search(r"chosen for 8\.00 GB: (.+); predicted peak ([\d.]+ [kMG]?B)", out)
    assert chosen and parse_size(chosen[2]) <= 8 * 10**9, out


# ----------------------------------------------------------------------------------------- the recipes' video blocks

VIDEO_RECIPES = [name for name in list_recipes("pipeline") if "video" in pipeline_spec(name)]


def _tiny_of(recipe: str):
    """The tiny pipeline of a recipe with a video block: the registry's text-to-video entry under it (SVD's tiny
    pipeline is the image-to-video "svd" entry)."""
    if recipe == "svd":
        return make_pipeline("svd")
    rows = [p for p in PIPELINES.values() if p.recipe == recipe]
    # an image-to-video-only family (ChronoEdit): its one row
    return next((p for p in rows if p.mode == "t2v"), rows[0]).make(0)


def test_the_video_recipes_are_the_video_families():
    assert VIDEO_RECIPES == ["allegro", "chronoedit", "cogvideox", "easyanimate", "hunyuan_video", "hunyuan_video15",
                             "kandinsky5", "latte", "ltx", "ltx2", "mochi", "sana_video", "skyreels_v2", "svd", "wan"]


# Video recipes whose denoiser has no row in recipes/denoisers.yaml (tests/test_training_families.py NOT_TRAINED):
# `video --plan` cannot call it on the meta device and says so in one line.
NO_ROW = ("ltx2",)


@pytest.mark.parametrize("name", NO_ROW)
def test_video_plan_refuses_a_denoiser_without_a_row(name):
    """`video --plan` on such a family: one RecipeError naming the class and the fix, not a traceback."""
    import torch

    from hf_precision.apps.video.plan import denoiser_call
    from hf_precision.errors import RecipeError
    from hf_precision.apps.video.spec import spec_of

    pipe = _tiny_of(name)
    spec = spec_of(pipe)
    with pytest.raises(RecipeError, match=r"has no row in recipes/denoisers\.yaml.*add one"):
        denoiser_call(spec, pipe.components[spec.denoiser], torch.float32, 32, 32, 9)


@pytest.mark.parametrize("name", [n for n in VIDEO_RECIPES if n not in NO_ROW])
def test_each_rows_planner_inputs_are_what_its_tiny_transformer_takes(name):
    """The memory plan calls the denoiser with its class's row (the training loss's code) on the meta device: the
    real tiny denoiser of the family accepts them and gives back one latent-sized output per batch entry, and the call is counted."""
    import torch

    from hf_precision.memory.counting import count_live_bytes
    from hf_precision.apps.video.spec import spec_of, video_row
    from hf_precision.apps.video.plan import denoiser_call

    pipe = _tiny_of(name)
    spec = spec_of(pipe)
    row = spec.row
    assert row.name == name and row == video_row(name)
    h, w, f = SIZES.get(next((k for k in SIZES if k.startswith(name)), ""), (32, 32, 3))
    den = pipe.components[spec.denoiser].to("meta")
    with count_live_bytes() as live:
        out = den(**denoiser_call(spec, den, torch.float32, h, w, f), return_dict=False)[0]
    latent = spec.latent_shape(h, w, f)
    assert out.shape[0] == row.cfg_batch and out[0].numel() % (latent[0] * latent[1] * latent[2]) == 0, out.shape
    assert live.peak > 0


def test_plan_counts_framepacks_call_which_reads_its_prompt_mask():
    """`video --plan` on HunyuanVideo FramePack: its transformer slices the prompt by mask.sum(dim=1)[0], an .item()
    (transformer_hunyuan_video_framepack.py:328-332); the planner's masks keep their values, as train --plan's do,
    where every --plan on a FramePack folder ended in 'Tensor.item() cannot be called on meta tensors'."""
    import torch

    from hf_precision.apps.video.plan import denoiser_call
    from hf_precision.apps.video.spec import spec_of
    from hf_precision.memory.peaks import denoise_peak

    pipe = make_pipeline("hunyuan_video_framepack")
    spec = spec_of(pipe)
    den = pipe.components[spec.denoiser].to("meta")
    call = lambda: denoiser_call(spec, den, torch.float32, 16, 16, 5)  # noqa: E731
    assert denoise_peak(den, call) > 0


def test_plan_gives_mochi_allegro_and_latte_an_estimate(folders):
    """They had no denoiser inputs before (the plan raised); now each phase has a count above the weights."""
    from hf_precision.apps.video import model_spec, predict

    for kind in ("mochi", "allegro", "latte"):
        where, spec = model_spec(str(folders(kind)))
        h, w, f = SIZES[kind]
        p = predict(where, spec, layout="cpu", height=h, width=w, frames=f)
        assert list(p.phases) == ["text encoding", "denoising", "VAE decode"], kind
        assert p.phases["denoising"] > sum(p.weights.values()), kind


def test_a_pipeline_gets_the_video_block_of_the_recipe_it_resolves_to_not_of_its_class_name():
    """SkyReels' image-to-video pipeline is HunyuanVideo's (recipes/hunyuan_video.yaml lists it): the same prompt
    template crop and one-at-a-time guidance calls. A class-name prefix ("HunyuanVideo") missed it."""
    from hf_precision.apps.video.spec import video_row, video_spec
    from hf_precision.runtime.source import configs_of

    _, index, configs = configs_of("hunyuan_video")
    spec = video_spec("HunyuanSkyreelsImageToVideoPipeline", index, configs)
    assert spec.row == video_row("hunyuan_video") and (spec.row.cfg_batch, spec.row.text_prefix) == (1, 95)
    assert spec.defaults == {"height": 320, "width": 512, "frames": 61, "steps": 30}
