"""Readable dtype and device mismatch errors: the failing module, the two dtypes or devices, and a fix that works.

torch reports a mismatch from deep inside an op, in one of some thirty wordings that differ between ops, CPU kernels
(with or without oneDNN/AMX), CUDA, MPS and the meta device, and that often do not say which side is the input.
:func:`parse_mismatch` recognises them (the list, with the torch source of each, is in its docstring);
:func:`explain` watches which ``nn.Module`` is executing, or reads it from a caught exception's traceback, and
turns such an error into a :class:`MismatchError` that names the module, the input-side and parameter-side dtypes
(or devices) and a fix: every override it prints changes the dtype of at least one component, and when a
component received another component's activations the fix names that side, never the dtype the component
already has. Nothing else is caught: other exceptions propagate as the same object.

Nothing is imported at import time except the standard library; torch is imported inside functions.
"""

from __future__ import annotations

import functools
import inspect
import re
import sys
import threading
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar
from .. import dtypes as dt

from .quant_errors import FLOAT8_NAMES, dtype_pair_is_fp8, parse_quantized, quantized_fix

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MismatchError", "explain", "explain_error", "parse_mismatch"]

F = TypeVar("F", bound=Callable[..., Any])

# ---------------------------------------------------------------------------------------------------------------
# Dtype and device spellings
# ---------------------------------------------------------------------------------------------------------------

