"""recipes/ stays at the top level of the repository AND ships inside the wheel: build it, install it elsewhere,
and prove every recipe is found from the installed copy."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Build outputs and local state that must not travel into the copy the wheel is built from.
IGNORE = shutil.ignore_patterns(".git", ".venv*", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                "demo_output", "bench_output", "tests", "*.pyc")


def _run(cmd: list[str], **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, **kwargs)
    assert proc.returncode == 0, f"{' '.join(map(str, cmd))} failed:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """Build the wheel from a copy of the repository (the checkout's own build/ and egg-info stay untouched)."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(REPO, src, ignore=IGNORE)
    _run([sys.executable, "-m", "pip", "wheel", str(src), "--no-deps", "--no-build-isolation", "--no-cache-dir",
          "-q", "-w", str(tmp / "dist")])
    (built,) = (tmp / "dist").glob("hf_precision-*.whl")
    return built


@pytest.mark.slow
def test_wheel_contains_every_recipe(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    recipes = sorted((REPO / "recipes").rglob("*.yaml"))
    assert len(recipes) >= 7  # devices.yaml, the pipeline recipes, the component recipes
    for path in recipes:
        inside = "hf_precision/recipes/" + path.relative_to(REPO / "recipes").as_posix()
        assert inside in names, f"{inside} is not in {wheel.name}"
    assert "hf_precision/recipes/devices.yaml" in names
    assert "hf_precision/recipes/components/vae.yaml" in names
    assert "hf_precision/py.typed" in names
    tiny = sorted((REPO / "hf_precision" / "testing" / "tiny").glob("*.yaml"))  # the tiny pipelines' rows
    assert len(tiny) >= 5 and all(p.relative_to(REPO).as_posix() in names for p in tiny), tiny
    shapes = REPO / "hf_precision" / "apps" / "shapes_sdxl"  # the demo's trained model: weights, configs, tokenizers
    for path in sorted(p for p in shapes.rglob("*") if p.is_file()):
        assert path.relative_to(REPO).as_posix() in names, f"{path.relative_to(REPO)} is not in the wheel"
    # every module of the package ships too, and no stray top-level recipes/ folder
    for module in sorted((REPO / "hf_precision").rglob("*.py")):
        if "__pycache__" not in module.parts:
            assert module.relative_to(REPO).as_posix() in names, f"{module.relative_to(REPO)} is not in the wheel"
    assert not [n for n in names if n.startswith("recipes/")]
    entry_points = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "hf-precision = hf_precision.cli:main" in zipfile.ZipFile(wheel).read(entry_points).decode()


@pytest.mark.slow
def test_installed_wheel_finds_every_recipe(wheel, tmp_path):
    site = tmp_path / "site"
    _run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--no-compile", "-q",
          "--target", str(site), str(wheel)])
    expected = {
        "pipeline": sorted(p.stem for p in (REPO / "recipes").glob("*.yaml") if p.stem not in ("devices", "denoisers")),
        "files": sorted(p.relative_to(REPO / "recipes").as_posix() for p in (REPO / "recipes").rglob("*.yaml")),
    }
    code = textwrap.dedent(f"""
        import json, sys
        from pathlib import Path
        import hf_precision
        from hf_precision.recipe.files import recipes_dir
        site = Path({str(site)!r}).resolve()
        assert Path(hf_precision.__file__).resolve().is_relative_to(site), hf_precision.__file__
        root = recipes_dir().resolve()
        assert root == site / "hf_precision" / "recipes", root
        names = hf_precision.list_recipes()
        resolved = {{}}
        for name in names:
            r = hf_precision.get_recipe(name, device="t4")
            assert r.policies, name
            assert all(p.recipe for p in r.policies), name
            resolved[name] = {{p.name: p.compute for p in r.policies}}
        files = sorted(p.relative_to(root).as_posix() for p in root.rglob("*.yaml"))
        print(json.dumps({{"pipeline": hf_precision.list_recipes("pipeline"), "all": names,
                          "resolved": resolved, "files": files, "torch": "torch" in sys.modules}}))
        # the demo's model, from the installed copy (after the torch check above)
        from hf_precision.apps.shapes_model import shipped_folder
        from diffusers import DiffusionPipeline
        shapes = shipped_folder().resolve()
        assert shapes == site / "hf_precision" / "apps" / "shapes_sdxl", shapes
        DiffusionPipeline.from_pretrained(str(shapes), local_files_only=True)
    """)
    # the wheel's copy first; what the caller's PYTHONPATH provides (dependencies installed beside) stays importable
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])),
           "HF_HUB_OFFLINE": "1"}
    env.pop("PYTHONSAFEPATH", None)
    proc = _run([sys.executable, "-c", code], cwd=tmp_path, env=env)
    out = json.loads(proc.stdout)
    assert out["pipeline"] == expected["pipeline"]
    assert out["files"] == expected["files"]
    assert set(out["resolved"]) == set(out["all"]) and len(out["all"]) > len(out["pipeline"])
    sdxl = out["resolved"]["sdxl"]
    assert {c: sdxl[c] for c in ("text_encoder", "text_encoder_2", "unet", "vae")} == {
        "text_encoder": "float16", "text_encoder_2": "float16", "unet": "float16", "vae": "float32"}
    assert out["torch"] is False
