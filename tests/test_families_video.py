"""Video families (Wan, LTX-Video, CogVideoX, HunyuanVideo, Mochi, Allegro, Latte) load and run in every layout.

Tiny pipelines tagged ``video`` and ``dit`` in ``hf_precision.testing.PIPELINES`` are saved once per session and loaded back through
``load_pipeline(folder, "cpu", layout=L)``; dtypes are compared with an independently resolved plan for the same
layout, never with constants. Where plain diffusers fails on a layout a user picks (a half transformer next to an
fp32 text encoder and VAE), the failure is reproduced first. A planted fp16 overflow in the timestep MLP shows the
recipe's fp32 islands at work: all-fp16 gives inf/NaN frames, the recipe layout finite ones.
"""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

import hf_precision as hp
from checks import assert_finite, assert_plan_bytes, assert_plan_dtypes, group_id, same_load
from hf_precision.recipe.resolution import resolve
from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline, select
from hf_precision.testing.calibration import plant_fp16_overflow

pytestmark = pytest.mark.filterwarnings("ignore")

# One pipeline per recipe family (its text-to-video one) runs every layout; the other modes (i2v, vace, v2v,
# condition) run one half layout.
# A row tagged shares_layout (SkyReels-V2: Wan's parts and layout) brings no code path these forwards do not run.
FAMILIES = select("video", "dit", exclude="shares_layout")
MAIN = [name for name in FAMILIES if PIPELINES[name].mode == "t2v"]
MODES = [name for name in FAMILIES if name not in MAIN]
# cpu: this machine's rules (whatever they pick); t4: fp16 CUDA; a100: bf16 CUDA; m1-macos13: MPS without bf16.
LAYOUTS = ["cpu", "t4", "a100", "m1-macos13"]
# Plain diffusers with a half transformer and everything else fp32: these families fail (dtype mismatch); Wan and
# HunyuanVideo cast latents and embeddings to the transformer's dtype themselves (pipeline_wan.py:549,
# pipeline_hunyuan_video.py:602) and run.
PLAIN_FAILS = ["ltx", "cogvideox", "mochi", "allegro", "latte"]
MISMATCH = re.compile(r"dtype|type \(.*\) and bias type|Half|BFloat16|Float", re.I)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Factory: the saved tiny pipeline of a family, built and saved once per module."""
    folders = {}

    def get(name):
        if name not in folders:
            folders[name] = save_pipeline(make_pipeline(name), tmp_path_factory.mktemp(name))
        return folders[name]

    return get


def _configs(path):
    return {d.name: json.loads((d / "config.json").read_text()) for d in path.iterdir() if (d / "config.json").exists()}


def _run(name, pipe):
    spec = PIPELINES[name]
    return pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0))


def _load_and_check(name, folder, layout):
    spec = PIPELINES[name]
    path = folder(name)
    pipe = spec.ready(hp.load_pipeline(path, "cpu", layout=layout))
    expected = resolve(pipeline_class=spec.pipeline_class, devices="cpu", layout=layout, configs=_configs(path))
    assert hp.applied(pipe).recipe.name == expected.name == spec.recipe
    assert_plan_dtypes(pipe, expected)
    if layout in ("t4", "cpu"):  # plan bytes == every byte loaded, buffers included (rotary and position tables)
        assert_plan_bytes(pipe, path, layout)
    assert_finite(_run(name, pipe))
    return pipe, expected


@pytest.mark.parametrize("name, layouts", [(n, g) for n in MAIN for g in same_load(PIPELINES[n].recipe, LAYOUTS)],
                         ids=group_id)
def test_family_loads_and_runs_in_the_planned_dtypes(name, layouts, folder):
    """Each family under each layout of ``LAYOUTS``, one load and run per group of layouts whose recipes load the
    same (tests/checks.py ``same_load``: the T4's and the MPS Mac's fp16 are one); every layout's plan, resolved with
    the folder's configs, is checked on the loaded pipeline."""
    pipe, _ = _load_and_check(name, folder, layouts[0])
    spec, path = PIPELINES[name], folder(name)
    for other in layouts[1:]:
        assert_plan_dtypes(pipe, resolve(pipeline_class=spec.pipeline_class, devices="cpu", layout=other,
                                          configs=_configs(path)))


