"""NaN guard: a VAE whose fp16 activations really overflow is re-run in bf16 or fp32 and keeps that dtype."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import hf_precision as hp
from hf_precision.testing import make_overflowing_vae


def _overflowing_vae():
    """A tiny VAE whose decoder.conv_in output exceeds 65504: fine in fp32, inf/NaN in fp16."""
    return make_overflowing_vae()[0]


def _latents():
    return make_overflowing_vae()[1]


def test_the_vae_really_overflows_in_fp16():
    vae = _overflowing_vae()
    with torch.no_grad():
        peak = vae.decoder.conv_in(vae.post_quant_conv(_latents())).abs().max()
        assert peak > 65504, f"activations only reach {peak}"
        assert torch.isfinite(vae.decode(_latents()).sample).all()
        half = vae.to(torch.float16).decode(_latents().half()).sample
    assert not torch.isfinite(half).all()


@pytest.mark.parametrize("device, fallback", [("t4", torch.float32), ("a100", torch.bfloat16)])
def test_guard_reruns_and_keeps_the_fallback(device, fallback):
    vae = _overflowing_vae()
    with torch.no_grad():
        reference = vae.decode(_latents()).sample
    recipe = hp.get_recipe("vae.fp16_fix", device=device)
    assert recipe["vae"].compute == "float16" and recipe["vae"].nan_guard
    hp.apply_recipe(vae, recipe, device="cpu")
    assert vae.decoder.conv_in.weight.dtype == torch.float16

    with pytest.warns(RuntimeWarning, match=rf"re-ran it in {str(fallback)[6:]}.*--set vae\.dtype={str(fallback)[6:]}"):
        with torch.no_grad():
            image = vae.decode(_latents()).sample
    assert torch.isfinite(image).all()
    assert image.dtype == torch.float32
    scale = reference.abs().max()
    # The weights were stored in fp16 before the fallback, so even the fp32 re-run carries fp16 weight rounding
    # (~5e-4 relative); bf16 activations add their own 8-bit mantissa error.
    tolerance = 2e-3 if fallback == torch.float32 else 5e-2
    assert (image - reference).abs().max() <= tolerance * scale

    assert vae.decoder.conv_in.weight.dtype == fallback, "the fallback must stick for the session"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no second warning: the fallback is kept
        with torch.no_grad():
            again = vae.decode(_latents()).sample
    assert torch.isfinite(again).all()


def test_guard_is_off_outside_half_precision_and_opt_in_elsewhere():
    assert not hp.get_recipe("vae.sdxl", device="t4")["vae"].nan_guard  # fp32 there: nothing to guard
    assert not hp.get_recipe("sdxl", device="t4")["unet"].nan_guard
    assert hp.get_recipe("sdxl", device="t4", overrides={"unet": {"nan_guard": True}})["unet"].nan_guard


def test_failed_forward_leaves_no_hook_state_behind(tiny_pipe):
    # Post hooks are registered with always_call=True: when a forward raises, the entry hook's stacks are popped
    # and the NaN guard keeps no reference to the failed call's inputs. Before, each failure left one entry.
    pipe = tiny_pipe("sdxl")
    applied = hp.apply_recipe(pipe, device="cpu", layout="a100")
    assert applied.recipe["vae"].nan_guard, "the a100 layout's VAE should carry the NaN guard (it keeps inputs)"
    hooks = [h.__self__ for h in pipe.vae.post_quant_conv._forward_hooks.values() if hasattr(h, "__self__")]
    assert hooks, "the VAE's post_quant_conv has no entry hook"
    hook = hooks[0]
    latents = torch.randn(1, 4, 8, 8, dtype=torch.bfloat16)
    ref = weakref.ref(latents)

    def boom(module, args):
        raise RuntimeError("boom")

    handle = pipe.vae.post_quant_conv.register_forward_pre_hook(boom)
    try:
        for _ in range(3):
            with pytest.raises(RuntimeError, match="boom"):
                pipe.vae.post_quant_conv(latents)
    finally:
        handle.remove()
    assert hook._arrived == [] and hook._originals == []
    del latents
    gc.collect()
    assert ref() is None, "a failed call's input is still referenced by the hooks"
    applied.remove()
