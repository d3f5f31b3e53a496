"""Quantized storage as a recipe choice: the names, their backends, their exact bytes, and the ``quantize:`` key.

A component's ``storage`` is a float dtype (``float8_e4m3fn``: diffusers layerwise casting, cast to the compute
dtype per layer on use) or a layout below, loaded through the backends diffusers and transformers ship
(``PipelineQuantizationConfig``), never a kernel written here. Which device runs which is ``devices.yaml``'s
``storage:``; what a component tolerates is its recipe's ``quantize:``. Torch-free.

Bytes per quantized ``nn.Linear`` weight (:func:`weight_bytes`, from each :class:`QuantChoice`'s fields) were
measured on the backends' tensors (``tests/test_quantize.py`` checks loaded models): int8 data plus per-row scales
(torchao's with an int8 zero point; quanto's in the compute dtype, with ``input_scale``/``output_scale`` per
layer), or bitsandbytes 4-bit's ``ceil(n / 2)``, an fp32 absmax per 64 and a 64-byte ``quant_state.code`` per layer
(bitsandbytes 0.50.2 functional.py quantize_4bit makes one per call).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Mapping
from typing import Any

from .. import dtypes as dt
from ..errors import arg, override_fix, override_line

__all__ = ["QuantChoice", "CHOICES", "quanto_group", "canonical_storage", "is_quantized", "storage_names",
           "weight_bytes", "stored_bytes", "check_storage_value", "check_quantize_value", "DEFAULT_KEEP", "BACKEND_PACKAGES", "storage_options",
           "library_refusal"]


@dataclasses.dataclass(frozen=True)
class QuantChoice:
    """One backend-quantized storage layout: its backend, how its bytes are counted, and the aliases people type."""

    name: str
    backend: str           # torchao | quanto | bitsandbytes
    scheme: str            # the backend's own name for it
    aliases: tuple[str, ...]
    data_bits: int         # bits per weight element
    row_scale: str         # dtype of the per-output-row scale: a dtype name, "compute", or "" (none)
    row_extra: int         # further bytes per output row (a zero point)
    block: int = 0         # elements per block with one fp32 absmax (bitsandbytes 4-bit)
    layer_scalars: int = 0  # scalar buffers per quantized layer, in the compute dtype (quanto's input/output scales)
    layer_bytes: int = 0    # further bytes per quantized layer (bitsandbytes 4-bit: its 16-entry fp32 code table)
    group: int = 0          # largest input group (quanto 4/2-bit: 128; the group it picks: quanto_group)
    group_params: int = 0   # values per group in the compute dtype (quanto 4/2-bit: a scale and a shift)
    why: str = ""


CHOICES: dict[str, QuantChoice] = {c.name: c for c in (
    QuantChoice("int8", "torchao", "Int8WeightOnlyConfig", ("torchao-int8", "int8wo", "int8_weight_only"), 8,
                "float32", 1, why="int8 weights, per-row fp32 scale; dequantized to the compute dtype per matmul"),
    QuantChoice("quanto-int8", "quanto", "int8", ("qint8",), 8, "compute", 0, layer_scalars=2,
                why="optimum-quanto qint8 weights, per-row scale in the compute dtype"),
    QuantChoice("quanto-float8", "quanto", "float8", ("qfloat8",), 8, "compute", 0, layer_scalars=2,
                why="optimum-quanto qfloat8 (e4m3) weights, per-row scale in the compute dtype; fp8 matmul not needed"),
    QuantChoice("quanto-int4", "quanto", "int4", ("qint4",), 4, "", 0, layer_scalars=2, group=128, group_params=2,
                why="optimum-quanto qint4 weights (two per byte), a scale and a shift in the compute dtype per group "
                    "of 128 (or 96, 64, 32) inputs of a row, or per row"),
    QuantChoice("quanto-int2", "quanto", "int2", ("qint2",), 2, "", 0, layer_scalars=2, group=128, group_params=2,
                why="optimum-quanto qint2 weights (four per byte), a scale and a shift in the compute dtype per group "
                    "of 128 (or 96, 64, 32) inputs of a row, or per row"),
    QuantChoice("fp8-compute", "torchao", "Float8DynamicActivationFloat8WeightConfig",
                ("float8dq", "torchao-float8", "fp8_compute"), 8, "float32", 0,
                why="fp8 weights and activations (torchao), fp8 tensor-core matmuls: CUDA compute capability 8.9+"),
    QuantChoice("nf4", "bitsandbytes", "nf4", ("bnb-nf4", "bnb_nf4"), 4, "", 0, block=64, layer_bytes=64,
                why="bitsandbytes 4-bit NormalFloat (QLoRA), fp32 absmax per 64 weights"),
    QuantChoice("fp4", "bitsandbytes", "fp4", ("bnb-fp4",), 4, "", 0, block=64, layer_bytes=64,
                why="bitsandbytes 4-bit float, fp32 absmax per 64 weights"),
    QuantChoice("bnb-int8", "bitsandbytes", "int8", ("llm.int8", "bnb_int8"), 8, "float32", 0,
                why="bitsandbytes LLM.int8 weights, per-row fp32 scale"),
)}
# The pip package each backend needs (named in the error when it is missing).
BACKEND_PACKAGES = {"torchao": "torchao", "quanto": "optimum-quanto", "bitsandbytes": "bitsandbytes", "gguf": "gguf"}
# Linear layers never quantized unless a recipe says so: embedders, the final norm's modulation and projection,
# beside the islands and _keep_in_fp32_modules (norm layers are no nn.Linear). The blocks' adaLN linears (Flux
# `norm1.linear`, 3.2B of 12B parameters) ARE quantized, as diffusers' bitsandbytes/torchao examples and
# city96/ComfyUI-GGUF do; only fp8 storage keeps them, by diffusers' `_skip_layerwise_casting_patterns`.
DEFAULT_KEEP = ("*embed*", "*embedder*", "*pos_embed*", "*patch_embed*", "proj_out", "norm_out*", "final_layer*",
                "lm_head", "conv_out")
_LOOKUP = {alias: c.name for c in CHOICES.values() for alias in (c.name, *c.aliases)}


def canonical_storage(value: object) -> str | None:
    """The canonical storage name of a dtype name or a quantized layout name; ``None`` when it is neither.

    Example:
        >>> canonical_storage("fp8"), canonical_storage("int8wo"), canonical_storage("QINT8"), canonical_storage("int3")
        ('float8_e4m3fn', 'int8', 'quanto-int8', None)
    """
    name = dt.canonical(value)
    if name is not None:
        return name
    return _LOOKUP.get(str(value).strip().lower())


def is_quantized(storage: str | None) -> bool:
    """Whether a canonical storage name is a backend-quantized layout (not a float dtype).

    Example:
        >>> is_quantized("int8"), is_quantized("float8_e4m3fn")
        (True, False)
    """
    return storage in CHOICES


def storage_names() -> list[str]:
    """Every storage name a recipe, override or ``quantize=`` accepts: float dtypes, then quantized layouts.

    Example:
        >>> storage_names()[:2], "nf4" in storage_names()
        (['float32', 'bfloat16'], True)
    """
    return [*dt.DTYPES, *CHOICES]


def weight_bytes(storage: str, out_features: int, in_features: int, compute: str) -> int:
    """Exact bytes of one ``nn.Linear`` weight ``[out, in]`` in quantized ``storage``, with the backend's buffers.

    Example:
        >>> weight_bytes("int8", 128, 32, "bfloat16")     # 4096 int8 + 128 * (fp32 scale + int8 zero point)
        4736
        >>> weight_bytes("quanto-int8", 128, 32, "bfloat16")  # 4096 int8 + 128 bf16 scales + 2 bf16 scalars
        4356
        >>> weight_bytes("nf4", 128, 32, "bfloat16")  # 2048 packed + 64 fp32 absmax + the 64-byte code table
        2368
        >>> weight_bytes("quanto-int4", 64, 256, "bfloat16")  # 8192 packed + 128 groups x (scale, shift) + 2 scalars
        8708
    """
    choice = CHOICES[storage]
    n = out_features * in_features
    if choice.group:  # quanto: rows of whole groups when the row length allows, values packed along the rows
        group = quanto_group(in_features, choice.group)
        rows, cols = (n // group, group) if group else (out_features, in_features)
        data = -(-rows * choice.data_bits // 8) * cols
        data += rows * choice.group_params * dt.itemsize(compute)  # a scale and a shift per row of the grouping
    else:
        data = (n * choice.data_bits + 7) // 8
    if choice.block:
        data += -(-n // choice.block) * 4
    scale = {"": 0, "compute": dt.itemsize(compute)}.get(choice.row_scale)
    if scale is None:
        scale = dt.itemsize(choice.row_scale)
    return (data + out_features * (scale + choice.row_extra) + choice.layer_scalars * dt.itemsize(compute)
            + choice.layer_bytes)


def quanto_group(in_features: int, largest: int = 128) -> int | None:
    """The group optimum-quanto gives a 4/2-bit layer's rows: the first of 128, 96, 64, 32 that divides a row longer
    than 128, else none (one scale and shift per row): optimum/quanto/nn/qmodule.py ``QModuleMixin.__init__``.

    Example:
        >>> quanto_group(3072), quanto_group(160), quanto_group(200), quanto_group(128)
        (128, 32, None, None)
    """
    if in_features <= largest:
        return None
    group = largest
    while in_features % group and group > 32:
        group -= 32
    return group if in_features % group == 0 else None


def stored_bytes(storage: str, shape: tuple[int, ...], compute: str) -> int:
    """Bytes of one parameter of ``shape`` planned in ``storage`` (a dtype name, or a quantized layout for a weight).

    Example:
        >>> stored_bytes("bfloat16", (128, 32), "bfloat16"), stored_bytes("int8", (128, 32), "bfloat16")
        (8192, 4736)
    """
    if storage in CHOICES:
        return weight_bytes(storage, shape[0], shape[1], compute)
    return math.prod(shape) * dt.itemsize(storage)


def _close(word: str, options: list[str]) -> str:
    # schema.did_you_mean's words; not imported from there: schema imports this module (tests/test_layers.py)
    near = difflib.get_close_matches(str(word)[:100], options, n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def check_storage_value(value: Any, path: str, problems: Any) -> str | None:
    """Validate a ``storage`` value (dtype or quantized layout), adding one problem with close names if it is bad.

    Example:
        >>> from hf_precision.errors import Problems
        >>> p = Problems("--set"); check_storage_value("int9", "components.unet.storage", p); print(p.items[0])
        --set: components.unet.storage: unknown storage 'int9'; allowed: float32, bfloat16, float16, float8_e4m3fn, \
