"""UNet image and video families: every tiny pipeline tagged ``unet`` (the ``core`` ones aside: tests/layouts.py has
them) in ``hf_precision.testing.PIPELINES`` is saved once, loaded
back offline through ``load_pipeline`` under the layouts of a CPU, a T4 (fp16), an A100 (bf16) and an MPS Mac, and run
for two steps; its component dtypes must be what an independent resolution of the family's recipe plans. A layout a
user writes by hand (fp16 denoiser, everything else fp32) fails in plain diffusers and runs through hf_precision.
"""

from __future__ import annotations

import copy
import warnings

import numpy as np
import pytest
import torch

import hf_precision as hp
from checks import assert_plan_bytes, assert_plan_dtypes, group_id, same_load
from hf_precision.recipe import recipe_for_class
from hf_precision.runtime.source import models_of_pipeline
from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline, select

LAYOUTS = ("cpu", "t4", "a100", "m1-macos13")
# What torch says when two dtypes meet in one op (CPU wording; linear, conv and matmul variants).
DTYPE_MISMATCH = r"same dtype|Input type \(.*\) and bias type|expected (scalar type|m1 and m2 to have the same dtype)"


pytestmark = pytest.mark.usefixtures("one_thread")
FAMILIES = select("unet", exclude="core")


_BUILT: dict = {}


def _built(family: str):
    """A fresh copy of the family's tiny pipeline, built once per module."""
    if family not in _BUILT:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _BUILT[family] = make_pipeline(family)
    return copy.deepcopy(_BUILT[family])


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """``saved(family)``: the family's tiny pipeline saved once per module (float32 safetensors)."""
    folders = {}

    def get(family: str):
        if family not in folders:
            folders[family] = save_pipeline(_built(family), tmp_path_factory.mktemp(family))
        return folders[family]

    yield get
    _BUILT.clear()


def _load(family: str, folder, **kwargs):
    """``load_pipeline`` for folders diffusers can load; Stable Cascade's decoder folder it cannot (its
    model_index names ``PaellaVQModel``, which ``diffusers`` does not export), so that one is built and applied."""
    spec = PIPELINES[family]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if spec.loads:
            dtype = kwargs.pop("dtype", None)
            return hp.load_pipeline(folder, "cpu", **({"dtype": dtype} if dtype else {}), **kwargs)
        pipe = _built(family)
        hp.apply_recipe(pipe, spec.recipe, device="cpu", layout=kwargs.get("layout"), overrides=kwargs.get("overrides"))
        return pipe


def _run(family: str, pipe) -> np.ndarray:
    spec = PIPELINES[family]
    result = spec.result(pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0)))
    arr = result.float().cpu().numpy() if isinstance(result, torch.Tensor) else np.asarray(result, dtype=np.float32)
    assert arr.size > 0 and np.isfinite(arr).all(), f"{family}: {(~np.isfinite(arr)).sum()} non-finite values"
    return arr


def _denoiser(family: str) -> str:
    return hp.get_recipe(PIPELINES[family].recipe).denoiser


def test_every_family_has_a_named_recipe_that_plans_all_its_models():
    for family in FAMILIES:
        spec = PIPELINES[family]
        assert recipe_for_class(spec.pipeline_class) == spec.recipe, family
        pipe = _built(family)
        assert type(pipe).__name__ == spec.pipeline_class
        planned = set(hp.get_recipe(spec.recipe).components)
        unplanned = set(models_of_pipeline(pipe)) - planned
        assert not unplanned, f"{family}: {sorted(unplanned)} would be left as they are"


@pytest.mark.parametrize("family, layouts", [(f, g) for f in FAMILIES for g in same_load(PIPELINES[f].recipe, LAYOUTS)],
                         ids=group_id)
def test_family_loads_in_the_planned_dtypes_and_runs(family, layouts, saved):
    """Each family under each layout of ``LAYOUTS``, one load and run per group of layouts whose recipes load the
    same (tests/checks.py ``same_load``: the T4's and the MPS Mac's fp16 are one; 64 runs were 48)."""
    spec = PIPELINES[family]
    layout = layouts[0]
    pipe = _load(family, saved(family), layout=layout)
    record = hp.applied(pipe)
    assert record.recipe.name == spec.recipe
    # An independent resolution of the same recipe for each device: the loader must agree with it.
    for each in layouts:
        expected = hp.get_recipe(spec.recipe, device=each)
        present = [p.name for p in expected.policies if getattr(pipe, p.name, None) is not None]
        assert _denoiser(family) in present
        assert {n: record.recipe[n].compute for n in present} == {n: expected[n].compute for n in present}
        assert_plan_dtypes(pipe, expected)
    if layout in ("t4", "cpu") and spec.loads:  # plan bytes == every byte loaded, buffers included
        assert_plan_bytes(pipe, saved(family), layout)
    _run(family, pipe)


