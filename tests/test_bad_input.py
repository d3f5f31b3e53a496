"""Every kind of bad input the project knows about, in one place: each gives one clear error naming the culprit, fast,
with no traceback and no partial output file; and every fix an error suggests works when followed.

First one table (issue 16) of inputs given the way users give them; then, one test per kind of bad input to the
library, the message piece by piece: a ``RecipeError`` (a ``ValueError``) naming the source, the key path, the bad
value, what is allowed and the fix.

Rows: (kind of input, how it is given, expected error, words of the message that name the culprit). ``cli`` rows run
``hf_precision.cli.main(argv)`` in-process (stderr captured), ``video`` rows the video script's ``main`` (what
``scripts/generate_video.py`` runs), ``api`` rows call the library, ``sub`` rows run a real subprocess. Paths in
``{braces}`` are files of the ``env`` fixture, made once per module from one tiny saved SDXL pipeline.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

import hf_precision as hp
from hf_precision.errors import DamagedFileError, RecipeError
from hf_precision.recipe import devices
from hf_precision.recipe.overrides import Override, parse_set

from launch import subprocess_env

ROOT = Path(__file__).resolve().parents[1]
UNET_WEIGHTS = "unet/diffusion_pytorch_model.safetensors"


# ------------------------------------------------------------------------------------------------ the inputs


def _linked_copy(src: Path, dst: Path, real: tuple[str, ...] = ()) -> Path:
    """``dst`` with ``src``'s model_index.json and components; those in ``real`` copied, the rest symlinked."""
    dst.mkdir()
    for entry in src.iterdir():
        if entry.name in real or entry.is_file():
            (shutil.copytree if entry.is_dir() else shutil.copy)(entry, dst / entry.name)
        else:
            (dst / entry.name).symlink_to(entry, target_is_directory=True)
    return dst


def _edit_index(folder: Path, **changes) -> None:
    index = json.loads((folder / "model_index.json").read_text())
    for key, value in changes.items():
        if value is None:
            index.pop(key, None)
        else:
            index[key] = value
    (folder / "model_index.json").write_text(json.dumps(index))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def _garble(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:40] = b"x" * 32
    path.write_bytes(bytes(data))


YAML = {
    "bomb.yaml": "schema: 1\na: &a [x, x, x, x, x, x, x, x, x]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]\n"
                 "components: {unet: {keep_fp32: *b}}\n",
    "dup.yaml": "schema: 1\ncomponents:\n  vae: {dtype: float32}\n  vae: {dtype: float16}\n",
    "syntax.yaml": "schema: 1\ncomponents: {vae: {dtype: float32}\n",
    "list.yaml": "- schema: 1\n",
    "topkey.yaml": "schema: 1\ncomponets: {vae: {dtype: float32}}\n",
    "component.yaml": "schema: 1\ncomponents: {vea: {dtype: float32}}\n",
    "policykey.yaml": "schema: 1\ncomponents: {vae: {dtyp: float32}}\n",
    "dtype.yaml": "schema: 1\ncomponents: {vae: {dtype: float17}}\n",
    "half.yaml": "schema: 1\ncomponents: {vae: {dtype: half}}\n",
    "schema.yaml": "schema: 2\ncomponents: {vae: {dtype: float32}}\n",
    "noschema.yaml": "components: {vae: {dtype: float32}}\n",
    "tag.yaml": "schema: 1\ndevices: {cuda_sm99: {vae: {dtype: float32}}}\n",
    "keepstr.yaml": "schema: 1\ncomponents: {unet: {keep_fp32: time_embedding}}\n",
    "guard.yaml": "schema: 1\ncomponents: {vae: {nan_guard: 'yes'}}\n",
    "pyobj.yaml": "schema: 1\ncomponents: !!python/object/apply:os.system ['true']\n",
    "kind.yaml": "schema: 1\nkind: component\nmodel: x/y\npipelines: [StableDiffusionXLPipeline]\n"
                 "components: {unet: {use: unet.sdxl}}\n",
    "use.yaml": "schema: 1\nkind: pipeline\nmodel: x/y\npipelines: [StableDiffusionXLPipeline]\n"
                "components: {unet: {use: unet.sdxxl}}\n",
}


class Env:
    """Lazily made inputs: ``env.path(name)`` for every ``{name}`` a row uses."""

    def __init__(self, root: Path, sdxl: Path, pipe):
        self.root, self.sdxl, self.pipe = root, sdxl, pipe
        self.made: dict[str, Path] = {"sdxl": sdxl}

    def path(self, name: str) -> Path:
        if name not in self.made:
            self.made[name] = self._make(name)
        return self.made[name]

    def _make(self, name: str) -> Path:
        root = self.root
        if name in YAML:
            (root / name).write_text(YAML[name])
            return root / name
        if name == "binary.yaml":
            (root / name).write_bytes(b"\xff\xfe\x00schema")
            return root / name
        if name == "huge.yaml":
            (root / name).write_text("schema: 1\n# " + "x" * (2 << 20) + "\n")
            return root / name
        if name == "image":
            from PIL import Image

            Image.new("RGB", (16, 16)).save(root / "in.png")
            return root / "in.png"
        if name == "not-image":
            (root / "fake.png").write_text("not a png")
            return root / "fake.png"
        if name == "images":
            from PIL import Image

            (root / "images").mkdir()
            Image.new("RGB", (16, 16)).save(root / "images" / "a.png")
            return root / "images"
        if name == "afile":
            (root / "afile").write_text("x")
            return root / "afile"
        if name == "adir":
            (root / "adir.mp4").mkdir()
            return root / "adir.mp4"
        if name == "empty":
            (root / "empty").mkdir()
            return root / "empty"
        if name == "pickled":
            folder = root / "pickled"
            self.pipe.save_pretrained(folder, safe_serialization=False)
            return folder
        folder = root / name
        if name in ("truncated", "garbled", "zero"):
            _linked_copy(self.sdxl, folder, real=("unet",))
            {"truncated": _truncate, "garbled": _garble, "zero": lambda p: p.write_bytes(b"")}[name](folder / UNET_WEIGHTS)
        elif name == "vae-config":
            _linked_copy(self.sdxl, folder, real=("vae",))
            (folder / "vae" / "config.json").write_text('{"_class_name": "AutoencoderKL",,}')
        else:
            _linked_copy(self.sdxl, folder)
            index = folder / "model_index.json"
            if name == "index-json":
                index.write_text('{"_class_name": "StableDiffusionXLPipeline", ')
            elif name == "typo-class":
                _edit_index(folder, _class_name="StableDiffusionXLPipelinee")
            elif name == "custom-class":
                _edit_index(folder, _class_name="MyOwnCustomThing")
            elif name == "no-unet":
                _edit_index(folder, unet=None)
            else:
                raise KeyError(name)
        return folder

    def fill(self, text: str) -> str:
        return re.sub(r"\{([\w.-]+)\}", lambda m: str(self.path(m[1])), text)


