"""The ``hf-precision`` command line, run as a user runs it (a subprocess): recipes, devices, show, --help (each
subcommand's --help in this process)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.cli import build_parser

from launch import subprocess_env

_SCRIPT = Path(sys.executable).parent / "hf-precision"
CLI = [str(_SCRIPT)] if _SCRIPT.exists() else ([shutil.which("hf-precision")] if shutil.which("hf-precision")
                                               else [sys.executable, "-m", "hf_precision.cli"])

pytestmark = pytest.mark.slow


def cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=120, cwd=cwd,
                          env=subprocess_env(**(env or {})))


def ok(*args: str, **kwargs) -> str:
    proc = cli(*args, **kwargs)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stdout


def user_error(*args: str, **kwargs) -> str:
    """A bad input: exit 2, one message on stderr naming the command, no traceback, nothing on stdout."""
    proc = cli(*args, **kwargs)
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    return proc.stderr


def test_recipes(tmp_path):
    out = ok("recipes", cwd=tmp_path)
    # the shipped pipeline recipes, in name order (the list grows with every family added)
    assert "pipeline recipes:  " + ", ".join(sorted(json.loads(ok("recipes", "--json", cwd=tmp_path))["pipeline"])) in out
    assert {"dit", "pixart", "sd15", "sdxl", "svd"} <= set(json.loads(ok("recipes", "--json", cwd=tmp_path))["pipeline"])
    assert "component recipes:" in out and "vae.sdxl" in out and "vae.fp16_fix" in out
    data = json.loads(ok("recipes", "--json", cwd=tmp_path))
    assert "sdxl" in data["pipeline"] and "unet.sdxl" in data["component"]


def _in_process(capsys, *args: str) -> str:
    """``hf-precision ARGS`` through ``main`` in this process: exit 0, no traceback; its stdout."""
    from hf_precision.cli import main

    code = main(list(args))
    out, err = capsys.readouterr()
    assert code == 0 and "Traceback" not in err, err
    return out


@pytest.mark.probe
def test_devices(no_gpu, capsys):
    """In this process, GPUs hidden (``no_gpu``): the probe parametrisation runs it as 4 CPUs, and a process each
    (8 in all) cost ~20 s of imports; the console script's start-up is every other test's of this module."""
    out = _in_process(capsys, "devices")
    lines = out.splitlines()
    assert lines[0].startswith("this machine")
    for preset in ("cpu-avx2", "cpu-amx", "t4", "gtx1660", "a100", "h100", "m1-macos13", "m2-macos15", "arc-a770"):
        assert any(line.startswith(f"{preset} ") for line in lines), preset
    assert "t4            cuda (Tesla T4, sm 7.5)" in out
    assert "attention upcast" in out  # m2-macos15
    rows = {r["device"]: r for r in json.loads(_in_process(capsys, "devices", "--json"))}
    assert rows["t4"]["compute"] == ["float32", "float16"] and rows["t4"]["tags"] == ["cuda"]
    assert rows["a100"]["tags"] == ["cuda", "cuda-sm80"] and "bfloat16" in rows["a100"]["auto"]
    assert rows["m2-macos15"]["upcast_attention"] is True
    here = rows["this machine"]
    assert here["label"]
    assert ("this cpu" in rows) is not here["label"].startswith("cpu")  # a GPU machine lists its CPU too
    if here["label"].startswith("cpu"):  # CUDA is hidden above; an Apple or XPU machine lists its GPU here
        caps = hp.device_caps("cpu")   # read afresh, as the command read it
        assert (here["auto"], here["tags"]) == (list(caps.auto), list(caps.tags))


@pytest.mark.parametrize("flags, unet", [("amx", "bfloat16"), ("avx2,avx512f,avx512_bf16", "float32"), ("none", "float32")])
def test_commands_run_as_another_cpu(tmp_path, flags, unet):
    """HF_PRECISION_CPU_FLAGS reaches the command line: `show --device cpu` resolves as on that CPU."""
    env = {"HF_PRECISION_CPU_FLAGS": flags, "HF_PRECISION_CPU_NAME": ""}
    data = json.loads(ok("show", "sdxl", "--device", "cpu", "--json", cwd=tmp_path, env=env))
    assert data["components"]["unet"]["compute"] == unet
    assert data["device"]["present"] is True and data["device"]["name"].endswith("flags from HF_PRECISION_CPU_FLAGS")
    assert ("cpu-amx" in data["device_tags"]) is (flags == "amx")


def test_bad_cpu_flags_env_is_a_user_error(tmp_path):
    err = user_error("devices", cwd=tmp_path, env={"HF_PRECISION_CPU_FLAGS": "amx_bf16;avx2"})
    assert err.startswith("hf-precision devices: error: HF_PRECISION_CPU_FLAGS='amx_bf16;avx2': 'amx_bf16;avx2' is "
                          "not a CPU flag name")


def test_show_table(tmp_path):
    out = ok("show", "sdxl", "--device", "t4", cwd=tmp_path)
    lines = out.splitlines()
    assert lines[0].startswith("recipe sdxl for cuda (Tesla T4, sm 7.5)")
    assert lines[1].split()[:3] == ["component", "storage", "compute"]
    rows = {line.split()[0]: line.split()[1:4] for line in lines[3:7]}
    assert rows == {"text_encoder": ["float16"] * 3, "text_encoder_2": ["float16"] * 3, "unet": ["float16"] * 3,
                    "vae": ["float32"] * 3}
    assert "time_embedding, add_embedding" in out
    assert "decisions:" in out and "vae.compute = float32:" in out
    brief = ok("show", "sdxl", "--device", "t4", "--brief", cwd=tmp_path)
    rows = len(hp.get_recipe("sdxl").components)  # title, header and rule lines, then one row per component
    assert "decisions:" not in brief and len(brief.strip().splitlines()) == 3 + rows


def test_show_json(tmp_path):
    data = json.loads(ok("show", "sdxl", "--device", "a100", "--json", cwd=tmp_path))
    assert data["name"] == "sdxl" and data["device"]["capability"] == "8.0"
    vae = data["components"]["vae"]
    assert (vae["compute"], vae["storage"], vae["handed_over"]) == ("bfloat16", "bfloat16", "float32")
    assert data["components"]["unet"]["compute"] == "float16"
    assert data["components"]["unet"]["keep_fp32"] == ["time_embedding", "add_embedding"]


def test_show_with_overrides_and_set(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("schema: 1\ncomponents:\n  vae: {dtype: float32}\n  unet: {dtype: float32}\n")
    data = json.loads(ok("show", "sdxl", "--device", "a100", "--overrides", str(path), "--set", "unet.dtype=bf16",
                         "--set", "unet.keep_fp32=[time_embedding]", "--json", cwd=tmp_path))
    assert data["components"]["vae"]["compute"] == "float32"     # file
    assert data["components"]["unet"]["compute"] == "bfloat16"   # --set wins over the file
    assert data["components"]["unet"]["keep_fp32"] == ["time_embedding"]
    assert data["sources"] == ["recipes/sdxl.yaml", str(path), "--set"]


@pytest.mark.parametrize("device, vae, unet", [("cuda:sm=8.0,name=GeForce GTX 1660", "bfloat16", "bfloat16"),
                                               ("cuda:sm75", "float32", "float16"),
                                               ("mps:macos=13.6", "float32", "float16"),
                                               ("mps:macos=15.1", "bfloat16", "float16")])
def test_show_describes_a_device_that_is_not_present(tmp_path, device, vae, unet):
    data = json.loads(ok("show", "sdxl", "--device", device, "--json", cwd=tmp_path))
    assert data["device"]["present"] is False
    assert (data["components"]["vae"]["compute"], data["components"]["unet"]["compute"]) == (vae, unet)


def test_show_component_recipe_and_user_file(tmp_path):
    data = json.loads(ok("show", "mmdit.flux", "--device", "h100", "--json", cwd=tmp_path))
    assert data["components"]["mmdit"]["compute"] == "bfloat16"
    arch = tmp_path / "arch.yaml"
    arch.write_text("schema: 1\nkind: pipeline\nlatents_from: unet\ncomponents:\n  unet: {use: unet.sd15}\n"
                    "  vae: {use: vae.sdxl}\n")
    data = json.loads(ok("show", "arch.yaml", "--device", "t4", "--json", cwd=tmp_path))
    assert data["components"]["unet"]["compute"] == "float16" and data["components"]["vae"]["compute"] == "float32"


def test_show_uncomputable_dtype_exits_2_with_the_fix(tmp_path):
    err = user_error("show", "sdxl", "--device", "t4", "--set", "vae.dtype=bf16", cwd=tmp_path)
    assert err.startswith("hf-precision show: error: --set: components.vae.dtype: bfloat16 cannot be computed on "
                          "cuda (Tesla T4, sm 7.5)")
    assert "fix: --set vae.dtype=float32" in err


@pytest.mark.parametrize("args, needle", [
    (("show", "sdxll", "--device", "t4"), "recipe 'sdxll': unknown; did you mean 'sdxl'?"),
    (("show", "sdxl", "--device", "tpu"), "unknown device type 'tpu'"),
    (("show", "sdxl", "--device", "t4", "--set", "vae.dtype"), "expected component.key=value"),
    (("show", "sdxl", "--device", "t4", "--set", "vea.dtype=fp32"), "did you mean 'vae'?"),
    (("show", "sdxl", "--device", "t4", "--overrides", "missing.yaml"), "missing.yaml: file not found"),
    (("show", "sdxl", "--device", "cuda"), "this machine has no cuda device (present: cpu)"),
])
def test_show_bad_input_exits_2(args, needle, no_gpu, capsys, monkeypatch, tmp_path):
    """In this process, GPUs hidden (``no_gpu``): exit 2, one line of ours, nothing on stdout. A process each cost
    ~6 s of imports; a refusal from a real process is test_show_reports_every_problem_of_a_file's and
    test_bad_cpu_flags_env_is_a_user_error's, and the one line on a fresh process's stderr
    tests/test_stderr_ours.py's."""
    from hf_precision.cli import main

    monkeypatch.chdir(tmp_path)
    try:
        code = main(list(args))
    except SystemExit as exit_:  # argparse's own refusals exit
        code = exit_.code
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and "Traceback" not in err, (code, out, err)
    assert err.startswith("hf-precision show: error: ") and len(err.strip().splitlines()) == 1, err
    assert needle in err


