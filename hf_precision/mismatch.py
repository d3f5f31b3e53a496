"""Readable dtype and device mismatch errors: the failing module, the two dtypes or devices, and the override line.

torch reports a mismatch from deep inside an op, in one of about ten wordings that differ between CPU and CUDA and
often do not say which side is the input (reference: diffusers-dtype-facts.md §2.1). :func:`explain` watches which
``nn.Module`` is executing and turns such a ``RuntimeError`` into a :class:`MismatchError` that names the module,
the input-side and parameter-side dtypes (or devices) and the fix, with the original error as ``__cause__``.
Nothing else is caught: other exceptions propagate as the same object.

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
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MismatchError", "explain", "explain_error", "parse_mismatch"]

F = TypeVar("F", bound=Callable[..., Any])

# ---------------------------------------------------------------------------------------------------------------
# Dtype and device spellings
# ---------------------------------------------------------------------------------------------------------------

# Every spelling torch uses in these messages, lower-cased after dropping "c10::"/"torch."/"Tensor"/"Type":
# scalar names ("float", "c10::Half", "BFloat16", "double"), legacy tensor types ("torch.cuda.HalfTensor") and
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
_BACKEND_TYPE = re.compile(r"^(?P<dev>CPU|CUDA|HIP|MPS|XPU|Meta|HPU|MTIA)(?P<dt>\w+)Type$")  # CPUBFloat16Type
_BACKEND_DEVICES = {"hip": "cuda"}  # ROCm tensors report device type "cuda"

_T = r"[\w:]+"  # a dtype or device token: float, c10::Half, cuda:0 (never a sentence's final period)
_FAMILIES: list[tuple[str, re.Pattern[str]]] = [
    ("input_type", re.compile(
        r"Input type \((?P<a>[^()]+)\) and (?P<role>weight|bias) type \((?P<b>[^()]+)\) should be the same")),
    ("mat1_mat2", re.compile(rf"mat1 and mat2 must have the same dtype, but got (?P<a>{_T}) and (?P<b>{_T})")),
    ("self_mat2", re.compile(rf"self and mat2 must have the same dtype, but got (?P<a>{_T}) and (?P<b>{_T})")),
    ("m1_m2", re.compile(rf"expected m1 and m2 to have the same dtype, but got: (?P<a>{_T}) != (?P<b>{_T})")),
    ("scalar_type", re.compile(rf"expected scalar type '?(?P<a>{_T})'? but found '?(?P<b>{_T})'?")),
    ("mixed_dtype_cpu", re.compile(r"mixed dtype \(CPU\): (?:expect parameter to have scalar type of (?P<a>\w+)"
                                   r"|all inputs must share same datatype)")),
    ("sdpa", re.compile(rf"Expected query, key, and value to have the same dtype, but got query\.dtype: (?P<q>{_T})"
                        rf" key\.dtype: (?P<k>{_T}) and value\.dtype: (?P<v>{_T})")),
    ("devices_found", re.compile(
        r"Expected all tensors to be on the same device, but found at least two devices, (?P<a>[\w:]+) and "
        r"(?P<b>[\w:]+)!(?: \(when checking argument for argument (?P<arg>\w+) in method (?P<op>\w+)\))?")),
    ("device_got", re.compile(
        r"Expected all tensors to be on the same device, but got (?P<arg>\w+) is on (?P<a>[\w:]+), different from "
        r"other tensors on (?P<b>[\w:]+)(?: \(when checking argument in method (?P<op>\w+)\))?")),
    ("device_cpu_op", re.compile(
        r"Expected all tensors to be on the same device\. (?P<op>\w+):? expected '(?P<arg>\w+)' to be (?:a )?CPU "
        r"tensor, but got tensor on (?P<a>[\w:]+)")),
    ("expected_device", re.compile(r"Tensor on device (?P<a>[\w:]+) is not on the expected device (?P<b>[\w:]+)!")),
]
# Argument names in device messages: which side the named tensor is on. "self" is ambiguous (the bias in addmm,
# the embedding table in index_select), so it is in neither set and the module's parameters decide.
_INPUT_ARGS = frozenset({"mat1", "index", "indices", "input", "query", "key", "value"})
_PARAM_ARGS = frozenset({"mat2", "weight", "bias", "running_mean", "running_var"})


def _dtype(text: str | None) -> str | None:
    """Canonical floating dtype name for a scalar-type spelling, or ``None``."""
    if text is None:
        return None
    t = text.strip().strip("'\"")
    for prefix in ("c10::", "at::", "torch."):
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


# ---------------------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------------------


def parse_mismatch(message: str) -> dict[str, Any] | None:
    """Recognise a torch dtype or device mismatch message.

    Every family of the reference §2.1 is recognised, in its CPU and CUDA wordings: ``Input type (X) and
    weight|bias type (Y) should be the same`` (scalar, ``torch.cuda.HalfTensor`` and ``CPUBFloat16Type`` forms;
    when the two types differ in device the result is a device mismatch), ``mat1 and mat2 must have the same
    dtype``, ``expected m1 and m2 to have the same dtype``, ``expected scalar type X but found Y``, ``mixed dtype
    (CPU)``, the SDPA ``Expected query, key, and value to have the same dtype``, ``Expected all tensors to be on the
    same device`` (``found at least two devices`` and the newer ``got <arg> is on <dev>`` forms) and ``Tensor on
    device X is not on the expected device Y!``. Dtypes are returned as canonical names (``float32``, ``float16``,
    ``bfloat16``, ``float64``, ``float8_*``); a mix involving a non-floating dtype is not a precision mismatch and
    gives ``None``.

    Args:
        message (`str`): The text of the exception (``str(err)``); the mismatch may be embedded in a longer text.

    Returns:
        `dict` or `None`: ``None`` when the message is not a mismatch. Otherwise a dict with

        - ``kind``: ``"dtype"`` or ``"device"``;
        - ``a``, ``b``: the two dtypes or devices. When ``ordered`` is true, ``a`` is the input side and ``b`` the
          parameter side (for SDPA: the query and the differing key/value). ``b`` is ``None`` for
          ``mixed dtype (CPU)``, which names only the input dtype; both are ``None`` for its
          ``all inputs must share same datatype`` variant;
        - ``ordered``: whether the message says which side is which. ``expected scalar type`` does not (torch
          prints the input first for CPU convolutions but the weight first for CUDA linear layers), nor does
          ``Tensor on device X is not on the expected device Y``; :func:`explain` then decides from the failing
          module's own parameters;
        - ``roles``: names of the two sides, e.g. ``("input", "weight")``, ``("query", "key and value")``;
        - ``family``: which wording matched (``input_type``, ``mat1_mat2``, ``m1_m2``, ``scalar_type``,
          ``mixed_dtype_cpu``, ``sdpa``, ``self_mat2``, ``devices_found``, ``device_got``, ``device_cpu_op``,
          ``expected_device``);
        - optionally ``argument`` and ``op`` (device messages), ``norm`` (``mixed dtype (CPU)``: a normalisation
          layer's parameters), and ``dtypes`` (an ``Input type`` message whose devices *and* dtypes differ).

    Example:
        >>> p = parse_mismatch("Input type (float) and bias type (c10::Half) should be the same")
        >>> p["kind"], p["a"], p["b"], p["ordered"]
        ('dtype', 'float32', 'float16', True)
        >>> parse_mismatch("mat1 and mat2 must have the same dtype, but got Float and BFloat16")["b"]
        'bfloat16'
        >>> p = parse_mismatch("Expected all tensors to be on the same device, but found at least two devices, "
        ...                    "cpu and cuda:0! (when checking argument for argument index in method "
        ...                    "wrapper__index_select)")
        >>> p["kind"], p["a"], p["b"]
        ('device', 'cuda:0', 'cpu')
        >>> parse_mismatch("CUDA out of memory") is None
        True
    """
    for family, pattern in _FAMILIES:
        m = pattern.search(message)
        if m is None:
            continue
        parsed = _PARSERS[family](m)
        if parsed is not None:
            parsed["family"] = family
            return parsed
    return None


def _simple_dtype(m: re.Match[str], *, ordered: bool = True, roles: tuple[str, str] = ("input", "weight")
                  ) -> dict[str, Any] | None:
    a, b = _dtype(m["a"]), _dtype(m["b"])
    if a is None or b is None or a == b:
        return None
    return {"kind": "dtype", "a": a, "b": b, "ordered": ordered, "roles": roles}


def _input_type(m: re.Match[str]) -> dict[str, Any] | None:
    # "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor)" is a *device* mismatch in a
    # dtype-looking message (the classic "model on GPU, input on CPU" convolution error).
    (da, va), (db, vb) = _tensor_type(m["a"]), _tensor_type(m["b"])
    roles = ("input", m["role"])
    if va is not None and vb is not None and va != vb:
        out: dict[str, Any] = {"kind": "device", "a": va, "b": vb, "ordered": True, "roles": roles}
        if da is not None and db is not None and da != db:
            out["dtypes"] = (da, db)
        return out
    if da is None or db is None or da == db:
        return None
    return {"kind": "dtype", "a": da, "b": db, "ordered": True, "roles": roles}


def _mixed(m: re.Match[str]) -> dict[str, Any]:
    # The input is a_dtype (always Float in torch 2.13) and the norm's parameters are something else.
    a = _dtype(m["a"]) if m["a"] else None
    return {"kind": "dtype", "a": a, "b": None, "ordered": True, "roles": ("input", "parameters"), "norm": True}


def _sdpa(m: re.Match[str]) -> dict[str, Any] | None:
    q, k, v = _dtype(m["q"]), _dtype(m["k"]), _dtype(m["v"])
    if q is None or k is None or v is None:
        return None
    if k == v:
        other, role = k, "key and value"
    elif k != q:
        other, role = k, "key"
    else:
        other, role = v, "value"
    if other == q:
        return None
    return {"kind": "dtype", "a": q, "b": other, "ordered": True, "roles": ("query", role)}


def _device(m: re.Match[str], *, named_first: bool) -> dict[str, Any]:
    """Device families: the argument named in the message sits on ``a`` (named_first) or on ``b``."""
    groups = m.groupdict()
    arg, op = groups.get("arg"), groups.get("op")
    a = m["a"]
    b = groups.get("b") or "cpu"  # device_cpu_op: the other tensors are on the CPU
    named, other = (a, b) if named_first else (b, a)
    out: dict[str, Any] = {"kind": "device", "ordered": False, "roles": ("tensor", "other tensors")}
    if arg in _INPUT_ARGS:
        out.update(a=named, b=other, ordered=True, roles=("input", "weights"))
    elif arg in _PARAM_ARGS:
        out.update(a=other, b=named, ordered=True, roles=("input", "weights"))
    else:
        out.update(a=a, b=b)
    if arg:
        out["argument"] = arg
    if op:
        out["op"] = op
    return out


_PARSERS: dict[str, Callable[[re.Match[str]], dict[str, Any] | None]] = {
    "input_type": _input_type,
    "mat1_mat2": _simple_dtype,  # F.linear with bias: addmm(bias, input=mat1, weight.T=mat2)
    "self_mat2": lambda m: _simple_dtype(m, ordered=False, roles=("bias", "weight")),
    "m1_m2": _simple_dtype,  # F.linear without bias / matmul: m1 = input
    "scalar_type": lambda m: _simple_dtype(m, ordered=False, roles=("one tensor", "another")),
    "mixed_dtype_cpu": _mixed,
    "sdpa": _sdpa,
    # "found at least two devices, <common> and <arg's device>" ; "got <arg> is on <dev>, different from <common>"
    "devices_found": lambda m: _device(m, named_first=False),
    "device_got": lambda m: _device(m, named_first=True),
    "device_cpu_op": lambda m: _device(m, named_first=True),
    "expected_device": lambda m: {"kind": "device", "a": m["a"], "b": m["b"], "ordered": False,
                                  "roles": ("tensor", "expected device")},
}


# ---------------------------------------------------------------------------------------------------------------
# The error
# ---------------------------------------------------------------------------------------------------------------


class MismatchError(RuntimeError):
    """A dtype or device mismatch, explained: where it happened, the two sides, and the fix.

    Raised by :func:`explain` (``from`` the original error) and built by :func:`explain_error`. ``str(err)`` is
    the full message: a first line such as ``dtype mismatch in unet.time_embedding.linear_1: input is float32,
    weights are float16``, a ``fix:`` line, and torch's original message quoted at the end.

    Attributes:
        kind (`str`): ``"dtype"`` or ``"device"``.
        module (`str` or `None`): Dotted path of the innermost module executing when torch raised, e.g.
            ``"unet.time_embedding.linear_1"``; ``None`` when no module was executing (or it is unknown).
        component (`str` or `None`): The pipeline component (first path segment), e.g. ``"unet"``; ``None``
            for a bare module explained without a ``component`` name.
        got (`str` or `None`): Input-side dtype or device (``"float32"``, ``"cpu"``).
        expected (`str` or `None`): Parameter-side dtype or device (``"float16"``, ``"cuda:0"``).
        sides_known (`bool`): Whether ``got``/``expected`` are known to be the input and parameter sides. When
            neither the message nor the module's parameters tell, they are in the message's order.
        family (`str` or `None`): Which torch wording was recognised (see :func:`parse_mismatch`).
        fix (`str` or `None`): What to do, with the override line (``--set unet.dtype=float16``).
        original (`RuntimeError` or `None`): torch's error (also ``__cause__``).
    """

    def __init__(self, message: str, *, kind: str | None = None, module: str | None = None,
                 component: str | None = None, got: str | None = None, expected: str | None = None,
                 fix: str | None = None, original: BaseException | None = None, family: str | None = None,
                 sides_known: bool = True):
        super().__init__(message)
        self.kind = kind
        self.module = module
        self.component = component
        self.got = got
        self.expected = expected
        self.fix = fix
        self.original = original
        self.family = family
        self.sides_known = sides_known


def explain_error(exc: BaseException, module_path: str | None = None, *, target: Any = None
                  ) -> MismatchError | None:
    """Build the :class:`MismatchError` for an exception, if it is a dtype or device mismatch.

    For code that already knows where the error happened (the CLI, or a caller that caught the error itself).
    Nothing is raised: the caller decides (``raise err from exc``). ``err.__cause__`` is already set to ``exc``.

    Args:
        exc (`BaseException`): The exception. Only a ``RuntimeError`` whose message :func:`parse_mismatch`
            recognises is explained; a :class:`MismatchError` is returned as is.
        module_path (`str`, *optional*): Dotted path of the failing module, e.g. ``"unet.time_embedding.linear_1"``.
            Its first segment is taken as the component.
        target (pipeline or `nn.Module`, *optional*): When given with ``module_path``, the failing module is looked
            up in it, so that its parameters can tell which side is the input and float32 islands can be named.

    Returns:
        `MismatchError` or `None`: ``None`` when ``exc`` is not a mismatch.

    Example:
        >>> err = explain_error(RuntimeError("mat1 and mat2 must have the same dtype, but got Float and Half"),
        ...                     "unet.time_embedding.linear_1")
        >>> print(str(err).splitlines()[0])
        dtype mismatch in unet.time_embedding.linear_1: input is float32, weights are float16
        >>> "--set unet.dtype=float16" in err.fix
        True
        >>> explain_error(ValueError("nope")) is None
        True
    """
    if isinstance(exc, MismatchError):
        return exc
    if not isinstance(exc, RuntimeError):
        return None
    parsed = parse_mismatch(str(exc))
    if parsed is None:
        return None
    component, rel, module, root = None, None, None, None
    if module_path:
        component, _, rel = module_path.partition(".")
        if target is not None:
            component, rel, module, root = _resolve(target, module_path)
    return _build(exc, parsed, module_path=module_path, component=component, rel=rel, module=module, root=root)


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
    components = getattr(target, "components", None)
    return components if isinstance(components, Mapping) else None


# ---------------------------------------------------------------------------------------------------------------
# Building the message and the fix
# ---------------------------------------------------------------------------------------------------------------


def _values(module: nn.Module, kind: str) -> set[str]:
    """Distinct floating dtypes (or devices) of a module's own parameters and buffers, else of its subtree."""
    for recurse in (False, True):
        tensors = [*module.parameters(recurse=recurse), *module.buffers(recurse=recurse)]
        if kind == "dtype":
            found = {str(t.dtype).removeprefix("torch.") for t in tensors if t.is_floating_point()}
        else:
            found = {str(t.device) for t in tensors}
        if found:
            return found
    return set()


def _same_device(a: str, b: str) -> bool:
    """``cuda`` (from a legacy type name) matches ``cuda:0``."""
    return a == b or a.split(":")[0] == b or b.split(":")[0] == a


def _main_dtype(root: nn.Module) -> str | None:
    """The dtype most parameter elements of a component are stored in."""
    counts: Counter[str] = Counter()
    for p in root.parameters():
        if p.is_floating_point():
            counts[str(p.dtype).removeprefix("torch.")] += p.numel()
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


def _build(exc: BaseException, parsed: dict[str, Any], *, module_path: str | None, component: str | None,
           rel: str | None, module: Any = None, root: Any = None) -> MismatchError:
    """Turn a parsed mismatch plus what is known about the failing module into a MismatchError."""
    kind = parsed["kind"]
    got, expected = parsed["a"], parsed["b"]
    ordered = parsed["ordered"]
    roles = parsed["roles"]
    if module is not None and kind in ("dtype", "device") and parsed["family"] != "sdpa":
        own = _values(module, kind)
        if len(own) == 1:
            (param,) = own
            if kind == "dtype" and expected is None:  # mixed dtype (CPU) names only the input side
                expected = param
            elif not ordered and got is not None and expected is not None:
                if param in (got, expected) and got != expected:
                    got, expected = (expected, got) if param == got else (got, expected)
                    ordered, roles = True, ("input", "weights")
                elif kind == "device" and _same_device(param, got) != _same_device(param, expected):
                    got, expected = (expected, param) if _same_device(param, got) else (got, param)
                    ordered, roles = True, ("input", "weights")
    where = f" in {module_path}" if module_path else ""
    if kind == "dtype":
        header, fix = _dtype_text(parsed, where, got, expected, ordered, roles, component, rel, root, module_path)
    else:
        header, fix = _device_text(parsed, where, got, expected, ordered, roles, component)
    message = f"{header}\nfix: {fix}\ntorch: {str(exc)!r}"
    err = MismatchError(message, kind=kind, module=module_path, component=component, got=got, expected=expected,
                        fix=fix, original=exc, family=parsed["family"], sides_known=ordered)
    err.__cause__ = exc
    return err


def _set_line(component: str | None, key: str, value: str) -> str:
    """The override line in both forms: ``--set C.key=value`` (YAML: components: {C: {key: value}})."""
    c = component or "<component>"
    yaml_value = value if not value.startswith("[") else "[" + ", ".join(value[1:-1].split(",")) + "]"
    return f"`--set {c}.{key}={value}` (YAML: components: {{{c}: {{{key}: {yaml_value}}}}})"


def _dtype_text(parsed: dict[str, Any], where: str, got: str | None, expected: str | None, ordered: bool,
                roles: tuple[str, str], component: str | None, rel: str | None, root: Any,
                module_path: str | None) -> tuple[str, str]:
    got_t, exp_t = got or "another dtype", expected or "another dtype"
    if ordered and roles[0] == "query":
        header = f"dtype mismatch{where}: query is {got_t}, {roles[1]} {'are' if ' and ' in roles[1] else 'is'} {exp_t}"
    elif ordered:
        noun = "parameters" if parsed.get("norm") else "weights"
        header = f"dtype mismatch{where}: input is {got_t}, {noun} are {exp_t}"
    else:
        header = (f"dtype mismatch{where}: {got_t} and {exp_t} meet in one op "
                  f"(torch does not say which one is the input)")
    c = component or "<component>"
    name = component or "this component"
    note = "" if component else " (<component> is the pipeline attribute that holds this model, e.g. unet)"
    path = module_path or "the failing module"

    # Islands: the failing module's dtype differs from the rest of its component.
    main = _main_dtype(root) if root is not None else None
    if ordered and got is not None and expected is not None and main is not None and rel:
        if expected == "float32" and got in _HALF and main == got:
            island = _island(root, rel, "float32") or rel
            fix = (f"{path} is inside the float32 island {c}.{island} of {name}, which otherwise computes in "
                   f"{main}, and it received {got} activations: hf_precision.apply_recipe(pipe) or "
                   f"hf_precision.load_pipeline(...) cast inputs to float32 at island boundaries and outputs back, "
                   f"with the island declared as {_set_line(component, 'keep_fp32', f'[{island}]')}; or remove the "
                   f"island: leave it out of `--set {c}.keep_fp32=[...]` and cast it back with "
                   f"pipe.{c}.{island}.to(torch.{got}){note}")
            return header, fix
        if got == "float32" and expected in _HALF and main == "float32":
            island = _island(root, rel, expected) or rel
            why = ("on CPU, norm layers accept half input with float32 parameters but not float32 input with half "
                   "parameters; " if parsed.get("norm") else "")
            fix = (f"{why}{c}.{island} has {expected} parameters inside {name}, which otherwise computes in float32: "
                   f"cast it back with pipe.{c}.{island}.float(), or keep it in float32 with "
                   f"{_set_line(component, 'keep_fp32', f'[{island}]')} and hf_precision.load_pipeline(...) or "
                   f"hf_precision.apply_recipe(pipe){note}")
            return header, fix
    if parsed.get("norm"):
        params = expected or "half"
        norm_rel = rel or "<norm>"
        fix = (f"the norm {path} has {params} parameters but received {got or 'float32'} input (on CPU, norm layers "
               f"accept half input with float32 parameters, not the reverse): keep the norm in float32 with "
               f"{_set_line(component, 'keep_fp32', f'[{norm_rel}]')}, or feed {name} {params} activations: "
               f"hf_precision.load_pipeline(...) or hf_precision.apply_recipe(pipe) cast inputs at component "
               f"boundaries, with {_set_line(component, 'dtype', params)}{note}")
        return header, fix
    if ordered and roles[0] == "query":
        fix = (f"attention in {path} got a {got} query but {exp_t} {roles[1]}: part of the attention block was cast "
               f"separately; keep the whole block in one dtype (list the block, not a projection, in "
               f"`--set {c}.keep_fp32=[...]`), or run the component through hf_precision.apply_recipe(pipe), "
               f"which casts island inputs and outputs{note}")
        return header, fix
    if not ordered:
        fix = (f"{name} mixes {got_t} and {exp_t}: load it with hf_precision.load_pipeline(...) or "
               f"hf_precision.apply_recipe(pipe), which cast inputs at component boundaries; or make the dtypes "
               f"agree with the override line {_set_line(component, 'dtype', exp_t)} (or {got_t}){note}")
        return header, fix
    fix = (f"{name} received {got_t} activations but its weights are {exp_t}: load it with "
           f"hf_precision.load_pipeline(...) or hf_precision.apply_recipe(pipe), which cast inputs at component "
           f"boundaries; or make the dtypes agree with the override line {_set_line(component, 'dtype', exp_t)}"
           f"{note}")
    return header, fix


def _device_text(parsed: dict[str, Any], where: str, got: str, expected: str, ordered: bool,
                 roles: tuple[str, str], component: str | None) -> tuple[str, str]:
    if ordered:
        header = f"device mismatch{where}: input is on {got}, weights are on {expected}"
    else:
        header = f"device mismatch{where}: tensors on {got} and {expected} meet in one op"
    if parsed.get("dtypes"):
        da, db = parsed["dtypes"]
        header += f" (dtypes differ too: {da} and {db})"
    c = component or "<component>"
    name = component or "this component"
    note = "" if component else " (<component> is the pipeline attribute that holds this model, e.g. unet)"
    if "meta" in (got, expected):
        fix = (f"{name} has tensors on the meta device, i.e. weights that were never loaded (an interrupted "
               f"low_cpu_mem_usage/device_map load, or an offload hook that was removed): reload the component, "
               f"or re-enable offloading with pipe.enable_model_cpu_offload() after any hf_precision.apply_recipe; "
               f"meta tensors cannot be moved with .to(){note}")
        return header, fix
    fix = (f"{name} runs on {expected} but received inputs on {got}: load it with "
           f'hf_precision.load_pipeline(path, device={{"{c}": "{expected}"}}) or '
           f'hf_precision.apply_recipe(pipe, device="{expected}"), which move inputs to each '
           f'component\'s execution device; or put the whole pipeline on one device with pipe.to("{expected}")'
           f"{note}")
    if not ordered:
        fix += f" (torch does not say which side is the input; the other device is {got})"
    return header, fix


# ---------------------------------------------------------------------------------------------------------------
# The context manager / decorator
# ---------------------------------------------------------------------------------------------------------------


class _Session:
    """One active explain context: global module hooks, the stack of executing modules, the first failure."""

    def __init__(self, target: Any, component: str | None):
        from torch import nn

        self.thread = threading.get_ident()
        # id(module) -> (component, path inside the component); roots: component -> component module
        self.names: dict[int, tuple[str | None, str]] = {}
        self.roots: dict[str | None, nn.Module] = {}
        self.lazy = target is None  # name modules relative to the outermost executing module
        components = _components(target) if target is not None else None
        if components is not None:
            for cname, comp in components.items():
                if isinstance(comp, nn.Module):
                    self.roots.setdefault(cname, comp)
                    for n, m in comp.named_modules():
                        self.names.setdefault(id(m), (cname, n))
        elif target is not None:
            self.roots[component] = target
            for n, m in target.named_modules():
                self.names.setdefault(id(m), (component, n))
        # (module, exception being handled when it was entered); see post()
        self.stack: list[tuple[nn.Module, BaseException | None]] = []
        self.failures: list[tuple[BaseException, list[nn.Module]]] = []
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
            self.stack.append((module, sys.exc_info()[1]))

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
        if exc is not None and exc is not stack[i][1] and not any(f is exc for f, _ in self.failures):
            self.failures.append((exc, [m for m, _ in stack[: i + 1]]))
            del self.failures[:-8]
        del stack[i:]

    def chain_for(self, exc: BaseException) -> list[nn.Module]:
        """Modules executing (outermost first) where ``exc`` began.

        When ``exc`` wraps an earlier mismatch (``raise RuntimeError(...) from err`` in library code), the
        deepest exception of its cause chain that is itself a mismatch wins: that is where torch raised.
        """
        chain: list[nn.Module] | None = None
        seen: set[int] = set()
        e: BaseException | None = exc
        while e is not None and id(e) not in seen:
            seen.add(id(e))
            for f, modules in self.failures:
                if f is e and (e is exc or parse_mismatch(str(e)) is not None):
                    chain = modules
            e = e.__cause__ or e.__context__
        if chain is not None:
            return chain
        return [m for m, _ in self.stack]  # hooks did not run on the way out (e.g. under torch.compile)

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
            if not isinstance(exc, RuntimeError) or isinstance(exc, MismatchError):
                return False
            parsed = parse_mismatch(str(exc))
            if parsed is None:
                return False
            try:
                path, component, rel, module, root = session.locate(session.chain_for(exc))
                err = _build(exc, parsed, module_path=path, component=component, rel=rel, module=module, root=root)
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
    """Explain dtype and device mismatches raised inside a block or function.

    While active, torch's global module hooks (``register_module_forward_pre_hook`` /
    ``register_module_forward_hook``) track which module is executing; they are removed on exit, also on error.
    A ``RuntimeError`` whose message :func:`parse_mismatch` recognises is re-raised as a :class:`MismatchError`
    naming the innermost module that was executing when torch raised, the input-side and parameter-side dtypes (or
    devices) and the override line that fixes it, ``from`` the original error. Every other exception propagates
    unchanged, as the same object. The hooks put every module call on torch's slow path (tens of microseconds per
    call), so use this for debugging, not in production loops.

    Args:
        target (pipeline or `nn.Module`, *optional*): Where module names come from. A diffusers pipeline (anything
            with a ``components`` dict) names modules ``f"{component}.{name}"`` (``unet.time_embedding.linear_1``);
            an ``nn.Module`` by its ``named_modules()`` names; ``None`` names them inside the outermost module that
            was executing. Modules outside the target are named by class.
        component (`str`, *optional*): For an ``nn.Module`` target, the pipeline attribute it will live under
            (``"unet"``), used as the path prefix and in the override line.

    Returns:
        A context manager (``with explain(pipe): ...``) that is also a decorator (``@explain()``,
        ``@explain(pipe)``). A plain function passed directly (``@explain``) is decorated.

    Raises:
        MismatchError: From the original ``RuntimeError``, when the block raised a dtype or device mismatch.
        TypeError: ``target`` is neither ``None``, an ``nn.Module`` nor an object with a ``components`` mapping.

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
    """
    if target is not None and inspect.isroutine(target):  # bare @explain
        return _Explain(None, component)(target)
    if target is not None:
        from torch import nn

        if not isinstance(target, nn.Module) and _components(target) is None:
            raise TypeError(f"explain() expects a diffusers pipeline (an object with a `components` mapping), an "
                            f"nn.Module or None, not {type(target).__name__}")
    return _Explain(target, component)