# Every spelling torch uses in these messages, lower-cased after dropping "struct "/"c10::"/"torch.": scalar names
# ("float", "c10::Half", "BFloat16", "double", "torch.float16"), legacy tensor types ("torch.cuda.HalfTensor") and
# backend types ("CPUBFloat16Type"). Only floating types are listed: an int/float mix is not a precision problem.
_DTYPES = {
    "float": "float32", "float32": "float32",
    "half": "float16", "float16": "float16",
    "bfloat16": "bfloat16",
    "double": "float64", "float64": "float64",
    **{n: n for n in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")},
}
_HALF = ("float16", "bfloat16")
_LEGACY_TENSOR = re.compile(r"^torch\.(?:(?P<dev>[a-z_]+)\.)?(?P<dt>\w+?)Tensor$")  # torch.cuda.HalfTensor
_BACKEND_TYPE = re.compile(  # CPUBFloat16Type, CUDAFloatType, MkldnnCPUFloatType
    r"^(?:Mkldnn|Sparse|Quantized)?(?P<dev>CPU|CUDA|HIP|MPS|XPU|Meta|HPU|MTIA|PrivateUse1)(?P<dt>\w+)Type$")
_BACKEND_DEVICES = {"hip": "cuda", "privateuse1": "privateuseone"}  # ROCm tensors report device type "cuda"

_T = r"(?:struct |class )?[\w:.]*\w"  # a dtype token: float, c10::Half, torch.float16 (never a sentence's period)
_D = r"[\w:]*\w"  # a device token: cpu, cuda:0, meta
_ARG = r"(?:argument #\d+ )?'(?P<{}>\w+)'"  # TensorArg: "argument #1 'input'" or "'self'"


def _dtype(text: str | None) -> str | None:
    """Canonical floating dtype name for a scalar-type spelling, or ``None``."""
    if text is None:
        return None
    t = text.strip().strip("'\"")
    for prefix in ("struct ", "class ", "c10::", "at::", "torch."):
        t = t.removeprefix(prefix)
    return _DTYPES.get(t.lower())


def _tensor_type(text: str) -> tuple[str | None, str | None]:
    """(dtype, device type) from ``float`` / ``c10::Half`` / ``torch.cuda.HalfTensor`` / ``CPUBFloat16Type``."""
    text = text.strip()
    m = _LEGACY_TENSOR.match(text)
    if m:
        return _dtype(m["dt"]), m["dev"] or "cpu"
    m = _BACKEND_TYPE.match(text)
    if m:
        dev = m["dev"].lower()
        return _dtype(m["dt"]), _BACKEND_DEVICES.get(dev, dev)
    return _dtype(text), None


def _device(text: str) -> str:
    """``cuda:0`` as is; ``CUDA`` -> ``cuda``; a bare index (``checkSameGPU``) -> ``cuda:N``, ``-1`` -> ``cpu``."""
    t = text.strip()
    if re.fullmatch(r"-?\d+", t):
        return "cpu" if int(t) < 0 else f"cuda:{t}"
    t = t.lower()
    return _BACKEND_DEVICES.get(t, t)


# ---------------------------------------------------------------------------------------------------------------
# The wordings
# ---------------------------------------------------------------------------------------------------------------

# Argument names in messages: which side the named tensor is on. "self" is ambiguous (the bias in addmm, the
# embedding table in index_select), so it is in neither set and the module's parameters decide.
_INPUT_ARGS = frozenset({"mat1", "m1", "index", "indices", "input", "query", "key", "value", "batch1", "vec"})
_PARAM_ARGS = frozenset({"mat2", "m2", "weight", "bias", "running_mean", "running_var", "mat"})
_PARAM_ROLES = frozenset({"weight", "weights", "bias", "parameters"})
# ValueErrors that torch's Python code raises for the same mismatches (nn.RNN, the SDPA reference checks).
_VALUE_ERROR_FAMILIES = frozenset({"rnn_dtype", "sdpa", "sdpa_device"})


@dataclass(frozen=True)
class _Family:
    name: str
    pattern: re.Pattern[str]
    parse: Callable[[re.Match[str]], dict[str, Any] | None]


def _pair(kind: str, a: str | None, b: str | None, ordered: bool, roles: tuple[str, str], **extra: Any
          ) -> dict[str, Any] | None:
    """The parse result, or ``None`` when the two sides are not a floating mismatch (int/float, equal)."""
    if a is None or b is None or a == b:
        return None
    return {"kind": kind, "a": a, "b": b, "ordered": ordered, "roles": roles,
            **{k: v for k, v in extra.items() if v is not None}}


def _dt(m: re.Match[str], a: str = "a", b: str = "b", *, ordered: bool = True,
        roles: tuple[str, str] = ("input", "weight")) -> dict[str, Any] | None:
    return _pair("dtype", _dtype(m[a]), _dtype(m[b]), ordered, roles)


def _named(kind: str, named: str | None, other: str | None, arg: str | None, op: str | None = None, *,
           named_first: bool = True) -> dict[str, Any] | None:
    """A message that names one argument and its dtype/device (``named``) against the others' (``other``).

    When the argument does not tell the side, the two stay in the message's order (``named_first``).
    """
    if arg in _INPUT_ARGS:
        return _pair(kind, named, other, True, ("input", "weights"), argument=arg, op=op)
    if arg in _PARAM_ARGS:
        return _pair(kind, other, named, True, ("input", "weights"), argument=arg, op=op)
    a, b = (named, other) if named_first else (other, named)
    return _pair(kind, a, b, False, ("tensor", "other tensors"), argument=arg, op=op)


def _types(ta: str, tb: str, roles: tuple[str, str], **extra: Any) -> dict[str, Any] | None:
    """Two tensor types (``torch.cuda.HalfTensor``, ``CPUBFloat16Type``, ``float``): device first, then dtype.

    ``Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor)`` is a device mismatch AND a dtype
    mismatch: the result is the device one, with ``dtypes`` = (input dtype, weight dtype).
    """
    (da, va), (db, vb) = _tensor_type(ta), _tensor_type(tb)
    if va is not None and vb is not None and va != vb:
        both = (da, db) if da is not None and db is not None and da != db else None
        return _pair("device", va, vb, True, roles, dtypes=both, **extra)
    return _pair("dtype", da, db, True, roles, **extra)


def _input_type(m: re.Match[str]) -> dict[str, Any] | None:
    return _types(m["a"], m["b"], ("input", m["role"]))


def _same_type_args(m: re.Match[str]) -> dict[str, Any] | None:
    a1, a2 = m["arg1"], m["arg2"]
    if a1 in _PARAM_ARGS and a2 not in _PARAM_ARGS:  # keep the input first
        return _types(m["b"], m["a"], ("input", a1), op=m["op"])
    return _types(m["a"], m["b"], ("input" if a1 in _INPUT_ARGS else a1, a2), op=m["op"])


def _mixed(m: re.Match[str]) -> dict[str, Any]:
    # "expect parameter to have scalar type of Float": the norm's parameters differ from its input and are not
    # float32 (CPU norms take half input only with float32 parameters). It names neither dtype: the parameters'
    # come from the module, the input's from the call (explain records it).
    return {"kind": "dtype", "a": None, "b": None, "ordered": True, "roles": ("input", "parameters"), "norm": True}


def _three(first: str, second: str, third: str) -> tuple[str | None, str]:
    """The odd one out of three dtypes, for messages that list query/key/value or self/mat/vec."""
    if second == third:
        return second, "both"
    return (second, "second") if second != first else (third, "third")


def _sdpa(kind: str) -> Callable[[re.Match[str]], dict[str, Any] | None]:
    conv = _dtype if kind == "dtype" else _device

    def parse(m: re.Match[str]) -> dict[str, Any] | None:
        q, k, v = conv(m["q"]), conv(m["k"]), conv(m["v"])
        if q is None or k is None or v is None:
            return None
        other, which = _three(q, k, v)
        role = {"both": "key and value", "second": "key", "third": "value"}[which]
        return _pair(kind, q, other, True, ("query", role))

    return parse


def _addmv(m: re.Match[str]) -> dict[str, Any] | None:
    # addmv(self=bias, mat=weight, vec=input): F.linear on a 1-D input
    s, mat, vec = _dtype(m["s"]), _dtype(m["mat"]), _dtype(m["vec"])
    if vec is not None and mat is not None and vec != mat:
        return _pair("dtype", vec, mat, True, ("input", "weight"))
    return _pair("dtype", vec, s, True, ("input", "bias"))


def _baddbmm(m: re.Match[str]) -> dict[str, Any] | None:
    # baddbmm(input, batch1, batch2): the added term (diffusers: the attention mask) against the product's dtype
    return _pair("dtype", _dtype(m["b1"]), _dtype(m["s"]), True, ("query", "attention mask (baddbmm input)"))


def _dev(m: re.Match[str], a: str = "a", b: str = "b", *, ordered: bool = False,
         roles: tuple[str, str] = ("tensor", "other tensors"), **extra: Any) -> dict[str, Any] | None:
    return _pair("device", _device(m[a]), _device(m[b]), ordered, roles, **extra)


def _groups(m: re.Match[str], name: str) -> str | None:
    return m.groupdict().get(name)


def _family(name: str, pattern: str, parse: Callable[[re.Match[str]], dict[str, Any] | None]) -> _Family:
    return _Family(name, re.compile(pattern), parse)


_SAME = r"Expected all tensors to be on the same device"
# Most specific first; each entry: the torch source that raises it (paths in github.com/pytorch/pytorch).
_FAMILIES: tuple[_Family, ...] = (
    # aten/src/ATen/native/Convolution.cpp check_input_same_type_as_parameters (CUDA, MPS, oneDNN: tensor types,
    # "... or input should be a MKLDNN tensor and weight is a dense tensor"); CPU slow conv: scalar names
    _family("input_type", r"Input type \((?P<a>[^()]+)\) and (?P<role>weight|bias) type \((?P<b>[^()]+)\) "
                          r"should be the same", _input_type),
    # aten/src/ATen/TensorUtils.cpp checkSameType / checkScalarType / checkSameGPU / checkBackend / checkDeviceType
    _family("tensor_arg_type", rf"Expected tensor for {_ARG.format('arg1')} to have the same type as tensor for "
                               rf"{_ARG.format('arg2')}; but type (?P<a>\S+) does not equal (?P<b>\S+)"
                               rf"(?: \(while checking arguments for (?P<op>\w+)\))?", _same_type_args),
    _family("tensor_arg_scalar_type", rf"Expected tensor for {_ARG.format('arg')} to have scalar type (?P<b>\w+); "
                                      rf"but got (?P<a>\S+) instead",
            lambda m: _named("dtype", _tensor_type(m["a"])[0], _dtype(m["b"]), m["arg"])),
    _family("tensor_arg_device", rf"Expected tensor for {_ARG.format('arg1')} to have the same device as tensor for "
                                 rf"{_ARG.format('arg2')}; but device (?P<a>-?\d+) does not equal (?P<b>-?\d+)",
            lambda m: _named("device", _device(m["a"]), _device(m["b"]), m["arg1"])),
    _family("tensor_arg_on_cpu", rf"Tensor for {_ARG.format('arg')} is on CPU, (?:Tensor for [^,]+ is on CPU, )?"
                                 r"but expected (?:it|them) to be on GPU",
            lambda m: _named("device", "cpu", "cuda", m["arg"])),
    _family("backend", r"Expected tensor to have (?P<b>\w+) (?:Backend|DeviceType), but got tensor with (?P<a>\w+) "
                       r"(?:Backend|DeviceType)", _dev),
    # aten/src/ATen/native/LinearAlgebra.cpp (addmm meta; CPU addmm_impl_cpu_) and native/cuda/Blas.cpp
    _family("mat1_mat2", rf"mat1 and mat2 must have the same dtype, but got (?P<a>{_T}) and (?P<b>{_T})", _dt),
    _family("self_mat2", rf"self and mat2 must have the same dtype, but got (?P<a>{_T}) and (?P<b>{_T})",
            lambda m: _dt(m, ordered=False, roles=("bias", "weight"))),
    _family("m1_m2", rf"expected (?:m1 and m2|mat1 and mat2) to have the same dtype, but got: (?P<a>{_T}) != "
                     rf"(?P<b>{_T})", _dt),
    _family("addmv", rf"addmv input tensors must have the same dtype, but got (?P<s>{_T}), (?P<mat>{_T}),? and "
                     rf"(?P<vec>{_T})", _addmv),
    _family("baddbmm", rf"Input dtypes must be the same, got: input:? (?P<s>{_T}), batch1: (?P<b1>{_T})", _baddbmm),
    _family("dot", rf"dot ?: expected both vectors to have same dtype, but found (?P<a>{_T}) and (?P<b>{_T})",
            lambda m: _dt(m, ordered=False, roles=("one vector", "the other"))),
    _family("prelu", rf"prelu: Type promoting not supported\. Got (?P<a>{_T}) and (?P<b>{_T})", _dt),
    # c10 TensorBase::data_ptr<T> ("expected scalar type X but found Y", CPU bmm/baddbmm/conv without bias/
    # grid_sample, CUDA norms); torch/_meta_registrations.py spells the dtypes torch.float32
    _family("scalar_type", rf"expected scalar type '?(?P<a>{_T})'? but found '?(?P<b>{_T})'?",
            lambda m: _dt(m, ordered=False, roles=("one tensor", "another"))),
    # aten/src/ATen/TensorIterator.cpp compute_types (binary_cross_entropy, ops that do not promote)
    _family("found_dtype", rf"Found dtype (?P<a>{_T}) but expected (?P<b>{_T})",
            lambda m: _dt(m, ordered=False, roles=("one tensor", "the common dtype"))),
    # aten/src/ATen/native/TensorFactories/UnaryOps ("Expected object of scalar type X but got scalar type Y for
    # second argument"; torch 1.x: "... for argument #2 'mat2' in call to _th_mm")
    _family("object_scalar_type", rf"Expected object of scalar type (?P<b>{_T}) but got scalar type (?P<a>{_T}) "
                                  rf"for (?:argument #\d+ '(?P<arg>\w+)'|\w+ argument|sequence element \d+)",
            lambda m: _named("dtype", _dtype(m["a"]), _dtype(m["b"]), _groups(m, "arg"))),
    # aten/src/ATen/native/mixed_dtypes.h check_mixed_data_type (CPU layer_norm, group_norm, batch_norm)
    _family("mixed_dtype_cpu", r"mixed dtype \(CPU\): (?:expect parameter to have scalar type of (?P<a>\w+)"
                               r"|all inputs must share same datatype)", _mixed),
    # aten/src/ATen/native/transformers/sdp_utils_cpp.h check_for_seq_len_0_and_consistent_head_dim / the
    # validate_sdpa_input checks; torch/nn/attention/_utils.py raises the same text as a ValueError, with commas
    _family("sdpa", rf"Expected query, key, and value to have the same dtype, but got query\.dtype: (?P<q>{_T}),? "
                    rf"key\.dtype: (?P<k>{_T}),? and value\.dtype: (?P<v>{_T})", _sdpa("dtype")),
    _family("sdpa_mask", rf"Expected attn_mask dtype to be bool or float or to match query dtype, but got "
                         rf"attn_mask\.dtype: (?P<b>{_T}),? and\s+query\.dtype: (?P<a>{_T})",
            lambda m: _dt(m, roles=("query", "attention mask"))),
    # aten/src/ATen/native/TensorAdvancedIndexing.cpp (x[mask] = y, index_copy_, put_, masked_scatter_, scatter)
    _family("index_put", rf"Index put requires the source and destination dtypes match, got (?P<b>{_T}) for the "
                         rf"destination and (?P<a>{_T}) for the source",
            lambda m: _dt(m, roles=("source", "destination"))),
    _family("index_copy", rf"self and source expected to have the same dtype, but got (?:\(self\) |self\.dtype = )"
                          rf"(?P<b>{_T}) and (?:\(source\) |source\.dtype = )(?P<a>{_T})",
            lambda m: _dt(m, roles=("source", "destination"))),
    _family("masked_scatter", rf"masked_scatter_?: expected self and source to have same dtypes but got\s*"
                              rf"(?P<b>{_T}) and (?P<a>{_T})", lambda m: _dt(m, roles=("source", "destination"))),
    _family("scatter", r"scatter(?:_add|_reduce)?\(\): Expected self\.dtype to be equal to src\.dtype",
            lambda m: {"kind": "dtype", "a": None, "b": None, "ordered": True, "roles": ("source", "destination")}),
    # aten/src/ATen/native/Lerp.cpp; aten/src/ATen/native/LinearAlgebra.cpp (out= arguments)
    _family("lerp", rf"expected dtype (?P<b>{_T}) for `(?P<arg>\w+)` but got dtype (?P<a>{_T})",
            lambda m: _dt(m, roles=(f"`{m['arg']}`", "self"))),
    _family("out_dtype", rf"Expected out tensor to have dtype (?P<b>{_T}), but got (?P<a>{_T}) instead",
            lambda m: _dt(m, roles=("out tensor", "result"))),
    # aten/src/ATen/native/RNN.cpp check_attributes; torch/nn/modules/rnn.py RNNBase.check_input (ValueError)
    _family("rnn_dtype", rf"(?:RNN input dtype \((?P<a>{_T})\) does not match weight dtype \((?P<b>{_T})\)"
                         rf"|Input and (?:parameter|hidden) tensors are not the same dtype, found input tensor with "
                         rf"(?P<a2>{_T}) and \w+ tensor with (?P<b2>{_T}))",
            lambda m: _pair("dtype", _dtype(m["a"] or m["a2"]), _dtype(m["b"] or m["b2"]), True,
                            ("input", "weights"))),
    # -- devices: aten/src/ATen/core/op_registration/adaption.h common_device_check_failure (the "found at least
    # two devices" form before torch 2.6, "got <arg> is on <device>, different from other tensors" after)
    _family("devices_found", rf"{_SAME}, but found at least two devices, (?P<b>{_D}) and (?P<a>{_D})!"
                             r"(?: \(when checking argument for argument (?P<arg>\w+) in method (?P<op>\w+)\))?",
            lambda m: _named("device", _device(m["a"]), _device(m["b"]), m["arg"], m["op"], named_first=False)),
    _family("device_got", rf"{_SAME}, but got (?P<arg>\w+) is on (?P<a>{_D}), different from other tensors on "
                          rf"(?P<b>{_D})(?: \(when checking argument in method (?P<op>\w+)\))?",
            lambda m: _named("device", _device(m["a"]), _device(m["b"]), m["arg"], m["op"])),
    # aten/src/ATen/native/LinearAlgebra.cpp addmm_impl_cpu_ (a CUDA tensor into a CPU matmul)
    _family("device_cpu_op", rf"{_SAME}\. (?P<op>\w+):? expected '(?P<arg>\w+)' to be (?:a )?CPU tensor, but got "
                             rf"tensor on (?P<a>{_D})",
            lambda m: _named("device", _device(m["a"]), "cpu", m["arg"], m["op"])),
    # aten/src/ATen/TensorIterator.cpp / native/TensorShape.cpp (meta tensors: weights never loaded)
    _family("expected_device", rf"Tensor on device (?P<a>{_D}) is not on the expected device (?P<b>{_D})!",
            lambda m: _dev(m, roles=("tensor", "expected device"))),
    _family("sdpa_device", rf"Expected query, key, and value to have the same device type, but got query\.device: "
                           rf"(?P<q>{_D}),? key\.device: (?P<k>{_D}),? and value\.device: (?P<v>{_D})",
            _sdpa("device")),
    _family("rnn_device", rf"Input and (?:parameter|hidden) tensors are not at the same device, found input tensor "
                          rf"at (?P<a>{_D}) and \w+ tensor at (?P<b>{_D})",
            lambda m: _dev(m, ordered=True, roles=("input", "weights"))),
    # aten/src/ATen/native/mps/OperationUtils.mm (a CPU tensor in an MPS graph) and mps/operations/Linear.mm
    _family("mps_placeholder", r"Placeholder storage has not been allocated on MPS device",
            lambda m: _pair("device", "cpu", "mps", False, ("tensor", "MPS tensors"))),
    _family("mps_argument", rf"Tensor for argument (?P<arg>\w+) is on (?P<a>{_D}) but expected on (?P<b>{_D})",
            lambda m: _named("device", _device(m["a"]), _device(m["b"]), m["arg"])),
    # aten/src/ATen/native/TensorAdvancedIndexing.cpp index_put_ (value on another device)
    _family("index_put_device", rf"expected device (?P<b>{_D}) but got device (?P<a>{_D}) for value tensor",
            lambda m: _dev(m, ordered=True, roles=("source", "destination"))),
    _family("object_device_type", rf"Expected object of device type (?P<b>\w+) but got device type (?P<a>\w+) for "
                                  rf"argument #\d+ '(?P<arg>\w+)'",
            lambda m: _named("device", _device(m["a"]), _device(m["b"]), m["arg"])),
)


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------


def parse_mismatch(message: str) -> dict[str, Any] | None:
    """Recognise a torch dtype or device mismatch message.

    Every wording torch 2.4-2.13 raises for these mismatches on CPU (with and without oneDNN/AMX), CUDA/ROCm,
    MPS, XPU and the meta device is recognised, also embedded in a longer text (a wrapper's message, a
    ``torch.compile`` error). Dtype forms: ``Input type (X) and weight|bias type (Y) should be the same`` (scalar
    names, ``torch.cuda.HalfTensor`` / ``torch.HalfTensor`` and ``CPUBFloat16Type`` / ``CUDABFloat16Type`` spellings,
    with or without ``... or input should be a MKLDNN tensor``), ``mat1 and mat2 must have the same dtype``, ``self
    and mat2 must have the same dtype``, ``expected m1 and m2`` / ``expected mat1 and mat2 to have the same dtype``,
    ``expected scalar type X but found Y`` (both orders, also ``torch.float32`` spellings), ``Found dtype X but
    expected Y``, ``mixed dtype (CPU)``, SDPA's ``Expected query, key, and value to have the same dtype`` and its
    ``attn_mask`` check, ``Input dtypes must be the same`` (baddbmm), ``addmv input tensors``, ``dot``, ``prelu``,
    ``Index put requires the source and destination dtypes match``, ``index_copy_``/``put_``/``masked_scatter``/
    ``scatter``, ``expected dtype X for `end``` (lerp), ``Expected out tensor to have dtype``, the RNN checks,
    ``Expected tensor for argument #1 'input' to have the same type as tensor for argument #2 'weight'`` and
    ``... to have scalar type``, ``Expected object of scalar type``. Device forms: ``Expected all tensors to be on
    the same device`` (``found at least two devices, X and Y!``, ``got <arg> is on X, different from other tensors
    on Y`` and ``addmm: expected 'mat1' to be a CPU tensor``), ``Tensor on device X is not on the expected device
    Y!``, ``Expected tensor for argument #1 'input' to have the same device as tensor for argument #2 'weight'``,
    ``Tensor for argument #1 'input' is on CPU, but expected it to be on GPU``, ``Expected tensor to have CUDA
    Backend``/``DeviceType``, SDPA's ``same device type``, the RNN check, MPS's ``Placeholder storage has not been
    allocated`` and ``Tensor for argument input is on cpu but expected on mps``, index_put's value device, and the
    convolution ``Input type`` message whose two types differ in device (``torch.FloatTensor`` against
    ``torch.cuda.HalfTensor``): a device mismatch and, when the scalar types differ too, a dtype mismatch at once.

    Dtypes are returned as canonical names (``float32``, ``float16``, ``bfloat16``, ``float64``, ``float8_*``); a
    mix involving a non-floating dtype is not a precision mismatch and gives ``None``.

    Args:
        message (`str`): The text of the exception (``str(err)``).

    Returns:
        `dict` or `None`: ``None`` when the message is not a mismatch. Otherwise a dict with

        - ``kind``: ``"dtype"`` or ``"device"``;
        - ``a``, ``b``: the two dtypes or devices. When ``ordered`` is true, ``a`` is the input side and ``b`` the
          parameter side, or the sides named by ``roles``. ``b`` is ``None`` for ``mixed dtype (CPU)``, which names
          only the input dtype; both are ``None`` for messages that name no dtype (``scatter()``);
        - ``ordered``: whether the message says which side is which. ``expected scalar type`` does not (torch
          prints the input first for CPU convolutions but the weight first for CUDA linear layers); :func:`explain`
          then decides from the failing module's own parameters;
        - ``roles``: names of the two sides, e.g. ``("input", "weight")``, ``("query", "key and value")``,
          ``("source", "destination")``;
        - ``family``: which wording matched (``input_type``, ``mat1_mat2``, ``m1_m2``, ``scalar_type``,
          ``devices_found``, ...);
        - optionally ``argument`` and ``op`` (messages that name them), ``norm`` (``mixed dtype (CPU)``: a
          normalisation layer's parameters), and ``dtypes`` (a device mismatch whose dtypes differ too:
          (input dtype, weight dtype)).

    Example:
        >>> p = parse_mismatch("Input type (float) and bias type (c10::Half) should be the same")
        >>> p["kind"], p["a"], p["b"], p["ordered"]
        ('dtype', 'float32', 'float16', True)
        >>> parse_mismatch("mat1 and mat2 must have the same dtype, but got Float and BFloat16")["b"]
        'bfloat16'
        >>> p = parse_mismatch("Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor) should be "
        ...                    "the same or input should be a MKLDNN tensor and weight is a dense tensor")
        >>> p["kind"], p["a"], p["b"], p["dtypes"]
        ('device', 'cpu', 'cuda', ('float32', 'float16'))
        >>> p = parse_mismatch("Expected all tensors to be on the same device, but got mat1 is on cpu, different "
        ...                    "from other tensors on cuda:0 (when checking argument in method wrapper_CUDA_addmm)")
        >>> p["kind"], p["a"], p["b"], p["argument"]
        ('device', 'cpu', 'cuda:0', 'mat1')
        >>> parse_mismatch("CUDA out of memory") is None
        True
    """
    for family in _FAMILIES:
        m = family.pattern.search(message)
        if m is None:
            continue
        parsed = family.parse(m)
        if parsed is not None:
            parsed["family"] = family.name
            return parsed
    return None


def _parse_exception(exc: BaseException | None) -> dict[str, Any] | None:
    """:func:`parse_mismatch` of an exception: a ``RuntimeError``, or a ``ValueError`` of torch's Python checks."""
    if not isinstance(exc, (RuntimeError, ValueError)) or isinstance(exc, MismatchError):
        return None
    parsed = parse_mismatch(str(exc))
    if parsed is None or (not isinstance(exc, RuntimeError) and parsed["family"] not in _VALUE_ERROR_FAMILIES):
        return None
    return parsed


# ---------------------------------------------------------------------------------------------------------------
# The error
# ---------------------------------------------------------------------------------------------------------------


class MismatchError(RuntimeError):
    """A dtype or device mismatch, explained: where it happened, the two sides, and the fix.

    Raised by :func:`explain` (``from`` the original error) and returned by ``explain(err)`` and
    :func:`explain_error`. ``str(err)`` is the full message: a first line such as ``dtype mismatch in
    unet.time_embedding.linear_1: input is float32, weights are float16``, a ``fix:`` line, and torch's original
    message quoted at the end.

    Attributes:
        kind (`str`): ``"dtype"`` or ``"device"`` (a device mismatch whose dtypes differ too has ``dtypes``).
        module (`str` or `None`): Dotted path of the innermost module executing when torch raised, e.g.
            ``"unet.time_embedding.linear_1"``; ``None`` when no module was executing (or it is unknown).
        component (`str` or `None`): The pipeline component (first path segment), e.g. ``"unet"``; ``None``
            for a bare module explained without a ``component`` name.
        got (`str` or `None`): Input-side dtype or device (``"float32"``, ``"cpu"``).
        expected (`str` or `None`): Parameter-side dtype or device (``"float16"``, ``"cuda:0"``).
        dtypes (`tuple` or `None`): For a device mismatch whose dtypes differ as well (CUDA's ``Input type
            (torch.FloatTensor) and weight type (torch.cuda.HalfTensor)``): (input dtype, weight dtype).
        sides_known (`bool`): Whether ``got``/``expected`` are known to be the input and parameter sides. When
            neither the message nor the module's parameters tell, they are in the message's order.
        family (`str` or `None`): Which torch wording was recognised (see :func:`parse_mismatch`).
        fix (`str` or `None`): What to do, with the override lines (``--set text_encoder_2.dtype=float16``).
        overrides (`tuple`): The override alternatives the fix prints, each a tuple of ``--set`` values
            (``("text_encoder.dtype=float16", "text_encoder_2.dtype=float16")``); every one changes the dtype of
            the components it names. Empty when the fix has no override line.
        original (`RuntimeError` or `None`): torch's error (also ``__cause__``).
    """

    def __init__(self, message: str, *, kind: str | None = None, module: str | None = None,
                 component: str | None = None, got: str | None = None, expected: str | None = None,
                 fix: str | None = None, original: BaseException | None = None, family: str | None = None,
                 sides_known: bool = True, dtypes: tuple[str, str] | None = None,
                 overrides: tuple[tuple[str, ...], ...] = ()):
        super().__init__(message)
        self.kind = kind
        self.module = module
        self.component = component
        self.got = got
        self.expected = expected
        self.dtypes = dtypes
        self.fix = fix
        self.overrides = overrides
        self.original = original
        self.family = family
        self.sides_known = sides_known


def explain_error(exc: BaseException, module_path: str | None = None, *, target: Any = None
                  ) -> MismatchError | None:
    """Build the :class:`MismatchError` for an exception, if it is a dtype or device mismatch.

    For code that caught the error itself (``hf_precision.explain(err)`` calls this). Nothing is raised: the
    caller decides (``raise err from exc``). ``err.__cause__`` is already set to ``exc``. Without
    ``module_path`` and ``target``, the failing module and the pipeline are read from the exception's traceback
    (the ``self`` of the ``forward`` frames), so a caught error is explained as well as one raised under
    ``with explain(pipe):``.

    Args:
        exc (`BaseException`): The exception. A ``RuntimeError`` (or one of torch's mismatch ``ValueError``\\ s)
            whose message :func:`parse_mismatch` recognises is explained; a :class:`MismatchError` is returned as is.
        module_path (`str`, *optional*): Dotted path of the failing module, e.g. ``"unet.time_embedding.linear_1"``.
            Its first segment is taken as the component.
        target (pipeline or `nn.Module`, *optional*): When given with ``module_path``, the failing module is looked
            up in it, so that its parameters can tell which side is the input, float32 islands can be named and the
            fix can name the other components.

    Returns:
        `MismatchError` or `None`: ``None`` when ``exc`` is not a mismatch.

    Example:
        >>> err = explain_error(RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Half"),
        ...                     "unet.time_embedding.linear_1")
        >>> print(str(err).splitlines()[0])
        dtype mismatch in unet.time_embedding.linear_1: input is float32, weights are float16
        >>> "load_pipeline" in err.fix, err.overrides   # no pipeline given: no override can be known to help
        (True, ())
        >>> explain_error(ValueError("nope")) is None
        True
    """
    if isinstance(exc, MismatchError):
        return exc
    parsed = _parse_exception(exc)
    if parsed is None:
        if parse_quantized(str(exc)) is None:
            return None
        if module_path is None:
            chain, pipeline, input_dtype = _traceback_modules(exc)
            names = _Names(pipeline if pipeline is not None else target, None)
            return _quantized_error(exc, _Where(*names.locate(chain), names.components, input_dtype))
        return _quantized_error(exc, _Where(module_path, module_path.partition(".")[0], module_path.partition(".")[2]))
    if module_path is None and target is None:
        chain, pipeline, input_dtype = _traceback_modules(exc)
        names = _Names(pipeline, None)
        return _build(exc, parsed, _Where(*names.locate(chain), names.components, input_dtype))
    component, rel, module, root, components = None, None, None, None, None
    if module_path:
        component, _, rel = module_path.partition(".")
        if target is not None:
            component, rel, module, root = _resolve(target, module_path)
            comps = _components(target)
            components = _models(target, comps) if comps is not None else None
    return _build(exc, parsed, _Where(module_path, component, rel, module, root, components))


def _traceback_modules(exc: BaseException) -> tuple[list[nn.Module], Any, str | None]:
    """Modules whose ``forward`` frames are in the traceback (outermost first), the pipeline being called (or
    ``None``) and the dtype of the innermost module's first floating input (from its frame's arguments).

    A mismatch that library code wrapped (``raise RuntimeError(...) from err``) is followed into its cause, whose
    traceback holds the deeper frames.
    """
    from torch import nn

    chain: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not c for c in chain):
        chain.append(e)
        nxt = e.__cause__ or e.__context__
        e = nxt if _parse_exception(nxt) is not None else None
    modules: list[nn.Module] = []
    pipeline = None
    input_dtype = None
    for e in chain:
        tb = e.__traceback__
        while tb is not None:
            local = tb.tb_frame.f_locals
            owner = local.get("self")
            if isinstance(owner, nn.Module):
                if all(owner is not m for m in modules):
                    modules.append(owner)
                    input_dtype = _first_dtype(v for k, v in local.items() if k != "self")
            elif pipeline is None and owner is not None and _components(owner) is not None:
                pipeline = owner
            tb = tb.tb_next
    return modules, pipeline, input_dtype


