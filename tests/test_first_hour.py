"""Issue 25: the dead ends a newcomer hit following README.md on a CPU-only machine, each reproduced and shown gone.

Every test here failed before its fix (the item number of the issue is in each docstring). The README itself is run
by tests/test_readme.py.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.cli import build_parser, main
from hf_precision.errors import RecipeError

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def sdxl_folder(tmp_path_factory):
    from hf_precision.testing import make_sdxl, save_pipeline

    return save_pipeline(make_sdxl(), tmp_path_factory.mktemp("sdxl"))


@pytest.fixture(scope="module")
def wan_folder(tmp_path_factory):
    """The tiny Wan of the tests: its transformer's rotary table holds 32 positions (rope_max_seq_len)."""
    from hf_precision.testing import make_pipeline, save_pipeline

    return save_pipeline(make_pipeline("wan"), tmp_path_factory.mktemp("wan"))


def test_the_script_without_the_package_says_how_to_get_it(tmp_path):
    """1. `python scripts/generate_video.py` outside .venv gave `ModuleNotFoundError: No module named 'hf_precision'`."""
    proc = subprocess.run([sys.executable, "-I", "-S", str(ROOT / "scripts" / "generate_video.py"), "--demo"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "source .venv/bin/activate" in proc.stderr and ".venv/bin/python" in proc.stderr


RUN_COMMANDS = ("generate", "video", "check", "calibrate", "demo")


@pytest.mark.parametrize("command", [*RUN_COMMANDS, "plan", "show"])
def test_every_command_takes_device_and_layout(command):
    """2. `generate --layout t4` was `unrecognized arguments` (only `check` had it): one rule on every command."""
    positional = {"generate": ["m", "--prompt", "x"], "check": ["m"], "calibrate": ["m"], "plan": ["m"],
                  "show": ["sdxl"], "video": [], "demo": []}[command]
    args = build_parser().parse_args([command, *positional, "--device", "cpu", "--layout", "t4"])
    assert args.device == "cpu" and args.layout == "t4"


@pytest.mark.parametrize("command", RUN_COMMANDS)
def test_device_help_says_where_it_runs(command, capsys):
    """2. `generate --help` said --device takes presets, which it refuses: --device is where it runs."""
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[command]  # noqa: SLF001  (argparse keeps no public map)
    device = next(a for a in sub._actions if "--device" in a.option_strings)
    said = device.help.split("--layout")[0]
    assert ("where" in said or "run on" in said) and "t4" not in said and "preset" not in said, (command, device.help)


def test_old_spellings_still_work(sdxl_folder):
    """`check --for` and `calibrate --device LAYOUT --run-on DEVICE` keep their meaning."""
    args = build_parser().parse_args(["check", str(sdxl_folder), "--device", "cpu", "--for", "t4"])
    assert args.layout == "t4"


def test_generate_runs_another_devices_layout_here_into_a_new_folder(sdxl_folder, tmp_path, capsys):
    """2 and 11. The dead end: --device t4 -> 'use --layout t4 --device cpu' -> unrecognized; and generate refused
    an output folder that does not exist yet, where video creates it."""
    rc = main(["generate", str(sdxl_folder), "--prompt", "x", "--device", "t4", "--out", str(tmp_path / "a.png")])
    err = capsys.readouterr().err
    assert rc == 2 and "--layout t4 --device cpu" in err
    out = tmp_path / "new" / "folder" / "a.png"
    rc = main(["generate", str(sdxl_folder), "--prompt", "x", "--layout", "t4", "--device", "cpu", "--steps", "1",
               "--height", "32", "--width", "32", "--out", str(out)])
    assert rc == 0 and out.is_file(), capsys.readouterr()
    assert f"wrote {out}" in capsys.readouterr().out


def test_wan_size_beyond_the_rotary_table_is_refused_before_loading(wan_folder, capsys):
    """3. A size beyond the transformer's rope_max_seq_len raised a 40-line torch traceback from --plan."""
    from hf_precision.cli.video import main as video_main

    rc = video_main(["--model", str(wan_folder), "--prompt", "a cat", "--out", "x.mp4", "--plan", "--device", "t4",
                     "--width", "832"], prog="generate_video.py")
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "--width 832" in err and "rope_max_seq_len" in err and "at most 512" in err
    # Without --width the defaults (the model card's 480x832) are capped to what this transformer can place.
    rc = video_main(["--model", str(wan_folder), "--prompt", "a cat", "--out", "x.mp4", "--plan", "--device", "t4",
                     "--max-memory", "8GB"], prog="generate_video.py")
    assert rc == 0 and "512x480, 81 frames" in capsys.readouterr().out


def test_plan_for_a_device_not_here_asks_for_its_budget(wan_folder, capsys):
    """`--plan --device t4` without --max-memory read the free memory of 't4': a torch traceback."""
    from hf_precision.cli.video import main as video_main

    rc = video_main(["--model", str(wan_folder), "--prompt", "a cat", "--out", "x.mp4", "--plan", "--device", "t4"],
                    prog="generate_video.py")
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err and "--max-memory SIZE" in err


def test_the_whole_runs_peak_is_at_least_its_peak_before_decoding(monkeypatch):
    """4. 'peak memory 459.2 MiB (... 482.4 MiB before decoding)': the per-phase figures reset the counter."""
    from hf_precision.apps.video import memory as meter

    readings = iter([482 * 2**20, 459 * 2**20])  # before decoding, then after a phase reset the high-water mark
    monkeypatch.setattr(meter, "peak_rss", lambda: next(readings))
    monkeypatch.setattr(meter, "rss", lambda: 0)
    memory = meter.PhaseMemory("cpu")
    memory.enter("denoising")
    memory.enter("VAE decode")
    before = memory.before_decode
    memory.finish()
    final, kind = memory.run_peak, memory.run_kind
    assert final >= before == 482 * 2**20 and kind == "peak RSS of the process"


def test_check_plain_suggests_flags_plain_takes(sdxl_folder, capsys):
    """7. `check --plain` suggested `--set ...`, then refused `--set` with `--plain`: follow each suggestion."""
    import re
    import shlex

    base = ["check", str(sdxl_folder), "--device", "cpu", "--plain", "--dtype", "unet=float16"]
    assert main(base) == 1
    out = capsys.readouterr().out
    assert "--set" not in out
    suggestions = re.findall(r"add `([^`]+)` to --plain", out.replace("\n      ", " "))
    assert suggestions, out
    for flags in suggestions:
        rc = main([*base, *shlex.split(flags)])
        err = capsys.readouterr().err
        assert rc != 2 and "error" not in err, (flags, err)


def test_removed_record_says_so(sdxl_folder):
    """8. After applied.remove(), print(applied) and hp.applied(pipe) still said 'entry hooks on (forward)'."""
    pipe = hp.load_pipeline(sdxl_folder, "cpu")
    record = hp.applied(pipe)
    assert "entry hooks on" in str(record)
    record.remove()
    assert hp.applied(pipe) is None
    assert "removed" in str(record) and "entry hooks on" not in str(record)
    assert not any(getattr(m, "_forward_pre_hooks", None) for m in [pipe.unet])


@pytest.mark.parametrize("value, near", [("amxx", "amx"), ("avx512bf16", "avx512_bf16"), ("avx2,amx_bf", "amx_bf16")])
def test_a_misspelled_cpu_flag_is_an_error(value, near):
    """10. HF_PRECISION_CPU_FLAGS=amxx was silent: the probe described a CPU without AMX."""
    from hf_precision.recipe.devices import cpu_flags_from_env

    with pytest.raises(RecipeError, match=rf"did you mean '{near}'"):
        cpu_flags_from_env({"HF_PRECISION_CPU_FLAGS": value})
    # real /proc/cpuinfo names the rules do not read are still taken as they are
    assert "avx512vl" in cpu_flags_from_env({"HF_PRECISION_CPU_FLAGS": "avx,avx512vl,sse4_2,avx512_vnni"})


@pytest.mark.parametrize("name", ["sdxll", "SDXL", "stable-diffusion-xl", "stabilityai/stable-diffusion-xl-base-1.0"])
def test_a_misspelled_recipe_leads_with_the_suggestion(name, capsys):
    """13. `show sdxll` printed ~2,000 characters with the suggestion at the end; SDXL and Hub ids got none."""
    assert main(["show", name, "--device", "t4"]) == 2
    err = capsys.readouterr().err
    head = err.split("pipeline recipes:")[0]
    assert "did you mean 'sdxl'?" in head, err
    assert "vae.sdxl," not in err and "unet.sdxl" not in err  # pipeline recipes only
    # the suggestion and the fixed text stay short; the list of pipeline recipes grows with every family shipped
    from hf_precision.recipe.catalog import list_recipes

    assert len(err) - len(", ".join(list_recipes("pipeline"))) < 300


def test_optional_dependency_notices_are_silenced():
    """14. torchvision-missing and local_dir_use_symlinks notices appeared on nearly every command."""
    import warnings

    from hf_precision.cli.common import quiet_optional_dependencies

    quiet_optional_dependencies()
    record = logging.makeLogRecord({"msg": "`CLIPImageProcessor` requires torchvision (not installed); falling back"})
    assert not logging.getLogger("transformers.utils.import_utils").filters[-1].filter(record)
    other = logging.makeLogRecord({"msg": "something the user should see"})
    assert logging.getLogger("transformers.utils.import_utils").filters[-1].filter(other)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("default")
        quiet_optional_dependencies()
        warnings.warn("The `local_dir_use_symlinks` argument is deprecated and ignored in `x`.")
    assert not seen