float8_e5m2, int8, quanto-int8, quanto-float8, quanto-int4, quanto-int2, fp8-compute, nf4, fp4, bnb-int8; did you mean \
'int8'?
    """
    canon = canonical_storage(value) if isinstance(value, str) else None
    if canon is None:
        options = [*_LOOKUP, *(a for n, al in dt.DTYPES.items() for a in (n, *al))]
        problems.add(path, f"unknown storage {value!r}; allowed: {', '.join(storage_names())}{_close(str(value), options)}")
    return canon


def check_quantize_value(value: Any, path: str, problems: Any) -> dict[str, Any] | None:
    """Validate a component's ``quantize:`` policy: ``{storage: [the layouts memory plans may choose], keep: [module
    globs never quantized, beside islands, norms and embeddings], why: text}``.

    Example:
        >>> from hf_precision.errors import Problems
        >>> check_quantize_value({"storage": ["fp8", "int8"], "why": "x"}, "q", Problems("f"))
        {'storage': ['float8_e4m3fn', 'int8'], 'keep': [], 'why': 'x'}
    """
    if not isinstance(value, Mapping):
        problems.add(path, f"expected a mapping {{storage: [int8, float8_e4m3fn], keep: [proj_out], why: ...}}, "
                     f"got {value!r:.80}")
        return None
    allowed = ("storage", "keep", "why")
    for key in value:
        if key not in allowed:
            problems.add(f"{path}.{key}", f"unknown key {key!r:.80}; allowed: {', '.join(allowed)}{_close(str(key), list(allowed))}")
    storage = value.get("storage", [])
    if not isinstance(storage, list):
        problems.add(f"{path}.storage", f"expected a list of storage names, got {storage!r:.80}")
        storage = []
    keep = value.get("keep", [])
    if not isinstance(keep, list) or not all(isinstance(k, str) for k in keep):
        problems.add(f"{path}.keep", f"expected a list of module globs, got {keep!r:.80}")
        keep = []
    if value.get("why") is not None and not isinstance(value.get("why"), str):
        problems.add(f"{path}.why", "expected a text")
    names = [check_storage_value(s, f"{path}.storage[{i}]", problems) for i, s in enumerate(storage)]
    return {"storage": [n for n in names if n], "keep": list(keep), "why": " ".join(str(value.get("why") or "").split())}


def _hint(storage: str, caps: Any) -> str:
    """Why a device refuses a storage choice, where the reason is known."""
    kind = caps.profile.type
    if storage in dt.FLOAT8 | {"quanto-float8"} and kind == "mps":
        return "MPS has no float8 dtypes (Nerogar/OneTrainer#1689: 'Trying to convert Float8_e4m3fn to the MPS backend')"
    if storage == "fp8-compute":
        return ("fp8 matmuls need fp8 tensor cores: CUDA compute capability 8.9 or newer (Ada, Hopper); older cards fail "
                "with errors such as 'Expected is_sm80 || is_sm90' (bmaltais/kohya_ss#2717); fp8 *storage* "
                "(float8_e4m3fn, cast to the compute dtype on use) runs there")
    if CHOICES.get(storage) and CHOICES[storage].backend == "bitsandbytes" and kind != "cuda":
        return ("bitsandbytes runs on CUDA, and on the CPU for transformers models (devices.yaml); torchao (int8) and "
                "optimum-quanto run on CPU")
    return ""


def storage_rule(name: str, storage: str, compute: str, quant: Mapping[str, Any], caps: Any, problems: list[str],
                 source: str) -> str:
    """The rule text of a component's storage choice: a device that cannot hold or run it adds one problem naming
    it, what it allows and the fix; a layout the recipe does not list is taken (the user asked) with a note.

    Example:
        >>> from hf_precision.recipe.devices import device_caps
        >>> problems = []
        >>> storage_rule("unet", "nf4", "float16", {}, device_caps("m1-macos13"), problems, "--set")
        'set by storage: bitsandbytes nf4 (the recipe lists no quantized storage for unet)'
        >>> print(problems[0])  # doctest: +ELLIPSIS
        --set: components.unet.storage: nf4 cannot be used on mps (...): bitsandbytes runs on CUDA, and on the CPU ...
    """
    if storage not in caps.storage:
        device = caps.profile.label()
        allowed = list(caps.storage)
        # a quantized layout the device lacks: another one it has (the recipe's first); a float dtype: compute in it
        tolerated = [s for s in quant.get("storage") or () if s in caps.storage and is_quantized(s)]
        same_kind = [s for s in caps.storage if is_quantized(s)]
        fix = (tolerated or same_kind or [compute])[0] if is_quantized(storage) else compute
        hint = _hint(storage, caps)
        verb = "used" if is_quantized(storage) else "stored"
        problems.append(f"{source}: components.{name}.storage: {storage} cannot be {verb} on {device}"
                        f"{': ' + hint if hint else ''}; allowed there: {', '.join(allowed)}; "
                        f"fix: {override_fix(source, name, 'storage', fix)}")
    if not is_quantized(storage):
        return "set by storage (cast to the compute dtype on use)"
    choice = CHOICES[storage]
    tolerated = list(quant.get("storage") or ())
    note = ("" if storage in tolerated else
            f" (outside the tolerated {tolerated}: check the output)" if tolerated else
            f" (the recipe lists no quantized storage for {name})")
    return f"set by storage: {choice.backend} {choice.scheme}{note}"


def library_refusal(name: str, storage: str, library: str, caps: Any, quant: Mapping[str, Any], *,
                    gpu_present: bool = True) -> str | None:
    """Why a component's backend refuses its model's library on this device, with the fix; ``None`` when it does not.

    ``caps.transformers_only``: bitsandbytes runs on the CPU for transformers models, while diffusers' quantizer
    refuses without a GPU (diffusers v0.42.1 quantizers/bitsandbytes/bnb_quantizer.py:64, ``No GPU found``), also
    for a GPU layout planned on a machine without one (``gpu_present=False``).

    Example:
        >>> from hf_precision.recipe.devices import device_caps
        >>> cpu = device_caps("cpu-avx2")
        >>> library_refusal("text_encoder_2", "nf4", "transformers", cpu, {}) is None
        True
        >>> print(library_refusal("transformer", "nf4", "diffusers", cpu, {}))  # doctest: +ELLIPSIS
        components.transformer.storage: nf4 cannot be used for transformer (a diffusers model) on cpu (...): ...
    """
    choice = CHOICES.get(storage)
    if choice is None or library != "diffusers" or choice.backend != "bitsandbytes":
        return None
    if storage in caps.transformers_only:
        where = caps.profile.label()
    elif not gpu_present:
        where = f"{caps.profile.label()} planned on a machine without a CUDA, XPU or MPS GPU"
    else:
        return None
    usable = [s for s in caps.storage if s.startswith("float8") or (  # fp8 storage: diffusers' layerwise casting
        is_quantized(s) and s not in caps.transformers_only and CHOICES[s].backend != "bitsandbytes")]
    fallback = next((s for s in usable if is_quantized(s)), usable[0] if usable else "float8_e4m3fn")
    fix = next((s for s in quant.get("storage") or () if s in usable), fallback)
    return (f"components.{name}.storage: {storage} cannot be used for {name} (a diffusers model) on {where}: "
            f"diffusers' bitsandbytes quantizer needs a GPU (diffusers v0.42.1 quantizers/bitsandbytes/"
            f"bnb_quantizer.py:64 'No GPU found'); bitsandbytes quantizes transformers models (the text encoders) on "
            f"the CPU; allowed for {name} there: {', '.join(usable) or 'the float storages'}; "
            f"fix: {override_line(name, 'storage', fix)} (or a GGUF file with {arg('base', '...')})")


def storage_options(recipe: Any, denoisers: list[str], texts: list[str], allowed: Any,
                    transformers_only: Any = ()) -> list[tuple[tuple[str, str], ...]]:
    """Quantized storage a memory plan may choose, least change first: the denoiser(s) in each size class their
    recipe tolerates (8-bit: fp8 storage or int8; then 4-bit), then the same with the text encoders quantized too.

    Only what ``quantize.storage`` lists and ``allowed`` (``device_caps(recipe.device).storage``, passed in to keep
    the layer free of cycles) holds; the diffusers denoisers never take ``transformers_only`` storage.

    Example:
        >>> from hf_precision import device_caps, get_recipe
        >>> storage_options(get_recipe("flux", device="rtx3090"), ["transformer"], ["text_encoder_2"],
        ...                 device_caps("rtx3090").storage)
        [(('transformer', 'float8_e4m3fn'),), (('transformer', 'int8'),), (('transformer', 'nf4'),), \
(('transformer', 'float8_e4m3fn'), ('text_encoder_2', 'int8')), (('transformer', 'int8'), ('text_encoder_2', 'int8')), \
(('transformer', 'nf4'), ('text_encoder_2', 'int8'))]
        >>> cpu = device_caps("cpu-avx2")  # bitsandbytes runs there for the T5, never for the diffusers transformer
        >>> [o for o in storage_options(get_recipe("flux", device="cpu-avx2"), ["transformer"], ["text_encoder_2"],
        ...                             cpu.storage, cpu.transformers_only) if ("transformer", "nf4") in o]
        []
    """
    allowed = set(allowed)
    only_texts = set(transformers_only)

    def firsts(name: str) -> list[str]:
        seen, out = set(), []
        for s in (recipe[name].quantize if name in recipe else ()):
            if name not in texts and s in only_texts:
                continue  # a diffusers denoiser: its quantizer refuses this storage on the device (library_refusal)
            # one per size class and kind: fp8 storage (layerwise: norms' linears stay), a backend's 8 bit, its 4 bit
            kind = (CHOICES[s].data_bits, True) if s in CHOICES else (dt.itemsize(s) * 8, False)
            if s in allowed and kind not in seen:
                seen.add(kind)
                out.append(s)
        return out

    dens = [d for d in denoisers if d in recipe]
    options: list[tuple[tuple[str, str], ...]] = []
    for choice in firsts(dens[0]) if dens else []:
        options.append(tuple((d, choice) for d in dens if choice in firsts(d)))
    extra = tuple((t, firsts(t)[0]) for t in texts if firsts(t))
    return options + ([o + extra for o in options] if extra else [])