def _first_dtype(values: Any) -> str | None:
    """Dtype of the first floating tensor among ``values`` (a forward's arguments), looking one level into
    tuples (``_call_impl``'s ``args``)."""
    import torch

    for v in values:
        for t in (v if isinstance(v, (tuple, list)) else (v,)):
            if isinstance(t, torch.Tensor) and t.is_floating_point():
                return dt.from_torch(t.dtype)
    return None


def _resolve(target: Any, path: str) -> tuple[str | None, str | None, Any, Any]:
    """(component, path inside it, module, component module) for a dotted path in a pipeline or module."""
    from torch import nn

    first, _, rest = path.partition(".")
    components = _components(target)
    if components is not None:
        root = components.get(first)
        if isinstance(root, nn.Module):
            return first, rest, _submodule(root, rest), root
        return first, rest, None, None
    if isinstance(target, nn.Module):
        module = _submodule(target, path)
        if module is not None:
            return None, path, module, target
        if rest:  # "unet.time_embedding" against the bare unet: the first segment names the component
            return first, rest, _submodule(target, rest), target
    return first, rest, None, None


def _submodule(root: nn.Module, rel: str) -> nn.Module | None:
    try:
        return root.get_submodule(rel) if rel else root
    except AttributeError:
        return None


def _components(target: Any) -> Mapping[str, Any] | None:
    """The ``components`` mapping of a pipeline-like object, else ``None``."""
    from torch import nn

    if isinstance(target, nn.Module):
        return None
    try:
        components = getattr(target, "components", None)
    except Exception:  # a property that fails is not a pipeline
        return None
    return components if isinstance(components, Mapping) else None


