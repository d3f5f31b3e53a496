"""README.md as a test: every command and snippet of README.md (and docs/video.md's per-card commands) runs as written.

The commands run offline on the CPU, with any GPU hidden (a GPU machine runs them as a CPU-only one), in a folder
that holds tiny random-weight stand-ins saved under the names the README uses (``./stable-diffusion-xl-base-1.0``,
``./Wan2.1-T2V-1.3B-Diffusers`` ...; hf_precision.testing builds them). A command fails the test when it exits with
another code than the README shows, prints a traceback, or its output no longer has the README's lines (compared
loosely: whitespace collapsed, numbers free to vary, ``...`` standing for what the README leaves out).

Commands run in this process (the CLI's ``main(argv)`` with captured output); a few run as subprocesses to prove the
console script and the script entry work. What cannot run as written on a CPU has one entry in ``INSTEAD`` saying
what runs in its place and why (a GPU command: its one-line refusal, then the fix that refusal names; a multi-GPU
launch: its CPU refusal or CPU equivalent; a video at a model card's size: the same command at the stand-in's tiny
size). A README block that is neither runnable nor listed in ``NOT_COMMANDS`` fails ``test_every_block_is_covered``:
nothing is skipped silently, and a new README command needs a way to run here. tests/test_docs_examples.py does the
same for docs/*.md and the ``--help`` examples, on the same folder (tests/readme_commands.py builds it once per
process).
"""

from __future__ import annotations

import ast
import contextlib
import io
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

import hf_precision as hp

from readme_commands import (BYTES, README, ROOT, Block, Command, _tiny_size, _tokens, _video_family,  # noqa: E402
                             assert_clean, blocks, inside, instead, missing_lines, readme_commands, run_as_written,
                             run_in_process, run_subprocess, shell_commands, stand_in_folder)
from launch import accelerate_cpu  # noqa: E402
from docs_commands import run_statements  # noqa: E402

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The folder of stand-ins laid out as the README expects, the process's working directory while the module runs."""
    with inside(stand_in_folder(tmp_path_factory)) as work:
        yield work


COMMANDS = readme_commands()


def _id(c: Command) -> str:
    return f"{c.where} {c.text[:60]}"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if instead(c.text) is None or instead(c.text)[0] == "refusal"],
                         ids=_id)
def test_command(cmd, workdir, no_gpu):
    """Each command exits as the docs show, prints no traceback, and prints the lines the docs show.

    GPUs hidden (``no_gpu``): the table above says what a command does on a CPU-only machine (a GPU command's one-line
    refusal), which on a GPU machine would run instead of refusing."""
    plan = instead(cmd.text)
    if plan is None:
        result = run_as_written(cmd.text)
        assert_clean(result, cmd.text, cmd.exit or 0)
        missing = missing_lines(cmd.expected, result.text, exact=BYTES)  # bytes from configs: the same everywhere
        assert not missing, f"{cmd.where}: `{cmd.text}` no longer prints:\n" + "\n".join(missing) + \
            f"\n--- it printed:\n{result.text[-4000:]}"
        return
    _, fix, says = plan
    result = run_as_written(cmd.text)
    assert_clean(result, cmd.text, 2)
    assert says in result.err and len(result.err.strip().splitlines()) == 1, result.err
    if fix is not None:  # the fix the refusal names works when followed
        followed = run_as_written(fix)
        assert_clean(followed, fix, 0)


def test_every_command_has_a_runner():
    """Each command is run as written (test_command), or by the test its entry in `instead` names."""
    kinds = {(instead(c.text) or ("as written",))[0] for c in COMMANDS}
    assert kinds <= {"as written", "refusal", "instead", "skip-why", "slow-accelerate", "slow-accelerate-train",
                     "slow-benchmark"}, kinds
    assert len(COMMANDS) > 40  # the extraction still finds the README's commands


def test_every_block_is_covered():
    """Every fenced block of README.md runs here or is listed with the reason it does not."""
    covered = {b.where for b in blocks(README) if b.lang in ("bash", "") and shell_commands(b)}
    covered |= set(PYTHON_BLOCKS) | set(NOT_COMMANDS) | set(OUTPUT_BLOCKS)
    lines = {b.line: b for b in blocks(README)}
    uncovered = [f"{b.where} ({b.lang or 'text'}): {b.text.splitlines()[0] if b.text else ''}"
                 for b in lines.values() if b.where not in covered and _key(b) not in covered]
    assert not uncovered, "README blocks that no test runs: add them to a table of tests/test_readme.py:\n" + \
        "\n".join(uncovered)