@pytest.fixture(scope="module")
def env(saved_pipeline, tiny_pipes, tmp_path_factory):
    folder = saved_pipeline("sdxl")
    return Env(tmp_path_factory.mktemp("bad_input"), folder, tiny_pipes["sdxl"])


def _sdxl_pipe(env):
    import copy

    return copy.deepcopy(env.pipe)


# ------------------------------------------------------------------------------------------------ the table

T4 = ["--device", "t4"]
CASES = [
    # --- files: override and recipe YAML
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{bomb.yaml}"], RecipeError, "anchors and aliases are not allowed"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{dup.yaml}"], RecipeError, "duplicate key components.vae"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{syntax.yaml}"], RecipeError, "syntax.yaml"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{list.yaml}"], RecipeError, "expected a mapping"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{topkey.yaml}"], RecipeError, "did you mean 'components'"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{component.yaml}"], RecipeError, "did you mean 'vae'"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{policykey.yaml}"], RecipeError, "did you mean 'dtype'"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{dtype.yaml}"], RecipeError, "unknown dtype 'float17'"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{half.yaml}"], RecipeError, "'half' is ambiguous"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{schema.yaml}"], RecipeError, "schema: 2 is not supported"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{noschema.yaml}"], RecipeError, "schema: missing"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{tag.yaml}"], RecipeError, "unknown device tag 'cuda_sm99'"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{keepstr.yaml}"], RecipeError, "components.unet.keep_fp32"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{guard.yaml}"], RecipeError, "true or false"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{pyobj.yaml}"], RecipeError, "pyobj.yaml"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{binary.yaml}"], RecipeError, "binary.yaml"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{huge.yaml}"], RecipeError, "huge.yaml"),
    ("file", "cli", ["show", "sdxl", *T4, "--overrides", "{empty}/missing.yaml"], RecipeError, "missing.yaml"),
    ("file", "cli", ["show", "{kind.yaml}", *T4], RecipeError, "is not 'pipeline'"),
    ("file", "cli", ["show", "{use.yaml}", *T4], RecipeError, "did you mean 'unet.sdxl'"),
    # --- flags
    ("flag", "cli", ["show", "sdxl", *T4, "--set", "vae.dtype"], RecipeError, "expected component.key=value"),
    ("flag", "cli", ["show", "sdxl", *T4, "--set", "unet.dtype=fp17"], RecipeError, "unknown dtype 'fp17'"),
    ("flag", "cli", ["show", "sdxl", *T4, "--set", "vae.keep_fp32=[a"], RecipeError, "vae.keep_fp32=[a"),
    ("flag", "cli", ["show", "sdxl", *T4, "--set", "unet.dtype=bfloat16"], RecipeError, "bfloat16 cannot be computed"),
    ("flag", "cli", ["show", "sdxl", *T4, "--set", "vea.dtype=float32"], RecipeError, "did you mean 'vae'"),
    ("flag", "cli", ["show", *T4], RecipeError, "one of the two"),
    ("flag", "cli", ["check", "{sdxl}", "--device", "cpu", "--dtype", "float16"], RecipeError, "--dtype goes with --plain"),
    ("flag", "cli", ["check", "{sdxl}", "--plain", "--recipe", "sdxl"], RecipeError, "drop --recipe"),
    ("flag", "cli", ["check", "{sdxl}", "--plain", "--dtype", "float17"], RecipeError, "unknown dtype 'float17'"),
    ("flag", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{empty}/x.png", "--steps", "0"], RecipeError, "--steps 0"),
    ("flag", "video", ["--demo", "--height", "30"], RecipeError, "--height 30"),
    ("flag", "video", ["--demo", "--frames", "0"], RecipeError, "--frames 0"),
    ("flag", "video", ["--demo", "--model", "{sdxl}"], RecipeError, "drop --model"),
    ("flag", "video", ["--out", "{empty}/x.mp4"], RecipeError, "nothing to do: give --prompt TEXT, --prompts FILE (one per line) or --image"),
    ("flag", "video", ["--demo", "--offload", "bogus"], SystemExit, "invalid choice: 'bogus'"),
    # --- devices
    ("device", "cli", ["show", "sdxl", "--device", "tpu"], RecipeError, "'tpu'"),
    ("device", "cli", ["check", "{sdxl}", "--device", "t4"], RecipeError, "--layout t4 --device cpu"),
    ("device", "video", ["--demo", "--device", "t4", "--out", "{empty}/x.mp4"], RecipeError, "--device: 't4'"),
    ("device", "api", lambda env: hp.load_pipeline(env.sdxl, "t4"), RecipeError, "layout='t4', device='cpu'"),
    ("device", "api", lambda env: hp.load_pipeline(env.sdxl, {"vea": "cpu"}), RecipeError, "did you mean 'vae'"),
    ("device", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", layout={"vea": "t4"}), RecipeError,
     "layout mapping: unknown component(s) ['vea']"),
    ("device", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env), device="cuda:x"), RecipeError, "'cuda:x'"),
    ("device", "api", lambda env: hp.get_recipe("sdxl", device="cuda:sm=abc"), RecipeError, "cuda:sm=abc"),
    # --- folders
    ("folder", "cli", ["plan", "42"], RecipeError, "'42': no such folder, and not a recipe alias or a Hub id"),
    ("folder", "cli", ["plan", "sdxxl"], RecipeError, "did you mean 'sdxl'"),
    ("folder", "cli", ["plan", "{empty}/missing"], RecipeError, "missing': no such folder"),
    ("folder", "cli", ["check", "{empty}/missing"], RecipeError, "missing: no such folder"),
    ("folder", "cli", ["plan", "{empty}"], RecipeError, "no model_index.json"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("empty"), "cpu"), RecipeError, "no model_index.json"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("afile"), "cpu"), RecipeError, "afile': not a folder"),
    ("folder", "api", lambda env: hp.load_pipeline("sdxxl", "cpu"), RecipeError, "did you mean 'sdxl'"),
    ("folder", "api", lambda env: hp.load_pipeline("org/name with space", "cpu"), RecipeError, "not a recipe alias or a Hub id"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("no-unet"), "cpu"), RecipeError, "needs the components unet"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("typo-class"), "cpu"), RecipeError,
     "did you mean 'StableDiffusionXLPipeline'"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("custom-class"), "cpu"), RecipeError,
     "'MyOwnCustomThing' is not a diffusers pipeline class"),
    ("folder", "api", lambda env: hp.load_pipeline(env.path("index-json"), "cpu"), DamagedFileError, "not valid JSON"),
    ("folder", "cli", ["check", "{index-json}", "--device", "cpu"], RecipeError, "model_index.json: damaged file"),
    ("folder", "cli", ["plan", "{index-json}"], RecipeError, "model_index.json: damaged file"),
    ("folder", "video", ["--model", "{index-json}", "--image", "{image}", "--out", "{empty}/x.mp4"], RecipeError,
     "model_index.json: damaged file"),
    ("folder", "cli", ["show", "--class", "StableDiffusionXLPipelinee", *T4], RecipeError,
     "did you mean 'StableDiffusionXLPipeline'"),
    ("folder", "video", ["--model", "{sdxl}", "--image", "{image}", "--out", "{empty}/x.mp4"], RecipeError,
     "which is not a diffusers video pipeline"),
    # --- weights
    ("weights", "api", lambda env: hp.load_pipeline(env.path("truncated"), "cpu"), DamagedFileError, "(component unet): damaged file: truncated"),
    ("weights", "api", lambda env: hp.load_pipeline(env.path("garbled"), "cpu"), DamagedFileError, "header is not valid JSON"),
    ("weights", "api", lambda env: hp.load_pipeline(env.path("zero"), "cpu"), DamagedFileError, "only 0 bytes"),
    ("weights", "api", lambda env: hp.load_pipeline(env.path("vae-config"), "cpu"), DamagedFileError, "(component vae)"),
    ("weights", "api", lambda env: hp.load_pipeline(env.path("pickled"), "cpu"), RecipeError, "use_safetensors=False"),
    ("weights", "cli", ["check", "{truncated}", "--device", "cpu"], RecipeError, "(component unet): damaged file: truncated"),
    ("weights", "cli", ["check", "{garbled}", "--device", "cpu", "--plain"], RecipeError, "(component unet)"),
    # --- recipes
    ("recipe", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", recipe="sdxxl"), RecipeError, "did you mean 'sdxl'"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env), "svd"), RecipeError,
     "recipe 'svd' is for StableVideoDiffusionPipeline, not StableDiffusionXLPipeline"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env), "sd15", device="cpu"), RecipeError,
     "lists StableDiffusionXLPipeline: sdxl"),
    ("recipe", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", recipe="sd15"), RecipeError, "force=True"),
    ("recipe", "cli", ["plan", "sdxl", *T4, "--recipe", "svd"], RecipeError, "--force"),
    ("recipe", "cli", ["check", "{sdxl}", "--device", "cpu", "--recipe", "svd"], RecipeError,
     "recipe 'svd' is for StableVideoDiffusionPipeline"),
    ("recipe", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{empty}/x.png", "--recipe", "sd15"], RecipeError,
     "The recipe that lists StableDiffusionXLPipeline: sdxl"),
    ("recipe", "cli", ["show", "nosuch", *T4], RecipeError, "recipe 'nosuch': unknown"),
    ("recipe", "api", lambda env: hp.get_recipe("vae.nosuch"), RecipeError, "has no entry 'nosuch'"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env).unet), RecipeError, "name a component recipe"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env).unet, "sdxl"), RecipeError,
     "'sdxl' is a pipeline recipe; name a component recipe for a bare UNet2DConditionModel"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4",
                                                   overrides={"unet": {"keep_fp32": ["time_embeding"]}}),
     RecipeError, "'time_embeding': did you mean ['time_embedding'"),
    ("recipe", "cli", ["plan", "sdxl", *T4, "--set", "unet.keep_fp32=[nonexistent]"], RecipeError, "['nonexistent'] match no module"),
    ("recipe", "cli", ["plan", "sdxl", *T4, "--set", "vae.entry=[decoderr]"], RecipeError, "vae.entry: ['decoderr'] name no module"),
    ("recipe", "api", lambda env: hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4",
                                                   overrides={"unet": {"layerwise_skip": ["*nrom*"]}}),
     RecipeError, "unet.layerwise_skip: ['*nrom*'] name no module"),
    ("recipe", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", layout="t4", overrides={"vae": {"entry": ["decoderr"]}}),
     RecipeError, "did you mean ['decoder'"),
    ("recipe", "api", lambda env: hp.plan(str(env.path("typo-class")), "t4"), RecipeError,
     "'StableDiffusionXLPipelinee' is not a diffusers pipeline class"),
    # --- keywords
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", varient="fp16"), RecipeError, "did you mean 'variant'"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", overide={}), RecipeError, "did you mean 'overrides'"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", dtype=torch.int8), RecipeError, "dtype=torch.int8"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", torch_dtype="float17"), RecipeError, "torch_dtype='float17'"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", dtype={"vea": torch.float16}), RecipeError,
     "load_pipeline dtype=: components.vea: unknown component 'vea'"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", dtype=torch.float16, torch_dtype=torch.float16),
     RecipeError, "not both"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", trust_remote_code=True), RecipeError, "trust_remote_code is refused"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", pipeline_class="StableDiffusionXLPipelinee"),
     RecipeError, "pipeline_class='StableDiffusionXLPipelinee' is not a diffusers pipeline class; did you mean"),
    ("keyword", "api", lambda env: hp.load_pipeline(env.sdxl, "cpu", pipeline_class=42), RecipeError, "pipeline_class=42"),
    ("keyword", "api", lambda env: hp.get_recipe("sdxl", device="t4", overrides=42), RecipeError, "overrides: expected a YAML path"),
    # --- scripts: output paths are checked before any model is loaded or built
    ("script", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{afile}/x.png"], RecipeError, "afile is a file, not a folder"),
    ("script", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{empty}/x.bmp"], RecipeError, "unsupported image type '.bmp'"),
    # missing folders are created, as `video` does (issue 25); one under a file is refused before loading
    ("script", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{afile}/nodir/x.png"], RecipeError, "afile is a file, not a folder"),
    ("script", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{adir}"], RecipeError, "unsupported image type '.mp4'"),
    ("script", "cli", ["generate", "{sdxl}", "--prompt", "x", "--out", "{empty}"], RecipeError, "unsupported image type"),
    ("script", "video", ["--demo", "--out", "{afile}/x.mp4"], RecipeError, "afile is a file, not a folder"),
    ("script", "video", ["--demo", "--out", "{empty}/x.avi"], RecipeError, "unknown output type '.avi'"),
    ("script", "video", ["--demo", "--out", "{adir}"], RecipeError, "adir.mp4: is a folder"),
    ("script", "video", ["--demo", "--out", "{afile}"], RecipeError, "exists and is not a folder"),
    ("script", "video", ["--image", "{images}", "--out", "{afile}"], RecipeError, "afile: exists and is not a folder"),
    ("script", "video", ["--image", "{empty}/none.png", "--out", "{empty}/x.mp4"], RecipeError, "none.png: no such file"),
    ("script", "video", ["--image", "{not-image}", "--out", "{empty}/x.mp4"], RecipeError, "cannot read it as an image"),
    ("script", "video", ["--demo", "--out", "{empty}/x.gif", "--format", "mp4"], RecipeError, "--format is mp4"),
    ("script", "cli", ["video", "--demo", "--out", "{afile}/x.gif"], RecipeError, "afile is a file, not a folder"),
    ("script", "cli", ["demo", "--out", "{afile}"], RecipeError, "afile: exists and is not a folder"),
    ("script", "cli", ["demo", "--out", "{afile}/report"], RecipeError, "afile is a file, not a folder"),
    # --- real processes: the installed entry points print one line and exit 2
    ("script", "sub", [sys.executable, "-m", "hf_precision.cli", "plan", "42"], RecipeError, "'42': no such folder"),
    ("script", "sub", [sys.executable, str(ROOT / "scripts" / "generate_video.py"), "--demo", "--out", "{afile}/x.mp4"],
     RecipeError, "afile is a file, not a folder"),
]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _run(kind: str, spec, env: Env, capsys) -> tuple[int | None, str, BaseException | None]:
    """(exit code, stderr, exception) of one row; inputs are made before this is called."""
    if kind == "api":
        try:
            spec(env)
        except Exception as err:  # the table says which class
            return None, "", err
        return None, "", None
    argv = [env.fill(a) for a in spec]
    if kind == "sub":
        proc = subprocess.run(argv, capture_output=True, text=True, env=subprocess_env(), cwd=env.root, timeout=60)
        return proc.returncode, proc.stderr, None
    from hf_precision.cli import main as cli_main
    from hf_precision.cli.video import main as video_main

    capsys.readouterr()
    try:
        rc = cli_main(argv) if kind == "cli" else video_main(argv, prog="generate_video.py")
    except SystemExit as err:
        rc = err.code
    return rc, capsys.readouterr().err, None


@contextlib.contextmanager
def _counting_forwards():
    """Count every ``nn.Module`` forward in this process while the block runs."""
    import torch

    counter = types.SimpleNamespace(calls=0)

    def count(module, args):
        counter.calls += 1

    handle = torch.nn.modules.module.register_module_forward_pre_hook(count)
    try:
        yield counter
    finally:
        handle.remove()


def _ids() -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for group, kind, spec, _, words in CASES:
        base = f"{group}-{kind}-" + re.sub(r"\W+", "_", words)[:40].strip("_")
        seen[base] = seen.get(base, 0) + 1
        out.append(base if seen[base] == 1 else f"{base}-{seen[base]}")
    return out


def test_table_covers_every_kind():
    assert len(CASES) >= 60
    assert {c[0] for c in CASES} == {"file", "flag", "device", "folder", "weights", "recipe", "keyword", "script"}


@pytest.mark.parametrize("group,kind,spec,error,words", CASES, ids=_ids())
def test_bad_input(group, kind, spec, error, words, env, capsys):
    if kind != "api":
        for name in re.findall(r"\{([\w.-]+)\}", " ".join(map(str, spec))):
            env.path(name)  # made before the snapshot: only what the run writes counts as output
    if kind == "api" and group in ("folder", "weights", "script"):
        for name in ("empty", "afile", "no-unet", "typo-class", "custom-class", "index-json", "truncated", "garbled",
                     "zero", "vae-config", "pickled"):
            env.path(name)
    before = _tree(env.root)
    with _counting_forwards() as forwards:
        rc, stderr, err = _run(kind, spec, env, capsys)
    assert _tree(env.root) == before, "a failed run left output behind"
    # Bound the work, not the time (a busy CI host makes any time bound flaky): bad input is refused before any
    # model computes anything (a child process's forwards are not counted: its rows check wording and exit code).
    assert forwards.calls == 0, f"{forwards.calls} forward calls ran before the refusal"
    if kind == "api":
        assert isinstance(err, error), f"expected {error.__name__}, got {err!r}"
        msg = str(err)
        assert words in msg, msg
        assert "Traceback" not in msg and len(msg) < 2000
        return
    assert rc == 2, stderr
    assert "Traceback" not in stderr, stderr
    # what libraries log on the way (progress bars, deprecation warnings) is not the error
    noise = ("Warning", "warnings.warn", "torchvision", "it/s]", "%|")
    lines = [line for line in stderr.splitlines() if line.strip() and not any(n in line for n in noise)]
    if error is SystemExit:  # argparse: its usage line, then one error line
        assert lines[-1].count("error:") == 1 and words in lines[-1], stderr
    else:
        assert len(lines) == 1 and "error: " in lines[0] and words in lines[0], stderr


# ------------------------------------------------------------------------------------------ fixes, followed


def _follow(call, fix, expect_in_message: str):
    """Run ``call``, which must fail with a message holding ``expect_in_message``; then ``fix(message)`` must work."""
    with pytest.raises(RecipeError) as info:
        call()
    msg = str(info.value)
    assert expect_in_message in msg, msg
    return fix(msg)


def test_fix_recipe_name_is_followed(env):
    def fix(msg):
        name = re.search(r"did you mean '(\w+)'", msg)[1]
        return hp.load_pipeline(env.sdxl, "cpu", layout="t4", recipe=name)

    pipe = _follow(lambda: hp.load_pipeline(env.sdxl, "cpu", layout="t4", recipe="sdxxl"), fix, "did you mean")
    assert hp.applied(pipe).recipe.name == "sdxl"


def test_wrong_recipe_for_class_changes_nothing_and_both_fixes_work(env):
    pipe = _sdxl_pipe(env)
    before = {n: p.dtype for n, p in pipe.unet.named_parameters()}
    msg = _follow(lambda: hp.apply_recipe(pipe, "sd15", device="cpu", layout="t4"), lambda m: m, "force=True")
    # Without the check the sd15 recipe would have recast the SDXL UNet: it fits the class. Nothing moved.
    assert {n: p.dtype for n, p in pipe.unet.named_parameters()} == before
    named = re.search(r"pass recipe='(\w+)'", msg)[1]
    assert hp.apply_recipe(pipe, named, device="cpu", layout="t4").recipe.name == "sdxl"
    forced_pipe = _sdxl_pipe(env)
    forced = hp.apply_recipe(forced_pipe, "sd15", device="cpu", layout="t4", force=True)
    assert forced.recipe.name == "sd15" and "unet" in forced.modules
    # what the check prevented: the sd15 recipe does recast the SDXL UNet when forced
    assert forced_pipe.unet.conv_in.weight.dtype != before["conv_in.weight"]


def test_fix_keyword_is_followed(env):
    def fix(msg):
        name = re.search(r"did you mean '(\w+)'", msg)[1]
        return hp.load_pipeline(env.sdxl, "cpu", layout="t4", **{name: True})

    # plain diffusers only logs the misspelling and goes on
    from diffusers import DiffusionPipeline

    assert DiffusionPipeline.from_pretrained(env.sdxl, use_safetensor=True) is not None
    pipe = _follow(lambda: hp.load_pipeline(env.sdxl, "cpu", layout="t4", use_safetensor=True), fix, "use_safetensor")
    assert pipe.unet.dtype == torch.float16


def test_fix_pickle_folder_is_followed(env):
    folder = env.path("pickled")
    # plain diffusers' own flag fails on this folder: transformers refuses the safetensors file it wrote itself
    from diffusers import DiffusionPipeline

    with pytest.raises(OSError):
        DiffusionPipeline.from_pretrained(folder, use_safetensors=False)

    def fix(msg):
        assert "use_safetensors=False" in msg
        return hp.load_pipeline(folder, "cpu", layout="t4", use_safetensors=False)

    pipe = _follow(lambda: hp.load_pipeline(folder, "cpu", layout="t4"), fix, "unet")
    assert pipe.unet.dtype == torch.float16 and pipe.vae.dtype == torch.float32


def test_fix_class_name_is_followed(env):
    import diffusers

    def fix(msg):
        name = re.search(r"pipeline_class=diffusers\.(\w+)", msg)[1]
        return hp.load_pipeline(env.path("typo-class"), "cpu", layout="t4", pipeline_class=getattr(diffusers, name))

    pipe = _follow(lambda: hp.load_pipeline(env.path("typo-class"), "cpu", layout="t4"), fix, "_class_name")
    assert type(pipe).__name__ == "StableDiffusionXLPipeline"


def test_fix_no_recipe_for_class_is_followed(env):
    folder = str(env.path("typo-class"))

    def fix(msg):
        recipe = re.search(r"recipe='(\w+)', force=True", msg)[1]
        return hp.plan(folder, "t4", recipe=recipe, force=True)

    assert _follow(lambda: hp.plan(folder, "t4"), fix, "force=True")["unet"].compute == "float16"


def test_fix_keep_fp32_line_is_followed(env):
    from hf_precision.recipe.overrides import parse_set

    bad = {"unet": {"keep_fp32": ["time_embeding", "add_embedding"]}}

    def fix(msg):
        flag = re.search(r"--set (\S+)", msg)[1]
        return hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4", overrides=[bad, parse_set([flag])])

    record = _follow(lambda: hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4", overrides=bad), fix, "did you mean")
    assert record.islands["unet"] == ["time_embedding", "add_embedding"]


def test_fix_entry_name_is_followed(env):
    from hf_precision.recipe.overrides import parse_set

    bad = {"vae": {"entry": ["decoderr"]}}

    def fix(msg):
        return hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4", overrides=[bad, parse_set([re.search(r"--set (\S+)", msg)[1]])])

    record = _follow(lambda: hp.apply_recipe(_sdxl_pipe(env), device="cpu", layout="t4", overrides=bad), fix, "decoderr")
    assert record.hooked["vae"] == ["decoder"]


def test_fix_dtype_keyword_is_followed(env):
    def fix(msg):
        assert "dtype=torch.float16" in msg
        return hp.load_pipeline(env.sdxl, "cpu", layout="t4", dtype=torch.float16)

    pipe = _follow(lambda: hp.load_pipeline(env.sdxl, "cpu", layout="t4", dtype=torch.int8), fix, "dtype=torch.int8")
    assert pipe.vae.dtype == torch.float16  # the user's dtype wins over the recipe's fp32 VAE


def test_fix_preset_as_device_is_followed(env):
    def fix(msg):
        kwargs = dict(re.findall(r"(layout|device)='([\w:]+)'", msg))
        return hp.load_pipeline(env.sdxl, kwargs.pop("device"), **kwargs)

    pipe = _follow(lambda: hp.load_pipeline(env.sdxl, "t4"), fix, "layout='t4'")
    assert pipe.unet.dtype == torch.float16 and pipe.unet.device.type == "cpu"


def test_fix_unknown_component_is_followed():
    def fix(msg):
        name = re.search(r"did you mean '(\w+)'", msg)[1]
        return hp.get_recipe("sdxl", device="t4", overrides={name: {"dtype": "float32"}})

    assert _follow(lambda: hp.get_recipe("sdxl", device="t4", overrides={"vea": {"dtype": "float32"}}), fix,
                   "vea")["vae"].compute == "float32"


def test_show_says_it_did_not_check_patterns(capsys):
    from hf_precision.cli import main

    assert main(["show", "sdxl", *T4, "--brief", "--set", "unet.keep_fp32=[nonexistent]"]) == 0
    err = capsys.readouterr().err
    assert "not checked" in err and "nonexistent" in err and "hf-precision plan sdxl" in err
    # the command it names does check them
    assert main(["plan", "sdxl", *T4, "--set", "unet.keep_fp32=[nonexistent]"]) == 2
    assert "match no module" in capsys.readouterr().err
    # shipped patterns are checked by the tests against the real configs: no note for them
    assert main(["show", "sdxl", *T4, "--brief"]) == 0
    assert "not checked" not in capsys.readouterr().err


# ================================================================ library calls: the message, piece by piece


def raises(fn, *args, **kwargs) -> str:
    """Run ``fn`` expecting a RecipeError; return its message."""
    with pytest.raises(hp.RecipeError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    assert "Traceback" not in str(info.value)
    return str(info.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def as_set(*flags: str) -> dict:
    return Override("--set", parse_set(flags))


# ---------------------------------------------------------------------------------------- unknown names


def test_unknown_key_in_override_file(tmp_path):
    path = write(tmp_path, "typo.yaml", "schema: 1\ncomponents:\n  unet: {dtpye: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(str(path))
    assert "components.unet.dtpye" in msg and "unknown key 'dtpye'" in msg
    assert "allowed: dtype, dtypes, entry, keep_fp32" in msg
    assert "did you mean 'dtype'?" in msg


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "top.yaml", "schema: 1\ncomponent:\n  unet: {dtype: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "top.yaml: component: unknown key 'component'" in msg
    assert "allowed: components, devices, schema" in msg and "did you mean 'components'?" in msg


def test_unknown_key_in_a_pipeline_recipe_file(tmp_path):
    path = write(tmp_path, "arch.yaml", "schema: 1\nkind: pipeline\nlatent_from: unet\n"
                                        "components:\n  unet: {use: unet.sd15, dtpyes: [float16]}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "2 problems" in msg
    assert "arch.yaml: latent_from: unknown key 'latent_from'" in msg and "did you mean 'latents_from'?" in msg
    assert "arch.yaml: components.unet.dtpyes: unknown key 'dtpyes'" in msg and "did you mean 'dtypes'?" in msg


def test_unknown_component(tmp_path):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"vea": {"dtype": "float32"}})
    assert "overrides dict: components.vea: unknown component 'vea'" in msg
    assert "this recipe has " + ", ".join(sorted(hp.get_recipe("sdxl", device="t4").components)) in msg
    assert "did you mean 'vae'?" in msg
    path = write(tmp_path, "comp.yaml", "schema: 1\ncomponents:\n  transformer: {dtype: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "comp.yaml: components.transformer: unknown component 'transformer'" in msg


def test_unknown_component_in_a_device_section():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"devices": {"cuda": {"unet2": {"dtype": "float32"}}}})
    assert "devices.cuda.unet2: unknown component 'unet2'" in msg and "did you mean 'unet'?" in msg


def test_unknown_device_tag_in_a_device_section():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"devices": {"cuda-sm8": {"vae": {"dtype": "float32"}}}})
    assert "devices.cuda-sm8: unknown device tag 'cuda-sm8'" in msg
    assert "allowed: cpu, cpu-amx, cuda" in msg and "did you mean 'cuda-sm8" in msg


def test_unknown_recipe_name():
    msg = raises(hp.get_recipe, "sdxll", device="t4")
    assert "recipe 'sdxll': unknown; did you mean 'sdxl'?" in msg  # the suggestion first (issue 25)
    assert "pipeline recipes: " + ", ".join(hp.list_recipes("pipeline")) in msg


def test_unknown_component_recipe_entry():
    msg = raises(hp.get_recipe, "vae.sdxll", device="t4")
    assert "has no entry 'sdxll'" in msg and "vae.sdxl" in msg and "did you mean 'vae.sdxl'?" in msg
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"vae": {"use": "vea.kl"}})
    assert "components.vae.use: no component recipe file 'vea'" in msg and "did you mean 'vae'?" in msg


@pytest.mark.parametrize("bad, hint", [("fp17", "did you mean 'fp16'?"), ("bfloat61", "did you mean 'bfloat16'?"),
                                       ("half", "'half' is ambiguous: write float16 or bfloat16")])
def test_unknown_dtype_name(bad, hint):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"unet": {"dtype": bad}})
    assert f"overrides dict: components.unet.dtype: unknown dtype {bad!r}" in msg
    assert "allowed: float32, bfloat16, float16, float8_e4m3fn, float8_e5m2 (aliases: fp32" in msg
    assert hint in msg


