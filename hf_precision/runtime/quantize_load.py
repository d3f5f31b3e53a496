"""The loader's side of quantized storage: the ``quantization_config`` it hands ``from_pretrained``, and the report.

Kept apart from ``load.py`` so the loader only asks two questions: which config to pass, and what to report.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from ..errors import RecipeError
from ..recipe.quantize import CHOICES, is_quantized
from ..recipe.resolution import Recipe
from .kernel_guards import guard_bnb_cpu_packing, guard_quanto_int8pack
from .quantize import (is_quantized_tensor, pipeline_quantization_config, quantized_layers, refuse_int8_beside_cuda,
                       refuse_library, torchao_scheme)

__all__ = ["quantization_kwargs", "report_quantization", "quantized_in", "quantize_planned_rest", "QUANTO_LEAVES"]

# diffusers v0.42.1 quantizers/quantization_config.py ``QuantoConfig.__init__`` warns on every use that it goes in
# diffusers 1.0; said once, here, with what to use instead (the command line holds the library's warning back).
QUANTO_LEAVES = ("; diffusers drops optimum-quanto in its version 1.0: for the same bytes without it use int8 or "
                 "fp8-compute (torchao), or nf4 on CUDA (bitsandbytes)")


def quantized_in(module: torch.nn.Module) -> set[str]:
    """Names of the modules whose ``weight`` holds a backend's quantized tensor.

    Example:
        >>> quantized_in(torch.nn.Linear(2, 2))
        set()
    """
    return {n for n, m in module.named_modules() if is_quantized_tensor(m._parameters.get("weight"))}


def quantization_kwargs(recipe: Recipe, where: str, index: Mapping[str, Any], folder: Path | None,
                        kwargs: dict[str, Any]) -> dict[str, Any]:
    """Put the ``quantization_config`` for the recipe's quantized components into ``kwargs``; notes for the report.

    The layers each backend converts are read from meta-built components by the planner's rule. A caller's own
    ``quantization_config`` is kept (and reported), but not beside a quantized storage in the recipe: two answers to one
    question.
    """
    from .layout import component_islands
    from .meta import build_on_meta
    from .source import component_configs, listed_components

    wanted = [p for p in recipe.policies if is_quantized(p.storage)]
    user = kwargs.get("quantization_config")
    if user is not None:
        if wanted:
            raise RecipeError(f"load_pipeline: quantization_config= and a quantized storage "
                              f"({', '.join(f'{p.name}={p.storage}' for p in wanted)}) both ask how to quantize; "
                              f"pass one: quantize={{...}} / --set COMPONENT.storage=..., or your own quantization_config")
        if "quanto" in repr(user).lower():  # a QuantoConfig, alone or inside a PipelineQuantizationConfig
            guard_quanto_int8pack()
        if "bitsandbytes" in repr(user).lower():
            guard_bnb_cpu_packing()
        return {"user": user}
    if not wanted:
        return {}
    configs = component_configs(where, index, folder)
    modules: dict[str, tuple[torch.nn.Module, list[str]]] = {}
    planned: dict[str, set[str]] = {}
    listed = listed_components(index)
    for plan in wanted:
        spec = listed.get(plan.name)
        if spec is None or plan.name not in configs:
            raise RecipeError(f"{where}: {plan.name}.storage={plan.storage}: the folder has no {plan.name}/config.json")
        refuse_library(plan, spec[0], recipe.device, where, loading=True)
        refuse_int8_beside_cuda(plan, where)
        module = build_on_meta(*spec, configs[plan.name], pipeline=index.get("_class_name"))
        islands = component_islands(plan, module, strict=False)
        modules[plan.name] = (module, islands)
        planned[plan.name] = set(quantized_layers(module, plan, islands))
    kwargs["quantization_config"] = pipeline_quantization_config(recipe, modules)
    return {"planned": planned}


def quantize_planned_rest(module: torch.nn.Module, plan: Any, predicted: set[str]) -> list[str]:
    """Quantize the planned layers the backend left plain, with the same backend and scheme; their names.

    Backends quantize weights as they are read, so a layer the checkpoint lacks (HunyuanDiT's BertModel ``pooler``)
    stays plain (torchao), unfrozen (quanto) or a float ``Parameter`` in a ``Linear4bit`` that fails ("FP4 quantization
    state not initialized"), while the plan counts it quantized.

    Example:
        >>> from hf_precision import get_recipe
        >>> quantize_planned_rest(torch.nn.Linear(2, 2), get_recipe("flux", device="cpu")["transformer"], set())
        []
    """
    missing = sorted(predicted - quantized_in(module))
    if not missing:
        return []
    choice = CHOICES[plan.storage]
    done = []
    for name in missing:
        layer = module.get_submodule(name)
        if choice.backend == "quanto" and hasattr(layer, "freeze"):
            layer.freeze()  # optimum.quanto's QModuleMixin.freeze: quantizes the float weight in place
        elif choice.backend == "torchao" and type(layer) is torch.nn.Linear:
            import torchao.quantization as ao

            ao.quantize_(layer, torchao_scheme(choice.scheme))
        elif choice.backend == "bitsandbytes" and hasattr(layer, "quant_storage"):  # Linear4bit
            _bnb_4bit(module, layer, choice.scheme)
        if is_quantized_tensor(layer._parameters.get("weight")):
            done.append(name)
    return done


def _bnb_4bit(module: torch.nn.Module, layer: torch.nn.Module, quant_type: str) -> None:
    """Quantize a ``Linear4bit``'s float weight in place, with the settings of the layers bitsandbytes quantized on
    load (block size, double quantization, storage type), so the plan's bytes hold for it too."""
    from bitsandbytes.nn import Params4bit

    like = next((m.weight for m in module.modules() if isinstance(getattr(m, "weight", None), Params4bit)
                 and m.weight.quant_state is not None), None)
    settings = ({} if like is None else
                dict(blocksize=like.blocksize, compress_statistics=like.compress_statistics, quant_type=like.quant_type))
    weight = layer.weight
    param = Params4bit(weight.data, requires_grad=False, quant_storage=layer.quant_storage, module=layer,
                       **{"quant_type": quant_type, **settings})
    layer.weight = param._quantize(weight.device)


def _zero_rows(module: torch.nn.Module) -> list[str]:
    """Set to 0 the fp8 values optimum-quanto wrote as NaN for all-zero weight rows; the layers it repaired.

    quanto scales each row by its absmax, and ``0 / 0`` is NaN in float8 (int8 rounds it to 0), so a zero-initialized
    layer (Kandinsky 3's ``context_mlp``, ControlNet's zero convolutions, adaLN-Zero) made every output NaN. A zero row
    is 0 under any scale: no other value or byte changes.
    """
    fixed = []
    for name, layer in module.named_modules():
        weight = layer._parameters.get("weight")
        data, scale = getattr(weight, "_data", None), getattr(weight, "_scale", None)
        if (type(data) is not torch.Tensor or not isinstance(scale, torch.Tensor)
                or data.dtype not in (torch.float8_e4m3fn, torch.float8_e5m2) or bool((scale != 0).all())):
            continue
        with torch.no_grad():
            wide = data.float()
            data.copy_(torch.where(torch.isnan(wide), torch.zeros_like(wide), wide).to(data.dtype))
        fixed.append(name)
    return fixed


def report_quantization(pipe: Any, recipe: Recipe, notes: Mapping[str, Any]) -> list[str]:
    """Lines for ``Applied.actions``: what each backend quantized, checked against the plan; the caller's config."""
    lines = []
    for plan in recipe.policies:
        module = getattr(pipe, plan.name, None)
        fixed = _zero_rows(module) if isinstance(module, torch.nn.Module) else []
        if fixed:
            lines.append(f"{plan.name}: {len(fixed)} fp8 layer(s) with all-zero weight rows, which optimum-quanto "
                         f"stores as NaN (0/0 scale), set back to 0: {fixed[:3]}")
    user = notes.get("user")
    if user is not None:
        held = {p.name: len(quantized_in(getattr(pipe, p.name))) for p in recipe.policies
                if isinstance(getattr(pipe, p.name, None), torch.nn.Module)}
        comps = ", ".join(f"{n} ({k} layers)" for n, k in held.items() if k) or "no component"
        lines.append(f"quantization_config from the caller ({type(user).__name__}) passed through: quantized {comps}; "
                     f"hf_precision kept its islands and boundary casts, plan() does not count this layout")
    for name, predicted in (notes.get("planned") or {}).items():
        plan = recipe[name]
        done = quantize_planned_rest(getattr(pipe, name), plan, predicted)
        if done:
            lines.append(f"{name}: {len(done)} planned layer(s) the checkpoint has no weights for (newly initialized, "
                         f"so the backend skipped them) quantized after loading, as planned: {done[:3]}")
        actual = quantized_in(getattr(pipe, name))
        choice = CHOICES[plan.storage]
        if actual == predicted:
            lines.append(f"{name}: {plan.storage} via {choice.backend} ({choice.scheme}): {len(actual)} Linear layers "
                         f"quantized, as planned" + (QUANTO_LEAVES if choice.backend == "quanto" else ""))
        else:
            msg = (f"{name}: {choice.backend} quantized {len(actual)} layers where the plan counted {len(predicted)} "
                   f"(extra: {sorted(actual - predicted)[:5]}, missing: {sorted(predicted - actual)[:5]}): "
                   f"plan() bytes for {name} are off; please report it with your diffusers/transformers versions")
            warnings.warn(msg, RuntimeWarning, stacklevel=3)
            lines.append(msg)
    if notes.get("gguf"):
        name, path = notes["gguf"]
        lines.append(f"{name}: loaded from the GGUF file {path} (diffusers GGUFQuantizationConfig, dequantized per "
                     f"layer to {recipe[name].compute})")
    return lines
