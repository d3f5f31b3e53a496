"""GGUF K-quant files (Q2_K ... Q6_K, what people download for Flux/Wan/HunyuanVideo) as a pipeline's denoiser.

The ``gguf`` package cannot quantize K-quants, so ``write_gguf`` writes seeded random blocks with small finite
scales (hf_precision/testing/gguf_file.py) for the rows that fill 256 weights, and llama.cpp's fallback type for the
others. A Flux transformer of width 256 has such rows. Each file: loaded with a base folder, the plan counts the
loaded bytes exactly, diffusers reads every K-quant tensor as gguf-py's numpy reference does, an fp32 island the
file holds K-quant is unpacked, and one step runs finite.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.runtime.quantize import module_bytes
from hf_precision.runtime.quantize_load import quantized_in

gguf = pytest.importorskip("gguf")

ISLAND = "single_transformer_blocks.0.proj_out"  # rows of 1280 weights: K-quant in the file, kept fp32 by override
OVERRIDES = {"transformer": {"keep_fp32": [ISLAND]}}
CALL = dict(prompt="a cat", num_inference_steps=1, height=32, width=32, output_type="np", max_sequence_length=16,
            guidance_scale=3.5)
# one compute dtype each: bf16 (cpu-amx), fp32 (cpu-avx2), fp16 (t4's layout, run on the CPU)
CASES = [("Q2_K", "t4"), ("Q3_K", "cpu-avx2"), ("Q4_K", "cpu-amx"), ("Q5_K", "cpu-avx2"), ("Q6_K", "cpu-amx")]


@pytest.fixture(scope="module")
def wide_flux(tmp_path_factory):
    """(the transformer, the saved folder) of the tiny Flux pipeline with a transformer 256 wide (4 heads of 64)."""
    from diffusers import FluxTransformer2DModel

    from hf_precision.testing import save_pipeline
    from hf_precision.testing.families_dit import make_flux

    pipe = make_flux()
    torch.manual_seed(0)
    pipe.transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=[16, 16, 32])
    return pipe.transformer, save_pipeline(pipe, tmp_path_factory.mktemp("wide_flux"))


@pytest.mark.parametrize("qtype, layout", CASES)
def test_kquant_file_loads_plans_exactly_reads_like_gguf_py_and_runs(wide_flux, tmp_path, qtype, layout):
    from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES, dequantize_functions, dequantize_gguf_tensor

    from hf_precision.testing.gguf_file import FALLBACK, write_gguf

    source, folder = wide_flux
    path = tmp_path / f"flux-{qtype}.gguf"
    types = write_gguf(source, path, (qtype, FALLBACK[qtype]))
    assert {qtype, FALLBACK[qtype], "F32"} <= set(types.values())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(path, "cpu", base=folder, layout=layout, overrides=OVERRIDES)
    model = pipe.transformer
    compute = hp.applied(pipe).recipe["transformer"].compute

    # (a) the plan, from the file's header, counts what loading gave; its storage column names the file's types
    planned = hp.plan(path, device=layout, base=folder, overrides=OVERRIDES)
    assert {c: module_bytes(getattr(pipe, c)) for c in planned.components} == \
        {c: p.total_bytes for c, p in planned.components.items()}
    den = planned["transformer"]
    assert den.bytes_by_dtype[qtype] > 0 and den.storage == f"gguf {qtype}+{FALLBACK[qtype]}, rest {compute}"
    assert den.storage in planned.table()

    # (b) every packed tensor holds the file's bytes, and diffusers' dequantization equals gguf-py's
    file = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    packed = quantized_in(model)
    assert {n for n in packed if types[f"{n}.weight"] == qtype}
    for name in packed:
        weight, tensor = model.get_submodule(name).weight, file[f"{name}.weight"]
        assert weight.quant_type == tensor.tensor_type
        raw = weight.as_tensor().view(torch.uint8)
        assert np.array_equal(raw.numpy(), tensor.data)
        reference = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        block, size = GGML_QUANT_SIZES[weight.quant_type]
        exact = dequantize_functions[weight.quant_type](raw.reshape(-1, size), block, size, dtype=torch.float32)
        assert np.array_equal(exact.reshape(reference.shape).numpy(), reference), name
        # what GGUFLinear's forward uses: diffusers calls the same functions with dtype=None, so K-quant blocks
        # are combined in fp16 arithmetic (a few roundings of 2**-11 on terms up to twice the weight's range)
        used = dequantize_gguf_tensor(weight).float().numpy()
        assert np.abs(used - reference).max() <= 2 ** -8 * np.abs(reference).max(), name

    # (d) the island (K-quant in the file) and the first parameter's layer are plain; the island fp32 (an fp32
    # compute has no islands: the K-quant layer stays packed and computes in fp32)
    assert types[f"{ISLAND}.weight"] == qtype
    if compute != "float32":
        assert ISLAND in hp.applied(pipe).islands["transformer"] and ISLAND not in packed
        assert model.get_submodule(ISLAND).weight.dtype == torch.float32
    else:
        assert ISLAND in packed
    assert "x_embedder" not in packed and model.x_embedder.weight.dtype == getattr(torch, compute)

    # (c) one step runs finite
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(**CALL, generator=torch.Generator().manual_seed(0)).images
    assert np.isfinite(out).all() and out.std() > 0

