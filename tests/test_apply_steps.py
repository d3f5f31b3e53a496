"""apply_recipe as named steps: each step records what it did on Applied, in the order of STEPS."""

from __future__ import annotations

import re

import torch

import hf_precision as hp
from hf_precision.runtime import apply, placement
from hf_precision.runtime.layout import layerwise_skip_regexes, planned_dtypes
from hf_precision.testing.pipelines import make_sdxl


def test_steps_run_in_order_and_each_records_its_action():
    assert [s.__name__ for s in apply.STEPS] == ["_check_class", "_find_islands", "_place_and_cast", "_store_layerwise",
                                                 "_patch_diffusers", "_hook_entries", "_hook_islands"]
    pipe = make_sdxl()
    pipe.vae.register_to_config(force_upcast=True)
    overrides = {"vae": {"dtype": "float16", "upcast_attention": True}, "unet": {"storage": "bfloat16"}}
    record = hp.apply_recipe(pipe, device="cpu", layout="a100", overrides=overrides)
    text = "\n".join(record.actions)
    assert "unet: cast/moved" in text and "vae: cast/moved" in text                       # place and cast
    assert "unet: weights stored in bfloat16, cast to float16 per layer on use" in text  # layerwise storage
    assert "vae: config.force_upcast True -> False" in text                                # patches: force_upcast
    assert "vae: attention softmax in fp32 in" in text                                      # patches: attention
    assert pipe.vae.config.force_upcast is False
    assert pipe.unet.conv_in.weight.dtype == torch.bfloat16
    assert pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32                  # islands kept in fp32
    assert record.islands["unet"] and record.hooked["vae"]                                  # island and entry hooks
    out = pipe.vae.decode(torch.randn(1, 4, 8, 8, dtype=torch.float16)).sample
    assert torch.isfinite(out).all()


def test_a_new_technique_is_one_more_step(monkeypatch):
    seen = []
    monkeypatch.setattr(apply, "STEPS", (*apply.STEPS, lambda c: (seen.append(c.plan.name), c.did("probed"))))
    record = hp.apply_recipe(make_sdxl(), device="cpu", layout="t4")
    assert sorted(seen) == sorted(record.modules)
    assert f"{seen[0]}: probed" in record.actions


# ---------------------------------------------------------------- the layerwise storage step and the entry hooks


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
    rx = layerwise_skip_regexes(["time_embedding"], plan.layerwise_skip)
    assert not any(re.search(p, "down_blocks.0.time_embedding") for p in rx)


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


def test_a_patched_processor_swaps_torch_functions_for_its_own_thread_only():
    """The fp32-SDPA (macOS) and fp32-matmul (training) processor patches replace a torch function for the length of
    a processor call: another thread running its own model meanwhile must see torch's function, and the last call
    out puts it back. Before: the swap was process-wide, so a second thread used the first one's wrapper."""
    import threading

    from hf_precision.runtime.patches import processor_calling

    inside, release, seen = threading.Event(), threading.Event(), {}
    marked = lambda fn: lambda *a, **k: ("wrapped", fn(*a, **k))  # noqa: E731

    class Processor:
        def __call__(self, x):
            inside.set()
            release.wait(10)
            return torch.matmul(x, x)

    patched = processor_calling(Processor, "_thread_test", torch, ("matmul",), marked)
    original = torch.matmul
    x = torch.eye(2)
    worker = threading.Thread(target=lambda: seen.update(patched=patched()(x)))
    worker.start()
    assert inside.wait(10)
    seen["other"] = torch.matmul(x, x)  # this thread, while the worker is inside its patched call
    release.set()
    worker.join(10)
    assert seen["patched"][0] == "wrapped" and torch.equal(seen["patched"][1], x)
    assert isinstance(seen["other"], torch.Tensor) and torch.equal(seen["other"], x)
    assert torch.matmul is original  # nothing left behind


def test_a_resolved_recipe_placed_on_a_missing_device_names_a_present_one():
    # A resolved Recipe keeps its dtypes, so the fix for a device this machine lacks is a present device, not layout=
    present = {"cuda": torch.cuda.is_available(), "mps": torch.backends.mps.is_available(), "xpu": torch.xpu.is_available()}
    missing = next(t for t, there in present.items() if not there)
    try:
        placement.check_placeable(missing, hp.get_recipe("sdxl", device="t4"))
    except hp.RecipeError as err:
        assert "recipe= is a resolved Recipe, which keeps the dtypes it was resolved for" in str(err)
        assert "e.g. device='cpu'" in str(err) and "layout=" not in str(err)
    else:
        raise AssertionError(f"{missing}: placed a resolved Recipe on a device this machine lacks")
