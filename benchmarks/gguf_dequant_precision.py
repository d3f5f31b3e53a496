"""How far diffusers' GGUF dequantization (fp16 arithmetic) is from gguf-py's fp32 reference, per GGUF type.

    python benchmarks/gguf_dequant_precision.py

diffusers calls its dequantization functions without a dtype (diffusers 0.42.1 quantizers/gguf/utils.py:542), so a
block's fp16 scales and its quants are combined in fp16; ggml and gguf-py compute in fp32. For each type, a GGUF file
of a Flux transformer 256 wide (``hf_precision.testing.gguf_file.write_gguf``: K-quants as random blocks) is loaded
through ``hp.load_pipeline(file, base=...)`` with fp32 compute, and the script prints the largest difference of
a packed weight from gguf-py's ``dequantize`` (relative to the largest weight) and the relative L2 difference of the
transformer output between diffusers' dequantization and the same functions given ``dtype=torch.float32``.
"""

from __future__ import annotations

import tempfile
import warnings
from pathlib import Path

import numpy as np
import torch

TYPES = ("Q8_0", "Q4_0", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def main() -> None:
    import diffusers.quantizers.gguf.utils as gguf_utils
    import gguf
    from diffusers import FluxTransformer2DModel

    import hf_precision as hp
    from hf_precision.runtime.quantize_load import quantized_in
    from hf_precision.testing import save_pipeline
    from hf_precision.testing import make_pipeline
    from hf_precision.testing.gguf_file import FALLBACK, write_gguf

    warnings.simplefilter("ignore")
    torch.manual_seed(0)
    pipe = make_pipeline("flux")
    pipe.transformer = FluxTransformer2DModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=64, num_attention_heads=4,
        joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=[16, 16, 32])
    tmp = Path(tempfile.mkdtemp())
    folder = save_pipeline(pipe, tmp / "base")
    as_diffusers = gguf_utils.dequantize_gguf_tensor

    def in_fp32(t):
        if not hasattr(t, "quant_type"):
            return t
        block, size = gguf_utils.GGML_QUANT_SIZES[t.quant_type]
        raw = t.as_tensor().view(torch.uint8)
        out = gguf_utils.dequantize_functions[t.quant_type](raw.reshape(-1, size), block, size, dtype=torch.float32)
        return out.reshape(*raw.shape[:-1], raw.shape[-1] // size * block)

    g = torch.Generator().manual_seed(1)
    inputs = dict(hidden_states=torch.randn(1, 64, 16, generator=g), encoder_hidden_states=torch.randn(1, 16, 32, generator=g),
                  pooled_projections=torch.randn(1, 8, generator=g), timestep=torch.tensor([0.5]),
                  guidance=torch.tensor([3.5]), img_ids=torch.zeros(64, 3), txt_ids=torch.zeros(16, 3), return_dict=False)
    print("| type | packed tensors | max weight diff / max weight | output rel. L2 (fp32 compute) |\n|---|---:|---:|---:|")
    for qtype in TYPES:
        path = tmp / f"{qtype}.gguf"
        write_gguf(pipe.transformer, path, (qtype, FALLBACK[qtype]) if qtype in FALLBACK else qtype)
        file = {t.name: t for t in gguf.GGUFReader(str(path)).tensors}
        model = hp.load_pipeline(path, "cpu", base=folder, layout="cpu-avx2").transformer
        worst, count = 0.0, 0
        for name in quantized_in(model):
            weight = model.get_submodule(name).weight
            if weight.quant_type.name == qtype:
                reference = gguf.quants.dequantize(file[f"{name}.weight"].data, weight.quant_type)
                diff = np.abs(as_diffusers(weight).float().numpy() - reference).max() / np.abs(reference).max()
                worst, count = max(worst, float(diff)), count + 1
        try:
            with torch.no_grad():
                ours = model(**inputs)[0]
                gguf_utils.dequantize_gguf_tensor = in_fp32  # GGUFLinear looks the function up per call
                exact = model(**inputs)[0]
        finally:
            gguf_utils.dequantize_gguf_tensor = as_diffusers
        print(f"| {qtype} | {count} | {worst:.2e} | {((ours - exact).norm() / exact.norm()).item():.2e} |")


if __name__ == "__main__":
    main()
