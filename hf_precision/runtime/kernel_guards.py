"""Backend kernels that crash the process on some inputs, routed around where the crash is known.

optimum-quanto (v0.2.7 optimum/quanto/library/qbytes_mm.py ``qbytes_mm_impl_cpu``) sends a bfloat16 activation times
an int8 weight on the CPU to ``torch._weight_int8pack_mm`` whenever ``in_features % 4 == 0``. torch's x86 kernel for
it (aten/src/ATen/native/cpu/int8mm_kernel.cpp ``tinygemm_kernel``) walks K in steps of 8 (AVX2) or 16 (AVX512) with
*aligned* vector loads of each activation and weight row, so a K that is not a multiple of the step, or a row that
does not start on a 32-byte boundary, is a segmentation fault, not an error: measured here with K = 4 and 12 on an
AVX2 CPU (torch 2.13) and in a LoRA training step on a Sapphire Rapids CPU (torch 2.11). Real models have K a
multiple of 64; tiny and odd-sized layers do not. :func:`guard_quanto_int8pack` keeps quanto's fast path where it
is safe and sends the rest to quanto's own dequantizing matmul, which is exact to the same weights.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["int8pack_safe", "guard_quanto_int8pack"]

# The widest step any of the kernel's paths takes over K (AVX512: 16 bf16 values), and the alignment its loads need
# (32 bytes for a row of bf16; 16 for a row of int8). 64 covers both with margin for the allocator's own alignment.
_K_STEP = 16
_ALIGN = 64


def int8pack_safe(activations: torch.Tensor, weights: torch.Tensor) -> bool:
    """Whether ``torch._weight_int8pack_mm(activations.reshape(-1, K), weights, scales)`` reads only whole, aligned
    rows on every CPU kernel torch has for it.

    Example:
        >>> w = torch.zeros(8, 32, dtype=torch.int8)
        >>> int8pack_safe(torch.zeros(2, 32, dtype=torch.bfloat16), w)
        True
        >>> int8pack_safe(torch.zeros(2, 12, dtype=torch.bfloat16), torch.zeros(8, 12, dtype=torch.int8))
        False
    """
    k = activations.shape[-1]
    if k % _K_STEP:
        return False
    return (activations.is_contiguous() and activations.data_ptr() % _ALIGN == 0
            and weights.is_contiguous() and weights.data_ptr() % _ALIGN == 0)


def guard_quanto_int8pack() -> bool:
    """Route quanto's CPU int8 x bfloat16 matmul around the shapes that crash torch's kernel (see the module
    docstring); returns whether the guard is in place (False: quanto is not installed or has no such path).

    Idempotent and process-wide: quanto looks the function up by name on every call, so the guard holds for every
    quanto model in the process, including ones quantized by the caller.

    Example:
        >>> import importlib.util
        >>> guard_quanto_int8pack() == (importlib.util.find_spec("optimum.quanto") is not None)
        True
    """
    try:
        from optimum.quanto.library import qbytes_mm as lib
    except ImportError:
        return False
    original = getattr(lib, "qbytes_int8pack_mm", None)
    fallback = getattr(lib, "qbytes_mm", None)
    if original is None or fallback is None:
        return False
    if getattr(original, "_hf_precision_guard", False):
        return True

    def guarded(activations: torch.Tensor, weights: torch.Tensor, output_scales: torch.Tensor) -> Any:
        if int8pack_safe(activations, weights):
            return original(activations, weights, output_scales)
        return fallback(activations, weights, output_scales)

    guarded._hf_precision_guard = True  # type: ignore[attr-defined]
    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    lib.qbytes_int8pack_mm = guarded
    return True