def _key(block: Block) -> str:
    return block.text.splitlines()[0] if block.text else ""


# Blocks that are not commands, by their first line, and why (each is still checked where it can be).
NOT_COMMANDS = {
    "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and Half":
        "the torch errors this library ends (quoted; the demo's part 1 reproduces the first)",
    "schema: 1": "recipes/sdxl.yaml quoted: test_recipe_yaml_is_the_shipped_one",
    "# my.yaml": "written to my.yaml by the workdir fixture and used by the `--overrides my.yaml` command",
}
# Output blocks without a `$` command: the scenario that prints them is a test below.
OUTPUT_BLOCKS = {
    "erased float32 islands:": "test_check_after_a_cast_to_float16",
    "hf_precision.diagnose.mismatch.MismatchError: dtype mismatch in unet.time_embedding.linear_1: input is float32, weights are float16":
        "test_explain_block",
    "RuntimeWarning: hf_precision: vae produced non-finite values in float16; re-ran it in bfloat16 and keeps bfloat16":
        "test_nan_guard_warning",
}
PYTHON_BLOCKS = {"import hf_precision as hp": "test_use_it_block",
                 'pipe = hp.load_pipeline("./FLUX.1-dev", "cuda", quantize={"transformer": "int8", "text_encoder_2": "nf4"})':
                     "test_quantize_block",
                 "import torch, hf_precision as hp": "test_training_block",
                 'pipe = hp.load_pipeline("./my-sdxl-unet.safetensors", "cuda", base="./stable-diffusion-xl-base-1.0")':
                     "test_single_file_block",
                 'pipe = hp.load_pipeline("./stable-diffusion-xl-base-1.0", "cuda")': "test_load_lora_block", 'hp.get_recipe("sdxl", device="t4")': "test_devices_python_block",
                 '>>> hp.apply_recipe(sdxl_pipe, "svd")': "test_wrong_recipe_block",
                 "with hp.explain(pipe):          # raises a MismatchError from the original error": "test_explain_block"}


# ------------------------------------------------------------------------------------------------ what `make` does


def test_make_targets_the_readme_names():
    """`make demo` runs the demo command test_make_demo runs; `make test` the suite; both create .venv."""
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^VENV \?= \.venv$", makefile, re.M) and "-m venv $(VENV)" in makefile
    assert re.search(r"^demo:.*\n\t\$\(BIN\)/hf-precision demo --out demo_output$", makefile, re.M)
    assert re.search(r"^test:.*\n\t\$\(BIN\)/python -m pytest", makefile, re.M)
    quick_start = next(b for b in blocks(README) if b.lang == "bash" and b.text.startswith("make demo"))
    # after `make demo` the README says how to reach what make installed (issue 25 item 1)
    assert "source .venv/bin/activate" in quick_start.text
    assert ".venv/bin/" in README.read_text().split("## Use it")[0]


def test_make_demo(demo_run):
    """What `make demo` runs prints the four parts the README describes, with the calls the README quotes.

    The run is tests/conftest.py's ``demo_run``, shared with tests/test_main_job.py: ``hf-precision demo --out DIR
    --device cpu`` plus ``--json``, which appends the measurements after what is checked here."""
    # --device cpu: the README quotes the CPU demo (`hp.load_pipeline(folder, "cpu", layout="t4")`); without it a GPU
    # machine runs the demo on cuda:0 and prints that device instead (the same text with another place)
    result, _, _, folder = demo_run
    assert_clean(result, "hf-precision demo", 0)
    section = README.read_text().split("## Quick start")[1].split("## Use it")[0]
    for title in ("1. the classic failure", "2. what the recipe", "3. the NaN guard", "4. the recipe of", "5. pictures"):
        assert title in result.out
    for call in re.findall(r"`(hp\.load_pipeline\([^`]*\))`", section):
        assert call in result.out, f"the README quotes {call}; the demo prints something else"
    assert "mat1 and mat2 must have the same dtype" in result.out and "unet.time_embedding.linear_1" in result.out
    printed, quoted = " ".join(result.out.split()), " ".join(section.split())
    assert "32x32, enlarged 8x to 256x256" in printed and "4 frames of 32x32, enlarged 8x" in printed  # sdxl.png, svd.gif
    assert "32x32 picture enlarged 8x" in quoted and "32x32 frames enlarged 8x" in quoted
    assert "shapes.png" in printed and "shapes.png" in quoted
    for name in ("shapes.png", "sdxl.png", "svd.gif", "report.json"):
        assert (folder / name).is_file()


