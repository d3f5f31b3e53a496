"""What to do about a mismatch: the one place that turns a dtype or device mismatch into a fix line.

For an error torch raised (:func:`mismatch_fix`, from :mod:`~hf_precision.diagnose.mismatch`) and a mismatch
``check`` recorded at a boundary (:func:`recorded_fix`). Every override printed changes the dtype of at least one
component, and where a component received another's activations the fix names that side, never the dtype the
component already has. Override lines are spelled by ``errors.override_lines``.

Nothing is imported at import time except the standard library; torch is imported inside functions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from .. import dtypes as dt
from ..errors import override_flag, override_line, override_lines
from .locate import submodule
from .quant_errors import FLOAT8_NAMES, dtype_pair_is_fp8, quantized_fix
from .wordings import HALF, PARAM_ROLES

if TYPE_CHECKING:
    from torch import nn

__all__ = ["Where", "Fix", "Override", "mismatch_fix", "recorded_fix", "compute_dtype"]

# ----------------------------------------------------------------------------------------------- what the modules hold


@dataclass
class Where:
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


def compute_dtype(root: nn.Module) -> str | None:
    """The dtype most of a component's parameter elements compute in (``None`` without floating parameters): the stored
    dtype, or a layerwise-cast layer's hook ``compute_dtype`` (diffusers/hooks/layerwise_casting.py).

    Example:
        >>> import torch
        >>> from hf_precision.runtime.patches import store_layerwise
        >>> model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.LayerNorm(8))
        >>> store_layerwise(model, torch.float8_e4m3fn, torch.float32, ["^1$"])
        >>> compute_dtype(model), model[0].weight.dtype  # stored in fp8, computed in float32
        ('float32', torch.float8_e4m3fn)
    """
    from ..runtime.patches import layerwise_hook

    counts: Counter[str] = Counter()
    for m in root.modules():
        compute = getattr(layerwise_hook(m), "compute_dtype", None)
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
        sub = submodule(root, prefix)
        if sub is not None and _values(sub, "dtype") == {dtype}:
            return prefix
    return None


# ------------------------------------------------------------------------------------ building the message and the fix

Override = tuple[str | None, str, object]  # (component, key, value); a None component is printed <component>


@dataclass(frozen=True)
class Fix:
    """What a mismatch message says: its first line, the fix, and the two sides as far as they are known
    (``sides_known``: ``got`` is the input side); ``overrides`` as :class:`~hf_precision.MismatchError` has them.
    """

    header: str
    text: str
    overrides: tuple[tuple[str, ...], ...]
    got: str | None
    expected: str | None
    sides_known: bool


_LOADER = ("load the pipeline with hf_precision.load_pipeline(...) or run hf_precision.apply_recipe(pipe) before "
           "calling it: they cast activations to each component's compute dtype at its boundary")


def mismatch_fix(parsed: dict[str, Any], w: Where) -> Fix:
    """What a parsed mismatch (:func:`~hf_precision.diagnose.wordings.parse_mismatch`) means where it happened: the
    failing module's parameters settle the sides where torch's wording does not, and the fix depends on what the
    component and the rest of the pipeline compute in.

    Example:
        >>> from hf_precision.diagnose.wordings import parse_mismatch
        >>> parsed = parse_mismatch("mat1 and mat2 must have the same dtype, but got Float and Half")
        >>> f = mismatch_fix(parsed, Where("unet.conv_in", "unet", "conv_in"))
        >>> f.header
        'dtype mismatch in unet.conv_in: input is float32, weights are float16'
        >>> f.got, f.expected, f.sides_known, f.overrides
        ('float32', 'float16', True, ())
    """
    kind = parsed["kind"]
    got, expected = parsed["a"], parsed["b"]
    ordered = parsed["ordered"]
    roles = parsed["roles"]
    weightish = roles[1] in PARAM_ROLES or not ordered
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
        half = next((d for d in (got, expected, w.input_dtype) if d and d not in FLOAT8_NAMES), None)  # the rest's
        header, fix = quantized_fix("fp8_promotion", w.component, half)
        header, overrides = f"{header} ({w.path or 'a module'}: input is {got}, weights are {expected})", []
    elif kind == "dtype":
        header, fix, overrides = _dtype_text(parsed, w, got, expected, ordered, roles)
    else:
        header, fix, overrides = _device_text(parsed, w, got, expected, ordered)
    flags = tuple(tuple(override_flag(c or "<component>", k, v) for c, k, v in alt) for alt in overrides)
    return Fix(header, fix, flags, got, expected, ordered)


def _lines(pairs: list[Override]) -> str:
    """The override line of a fix, flags quoted; ``<component>`` stands in for a model explained without its name."""
    return override_lines([(c or "<component>", k, v) for c, k, v in pairs], quoted=True)


def _agree(w: Where, dtype: str, *, keep: str | None = None) -> list[Override]:
    """Overrides that make every model of the pipeline compute in ``dtype``: only those that do not yet."""
    dts = {n: compute_dtype(m) for n, m in (w.components or {}).items()}
    return [(n, "dtype", dtype) for n, d in dts.items() if n != keep and d is not None and d != dtype]


def _by_hand(pairs: list[Override]) -> str:
    return ", ".join(f"pipe.{c}.to(torch.{v})" for c, _, v in pairs)


def _names(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _dtype_text(parsed: dict[str, Any], w: Where, got: str | None, expected: str | None, ordered: bool,
                roles: tuple[str, str]) -> tuple[str, str, list[list[Override]]]:
    got_t, exp_t = got or "another dtype", expected or "another dtype"
    where = f" in {w.path}" if w.path else ""
    weightish = ordered and roles[0] == "input" and roles[1] in PARAM_ROLES
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
    comp = compute_dtype(w.root) if w.root is not None else None

    if roles[0] == "query" and roles[1] in ("key", "value", "key and value"):
        fix = (f"attention in {path} got a {got_t} query but {exp_t} {roles[1]}: part of the attention block was cast "
               f"separately; keep the whole block in one dtype (list the block, not a projection, in "
               f"`--set {c}.keep_fp32=[...]`), or run the component through hf_precision.apply_recipe(pipe), "
               f"which casts island inputs and outputs{note}")
        return header, fix, []
    if not weightish and ordered:
        return header, *_tensors_text(w, got_t, exp_t, roles, comp)
    if parsed.get("norm") and (expected is None or comp is None):
        alt = [(w.component, "keep_fp32", [w.rel or "<norm>"])]
        fix = (f"the norm {path} has {exp_t} parameters but received {got or 'float32'} input (on CPU, norm layers "
               f"accept half input with float32 parameters, not the reverse): keep the norm in float32 with "
               f"{_lines(alt)} and {_LOADER}{note}")
        return header, fix, [alt] if w.component and w.rel else []
    if not ordered or got is None or expected is None:
        return header, *_unknown_sides_text(w, got, expected, comp, name, note)

    # Islands: the failing module's dtype differs from what the rest of its component computes in.
    if comp is not None and w.rel:
        if expected == "float32" and got in HALF and comp == got:
            island = _island(w.root, w.rel, "float32") or w.rel
            fix = (f"{path} is inside the float32 island {c}.{island} of {name}, which otherwise computes in "
                   f"{comp}, and it received {got} activations: hf_precision.apply_recipe(pipe) or "
                   f"hf_precision.load_pipeline(...) cast inputs to float32 at island boundaries and outputs back, "
                   f"with the island declared as {_lines([(w.component, 'keep_fp32', [island])])}; or remove "
                   f"the island: cast it back with pipe.{c}.{island}.to(torch.{got}){note}")
            return header, fix, [[(w.component, "keep_fp32", [island])]] if w.component else []
        if got == "float32" and expected in HALF and comp == "float32":
            island = _island(w.root, w.rel, expected) or w.rel
            why = ("on CPU, norm layers accept half input with float32 parameters but not float32 input with half "
                   "parameters; " if parsed.get("norm") else "")
            fix = (f"{why}{c}.{island} has {expected} parameters inside {name}, which otherwise computes in float32: "
                   f"cast it back with pipe.{c}.{island}.float(), or keep it in float32 with "
                   f"{_lines([(w.component, 'keep_fp32', [island])])} and hf_precision.load_pipeline(...) or "
                   f"hf_precision.apply_recipe(pipe){note}")
            return header, fix, [[(w.component, "keep_fp32", [island])]] if w.component else []
    if comp == expected:  # the component already computes in `expected`: its input came from somewhere else
        why = ("on CPU, norm layers accept half input with float32 parameters, not the reverse; "
               if parsed.get("norm") else "")
        return header, *_foreign_text(w, got, expected, name, note, why)
    if comp is not None:  # the component computes in a third dtype: make it compute in the weights' one
        alt = [(w.component, "dtype", expected)]
        fix = (f"{name} computes in {comp}, {path} has {expected} weights and received {got} activations: "
               f"{_LOADER}; or make {name} compute in {expected}: {_lines(alt)}{note}")
        return header, fix, [alt] if w.component else []
    fix = (f"{name} has {expected} weights and received {got} activations: {_LOADER}. The override that makes "
           f"the components agree depends on the dtype each one computes in: explain the error with the pipeline "
           f"(`with hf_precision.explain(pipe): ...`, or hf_precision.explain_error(err) on the caught error) to get it")
    return header, fix, []


def _foreign_text(w: Where, got: str, expected: str, name: str, note: str, why: str
                  ) -> tuple[str, list[list[Override]]]:
    """The component computes in ``expected`` and received ``got`` activations from outside itself."""
    if w.components is None:  # a bare model: its input comes from the caller
        alt: list[Override] = [(w.component, "dtype", got)]
        fix = (f"{why}{name} computes in {expected} but received {got} activations from its caller: {_LOADER}; or "
               f"cast the input to {expected} before the call (x.to(torch.{expected})); or run {name} in {got}: "
               f"{_lines(alt)}{note}")
        return fix, [alt] if w.component else []
    dts = {n: compute_dtype(m) for n, m in w.components.items()}
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
        fix += (f"; or make the pipeline agree on {expected}: {_lines(to_expected)} (with plain diffusers: "
                f"{_by_hand(to_expected)})")
        alts.append(to_expected)
    if to_got:
        fix += f"; or on {got}: {_lines(to_got)} (with plain diffusers: {_by_hand(to_got)})"
        alts.append(to_got)
    return fix, alts


def _tensors_text(w: Where, got: str, expected: str, roles: tuple[str, str], comp: str | None
                  ) -> tuple[str, list[list[Override]]]:
    """Two activations (not an input and a weight) of different dtypes meet: a mask, an indexed write, out=."""
    where = f" in {w.path}" if w.path else ""
    fix = (f"the {roles[0]} ({got}) and the {roles[1]} ({expected}) meet{where}: {_LOADER}; a tensor you pass to the "
           f"pipeline or create yourself (latents=, prompt_embeds=, an attention mask) must be in the dtype the "
           f"pipeline computes in")
    target = comp or expected
    alt = _agree(w, target) if w.components else []
    if alt:
        fix += f"; or make the pipeline agree on {target}: {_lines(alt)} (with plain diffusers: {_by_hand(alt)})"
    return fix, [alt] if alt else []


def _unknown_sides_text(w: Where, got: str | None, expected: str | None, comp: str | None, name: str, note: str
                        ) -> tuple[str, list[list[Override]]]:
    """torch does not say which side is the input, and the module's parameters do not either."""
    fix = f"{name} mixes {got or 'another dtype'} and {expected or 'another dtype'}: {_LOADER}"
    alts: list[list[Override]] = [[(w.component, "dtype", v)] for v in (expected, got)
                                   if v is not None and comp is not None and v != comp]
    if w.component and alts:
        fix += "; or make it compute in one dtype: " + " or ".join(_lines(a) for a in alts)
    return fix + note, alts if w.component else []