@pytest.mark.parametrize("name", MODES)
def test_other_modes_load_and_run_in_the_fp16_layout(name, folder):
    pipe, expected = _load_and_check(name, folder, "t4")
    assert any(p.compute == "float16" for p in expected.policies if getattr(pipe, p.name, None) is not None)


@pytest.mark.parametrize("name", MAIN)
def test_a_user_dtype_dict_is_honoured_where_plain_diffusers_fails(name, folder):
    """A from_pretrained-style per-component dtype dict: fp16 transformer, fp32 text encoder and VAE. Plain
    diffusers raises a dtype mismatch with it for the PLAIN_FAILS families; hf_precision honours it and runs."""
    from diffusers import DiffusionPipeline

    dtype = {"transformer": torch.float16, "text_encoder": torch.float32, "vae": torch.float32}
    if name in PLAIN_FAILS:
        plain = PIPELINES[name].ready(DiffusionPipeline.from_pretrained(folder(name), dtype=dtype))
        plain.set_progress_bar_config(disable=True)
        with pytest.raises(RuntimeError, match=MISMATCH):
            _run(name, plain)
    pipe = PIPELINES[name].ready(hp.load_pipeline(folder(name), "cpu", dtype=dtype))
    planned = hp.applied(pipe).recipe
    assert planned["transformer"].compute == "float16"
    assert planned["text_encoder"].compute == planned["vae"].compute == "float32"
    assert_plan_dtypes(pipe, planned)
    assert_finite(_run(name, pipe))


# Families with no fp16 layout: without bf16 their transformer computes fp32 (tests/test_resolve.py checks the plan).
# Sana-Video's attention normalizer overflows fp16; Kandinsky 5 and LTX-2 have no documented fp16 run
# (recipes/components/sana_video.yaml, kandinsky5.yaml, ltx2.yaml).
NO_FP16 = ("sana_video", "kandinsky5", "ltx2")


@pytest.mark.parametrize("name", [n for n in MAIN if n not in NO_FP16])
def test_planted_fp16_overflow_needs_the_recipes_fp32_islands(name):
    """All-fp16 overflows in the timestep MLP (inf/NaN frames); the recipe's own T4 layout (no override) computes the
    transformer in fp16, keeps that MLP fp32 and stays finite."""
    spec = PIPELINES[name]
    planted = plant_fp16_overflow(spec.make(0), name)
    naive = spec.ready(copy.deepcopy(planted).to(torch.float16))
    frames = _run(name, naive).frames
    assert not torch.isfinite(torch.as_tensor(frames, dtype=torch.float32)).all()

    hp.apply_recipe(planted, spec.recipe, "cpu", layout="t4")
    record = hp.applied(planted)
    assert record.recipe["transformer"].compute == "float16"
    assert any(spec.time_mlp == island or spec.time_mlp.startswith(island + ".")
               for island in record.islands["transformer"])
    assert_finite(_run(name, planted))


# Families whose authors' dtype is bf16: without bf16 the recipe's `devices:` sections pick an fp16 entry with more
# fp32 islands; with bf16 (and on CPU) the authors' entry, unchanged.
BF16_FAMILIES = ["ltx", "cogvideox_i2v", "hunyuan_video", "mochi", "allegro"]


