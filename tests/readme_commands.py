"""Reading the fenced blocks and shell commands of README.md and docs/video.md, and running commands with their
output captured: the machinery of tests/test_readme.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
import subprocess
import sys
import traceback
from pathlib import Path

from launch import ROOT, subprocess_env

README = ROOT / "README.md"
VIDEO_DOC = ROOT / "docs" / "video.md"

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
        joined = re.sub(r"\\\n\s*", " ", block.text)
        return [Command(re.sub(r"\s+#\s.*$", "", line).strip(), block.where)
                for line in joined.splitlines() if shlex.split(line, comments=True)]
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


def readme_commands() -> list[Command]:
    cmds = [c for b in blocks(README) if b.lang in ("bash", "") for c in shell_commands(b)]
    per_card = next(b for b in blocks(VIDEO_DOC) if b.lang == "bash" and "# 8 GB" in b.text)
    return cmds + shell_commands(per_card)


def _norm(text: str) -> str:
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    text = re.sub(r"[-+]?\d[\d,]*(\.\d+)?(e[-+]?\d+)?", "#", text)
    return " ".join(text.split())


def missing_lines(expected: list[str], output: str) -> list[str]:
    """The README's shown lines (pieces between ``...``) that the output does not contain, numbers set free."""
    have = _norm(output)
    missing = []
    for line in expected:
        for piece in _norm(line).split("..."):
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
