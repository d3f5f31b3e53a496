"""Quantized storage at runtime: which layers a backend converts, the backend config that does it, measured bytes.

The loader hands diffusers a ``PipelineQuantizationConfig`` whose per-component configs (torchao, quanto,
bitsandbytes; diffusers' or transformers' by the model's library) keep out every ``nn.Linear`` hf_precision keeps:
islands, layerwise skips, the recipe's ``quantize.keep`` and the model's ``_keep_in_fp32_modules``. Each backend
matches names by its own rule (torchao ``FqnToConfig`` exact names, diffusers' quanto child names, diffusers'
bitsandbytes substrings, transformers ``should_convert_module``); :func:`quantized_layers` applies the same rule, so
the plan counts exactly the layers converted.
"""

from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..errors import RecipeError
from ..recipe.patterns import inside
from ..recipe.devices import device_caps
from ..recipe.quantize import BACKEND_PACKAGES, CHOICES, DEFAULT_KEEP, is_quantized, library_refusal
from ..recipe.resolution import ComponentPolicy, Recipe
from .kernel_guards import guard_bnb_cpu_packing, guard_quanto_int8pack, stale_build_locks

__all__ = ["is_quantized_tensor", "tensor_bytes", "module_bytes", "kept_layers", "quantized_layers",
           "backend_config", "torchao_scheme", "pipeline_quantization_config", "require_backend", "library_of",
           "refuse_library", "refuse_int8_beside_cuda"]