def test_unknown_dtype_in_a_dtype_list(tmp_path):
    path = write(tmp_path, "list.yaml", "schema: 1\ncomponents:\n  unet: {dtypes: [float16, bf61]}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "components.unet.dtypes[1]: unknown dtype 'bf61'" in msg and "did you mean 'bf16'?" in msg


# --------------------------------------------------------------------------------------------- devices


@pytest.mark.parametrize("spec, why", [
    ("cuda:sm", "cannot read 'sm'"),
    ("tpu", "unknown device type 'tpu'"),
    ("mps:name=x", "a described MPS device needs its macOS version (mps:macos=13.6)"),
    ("cuda:name=Tesla T4", "a described CUDA device needs its compute capability"),
    ("cuda:sm=abc", "capability='abc' is not a version like 8.0"),
    ("cuda:sm75,ram=16", "unknown field 'ram' (fields: sm/cc, macos, name, flags)"),
])
def test_unknown_device_spec(spec, why):
    msg = raises(hp.get_recipe, "sdxl", device=spec)
    assert msg.startswith(f"device {spec!r}: {why}")
    # the fix: presets and how to describe a device
    assert "use a preset (" in msg and "t4" in msg and "m1-macos13" in msg
    assert "cuda:sm75" in msg and "mps:macos=13.6" in msg
    raises(hp.device_profile, spec)


class NoAcceleratorProbe(devices.SystemProbe):
    def count(self, kind: str) -> int:
        return 1 if kind == "cpu" else 0

    def cpu_flags(self) -> frozenset[str]:
        return frozenset({"avx2"})

    def cpu_name(self) -> str:
        return "Test CPU"


@pytest.fixture
def no_accelerator():
    previous = devices.set_probe(NoAcceleratorProbe())
    yield
    devices.set_probe(previous)


@pytest.mark.parametrize("spec", ["cuda", "cuda:1", "mps", "xpu"])
def test_absent_device_tells_how_to_describe_one(no_accelerator, spec):
    msg = raises(hp.get_recipe, "sdxl", device=spec)
    kind = spec.split(":")[0]
    assert f"device {spec!r}: this machine has no {kind} device (present: cpu)" in msg
    assert "to plan for one, name a preset or describe it" in msg
    assert "cuda:sm75" in msg and "mps:macos=13.6" in msg and "t4" in msg
    # issue 25: the fix for running is named (layout=), and only the devices that are here are called present
    assert "layout=" in msg and "--layout" in msg and "--device cpu" in msg
    assert "a present device (cpu)" in msg and "cuda:1, mps" not in msg
    # and the default falls back to the CPU instead of failing
    assert hp.device_profile(None).type == "cpu"


@pytest.mark.parametrize("value, bad", [("amx_bf16;avx2", "'amx_bf16;avx2'"), ("avx2,none", "'none'"),
                                        ("-avx2", "'-avx2'"), ("avx2,amx/bf16", "'amx/bf16'")])
def test_bad_cpu_flags_env_names_the_variable(monkeypatch, value, bad):
    monkeypatch.setenv(devices.CPU_FLAGS_ENV, value)
    devices.set_probe(None)
    try:
        msg = raises(hp.get_recipe, "sdxl", device="cpu")
    finally:
        monkeypatch.undo()
        devices.set_probe(None)
    assert msg.startswith(f"HF_PRECISION_CPU_FLAGS={value!r}: {bad} is not a CPU flag name")
    assert "allowed: flag names as /proc/cpuinfo spells them" in msg and "amx, avx512, avx2" in msg
    assert "HF_PRECISION_CPU_FLAGS=avx2,avx512f,avx512_bf16,amx_tile,amx_bf16" in msg and "unset it" in msg


@pytest.mark.parametrize("value", ["Xeon\nRapids", "x" * 201])
def test_bad_cpu_name_env_names_the_variable(value):
    msg = raises(devices.cpu_name_from_env, {devices.CPU_NAME_ENV: value})
    assert msg.startswith("HF_PRECISION_CPU_NAME=") and "one printable line of at most 200 characters" in msg


def test_dtype_the_device_cannot_compute_names_the_fix():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=as_set("vae.dtype=bf16"))
    assert msg.startswith("--set: components.vae.dtype: bfloat16 cannot be computed on cuda (Tesla T4, sm 7.5)")
    assert "allowed there: float32, float16" in msg
    assert "bf16 needs compute capability 8.0" in msg  # the device rule that says why
    assert "fix: --set vae.dtype=float32" in msg and "components: {vae: {dtype: float32}}" in msg


