"""Training on a quantized base (QLoRA-style): the loaded storage is kept, the base stays frozen, LoRA trains in fp32.

A pipeline loaded with ``quantize={"unet": "int8"}`` (or ``--set unet.storage=int8``) holds the backend's quantized
weights; ``prepare_training`` resolves its recipe again, so the storage the pipeline was loaded with is carried
into that recipe here (else the plan would report, fingerprint and cache it as unquantized). peft wraps a quantized
``nn.Linear`` as it wraps any other: torchao's weights through its ``TorchaoLoraLinear`` (peft
src/peft/tuners/lora/torchao.py, int8 only), optimum-quanto's ``QLinear`` as a plain ``nn.Linear`` subclass, and
bitsandbytes' layers through its QLoRA path; the base weight never has a gradient, so it stays quantized and
unchanged. What has no backward is refused before anything changes: diffusers' fp8 layerwise casting stores the
weight back in fp8 after the forward, so autograd meets the fp8 tensor it saved (``expected scalar type Float but
found Float8_e4m3fn`` in backward; peft's LoRA wrapper in front of the hook fails already in the forward on some
paths with ``"mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.overrides import Override
from ..recipe.quantize import CHOICES, is_quantized
from ..runtime.apply import applied
from ..runtime.quantize import is_quantized_tensor, module_bytes
from .rules import ComputeChoice, TrainingError

__all__ = ["loaded_storage", "loaded_layer", "keep_loaded_compute", "compute_before_load", "refuse_untrainable",
           "base_lines"]


def _guess(module: torch.nn.Module) -> str | None:
    """The storage name of a module quantized by the user's own ``quantization_config`` (None: not quantized)."""
    for p in module.parameters():
        if not is_quantized_tensor(p):
            continue
        name = type(p).__name__
        if name == "Params4bit":
            return "fp4" if getattr(getattr(p, "quant_state", None), "quant_type", "nf4") == "fp4" else "nf4"
        if name == "Int8Params":
            return "bnb-int8"
        qtype = str(getattr(p, "qtype", "") or getattr(p, "_qtype", ""))
        if qtype:  # optimum-quanto
            return "quanto-float8" if "float8" in qtype else "quanto-int8"
        inner = [getattr(p, n, None) for n in (p.__tensor_flatten__()[0] if hasattr(p, "__tensor_flatten__") else [])]
        if any(isinstance(t, torch.Tensor) and t.dtype in (torch.int8, torch.uint8) for t in inner):
            return "int8"
        if any(isinstance(t, torch.Tensor) and t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) for t in inner):
            return "fp8-compute"
        return None
    return None


def loaded_storage(holder: Any, comps: Mapping[str, torch.nn.Module]) -> dict[str, str]:
    """Component -> the quantized or fp8 storage it was loaded with (the applied record first, else its tensors).

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> loaded_storage(make_pipeline("sd15"), {})
        {}
    """
    record = applied(holder)
    out: dict[str, str] = {}
    for name, module in comps.items():
        planned = record.recipe[name].storage if record is not None and name in record.recipe else None
        if planned is not None and (is_quantized(planned) or planned in dt.FLOAT8):
            out[name] = planned
        else:
            guessed = _guess(module)
            if guessed:
                out[name] = guessed
    return out


def loaded_layer(storage: Mapping[str, str]) -> Override | None:
    """The override layer that keeps the loaded storage in the training recipe (None when nothing is quantized).

    Example:
        >>> loaded_layer({"unet": "int8"}).data, loaded_layer({})
        ({'components': {'unet': {'storage': 'int8'}}}, None)
    """
    if not storage:
        return None
    return Override("the pipeline as loaded (quantized storage)", {"components": {c: {"storage": s} for c, s in storage.items()}})


def keep_loaded_compute(holder: Any, storage: Mapping[str, str], choices: dict[str, Any]) -> None:
    """A trainable component loaded quantized keeps the compute dtype it was loaded for.

    The backend made its scales in that dtype at load (quanto's per-row scales are in the compute dtype; its CPU
    int8 kernel then refuses other activations: "expected scalar type BFloat16 but found Half"), and a quantized
    weight cannot be re-cast the way the training rule re-casts a float one. The choice says how to get the rule's.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> choices = {"unet": ComputeChoice("bfloat16", "rule")}
        >>> keep_loaded_compute(make_pipeline("sd15"), {}, choices); choices["unet"].dtype  # nothing quantized
        'bfloat16'
    """
    record = applied(holder)
    for comp, choice in list(choices.items()):
        if not is_quantized(storage.get(comp)) or record is None or comp not in record.recipe:
            continue
        had = record.recipe[comp].compute
        if had != choice.dtype:
            fix = f"load it with --set {comp}.dtype={choice.dtype} (quantize= and overrides= in load_pipeline)"
            choices[comp] = ComputeChoice(had, f"kept from loading: {comp} was quantized ({storage[comp]}) for {had} "
                                               f"compute, where the training rule picks {choice.dtype}; {fix}",
                                          f"{comp}: {had} compute, as loaded quantized (the rule picks {choice.dtype}: {fix})")


