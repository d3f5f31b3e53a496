"""Backend kernels that crash or fail on some inputs, routed around where the failure is known.

optimum-quanto (v0.2.7 optimum/quanto/library/qbytes_mm.py ``qbytes_mm_impl_cpu``) sends a bfloat16 x int8 CPU
matmul to ``torch._weight_int8pack_mm`` whenever ``in_features % 4 == 0``; torch's x86 kernel
(aten/src/ATen/native/cpu/int8mm_kernel.cpp ``tinygemm_kernel``) makes aligned loads in steps of 8 (AVX2) or 16
(AVX512), so another K or a misaligned row is a segmentation fault (measured: K = 4 and 12, AVX2, torch 2.13; a
LoRA step on Sapphire Rapids, torch 2.11). :func:`guard_quanto_int8pack` sends those to quanto's exact dequantizing
matmul.

bitsandbytes (v0.50.2 nn/modules.py ``Linear4bit.forward``) repacks a 4-bit weight for its AVX512-BF16 CPU kernel
on the first call where ``has_avx512bf16()``, and the repacking (functional.py ``_convert_weight_packed_for_cpu``)
takes only output rows a multiple of 32 and inputs a multiple of the block (64); other layers raise ``N must be
divisible by block_n``. :func:`guard_bnb_cpu_packing` leaves them on the generic path every other CPU takes;
:func:`keep_bnb_unpacked` keeps a part gradients pass through off the fused kernel, which has no backward.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

__all__ = ["int8pack_safe", "guard_quanto_int8pack", "bnb_cpu_packable", "guard_bnb_cpu_packing",
           "keep_bnb_unpacked", "stale_build_locks"]

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
    """Route quanto's CPU int8 x bfloat16 matmul around the shapes that crash torch's kernel; returns whether the guard
    is in place. Idempotent and process-wide: quanto looks the function up by name on every call.

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


# bitsandbytes' CPU repacking groups output rows in blocks of 32 (``block_n``) and lays the absmax out as one column
# per quantization block of a row (functional.py ``_convert_weight_packed_for_cpu``).
_BNB_BLOCK_N = 32


def bnb_cpu_packable(out_features: int, in_features: int, blocksize: int = 64) -> bool:
    """Whether bitsandbytes can repack a 4-bit ``[out_features, in_features]`` weight for its AVX512-BF16 CPU kernel.

    Example:
        >>> bnb_cpu_packable(3072, 3072), bnb_cpu_packable(48, 64), bnb_cpu_packable(32, 32)
        (True, False, False)
    """
    return out_features % _BNB_BLOCK_N == 0 and in_features % blocksize == 0 and in_features % 2 == 0


def guard_bnb_cpu_packing() -> bool:
    """Leave the 4-bit layers bitsandbytes cannot repack for its AVX512-BF16 CPU kernel on its generic path (see the
    module docstring); returns whether the guard is in place (False: bitsandbytes is not installed or has no such
    path). Idempotent and process-wide, like :func:`guard_quanto_int8pack`.

    Example:
        >>> import importlib.util
        >>> guard_bnb_cpu_packing() == (importlib.util.find_spec("bitsandbytes") is not None)
        True
    """
    try:
        from bitsandbytes.nn import modules as lib
    except ImportError:
        return False
    original = getattr(lib, "_convert_weight_packed_for_cpu", None)
    if original is None:
        return False
    if getattr(original, "_hf_precision_guard", False):
        return True

    def guarded(qweight: torch.Tensor, quant_state: Any, *args: Any, **kwargs: Any) -> Any:
        out_features, in_features = (list(quant_state.shape) + [0, 0])[:2]
        if len(quant_state.shape) == 2 and bnb_cpu_packable(out_features, in_features, quant_state.blocksize):
            return original(qweight, quant_state, *args, **kwargs)
        return qweight, quant_state  # not flagged as packed: matmul_4bit takes the generic dequantizing path

    guarded._hf_precision_guard = True  # type: ignore[attr-defined]
    guarded.__wrapped__ = original  # type: ignore[attr-defined]
    lib._convert_weight_packed_for_cpu = guarded
    return True


def keep_bnb_unpacked(module: torch.nn.Module) -> int:
    """Keep every bitsandbytes 4-bit layer of ``module`` off the fused AVX512-BF16 CPU kernel; returns how many layers
    already repacked were unpacked (bitsandbytes' own inverse). The kernel (``gemv_4bit``) has no backward, and it
    repacks in eval mode without gradients, as a check or sample between training steps is.

    Example:
        >>> keep_bnb_unpacked(torch.nn.Linear(4, 4))
        0
    """
    unpacked = 0
    for layer in module.modules():
        if not hasattr(layer, "support_avx512bf16_for_cpu"):
            continue
        layer.support_avx512bf16_for_cpu = False
        state = getattr(layer.weight, "quant_state", None)
        if state is not None and getattr(state, "packing_format_for_cpu", False):
            from bitsandbytes.functional import _convert_weight_packed_for_cpu_inverse

            layer.weight.data, layer.weight.quant_state = _convert_weight_packed_for_cpu_inverse(layer.weight.data,
                                                                                                 state)
            unpacked += 1
    return unpacked


# quanto compiles its C++/CUDA unpackers on first use (optimum/quanto/library/extensions/extension.py ``Extension.lib``
# -> torch.utils.cpp_extension.load), which holds ``build/lock`` while it compiles (a minute or two). torch's FileBaton
# waits for that file to go, with no timeout and no word, so a build interrupted by Ctrl-C or a kill leaves every later
# quanto load of that environment hanging. A lock older than any build is left over.
_STALE_LOCK_S = 15 * 60


def _quanto_extensions() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("optimum.quanto")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "library" / "extensions"


def stale_build_locks(root: Path | None = None, older_than_s: float = _STALE_LOCK_S) -> list[Path]:
    """The extension build locks under ``root`` (default: the installed optimum-quanto's extensions) that are older
    than any build takes, so that an interrupted build left them: every later build would wait on them forever.

    Example:
        >>> import tempfile
        >>> d = Path(tempfile.mkdtemp()); (d / "cpp" / "build").mkdir(parents=True)
        >>> (d / "cpp" / "build" / "lock").touch()
        >>> stale_build_locks(d), [p.name for p in stale_build_locks(d, older_than_s=-1)]
        ([], ['lock'])
    """
    root = _quanto_extensions() if root is None else root
    if root is None:
        return []
    now = time.time()
    return sorted(p for p in Path(root).glob("*/build/lock") if now - p.stat().st_mtime > older_than_s)