# ------------------------------------------------------------------------------------------------ python blocks


def _python(start: str) -> Block:
    return next(b for b in blocks(README) if b.lang == "python" and b.text.startswith(start))


# The fixes the errors of the Use-it block name, applied when a statement raises one on this CPU-only machine.
# The one statement that makes an image runs 2 steps instead of the pipeline's 50 (fp16 of the T4 layout on a CPU).
SIZE = [('pipe("an astronaut riding a horse")', 'pipe("an astronaut riding a horse", num_inference_steps=2)')]
FOLLOW = [('"cuda")', '"cpu", layout="t4")'), ('"default": "cuda"}', '"default": "cpu"}, layout="t4"'),
          ('"mps",', '"cpu", layout="m2-macos15",'), ('("sdxl",', '("./stable-diffusion-xl-base-1.0",')]


def test_use_it_block(workdir):
    """The Use-it block statement by statement: each runs, or raises one RecipeError whose fix, followed, runs."""
    block = _python("import hf_precision as hp")
    namespace: dict[str, Any] = {}
    # the error names the fix applied (layout=), or that an offline machine cannot download the Hub id
    printed = run_statements(block, namespace, size=SIZE, follow=FOLLOW,
                             names=lambda fixed, message: "layout=" in message or "download" in message)
    assert "hf_precision applied recipe" in printed  # print(applied) before remove()
    assert namespace["image"].size[0] > 0
    assert hp.applied(namespace["pipe"]) is None  # applied.remove() takes the record off too (issue 25 item 8)


def test_devices_python_block():
    block = _python('hp.get_recipe("sdxl", device="t4")')
    namespace = {"hp": hp}
    for node in ast.parse(block.text).body:
        value = eval(compile(ast.Expression(node.value), block.where, "eval"), namespace)
        assert value["unet"].compute == "float16"


def test_wrong_recipe_block():
    from hf_precision.testing import make_sdxl

    block = _python('>>> hp.apply_recipe(sdxl_pipe, "svd")')
    with pytest.raises(hp.RecipeError) as info:
        eval(block.text.splitlines()[0][4:], {"hp": hp, "sdxl_pipe": make_sdxl()})
    shown = [line.removeprefix("hf_precision.errors.RecipeError: ") for line in block.text.splitlines()[1:]]
    assert not missing_lines(shown, str(info.value)), (missing_lines(shown, str(info.value)), str(info.value))


@pytest.fixture(scope="module")
def plain_fp16_unet(workdir):
    """The README's explain example: SDXL with an fp16 UNet next to fp32 text encoders, plain diffusers."""
    import torch
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(workdir / "stable-diffusion-xl-base-1.0",
                                             dtype={"unet": torch.float16, "default": torch.float32})
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_explain_block(plain_fp16_unet):
    block = _python("with hp.explain(pipe):")
    shown = next(b for b in blocks(README) if b.text.startswith("hf_precision.diagnose.mismatch.MismatchError"))
    namespace = {"hp": hp, "pipe": plain_fp16_unet, "prompt": "x"}
    nodes = ast.parse(block.text).body
    with pytest.raises(hp.MismatchError) as info:
        exec(compile(ast.get_source_segment(block.text, nodes[0]), block.where, "exec"), namespace)
    text = f"{type(info.value).__module__}.{type(info.value).__name__}: {info.value}"
    assert not missing_lines(shown.text.splitlines(), text), (missing_lines(shown.text.splitlines(), text), text)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(ast.get_source_segment(block.text, nodes[1]), block.where, "exec"), namespace)
    assert "dtype mismatch in unet.time_embedding.linear_1" in printed.getvalue()


def test_check_after_a_cast_to_float16(workdir):
    """'After pipe.to(torch.float16) on a loaded pipeline, hp.check(pipe) reports (exit code 1):'"""
    import torch

    shown = next(b for b in blocks(README) if b.text.startswith("erased float32 islands:"))
    pipe = hp.load_pipeline(workdir / "stable-diffusion-xl-base-1.0", "cpu", layout="t4")
    pipe.to(torch.float16)
    report = hp.check(pipe)
    assert report.exit_code == 1
    assert not missing_lines(shown.text.splitlines(), report.table()), report.table()


