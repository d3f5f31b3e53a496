"""A pipeline recipe for any pipeline class, composed from the component recipes. Torch-free.

When no shipped pipeline recipe lists a pipeline class (a new diffusers pipeline, a ControlNet variant), its
recipe is composed from what the pipeline is made of: each model component whose class a component recipe lists
gets that recipe (``use:``); the denoiser is the component whose role is ``denoiser`` (the runtime tells the roles
from where diffusers keeps each class: ``diffusers.models.transformers``/``unets`` denoise,
``autoencoders`` encode and decode, ``controlnets`` condition); any other model class is kept in a dtype its
device computes, gets boundary hooks like every component, and is named in one warning with the override line that
pins it.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError, override_line

__all__ = ["compose_spec", "component_spec", "component_recipe_for", "ROLES"]

# What a model component does in a pipeline, from the diffusers/transformers module that defines its class.
ROLES = ("denoiser", "vae", "controlnet", "encoder", "other")
# Unknown model classes: the first of these the device picks unasked (half where it is fast, else fp32), with the
# NaN guard on, since nothing is known about where they overflow.
UNKNOWN_DTYPES = ["bfloat16", "float16", "float32"]


@functools.lru_cache(maxsize=None)
def _class_index() -> dict[str, str]:
    """Model class name -> the first component recipe entry (``stem.entry``) that lists it, in file order."""
    from .files import recipes_dir
    from .resolution import component_entries

    index: dict[str, str] = {}
    for path in sorted((recipes_dir() / "components").glob("*.yaml")):
        for entry, policy in component_entries(path.stem).items():
            for cls in policy.get("class") or ():
                index.setdefault(str(cls), f"{path.stem}.{entry}")
    return index


def component_recipe_for(class_name: str) -> str | None:
    """The component recipe (``"clip.text"``) whose ``class:`` list names this model class, or ``None``.

    Example:
        >>> component_recipe_for("CLIPTextModelWithProjection"), component_recipe_for("NoSuchModel")
        ('clip.text', None)
    """
    return _class_index().get(class_name)


def component_spec(name: str, cls: str, role: str) -> dict[str, Any]:
    """A pipeline recipe's entry for component ``name`` of model class ``cls``: the component recipe that lists the
    class, or, for a class none lists, a dtype its device picks unasked with the NaN guard and boundary casts.

    Example:
        >>> component_spec("text_encoder", "T5EncoderModel", "text_encoder")
        {'use': 't5.encoder'}
        >>> component_spec("vae", "MyVAE", "vae")["entry"]
        ['encoder', 'quant_conv', 'post_quant_conv', 'decoder']
    """
    ref = component_recipe_for(cls)
    if ref is not None:
        return {"use": ref}
    spec: dict[str, Any] = {
        "class": [cls], "dtypes": list(UNKNOWN_DTYPES), "nan_guard": True,
        "output": "input" if role == "denoiser" else "compute",
        "why": f"no component recipe lists {cls}: kept in the first of {UNKNOWN_DTYPES} this device picks unasked, "
               f"with the NaN guard; pin it with {override_line(name, 'dtype', 'float32')}",
    }
    if role == "vae":  # VAEs are called through encode()/decode(), never forward(): hook the submodules they use
        spec["entry"] = ["encoder", "quant_conv", "post_quant_conv", "decoder"]
    return spec


def compose_spec(pipeline_class: str, models: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """The data of a pipeline recipe for ``pipeline_class``, from its model components.

    Args:
        pipeline_class: the diffusers pipeline class name.
        models: component name -> (model class name, role), role one of :data:`ROLES`. Only ``nn.Module``
            components: tokenizers, schedulers and processors have no dtype.

    Returns:
        A pipeline recipe as a dict (same schema as ``recipes/*.yaml``).

    Example:
        >>> spec = compose_spec("FluxControlNetPipeline", {"transformer": ("FluxTransformer2DModel", "denoiser"),
        ...                     "controlnet": ("FluxControlNetModel", "controlnet"), "vae": ("AutoencoderKL", "vae")})
        >>> spec["denoiser"], spec["components"]["transformer"], spec["components"]["vae"]
        ('transformer', {'use': 'mmdit.flux'}, {'use': 'autoencoders.kl_any'})
    """
    if not models:
        raise RecipeError(f"{pipeline_class}: its signature names no model class (e.g. `model: Any`), so no recipe can "
                          f"be composed from the class alone; load it from a folder (the classes then come from "
                          f"model_index.json) or pass recipe=<your recipe YAML>")
    components: dict[str, dict[str, Any]] = {}
    unknown: list[str] = []
    for name, (cls, role) in models.items():
        components[name] = component_spec(name, cls, role)
        if "use" not in components[name]:
            unknown.append(f"{name} ({cls})")
    denoisers = sorted(n for n, (_, role) in models.items() if role == "denoiser")
    if unknown:
        warnings.warn(f"{pipeline_class}: no component recipe for {', '.join(unknown)}; each is kept in the first of "
                      f"{', '.join(UNKNOWN_DTYPES)} its device picks unasked, with boundary casts and the NaN guard. Pin "
                      f"one with e.g. {override_line(unknown[0].split(' ')[0], 'dtype', 'float32')}",
                      stacklevel=3)
    return {"schema": 1, "kind": "pipeline", "model": None, "pipelines": [pipeline_class],
            "denoiser": denoisers[0] if denoisers else None, "latents_from": None, "components": components}
