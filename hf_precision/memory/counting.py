"""Counting the bytes of the tensors a forward makes on torch's ``meta`` device (shapes, no storage).

A ``TorchDispatchMode`` adds every tensor the ops create and subtracts it when Python frees it: the high-water mark
is the forward's activation peak, on diffusers' own code path. Attention counts as a fused kernel (the output, not
the score matrix), as ``F.scaled_dot_product_attention`` runs on CUDA and CPU.
"""

from __future__ import annotations

import contextlib
import weakref
from typing import Any, Iterator

__all__ = ["count_live_bytes", "with_values"]

# Small integer and bool meta tensors (attention masks, token counts) keep their values on the CPU beside them, so
# code that reads them runs on meta: Lumina 2 takes ``mask.sum(dim=1).tolist()`` (transformer_lumina2.py), HunyuanVideo
# Framepack slices the prompt by ``mask.sum(dim=1)[0]`` (an ``.item()``); each op on them is repeated on the values.
_VALUES: dict[int, tuple[Any, Any]] = {}
_VALUE_LIMIT = 1 << 16  # elements: masks and ids, never activations
# ops whose result depends on their tensor argument's shape and dtype only, not on its values
_SHAPE_ONLY = ("new_ones", "new_zeros", "new_full", "new_empty", "ones_like", "zeros_like", "full_like", "empty_like")
# ops whose result's values are known from their arguments alone: kept for float results too, since code tests them
# as HunyuanVideo 1.5 does `if torch.all(image_embeds == 0)` on the zero image embeddings of text-to-video
# (diffusers v0.42.1 transformer_hunyuan_video15.py:701-702), which the training plan makes with new_zeros
_FILLS = ("new_ones", "new_zeros", "new_full", "ones_like", "zeros_like", "full_like", "zeros", "ones", "full")


def with_values(t: Any) -> Any:
    """A CPU tensor on the meta device; a small integer or bool one (a mask) keeps its values for the ops that read
    them (``.tolist()``, ``.item()``, slicing by a length) under :func:`count_live_bytes`.

    Example:
        >>> import torch
        >>> mask = with_values(torch.ones(2, 3, dtype=torch.long))
        >>> with count_live_bytes():
        ...     lengths = mask.sum(dim=1).tolist()
        >>> mask.device.type, lengths
        ('meta', [3, 3])
    """
    meta = t.to("meta")
    if not t.is_floating_point() and t.numel() <= _VALUE_LIMIT:
        _remember(meta, t.detach().clone())
    return meta


def _remember(meta: Any, values: Any) -> None:
    key = id(meta)
    _VALUES[key] = (weakref.ref(meta), values)
    weakref.finalize(meta, _VALUES.pop, key, None)


def _values(t: Any) -> Any:
    entry = _VALUES.get(id(t))
    return entry[1] if entry is not None and entry[0]() is t else None


def _read(func: Any, args: Any, kwargs: Any) -> Any:
    """What an op that reads a meta tensor's values out (``.item()``, ``.to("cpu")``) gives, or None."""
    import torch

    values = _values(args[0]) if args and isinstance(args[0], torch.Tensor) else None
    if values is None:
        return None
    if func is torch.ops.aten._local_scalar_dense.default:
        return values.item()
    device = kwargs.get("device")
    if func is torch.ops.aten._to_copy.default and device is not None and torch.device(device).type == "cpu":
        return values.to(dtype=kwargs.get("dtype") or values.dtype, copy=True)
    return None


def _carry_values(func: Any, args: Any, kwargs: Any, outs: list[Any]) -> None:
    """Repeat an op on the values of its meta inputs when its meta outputs (``outs``, flattened) are small integer
    or bool tensors."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    name = func.__name__.split(".")[0]
    flat, spec = tree_flatten((args, kwargs))
    # float values start at a fill and follow the ops on it (the boundary cast to the compute dtype, `== 0`)
    floats = name in _FILLS or any(isinstance(a, torch.Tensor) and _values(a) is not None for a in flat)
    if not any(isinstance(t, torch.Tensor) and t.device.type == "meta" and (floats or not t.is_floating_point())
               and t.numel() <= _VALUE_LIMIT for t in outs):
        return
    shape_only = name in _SHAPE_ONLY
    cpu = []
    for a in flat:
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            values = _values(a)
            if values is None and not shape_only:
                return  # a value this op reads is unknown: its outputs' values are too
            a = torch.empty(a.shape, dtype=a.dtype) if values is None else values
        elif isinstance(a, torch.device) and a.type == "meta":
            a = torch.device("cpu")
        cpu.append(a)
    cpu_args, cpu_kwargs = tree_unflatten(cpu, spec)
    try:
        got = tree_flatten(func(*cpu_args, **cpu_kwargs))[0]
    except Exception:  # noqa: BLE001 - values are a help to code that reads them; the count goes on without them
        return
    for m, c in zip(outs, got):
        if isinstance(m, torch.Tensor) and isinstance(c, torch.Tensor) and m.device.type == "meta" \
                and c.shape == m.shape and c.numel() <= _VALUE_LIMIT:
            _remember(m, c)


class _LiveBytes:
    """High-water mark of the bytes of tensors created by ops (meta device) and still referenced from Python."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.refs: dict[int, list[int]] = {}

    def add(self, t: Any) -> None:
        key = t.untyped_storage()._cdata
        entry = self.refs.get(key)
        if entry is None:
            entry = self.refs[key] = [t.untyped_storage().nbytes(), 0]
            self.live += entry[0]
            self.peak = max(self.peak, self.live)
        entry[1] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.live -= entry[0]
            del self.refs[key]