def test_nan_guard_warning():
    """The guard's warning on a device that computes bf16 (an A100 layout, run here)."""
    import torch

    from hf_precision.testing import make_overflowing_vae

    shown = next(b for b in blocks(README) if b.text.startswith("RuntimeWarning: hf_precision: vae produced"))
    vae, latents = make_overflowing_vae()
    hp.apply_recipe(vae, "vae.fp16_fix", device="cpu", layout="a100")
    with pytest.warns(RuntimeWarning) as seen, torch.no_grad():
        vae.decode(latents)
    text = "RuntimeWarning: " + " ".join(str(w.message) for w in seen)
    assert not missing_lines(shown.text.splitlines(), text), (missing_lines(shown.text.splitlines(), text), text)


def test_recipe_yaml_is_the_shipped_one():
    import yaml

    quoted = yaml.safe_load(next(b for b in blocks(README) if b.lang == "yaml" and b.text.startswith("schema: 1")).text)
    shipped = yaml.safe_load((ROOT / "recipes" / "sdxl.yaml").read_text())
    for key, value in quoted.items():  # the README quotes it shortened: what it shows is in the file
        if key == "components":
            for comp, spec in value.items():
                assert shipped["components"][comp] == spec or shipped["components"][comp].get("use") == spec["use"]
        elif isinstance(value, list):
            assert set(value) <= set(shipped[key]), key
        else:
            assert shipped[key] == value, key


# ------------------------------------------------------------------------------------------------ entry points


def test_console_script_and_script_entry(workdir):
    """The installed `hf-precision` command and `python scripts/generate_video.py` run as separate programs."""
    result = run_subprocess([str(BIN / "hf-precision"), "show", "sdxl", "--device", "cuda:sm=8.6,name=RTX 3090",
                             "--brief"], workdir, timeout=300)
    assert_clean(result, "hf-precision show sdxl --device 'cuda:sm=8.6,name=RTX 3090'", 0)
    assert "RTX 3090" in result.out
    result = run_subprocess([sys.executable, str(ROOT / "scripts" / "generate_video.py"), "--demo", "--out",
                             "notes.txt/cat.mp4"], workdir, timeout=300)
    assert_clean(result, "generate_video.py --demo --out notes.txt/cat.mp4", 2)
    assert result.err.startswith("generate_video.py: error: --out notes.txt/cat.mp4: notes.txt is a file")


# ------------------------------------------------------------------------------------------------ slow ones


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if (instead(c.text) or ("",))[0] == "slow-benchmark"], ids=_id)
def test_benchmark_command(cmd, workdir, tmp_path):
    """The benchmark as written, at the tiny size, quick, its apply section only (the real run takes 1 to 20 minutes;
    tests/test_benchmark.py covers the sections). The probe and the estimate it scales run in every section."""
    tokens = _tokens(cmd.text)
    args = [sys.executable, str(ROOT / tokens[1]), *tokens[2:], "--size", "tiny", "--quick", "--only", "apply",
            "--out", str(tmp_path)]
    result = run_subprocess(args, workdir, timeout=600)
    assert_clean(result, cmd.text, 0)
    assert "probe:" in result.text and (tmp_path / "benchmark.md").is_file()


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if (instead(c.text) or ("",))[0] == "slow-accelerate"], ids=_id)
def test_accelerate_launch_command(cmd, workdir, tmp_path):
    """Two processes over gloo on the CPU: the CPU equivalent docs/video.md gives (`--device cpu`, no mixed precision)."""
    tokens = shlex.split(cmd.text)
    script = tokens.index("scripts/generate_video.py")
    tail = tokens[script + 1:]
    family = _video_family(["python", *tokens[script:]])
    out = tmp_path / "videos"
    tail[tail.index("--out") + 1] = str(out)
    args = [*accelerate_cpu(), str(ROOT / "scripts" / "generate_video.py"),
            "--device", "cpu", *tail, *_tiny_size(family)]
    (workdir / "prompts2.txt").write_text("a cat surfing\na dog\n")
    args[args.index("prompts.txt")] = "prompts2.txt"
    result = run_subprocess(args, workdir, timeout=600)
    assert_clean(result, cmd.text, 0)
    assert len(list(out.glob("*.mp4"))) == 2, result.text[-3000:]


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if (instead(c.text) or ("",))[0] == "slow-accelerate-train"],
                         ids=_id)
