"""Defects found in review, each with a test that fails without its fix."""

from __future__ import annotations

import gc
import weakref

import pytest
import torch

import hf_precision as hp
from hf_precision.runtime.layout import layerwise_skip_regexes, planned_dtypes


class _Names(torch.nn.Module):
    """Modules whose names differ from an island only by a prefix: the old suffix regex also matched them."""

    def __init__(self):
        super().__init__()
        self.time_embedding = torch.nn.Linear(4, 4)
        self.xtime_embedding = torch.nn.Linear(4, 4)
        self.down_blocks = torch.nn.ModuleList([torch.nn.Module()])
        self.down_blocks[0].time_embedding = torch.nn.Linear(4, 4)


def test_layerwise_skips_are_full_matches_like_every_other_pattern():
    # Storage fp8, compute fp16, island time_embedding: only that module (and its children) stays out of the
    # storage dtype. Before the fix the translated glob was a suffix regex under re.search, so
    # down_blocks.0.time_embedding and xtime_embedding were skipped too and stayed in the compute dtype.
    plan = hp.get_recipe("unet.sdxl", device="h100", overrides={"unet": {"dtype": "float16", "storage": "float8_e4m3fn"}})["unet"]
    dtypes = planned_dtypes(_Names(), plan, ["time_embedding"])
    assert dtypes["time_embedding.weight"] == "float32"
    assert dtypes["xtime_embedding.weight"] == "float8_e4m3fn"
    assert dtypes["down_blocks.0.time_embedding.weight"] == "float8_e4m3fn"
    import re
    rx = layerwise_skip_regexes(["time_embedding"], plan.layerwise_skip)
    assert not any(re.search(p, "down_blocks.0.time_embedding") for p in rx)


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


def test_devices_yaml_is_validated_like_every_recipe_file():
    # Before, only `kind` was checked: a typo under `when:` was ignored, so the rule then held for every CUDA device.
    import yaml

    from hf_precision.recipe.schema import check_devices_file
    from hf_precision.recipe.files import recipes_dir

    shipped = yaml.safe_load((recipes_dir() / "devices.yaml").read_text())
    check_devices_file(shipped, "devices.yaml")  # the shipped file is valid
    typo = dict(shipped, rules=[*shipped["rules"], {"id": "cuda-typo", "when": {"type": "cuda", "capabilty": ">=9.0"},
                                                   "auto": ["+bfloat16"]}])
    with pytest.raises(hp.RecipeError, match=r"rules\[\d+\] \(cuda-typo\)\.when\.capabilty: unknown key 'capabilty'.*did you mean 'capability'"):
        check_devices_file(typo, "devices.yaml")
    bad = dict(shipped, presets={"x": {"type": "gpu", "capability": "7.5"}}, extra=1)
    with pytest.raises(hp.RecipeError) as err:
        check_devices_file(bad, "devices.yaml")
    assert "unknown key 'extra'" in str(err.value) and "unknown device type 'gpu'" in str(err.value)


def test_containers_a_model_fills_in_place_are_passed_through():
    # The Wan/QwenImage 3D VAEs keep a causal cache in a list passed to encoder/decoder and fill it in place.
    # Rebuilding that list in the entry hook lost the cache: decode returned 3 frames instead of 9.
    from hf_precision.runtime.hooks import cast_tree

    cache: list = [None] * 3
    idx = [0]
    args = (torch.ones(2, dtype=torch.float16), {"feat_cache": cache, "feat_idx": idx})
    out = cast_tree(args, torch.float16)
    assert out is args and out[1]["feat_cache"] is cache and out[1]["feat_idx"] is idx
    changed = cast_tree([torch.ones(1), cache], torch.float16)
    assert changed[0].dtype == torch.float16 and changed[1] is cache
