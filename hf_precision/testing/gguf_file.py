"""Write a model's weights to a GGUF file with the ``gguf`` package (for tests and the benchmark; no llama.cpp).

Keys stay diffusers' own (``from_single_file`` takes its own format as is). Weights whose last dimension fills the
type's blocks (32 for Q8_0/Q4_0, 256 for K-quants) take that type, the rest F32 as converters do. ``gguf`` cannot
quantize K-quants, so those are seeded random blocks with fp16 scales set so the dequantized weight has the
source's root mean square and a mean near zero (finite, but no longer the source's function).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

__all__ = ["K_QUANTS", "FALLBACK", "write_gguf", "random_kquant"]

# Byte offsets of the fp16 fields ``d`` and ``dmin`` in each block the gguf package cannot quantize, and the dmin/d
# ratio that centres the dequantized values on zero for uniform random quants. Layouts: ggml-common.h's
# block_q2_K ... block_q6_K and block_iq4_nl, as gguf-py's gguf/quants.py reads them (Q2_K: scales, qs, d, dmin;
# Q3_K: hmask, qs, scales, d; Q4_K: d, dmin, scales, qs; Q5_K: d, dmin, scales, qh, qs; Q6_K: ql, qh, scales, d;
# IQ4_NL: d, qs). Centring: Q4_K is d*sc*q - dmin*m with sc, m uniform on 0..63 and q on 0..15 (mean 7.5), so
# dmin = 7.5 d; Q5_K's q spans 0..31 (15.5); Q2_K's q spans 0..3 (1.5) with 4-bit sc and m. The others are signed.
K_QUANTS: dict[str, tuple[int, int | None, float]] = {
    "Q2_K": (80, 82, 1.5),
    "Q3_K": (108, None, 0.0),
    "Q4_K": (0, 2, 7.5),
    "Q5_K": (0, 2, 15.5),
    "Q6_K": (208, None, 0.0),
    "IQ4_NL": (0, None, 0.0),
}
# The type llama.cpp's quantizer stores a weight in when its rows do not fill a K-quant's 256-weight block
# (src/llama-quant.cpp, llama_tensor_get_type, "using fallback quantization"); K-quant files hold these too.
FALLBACK = {"Q2_K": "IQ4_NL", "Q3_K": "IQ4_NL", "Q4_K": "Q5_0", "Q5_K": "Q5_1", "Q6_K": "Q8_0"}


def write_gguf(module: Any, path: str | os.PathLike[str],
               qtype: str | Sequence[str] | Callable[[str], str | Sequence[str]] = "Q8_0",
               seed: int = 0) -> dict[str, str]:
    """Save ``module``'s state dict as a GGUF file; returns tensor name -> the GGUF type it was stored in.

    ``qtype``: one type, several tried in order (the first whose block fills the rows, as llama.cpp falls back:
    :data:`FALLBACK`), or a function of the tensor name (a Q4_K_M file mixes Q4_K and Q6_K). K-quant and IQ4_NL blocks
    are random, seeded by ``seed``.

    Example:
        >>> import tempfile, torch
        >>> types = write_gguf(torch.nn.Linear(64, 8), Path(tempfile.mkdtemp()) / "m.gguf")
        >>> types
        {'weight': 'Q8_0', 'bias': 'F32'}
        >>> net = torch.nn.Sequential(torch.nn.Linear(32, 256), torch.nn.Linear(256, 8))
        >>> write_gguf(net, Path(tempfile.mkdtemp()) / "k.gguf", ("Q4_K", FALLBACK["Q4_K"]))
        {'0.weight': 'Q5_0', '0.bias': 'F32', '1.weight': 'Q4_K', '1.bias': 'F32'}
    """
    import gguf
    import numpy as np

    choose = qtype if callable(qtype) else lambda _: qtype
    rng = np.random.default_rng(seed)
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch="hf_precision_test")
    types = {}
    for name, tensor in module.state_dict().items():
        data = tensor.detach().float().cpu().numpy()
        wanted = choose(name)
        kinds = [(t, getattr(gguf.GGMLQuantizationType, t)) for t in ([wanted] if isinstance(wanted, str) else wanted)]
        fits = [(n, k) for n, k in kinds if data.ndim >= 2 and data.shape[-1] % gguf.GGML_QUANT_SIZES[k][0] == 0]
        if not fits:
            writer.add_tensor(name, data.astype(np.float32))
            types[name] = "F32"
            continue
        qname, kind = fits[0]
        blocks = random_kquant(data, qname, rng) if qname in K_QUANTS else gguf.quants.quantize(data, kind)
        writer.add_tensor(name, blocks, raw_dtype=kind)  # uint8 bytes: the writer derives the ggml shape
        types[name] = qname
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return types


def random_kquant(data: Any, qtype: str, rng: Any) -> Any:
    """Random blocks of a :data:`K_QUANTS` type (uint8, rows x bytes) for a float array ``data`` whose rows fill them:
    random quants and scales, each block's fp16 ``d`` (and ``dmin``) a random factor in [0.5, 1.5) times one scale
    that gives the dequantized tensor ``data``'s root mean square.

    Example:
        >>> import numpy as np, gguf
        >>> w = np.random.default_rng(0).normal(0, 0.05, (4, 512)).astype(np.float32)
        >>> blocks = random_kquant(w, "Q4_K", np.random.default_rng(1))
        >>> blocks.shape, blocks.dtype.name      # 2 blocks of 144 bytes per row
        ((4, 288), 'uint8')
        >>> back = gguf.quants.dequantize(blocks, gguf.GGMLQuantizationType.Q4_K)
        >>> bool(abs(np.sqrt((back ** 2).mean()) - 0.05) < 0.01)
        True
    """
    import gguf
    import numpy as np

    kind = getattr(gguf.GGMLQuantizationType, qtype)
    size, nbytes = gguf.GGML_QUANT_SIZES[kind]
    d_at, dmin_at, ratio = K_QUANTS[qtype]
    rows = data.reshape(-1, data.shape[-1])
    raw = rng.integers(0, 256, (rows.size // size, nbytes), dtype=np.uint8)
    factor = rng.uniform(0.5, 1.5, raw.shape[0])

    def set_scales(scale: float) -> Any:
        for at, mult in ((d_at, 1.0), (dmin_at, ratio)):
            if at is not None:
                raw[:, at:at + 2] = (factor * scale * mult).astype(np.float16).reshape(-1, 1).view(np.uint8)
        return raw.reshape(*data.shape[:-1], -1)

    unit = gguf.quants.dequantize(set_scales(1.0), kind)
    target = float(np.sqrt((rows.astype(np.float64) ** 2).mean())) or 0.02  # an all-zero weight: a typical init
    # Q6_K's int8 sub-scales make d subnormal in fp16 (~2e-5), as in real files; the floor keeps it nonzero with
    # a few bits (fp16's smallest subnormal is 6e-8)
    scale = max(target / float(np.sqrt((unit.astype(np.float64) ** 2).mean())), 4e-6)
    return set_scales(scale)