def _device_text(parsed: dict[str, Any], w: Where, got: str, expected: str, ordered: bool
                 ) -> tuple[str, str, list[list[Override]]]:
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


# ------------------ a mismatch check recorded (no error: the hooks saw an input in one dtype reach weights in another)


def recorded_fix(component: str, rel: str, kind: str, got: str, expected: str, applied: bool,
                 main: str | None = None) -> str:
    """The fix for a mismatch ``check`` recorded: ``component.rel`` received ``got`` but holds ``expected``. ``applied``:
    a recipe is applied (re-applying restores its hooks); ``main``: the component's :func:`compute_dtype`, so an inner
    module in another one is an undeclared island.

    Example:
        >>> recorded_fix("unet", "conv_in", "dtype", "float32", "float16", applied=False)[:60]
        'unet receives float32 but its weights are float16: hf_precis'
    """
    if kind == "dtype" and rel and main is not None and expected != main:
        # An inner module in another dtype than the rest of its component: an undeclared island.
        if expected == "float32":
            return (f"{component}.{rel} holds float32 parameters inside a {main} {component}: declare it a float32 "
                    f"island so hooks cast around it: hf_precision.apply_recipe(pipe, overrides={{'{component}': "
                    f"{{'keep_fp32': ['{rel}']}}}}) ({override_line(component, 'keep_fp32', [rel])}; the list replaces "
                    f"the recipe's, so keep its islands in it), or cast it back: pipe.{component}.{rel}.to(torch.{main})")
        return (f"{component}.{rel} holds {expected} parameters inside a {main} {component}: cast it back with "
                f"pipe.{component}.{rel}.to(torch.{main}); only float32 islands can be declared (keep_fp32)")
    if kind == "device":
        return (f"{component} runs on {expected} but receives inputs on {got}: hf_precision.apply_recipe(pipe, "
                f"device=...) moves inputs to each component's device (or load with hf_precision.load_pipeline("
                f"path, device={{'{component}': '{expected}'}})); or put the pipeline on one device: "
                f"pipe.to('{expected}')")
    if applied:
        island = override_line(component, "keep_fp32", [rel]) if rel else ""
        return (f"{component} receives {got} here but its weights are {expected}: re-apply the recipe "
                f"(hf_precision.apply_recipe(pipe)) so the boundary hooks cast it, or make the plan agree with "
                f"{override_line(component, 'dtype', got)}" + (f"; if {rel} must stay float32, declare it: {island}"
                                                               if island and got == "float32" else ""))
    return (f"{component} receives {got} but its weights are {expected}: hf_precision.apply_recipe(pipe) casts what "
            f"enters each component to its dtype; to keep this layout: hf_precision.apply_recipe(pipe, overrides="
            f"{{'{component}': {{'dtype': '{expected}'}}}}) ({override_line(component, 'dtype', expected)})")