@pytest.mark.parametrize("name", BF16_FAMILIES)
def test_bf16_families_get_an_fp16_layout_only_where_bf16_is_missing(name, folder):
    """Compared with the family's own component entry (the pipeline recipe's `components.transformer.use`, resolved
    alone): devices without bf16 compute fp16 with more fp32 islands; bf16 devices and CPUs are unchanged."""
    from hf_precision.recipe.files import read_yaml, recipes_dir
    from hf_precision.recipe.resolution import get_recipe

    spec = PIPELINES[name]
    configs = _configs(folder(name))
    entry = read_yaml(recipes_dir() / f"{spec.recipe}.yaml")["components"]["transformer"]["use"]
    for device, half in [("t4", True), ("v100", True), ("m1-macos13", True), ("a100", False), ("h100", False),
                         ("m2-macos14", False), ("cpu-avx2", False), ("cpu-amx", False)]:
        plan = get_recipe(spec.recipe, device=device, configs=configs)["transformer"]
        base = get_recipe(entry, device=device, configs={"video": configs["transformer"]})["video"]
        if half:
            assert plan.compute == "float16" and base.compute != "float16", (device, plan.compute, base.compute)
            covered = lambda b: any(b == i or b.startswith(i + ".") for i in plan.keep_fp32)
            assert all(map(covered, base.keep_fp32)) and len(plan.keep_fp32) > len(base.keep_fp32), plan.keep_fp32
        else:
            assert (plan.compute, plan.keep_fp32) == (base.compute, base.keep_fp32), device


def test_every_family_pipeline_class_is_in_its_recipe():
    """Each builder's class resolves to its family's named recipe (not a composed one)."""
    from hf_precision.recipe.catalog import recipe_for_class

    for spec in map(PIPELINES.get, FAMILIES):
        assert recipe_for_class(spec.pipeline_class) == spec.recipe


def _shipped_video_folders():
    from hf_precision.recipe.catalog import recipe_for_class
    from hf_precision.runtime.source import shipped_configs

    root = __import__("pathlib").Path(hp.__file__).parent / "model_configs"
    families = {PIPELINES[name].recipe for name in FAMILIES}
    found = []
    for source in sorted(root.glob("*/SOURCE.json")):
        cls = json.loads((source.parent / "model_index.json").read_text())["_class_name"]
        # a recipe's own folder (`plan <alias>`); further sizes (Wan 14B) are counted by hand in test_quant_memory.py
        if recipe_for_class(cls) in families and shipped_configs().get(recipe_for_class(cls)) == source.parent:
            found.append(source.parent)
    return found


@pytest.mark.parametrize("path", _shipped_video_folders(), ids=lambda p: p.name)
def test_shipped_video_configs_plan_offline_with_published_parameter_counts(path):
    """`hf-precision plan <alias> --device t4` builds the shipped folder on the meta device; each component's count
    matches SOURCE.json's published one (exact where the source is exact, else within 2%: counts derived from file
    sizes on the Hub are rounded), and each planned dtype is the T4 recipe's."""
    from hf_precision.diagnose.planner import plan
    from hf_precision.recipe.catalog import recipe_for_class

    source = json.loads((path / "SOURCE.json").read_text())
    cls = json.loads((path / "model_index.json").read_text())["_class_name"]
    alias = recipe_for_class(cls)
    result = plan(alias, device="t4")
    assert result.source.endswith(path.name) and result.pipeline == cls
    expected = hp.get_recipe(alias, device="t4")
    for name, planned in result.components.items():
        assert planned.params > 0 and planned.total_bytes > 0
        assert planned.compute == expected[name].compute
    assert source["published_params"], f"{path.name}: SOURCE.json publishes no parameter count"
    for component, published in source["published_params"].items():
        if published.get("part"):  # a figure for one part of the component: test_families_dit counts that part
            continue
        count = result.components[component].params
        if published.get("exact"):
            assert count == published["params"], f"{path.name}/{component}: {count:,} != {published['params']:,}"
        else:
            assert abs(count - published["params"]) <= 0.02 * published["params"], (
                f"{path.name}/{component}: {count:,} is more than 2% from {published['params']:,} ({published['source']})")
