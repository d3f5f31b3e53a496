"""The errors of fp8 and quantized weights, explained with a fix that works (used by ``explain``).

Weights cast with ``model.to(torch.float8_e4m3fn)`` ("fp8 base") reach ops with no fp8 arithmetic: ``Promotion
for Float8 Types is not supported`` (Nerogar/OneTrainer#442), ``"cat_cuda" not implemented for 'Float8_e4m3fn'``
(bmaltais/kohya_ss#2733), or a ``mat1 and mat2`` mismatch whose "agree on float8" fix would be wrong. What works is
fp8 *storage* computing in a half dtype (``--set C.storage=float8_e4m3fn``). fp8 matmuls need sm 8.9 (``Expected
is_sm80 || is_sm90``, bmaltais/kohya_ss#2717); MPS has no fp8 (Nerogar/OneTrainer#1689). diffusers' bitsandbytes
quantizer refuses a machine without a GPU (v0.42.1 quantizers/bitsandbytes/bnb_quantizer.py:64).
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import override_line

__all__ = ["quantized_fix", "parse_quantized", "FLOAT8_NAMES"]

FLOAT8_NAMES = ("float8_e4m3fn", "float8_e5m2")
_F8 = r"Float8_e4m3fn(?:uz)?|Float8_e5m2(?:fnuz)?"
_PATTERNS = (
    ("fp8_promotion", rf"Promotion for Float8 Types is not supported(?:, attempted to promote (?P<a>{_F8}) and (?P<b>\w+))?"),
    ("fp8_kernel", rf"\"(?P<op>\w+)\" not implemented for '(?P<a>{_F8})'"),
    ("fp8_arch", r"Expected is_sm8\w*(?: \|\| is_sm\w+)+|fp8 (?:e4m3|e5m2|types?) (?:is|are) (?:only )?supported on"
                 r"|Float8 \w+ requires CUDA (?:compute )?capability"),
    ("fp8_mps", rf"(?:MPS|mps).{{0,80}}(?:{_F8}|[Ff]loat8)|(?:{_F8}|[Ff]loat8).{{0,80}}(?:MPS|mps)"),
    ("bnb_no_gpu", r"No GPU found\. A GPU is needed for quantization"),
)


def parse_quantized(message: str) -> dict[str, str] | None:
    """Recognise an fp8/quantized-weight error message; ``{"family": ..., "op": ...}`` or ``None``.

    Example:
        >>> parse_quantized('"cat_cuda" not implemented for \\'Float8_e4m3fn\\'')
        {'family': 'fp8_kernel', 'op': 'cat_cuda'}
        >>> parse_quantized("Promotion for Float8 Types is not supported")["family"]  # as quoted in OneTrainer#442
        'fp8_promotion'
        >>> parse_quantized("Expected is_sm80 || is_sm90 to be true, but got false.")["family"]
        'fp8_arch'
        >>> parse_quantized("mat1 and mat2 must have the same dtype") is None
        True
    """
    for family, pattern in _PATTERNS:
        m = re.search(pattern, message)
        if m:
            op = m.groupdict().get("op") or ""
            return {"family": family, "op": op}
    return None


def quantized_fix(family: str, component: str | None, compute: str | None = None) -> tuple[str, str]:
    """(header, fix) for an fp8/quantized-weight error of ``component`` (``None`` when the component is unknown).

    Example:
        >>> header, fix = quantized_fix("fp8_promotion", "transformer", "bfloat16")
        >>> fix.startswith("store the weights in fp8 and compute in bfloat16: --set transformer.storage=float8_e4m3fn")
        True
    """
    comp = component or "COMPONENT"
    half = compute if compute and compute not in FLOAT8_NAMES else "bfloat16"
    storage = override_line(comp, "storage", "float8_e4m3fn")
    where = f" in {component}" if component else ""
    if family == "fp8_arch":
        return (f"fp8 compute is not supported by this GPU{where}",
                f"fp8 matmuls need CUDA compute capability 8.9+ (Ada, Hopper); keep fp8 as storage only, computed in "
                f"float16: {storage} with {override_line(comp, 'dtype', 'float16')}, or int8 weight-only: "
                f"{override_line(comp, 'storage', 'int8')} (hf_precision refuses storage=fp8-compute below sm 8.9 "
                f"before loading)")
    if family == "bnb_no_gpu":
        return (f"bitsandbytes for a diffusers model without a GPU{where}",
                f"diffusers' bitsandbytes quantizer needs a GPU (diffusers v0.42.1 quantizers/bitsandbytes/"
                f"bnb_quantizer.py:64); on this machine quantize {comp} with torchao: "
                f"{override_line(comp, 'storage', 'int8')} (or quanto-int8, fp8 storage, a GGUF file); bitsandbytes "
                f"runs on the CPU for the text encoders (transformers models): quantize={{'text_encoder_2': 'nf4'}}")
    if family == "fp8_mps":
        return (f"fp8 weights on MPS{where}",
                f"MPS has no float8 dtypes: store {comp} in float16, or quantize it with a backend that runs on MPS: "
                f"{override_line(comp, 'storage', 'quanto-int8')}")
    what = "a torch op with no fp8 kernel" if family == "fp8_kernel" else "arithmetic torch cannot do in fp8"
    return (f"fp8 weights used directly{where}: {what}",
            f"store the weights in fp8 and compute in {half}: {storage} (diffusers layerwise casting: each layer's "
            f"weights are cast to {half} on use; norms and embeddings stay {half}), or "
            f"hf_precision.load_pipeline(..., quantize={{{comp!r}: 'float8_e4m3fn'}}); never call "
            f"{comp}.to(torch.float8_e4m3fn) on a model you run")


def dtype_pair_is_fp8(got: Any, expected: Any) -> bool:
    """Whether a dtype mismatch has fp8 on one side (its "agree on one dtype" fix would be wrong)."""
    return got in FLOAT8_NAMES or expected in FLOAT8_NAMES
