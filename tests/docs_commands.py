"""The commands of docs/*.md and of the ``--help`` epilogs, and how each is checked: the machinery of
tests/test_docs_examples.py (tests/readme_commands.py has the README's, which this builds on)."""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import io
import re
import runpy
import shlex
import sys
from typing import Any

import hf_precision as hp

from readme_commands import (DOCS, ROOT, Block, Command, _tokens, all_commands, blocks, instead,  # noqa: E402
                             readme_commands, shell_commands)


# ------------------------------------------------------------------------------------------------ what runs


# One program under two names: the subcommand and the script share their parser and code (hf_precision/cli/).
PROGRAMS = {("python", "scripts/generate_video.py"): ["hf-precision", "video"],
            ("python", "scripts/train.py"): ["hf-precision", "train"]}


def _same(a: str, b: str) -> bool:
    """Two command lines that run the same thing (``./x`` and ``x``, ``videos/`` and ``videos``, ``hf-precision
    video`` and ``python scripts/generate_video.py``)."""
    def norm(text: str) -> list[str]:
        tokens = shlex.split(text)
        tokens[0] = tokens[0].removeprefix(".venv/bin/")
        tokens = PROGRAMS.get(tuple(tokens[:2]), tokens[:2]) + tokens[2:]
        return [t.removeprefix("./").rstrip("/") or t for t in tokens]
    return norm(a) == norm(b)


def _launched(text: str) -> list[str]:
    """The program and arguments a launcher (``accelerate launch``, ``torchrun``) starts; the command as is else."""
    tokens = shlex.split(text)
    while "=" in tokens[0] and not tokens[0].startswith("-"):  # OMP_NUM_THREADS=1 python ...
        tokens = tokens[1:]
    if tokens[0] in ("accelerate", "torchrun"):
        start = next(i for i, t in enumerate(tokens) if t.endswith(".py") or t == "-m")
        tokens = ["python", *tokens[start:]]
    if tokens[0].startswith(".venv/bin/"):
        tokens[0] = tokens[0][len(".venv/bin/"):]
    return tokens


@functools.lru_cache(maxsize=1)
def _readme_commands() -> tuple[Command, ...]:
    return tuple(readme_commands())


def _in_readme(text: str) -> Command | None:
    """The README command that runs ``text`` (as written, or what its entry in README's table runs instead)."""
    for c in _readme_commands():
        plan = instead(c.text)
        if _same(c.text, text) or (plan and plan[0] == "instead" and _same(shlex.join(plan[1]), text)):
            return c
    return None


SCRIPTS = ("benchmark.py", "bench_training.py", "video_memory.py")


@functools.lru_cache(maxsize=None)
def how(text: str) -> tuple | None:
    """How a command of the docs or of an epilog is checked here: None = run as written (test_doc_command);
    ("refusal", FIX, SAYS) = README's table: one clear error naming SAYS, then FIX runs; ("readme", WHERE) = the same
    command is one of the README's, test_readme runs it; ("parse", WHY) = its arguments parse with its program's own
    parser (test_doc_command_parses) and WHY names what runs it; ("heavy", WHY) = that, and test_doc_command_heavy
    runs it as written at the stand-in's size; ("heavy-test", WHY) = that, and the heavy test WHY names runs it; ("skip-why", WHY) = not a runnable command (WHY says where its program runs)."""
    if (same := _in_readme(text)) is not None:
        return ("readme", same.where)
    if re.search(r"(^|\s)\.\.\.(\s|$)", text) and not text.startswith(("accelerate", "torchrun")):
        return ("skip-why", "'...' stands for the arguments of the command above it in the docs, which runs here")
    if any(name in text for name in SCRIPTS):
        return ("heavy-test", "a benchmark (minutes of CPU): test_benchmark_script_commands runs it reduced")
    if "--plan" in text and "wan2.1-t2v-1.3b-configs" in text:
        return ("heavy-test", "the real Wan configs at 832x480, 81 frames (minutes of CPU): test_real_wan_plan_block")
    if text.startswith("hf-precision train --plan --model sdxl"):
        return ("heavy-test", "the real SDXL configs (a minute of CPU): "
                         "tests/test_docs.py::test_the_train_plan_the_docs_show_is_what_the_command_prints")
    if text.startswith("python -c") and "save_pipeline(" in text:
        return ("heavy", "builds and saves a model for the command after it (seconds of CPU): "
                         "test_doc_command_heavy runs it; here it compiles and its imports resolve")
    readme = instead(text)
    if readme is not None and readme[0] == "refusal":
        return readme
    if readme is None and (_works(text) or _reads_work(text)):
        return ("heavy", "a generation, training or calibration run, or what reads its output (seconds to a minute "
                         "of CPU each at the stand-in's size): test_doc_command_heavy runs it; the README runs the "
                         "same program")
    if readme is None or readme[0] == "instead":
        return readme
    if readme[0] == "skip-why" and not text.startswith(("torchrun", "accelerate")):
        return readme
    return ("parse", "a launch of several processes: test_readme's heavy accelerate tests, "
                     "tests/test_video_families.py and tests/test_train_shard.py run the program on 2 CPU processes")