def _models(pipe: Any, components: Mapping[str, Any]) -> dict[str, nn.Module]:
    """The pipeline's models in data-flow order (diffusers' ``model_cpu_offload_seq``, then the rest)."""
    from torch import nn

    order = [n for n in str(getattr(pipe, "model_cpu_offload_seq", "") or "").split("->") if n]
    names = [n for n in order if n in components] + [n for n in components if n not in order]
    return {n: components[n] for n in names if isinstance(components[n], nn.Module)}


# ---------------------------------------------------------------------------------------------------------------
# What the modules hold
# ---------------------------------------------------------------------------------------------------------------


@dataclass
class _Where:
    """Where a mismatch happened: module path, component and its module, and the pipeline's models if known."""

    path: str | None
    component: str | None
    rel: str | None
    module: Any = None
    root: Any = None
    components: Mapping[str, Any] | None = None
    input_dtype: str | None = None  # the failing module's first floating input, when the call was seen


def _values(module: nn.Module, kind: str) -> set[str]:
    """Distinct floating dtypes (or devices) of a module's own parameters and buffers, else of its subtree."""
    for recurse in (False, True):
        tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
        if kind == "dtype":
            found = {dt.from_torch(t.dtype) for t in tensors if t.is_floating_point()}
        else:
            found = {str(t.device) for t in tensors}
        if found:
            return found
    return set()