def test_every_uncomputable_dtype_is_reported_together():
    msg = raises(hp.get_recipe, "sdxl", device="gtx1660", overrides={"unet": {"dtype": "fp16"}, "vae": {"dtype": "bf16"}})
    assert msg.startswith("2 problems:")
    assert "components.unet.dtype: float16 cannot be computed on cuda (NVIDIA GeForce GTX 1660 SUPER, sm 7.5)" in msg
    # a Python caller's dict gets the keyword argument to pass, the flag after it
    assert "fix: overrides={'unet': {'dtype': 'float32'}} (CLI: --set unet.dtype=float32)" in msg
    assert "components.vae.dtype: bfloat16 cannot be computed" in msg and "fix: overrides={'vae': {'dtype': 'float32'}}" in msg


def test_storage_the_device_cannot_hold():
    # fp8 storage needs no fp8 hardware (cast per layer on use), but MPS has no float8 dtypes at all.
    msg = raises(hp.get_recipe, "sdxl", device="m1-macos13", overrides={"unet": {"storage": "fp8"}})
    assert "components.unet.storage: float8_e4m3fn cannot be stored on mps (Apple M1, macOS 13.6)" in msg
    assert "allowed there: float32, float16" in msg and "fix: overrides={'unet': {'storage': 'float16'}}" in msg


