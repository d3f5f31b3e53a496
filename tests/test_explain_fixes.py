"""Every fix explain() prints changes something, and applying it makes the failing run pass (issue 11 item 9).

Plain diffusers with a layout a user would choose by hand fails inside one component because it received another
component's activations. The fix must never be "set the component to the dtype it already has": it names the
loader (which casts at component boundaries) or the other components. Each test builds the failing run on a
tiny pipeline, catches the error under ``hp.explain(pipe)`` (and again as a caught error), then applies every
printed alternative (by hand, as the printed plain-diffusers calls, and through ``hp.apply_recipe(pipe,
overrides=...)``) and the printed ``hp.apply_recipe(pipe)`` call, and runs the pipeline again.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.recipe.overrides import parse_set
from hf_precision.testing.pipelines import example_call_kwargs

try:
    from layouts import LAYOUTS, apply_plain
except ImportError:  # tests/ imported as a package
    from tests.layouts import LAYOUTS, apply_plain

F16, BF16 = torch.float16, torch.bfloat16

# (id, pipeline kind, what the user casts by hand, the module that fails)
FAILING = [
    ("sdxl-fp16-unet-vae-fp32-text-encoders", "sdxl", {"unet": F16, "vae": F16}, "unet.time_embedding.linear_1"),
    ("sdxl-bf16-vae-only", "sdxl", {"vae": BF16}, "vae.post_quant_conv"),
    ("sdxl-fp16-text-encoder-2-only", "sdxl", {"text_encoder_2": F16}, "unet.time_embedding.linear_1"),
    ("svd-fp16-unet-fp32-image-encoder", "svd", {"unet": F16}, "unet.time_embedding.linear_1"),
    ("pixart-bf16-transformer-fp32-t5-latents", "pixart", {"transformer": BF16}, "transformer.pos_embed.proj"),
    ("dit-fp16-transformer-latents-into-fp32-vae", "dit", {"transformer": F16}, "vae.post_quant_conv"),
]


def _main_dtype(module: torch.nn.Module) -> str:
    counts = Counter()
    for p in module.parameters():
        counts[str(p.dtype).removeprefix("torch.")] += p.numel()
    return counts.most_common(1)[0][0]


def _run(pipe, kind):
    pipe.set_progress_bar_config(disable=True)
    out = pipe(**example_call_kwargs(kind), generator=torch.Generator().manual_seed(0))
    arr = np.asarray(out.frames if kind == "svd" else out.images, dtype=np.float32)
    assert arr.size and np.isfinite(arr).all()


def _layout(tiny_pipe, kind, casts):
    pipe = tiny_pipe(kind)
    for name, dtype in casts.items():
        getattr(pipe, name).to(dtype)
    return pipe


@pytest.mark.parametrize("kind, casts, module", [pytest.param(k, c, m, id=i) for i, k, c, m in FAILING])
def test_printed_fix_makes_the_failing_run_pass(tiny_pipe, kind, casts, module):
    pipe = _layout(tiny_pipe, kind, casts)
    with pytest.raises(hp.MismatchError) as info:
        with hp.explain(pipe):
            _run(pipe, kind)
    err = info.value
    assert err.module == module and err.kind == "dtype"
    component = err.component
    has = _main_dtype(getattr(pipe, component))
    assert err.expected == has  # the component received another component's activations ...
    assert f"{component}.dtype={has}" not in err.fix  # ... so its own dtype is never the fix
    assert "hf_precision.load_pipeline(...)" in err.fix and "hf_precision.apply_recipe(pipe)" in err.fix

    assert len(err.overrides) == 2  # agree on the weights' dtype, or on the input's
    for alternative in err.overrides:
        assert " ".join(f"--set {o}" for o in alternative) in err.fix
        wanted = {o.split(".")[0]: o.split("=")[1] for o in alternative}
        for name, dtype in wanted.items():
            assert _main_dtype(getattr(pipe, name)) != dtype, f"{name}.dtype={dtype} changes nothing"
            assert f"pipe.{name}.to(torch.{dtype})" in err.fix

        # with plain diffusers, as printed: pipe.<component>.to(torch.<dtype>)
        fixed = _layout(tiny_pipe, kind, casts)
        for name, dtype in wanted.items():
            getattr(fixed, name).to(getattr(torch, dtype))
        _run(fixed, kind)

        # through hf_precision: the override lines, as printed
        loaded = _layout(tiny_pipe, kind, casts)
        hp.apply_recipe(loaded, overrides=parse_set(alternative))
        for name, dtype in wanted.items():
            assert _main_dtype(getattr(loaded, name)) == dtype
        _run(loaded, kind)

    # the printed call: hp.apply_recipe(pipe) on the pipeline as it is
    hp.apply_recipe(pipe)
    _run(pipe, kind)


def test_a_caught_error_gets_the_same_explanation(tiny_pipe):
    """hp.explain_error(err) on an error caught without the context manager reads module and pipeline from the traceback."""
    casts = {"unet": F16, "vae": F16}
    pipe = _layout(tiny_pipe, "sdxl", casts)
    with pytest.raises(hp.MismatchError) as info:
        with hp.explain(pipe):
            _run(pipe, "sdxl")
    err = info.value
    try:
        _run(_layout(tiny_pipe, "sdxl", casts), "sdxl")
    except RuntimeError as caught:
        late = hp.explain_error(caught)
    assert late.__cause__ is not None and not isinstance(late.__cause__, hp.MismatchError)
    assert (late.module, late.component, late.got, late.expected) == ("unet.time_embedding.linear_1", "unet",
                                                                      "float32", "float16")
    assert (late.fix, late.overrides) == (err.fix, err.overrides)
    assert late.overrides[0] == ("text_encoder.dtype=float16", "text_encoder_2.dtype=float16")


def test_no_fix_sets_a_component_to_the_dtype_it_has(tiny_pipe):
    """Every failing row of the layout table: no override line names a dtype its component already has."""
    checked = 0
    for layout in LAYOUTS:
        if layout.expect is None or layout.setup is not None:
            continue
        pipe = tiny_pipe(layout.kind)
        kwargs = {**example_call_kwargs(layout.kind), **apply_plain(pipe, layout)}
        pipe.set_progress_bar_config(disable=True)
        with pytest.raises(hp.MismatchError) as info:
            with hp.explain(pipe):
                pipe(**kwargs, generator=torch.Generator().manual_seed(0))
        err = info.value
        assert err.module == layout.module, layout.id
        for alternative in err.overrides:
            for override in alternative:
                key, value = override.split("=")
                name, field = key.split(".")
                if field == "dtype":
                    assert _main_dtype(getattr(pipe, name)) != value, f"{layout.id}: {override} changes nothing"
                else:  # keep_fp32=[island]: the island is not float32 yet, or not declared to the loader
                    assert field == "keep_fp32", f"{layout.id}: {override}"
        checked += 1
    assert checked >= 15


def test_a_tensor_the_user_passed_is_named_as_the_source(tiny_pipe):
    """Every component computes in bfloat16 but the user's latents are float32: no component is to blame."""
    pipe = tiny_pipe("pixart").to(BF16)
    side = 32 // pipe.vae_scale_factor
    latents = torch.randn(1, pipe.transformer.config.in_channels, side, side)
    pipe.set_progress_bar_config(disable=True)
    with pytest.raises(hp.MismatchError) as info:
        with hp.explain(pipe):
            pipe(**example_call_kwargs("pixart"), latents=latents, generator=torch.Generator().manual_seed(0))
    err = info.value
    assert (err.module, err.got, err.expected) == ("transformer.pos_embed.proj", "float32", "bfloat16")
    assert "passed to the pipeline" in err.fix and "dtype=bfloat16" not in err.fix
    assert err.overrides == (("text_encoder.dtype=float32", "transformer.dtype=float32", "vae.dtype=float32"),)
    _run_with(pipe, "pixart", latents=latents.to(BF16))  # the first fix: create the latents in bfloat16


def _run_with(pipe, kind, **extra):
    out = pipe(**example_call_kwargs(kind), **extra, generator=torch.Generator().manual_seed(0))
    assert np.isfinite(np.asarray(out.images, dtype=np.float32)).all()