def _same_device(a: str, b: str) -> bool:
    """``cuda`` (from a legacy type name) matches ``cuda:0``."""
    return a == b or a.split(":")[0] == b or b.split(":")[0] == a


def _compute_dtype(root: nn.Module) -> str | None:
    """The dtype most of a component's parameter elements compute in.

    A layer under diffusers' layerwise casting (diffusers/hooks/layerwise_casting.py) stores one dtype and computes
    in its hook's ``compute_dtype``; every other parameter computes in the dtype it is stored in.
    """
    counts: Counter[str] = Counter()
    for m in root.modules():
        hooks = getattr(getattr(m, "_diffusers_hook", None), "hooks", None)
        hook = hooks.get("layerwise_casting") if isinstance(hooks, Mapping) else None
        compute = getattr(hook, "compute_dtype", None)
        for p in m.parameters(recurse=False):
            if p.is_floating_point():
                counts[dt.from_torch(compute or p.dtype)] += p.numel()
    return counts.most_common(1)[0][0] if counts else None


def _main_device(root: nn.Module) -> str | None:
    counts: Counter[str] = Counter(str(p.device) for p in root.parameters())
    return counts.most_common(1)[0][0] if counts else None


def _island(root: nn.Module, rel: str, dtype: str) -> str | None:
    """Outermost module on the path to ``rel`` whose floating parameters are all ``dtype`` (the island)."""
    parts = rel.split(".") if rel else []
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        sub = _submodule(root, prefix)
        if sub is not None and _values(sub, "dtype") == {dtype}:
            return prefix
    return None


# ---------------------------------------------------------------------------------------------------------------
# Building the message and the fix
# ---------------------------------------------------------------------------------------------------------------

_Override = tuple[str | None, str, str]  # (component, key, value)
_LOADER = ("load the pipeline with hf_precision.load_pipeline(...) or run hf_precision.apply_recipe(pipe) before "
           "calling it: they cast activations to each component's compute dtype at its boundary")


