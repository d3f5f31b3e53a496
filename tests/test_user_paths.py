"""What a user runs, as they run it: AutoPipelines, help texts, early and plain errors, and the small things of
issue 34 (each test here failed before its fix)."""

from __future__ import annotations

import argparse

import pytest

pytestmark = pytest.mark.usefixtures("one_thread")


# --- pipeline_class= an AutoPipeline -------------------------------------------------------------------------------

def _auto_classes():
    import diffusers

    return [diffusers.AutoPipelineForText2Image, diffusers.AutoPipelineForImage2Image, diffusers.AutoPipelineForInpainting]


def test_every_auto_pipeline_of_a_shipped_family_resolves_to_its_recipe():
    """Every class a shipped recipe lists, under each AutoPipeline diffusers maps it to: the class it builds is found
    before loading, and the recipe chosen for it resolves (before, the AutoPipeline's name reached the recipe check)."""
    from diffusers.pipelines import auto_pipeline

    from hf_precision.recipe.catalog import recipe_classes
    from hf_precision.recipe.resolution import resolve
    from hf_precision.runtime.arguments import concrete_class
    from hf_precision.runtime.source import models_of_class

    tried = set()
    for saved in sorted(recipe_classes()):
        if auto_pipeline._get_model(saved) is None:
            continue
        for auto in _auto_classes():
            try:
                built = concrete_class(auto, "./folder", {"_class_name": saved}, {})
            except Exception as err:  # no pipeline for this task in the family: our one-line refusal
                assert "diffusers has no" in str(err) and saved in str(err), err
                continue
            assert not built.__name__.startswith("AutoPipeline")
            if built.__name__ in tried:
                continue
            tried.add(built.__name__)
            recipe = resolve(pipeline_class=built.__name__, devices="cpu", models=models_of_class(built.__name__))
            assert recipe.policies, built
    assert {"StableDiffusionXLImg2ImgPipeline", "StableDiffusionInpaintPipeline", "FluxImg2ImgPipeline"} <= tried


@pytest.mark.parametrize("kind, auto, recipe, built", [
    ("sdxl", "AutoPipelineForImage2Image", None, "StableDiffusionXLImg2ImgPipeline"),
    ("sdxl", "AutoPipelineForInpainting", "sdxl", "StableDiffusionXLInpaintPipeline"),
    ("sd15", "AutoPipelineForText2Image", "sd15", "StableDiffusionPipeline"),
])
def test_load_pipeline_builds_the_class_an_auto_pipeline_maps_to(saved_pipeline, kind, auto, recipe, built):
    import diffusers

    import hf_precision as hp

    pipe = hp.load_pipeline(saved_pipeline(kind), "cpu", layout="t4", recipe=recipe,
                            pipeline_class=getattr(diffusers, auto))
    assert type(pipe).__name__ == built
    assert hp.applied(pipe).recipe.name == (recipe or hp.applied(pipe).recipe.name)
    assert not hp.applied(pipe).recipe.name.startswith("composed:")


def test_an_auto_pipeline_without_a_pipeline_for_its_task_is_refused_before_loading(saved_pipeline):
    import diffusers

    import hf_precision as hp

    with pytest.raises(hp.RecipeError, match=r"pipeline_class=AutoPipelineForInpainting: diffusers has no inpaint "
                                             r"pipeline for StableVideoDiffusionPipeline"):
        hp.load_pipeline(saved_pipeline("svd"), "cpu", pipeline_class=diffusers.AutoPipelineForInpainting)


# --- help says every default ---------------------------------------------------------------------------------------

def _parsers():
    """Every parser a user reads: each ``hf-precision`` command, and the scripts that share their options."""
    import argparse

    from hf_precision.cli import build_parser
    from hf_precision.cli import train, video

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return [("hf-precision", top), *sub.choices.items(), ("scripts/train.py", train.build_parser("train.py")),
            ("scripts/generate_video.py", video.build_parser("generate_video.py"))]


