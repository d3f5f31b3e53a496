"""Every failing layout of docs/facts.md#f11-layout-table: plain diffusers raises, through hf_precision it runs.

Each test first reproduces the failure on a fresh copy (asserting the exact error), then applies the same
layout with ``apply_recipe`` (after the row's own setup, i.e. the user's situation) and checks the call
runs, the output is finite, and every parameter holds the dtype the plan says. Layouts are resolved for a
device without auto-picked half precision (``cpu-avx2``) so that components the row does not name stay
float32, exactly as in the table.
"""

from __future__ import annotations

import pytest
import torch

import hf_precision as hp
from hf_precision.testing.pipelines import example_call_kwargs
from layouts import LAYOUTS, apply_plain
from checks import assert_finite, assert_plan_dtypes

FAILING = [layout for layout in LAYOUTS if layout.expect is not None]
BASE_DEVICE = "cpu-avx2"


def _call(pipe, kind, extra):
    return pipe(**{**example_call_kwargs(kind), **extra}, generator=torch.Generator().manual_seed(0))


def test_every_failing_row_is_covered():
    ids = {layout.id for layout in FAILING}
    expected = {f"S{i}" for i in (2, 3, 5, 6, 7, 8, 10, 13, 14, 15, 16, 18, 20, 22, 23, 24, 26, 27)} | \
        {f"V{i}" for i in range(2, 10) if i != 7} | {"P2", "P3", "P4", "P5", "D2b", "D3"}
    assert expected <= ids, f"missing failing rows: {sorted(expected - ids)}"


@pytest.mark.parametrize("layout", FAILING, ids=[layout.id for layout in FAILING])
def test_plain_fails_then_recipe_runs(layout, tiny_pipe):
    plain = tiny_pipe(layout.kind)
    extra = apply_plain(plain, layout)
    with pytest.raises(RuntimeError, match=layout.expect):
        _call(plain, layout.kind, extra)

    pipe = tiny_pipe(layout.kind)
    extra = apply_plain(pipe, layout)  # the user's broken situation, then hf_precision on top of it
    recipe = hp.get_recipe(layout.kind, device=BASE_DEVICE, overrides=layout.overrides)
    hp.apply_recipe(pipe, recipe, device="cpu")
    assert_finite(_call(pipe, layout.kind, extra))
    assert_plan_dtypes(pipe, recipe)


NO_SETUP = [layout for layout in FAILING if layout.setup is None]


@pytest.mark.parametrize("layout", NO_SETUP, ids=[layout.id for layout in NO_SETUP])
def test_layout_loaded_from_disk_runs(layout, saved_pipeline):
    """The same layouts loaded straight into their dtypes by load_pipeline from a saved folder."""
    recipe = hp.get_recipe(layout.kind, device=BASE_DEVICE, overrides=layout.overrides)
    pipe = hp.load_pipeline(saved_pipeline(layout.kind), "cpu", recipe=recipe)
    assert_plan_dtypes(pipe, recipe)
    assert_finite(_call(pipe, layout.kind, {}))


def test_fp16_variant_folder_without_dtype(saved_pipeline):
    """S24: plain from_pretrained(variant='fp16') mixes fp16 text encoders with an fp32 UNet and fails;
    load_pipeline picks the variant itself and loads every component in its planned dtype."""
    from diffusers import DiffusionPipeline

    folder = saved_pipeline("sdxl", fp16_variant=True)
    plain = DiffusionPipeline.from_pretrained(folder, variant="fp16")
    assert plain.unet.dtype == torch.float32 and plain.text_encoder_2.dtype == torch.float16
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype"):
        _call(plain, "sdxl", {})

    recipe = hp.get_recipe("sdxl", device="t4")
    pipe = hp.load_pipeline(folder, "cpu", recipe=recipe)
    assert_plan_dtypes(pipe, recipe)
    assert_finite(_call(pipe, "sdxl", {}))
