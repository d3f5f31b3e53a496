"""Write a model's weights to a GGUF file with the ``gguf`` package (for tests and the benchmark; no llama.cpp).

Keys stay diffusers' own (diffusers' ``from_single_file`` takes a state dict already in its format as is). Weights
whose last dimension is a multiple of the type's block (32 for Q8_0/Q4_0) are quantized with ``gguf.quants``; the
rest (biases, norms, small embedders) are stored F32, as GGUF converters do for tensors that do not fill a block.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["write_gguf"]


def write_gguf(module: Any, path: str | os.PathLike[str], qtype: str = "Q8_0") -> dict[str, str]:
    """Save ``module``'s state dict as a GGUF file; returns tensor name -> the GGUF type it was stored in.

    Example:
        >>> import tempfile, torch
        >>> types = write_gguf(torch.nn.Linear(64, 8), Path(tempfile.mkdtemp()) / "m.gguf")
        >>> types
        {'weight': 'Q8_0', 'bias': 'F32'}
    """
    import gguf
    import numpy as np

    kind = getattr(gguf.GGMLQuantizationType, qtype)
    block, _ = gguf.GGML_QUANT_SIZES[kind]
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    writer = gguf.GGUFWriter(str(tmp), arch="hf_precision_test")
    types = {}
    for name, tensor in module.state_dict().items():
        data = tensor.detach().float().cpu().numpy()
        if data.ndim >= 2 and data.shape[-1] % block == 0:
            writer.add_tensor(name, gguf.quants.quantize(data, kind), raw_dtype=kind)
            types[name] = qtype
        else:
            writer.add_tensor(name, data.astype(np.float32))
            types[name] = "F32"
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, path)
    return types