def _build(exc: BaseException, parsed: dict[str, Any], w: _Where) -> MismatchError:
    """Turn a parsed mismatch plus what is known about the failing module into a MismatchError."""
    kind = parsed["kind"]
    got, expected = parsed["a"], parsed["b"]
    ordered = parsed["ordered"]
    roles = parsed["roles"]
    weightish = roles[1] in _PARAM_ROLES or not ordered
    if parsed.get("norm"):  # mixed dtype (CPU) names neither side: the input is what the norm was called with
        got = w.input_dtype
    if w.module is not None and weightish:  # the module's own parameters tell which side is the input
        own = _values(w.module, kind)
        if len(own) == 1:
            (param,) = own
            if parsed.get("norm"):
                expected = param if param != got else None
            elif not ordered and got is not None and expected is not None:
                if kind == "dtype" and param in (got, expected):
                    got, expected = (expected, got) if param == got else (got, expected)
                    ordered, roles = True, ("input", "weights")
                elif kind == "device" and _same_device(param, got) != _same_device(param, expected):
                    got, expected = (expected, param) if _same_device(param, got) else (got, param)
                    ordered, roles = True, ("input", "weights")
    if kind == "dtype" and dtype_pair_is_fp8(got, expected):
        # fp8 weights computed with directly: "agree on float8" would be no fix (quant_errors.py)
        header, fix = quantized_fix("fp8_promotion", w.component, _compute_of(w, got, expected))
        header, overrides = f"{header} ({w.path or 'a module'}: input is {got}, weights are {expected})", []
    elif kind == "dtype":
        header, fix, overrides = _dtype_text(parsed, w, got, expected, ordered, roles)
    else:
        header, fix, overrides = _device_text(parsed, w, got, expected, ordered)
    message = f"{header}\nfix: {fix}\ntorch: {str(exc)!r}"
    flags = tuple(tuple(f"{c}.{k}={v}" for c, k, v in alt) for alt in overrides)
    err = MismatchError(message, kind=kind, module=w.path, component=w.component, got=got, expected=expected,
                        fix=fix, original=exc, family=parsed["family"], sides_known=ordered,
                        dtypes=parsed.get("dtypes"), overrides=flags)
    err.__cause__ = exc
    return err


def _compute_of(w: _Where, got: str | None, expected: str | None) -> str | None:
    """The half dtype the rest of the pipeline computes in, beside fp8 weights."""
    return next((d for d in (got, expected, w.input_dtype) if d and d not in FLOAT8_NAMES), None)


def _quantized_error(exc: BaseException | None, w: _Where) -> MismatchError | None:
    """An fp8/quantized-weight error (quant_errors.py) as a MismatchError with its fix, or None."""
    if not isinstance(exc, (RuntimeError, NotImplementedError, ValueError)) or isinstance(exc, MismatchError):
        return None
    found = parse_quantized(str(exc))
    if found is None:
        return None
    header, fix = quantized_fix(found["family"], w.component, w.input_dtype)
    err = MismatchError(f"{header}{' (' + w.path + ')' if w.path else ''}\nfix: {fix}\ntorch: {str(exc)!r}",
                        kind="quantized", module=w.path, component=w.component, fix=fix, original=exc,
                        family=found["family"])
    err.__cause__ = exc
    return err


def _set_line(component: str | None, key: str, value: str) -> str:
    """The override line in both forms: ``--set C.key=value`` (YAML: components: {C: {key: value}})."""
    return _set_lines([(component, key, value)])


def _set_lines(pairs: list[_Override]) -> str:
    """Several overrides: ``--set A.dtype=x --set B.dtype=x`` (YAML: components: {A: {dtype: x}, B: {...}})."""
    flags = " ".join(f"--set {c or '<component>'}.{k}={v}" for c, k, v in pairs)
    grouped: dict[str, list[str]] = {}
    for c, k, v in pairs:
        yaml_value = v if not v.startswith("[") else "[" + ", ".join(v[1:-1].split(",")) + "]"
        grouped.setdefault(c or "<component>", []).append(f"{k}: {yaml_value}")
    yaml = ", ".join(f"{c}: {{{', '.join(items)}}}" for c, items in grouped.items())
    return f"`{flags}` (YAML: components: {{{yaml}}})"


def _agree(w: _Where, dtype: str, *, keep: str | None = None) -> list[_Override]:
    """Overrides that make every model of the pipeline compute in ``dtype``: only those that do not yet."""
    dts = {n: _compute_dtype(m) for n, m in (w.components or {}).items()}
    return [(n, "dtype", dtype) for n, d in dts.items() if n != keep and d is not None and d != dtype]


def _by_hand(pairs: list[_Override]) -> str:
    return ", ".join(f"pipe.{c}.to(torch.{v})" for c, _, v in pairs)


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _dtype_text(parsed: dict[str, Any], w: _Where, got: str | None, expected: str | None, ordered: bool,
                roles: tuple[str, str]) -> tuple[str, str, list[list[_Override]]]:
    got_t, exp_t = got or "another dtype", expected or "another dtype"
    where = f" in {w.path}" if w.path else ""
    weightish = ordered and roles[0] == "input" and roles[1] in _PARAM_ROLES
    if weightish:
        noun = "parameters" if parsed.get("norm") else "weights"
        header = f"dtype mismatch{where}: input is {got_t}, {noun} are {exp_t}"
    elif ordered:
        verb = "are" if roles[1].endswith("s") or " and " in roles[1] else "is"
        header = f"dtype mismatch{where}: {roles[0]} is {got_t}, {roles[1]} {verb} {exp_t}"
    else:
        header = (f"dtype mismatch{where}: {got_t} and {exp_t} meet in one op "
                  f"(torch does not say which one is the input)")
    c = w.component or "<component>"
    name = w.component or "this component"
    note = "" if w.component else " (<component> is the pipeline attribute that holds this model, e.g. unet)"
    path = w.path or "the failing module"
    comp = _compute_dtype(w.root) if w.root is not None else None

    if roles[0] == "query" and roles[1] in ("key", "value", "key and value"):
        fix = (f"attention in {path} got a {got_t} query but {exp_t} {roles[1]}: part of the attention block was cast "
               f"separately; keep the whole block in one dtype (list the block, not a projection, in "
               f"`--set {c}.keep_fp32=[...]`), or run the component through hf_precision.apply_recipe(pipe), "
               f"which casts island inputs and outputs{note}")
        return header, fix, []
    if not weightish and ordered:
        return header, *_tensors_text(w, got_t, exp_t, roles, comp)
    if parsed.get("norm") and (expected is None or comp is None):
        alt = [(w.component, "keep_fp32", f"[{w.rel or '<norm>'}]")]
        fix = (f"the norm {path} has {exp_t} parameters but received {got or 'float32'} input (on CPU, norm layers "
               f"accept half input with float32 parameters, not the reverse): keep the norm in float32 with "
               f"{_set_lines(alt)} and {_LOADER}{note}")
        return header, fix, [alt] if w.component and w.rel else []
    if not ordered or got is None or expected is None:
        return header, *_unknown_sides_text(w, got, expected, comp, name, note)

    # Islands: the failing module's dtype differs from what the rest of its component computes in.
    if comp is not None and w.rel:
        if expected == "float32" and got in _HALF and comp == got:
            island = _island(w.root, w.rel, "float32") or w.rel
            fix = (f"{path} is inside the float32 island {c}.{island} of {name}, which otherwise computes in "
                   f"{comp}, and it received {got} activations: hf_precision.apply_recipe(pipe) or "
                   f"hf_precision.load_pipeline(...) cast inputs to float32 at island boundaries and outputs back, "
                   f"with the island declared as {_set_line(w.component, 'keep_fp32', f'[{island}]')}; or remove "
                   f"the island: cast it back with pipe.{c}.{island}.to(torch.{got}){note}")
            return header, fix, [[(w.component, "keep_fp32", f"[{island}]")]] if w.component else []
        if got == "float32" and expected in _HALF and comp == "float32":
            island = _island(w.root, w.rel, expected) or w.rel
            why = ("on CPU, norm layers accept half input with float32 parameters but not float32 input with half "
                   "parameters; " if parsed.get("norm") else "")
            fix = (f"{why}{c}.{island} has {expected} parameters inside {name}, which otherwise computes in float32: "
                   f"cast it back with pipe.{c}.{island}.float(), or keep it in float32 with "
                   f"{_set_line(w.component, 'keep_fp32', f'[{island}]')} and hf_precision.load_pipeline(...) or "
                   f"hf_precision.apply_recipe(pipe){note}")
            return header, fix, [[(w.component, "keep_fp32", f"[{island}]")]] if w.component else []
    if comp == expected:  # the component already computes in `expected`: its input came from somewhere else
        why = ("on CPU, norm layers accept half input with float32 parameters, not the reverse; "
               if parsed.get("norm") else "")
        return header, *_foreign_text(w, got, expected, name, note, why)
    if comp is not None:  # the component computes in a third dtype: make it compute in the weights' one
        alt = [(w.component, "dtype", expected)]
        fix = (f"{name} computes in {comp}, {path} has {expected} weights and received {got} activations: "
               f"{_LOADER}; or make {name} compute in {expected}: {_set_lines(alt)}{note}")
        return header, fix, [alt] if w.component else []
    fix = (f"{name} has {expected} weights and received {got} activations: {_LOADER}. The override that makes "
           f"the components agree depends on the dtype each one computes in: explain the error with the pipeline "
           f"(`with hf_precision.explain(pipe): ...`, or hf_precision.explain(err) on the caught error) to get it")
    return header, fix, []