def _works(text: str) -> bool:
    """Whether a command does a model's work (denoising, training, calibration), not a plan, a listing, a check or
    an input error: the costly kind, which runs in the heavy test (the README's commands run each program once)."""
    tokens = shlex.split(text)
    program = PROGRAMS.get(tuple(_launched(text)[:2]), tokens[:2])
    if any(": error: " in line for line in _expected(text)):
        return False
    if program[1:2] == ["video"] and "--plan" in tokens:  # at a model card's size: tens of seconds of CPU
        return "--height" not in tokens
    return program[1:2] in (["generate"], ["video"], ["train"], ["calibrate"], ["demo"], ["check"]) \
        and "--plan" not in tokens


def _reads_work(text: str) -> bool:
    """Whether a command reads what another command of the docs writes by doing a model's work (islands.yaml)."""
    mine = shlex.split(text)
    tokens = {t.removeprefix("./") for i, t in enumerate(mine) if i and not t.startswith("-") and mine[i - 1] != "--out"}
    for c in all_commands():
        out = shlex.split(c.text)
        if c.text != text and "--out" in out and out[out.index("--out") + 1].removeprefix("./") in tokens:
            if _works(c.text):
                return True
    return False


def _expected(text: str) -> list[str]:
    return next((c.expected for c in doc_commands() if c.text == text), [])


@functools.lru_cache(maxsize=1)
def doc_commands() -> tuple[Command, ...]:
    """The shell commands of docs/*.md (bash blocks, and ``$`` transcripts in plain and text blocks)."""
    return tuple(c for path in DOCS for b in blocks(path) if b.lang in ("bash", "", "text") for c in shell_commands(b))


# ------------------------------------------------------------------------------------------------ --help examples


def _parsers() -> dict[str, argparse.ArgumentParser]:
    """``hf-precision`` and each subcommand's parser, by the command line that prints its help."""
    from hf_precision.cli import build_parser

    top = build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return {"hf-precision --help": top, **{f"hf-precision {name} --help": p for name, p in sub.choices.items()}}


def epilog_examples() -> list[Command]:
    """The example command lines of every ``--help`` epilog (its ``examples:`` section, ``# comments`` dropped)."""
    out: list[Command] = []
    for where, parser in _parsers().items():
        epilog = (parser.epilog or "") % {"prog": parser.prog}
        section = epilog.split("examples:\n", 1)[1].split("\n\n", 1)[0] if "examples:\n" in epilog else ""
        for line in section.splitlines():
            if re.match(r"  \S", line):  # deeper lines continue the note of the example above
                text = re.sub(r"\s+#\s.*$", "", line).strip()
                if not any(_same(text, c.text) for c in out):  # `video` and generate_video.py share theirs
                    out.append(Command(text, where))
    return out


def _unique(cmds: list[Command]) -> list[Command]:
    """The commands, each run once: an epilog example the docs also show runs as the docs' command."""
    out: list[Command] = []
    for c in cmds:
        if not any(_same(c.text, o.text) and not c.expected for o in out):
            out.append(c)
    return out


