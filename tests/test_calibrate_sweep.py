"""calibrate beyond the three planted pipelines of test_calibrate.py: other architectures and modules, overflows the
float32 run does not show, weights beyond the half range, a finite run over the error bound, and model offload.

Each case reproduces the failure first (the all-fp16 run is not finite, or too far from the reference) and then
shows it gone with the measured islands. benchmarks/calibrate_sweep.py runs the same planting over many more modules.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.recipe.patterns import inside
from hf_precision.runtime.apply import apply_recipe
from hf_precision.testing.calibration import module_bytes, plant_overflow, plant_vae_up_block
from hf_precision.testing import PIPELINES, make_pipeline
from hf_precision.testing.pipelines import example_call_kwargs, make_sd15

pytestmark = pytest.mark.filterwarnings("ignore")
HALF_DELTA = 4 - 2  # bytes an fp32 island adds per value over float16
LIMIT = 65504.0


def _frames(out):
    value = getattr(out, "images", None)
    return np.asarray(out.frames if value is None else value, dtype=np.float64)


def _sd15_call():
    return {**example_call_kwargs("sd15"), "num_inference_steps": 1}


@pytest.mark.parametrize("family,component,module", [
    ("flux", "transformer", "transformer_blocks.0.attn.to_v"),        # attention output projection reads the overflow
    ("qwenimage", "text_encoder", "model.language_model.layers.0.mlp.gate_proj"),  # a Qwen2.5-VL gated MLP
    ("sana", "vae", "decoder.up_blocks.0.1.conv1"),                  # a DC-AE decoder block
])
def test_planted_overflow_other_architectures(family, component, module):
    pipe = make_pipeline(family)
    call = PIPELINES[family].call_kwargs(num_inference_steps=1)
    planted = plant_overflow(pipe, component, module, lambda: pipe(**call, generator=torch.Generator().manual_seed(0)))
    assert not planted["spread"], planted  # a local overflow: only the planted module leaves the range

    result = hp.calibrate(pipe, "t4", call, progress=False, run_on="cpu")
    assert not result.errors["naive"].finite and result.finite
    islands = result.islands[component]
    assert any(inside(module, [i]) for i in islands), islands
    assert set(result.islands) == {component} and not result.whole
    assert 0 < result.extra_bytes < module_bytes(getattr(pipe, component), HALF_DELTA)
    assert result.extra_bytes < result.whole_component_bytes()

    # Independently of calibrate's own verification: the override alone makes the fp16 run finite.
    no_guard = {n: {"nan_guard": False} for n in result.components}
    apply_recipe(pipe, device="cpu", layout="t4", overrides=[result.overrides(), no_guard])
    assert np.isfinite(_frames(pipe(**call, generator=torch.Generator().manual_seed(0)))).all()


def test_overflow_only_the_half_run_shows():
    # Attention scores q.k^T overflow fp16 in the classic processor (baddbmm in the half dtype; why diffusers has
    # `upcast_attention`, e.g. stabilityai/stable-diffusion-2-1's unet config), while every module's input and
    # output stays in range: the reference run flags nothing, the verification run finds the attention.
    from diffusers.models.attention_processor import AttnProcessor

    pipe = make_sd15()
    path = "down_blocks.0.attentions.0.transformer_blocks.0.attn1"
    attn = pipe.unet.get_submodule(path)
    attn.set_processor(AttnProcessor())
    with torch.no_grad():
        attn.to_q.weight.mul_(300.0)
        attn.to_k.weight.mul_(300.0)
    result = hp.calibrate(pipe, "t4", _sd15_call(), progress=False, run_on="cpu")
    assert all(v <= LIMIT for per in result.ranges.values() for v in per.values())  # nothing in range to flag
    assert not result.errors["naive"].finite and result.finite
    assert result.islands == {"unet": [path]}
    assert [e.where for e in result.evidence["unet"][path]] == ["half run"]


def test_weights_beyond_the_half_range():
    # A fine-tune's outlier weights: linear_2's weights exceed 65504 (not storable in fp16) while its input is
    # tiny, so every activation of the float32 run is ordinary. The pre-check islands it before any half run.
    pipe = make_sd15()
    mlp = pipe.unet.time_embedding
    with torch.no_grad():
        mlp.linear_1.weight.div_(1e6)
        mlp.linear_1.bias.div_(1e6)
        mlp.linear_2.weight.mul_(1e6)  # SiLU is linear near 0: the float32 run computes what it did before
    assert float(mlp.linear_2.weight.abs().max()) > LIMIT
    result = hp.calibrate(pipe, "t4", _sd15_call(), progress=False, run_on="cpu", rounds=0)
    assert not result.errors["naive"].finite and result.finite  # no verification round needed
    assert result.islands == {"unet": ["time_embedding.linear_2"]}
    assert result.evidence["unet"]["time_embedding.linear_2"][0].where == "weights"


def test_finite_run_over_the_bound_is_localised():
    call = _sd15_call()
    rounding = hp.calibrate(make_sd15(), "t4", call, progress=False, run_on="cpu").errors["naive"].mean_abs
    # A large offset added by linear_1 and taken back by linear_2's bias: in fp16 the offset swallows the signal
    # (spacing 1 at 2000), in float32 it does not. Finite, but far from the reference.
    pipe = make_sd15()
    mlp = pipe.unet.time_embedding
    with torch.no_grad():
        mlp.linear_1.bias.add_(2000.0)
        mlp.linear_2.bias.sub_(mlp.linear_2.weight.sum(1) * 2000.0)
    bound = 2 * rounding
    result = hp.calibrate(pipe, "t4", call, progress=False, run_on="cpu", bound=bound)
    assert result.errors["naive"].finite and result.errors["naive"].mean_abs > bound
    assert result.finite and result.errors["islands"].mean_abs <= bound
    islands = result.islands["unet"]
    assert len(islands) == 1 and inside(islands[0], ["time_embedding"]), islands
    assert any(e.where == "error" for e in result.evidence["unet"][islands[0]])


@pytest.fixture(scope="module")
def planted_sd15():
    pipe = make_sd15()
    plant_vae_up_block(pipe.vae, block=0, resnets=(0,))
    return pipe


def test_offload_gives_what_the_in_memory_run_gives(planted_sd15):
    pipe = planted_sd15
    numel = {n: sum(t.numel() for t in m.parameters()) for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    per_value = 4 + 2  # the float32 reference weights and a half copy
    budget = per_value * max(numel.values()) + 1  # the largest component fits, the pipeline does not
    assert budget < per_value * sum(numel.values())
    memory = hp.calibrate(pipe, "t4", _sd15_call(), progress=False, run_on="cpu")
    offload = hp.calibrate(pipe, "t4", _sd15_call(), progress=False, run_on="cpu", max_memory=budget)
    assert any("model offload" in n for n in offload.notes) and not any("model offload" in n for n in memory.notes)
    assert offload.islands == memory.islands and offload.islands
    for key in ("naive", "islands"):
        assert offload.errors[key] == memory.errors[key]
    assert not any(hasattr(m, "_hf_hook") for m in pipe.components.values())  # handed back without offload hooks


def test_refuses_a_budget_below_the_largest_component(planted_sd15):
    with pytest.raises(hp.RecipeError, match="max_memory") as err:
        hp.calibrate(planted_sd15, "t4", _sd15_call(), progress=False, run_on="cpu", max_memory=10_000)
    text = str(err.value)
    assert "--max-memory" in text and "reference='bfloat16'" in text and "model offload" in text


def test_a_pipeline_whose_output_is_not_images():
    # Stable Cascade's prior returns image embeddings (StableCascadePriorPipelineOutput): calibrate compares those
    # (it failed with "float() argument must be ... not 'StableCascadePriorPipelineOutput'" before).
    pipe = make_pipeline("cascade_prior")
    call = PIPELINES["cascade_prior"].call_kwargs(num_inference_steps=1)
    plant_overflow(pipe, "prior", "down_blocks.0.2.attention.to_q",
                   lambda: pipe(**call, generator=torch.Generator().manual_seed(0)))
    result = hp.calibrate(pipe, "t4", call, progress=False, run_on="cpu")
    assert not result.errors["naive"].finite and result.finite
    assert any(inside("down_blocks.0.2.attention.to_q", [i]) for i in result.islands["prior"])
    assert result.extra_bytes < result.whole_component_bytes()