def test_every_option_with_a_default_says_it_in_its_help():
    import argparse

    missing = []
    for name, parser in _parsers():
        for action in parser._actions:
            if not action.option_strings or isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            text = " ".join(parser._get_formatter()._format_action(action).split())
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}: no help")
            default = action.default
            if default is None or isinstance(default, bool) or default == [] or default is argparse.SUPPRESS:
                continue
            if "default" not in text or str(default) not in text:
                missing.append(f"{name} {action.option_strings[0]}: default {default!r} not said: {text}")
    assert not missing, "\n".join(missing)


def test_train_and_generate_help_show_the_defaults_of_the_issue(capsys):
    from hf_precision.cli import main

    for command, expected in (("train", ("(default: 1000)", "(default: 0.0001)", "(default: 3)")),
                              ("generate", ("(default: 30)", "(default: the pipeline's"))):
        with pytest.raises(SystemExit):
            main([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for part in expected:
            assert part in text, (command, part)


# --- training: early refusals, one log line per step, the expected time, one report --------------------------------

def _train_args(train_demo, out, *extra):
    model, data = train_demo
    return ["train", "--model", str(model), "--data", str(data), "--out", str(out), "--device", "cpu", "--quiet",
            "--lora-rank", "4", "--batch-size", "2", "--learning-rate", "5e-3", "--resolution", "32", *extra]


def test_resume_is_refused_before_the_model_loads_and_reruns_leave_one_log_row_per_step(train_demo, tmp_path,
                                                                                        monkeypatch, capsys):
    import json
    import shutil

    import hf_precision.runtime.load as load
    from hf_precision.cli import main

    out = tmp_path / "run"
    # Killed after step 3 with the last checkpoint at step 2 (a kill, unlike Ctrl-C, saves nothing): step 3 is run
    # again on resume, and the log keeps one row for it.
    assert main(_train_args(train_demo, out, "--steps", "3", "--checkpoint-every", "2")) == 0
    shutil.rmtree(out / "checkpoints" / "step-000003")
    (out / "pytorch_lora_weights.safetensors").unlink()
    assert main(_train_args(train_demo, out, "--steps", "4", "--resume", "latest")) == 0
    rows = [json.loads(line)["step"] for line in (out / "train_log.jsonl").read_text().splitlines()]
    assert rows == [1, 2, 3, 4]
    capsys.readouterr()

    def no_loading(*args, **kwargs):
        raise AssertionError("the model was loaded before the resume check")

    monkeypatch.setattr(load, "load_pipeline", no_loading)
    assert main(_train_args(train_demo, out, "--steps", "6", "--resume", "latest", "--seed", "7")) == 2
    assert "seed: 0 -> 7" in capsys.readouterr().err


def test_a_run_says_its_expected_time_once_and_only_the_main_process_reports(train_demo, tmp_path, monkeypatch, capsys):
    import re

    from hf_precision.apps.train import loop
    from hf_precision.cli import main

    assert main(_train_args(train_demo, tmp_path / "a", "--steps", "4", "--checkpoint-every", "10")) == 0
    out, err = capsys.readouterr()
    assert "Loading pipeline components" not in err and "Loading weights" not in err  # --quiet: no loading bars
    lines = [line for line in out.splitlines() if "s a step" in line]
    assert len(lines) == 1 and re.fullmatch(r"hf-precision train: [\d.]+ s a step: the 2 steps left take about \d+ s "
                                            r"\(4 in all\)", lines[0]), out
    assert "trained 4 steps" in out

    # Another process of an `accelerate launch` run: it trains, and leaves the report to the main process.
    real = loop.train

    def as_second_process(settings):
        result = real(settings)
        result.main_process = False
        return result

    monkeypatch.setattr(loop, "train", as_second_process)
    assert main(_train_args(train_demo, tmp_path / "b", "--steps", "1")) == 0
    assert "trained" not in capsys.readouterr().out


# --- errors that come late or not in our words ---------------------------------------------------------------------

@pytest.fixture
def hub_unreachable(monkeypatch):
    """The Hub allowed (HF_HUB_OFFLINE unset) but not answering: its endpoint is a local port nobody listens on."""
    import socket

    from huggingface_hub import constants

    with socket.socket() as s:  # a free port, closed again: connecting to it is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    for key in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(key, raising=False)
    return monkeypatch


def test_an_unreachable_hub_gives_our_message_without_asking_it(hub_unreachable, tmp_path):
    """huggingface_hub retried for ~25 s (Retrying in 1s/2s/4s/8s/8s) before our message; the Hub is not asked now."""
    from diffusers import DiffusionPipeline
    from huggingface_hub import constants

    import hf_precision as hp

    asked = []
    real = DiffusionPipeline.load_config.__func__

    def spy(cls, name, *args, **kwargs):
        asked.append(kwargs.get("local_files_only", False))
        return real(cls, name, *args, **kwargs)

    hub_unreachable.setattr(DiffusionPipeline, "load_config", classmethod(spy))
    hub_unreachable.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    with pytest.raises(hp.RecipeError, match=r"'stabilityai/stable-diffusion-xl-base-1.0': not a local folder, and the "
                                             r"Hugging Face Hub could not be reached .*hf download"):
        hp.load_pipeline("sdxl", "cpu")
    assert not [a for a in asked if not a], "the Hub was asked (and retried) before the error"


def test_an_unreachable_hub_loads_the_cached_copy(hub_unreachable, saved_pipeline, tmp_path):
    import shutil

    from huggingface_hub import constants

    import hf_precision as hp

    repo = tmp_path / "hub" / "models--someone--tiny-sd"
    shutil.copytree(saved_pipeline("sd15"), repo / "snapshots" / "abc123")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("abc123")
    hub_unreachable.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    pipe = hp.load_pipeline("someone/tiny-sd", "cpu")
    assert type(pipe).__name__ == "StableDiffusionPipeline"


def test_a_dtype_the_layout_cannot_compute_counts_the_components_present_and_is_fixed_in_python(saved_pipeline):
    """A 4-model SDXL folder: four problems, not seven (the absent controlnet, adapter and image_encoder of its
    recipe), and a Python caller is told the keyword argument, not a --set flag first."""
    import torch

    import hf_precision as hp

    with pytest.raises(hp.RecipeError) as info:
        hp.load_pipeline(saved_pipeline("sdxl"), "cpu", layout="t4", dtype=torch.bfloat16)
    problems = info.value.problems
    assert len(problems) == 4, problems
    assert {p.split("components.")[1].split(".")[0] for p in problems} == {"text_encoder", "text_encoder_2", "unet", "vae"}
    assert all(p.split("fix: ")[1].startswith("overrides={") for p in problems), problems
    assert "fix: overrides={'vae': {'dtype': 'float32'}} (CLI: --set vae.dtype=float32)" in str(info.value)


# --- small things ----------------------------------------------------------------------------------------------------

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def test_the_readme_quotes_the_demo_picture_sizes():
    import numpy as np

    from hf_precision.apps.demo import PICTURE_CALLS
    from hf_precision.apps.demo_pictures import CELL, SHAPES_CALL, enlarged
    from hf_precision.testing.pipelines import example_call_kwargs

    readme = " ".join((ROOT / "README.md").read_text().split())
    for kind, words in (("sdxl", "shapes model's {} picture enlarged {}"), ("svd", "tiny SVD's {} frames enlarged {}")):
        call = {**example_call_kwargs(kind), **PICTURE_CALLS[kind]}
        note = enlarged(np.zeros((call["height"], call["width"], 3)))[1]  # '32x32, enlarged 8x to 256x256 ...'
        size, factor = note.split(", enlarged ")[0], note.split(", enlarged ")[1].split()[0]
        assert words.format(size, factor) in readme, (kind, note)
    side = SHAPES_CALL["height"]  # part 5's grid
    assert f"{side}x{side} pictures enlarged {CELL // side}x to {CELL}x{CELL}" in readme


def test_gitignore_covers_what_the_readmes_offline_commands_write():
    import re

    readme = (ROOT / "README.md").read_text()
    # commands as the README gives them to copy (a `$ ` transcript shows an error case, which writes nothing)
    written = set(re.findall(r"(?m)^(?:hf-precision|python) .*--demo --out (\S+)", readme)) | set(re.findall(r"save_pipeline\(\w+\(\), '([^']+)'\)", readme))
    written |= {"demo_output", "islands.yaml"}  # make demo's folder; calibrate's default --out
    assert {"demo.mp4", "demo-lora", "sdxl-tiny"} <= written
    ignored = {line.strip().strip("/") for line in (ROOT / ".gitignore").read_text().splitlines()
               if line.strip() and not line.startswith("#")}
    assert not {w.strip("./") for w in written} - ignored


def test_the_calibrated_override_file_gets_the_usual_file_mode(tmp_path):
    """islands.yaml was written 0600 (mkstemp's private mode): a file people share gets 0666 less the umask."""
    import os

    from hf_precision.diagnose.calibration.report import CalibrationResult, RunError

    errors = {k: RunError(k, True, 0.0, 0.0, 0.0) for k in ("naive", "islands")}
    result = CalibrationResult(model="m", layout="t4", target="float16", reference="float32", islands={}, whole=[],
                               evidence={}, extra_bytes=0, island_bytes={}, component_bytes={}, recipe_islands={},
                               recipe_fp32=[], errors=errors, ranges={}, notes=[], bound=0.05, timings={}, components=[])
    mask = os.umask(0o022)
    try:
        path = result.write(tmp_path / "islands.yaml")
    finally:
        os.umask(mask)
    assert oct(path.stat().st_mode & 0o777) == "0o644"
    assert [p.name for p in tmp_path.iterdir()] == ["islands.yaml"]  # still atomic: no temporary left


def test_a_reader_that_stops_reading_ends_the_command_quietly():
    """`hf-precision show ... | head` ended in a BrokenPipeError traceback. A pipe whose reader is already gone makes
    the first write fail, whatever the output's size."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([sys.executable, "-m", "hf_precision.cli", "show", "sdxl", "--device", "t4"], stdout=write,
                              stderr=subprocess.PIPE, text=True, timeout=120, cwd=ROOT,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "BrokenPipe" not in done.stderr, done.stderr
    assert done.returncode == 141


def test_version(capsys):
    import hf_precision
    from hf_precision.cli import main

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out.strip() == f"hf-precision {hf_precision.__version__}"


def test_our_warnings_print_as_one_line_of_ours(capsys):
    """`show --class ZImageControlNetPipeline` printed Python's `file:line: UserWarning` and the quoted source line."""
    import warnings

    from hf_precision.cli import main

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        assert main(["show", "--class", "ZImageControlNetPipeline", "--device", "t4", "--brief"]) == 0
    err = capsys.readouterr().err
    assert err.startswith("hf-precision show: note: ZImageControlNetPipeline: no component recipe for"), err
    assert "UserWarning" not in err and len(err.strip().splitlines()) == 1


def test_the_scripts_spell_arguments_as_flags_as_hf_precision_does(capsys):
    """scripts/train.py and scripts/generate_video.py said `base=` (the Python keyword) where `hf-precision` says
    `--base`: only the main command set the command-line spelling of messages."""
    import argparse

    from hf_precision.cli.common import script_main
    from hf_precision.errors import RecipeError, arg

    def run(args):
        raise RecipeError(f"pass {arg('base', './sdxl')} for the rest of the pipeline")

    assert script_main(argparse.ArgumentParser(prog="train.py"), run, []) == 2
    assert capsys.readouterr().err == "train.py: error: pass --base ./sdxl for the rest of the pipeline\n"


def test_a_variant_the_folder_lacks_is_our_error_before_loading(saved_pipeline):
    """diffusers raised its own ValueError from inside from_pretrained; the README promises a RecipeError."""
    import hf_precision as hp

    with pytest.raises(hp.RecipeError, match=r"variant='fp16': the folder has no weight files of that variant \(its "
                                             r"variants: none, only the full files\); leave variant out"):
        hp.load_pipeline(saved_pipeline("sd15"), "cpu", variant="fp16")
    with pytest.raises(hp.RecipeError, match=r"variant='bf16': .*\(its variants: 'fp16'\); pass one of them "
                                             r"\(variant='fp16'\) or leave variant out"):
        hp.load_pipeline(saved_pipeline("sd15", fp16_variant=True), "cpu", variant="bf16")


def test_calibrate_runs_a_wan_at_the_size_its_rotary_table_holds(saved_pipeline, capsys):
    """calibrate without --height/--width ran the Wan pipeline's own 480x832 past a short rope table and failed
    inside diffusers, where `video --plan` capped the size: both now take the video command's capped size."""
    from hf_precision.apps.video.spec import model_spec
    from hf_precision.cli import main
    from hf_precision.cli.calibrate import _video_size
    from hf_precision.diagnose.calibration.method import _call_kwargs

    folder = str(saved_pipeline("wan"))
    _, spec = model_spec(folder)
    def args(model):
        return argparse.Namespace(model=model, height=None, width=None, frames=None)

    height, width, frames, _ = _video_size(args(folder))
    assert (height, width, frames) == (spec.defaults["height"], spec.defaults["width"], spec.defaults["frames"])
    assert not spec.check(height=height, width=width, frames=frames)  # inside the table, a multiple of the patch
    assert _video_size(args(str(saved_pipeline("sdxl")))) == (None, None, None, {})  # not video: the pipeline's own

    class Wan:  # what _call_kwargs reads of a pipeline: its __call__ signature
        def __call__(self, prompt=None, height=480, width=832, num_frames=81, num_inference_steps=50, output_type="np"):
            pass

    kwargs = _call_kwargs(Wan(), None, None, None, 1, (height, width), frames)
    assert (kwargs["height"], kwargs["width"], kwargs["num_frames"]) == (height, width, frames)
    # a size beyond the table: refused before loading, with the largest it holds
    assert main(["calibrate", folder, "--height", str(spec.max_positions * spec.size_multiple * 2), "--device", "cpu"]) == 2
    assert "rope_max_seq_len" in capsys.readouterr().err


def test_offline_message_on_the_command_line_names_the_folder_not_a_python_call(capsys, monkeypatch):
    """`train --plan --model hidream` offline ended 'pass the folder: hf_precision.load_pipeline(...)', a Python call
    for someone at a shell: on the command line the fix is the folder in the model's place."""
    from hf_precision.cli import main

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = main(["train", "--plan", "--model", "HiDream-ai/HiDream-I1-Full", "--out", "unused", "--device", "t4"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert "pass the folder: ./HiDream-I1-Full in place of HiDream-ai/HiDream-I1-Full" in err, err
    assert "load_pipeline" not in err, err


@pytest.mark.parametrize("value, words", [(".", "use a size such as 16GB"), ("GB", "use a size such as 16GB"),
                                          ("0", "a memory budget must be above 0 bytes"),
                                          ("0MB", "a memory budget must be above 0 bytes")])
def test_max_memory_without_a_size_is_one_line(value, words, saved_pipeline, capsys):
    """`--max-memory .` ended in a ValueError traceback (float('.')); `--max-memory 0` planned against a budget
    nothing fits ('does NOT fit in 0.0 MiB', exit 1) instead of naming the mistake."""
    from hf_precision.cli import main

    model = str(saved_pipeline("sd15"))
    capsys.readouterr()  # the fixture's own saving output
    code = main(["train", "--plan", "--model", model, "--out", "unused", "--device", "t4", "--max-memory", value])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"--max-memory {value}: {words}" in err, err