@pytest.mark.parametrize("family", FAMILIES)
def test_hand_written_fp16_denoiser_fails_in_plain_diffusers_and_runs_here(family, saved):
    """The user's layout: the denoiser in fp16, everything else fp32, passed the diffusers way (a dtype dict)."""
    import diffusers

    spec, denoiser = PIPELINES[family], _denoiser(family)
    if spec.loads:
        plain = getattr(diffusers, spec.pipeline_class).from_pretrained(saved(family),
                                                                   dtype={denoiser: torch.float16, "default": torch.float32})
    else:
        plain = _built(family)
        getattr(plain, denoiser).to(torch.float16)
    plain.set_progress_bar_config(disable=True)
    assert getattr(plain, denoiser).dtype == torch.float16
    with pytest.raises(RuntimeError, match=DTYPE_MISMATCH):
        _run(family, plain)

    layout = {denoiser: torch.float16, "default": torch.float32}
    if spec.loads:
        pipe = _load(family, saved(family), dtype=layout)
    else:
        pipe = _load(family, None, overrides={denoiser: {"dtype": "float16"}}, layout="cpu-avx2")
    record = hp.applied(pipe)
    assert record.recipe[denoiser].compute == "float16"
    others = [p.name for p in record.recipe.policies if p.name != denoiser and getattr(pipe, p.name, None) is not None]
    assert others and all(record.recipe[n].compute == "float32" for n in others)
    assert_plan_dtypes(pipe, record.recipe)
    _run(family, pipe)


# Real configs shipped for these families (no weights): folder -> the recipe alias whose `model:` it is.
SHIPPED = {"stable-cascade-prior": "cascade_prior", "kandinsky-3": "kandinsky3", "stable-diffusion-x4-upscaler": "sd_upscale",
           "animatediff-motion-adapter-v1-5-2": "animatediff", "i2vgen-xl": "i2vgenxl"}


@pytest.mark.parametrize("folder", sorted(SHIPPED))
def test_shipped_configs_build_to_the_published_parameter_counts(folder):
    import json

    from hf_precision.runtime.source import CONFIGS_DIR, shipped_configs

    alias = SHIPPED[folder]
    assert shipped_configs()[alias] == CONFIGS_DIR / folder
    source = json.loads((CONFIGS_DIR / folder / "SOURCE.json").read_text())
    assert {f["path"] for f in source["files"]} >= {"model_index.json"} | {f"{c}/config.json" for c in source["published_params"]}
    planned = hp.plan(alias, device="t4")  # every component built on the meta device from the shipped configs
    assert planned.params == sum(c.params for c in planned.components.values()) > 0
    for component, published in source["published_params"].items():
        got = planned[component].params
        if published.get("approx"):  # the authors publish rounded counts ("3.6B", "267M"): within 2%
            assert abs(got - published["params"]) <= 0.02 * published["params"], (component, got, published)
        else:
            assert got == published["params"], component


@pytest.mark.parametrize("family", ["sd_controlnet", "sdxl_controlnet"])
def test_fp32_controlnet_beside_an_fp16_pipeline(family):
    """A ControlNet kept fp32 (as users do when fp16 ControlNet weights misbehave) next to an fp16 pipeline: plain
    diffusers feeds it fp16 prompt embeddings and fails; the recipe's entry casts make the same layout run."""
    plain = _built(family)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain.to(torch.float16)
        plain.controlnet.to(torch.float32)
        if family.startswith("sdxl"):
            plain.vae.to(torch.float32)  # the SDXL VAE is never fp16 (vae.sdxl)
    with pytest.raises(RuntimeError, match=DTYPE_MISMATCH):
        _run(family, plain)

    pipe = _built(family)
    recipe = hp.get_recipe(PIPELINES[family].recipe, device="t4", overrides={"controlnet": {"dtype": "float32"}})
    hp.apply_recipe(pipe, recipe, device="cpu")
    assert (recipe["controlnet"].compute, recipe["unet"].compute) == ("float32", "float16")
    assert_plan_dtypes(pipe, recipe)
    _run(family, pipe)
