"""Every command prints only the project's lines on stderr (progress bars aside): what diffusers, transformers and
the quantization backends print while they import or load is held back (hf_precision/cli/quiet.py,
hf_precision/cli/common.py). One fresh process runs the README's kinds of command one after another, each with the
process's stderr (the file descriptor, where compiled code writes too) captured on its own: the first pays every
import, as a user's command does."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap

import pytest

from hf_precision.testing.cli_runs import ours
from launch import subprocess_env

DRIVER = textwrap.dedent("""
    import json, os, shlex, sys, tempfile
    from hf_precision.cli import main
    out = {}
    for cmd in sys.argv[1:]:
        sys.stderr.flush()
        with tempfile.TemporaryFile() as sink:
            saved = os.dup(2)
            os.dup2(sink.fileno(), 2)
            try:
                try:
                    code = main(shlex.split(cmd))
                except SystemExit as e:
                    code = e.code
                sys.stderr.flush()
            finally:
                os.dup2(saved, 2)
                os.close(saved)
            sink.seek(0)
            bnb = sys.modules.get("bitsandbytes")  # vars(): reading a name would run a deferred module's code
            out[cmd] = [code, sink.read().decode(errors="replace"), bnb is not None and "__version__" in vars(bnb)]
    print("JSON" + json.dumps(out))
""")

# The first command pays the imports of diffusers, transformers and every installed backend; a bad input must be
# one line; a quanto storage makes diffusers warn of its deprecation while loading; a train plan casts on meta (on
# the tiny folder: the same meta step as at SDXL's size, where its ladder of full-size steps took ~20 s of this test;
# the README's `train --plan` commands run at full size in tests/test_readme.py).
COMMANDS = [
    ("plan sdxl --device t4", 0),
    ("plan 42", 2),
    ("recipes", 0),
    ("show sdxl --device t4 --brief", 0),
    ("devices", 0),
    ("check {folder} --device cpu --layout t4", 0),
    ("check {folder} --device cpu --set unet.storage=quanto-int8", 0),
    ("generate {folder} --prompt cat --device cpu --layout t4 --steps 1 --height 32 --width 32 --out {out}/c.png", 0),
    ("train --plan --model {folder} --device t4 --max-memory 12GB", 0),
]
# bitsandbytes is imported by diffusers' quantizers on every model import but runs only when a component is stored
# in 4 or 8 bits (DEFERRED in hf_precision/cli/quiet.py): the commands above never run it, this one does. Training
# may: peft reads it whenever it makes a LoRA layer (peft/tuners/lora/bnb.py asks `is_bnb_4bit_available()`).
BNB_COMMAND = ("check {folder} --device cpu --set text_encoder_2.storage=nf4", 0)


@pytest.mark.slow
def test_every_command_writes_only_our_lines_to_stderr(saved_pipeline, tmp_path):
    pytest.importorskip("optimum.quanto")
    import importlib.util

    has_bnb = importlib.util.find_spec("bitsandbytes") is not None
    commands = COMMANDS + [BNB_COMMAND] * has_bnb
    folder = saved_pipeline("sdxl")
    cmds = [c.format(folder=folder, out=tmp_path) for c, _ in commands]
    proc = subprocess.run([sys.executable, "-c", DRIVER, *cmds], capture_output=True, text=True, timeout=900,
                          env=subprocess_env(cpu_only=True), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.split("JSON", 1)[1])
    for (cmd, code), text in zip(commands, cmds):
        got, err, bnb_ran = results[text]
        if not cmd.startswith("train"):
            assert bnb_ran == ((cmd, code) == BNB_COMMAND), f"{text}: bitsandbytes ran: {bnb_ran}"
        assert got == code, (text, got, err[-2000:])
        foreign = [line for line in re.split(r"[\r\n]", err) if not ours(line)]
        assert not foreign, f"{text}: lines on stderr that are not ours:\n" + "\n".join(foreign[:10])
        if code:
            assert len(err.strip().splitlines()) == 1 and err.startswith(f"hf-precision {cmd.split()[0]}: error:"), err
