"""Training on a quantized base (QLoRA-style): the loaded storage is kept, the base stays frozen, LoRA trains in fp32.

The storage a pipeline was loaded with (``quantize={"unet": "int8"}``) is carried into the training recipe here
(else the plan would report, fingerprint and cache it as unquantized). peft wraps a quantized ``nn.Linear`` like any
other: torchao's through ``TorchaoLoraLinear`` (peft src/peft/tuners/lora/torchao.py, int8 only), quanto's
``QLinear`` as an ``nn.Linear`` subclass, bitsandbytes' through its QLoRA path; the base has no gradient and stays
unchanged. fp8 *storage* (diffusers' layerwise casting) swaps each layer's ``.data`` in place, so autograd would
meet the fp8 tensor it saved (``expected scalar type Float but found Float8_e4m3fn`` in backward): where gradients
pass, :func:`upcast_fp8` computes from a fresh upcast copy instead (kohya's ``--fp8_base``). A full fine-tune of
quantized or fp8 weights is refused before anything changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.overrides import Override
from ..recipe.quantize import CHOICES, is_quantized
from ..runtime import patches
from ..runtime.apply import applied
from ..runtime.kernel_guards import keep_bnb_unpacked
from ..runtime.quantize import is_quantized_tensor, module_bytes
from .methods import method_of
from .rules import ComputeChoice, TrainingError

__all__ = ["loaded_storage", "loaded_layer", "keep_loaded_compute", "refuse_untrainable",
           "upcast_fp8", "keep_4bit_differentiable", "base_lines"]


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
    """A trainable component loaded quantized keeps the compute dtype it was loaded for, since its scales were made
    in it (quanto's CPU int8 kernel refuses other activations: "expected scalar type BFloat16 but found Half") and
    a quantized weight cannot be re-cast; the choice says how to get the rule's.

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


def _through(train: Mapping[str, str], denoiser: str | None) -> set[str]:
    """The components gradients flow through: those that train, and the denoiser behind a text-encoder LoRA."""
    through = {c for c, k in train.items() if method_of(k).trains_weights}
    if through and any(c.startswith("text_encoder") for c in through) and denoiser:
        through.add(denoiser)  # the text encoder's gradients come back through the denoiser
    return through


def refuse_untrainable(recipe: Any, train: Mapping[str, str], denoiser: str | None) -> None:
    """One TrainingError for trainable parts whose storage cannot be trained the way asked: LoRA needs gradients
    through the frozen weights (every backend has them, fp8 through :func:`upcast_fp8`), a full fine-tune float
    masters, which quantized and fp8 weights are not.

    Example:
        >>> from hf_precision import get_recipe
        >>> r = get_recipe("sd15", device="cpu", overrides={"unet": {"storage": "float8_e4m3fn"}})
        >>> refuse_untrainable(r, {"unet": "lora"}, "unet")  # LoRA on an fp8 base: allowed
        >>> refuse_untrainable(r, {"unet": "full"}, "unet")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.training.rules.TrainingError: train: unet: 'full' cannot train float8_e4m3fn weights ...
    """
    problems = []
    for comp in sorted(_through(train, denoiser)):
        if comp in recipe:
            problem = method_of(train.get(comp, "frozen")).storage_problem(comp, recipe[comp].storage, recipe[comp].compute)
            problems += [problem] if problem else []
    if problems:
        raise TrainingError(problems)


def upcast_fp8(recipe: Any, comps: Mapping[str, torch.nn.Module], train: Mapping[str, str],
               denoiser: str | None) -> dict[str, int]:
    """fp8-stored components that gradients pass through compute from ``weight.to(compute)``
    (:func:`hf_precision.runtime.patches.upcast_on_use`); component -> layers changed.

    Example:
        >>> from hf_precision import apply_recipe
        >>> from hf_precision.testing import make_pipeline
        >>> pipe = make_pipeline("sd15")
        >>> r = apply_recipe(pipe, overrides={"unet": {"storage": "float8_e4m3fn"}}).recipe
        >>> upcast_fp8(r, {"unet": pipe.unet}, {"text_encoder": "lora"}, "unet")  # its gradients pass the UNet
        {'unet': 83}
        >>> upcast_fp8(r, {"unet": pipe.unet}, {"unet": "lora"}, "unet")  # done once
        {'unet': 0}
    """
    done = {}
    for comp in sorted(_through(train, denoiser)):
        if comp in recipe and comp in comps and recipe[comp].storage in dt.FLOAT8:
            done[comp] = patches.upcast_on_use(comps[comp], dt.to_torch(recipe[comp].compute))
    return done


def keep_4bit_differentiable(comps: Mapping[str, torch.nn.Module], train: Mapping[str, str],
                             denoiser: str | None) -> dict[str, int]:
    """bitsandbytes 4-bit layers that gradients pass through stay off its fused CPU kernel, which has no backward
    (:func:`hf_precision.runtime.kernel_guards.keep_bnb_unpacked`); component -> layers unpacked again.

    Example:
        >>> keep_4bit_differentiable({"unet": torch.nn.Linear(2, 2)}, {"unet": "lora"}, "unet")
        {}
    """
    done = {comp: keep_bnb_unpacked(comps[comp]) for comp in sorted(_through(train, denoiser)) if comp in comps}
    return {comp: n for comp, n in done.items() if n}


def base_lines(tp: Any) -> list[str]:
    """Report lines: each quantized or fp8-stored component, its layers, frozen or not, and its bytes without LoRA.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> from hf_precision.training import prepare_training
        >>> base_lines(prepare_training(make_pipeline("sd15")))  # nothing quantized: no line
        []
    """
    lines = []
    fp8 = tuple(dt.to_torch(d) for d in sorted(dt.FLOAT8))
    for comp, module in tp.components.items():
        storage = tp.recipe[comp].storage if comp in tp.recipe else None
        layers = [m for m in module.modules() if is_quantized_tensor(m._parameters.get("weight"))
                  or getattr(m._parameters.get("weight"), "dtype", None) in fp8]
        if not layers:
            continue
        weights = [m._parameters["weight"] for m in layers]
        lora = sum(p.numel() * p.element_size() for n, p in module.named_parameters() if "lora_" in n)
        if storage in dt.FLOAT8:
            upcast = any(patches.upcasts_on_use(m) for m in layers)
            backend = (f"stored fp8, computed in {tp.recipe[comp].compute} from a fresh copy per call" if upcast
                       else "diffusers layerwise casting")
        else:
            backend = f"{CHOICES[storage].backend} {CHOICES[storage].scheme}" if storage in CHOICES else "the user's config"
        frozen = not any(w.requires_grad for w in weights)
        kind = "fp8" if storage in dt.FLOAT8 else "quantized"
        lines.append(f"{kind} base: {comp} {storage} ({backend}): {len(weights)} layers "
                     f"{'frozen' if frozen else 'NOT frozen'}, {module_bytes(module) - lora:,} bytes without the LoRA")
    return lines

