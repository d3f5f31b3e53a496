"""torch's dtype and device mismatch messages: every wording, and :func:`parse_mismatch` that reads them.

torch reports a mismatch from deep inside an op, in one of some thirty wordings that differ between ops, CPU kernels
(with or without oneDNN/AMX), CUDA, MPS and the meta device, and that often do not say which side is the input.
Each wording below names the torch source that raises it. This module only reads text: it imports nothing but the
standard library, so :mod:`hf_precision.diagnose.fixes` (what to do) and :mod:`hf_precision.diagnose.mismatch`
(the error and ``explain``) build on it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["parse_mismatch", "FAMILIES", "HALF", "PARAM_ROLES", "VALUE_ERROR_FAMILIES"]

# ------------------------------------------------------------------------------------------ dtype and device spellings

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
HALF = ("float16", "bfloat16")
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


# -------------------------------------------------------------------------------------------------------- the wordings

# Argument names in messages: which side the named tensor is on. "self" is ambiguous (the bias in addmm, the
# embedding table in index_select), so it is in neither set and the module's parameters decide.
_INPUT_ARGS = frozenset({"mat1", "m1", "index", "indices", "input", "query", "key", "value", "batch1", "vec"})
_PARAM_ARGS = frozenset({"mat2", "m2", "weight", "bias", "running_mean", "running_var", "mat"})
PARAM_ROLES = frozenset({"weight", "weights", "bias", "parameters"})
# ValueErrors that torch's Python code raises for the same mismatches (nn.RNN, the SDPA reference checks).
VALUE_ERROR_FAMILIES = frozenset({"rnn_dtype", "sdpa", "sdpa_device"})


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


def _family(name: str, pattern: str, parse: Callable[[re.Match[str]], dict[str, Any] | None]) -> _Family:
    return _Family(name, re.compile(pattern), parse)


_SAME = r"Expected all tensors to be on the same device"
# Most specific first; each entry: the torch source that raises it (paths in github.com/pytorch/pytorch).
FAMILIES: tuple[_Family, ...] = (
    # aten/src/ATen/native/Convolution.cpp check_input_same_type_as_parameters (CUDA, MPS, oneDNN: tensor types,
    # "... or input should be a MKLDNN tensor and weight is a dense tensor"); CPU slow conv: scalar names
    _family("input_type", r"Input type \((?P<a>[^()]+)\) and (?P<role>weight|bias) type \((?P<b>[^()]+)\) "
                          r"should be the same", lambda m: _types(m["a"], m["b"], ("input", m["role"]))),
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
            lambda m: _named("dtype", _dtype(m["a"]), _dtype(m["b"]), m["arg"])),
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


# ------------------------------------------------------------------------------------------------------------- parsing


def parse_mismatch(message: str) -> dict[str, Any] | None:
    """Recognise a torch dtype or device mismatch message; None when ``message`` (``str(err)``) is not one.

    Every wording of :data:`FAMILIES` (torch 2.4-2.13 on CPU with and without oneDNN/AMX, CUDA/ROCm, MPS, XPU and meta)
    is found, also inside a longer text (a wrapper's message, a ``torch.compile`` error). A convolution ``Input type``
    message whose two types differ in device is a device mismatch and, where the scalar types differ too, carries
    ``dtypes``. A mix with a non-floating dtype is not a precision mismatch (None). The dict: ``kind`` (``"dtype"`` or
    ``"device"``); ``a``, ``b`` (the two sides as canonical dtype names or devices: input then parameter side, or the
    sides named by ``roles`` such as ``("query", "key and value")``, when ``ordered``; ``b`` None for ``mixed dtype
    (CPU)``, both None for messages naming none); ``ordered`` (False for ``expected scalar type``, which torch prints in
    either order: :func:`explain` decides from the module's parameters); ``family`` (the wording matched); optionally
    ``argument``, ``op``, ``norm`` and ``dtypes``.

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
    for family in FAMILIES:
        m = family.pattern.search(message)
        if m is None:
            continue
        parsed = family.parse(m)
        if parsed is not None:
            parsed["family"] = family.name
            return parsed
    return None

