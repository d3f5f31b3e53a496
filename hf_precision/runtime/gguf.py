"""A GGUF single file as the denoiser of a diffusers pipeline: ``load_pipeline("x.gguf", base="<diffusers folder>")``.

GGUF files (ComfyUI-GGUF, city96's Flux/Wan quantizations) hold one model; the rest comes from ``base``. diffusers
reads it: ``from_single_file(file, config=base, subfolder=<denoiser>,
quantization_config=GGUFQuantizationConfig(compute_dtype=<the recipe's>))`` keeps the blocks packed and dequantizes
per layer on use.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from .. import dtypes as dt
from ..errors import RecipeError
from .single_file import hub_kwargs, refuse_unreadable
from .source import component_class, listed_components
from ..recipe.resolution import Recipe

__all__ = ["load_gguf_denoiser", "gguf_packed"]


def load_gguf_denoiser(path: Path, where: str, index: Mapping[str, Any], recipe: Recipe,
                       kwargs: Mapping[str, Any]) -> tuple[str, Any]:
    """Load the recipe's denoiser from a GGUF file through diffusers' ``from_single_file``; (component, model)."""
    import diffusers

    name = recipe.denoiser
    spec = listed_components(index).get(name) if name else None
    if spec is None:
        raise RecipeError(f"{path}: the base {where} has no denoiser component for the GGUF file (recipe {recipe.name})")
    cls = component_class(*spec, index.get("_class_name"))
    if cls is None:
        raise RecipeError(f"{path}: diffusers {diffusers.__version__} has no class {spec[1]} (the {name} of {where})")
    refuse_unreadable(path, cls, name, where)
    try:
        import gguf  # noqa: F401  (diffusers reads the file with it)
    except ImportError:
        raise RecipeError("reading a GGUF file needs the gguf package: pip install gguf (or 'hf-precision[quant]')") from None
    plan = recipe[name]
    compute = dt.to_torch(plan.compute)
    try:
        model = cls.from_single_file(str(path), config=where, subfolder=name, torch_dtype=compute,
                                     quantization_config=diffusers.GGUFQuantizationConfig(compute_dtype=compute),
                                     **hub_kwargs(kwargs))
    except (ValueError, KeyError, RuntimeError, OSError) as err:
        raise RecipeError(f"{path}: diffusers could not load it as the {name} ({spec[1]}) of {where}: {err}; check that "
                          f"the file is a {spec[1]} (same architecture and size as the base folder)") from None
    from .layout import component_islands

    _dequantize_unreadable(model, compute, component_islands(plan, model, strict=False) + _first_layer(model))
    return name, model


def _first_layer(model: Any) -> list[str]:
    """The layer holding the model's first parameter, kept unpacked: pipelines make their latents in
    ``next(model.parameters()).dtype`` (Stable Cascade's prior pipeline, pipeline_stable_cascade_prior.py), which a
    packed GGUF weight makes uint8 ('"normal_kernel_cpu" not implemented for 'Byte'')."""
    first = next(iter(model.named_parameters()), None)
    return [first[0].rpartition(".")[0]] if first is not None else []


def _dequantize_unreadable(model: Any, compute: Any, islands: list[str]) -> int:
    """Unpack the GGUF tensors diffusers left packed where they cannot be used; returns how many layers.

    Only ``GGUFLinear`` unpacks on use (quantizers/gguf/utils.py), so a convolution stored BF16 or Q8_0 would reach
    torch as raw bytes ("expected scalar type BFloat16 but found Byte"): unpacked once to the compute dtype, as
    ComfyUI-GGUF does without a kernel. The ``islands`` layers become plain ``nn.Linear`` too, kept fp32 by the recipe.
    """
    import torch
    from diffusers.quantizers.gguf.utils import GGUFLinear, GGUFParameter, dequantize_gguf_tensor

    from ..recipe.patterns import inside

    count = 0
    kept = set(islands)
    for mname, module in model.named_modules():
        if isinstance(module, GGUFLinear):
            if not inside(mname, kept):
                continue
            module.__class__ = torch.nn.Linear  # the same parameters, torch's forward
        for pname, param in list(module._parameters.items()):
            if isinstance(param, GGUFParameter):
                plain = dequantize_gguf_tensor(param).to(compute)
                module._parameters[pname] = torch.nn.Parameter(plain.as_subclass(torch.Tensor), requires_grad=False)
                count += 1
        for bname, buf in list(module._buffers.items()):  # a table the file holds packed (SD3's pos_embed)
            if isinstance(buf, GGUFParameter):
                module._buffers[bname] = dequantize_gguf_tensor(buf).to(compute).as_subclass(torch.Tensor)
                count += 1
    return count


def gguf_packed(path: str | os.PathLike[str], module: Any, islands: tuple[str, ...] | list[str] = ()) -> dict[str, tuple[str, int]]:
    """Parameter name -> (GGUF type, bytes) for the parameters of ``module`` (meta is enough) that stay packed on load.

    diffusers' rule (quantizers/gguf/): a quantized (or BF16) tensor stays packed only as the ``weight`` of an
    ``nn.Linear`` that ``_replace_with_gguf_linear`` makes a ``GGUFLinear`` (none on its path in
    ``_keep_in_fp32_modules``); the loader here also unpacks the recipe's fp32 ``islands`` and the first parameter's
    layer (pipelines read their dtype from it). The rest is plain in the recipe's dtypes; file tensors that are no
    parameter (SD3's ``pos_embed``) are not weights.

    Example:
        >>> import tempfile, torch
        >>> from hf_precision.testing.gguf_file import write_gguf
        >>> path = Path(tempfile.mkdtemp()) / "m.gguf"
        >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
        >>> _ = write_gguf(net, path)
        >>> gguf_packed(path, net)   # 8 rows x 2 blocks of 34 bytes; biases (F32) and the first layer are plain
        {'1.weight': ('Q8_0', 544)}
    """
    import gguf
    import torch

    from ..recipe.patterns import inside

    plain = (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16)
    packed = {str(t.name): t for t in gguf.GGUFReader(str(path)).tensors if t.tensor_type not in plain}
    keep = set(getattr(module, "_keep_in_fp32_modules", None) or ())
    kept = frozenset(list(islands) + _first_layer(module))
    out: dict[str, tuple[str, int]] = {}
    for mname, layer in module.named_modules():
        prefix = f"{mname}." if mname else ""
        if (not isinstance(layer, torch.nn.Linear) or f"{prefix}weight" not in packed
                or keep.intersection(mname.split(".")) or inside(mname, kept)):
            continue
        for pname, _ in layer.named_parameters(recurse=False):
            tensor = packed.get(prefix + pname)
            if tensor is not None:
                out[prefix + pname] = (tensor.tensor_type.name, int(tensor.n_bytes))
    return out
