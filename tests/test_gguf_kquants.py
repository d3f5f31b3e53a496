"""GGUF K-quant files (Q2_K ... Q6_K, what people download for Flux/Wan/HunyuanVideo) as a pipeline's denoiser.

The ``gguf`` package cannot quantize K-quants, so ``write_gguf`` writes seeded random blocks with small finite
scales (hf_precision/testing/gguf_file.py) for the rows that fill 256 weights, and llama.cpp's fallback type for the
others. A Flux transformer of width 256 has such rows; one file holds all five K-quants, layer by layer (files mix
types: a Q4_K_M file holds Q4_K and Q6_K). Loaded with a base folder under a bf16 and an fp16 layout: the plan
counts the loaded bytes exactly, diffusers reads every packed tensor as gguf-py's numpy reference does, an fp32
island the file holds K-quant is unpacked, and one step runs finite.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.errors import RecipeError
from hf_precision.runtime.quantize import module_bytes
from hf_precision.runtime.quantize_load import quantized_in

gguf = pytest.importorskip("gguf")

K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
ISLAND = "single_transformer_blocks.0.proj_out"  # rows of 1280 weights: K-quant in the file, kept fp32 by override
OVERRIDES = {"transformer": {"keep_fp32": [ISLAND]}}
CALL = dict(prompt="a cat", num_inference_steps=1, height=32, width=32, output_type="np", max_sequence_length=16,
            guidance_scale=3.5)


@pytest.fixture(scope="module")
def kquant_file(tmp_path_factory):
    """(GGUF file, base folder, tensor name -> type) of the tiny Flux pipeline with a transformer 256 wide."""
    from diffusers import FluxTransformer2DModel

    from hf_precision.testing import save_pipeline
    from hf_precision.testing import make_pipeline
    from hf_precision.testing.gguf_file import FALLBACK, write_gguf

    pipe = make_pipeline("flux")
    torch.manual_seed(0)
    pipe.transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=[16, 16, 32])
    tmp = tmp_path_factory.mktemp("kquant")
    order = {name: K_TYPES[i % len(K_TYPES)] for i, name in enumerate(pipe.transformer.state_dict())}
    path = tmp / "flux-mixed-K.gguf"
    types = write_gguf(pipe.transformer, path, lambda name: (order[name], FALLBACK[order[name]]))
    return path, save_pipeline(pipe, tmp / "base"), types


@pytest.mark.parametrize("layout", ["cpu-amx", "t4"])  # bf16 and fp16 compute (t4's layout, run on the CPU)
def test_kquant_file_loads_plans_exactly_reads_like_gguf_py_and_runs(kquant_file, layout):
    from diffusers.quantizers.gguf.utils import GGML_QUANT_SIZES, dequantize_functions, dequantize_gguf_tensor

    path, folder, types = kquant_file
    held = set(types.values())
    assert set(K_TYPES) | {"F32"} < held  # and the fallback type of context_embedder (rows of 32)
    with pytest.raises(RecipeError, match="pass the diffusers folder"):
        hp.load_pipeline(path, "cpu")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe = hp.load_pipeline(path, "cpu", base=folder, layout=layout, overrides=OVERRIDES)
    assert any("loaded from the GGUF file" in a for a in hp.applied(pipe).actions)
    model = pipe.transformer
    compute = hp.applied(pipe).recipe["transformer"].compute
    packed = quantized_in(model)
    # every quantized Linear weight stays packed but the island's, unpacked to fp32, and the first parameter's
    # layer's, unpacked to the compute dtype (pipelines read their dtype from it)
    first = next(iter(types)).rpartition(".")[0]
    assert types[f"{ISLAND}.weight"] in K_TYPES and types[f"{first}.weight"] in K_TYPES
    assert packed == {n.rpartition(".")[0] for n, t in types.items() if t != "F32" and n.endswith("weight")} - {ISLAND, first}
    assert ISLAND in hp.applied(pipe).islands["transformer"] and model.get_submodule(ISLAND).weight.dtype == torch.float32
    assert model.get_submodule(first).weight.dtype == getattr(torch, compute)

    # the plan, from the file's header, counts what loading gave; its storage column names the file's types
    planned = hp.plan(path, device=layout, base=folder, overrides=OVERRIDES)
    assert {c: module_bytes(getattr(pipe, c)) for c in planned.components} == \
        {c: p.total_bytes for c, p in planned.components.items()}
    den = planned["transformer"]
    assert held - {"F32"} <= set(den.bytes_by_dtype)
    assert den.storage.startswith("gguf Q") and den.storage.endswith(f", rest {compute}") and den.storage in planned.table()
    assert set(den.storage[5:].partition(",")[0].split("+")) == held - {"F32"}

    # every packed tensor holds the file's bytes, and diffusers' dequantization equals gguf-py's
    file = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
    for name in packed:
        weight, tensor = model.get_submodule(name).weight, file[f"{name}.weight"]
        assert weight.quant_type == tensor.tensor_type
        raw = weight.as_tensor().view(torch.uint8)
        assert np.array_equal(raw.numpy(), tensor.data)
        reference = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        block, size = GGML_QUANT_SIZES[weight.quant_type]
        exact = dequantize_functions[weight.quant_type](raw.reshape(-1, size), block, size, dtype=torch.float32)
        assert np.array_equal(exact.reshape(reference.shape).numpy(), reference), name
        # what GGUFLinear's forward uses: diffusers calls the same functions with dtype=None, so the blocks are
        # combined in fp16 arithmetic (a few roundings of 2**-11 on terms up to twice the weight's range)
        used = dequantize_gguf_tensor(weight).float().numpy()
        assert np.abs(used - reference).max() <= 2 ** -8 * np.abs(reference).max(), name

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        out = pipe(**CALL, generator=torch.Generator().manual_seed(0)).images
    assert np.isfinite(out).all() and out.std() > 0


def test_a_denoiser_class_diffusers_lacks_is_named_not_an_import_error(tmp_path):
    from hf_precision.runtime.gguf import load_gguf_denoiser

    index = {"transformer": ["diffusers", "NoSuchTransformer2DModel"]}
    with pytest.raises(RecipeError, match=r"has no class NoSuchTransformer2DModel \(the transformer of ./base\)"):
        load_gguf_denoiser(tmp_path / "x.gguf", "./base", index, hp.get_recipe("flux", device="cpu"), {})