def is_quantized_tensor(t: Any) -> bool:
    """Whether a parameter holds a backend's quantized weight (torchao, quanto, bitsandbytes, GGUF), not plain values.

    Example:
        >>> is_quantized_tensor(torch.nn.Parameter(torch.ones(2)))
        False
    """
    if type(t) in (torch.Tensor, torch.nn.Parameter):
        return False
    return (hasattr(t, "__tensor_flatten__") or hasattr(t, "quant_state") or hasattr(t, "quant_type")
            or type(t).__name__ in ("Int8Params", "Params4bit"))


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes a tensor really holds: the inner tensors of a quantized tensor (data, scales, zero points), else its own.

    Example:
        >>> tensor_bytes(torch.ones(3, 2, dtype=torch.float16))
        12
    """
    if type(t) not in (torch.Tensor, torch.nn.Parameter) and hasattr(t, "__tensor_flatten__"):
        names, _ = t.__tensor_flatten__()
        return sum(tensor_bytes(getattr(t, n)) for n in names if isinstance(getattr(t, n, None), torch.Tensor))
    size = t.numel() * t.element_size()
    state = getattr(t, "quant_state", None)  # bitsandbytes 4-bit: absmax per block, its code table, nested state2
    while state is not None:
        size += sum(v.numel() * v.element_size() for v in vars(state).values() if isinstance(v, torch.Tensor))
        state = getattr(state, "state2", None)
    scb = getattr(t, "SCB", None)  # bitsandbytes LLM.int8: per-row scale
    if isinstance(scb, torch.Tensor):
        size += scb.numel() * scb.element_size()
    return size


def module_bytes(module: torch.nn.Module) -> int:
    """Measured bytes a module holds, as :func:`hf_precision.plan` counts them: every parameter and buffer once,
    persistent or not, quantized tensors by their storage, with the buffers a backend adds (quanto's scales) and
    bitsandbytes' moved row scales.

    Example:
        >>> m = torch.nn.Linear(4, 2)
        >>> m.register_buffer("table", torch.zeros(3), persistent=False)
        >>> module_bytes(m)  # 10 float32 weights and biases + 3 float32 buffer values
        52
    """
    seen: set[int] = set()
    total = 0
    for m in module.modules():
        weight = m._parameters.get("weight")
        if is_quantized_tensor(weight):
            # bitsandbytes' Linear8bitLt moves its row scales from the weight to ``m.state`` on the first forward
            scb = getattr(getattr(m, "state", None), "SCB", None)
            if isinstance(scb, torch.Tensor) and scb is not getattr(weight, "SCB", None) and id(scb) not in seen:
                seen.add(id(scb))
                total += scb.numel() * scb.element_size()
    for t in [*module.parameters(), *module.buffers()]:
        if id(t) not in seen:
            seen.add(id(t))
            total += tensor_bytes(t)
    return total


def library_of(module: torch.nn.Module) -> str:
    """``"transformers"`` for a transformers model, else ``"diffusers"`` (whose quantizer configs it takes)."""
    return "transformers" if type(module).__module__.startswith("transformers") else "diffusers"


def _linears(module: torch.nn.Module) -> list[str]:
    return [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and n]


def kept_layers(module: torch.nn.Module, plan: ComponentPolicy, islands: Iterable[str]) -> list[str]:
    """The ``nn.Linear`` layers kept out of quantization (handed to the backend by name): islands,
    :data:`~hf_precision.recipe.quantize.DEFAULT_KEEP` and the recipe's ``quantize.keep`` as globs under the one rule
    (kept when it or a parent matches), and ``_keep_in_fp32_modules`` as substrings, as diffusers reads them.

    Example:
        >>> from hf_precision import get_recipe
        >>> m = torch.nn.ModuleDict({"proj_out": torch.nn.Linear(2, 2), "blocks": torch.nn.Linear(2, 2)})
        >>> kept_layers(m, get_recipe("unet.sdxl", device="t4")["unet"], [])
        ['proj_out']
    """
    islands = list(islands)
    globs = [*DEFAULT_KEEP, *plan.quantize_keep]
    fp32 = list(getattr(module, "_keep_in_fp32_modules", None) or ())
    unpackable = set(_unpackable(module, plan))
    out = []
    for name in _linears(module):
        parts = name.split(".")
        prefixes = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
        if (inside(name, islands) or any(fnmatch.fnmatchcase(p, g) for p in prefixes for g in globs)
                or any(k in name for k in fp32) or name in unpackable):
            out.append(name)
    return out


def _unpackable(module: torch.nn.Module, plan: ComponentPolicy) -> list[str]:
    """Layers the backend cannot pack and would fail on at load: optimum-quanto packs qint4 with bfloat16 scales in
    torch's tinygemm int4 layout whenever a row is two or more whole 128-input groups, and that packing needs the
    output features to be a multiple of 16 (``_convert_weight_to_int4pack_cpu : expect N to be dividable by 16``:
    optimum/quanto/tensor/weights/qbits.py ``WeightQBitsTensor.create``)."""
    if plan.storage != "quanto-int4" or plan.compute != "bfloat16":
        return []
    return [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear) and n
            and m.in_features % 128 == 0 and m.in_features > 128 and m.out_features % 16]


def _passed(library: str, backend: str, module: torch.nn.Module, plan: ComponentPolicy, islands: list[str]) -> list[str]:
    """The names handed to the backend for the kept layers, in the form its matching rule reads. diffusers' quanto and
    bitsandbytes compare child names only, so a default-kept layer whose child name also names layers to quantize is
    left to the backend (Flux: 38 single-block ``proj_out`` = 1.8B parameters); islands and ``_keep_in_fp32_modules``
    are kept whatever it costs.
    """
    kept = kept_layers(module, plan, islands)
    if not (library == "diffusers" and backend in ("quanto", "bitsandbytes")):
        return sorted(kept)
    fp32 = list(getattr(module, "_keep_in_fp32_modules", None) or ())
    leaf = lambda n: n.rpartition(".")[2]
    hard = {k for k in kept if inside(k, islands) or any(f in k for f in fp32)} | set(_unpackable(module, plan))
    taken = set(kept)
    colliding = {leaf(n) for n in _linears(module) if n not in taken}
    return sorted({leaf(k) for k in kept if k in hard or leaf(k) not in colliding})


def _excluded(library: str, backend: str, name: str, passed: list[str], fp32: list[str]) -> bool:
    """The backend's own rule: is this Linear left unquantized, given the names it was passed?"""
    if library == "transformers":
        from transformers.quantizers.quantizers_utils import should_convert_module

        return not should_convert_module(name, [*passed, *fp32] or None)
    if backend == "torchao":  # FqnToConfig: exact names; diffusers adds _keep_in_fp32_modules as substrings
        return name in passed or any((k + ".") in (name + ".") for k in fp32)
    leaf = name.rpartition(".")[2]
    if backend == "quanto":
        return leaf in passed or leaf in fp32
    # diffusers bitsandbytes (quantizers/bitsandbytes/utils.py _replace_with_bnb_linear)
    keys = [*passed, *fp32]
    return leaf in keys or any((k + ".") in name or k == name for k in keys)


def quantized_layers(module: torch.nn.Module, plan: ComponentPolicy, islands: Iterable[str]) -> list[str]:
    """The ``nn.Linear`` layers the component's backend will quantize (its own matching rule applied).

    Works on a meta-device model, so the planner counts them before any weight is read.

    Example:
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("unet.sdxl", device="t4", overrides={"unet": {"storage": "int8"}})["unet"]
        >>> m = torch.nn.ModuleDict({"proj_out": torch.nn.Linear(2, 2), "blocks": torch.nn.Linear(2, 2)})
        >>> quantized_layers(m, plan, [])
        ['blocks']
    """
    if not is_quantized(plan.storage):
        return []
    islands = list(islands)
    library, backend = library_of(module), CHOICES[plan.storage].backend
    passed = _passed(library, backend, module, plan, islands)
    fp32 = list(getattr(module, "_keep_in_fp32_modules", None) or ())
    names = _linears(module)
    if (library, backend) == ("transformers", "bitsandbytes"):
        # transformers converts `type(module) is nn.Linear` only (integrations/bitsandbytes.py:189): a subclass such
        # as nn.MultiheadAttention's out_proj (SigLIP's pooling head in Gemma 3's vision tower) stays as it is
        kinds = dict(module.named_modules())
        names = [n for n in names if type(kinds[n]) is torch.nn.Linear]
    return [n for n in names if not _excluded(library, backend, n, passed, fp32)]


def require_backend(storage: str, component: str) -> None:
    """Import the package a storage choice needs; a ``RecipeError`` naming the pip package when it is missing."""
    import importlib

    backend = CHOICES[storage].backend
    module = {"torchao": "torchao", "quanto": "optimum.quanto", "bitsandbytes": "bitsandbytes"}[backend]
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise RecipeError(f"{component}.storage={storage} needs {backend}, which is not installed here ({err}); "
                          f"fix: pip install {BACKEND_PACKAGES[backend]} (or pip install 'hf-precision[quant]'), or "
                          f"choose another storage") from None
    if backend == "quanto":
        for lock in stale_build_locks():
            raise RecipeError(f"{component}.storage={storage}: {lock} is left from an interrupted build of quanto's "
                              f"C++ extension, and quanto would wait on it forever; fix: delete that file (rm {lock}) "
                              f"if no other process is building quanto's extension now")


def refuse_library(plan: ComponentPolicy, library: str, device: Any, where: str, *, loading: bool) -> None:
    """One ``RecipeError`` before loading when the component's backend refuses its model's library on ``device``
    (bitsandbytes for a diffusers model on the CPU: :func:`hf_precision.recipe.quantize.library_refusal`); when
    ``loading``, also when this machine has no GPU for diffusers' bitsandbytes quantizer to check.

    Example:
        >>> from hf_precision import get_recipe
        >>> r = get_recipe("flux", device="cpu", overrides={"text_encoder_2": {"storage": "nf4"}})
        >>> refuse_library(r["text_encoder_2"], "transformers", r.device, "plan", loading=False)  # allowed
    """
    gpu = True
    if loading:
        gpu = torch.cuda.is_available() or torch.xpu.is_available() or torch.backends.mps.is_available()
    problem = library_refusal(plan.name, plan.storage, library, device_caps(device), {"storage": plan.quantize},
                              gpu_present=gpu)
    if problem:
        raise RecipeError(f"{where}: {problem}")


def refuse_int8_beside_cuda(plan: ComponentPolicy, where: str, cuda_present: bool | None = None) -> None:
    """One ``RecipeError`` before loading for bitsandbytes LLM.int8 on a CPU-placed component beside a CUDA GPU.

    transformers then loads it onto the GPU (``update_device_map`` of its bitsandbytes quantizers), and moved to the CPU
    LLM.int8 keeps its row scales there: ``invalid argument to getCurrentStream`` and a broken CUDA context (measured on
    an H200 machine: bitsandbytes 0.50.2, transformers 5.17, torch 2.11; NF4 ran). Without a GPU it runs.

    Example:
        >>> import dataclasses
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("flux", device="cpu", overrides={"text_encoder_2": {"storage": "bnb-int8"}})["text_encoder_2"]
        >>> plan = dataclasses.replace(plan, device="cpu")  # placed as load_pipeline(..., "cpu") places it
        >>> refuse_int8_beside_cuda(plan, "./flux", cuda_present=False)  # no GPU: allowed
        >>> refuse_int8_beside_cuda(plan, "./flux", cuda_present=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        hf_precision.errors.RecipeError: ./flux: text_encoder_2.storage=bnb-int8 on cpu beside a CUDA GPU: ...
    """
    if plan.storage != "bnb-int8" or not str(plan.device).startswith("cpu"):  # None: not placed yet
        return
    if not (torch.cuda.is_available() if cuda_present is None else cuda_present):
        return
    allowed = [s for s in device_caps("cpu").storage if is_quantized(s) and s != plan.storage]
    raise RecipeError(
        f"{where}: {plan.name}.storage=bnb-int8 on cpu beside a CUDA GPU: transformers loads bitsandbytes weights onto "
        f"the GPU and LLM.int8 keeps its row scales there when the component moves to the CPU (then 'invalid argument "
        f"to getCurrentStream' and a broken CUDA context); allowed on the CPU here: {', '.join(allowed)}; fix: "
        f"--set {plan.name}.storage=int8 (torchao), or place {plan.name} on the GPU "
        f"(device={{'{plan.name}': 'cuda', 'default': ...}})")


def backend_config(plan: ComponentPolicy, module: torch.nn.Module, islands: Iterable[str]) -> Any:
    """The diffusers or transformers quantization config for one component (``module`` may be on meta).

    Example:
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("unet.sdxl", device="t4", overrides={"unet": {"storage": "quanto-int8"}})["unet"]
        >>> m = torch.nn.ModuleDict({"proj_out": torch.nn.Linear(2, 2), "blocks": torch.nn.Linear(2, 2)})
        >>> cfg = backend_config(plan, m, [])
        >>> type(cfg).__name__, cfg.weights_dtype, cfg.modules_to_not_convert
        ('QuantoConfig', 'int8', ['proj_out'])
    """
    require_backend(plan.storage, plan.name)
    choice = CHOICES[plan.storage]
    library = library_of(module)
    passed = _passed(library, choice.backend, module, plan, list(islands))
    if library == "transformers":
        import transformers as lib
    else:
        import diffusers as lib
    if choice.backend == "quanto":  # transformers names it `weights` (an unknown `weights_dtype` is dropped: int8)
        guard_quanto_int8pack()
        if library == "transformers":
            return lib.QuantoConfig(weights=choice.scheme, modules_to_not_convert=passed)
        return lib.QuantoConfig(weights_dtype=choice.scheme, modules_to_not_convert=passed)
    if choice.backend == "bitsandbytes":
        guard_bnb_cpu_packing()
        compute = dt.to_torch(plan.compute)
        if choice.scheme == "int8":
            return lib.BitsAndBytesConfig(load_in_8bit=True, llm_int8_skip_modules=passed)
        return lib.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=choice.scheme,
                                      bnb_4bit_compute_dtype=compute, llm_int8_skip_modules=passed)
    import torchao.quantization as ao

    config = torchao_scheme(choice.scheme)
    if library == "transformers":
        return lib.TorchAoConfig(config, modules_to_not_convert=passed)
    with warnings.catch_warnings():  # torchao 0.18 warns `_default` is deprecated, yet documents it as the way to
        # quantize every Linear but the named ones (quant_api.py FqnToConfig docstring); nothing replaces it yet
        warnings.filterwarnings("ignore", message="Config Deprecation: _default", category=UserWarning)
        return lib.TorchAoConfig(ao.FqnToConfig({"_default": config, **{n: None for n in passed}}))


def torchao_scheme(scheme: str) -> Any:
    """The torchao config object for a storage choice's scheme (fp8 compute per row, as torchao recommends).

    Example:
        >>> type(torchao_scheme("Int8WeightOnlyConfig")).__name__
        'Int8WeightOnlyConfig'
    """
    import torchao.quantization as ao

    if scheme == "Float8DynamicActivationFloat8WeightConfig":
        return ao.Float8DynamicActivationFloat8WeightConfig(granularity=ao.PerRow())
    return getattr(ao, scheme)()


def pipeline_quantization_config(recipe: Recipe, modules: Mapping[str, tuple[torch.nn.Module, list[str]]]) -> Any:
    """``PipelineQuantizationConfig`` for the components whose storage is a quantized layout, or ``None``.

    ``modules`` maps each such component to its model (meta device is enough) and its islands.
    """
    mapping = {p.name: backend_config(p, *modules[p.name]) for p in recipe.policies
               if is_quantized(p.storage) and p.name in modules}
    if not mapping:
        return None
    from diffusers import PipelineQuantizationConfig

    return PipelineQuantizationConfig(quant_mapping=mapping)
