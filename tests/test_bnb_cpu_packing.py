"""bitsandbytes 4-bit on the CPU: where the native library reports AVX512-BF16 (AMD Zen 4, Intel Cooper Lake and
later) it repacks each weight for a fused kernel on the first inference call, and the repacking takes only some
shapes (hf_precision/runtime/kernel_guards.py). These tests run the same on every CPU: the repacking itself is plain
torch, so each shape is tried with bitsandbytes' own function; what the real CPU's kernel does is derived from what
bitsandbytes reports (``has_avx512bf16()``), not assumed."""

from __future__ import annotations

import copy

import pytest
import torch

bnb = pytest.importorskip("bitsandbytes")
from bitsandbytes import functional as bnbf  # noqa: E402
from bitsandbytes.nn import modules as bnb_modules  # noqa: E402

from hf_precision.runtime.kernel_guards import (bnb_cpu_packable, guard_bnb_cpu_packing,  # noqa: E402
                                                keep_bnb_unpacked)

# (out_features, in_features): the tiny test models' widths, and real ones: Flux's attention (3072x3072), its
# final projection (64 <- 3072), CLIP-L's MLP (3072 <- 768), SDXL's add_embedding (1280 <- 2816), T5-XXL's
# feed-forward (4096 <- 10240)
SHAPES = [(32, 32), (48, 64), (64, 96), (8, 12), (37, 64), (32, 64), (3072, 3072), (64, 3072), (3072, 768),
          (1280, 2816), (4096, 10240)]


def _layer(out_features: int, in_features: int, quant_type: str = "nf4") -> torch.nn.Module:
    torch.manual_seed(0)
    layer = bnb.nn.Linear4bit(in_features, out_features, quant_type=quant_type, compute_dtype=torch.bfloat16)
    return layer.to("cpu").eval()  # Params4bit quantizes on the move


def _original():
    return getattr(bnb_modules._convert_weight_packed_for_cpu, "__wrapped__", bnb_modules._convert_weight_packed_for_cpu)


def _reference(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    weight = bnbf.dequantize_4bit(layer.weight.data, layer.weight.quant_state).float()
    return x.float() @ weight.t() + layer.bias.float()


@pytest.mark.parametrize("out_features,in_features", SHAPES)
def test_the_packable_rule_is_bitsandbytes_own_repacking(out_features, in_features):
    layer = _layer(out_features, in_features)
    try:
        _original()(layer.weight.data.clone(), copy.deepcopy(layer.weight.quant_state))
        took = True
    except (AssertionError, RuntimeError):  # 'N must be divisible by block_n', "shape '[32, 0]' is invalid"
        took = False
    assert bnb_cpu_packable(out_features, in_features, layer.weight.quant_state.blocksize) is took


@pytest.mark.parametrize("quant_type", ["nf4", "fp4"])
@pytest.mark.parametrize("out_features,in_features", [(48, 64), (32, 32), (64, 96)])
def test_a_layer_it_cannot_repack_fails_unguarded_and_runs_guarded(monkeypatch, quant_type, out_features, in_features):
    """Every CPU: the layer as bitsandbytes sets it up on an AVX512-BF16 CPU (``support_avx512bf16_for_cpu``) fails
    its first inference call without the guard (the failure of the Zen 4 machine) and runs with it, on the generic
    path, equal to the dequantized weights."""
    x = torch.randn(3, in_features, dtype=torch.bfloat16)
    layer = _layer(out_features, in_features, quant_type)
    layer.support_avx512bf16_for_cpu = True
    monkeypatch.setattr(bnb_modules, "_convert_weight_packed_for_cpu", _original())
    with torch.no_grad(), pytest.raises((AssertionError, RuntimeError), match="block_n|is invalid for input"):
        layer(x)
    monkeypatch.undo()
    assert guard_bnb_cpu_packing() and guard_bnb_cpu_packing()  # idempotent
    layer = _layer(out_features, in_features, quant_type)
    layer.support_avx512bf16_for_cpu = True
    with torch.no_grad():
        out = layer(x)
    assert not getattr(layer.weight.quant_state, "packing_format_for_cpu", False)
    assert torch.allclose(out.float(), _reference(layer, x), atol=2e-2, rtol=2e-2)


def test_a_layer_it_can_repack_takes_this_cpus_own_path():
    """What bitsandbytes does with a packable layer depends on the real CPU: repacked for the fused kernel where
    it reports AVX512-BF16, left as it is elsewhere; the guard changes neither, and both agree with the weights."""
    assert guard_bnb_cpu_packing()
    layer = _layer(64, 128)
    x = torch.randn(5, 128, dtype=torch.bfloat16)
    reference = _reference(layer, x)
    with torch.no_grad():
        out = layer(x)
    fused = bool(bnbf.has_avx512bf16())
    assert layer.support_avx512bf16_for_cpu == fused
    assert getattr(layer.weight.quant_state, "packing_format_for_cpu", False) is fused
    assert torch.allclose(out.float(), reference, atol=2e-2, rtol=2e-2)


def test_keep_unpacked_restores_the_codes_and_keeps_gradients_flowing():
    """A layer repacked by an inference call (done here with bitsandbytes' own function, on any CPU) is unpacked
    to the same 4-bit codes and never repacked: a gradient reaches the input through it in eval mode."""
    layer = _layer(64, 128)
    codes = layer.weight.data.clone()
    layer.weight.data, layer.weight.quant_state = _original()(layer.weight.data, layer.weight.quant_state)
    assert layer.weight.quant_state.packing_format_for_cpu
    assert keep_bnb_unpacked(torch.nn.Sequential(layer)) == 1
    assert torch.equal(layer.weight.data, codes) and not layer.support_avx512bf16_for_cpu
    x = torch.randn(2, 128, dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        layer(x.detach())  # an eval call without gradients: where bitsandbytes would repack
    assert not layer.weight.quant_state.packing_format_for_cpu
    layer(x).float().sum().backward()
    assert x.grad is not None and bool(x.grad.abs().sum() > 0)
    assert keep_bnb_unpacked(torch.nn.Sequential(layer)) == 0


@pytest.mark.parametrize("m,k,n", [(3, 12, 8), (1, 5, 7), (17, 33, 9), (2, 64, 48)])
def test_llm_int8_matmul_takes_odd_shapes_on_this_cpus_kernel(m, k, n):
    """LLM.int8's integer matmul goes to ``torch._int_mm`` where torch reports an AVX512 CPU and to bitsandbytes'
    own kernel elsewhere (bitsandbytes v0.50.2 backends/cpu/ops.py): whichever this CPU registered is exact on
    widths that are not whole vector steps."""
    torch.manual_seed(0)
    a = torch.randint(-127, 128, (m, k), dtype=torch.int8)
    b = torch.randint(-127, 128, (n, k), dtype=torch.int8)
    out = torch.ops.bitsandbytes.int8_linear_matmul(a, b)
    assert torch.equal(out, a.int() @ b.int().t())