COMMANDS = _unique([*doc_commands(), *epilog_examples()])


# The video program's default model (no --model) is a Hub id; offline, its error names this download folder.
DEFAULT_VIDEO_MODEL = "./stable-video-diffusion-img2vid-xt"


def _offline(text: str) -> str:
    """The command as it runs offline here: the video program's default model from its download folder."""
    tokens = _launched(text)
    program = PROGRAMS.get(tuple(tokens[:2]), tokens[:2])
    if program == ["hf-precision", "video"] and "--model" not in tokens and "--demo" not in tokens:
        return f"{text} --model {DEFAULT_VIDEO_MODEL}"
    return text


class _Parsed(Exception):
    pass


def parse_only(tokens: list[str]) -> None:
    """Run the program of a command line up to its argument parsing (its own parser, on these arguments): a flag
    the program does not have fails here as it would for the user (exit 2), nothing else runs."""
    original = argparse.ArgumentParser.parse_args

    def parse_then_stop(self, args=None, namespace=None):
        raise _Parsed(original(self, args, namespace))

    if tokens[:2] == ["python", "-c"]:  # a snippet: it compiles, and what it imports is there
        import importlib

        tree = ast.parse(tokens[2])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                module = importlib.import_module(node.module)
                missing = [a.name for a in node.names if not hasattr(module, a.name)]
                assert not missing, f"python -c: {node.module} has no {missing}"
        return
    tokens = _tokens(" ".join(shlex.quote(t) for t in tokens))
    if tokens[:3] == ["python", "-m", "hf_precision.cli"]:
        tokens = ["hf-precision", *tokens[3:]]
    argparse.ArgumentParser.parse_args = parse_then_stop
    try:
        if tokens[0] == "hf-precision":
            from hf_precision.cli import main

            main(tokens[1:])
        else:
            script = next(t for t in tokens if t.endswith(".py"))
            argv = tokens[tokens.index(script) + 1:]
            old_argv, sys.argv = sys.argv, [script, *argv]
            try:
                runpy.run_path(str(ROOT / script), run_name="__main__")
            finally:
                sys.argv = old_argv
    except _Parsed:
        return
    finally:
        argparse.ArgumentParser.parse_args = original
    raise AssertionError(f"{' '.join(tokens)}: the program ended without parsing its arguments")


# On this CPU-only machine: the fixes the library's errors name, followed when a statement raises one.
# A resolved recipe (recipe=tr...) keeps its layout: only the device changes.
FOLLOW = [('"cuda", recipe=', '"cpu", recipe='), ('"cuda")', '"cpu", layout="t4")'), ('"cuda",', '"cpu", layout="t4",'),
          ('device="cuda"', 'device="cpu"')]


def _names_the_fix(fixed: str, message: str) -> bool:
    return ("device='cpu'" if "recipe=" in fixed else "layout=") in message


def run_statements(block: Block, namespace: dict[str, Any], *, size: Any = (), follow: Any = None,
                   names: Any = _names_the_fix) -> str:
    """A Python block statement by statement: each runs (after SIZE's replacements: fewer steps), or raises one
    RecipeError naming the fix that ``follow`` (default FOLLOW) applies, and then runs. Returns what it printed."""
    printed = io.StringIO()
    for node in ast.parse(block.text).body:
        source = ast.get_source_segment(block.text, node)
        for old, new in size:
            source = source.replace(old, new)
        try:
            with contextlib.redirect_stdout(printed):
                exec(compile(source, block.where, "exec"), namespace)
            continue
        except hp.RecipeError as err:
            message = str(err)
        fixed = source
        for old, new in (FOLLOW if follow is None else follow):
            fixed = fixed.replace(old, new)
        assert fixed != source and names(fixed, message) and len(message.splitlines()) == 1, (source, message)
        with contextlib.redirect_stdout(printed):
            exec(compile(fixed, block.where, "exec"), namespace)
    return printed.getvalue()