def test_uncomputable_dtype_in_a_device_section_names_its_source(tmp_path):
    path = write(tmp_path, "dev.yaml", "schema: 1\ndevices:\n  mps: {vae: {dtype: bfloat16}}\n")
    msg = raises(hp.get_recipe, "sdxl", device="m1-macos13", overrides=path)
    assert f"{path} devices.mps: components.vae.dtype: bfloat16 cannot be computed on mps (Apple M1, macOS 13.6)" in msg
    assert "fix: --set vae.dtype=float32" in msg
    assert hp.get_recipe("sdxl", device="m2-macos15", overrides=path)["vae"].compute == "bfloat16"


# ------------------------------------------------------------------------------------------ wrong types


@pytest.mark.parametrize("policy, path, allowed", [
    ({"keep_fp32": "time_embedding"}, "components.unet.keep_fp32", "a list of strings"),
    ({"nan_guard": "yes"}, "components.unet.nan_guard", "true or false"),
    ({"upcast_attention": 1}, "components.unet.upcast_attention", "true or false"),
    ({"dtypes": "float16"}, "components.unet.dtypes", "a non-empty list of dtype names"),
    ({"output": "latents"}, "components.unet.output", "input or compute or a dtype name"),
    ({"entry": [1, 2]}, "components.unet.entry", "a list of strings"),
])
def test_wrong_type(policy, path, allowed):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"unet": policy})
    (value,) = policy.values()
    assert f"overrides dict: {path}: bad value {value!r} ({type(value).__name__}); allowed: {allowed}" in msg