def _foreign_text(w: _Where, got: str, expected: str, name: str, note: str, why: str
                  ) -> tuple[str, list[list[_Override]]]:
    """The component computes in ``expected`` and received ``got`` activations from outside itself."""
    if w.components is None:  # a bare model: its input comes from the caller
        alt: list[_Override] = [(w.component, "dtype", got)]
        fix = (f"{why}{name} computes in {expected} but received {got} activations from its caller: {_LOADER}; or "
               f"cast the input to {expected} before the call (x.to(torch.{expected})); or run {name} in {got}: "
               f"{_set_lines(alt)}{note}")
        return fix, [alt] if w.component else []
    dts = {n: _compute_dtype(m) for n, m in w.components.items()}
    names = list(dts)  # data-flow order: the components before this one produced its input
    upstream = names[: names.index(w.component)] if w.component in names else names
    producers = [n for n in upstream if dts[n] == got] or [n for n, d in dts.items() if n != w.component and d == got]
    to_expected = _agree(w, expected, keep=w.component)
    to_got = _agree(w, got)
    if producers:
        source = f" from {_names(producers)} (computing in {got})"
    else:
        source = (f", and no other component computes in {got}: the tensor was passed to the pipeline or made by "
                  f"its code (latents=, prompt_embeds=, noise): create it in {expected}")
    fix = f"{why}{name} computes in {expected} but received {got} activations{source}. {_LOADER.capitalize()}"
    alts = []
    if to_expected:
        fix += (f"; or make the pipeline agree on {expected}: {_set_lines(to_expected)} (with plain diffusers: "
                f"{_by_hand(to_expected)})")
        alts.append(to_expected)
    if to_got:
        fix += f"; or on {got}: {_set_lines(to_got)} (with plain diffusers: {_by_hand(to_got)})"
        alts.append(to_got)
    return fix, alts


def _tensors_text(w: _Where, got: str, expected: str, roles: tuple[str, str], comp: str | None
                  ) -> tuple[str, list[list[_Override]]]:
    """Two activations (not an input and a weight) of different dtypes meet: a mask, an indexed write, out=."""
    where = f" in {w.path}" if w.path else ""
    fix = (f"the {roles[0]} ({got}) and the {roles[1]} ({expected}) meet{where}: {_LOADER}; a tensor you pass to the "
           f"pipeline or create yourself (latents=, prompt_embeds=, an attention mask) must be in the dtype the "
           f"pipeline computes in")
    target = comp or expected
    alt = _agree(w, target) if w.components else []
    if alt:
        fix += f"; or make the pipeline agree on {target}: {_set_lines(alt)} (with plain diffusers: {_by_hand(alt)})"
    return fix, [alt] if alt else []


def _unknown_sides_text(w: _Where, got: str | None, expected: str | None, comp: str | None, name: str, note: str
                        ) -> tuple[str, list[list[_Override]]]:
    """torch does not say which side is the input, and the module's parameters do not either."""
    fix = f"{name} mixes {got or 'another dtype'} and {expected or 'another dtype'}: {_LOADER}"
    alts: list[list[_Override]] = [[(w.component, "dtype", v)] for v in (expected, got)
                                   if v is not None and comp is not None and v != comp]
    if w.component and alts:
        fix += "; or make it compute in one dtype: " + " or ".join(_set_lines(a) for a in alts)
    return fix + note, alts if w.component else []


def _device_text(parsed: dict[str, Any], w: _Where, got: str, expected: str, ordered: bool
                 ) -> tuple[str, str, list[list[_Override]]]:
    where = f" in {w.path}" if w.path else ""
    dtypes = parsed.get("dtypes")
    if ordered and dtypes:
        header = (f"device and dtype mismatch{where}: input is {dtypes[0]} on {got}, weights are {dtypes[1]} on "
                  f"{expected}")
    elif ordered:
        header = f"device mismatch{where}: input is on {got}, weights are on {expected}"
    else:
        header = f"device mismatch{where}: tensors on {got} and {expected} meet in one op"
        if dtypes:
            header += f" (dtypes differ too: {dtypes[0]} and {dtypes[1]})"
    c = w.component or "<component>"
    name = w.component or "this component"
    note = "" if w.component else " (<component> is the pipeline attribute that holds this model, e.g. unet)"
    if "meta" in (got, expected):
        fix = (f"{name} has tensors on the meta device, i.e. weights that were never loaded (an interrupted "
               f"low_cpu_mem_usage/device_map load, or an offload hook that was removed): reload the component, "
               f"or re-enable offloading with pipe.enable_model_cpu_offload() after any hf_precision.apply_recipe; "
               f"meta tensors cannot be moved with .to(){note}")
        return header, fix, []
    loader = (f'load it with hf_precision.load_pipeline(path, device={{"{c}": "{expected}"}}) or '
              f'hf_precision.apply_recipe(pipe, device="{expected}"), which move inputs to each component\'s '
              f"execution device" + (" and cast them to its compute dtype" if dtypes else ""))
    elsewhere = [n for n, m in (w.components or {}).items()
                 if (d := _main_device(m)) is not None and not _same_device(d, expected)]
    if ordered and w.components is not None and not elsewhere:
        fix = (f"every component runs on {expected}: the input on {got} was passed to the pipeline or made by its "
               f'code (latents=, prompt_embeds=, image=): create it on {expected} (x.to("{expected}")); or {loader}')
    else:
        moved = f" (moves {_names(elsewhere)})" if elsewhere else ""
        fix = (f"{name} runs on {expected} but received inputs on {got}: {loader}; or put the whole pipeline on one "
               f'device with pipe.to("{expected}"){moved}{note}')
        if not ordered:
            fix += f" (torch does not say which side is the input; the other device is {got})"
    if dtypes:
        fix += (f"; the dtypes differ too ({dtypes[0]} input, {dtypes[1]} weights): by hand, move and cast the input "
                f'together: x.to("{expected}", torch.{dtypes[1]})')
    return header, fix, []


# ---------------------------------------------------------------------------------------------------------------
# Naming modules; the context manager / decorator
# ---------------------------------------------------------------------------------------------------------------


class _Names:
    """Module names of a target: a pipeline (``component.path``), an ``nn.Module``, or lazily the outermost module."""

    def __init__(self, target: Any, component: str | None):
        from torch import nn

        # id(module) -> (component, path inside the component); roots: component -> component module
        self.names: dict[int, tuple[str | None, str]] = {}
        self.roots: dict[str | None, nn.Module] = {}
        self.components: dict[str, nn.Module] | None = None  # the pipeline's models, for fixes that name them
        self.lazy = target is None  # name modules relative to the outermost executing module
        components = _components(target) if target is not None else None
        if components is not None:
            self.components = _models(target, components)
            for cname, comp in self.components.items():
                self.roots.setdefault(cname, comp)
                for n, m in comp.named_modules():
                    self.names.setdefault(id(m), (cname, n))
        elif target is not None:
            self.roots[component] = target
            for n, m in target.named_modules():
                self.names.setdefault(id(m), (component, n))

    def locate(self, chain: list[nn.Module]) -> tuple[str | None, str | None, str | None, Any, Any]:
        """(module path, component, path inside the component, module, component module) of the innermost module."""
        if not chain:
            return None, None, None, None, None
        inner = chain[-1]
        if self.lazy and id(chain[0]) not in self.names:
            self.roots[None] = chain[0]
            for n, m in chain[0].named_modules():
                self.names.setdefault(id(m), (None, n))
        hit = self.names.get(id(inner))
        if hit is None:  # not in the target: name it inside the nearest known module that contains it
            for outer in reversed(chain[:-1]):
                known = self.names.get(id(outer))
                if known is None:
                    continue
                rel = next((n for n, m in outer.named_modules() if m is inner), None)
                if rel is not None:
                    hit = (known[0], ".".join(p for p in (known[1], rel) if p))
                    break
        if hit is None:
            return type(inner).__name__, None, None, inner, None
        component, rel = hit
        path = ".".join(p for p in (component, rel) if p) or type(inner).__name__
        return path, component, rel, inner, self.roots.get(component)