def test_accelerate_launch_train_command(cmd, workdir, tmp_path):
    """`accelerate launch ... scripts/train.py` as two CPU processes over gloo: trains, and writes its LoRA once."""
    tokens = shlex.split(cmd.text)
    tail = tokens[tokens.index("scripts/train.py") + 1:]
    out = tmp_path / "lora"
    tail[tail.index("--out") + 1] = str(out)
    args = [*accelerate_cpu(), str(ROOT / "scripts" / "train.py"), *tail,
            "--device", "cpu", "--steps", "2", "--resolution", "32"]
    result = run_subprocess(args, workdir, timeout=600)
    assert_clean(result, cmd.text, 0)
    assert [p.name for p in out.glob("*.safetensors")] == ["pytorch_lora_weights.safetensors"], result.text[-3000:]


def _statements(start: str) -> list[str]:
    block = _python(start)
    return [ast.get_source_segment(block.text, node) for node in ast.parse(block.text).body]


def test_quantize_block(workdir):
    """The quantized-weights block: with CUDA it loads as written; without, as written it is one clear error, and on
    the CPU it loads. Either way the transformer is in torchao int8 and the T5 in bitsandbytes nf4 (a transformers
    model: bitsandbytes runs on the CPU too)."""
    import torch

    pytest.importorskip("bitsandbytes")
    first = _statements('pipe = hp.load_pipeline("./FLUX.1-dev", "cuda", quantize=')[0]
    namespace = {"hp": hp}
    if torch.cuda.is_available():
        exec(first, namespace)
    else:
        with pytest.raises(hp.RecipeError) as info:
            exec(first, {"hp": hp})
        assert len(str(info.value).splitlines()) == 1 and "layout=" in str(info.value)
        exec(first.replace('"cuda"', '"cpu"'), namespace)
    recipe = hp.applied(namespace["pipe"]).recipe
    assert recipe["transformer"].storage == "int8" and recipe["text_encoder_2"].storage == "nf4"


def test_single_file_block(workdir):
    """The single-file block on the stand-in: its UNet saved as one safetensors file loads as the pipeline's UNet
    (the T4 layout on this CPU), in the planned fp16 with the recipe's fp32 islands."""
    import torch
    from safetensors.torch import load_file, save_file

    [statement] = _statements('pipe = hp.load_pipeline("./my-sdxl-unet.safetensors"')
    unet = Path("stable-diffusion-xl-base-1.0") / "unet"
    save_file(load_file(next(unet.glob("*.safetensors"))), "my-sdxl-unet.safetensors")
    namespace = {"hp": hp}
    exec(statement.replace('"cuda",', '"cpu", layout="t4",'), namespace)
    pipe = namespace["pipe"]
    islands = hp.applied(pipe).islands["unet"]
    assert pipe.unet.conv_in.weight.dtype == torch.float16 and islands
    assert all(p.dtype == torch.float32 for p in pipe.unet.get_submodule(islands[0]).parameters())
    assert any("loaded from the single file" in a for a in hp.applied(pipe).actions)


def test_training_block(workdir):
    """The training block on the CPU (the T4 layout here), on the sd15 stand-in, with pixels and prompts of its size."""
    import torch

    block = _python("import torch, hf_precision as hp")
    source = block.text.replace('device="cuda"', 'device="cpu", layout="t4"').replace("num_inference_steps=20",
                                                                                      "num_inference_steps=2")
    namespace = {"pipe": hp.load_pipeline("./sd15", "cpu", layout="t4"), "pixels": torch.rand(1, 3, 32, 32) * 2 - 1,
                 "prompts": ["a cat"]}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(source, block.where, "exec"), namespace)
    assert "lora" in printed.getvalue() and (Path("out") / "pytorch_lora_weights.safetensors").is_file()
    assert all(p.dtype == torch.float32 for p in namespace["tp"].parameters())


def test_load_lora_block(workdir):
    """The LoRA a README command trained (./sdxl-lora) loads into an hf_precision pipeline as the block shows."""
    if not Path("sdxl-lora").is_dir():
        maker = next(c for c in COMMANDS if "--out ./sdxl-lora" in c.text)
        assert_clean(run_as_written(maker.text.replace("--device cuda", "--device cpu --layout t4")), maker.text)
    block = _python('pipe = hp.load_pipeline("./stable-diffusion-xl-base-1.0", "cuda")')
    source = block.text.replace('"cuda")', '"cpu", layout="t4")')
    namespace = {"hp": hp}
    exec(compile(source, block.where, "exec"), namespace)
    assert namespace["pipe"].get_active_adapters()