def test_wrong_type_of_a_whole_policy(tmp_path):
    path = write(tmp_path, "flat.yaml", "schema: 1\ncomponents:\n  vae: float32\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "flat.yaml: components.vae: expected a mapping of policy keys, got 'float32'" in msg
    assert "e.g. {dtype: float16}" in msg
    path = write(tmp_path, "list.yaml", "- vae\n- unet\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "list.yaml: expected a mapping" in msg and "got list" in msg


def test_wrong_type_of_overrides_argument():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=[42])
    assert "overrides: expected a YAML path, a dict or a list of them, got int 42" in msg


def test_wrong_types_in_yaml_file(tmp_path):
    path = write(tmp_path, "types.yaml", "schema: 1\ncomponents:\n  unet:\n    keep_fp32: time_embedding\n"
                                         "    nan_guard: \"yes\"\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith("2 problems:")
    assert "types.yaml: components.unet.keep_fp32: bad value 'time_embedding' (str); allowed: a list of strings" in msg
    assert "types.yaml: components.unet.nan_guard: bad value 'yes' (str); allowed: true or false" in msg


# ------------------------------------------------------------------------- several problems of one file


def test_all_errors_of_one_file_are_reported_together(tmp_path):
    path = write(tmp_path, "many.yaml",
                 "schema: 1\n"
                 "components:\n"
                 "  unet: {dtpye: float16, keep_fp32: time_embedding, nan_guard: \"yes\"}\n"
                 "  vea: {dtype: float32}\n"
                 "  vae: {dtype: fp17}\n"
                 "devices:\n"
                 "  cuda-sm8: {vae: {dtype: float32}}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.splitlines()[0] == "6 problems:"
    lines = msg.splitlines()[1:]
    assert len(lines) == 6 and all(line.startswith(f"  - {path}: ") for line in lines)
    for needle in ("components.unet.dtpye: unknown key", "components.unet.keep_fp32: bad value",
                   "components.unet.nan_guard: bad value", "components.vea: unknown component",
                   "components.vae.dtype: unknown dtype 'fp17'", "devices.cuda-sm8: unknown device tag"):
        assert sum(needle in line for line in lines) == 1, needle
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device="t4", overrides=path)
    assert len(info.value.problems) == 6


# ----------------------------------------------------------------------------------------- YAML itself


def test_malformed_yaml_reports_the_line(tmp_path):
    path = write(tmp_path, "broken.yaml",
                 "schema: 1\n"             # line 1
                 "components:\n"           # line 2
                 "  vae:\n"                # line 3
                 "    dtype: float32\n"    # line 4
                 "   storage: float32\n")  # line 5: bad indentation
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: line 5, column 4: malformed YAML")
    assert "fix the syntax there" in msg


def test_malformed_yaml_unclosed_bracket(tmp_path):
    path = write(tmp_path, "bracket.yaml", "schema: 1\ncomponents:\n  unet: {keep_fp32: [time_embedding}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert re.search(r"bracket\.yaml: line 3, column \d+: malformed YAML", msg), msg


def test_malformed_pipeline_recipe_file(tmp_path):
    path = write(tmp_path, "arch.yaml", "schema: 1\nkind: pipeline\ncomponents:\n  unet: {use: unet.sd15\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert str(path) in msg and "malformed YAML" in msg and re.search(r"line \d+, column \d+", msg)


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/object/apply:subprocess.call",
                                 "!!python/object/apply:subprocess.check_call"])
def test_yaml_tags_that_build_python_objects_are_refused(tmp_path, tag):
    marker = tmp_path / "pwned"
    command = f"touch {marker}"
    arg = f'["{command}"]' if tag.endswith("system") else f'[["touch", "{marker}"]]'
    path = write(tmp_path, "evil.yaml", f"schema: 1\ncomponents:\n  vae: {tag} {arg}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: line 3: refused YAML tag")
    assert "recipes are plain data" in msg and "remove tags such as !!python/object" in msg
    assert not marker.exists(), "the YAML tag ran a command"


def test_yaml_tag_in_a_set_flag_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    msg = raises(parse_set, [f'vae.dtype=!!python/object/apply:os.system ["touch {marker}"]'])
    assert "refused YAML tag" in msg and "--set" in msg
    assert not marker.exists()


def test_yaml_tag_in_a_pipeline_recipe_file_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, "arch.yaml", f'schema: 1\nkind: pipeline\nmodel: !!python/object/apply:os.system ["touch {marker}"]\n'
                                        "components:\n  unet: {use: unet.sd15}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "line 3: refused YAML tag" in msg
    assert not marker.exists()


# --------------------------------------------------------------------------------------- files, schema


def test_missing_override_file(tmp_path):
    path = tmp_path / "nope.yaml"
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: file not found") and "check the path" in msg


def test_missing_pipeline_recipe_file(tmp_path):
    path = tmp_path / "sub" / "gone.yaml"
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert msg.startswith(f"{path}: file not found")
    assert "relative paths are taken from" in msg


def test_unsupported_schema(tmp_path):
    path = write(tmp_path, "future.yaml", "schema: 2\ncomponents:\n  vae: {dtype: float32}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert f"{path}: schema: 2 is not supported (this hf_precision reads schema 1)" in msg
    assert "upgrade hf_precision or rewrite the file for schema 1" in msg


def test_unsupported_schema_of_a_pipeline_recipe(tmp_path):
    path = write(tmp_path, "future_arch.yaml", "schema: 2\nkind: pipeline\ncomponents:\n  unet: {use: unet.sd15}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "future_arch.yaml: schema: 2 is not supported" in msg


def test_missing_schema_key(tmp_path):
    path = write(tmp_path, "noschema.yaml", "components:\n  vae: {dtype: float32}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "noschema.yaml: schema: missing; add 'schema: 1' at the top" in msg


# ------------------------------------------------------------------------------------------- --set flags


@pytest.mark.parametrize("flag", ["vae.dtype", "vae=float32", "vae.dtype.x=float32", ".dtype=float32",
                                  "vae.=float32", "device.cuda.vae.dtype=float32"])
def test_bad_set_syntax(flag):
    msg = raises(parse_set, [flag])
    assert f"--set: {flag!r}: expected component.key=value (e.g. --set vae.dtype=float32)" in msg
    assert "devices.TAG.component.key=value" in msg


def test_bad_set_flags_are_reported_together():
    msg = raises(parse_set, ["vae.dtype", "unet=fp16", "unet.keep_fp32=[a"])
    assert msg.startswith("3 problems:")
    assert "'unet.keep_fp32=[a'" in msg and "malformed YAML" in msg


def test_bad_set_value_names_set_as_source():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=as_set("unet.dtpye=fp16", "vae.nan_guard=maybe"))
    assert msg.startswith("2 problems:")
    assert "--set: components.unet.dtpye: unknown key 'dtpye'" in msg and "did you mean 'dtype'?" in msg
    assert "--set: components.vae.nan_guard: bad value 'maybe' (str); allowed: true or false" in msg