def compute_before_load(recipe: Any, train: Mapping[str, str], layout: Any) -> Override | None:
    """Before loading: the compute dtype the training rule picks for each LoRA-trained component that ``recipe``
    (the inference recipe the loader will apply) quantizes, as an override layer for the loader, so the backend
    makes its scales in the dtype training computes in (else :func:`keep_loaded_compute` keeps the loaded one).

    Example:
        >>> from hf_precision import get_recipe
        >>> r = get_recipe("sd15", device="a100", overrides={"unet": {"storage": "quanto-int8"}})
        >>> compute_before_load(r, {"unet": "lora"}, "a100").data["components"]["unet"]["dtype"]
        'bfloat16'
    """
    from ..recipe.devices import device_caps, device_profile
    from .rules import training_compute

    profile = device_profile(layout)
    caps = device_caps(profile)
    layer = {}
    for comp, kind in train.items():
        if kind == "lora" and comp in recipe and is_quantized(recipe[comp].storage):
            plan = recipe[comp]
            choice = training_compute(comp, (*plan.dtypes, plan.compute), caps.auto, profile.label(), dict(caps.why))
            if choice.dtype != plan.compute:
                layer[comp] = {"dtype": choice.dtype, "why": choice.rule}
    return Override("training rule, before loading the quantized base", {"components": layer}) if layer else None


def refuse_untrainable(recipe: Any, train: Mapping[str, str], denoiser: str | None) -> None:
    """One TrainingError for trainable parts whose storage has no backward, or that cannot be trained in place.

    LoRA needs gradients through the frozen weights of the component it sits in (and, for a text-encoder LoRA,
    through the denoiser behind it); a full fine-tune needs the weights themselves as float masters.

    Example:
        >>> from hf_precision import get_recipe
        >>> r = get_recipe("sd15", device="cpu", overrides={"unet": {"storage": "float8_e4m3fn"}})
        >>> refuse_untrainable(r, {"unet": "lora"}, "unet")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.training.rules.TrainingError: train: unet trains, but its weights are stored float8_e4m3fn ...
    """
    problems = []
    through = {c for c, k in train.items() if k in ("lora", "full")}
    if through and any(c.startswith("text_encoder") for c in through) and denoiser:
        through.add(denoiser)  # the text encoder's gradients come back through the denoiser
    for comp in sorted(through):
        if comp not in recipe:
            continue
        storage, compute = recipe[comp].storage, recipe[comp].compute
        kind = train.get(comp, "frozen")
        if kind == "full" and is_quantized(storage):
            problems.append(f"train: {comp}: 'full' cannot train {storage} weights ({CHOICES[storage].why}): a full "
                            f"fine-tune updates every weight as an fp32 master; train a LoRA on the quantized base "
                            f"(train={{{comp!r}: 'lora'}}, --method lora) or load {comp} unquantized")
        elif storage in dt.FLOAT8:
            role = "trains" if kind != "frozen" else "passes the text encoder's gradients back"
            problems.append(f"train: {comp} {role}, but its weights are stored {storage} by layerwise casting (cast to "
                            f"{compute} per layer on use), which has no backward: autograd meets the fp8 weight "
                            f"again ('expected scalar type Float but found Float8_e4m3fn'). Store it with a "
                            f"backend that has one: --set {comp}.storage=int8 (torchao) or {comp}.storage=quanto-float8 "
                            f"(fp8 weights through optimum-quanto), i.e. quantize={{{comp!r}: 'int8'}}")
    if problems:
        raise TrainingError(problems)


def base_lines(tp: Any) -> list[str]:
    """Report lines: each quantized component, frozen, its converted layers and its measured bytes (LoRA excluded).

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> from hf_precision.training import prepare_training
        >>> base_lines(prepare_training(make_pipeline("sd15")))  # nothing quantized: no line
        []
    """
    lines = []
    for comp, module in tp.components.items():
        storage = tp.recipe[comp].storage if comp in tp.recipe else None
        weights = [m._parameters["weight"] for m in module.modules() if is_quantized_tensor(m._parameters.get("weight"))]
        if not weights:
            continue
        lora = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "lora_" in n)
        backend = f"{CHOICES[storage].backend} {CHOICES[storage].scheme}" if storage in CHOICES else "the user's config"
        frozen = not any(w.requires_grad for w in weights)
        lines.append(f"quantized base: {comp} {storage} ({backend}): {len(weights)} layers "
                     f"{'frozen' if frozen else 'NOT frozen'}, {module_bytes(module) - lora:,} bytes without the LoRA")
    return lines
