"""The shipped recipe of components given without their pipeline (``prepare_training({"unet": unet, ...})``). Torch-free.

A dict has no pipeline class: its recipe is the one whose denoiser it holds (same name, a class the recipe lists);
recipes sharing that class (``UNet2DConditionModel``: sd15, sd_upscale, sdxl) tell themselves apart by config values
under ``recognise:`` (SDXL: ``addition_embed_type: text_time``). None or several fitting: a RecipeError asks for
``recipe=``; another family's recipe is never guessed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError, excerpt
from .catalog import entry_classes, list_recipes, pipeline_spec, recipes_for_denoiser

__all__ = ["recipe_for_parts", "recognised_by", "recipes_planning"]

Parts = Mapping[str, tuple[str, Mapping[str, Any]]]
_MISSING = object()


def recognised_by(name: str) -> dict[str, dict[str, Any]]:
    """A shipped pipeline recipe's ``recognise:`` section: component -> the config values that tell it apart.

    Example:
        >>> recognised_by("sdxl"), recognised_by("flux")
        ({'unet': {'addition_embed_type': 'text_time'}}, {})
    """
    return {str(c): dict(v) for c, v in (pipeline_spec(name).get("recognise") or {}).items()}


def recipes_planning(component: str, class_name: str) -> list[str]:
    """The shipped pipeline recipes that plan a component of this name and model class, in name order.

    Example:
        >>> found = recipes_planning("text_encoder_2", "CLIPTextModelWithProjection")
        >>> {"sd3", "sdxl"} <= set(found), "flux" in found, found == sorted(found)
        (True, False, True)
    """
    out = []
    for name in list_recipes("pipeline"):
        entry = pipeline_spec(name)["components"].get(component)
        if entry is not None and class_name in (entry_classes(entry) or (class_name,)):
            out.append(name)
    return out


def _holds(name: str, parts: Parts) -> bool:
    for comp, values in recognised_by(name).items():
        if comp not in parts:
            return False  # what tells it apart is not here: not a match, so the choice is left to the user
        config = parts[comp][1]
        # a list value is the config's list or tuple (a patch size), as JSON and the model's own config give it
        if any((list(v) if isinstance(v := config.get(key, _MISSING), tuple) else v) != value
               for key, value in values.items()):
            return False
    return True


def _shown(parts: Parts, name: str) -> str:
    wants = "; ".join(f"{c}.{k} = {v!r}" for c, values in recognised_by(name).items() for k, v in values.items())
    has = ", ".join(f"{c}.{k} = {excerpt(parts[c][1].get(k, '<missing>')) if c in parts else '<no ' + c + '>'}"
                    for c, values in recognised_by(name).items() for k in values)
    return f"{name} wants {wants or 'nothing more'} (given: {has or '-'})"


def recipe_for_parts(parts: Parts, caller: str = "prepare_training") -> str:
    """The shipped pipeline recipe of ``parts`` (component -> (model class, config dict)); a RecipeError from
    ``caller`` asks for ``recipe=`` where none plans their denoiser or the configs do not tell which.

    Example:
        >>> recipe_for_parts({"unet": ("UNet2DConditionModel", {"addition_embed_type": "text_time"})})
        'sdxl'
        >>> recipe_for_parts({"unet": ("UNet2DConditionModel", {"addition_embed_type": None, "num_class_embeds": None})})
        'sd15'
        >>> recipe_for_parts({"transformer": ("FluxTransformer2DModel", {})})
        'flux'
    """
    candidates = sorted({r for comp, (cls, _) in parts.items() for r in recipes_for_denoiser(comp, cls)})
    classes = ", ".join(f"{c}: {cls}" for c, (cls, _) in parts.items()) or "none"
    if not candidates:
        covering = [n for n in list_recipes("pipeline") if all(n in recipes_planning(c, cls) for c, (cls, _) in parts.items())]
        raise RecipeError(f"{caller}: no shipped recipe has a denoiser of the classes given ({classes}); pass the "
                          f"pipeline instead, or name the recipe: recipe='<name>' (recipes that plan "
                          f"{'all of these' if parts else 'them'}: {', '.join(covering) or 'none'})")
    matched = [name for name in candidates if _holds(name, parts)]
    if len(matched) == 1:
        return matched[0]
    offer = matched or candidates
    why = "none of them fits" if not matched else f"{', '.join(matched)} all fit"
    raise RecipeError(f"{caller}: the components given ({classes}) have a denoiser that recipes "
                      f"{', '.join(candidates)} plan, and their configs do not tell which ({why}: "
                      f"{'; '.join(_shown(parts, n) for n in candidates)}); name it: recipe={offer[-1]!r} "
                      f"(or {', '.join(repr(c) for c in offer[:-1])})")
