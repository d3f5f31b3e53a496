"""Reading the fenced blocks and shell commands of README.md and docs/*.md, the folder of tiny stand-ins they run in,
and running commands with their output captured: the machinery of tests/test_readme.py and
tests/test_docs_examples.py."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import io
import os
import re
import shlex
import shutil
import subprocess
import sys
import traceback
from pathlib import Path

from launch import ROOT, subprocess_env

README = ROOT / "README.md"
VIDEO_DOC = ROOT / "docs" / "video.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

# ------------------------------------------------------------------------------------------------ reading the docs


@dataclasses.dataclass
class Block:
    """A fenced block of a Markdown file."""

    path: Path
    line: int
    lang: str
    text: str

    @property
    def where(self) -> str:
        return f"{self.path.name}:{self.line}"


@dataclasses.dataclass
class Command:
    """One shell command as written, with the output lines and exit code the doc shows (None: 0, no output)."""

    text: str
    where: str
    expected: list[str] = dataclasses.field(default_factory=list)
    exit: int | None = None


def blocks(path: Path) -> list[Block]:
    out, lang, start, body = [], None, 0, []
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            if lang is None:
                lang, start, body = line[3:].strip(), i, []
            else:
                out.append(Block(path, start, lang, "\n".join(body)))
                lang = None
        elif lang is not None:
            body.append(line)
    return out


def shell_commands(block: Block) -> list[Command]:
    """``bash`` blocks: one command per line (``\\`` continues it), comments dropped. Transcripts (``$ cmd`` lines
    followed by output, ``(exit N)``): each command with its output."""
    if block.lang == "bash":
        return [Command(re.sub(r"\s+#\s.*$", "", line).strip(), block.where) for line in _shell_lines(block.text)
                if shlex.split(line, comments=True)]
    cmds: list[Command] = []
    for line in block.text.splitlines():
        if line.startswith("$ "):
            cmds.append(Command(line[2:].split("  #")[0].strip(), block.where))
        elif cmds and (m := re.fullmatch(r"\(exit (\d+)\)", line.strip())):
            cmds[-1].exit = int(m[1])
        elif cmds:
            cmds[-1].expected.append(line)
    for c in cmds:  # an error transcript (`prog: error: ...`) exits with 2
        if c.exit is None and any(": error: " in e for e in c.expected):
            c.exit = 2
    return cmds


def _shell_lines(text: str) -> list[str]:
    """The block's lines as the shell reads them: ``\\`` continues a line, and so does an open quote (a multi-line
    ``python -c "..."``, whose newlines stay)."""
    lines: list[str] = []
    for line in re.sub(r"\\\n\s*", " ", text).splitlines():
        if lines and _open_quote(lines[-1]):
            lines[-1] += "\n" + line
        else:
            lines.append(line)
    return lines


def _open_quote(line: str) -> bool:
    try:
        shlex.split(line, comments=True)
    except ValueError:  # "No closing quotation"
        return True
    return False


def readme_commands() -> list[Command]:
    cmds = [c for b in blocks(README) if b.lang in ("bash", "") for c in shell_commands(b)]
    per_card = next(b for b in blocks(VIDEO_DOC) if b.lang == "bash" and "# 8 GB" in b.text)
    return cmds + shell_commands(per_card)


# Figures a command computes from configs alone (bytes, parameter counts): the same on every machine, so the docs'
# figures must be the command's. Other numbers (timings, activations of random weights, losses) vary.
BYTES = r"\d[\d,]*(?:\.\d+)? ?(?:[kMGT]i?B|B)\b|\d[\d,]* parameters"


def _norm(text: str, exact: str | None = None) -> str:
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    kept: list[str] = []
    if exact:  # protected from the number wildcard below, put back after
        text = re.sub(exact, lambda m: kept.append(m[0]) or f"\0{len(kept) - 1}\0", text)
    text = re.sub(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?", "#", text)
    text = re.sub("\0(#)\0", lambda m: kept.pop(0), text)
    return " ".join(text.split())


def missing_lines(expected: list[str], output: str, exact: str | None = None) -> list[str]:
    """The docs' shown lines (pieces between ``...``) that the output does not contain, numbers set free except
    those matching ``exact`` (e.g. ``BYTES``), which must be the same.

    >>> missing_lines(["weights 4.80 GiB, took 3.1 s"], "weights 4.80 GiB, took 2.9 s", exact=BYTES)
    []
    >>> missing_lines(["weights 4.80 GiB, took 3.1 s"], "weights 4.81 GiB, took 3.1 s", exact=BYTES)
    ['weights 4.80 GiB, took # s']
    """
    have = _norm(output, exact)
    missing = []
    for line in expected:
        for piece in _norm(line, exact).split("..."):
            piece = piece.strip(" (),")
            if len(piece) > 2 and piece not in have:
                missing.append(piece)
    return missing


# ------------------------------------------------------------------------------------------------ running


@dataclasses.dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def text(self) -> str:
        return self.out + "\n" + self.err


def run_in_process(tokens: list[str]) -> Result:
    """``hf-precision ...`` / ``python scripts/generate_video.py ...`` / ``python -c ...`` in this process."""
    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            if Path(tokens[0]).name == "hf-precision":
                from hf_precision.cli import main

                code = main(tokens[1:])
            elif tokens[1:2] == ["scripts/generate_video.py"]:
                from hf_precision.cli.video import main as video_main

                code = video_main(tokens[2:], prog="generate_video.py")
            elif tokens[1:2] == ["-c"]:
                exec(compile(tokens[2], "<python -c>", "exec"), {"__name__": "__main__"})
            else:
                raise AssertionError(f"no in-process runner for {tokens}")
        except SystemExit as exit_:  # argparse: usage errors exit 2
            code = exit_.code if isinstance(exit_.code, int) else 1
        except BaseException:  # a traceback is a failure whatever the README shows
            traceback.print_exc(file=err)
            code = -1
    return Result(code, out.getvalue(), err.getvalue())


def run_subprocess(args: list[str], cwd: Path, timeout: int = 600) -> Result:
    """A command as its own program, GPUs hidden: the docs' commands are checked as the CPU runs them (their CPU
    refusals, two processes over gloo), on a GPU machine too."""
    proc = subprocess.run(args, cwd=cwd, env=subprocess_env(cpu_only=True), capture_output=True, text=True,
                          timeout=timeout)
    return Result(proc.returncode, proc.stdout, proc.stderr)


BIN = Path(sys.executable).parent


# ------------------------------------------------------------------------------------------------ the stand-ins


def _tiny_size(family: str) -> list[str]:
    """The stand-in's own size, for a video command written for a model card's size (minutes per clip on a CPU)."""
    from hf_precision.testing import PIPELINES

    if family == "svd":
        return ["--height", "32", "--width", "32", "--frames", "2", "--steps", "2", "--decode-chunk-size", "2"]
    kw, spec = PIPELINES[family].call_kwargs(), PIPELINES[family]
    frames = kw["num_frames"]
    if spec.recipe == "cogvideox" and (frames - 1) % 4:  # diffusers' own I2V test calls it with 8 frames
        frames = 9
    return ["--height", str(kw["height"]), "--width", str(kw["width"]), "--frames", str(frames), "--steps", "2"]


# model folder name the docs use -> the tiny stand-in saved under it
STAND_INS = {
    "stable-diffusion-xl-base-1.0": "sdxl", "my-sdxl-finetune": "sdxl",
    "Wan2.1-T2V-1.3B-Diffusers": "wan", "Wan2.1-T2V-14B-Diffusers": "wan", "LTX-Video": "ltx",
    "CogVideoX-5b-I2V": "cogvideox_i2v", "HunyuanVideo": "hunyuan_video",
    "stable-video-diffusion-img2vid-xt": "svd", "svd-xt": "svd",
    "sd15": "sd15", "stable-diffusion-v1-5": "sd15", "FLUX.1-dev": "flux",
    "my-sdxl": "sdxl", "my-sdxl-folder": "sdxl",
    "sd-img2img": "sd_img2img", "sd-inpaint": "sd_inpaint",  # `generate --help`'s --image and --mask examples
}


def _training_data(work: Path) -> None:
    """Captioned images (photos/, and cat/ with the embedding's token), and captioned 5-frame clips (clips/)."""
    import numpy as np
    from PIL import Image

    from hf_precision.apps.train.demo import draw_shape

    (work / "photos").mkdir()
    (work / "cat").mkdir()
    (work / "clips").mkdir()
    for i, shape in enumerate(("square", "circle")):
        draw_shape(shape, (200, 40, 40), 32, seed=i).save(work / "photos" / f"{shape}.png")
        (work / "photos" / f"{shape}.txt").write_text(f"a red {shape}", encoding="utf-8")
        draw_shape(shape, (40, 40, 200), 32, seed=i).save(work / "cat" / f"{shape}.png")
        (work / "cat" / f"{shape}.txt").write_text(f"a photo of <my-cat> as a {shape}", encoding="utf-8")
        frames = [Image.fromarray(np.full((16, 16, 3), 20 * j + 50 * i, np.uint8)) for j in range(5)]
        frames[0].save(work / "clips" / f"c{i}.gif", save_all=True, append_images=frames[1:], duration=100)
        (work / "clips" / f"c{i}.txt").write_text(f"clip {i}", encoding="utf-8")


_FOLDER: list[Path] = []


def stand_in_folder(tmp_path_factory, eager: bool = True) -> Path:
    """The folder laid out as the docs expect (the stand-ins under the docs' model names, captioned images and clips,
    cat.png, prompts.txt ...), made once per test process and shared by every module that runs the docs' commands.
    ``eager=False``: the stand-ins are built when a command names them (``ensure_stand_ins``), not all at first."""
    if not _FOLDER:
        _FOLDER.append(_lay_out(tmp_path_factory.mktemp("docs")))
    if eager:
        ensure_stand_ins(" ".join(f"./{name}" for name in STAND_INS), _FOLDER[0])
    return _FOLDER[0]


def ensure_stand_ins(text: str, work: Path | None = None) -> None:
    """Build the stand-ins whose folder ``text`` names as ``./NAME`` (a command, a Python block), each kind once: the
    other names of a kind are links to its folder. (A bare ``sd15`` is the recipe alias, not the folder.)"""
    from hf_precision.testing import make_pipeline, save_pipeline

    work = work or _FOLDER[0]
    words = set(re.findall(r"(?<![\w/.])\./([\w.-]+)", text))
    for name, kind in STAND_INS.items():
        if name not in words or (work / name).exists():
            continue
        built = next((work / n for n, k in STAND_INS.items() if k == kind and (work / n).is_dir()), None)
        if built is None:
            save_pipeline(make_pipeline(kind), work / name)
        else:
            (work / name).symlink_to(built.resolve(), target_is_directory=True)


def _lay_out(work: Path) -> Path:
    """The folder's files besides the stand-ins."""
    from PIL import Image

    from hf_precision.testing import example_image

    example_image(32).save(work / "cat.png")
    mask = Image.new("L", (32, 32), 0)  # an inpainting mask: white where it repaints
    mask.paste(255, (8, 8, 24, 24))
    mask.save(work / "mask.png")
    _training_data(work)
    (work / "prompts.txt").write_text("a cat surfing\n")
    (work / "notes.txt").write_text("not a folder\n")
    (work / "notes.png").write_text("a text file named .png\n")  # docs/video.md's unreadable image
    my_yaml = next(b for b in blocks(README) if b.lang == "yaml" and b.text.startswith("# my.yaml"))
    (work / "my.yaml").write_text(my_yaml.text)
    return work


@contextlib.contextmanager
def inside(folder: Path):
    """The process's working directory is ``folder`` while a module runs the docs' commands (they use ./ paths)."""
    old = os.getcwd()
    os.chdir(folder)
    try:
        yield folder
    finally:
        os.chdir(old)


@functools.lru_cache(maxsize=1)
def all_commands() -> tuple[Command, ...]:
    """Every shell command of README.md and docs/*.md, in that order."""
    cmds = [c for b in blocks(README) if b.lang in ("bash", "") for c in shell_commands(b)]
    return tuple(cmds + [c for path in DOCS for b in blocks(path) if b.lang in ("bash", "", "text")
                         for c in shell_commands(b)])


def _written_by(text: str) -> list[str]:
    """The paths a command writes: its --out, or a folder a ``python -c`` snippet saves (``save_pipeline(p, 'x')``)."""
    tokens = shlex.split(text)
    out = [tokens[tokens.index("--out") + 1]] if "--out" in tokens else []
    return out + re.findall(r"save_pipeline\([^,]+, '([^']+)'\)", text)


def make_inputs(tokens: list[str]) -> None:
    """Make what a command reads that another command of the docs writes (sdxl-tiny, planted_sdxl, islands.yaml),
    when no earlier command made it: each command of the docs then runs alone, in any order."""
    outs = {tokens[tokens.index("--out") + 1]} if "--out" in tokens else set()
    for token in tokens[1:]:
        name = token.removeprefix("./").rstrip("/")
        if token in outs or not name or os.path.exists(name) or token.startswith("-") or len(name) > 100:
            continue
        maker = next((c for c in all_commands() if name in {w.removeprefix("./").rstrip("/") for w in _written_by(c.text)}
                      and not instead(c.text) and "--resume" not in c.text), None)
        if maker is not None and _tokens(maker.text) != tokens:
            assert_clean(run_as_written(maker.text), f"{maker.text} (it makes {name} for {' '.join(tokens)})")


# Commands that cannot run as written here, and what runs instead. Keys are the command as written (collapsed
# spaces); values: ("refusal", FIX) = it must fail with one clear error (exit 2) naming FIX's first words, then FIX
# runs; ("tiny", FAMILY) = the same command at the stand-in's size; ("instead", ARGS, WHY) = what runs in its place.
def instead(text: str) -> tuple | None:
    if text.startswith("make demo"):
        return ("instead", ["hf-precision", "demo", "--out", "demo_output"], "what `make demo` runs after installing")
    if text.startswith("make test"):
        return ("skip-why", "the test suite this module belongs to; the Makefile target is checked below")
    if "scripts/build_shapes_model.py" in text:
        return ("skip-why", "retrains the shipped shapes model (minutes) and rewrites it; "
                            "tests/test_shapes_model.py checks the shipped fingerprint is the one its settings give")
    if text.startswith("source .venv/bin/activate"):
        return ("skip-why", "an interactive shell's environment; the Makefile's .venv is checked below")
    if text.startswith("torchrun") and " train " in text and "--shard" in text:
        return ("skip-why", "8 GPUs and a 12B model; the same program runs sharded over 2 CPU processes in "
                            "tests/test_train_shard.py::test_sharded_program_on_tiny_sdxl_t4")
    if "--context-parallel" in text:
        return ("refusal", None, "needs GPUs")  # torchrun of a CPU-only torch: the script's own refusal
    if text.startswith("accelerate launch") and "scripts/train.py" in text:
        return ("slow-accelerate-train",)
    if text.startswith("accelerate launch"):
        return ("slow-accelerate",)
    if "--device-map balanced" in text:
        return ("refusal", None, "no accelerator is visible")
    if "benchmarks/benchmark.py" in text:
        return ("slow-benchmark",)
    if "--device cuda" in text and ("generate" in text or " train " in text) and "--plan" not in text:
        return ("refusal", text.replace("--device cuda", "--layout t4 --device cpu"), "--layout t4 --device cpu")
    if re.search(r"--device mps(\s|$)", text):
        return ("refusal", text.replace("--device mps", "--layout m2-macos15 --device cpu"), "--layout m2-macos15")
    return None


def _video_family(tokens: list[str]) -> str | None:
    if "--plan" in tokens or "--demo" in tokens or "--model" not in tokens:
        return None
    family = STAND_INS.get(Path(tokens[tokens.index("--model") + 1]).name)
    # an image pipeline given to the video program (docs/video.md's error transcript) keeps its arguments
    return family if family in VIDEO_STAND_INS else None


VIDEO_STAND_INS = {"wan", "ltx", "cogvideox_i2v", "hunyuan_video", "svd"}


def _tokens(text: str) -> list[str]:
    tokens = shlex.split(text)
    if tokens[0].startswith(".venv/bin/"):
        tokens[0] = tokens[0][len(".venv/bin/"):]
    if tokens[0] == "accelerate" or tokens[0] == "torchrun":
        tokens = ["python", *tokens[tokens.index("scripts/generate_video.py"):]]
    return tokens


def run_as_written(text: str) -> Result:
    """Run a command of the docs here: in process, at the stand-in's size where it makes a video.

    Each command of the docs stands alone: an output an earlier one wrote under the same name (cat.mp4) is removed
    first, and what a command reads that another command of the docs makes (sdxl-tiny, islands.yaml) is made first.
    """
    ensure_stand_ins(text)
    tokens = _tokens(text)
    if "--out" in tokens and "--resume" not in tokens:
        target = Path(tokens[tokens.index("--out") + 1])
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.is_file():
            target.unlink()
    make_inputs(tokens)
    family = _video_family(tokens) if tokens[1:2] != ["train"] else None
    if family is not None and "--height" not in tokens:
        tokens += _tiny_size(family)
    if tokens[1:2] == ["generate"] and "--steps" not in tokens:  # 30 steps of fp16 on a CPU: minutes
        tokens += ["--steps", "2", "--height", "32", "--width", "32"]
    if tokens[1:2] == ["train"] and "--demo" not in tokens and "--plan" not in tokens:
        tokens = _tiny_training(tokens)
    return run_in_process(tokens)


def _tiny_training(tokens: list[str]) -> list[str]:
    """A README training run at the stand-in's size: 2 steps (3 when resumed), its resolution, 5 frames for clips.

    ``--resume latest`` first makes what it resumes: the same run, stopped after 2 steps with a checkpoint.
    """
    def without(flag: str, tokens: list[str]) -> list[str]:
        if flag not in tokens:
            return tokens
        i = tokens.index(flag)
        return tokens[:i] + tokens[i + 2:]

    for flag in ("--steps", "--frames", "--validation-every", "--validation-prompt"):
        tokens = without(flag, tokens)
    tokens += ["--resolution", "16" if "./clips" in tokens else "32"] + (["--frames", "5"] if "./clips" in tokens else [])
    if "--resume" in tokens:
        first = without("--resume", tokens)
        shutil.rmtree(first[first.index("--out") + 1], ignore_errors=True)
        assert_clean(run_in_process(first + ["--steps", "2", "--checkpoint-every", "1"]), " ".join(first))
        return tokens + ["--steps", "3"]
    return tokens + ["--steps", "2"]


def assert_clean(result: Result, text: str, code: int = 0) -> None:
    assert "Traceback" not in result.text, f"{text}\n{result.text[-4000:]}"
    assert result.code == code, f"{text}: exit {result.code}, the docs show {code}\n{result.text[-3000:]}"