def test_show_reports_every_problem_of_a_file(tmp_path):
    path = tmp_path / "many.yaml"
    path.write_text("schema: 1\ncomponents:\n  unet: {dtpye: float16, nan_guard: 'yes'}\n  vea: {dtype: float32}\n")
    err = user_error("show", "sdxl", "--device", "t4", "--overrides", str(path), cwd=tmp_path)
    assert "3 problems:" in err and err.count(str(path)) == 3


def _subcommands() -> list[str]:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return sorted(sub.choices)


def test_known_subcommands_exist():
    assert {"recipes", "devices", "show"} <= set(_subcommands())


@pytest.mark.parametrize("command", _subcommands())
def test_help_of_every_subcommand(command, capsys):
    """In this process (the console script's start is test_top_level_help's; a process each was ~1 s apiece)."""
    from hf_precision.cli import main

    with pytest.raises(SystemExit) as done:
        main([command, "--help"])
    captured = capsys.readouterr()
    assert done.value.code == 0 and "Traceback" not in captured.err, captured.err
    assert captured.out.startswith(f"usage: hf-precision {command}")


def test_top_level_help(tmp_path):
    out = ok("--help", cwd=tmp_path)
    assert "usage: hf-precision" in out and "examples:" in out
    for command in _subcommands():
        assert command in out
    proc = cli(cwd=tmp_path)  # no command: help and exit 2
    assert proc.returncode == 2 and "usage: hf-precision" in proc.stdout
