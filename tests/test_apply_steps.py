"""apply_recipe as named steps: each step records what it did on Applied, in the order of STEPS."""

from __future__ import annotations

import torch

import hf_precision as hp
from hf_precision.runtime import apply
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