class _Session(_Names):
    """One active explain context: global module hooks, the stack of executing modules, the failures seen."""

    def __init__(self, target: Any, component: str | None):
        super().__init__(target, component)
        self.thread = threading.get_ident()
        # (module, exception being handled when it was entered, its arguments); see post()
        self.stack: list[tuple[nn.Module, BaseException | None, Any]] = []
        # (exception, modules executing outermost first, dtype of the innermost one's first floating input)
        self.failures: list[tuple[BaseException, list[nn.Module], str | None]] = []
        self.handles: list[Any] = []

    def start(self) -> None:
        from torch.nn.modules import module as torch_module

        self.handles.append(torch_module.register_module_forward_pre_hook(self.pre))
        # always_call: the hook also runs when forward raises, so the stack stays balanced even if the caller
        # catches the error and goes on; the failure is recorded there, at the innermost module first.
        self.handles.append(torch_module.register_module_forward_hook(self.post, always_call=True))

    def stop(self) -> None:
        handles, self.handles = self.handles, []
        for h in handles:
            h.remove()

    def pre(self, module: nn.Module, args: Any) -> None:
        if threading.get_ident() == self.thread:
            self.stack.append((module, sys.exc_info()[1], args))

    def post(self, module: nn.Module, args: Any, output: Any) -> None:
        if threading.get_ident() != self.thread:
            return
        stack = self.stack
        for i in range(len(stack) - 1, -1, -1):
            if stack[i][0] is module:
                break
        else:
            return
        # torch calls always_call hooks from its `except` block when forward raised, so sys.exc_info() is the
        # escaping exception; on a normal return it is whatever was already being handled when the module was
        # entered (usually None). The first module to see a new exception is the innermost one.
        exc = sys.exc_info()[1]
        if exc is not None and exc is not stack[i][1] and not any(f[0] is exc for f in self.failures):
            self.failures.append((exc, [m for m, _, _ in stack[: i + 1]], _first_dtype(stack[i][2])))
            del self.failures[:-8]
        del stack[i:]

    def chain_for(self, exc: BaseException) -> tuple[list[nn.Module], str | None]:
        """Modules executing (outermost first) where ``exc`` began, and the innermost one's input dtype.

        When ``exc`` wraps an earlier mismatch (``raise RuntimeError(...) from err`` in library code), the
        deepest exception of its cause chain that is itself a mismatch wins: that is where torch raised.
        """
        found: tuple[list[nn.Module], str | None] | None = None
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            for f, modules, input_dtype in self.failures:
                if f is e and (e is exc or parse_mismatch(str(e)) is not None):
                    found = modules, input_dtype
            e = e.__cause__ or e.__context__
        if found is not None:
            return found
        if self.stack:  # hooks did not run on the way out (e.g. under torch.compile)
            return [m for m, _, _ in self.stack], _first_dtype(self.stack[-1][2])
        modules, _, input_dtype = _traceback_modules(exc)
        return modules, input_dtype


class _Explain:
    """Context manager and decorator returned by :func:`explain`."""

    def __init__(self, target: Any, component: str | None):
        self._target = target
        self._component = component
        self._session: _Session | None = None

    def __enter__(self) -> _Explain:
        if self._session is not None:
            raise RuntimeError("this hf_precision.explain() context is already active; use a new explain(...)")
        session = _Session(self._target, self._component)
        session.start()
        self._session = session
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> bool:
        session, self._session = self._session, None
        if session is None:
            return False
        try:
            session.stop()
            parsed = _parse_exception(exc)
            if parsed is None and parse_quantized(str(exc)) is None:
                return False
            assert exc is not None
            try:
                chain, input_dtype = session.chain_for(exc)
                names: _Names = session
                if self._target is None:  # name modules inside the pipeline being called, if there is one
                    pipeline = _traceback_modules(exc)[1]
                    if pipeline is not None:
                        names = _Names(pipeline, None)
                where = _Where(*names.locate(chain), names.components, input_dtype)
                err = _build(exc, parsed, where) if parsed is not None else _quantized_error(exc, where)
                if err is None:
                    return False
            except Exception:  # a bug here must never hide the user's error: let the original propagate
                return False
        finally:
            session.failures.clear()
            session.stack.clear()
        raise err from exc

    def __call__(self, func: F) -> F:
        target, component = self._target, self._component

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            with _Explain(target, component):
                return func(*args, **kwargs)

        return wrapper  # type: ignore[return-value]


def explain(target: Any = None, *, component: str | None = None) -> Any:
    """Explain dtype and device mismatches: around a block or function, or of an error you caught.

    As a context manager or decorator, torch's global module hooks (``register_module_forward_pre_hook`` /
    ``register_module_forward_hook``) track which module is executing while it is active; they are removed on
    exit, also on error. An error whose message :func:`parse_mismatch` recognises is re-raised as a
    :class:`MismatchError` naming the innermost module that was executing when torch raised, the input-side and
    parameter-side dtypes (or devices) and the fix, ``from`` the original error. Every other exception propagates
    unchanged, as the same object. The hooks put every module call on torch's slow path (tens of microseconds per
    call), so use this for debugging, not in production loops.

    Given a caught exception, ``explain(err)`` returns its :class:`MismatchError` (``None`` when it is not a
    mismatch), reading the failing module and the pipeline from the exception's traceback.

    Every override line of a fix changes the dtype of the components it names. When a component received another
    component's activations (its weights already have the dtype it computes in), the fix names the loader, which
    casts at component boundaries, or the components to change so that the pipeline agrees on one dtype, never
    the dtype the failing component already has.

    Args:
        target (pipeline, `nn.Module`, exception or function, *optional*): Where module names come from. A
            diffusers pipeline (anything with a ``components`` dict) names modules ``f"{component}.{name}"``
            (``unet.time_embedding.linear_1``) and lets the fix name other components; an ``nn.Module`` by its
            ``named_modules()`` names; ``None`` names them inside the pipeline being called, else inside the
            outermost module that was executing. Modules outside the target are named by class. An exception is
            explained at once (see above); a plain function passed directly (``@explain``) is decorated.
        component (`str`, *optional*): For an ``nn.Module`` target, the pipeline attribute it will live under
            (``"unet"``), used as the path prefix and in the override line.

    Returns:
        A context manager (``with explain(pipe): ...``) that is also a decorator (``@explain()``,
        ``@explain(pipe)``); for an exception, its `MismatchError` or `None`.

    Raises:
        MismatchError: From the original error, when the block raised a dtype or device mismatch.
        TypeError: ``target`` is neither ``None``, a pipeline (an object with a ``components`` mapping), an
            ``nn.Module``, a caught exception nor a function.

    Example:
        >>> import torch
        >>> model = torch.nn.Sequential(torch.nn.Linear(4, 4)).to(torch.float16)
        >>> try:
        ...     with explain(model, component="unet"):
        ...         model(torch.randn(2, 4))
        ... except MismatchError as err:
        ...     print(str(err).splitlines()[0])
        ...     print(err.got, err.expected, type(err.__cause__).__name__)
        dtype mismatch in unet.0: input is float32, weights are float16
        float32 float16 RuntimeError
        >>> try:
        ...     model(torch.randn(2, 4))
        ... except RuntimeError as caught:
        ...     err = explain(caught)
        >>> err.module, err.got, err.expected, err.overrides
        ('0', 'float32', 'float16', ())
        >>> explain(ValueError("not a mismatch")) is None
        True
    """
    if isinstance(target, BaseException):
        return explain_error(target)
    if target is not None and inspect.isroutine(target):  # bare @explain
        return _Explain(None, component)(target)
    if target is not None:
        from torch import nn

        if not isinstance(target, nn.Module) and _components(target) is None:
            raise TypeError(f"explain() expects a diffusers pipeline (an object with a `components` mapping), an "
                            f"nn.Module, a caught exception (explain(err) returns its MismatchError) or None, not "
                            f"{type(target).__name__}")
    return _Explain(target, component)