def _cpu_conv3d_workspace(args: Any, out: Any) -> int:
    """Transient bytes PyTorch's CPU conv3d takes beyond its output (aten/src/ATen/native/Convolution.cpp,
    ``ConvParams::use_mkldnn``): float32 with ``N*C*D*H <= 20480`` and a kernel up to 3x3 runs ``slow_conv3d``, whose
    column buffer is (C_in*kD*kH*kW) x (output voxels); otherwise oneDNN reorders a copy of the input.
    """
    x, w = args[0], args[1]
    if x.dim() != 5 or x.dtype.itemsize != 4:
        return 0
    groups = args[8] if len(args) > 8 else 1
    n, c, d, h = x.shape[:4]
    native = groups == 1 and not (w.shape[-1] > 3 and w.shape[-2] > 3) and n == 1 and n * c * d * h <= 20480
    if native:
        return int(w.shape[1] * w.shape[2] * w.shape[3] * w.shape[4] * out.shape[2] * out.shape[3] * out.shape[4]
                   * x.element_size())
    return int(x.numel() * x.element_size())


@contextlib.contextmanager
def count_live_bytes(cpu: bool = False, grad: bool = False) -> Iterator[_LiveBytes]:
    """Count the bytes of meta tensors the ops inside create, while they are alive: ``.peak`` is the high-water mark.
    ``grad=True`` keeps autograd on, so what a forward saves for backward and the gradients count too (the training
    plan's step peak).

    Example:
        >>> import torch
        >>> with count_live_bytes() as live:
        ...     x = torch.empty(256, device="meta") * 2   # the empty input and the product: 2 x 1 KiB
        >>> live.peak
        2048
    """
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    live = _LiveBytes()
    reads = (torch.ops.aten._local_scalar_dense.default, torch.ops.aten._to_copy.default)

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func in reads:
                read = _read(func, args, kwargs)
                if read is not None:
                    return read
            out = func(*args, **kwargs)
            flat = tree_flatten(out)[0]
            _carry_values(func, args, kwargs, flat)
            for t in flat:
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    live.add(t)
            if cpu and func is torch.ops.aten.convolution.default:
                live.peak = max(live.peak, live.live + _cpu_conv3d_workspace(args, out))
            return out

    sdpa = F.scaled_dot_product_attention

    class FusedWithGrad(torch.autograd.Function):
        """A flash kernel under autograd: saves q, k, v, the output and the per-row logsumexp; backward gives
        gradients shaped like q, k, v (what torch's flash/efficient SDPA backward allocates)."""

        @staticmethod
        def forward(ctx, query, key, value):
            out = query.new_empty((*query.shape[:-1], value.shape[-1]))
            lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(query, key, value, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def fused(query, key, value, *args, **kwargs):  # a fused kernel: the output, no (L x S) score matrix
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
            return FusedWithGrad.apply(query, key, value)
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    autocast = torch.autocast
    tensor = torch.tensor

    def meta_tensor(data: Any, *args: Any, device: Any = None, **kwargs: Any) -> Any:
        # torch.tensor(data, device="meta") shows the dispatch modes no op, so its values would be lost: HiDream's
        # patchify builds its per-sample sizes so, and unpatchify slices by them (transformer_hidream_image.py:714,
        # :694-696). Made on the CPU and moved, a small integer one keeps them as with_values keeps a mask's.
        if device is not None and torch.device(device).type == "meta":
            return with_values(tensor(data, *args, **kwargs))
        return tensor(data, *args, device=device, **kwargs)

    def meta_autocast(device_type: str, *args: Any, **kwargs: Any) -> Any:
        # Mochi computes its rotary tables under torch.autocast(freqs.device.type, torch.float32)
        # (diffusers v0.42.1 transformer_mochi.py:286), and autocast refuses the meta device: nothing to cast there.
        return contextlib.nullcontext() if device_type == "meta" else autocast(device_type, *args, **kwargs)

    from torch.fx.experimental import _config as fx_config

    F.scaled_dot_product_attention = fused
    torch.autocast = meta_autocast
    torch.tensor = meta_tensor
    try:
        # Mochi's attention keeps the prompt tokens torch.nonzero(mask) finds (attention_processor.py
        # MochiAttnProcessor2_0); on meta that count is unknown, and all of them is the padded, largest case.
        with (torch.enable_grad() if grad else torch.no_grad()), Mode(), \
                fx_config.patch(meta_nonzero_assume_all_nonzero=True):
            yield live
    finally:
        F.scaled_dot_product_attention = sdpa
        torch.autocast = autocast
        torch.tensor = tensor
