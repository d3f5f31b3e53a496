"""A damaged model folder gives one ``DamagedFileError`` (a ``RecipeError``) naming the file, its component, what is
wrong and how to get a good copy: from ``load_pipeline``, ``plan``, ``hf-precision check`` and ``hf-precision plan``
(issue 16). Folders are tiny synthetic SDXL pipelines, damaged the way downloads and copies get damaged."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.errors import DamagedFileError
from hf_precision.recipe.files import damaged_file, download_command
from hf_precision.runtime.load import check_files
from hf_precision.runtime.stream import read_header

from launch import subprocess_env

UNET = "unet/diffusion_pytorch_model.safetensors"
TEXT_ENCODER = "text_encoder/model.safetensors"


def truncate(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return len(data) // 2, len(data)


def garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:40] = b"x" * 32  # the JSON header starts at byte 8
    path.write_bytes(bytes(data))


# name -> (file damaged, how, component named, words of the problem)
DAMAGE = {
    "index-json": ("model_index.json", lambda p: p.write_text('{"_class_name": "StableDiffusionXLPipeline", '),
                   None, "not valid JSON (line 1, column 46"),
    "index-not-object": ("model_index.json", lambda p: p.write_text("[1, 2]"), None, "expected a JSON object"),
    "index-empty": ("model_index.json", lambda p: p.write_text(""), None, "damaged file: empty"),
    "config-json": ("vae/config.json", lambda p: p.write_text('{"_class_name": "AutoencoderKL",,}'), "vae",
                    "not valid JSON"),
    "config-binary": ("unet/config.json", lambda p: p.write_bytes(b"\x00\xff\xfe" * 10), "unet", "not UTF-8"),
    "unet-truncated": (UNET, truncate, "unet", "truncated: "),
    "unet-header": (UNET, garble_header, "unet", "header is not valid JSON"),
    "unet-empty": (UNET, lambda p: p.write_bytes(b""), "unet", "only 0 bytes"),
    "unet-huge-length": (UNET, lambda p: p.write_bytes((10**12).to_bytes(8, "little") + p.read_bytes()[8:]), "unet",
                         "its first 8 bytes give a header of 1,000,000,000,000 bytes"),
    "unet-extra-bytes": (UNET, lambda p: p.write_bytes(p.read_bytes() + b"\0" * 16), "unet",
                         "16 bytes longer than its header describes"),
    "text-encoder-truncated": (TEXT_ENCODER, truncate, "text_encoder", "truncated: "),
}
JSON_DAMAGE = [k for k, v in DAMAGE.items() if v[0].endswith(".json")]


@pytest.fixture
def damaged(saved_pipeline, tmp_path):
    """Factory: ``damaged(kind)`` -> (folder copy with that damage, the damaged file)."""
    def make(kind: str) -> tuple[Path, Path]:
        folder = tmp_path / kind
        shutil.copytree(saved_pipeline("sdxl"), folder)
        rel, how, _, _ = DAMAGE[kind]
        how(folder / rel)
        return folder, folder / rel

    return make


def assert_names_it(msg: str, kind: str, path: Path, folder: Path) -> None:
    _, _, component, problem = DAMAGE[kind]
    assert msg.startswith(str(path)), msg
    if component:
        assert f"(component {component})" in msg
    assert problem in msg
    assert f"pipe.save_pretrained('{folder}')" in msg and download_command("ORG/NAME", folder) in msg
    assert "\n" not in msg and "Traceback" not in msg


# ------------------------------------------------------------------------------------------------- the API


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_load_pipeline_names_the_damaged_file(damaged, kind):
    folder, path = damaged(kind)
    with pytest.raises(DamagedFileError) as info:
        hp.load_pipeline(folder, "cpu")
    assert isinstance(info.value, hp.RecipeError) and info.value.path == str(path)
    assert_names_it(str(info.value), kind, path, folder)


@pytest.mark.parametrize("kind", ["unet-truncated", "text-encoder-truncated"])
def test_truncated_sizes_match_the_original_file(saved_pipeline, tmp_path, kind):
    folder = tmp_path / kind
    shutil.copytree(saved_pipeline("sdxl"), folder)
    path = folder / DAMAGE[kind][0]
    have, full = truncate(path)
    with pytest.raises(DamagedFileError) as info:
        hp.load_pipeline(folder, "cpu")
    assert f"({have:,} of {full:,} bytes)" in str(info.value)  # expected size computed from data_offsets


@pytest.mark.parametrize("kind", JSON_DAMAGE)
def test_plan_names_the_damaged_json(damaged, kind):
    folder, path = damaged(kind)
    with pytest.raises(DamagedFileError) as info:
        hp.plan(folder, device="t4")
    assert_names_it(str(info.value), kind, path, folder)


def test_plan_does_not_read_weights(damaged):
    folder, _ = damaged("unet-truncated")
    assert hp.plan(folder, device="t4")["unet"].params > 0  # plan needs configs only: a damaged weight is not its business


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_check_files_finds_each_damage(damaged, kind, saved_pipeline):
    check_files(saved_pipeline("sdxl"))  # the undamaged folder passes
    folder, path = damaged(kind)
    with pytest.raises(DamagedFileError) as info:
        check_files(folder)
    assert_names_it(str(info.value), kind, path, folder)


def test_without_the_check_the_errors_are_raw(damaged):
    # What users got before: a ValueError from inside torch (streaming) and a non-RecipeError from plain diffusers,
    # neither naming the file as damaged.
    from diffusers import DiffusionPipeline
    from safetensors import SafetensorError

    from hf_precision.runtime.stream import _mapped_tensors

    folder, path = damaged("unet-truncated")
    data = path.read_bytes()
    length = int.from_bytes(data[:8], "little")  # the header as it was read before: no check against the file
    header = json.loads(data[8:8 + length])
    header.pop("__metadata__", None)
    with pytest.raises(ValueError, match="buffer length") as raw:
        list(_mapped_tensors(path, 8 + length, header, lambda key, dtype: dtype))
    assert not isinstance(raw.value, hp.RecipeError)
    with pytest.raises((OSError, SafetensorError)) as plain:
        DiffusionPipeline.from_pretrained(folder)
    assert not isinstance(plain.value, hp.RecipeError)


def test_following_the_fix_loads(damaged, tiny_pipe):
    folder, _ = damaged("unet-truncated")
    with pytest.raises(DamagedFileError, match=r"save the pipeline again \(pipe\.save_pretrained"):
        hp.load_pipeline(folder, "cpu")
    tiny_pipe("sdxl").save_pretrained(folder)  # the fix the error gives
    pipe = hp.load_pipeline(folder, "cpu")
    assert pipe.unet is not None and hp.applied(pipe).recipe.name == "sdxl"


def test_hub_cache_files_get_the_exact_download_command(tmp_path):
    snapshot = tmp_path / "hub" / "models--org--tiny-sdxl" / "snapshots" / "abc123"
    (snapshot / "unet").mkdir(parents=True)
    (snapshot / "model_index.json").write_text("{}")
    err = damaged_file(snapshot / "unet" / "diffusion_pytorch_model.safetensors", "truncated")
    assert err.component == "unet"
    assert str(err).endswith(download_command("org/tiny-sdxl", None, "unet/diffusion_pytorch_model.safetensors"))
    assert "--force-download" in str(err) and "ORG/NAME" not in str(err)
    known = damaged_file(tmp_path / "folder" / "x.json", "not valid JSON", repo="org/name")
    assert str(known).endswith(download_command("org/name", tmp_path / "folder"))


def test_a_damaged_hub_cache_names_the_repo(saved_pipeline, tmp_path, monkeypatch):
    """``load_pipeline("org/tiny")`` offline, with a truncated weight in the cache: the fix is the exact command.

    In this process, the cache moved where huggingface_hub reads it at each call (``constants.HF_HUB_CACHE``, what
    ``snapshot_download`` resolves a repo id in): a fresh process for the environment variable cost ~10 s of imports."""
    from huggingface_hub import constants

    cache = tmp_path / "hub"
    repo = cache / "models--org--tiny"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    shutil.copytree(saved_pipeline("sdxl"), repo / "snapshots" / "abc123")
    truncate(repo / "snapshots" / "abc123" / TEXT_ENCODER)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(DamagedFileError) as err:
        hp.load_pipeline("org/tiny", "cpu")
    line = str(err.value)
    assert "(component text_encoder): damaged file: truncated" in line, line
    assert line.endswith(download_command("org/tiny", None, TEXT_ENCODER)), line


# ------------------------------------------------------------------------------------------------- the CLI


@pytest.mark.parametrize("kind", ["index-json", "config-json", "unet-truncated", "unet-header", "text-encoder-truncated"])
def test_cli_check_one_line_exit_2(damaged, kind, capsys):
    from hf_precision.cli import main

    folder, path = damaged(kind)
    assert main(["check", str(folder), "--device", "cpu"]) == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("hf-precision")]
    assert len(err) == 1 and err[0].startswith(f"hf-precision check: error: {path}")
    assert_names_it(err[0].removeprefix("hf-precision check: error: "), kind, path, folder)


def test_cli_check_plain_names_the_damaged_file(damaged, capsys):
    from hf_precision.cli import main

    folder, path = damaged("text-encoder-truncated")
    assert main(["check", str(folder), "--plain"]) == 2
    assert f"error: {path} (component text_encoder): damaged file: truncated" in capsys.readouterr().err


@pytest.mark.parametrize("kind", ["index-json", "config-json"])
def test_cli_plan_one_line_exit_2(damaged, kind):
    folder, path = damaged(kind)
    out = subprocess.run([sys.executable, "-m", "hf_precision.cli", "plan", str(folder), "--device", "t4"],
                         capture_output=True, text=True, timeout=300, env=subprocess_env())
    assert out.returncode == 2
    lines = [ln for ln in out.stderr.splitlines() if ln.strip() and not ln.startswith("[transformers]")]
    assert len(lines) == 1 and "Traceback" not in out.stderr, out.stderr
    assert lines[0].startswith(f"hf-precision plan: error: {path}")


# ------------------------------------------------------------------------------------ before heavy work


PREFLIGHT = [("check", "index-json"), ("check", "unet-truncated"), ("check", "unet-header"), ("check", "config-json"),
             ("generate", "text-encoder-truncated"), ("calibrate", "unet-truncated"), ("plan", "index-json"),
             ("plan", "config-json")]


@pytest.mark.parametrize("command, kind", PREFLIGHT, ids=[f"{c}-{k}" for c, k in PREFLIGHT])
def test_cli_names_the_damage_before_importing_torch(damaged, command, kind):
    # The work bound: the error comes before torch, diffusers or transformers is imported (importing them is most of
    # the seconds the error used to take), so no tensor, model or pipeline was touched on the way.
    folder, path = damaged(kind)
    argv = {"check": ["check", str(folder), "--device", "cpu"],
            "generate": ["generate", str(folder), "--prompt", "a cat", "--out", str(folder / "x.png"), "--device", "cpu"],
            "calibrate": ["calibrate", str(folder), "--device", "cpu"],
            "plan": ["plan", str(folder), "--device", "t4"]}[command]
    code = ("import sys\nfrom hf_precision.cli import main\nrc = main(sys.argv[1:])\n"
            "print('RC', rc, [m for m in ('torch', 'diffusers', 'transformers') if m in sys.modules])\n")
    out = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, env=subprocess_env(),
                         timeout=300)
    assert out.stdout.strip().splitlines()[-1] == "RC 2 []", out.stdout + out.stderr[-2000:]
    err = [ln for ln in out.stderr.splitlines() if ln.startswith("hf-precision")]
    assert len(err) == 1 and err[0].startswith(f"hf-precision {command}: error: {path}"), out.stderr[-2000:]
    assert_names_it(err[0].removeprefix(f"hf-precision {command}: error: "), kind, path, folder)


def test_cli_plan_still_plans_with_a_damaged_weight(damaged, capsys):
    # plan needs configs only: its early check reads no weight header (as hp.plan, test_plan_does_not_read_weights)
    from hf_precision.cli import main

    folder, _ = damaged("unet-truncated")
    assert main(["plan", str(folder), "--device", "t4"]) == 0
    assert "unet" in capsys.readouterr().out
