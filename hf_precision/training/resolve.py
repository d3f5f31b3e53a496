"""The training recipe, resolved once, from configs and the device rules, before any weight loads.

A pipeline, a folder (Hub id, alias) and a dict of components reach it through :func:`resolve_training`: the
recipe (``recipe=``, else :func:`~hf_precision.runtime.choose.recipe_of`'s), its ``training:`` section, the loaded
quantized storage, the user's overrides and the training rule (:func:`~hf_precision.training.rules.training_compute`).
The training program loads straight into it and ``prepare_training(pipe, recipe=tr)`` only attaches.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import torch

from ..recipe.catalog import list_recipes, pipeline_file, training_overrides, unknown_recipe
from ..recipe.devices import device_caps, device_profile
from ..recipe.model import Recipe
from ..recipe.overrides import Override, as_list
from ..recipe.resolution import resolve
from ..runtime.apply import config_dict
from ..runtime.choose import recipe_of
from ..runtime.placement import torch_device
from ..runtime.source import component_configs, listed_components, locate, models_of_index, models_of_pipeline
from . import quantized
from .methods import method_of
from .rules import ComputeChoice, TrainingError, training_compute
from .shard import refuse_unshardable

__all__ = ["Components", "TrainingRecipe", "resolve_training"]


def recipe_name(pipe: Any, recipe: Any) -> str | None:
    """The recipe named with ``recipe=`` (checked), else :func:`~hf_precision.runtime.choose.recipe_of`'s choice.

    Example:
        >>> recipe_name(None, "sdxl")
        'sdxl'
    """
    if recipe is None:
        return recipe_of(pipe, "prepare_training")  # None: composed from the classes of a pipeline no recipe lists
    if not isinstance(recipe, str):
        raise TrainingError(f"prepare_training: recipe= takes a pipeline recipe's name (recipe='sdxl') or a recipe "
                            f"YAML file, got {type(recipe).__name__}")
    if recipe.endswith((".yaml", ".yml")):
        pipeline_file(recipe)  # a missing or invalid file: one error naming it
        return recipe
    if recipe not in list_recipes("pipeline"):
        if recipe in list_recipes("component"):
            raise TrainingError(f"prepare_training: recipe {recipe!r} is a component recipe; training plans every "
                                f"component: name a pipeline recipe ({', '.join(list_recipes('pipeline'))})")
        raise unknown_recipe(recipe)
    return recipe


@dataclasses.dataclass(frozen=True)
class TrainingRecipe:
    """What trains, and the recipe every component is loaded and trained in (:func:`resolve_training`), with what it
    was resolved from, which ``prepare_training(pipe, recipe=tr)`` then needs not again (:meth:`refuse_other`)."""

    recipe: Recipe
    train: Mapping[str, str]
    choices: Mapping[str, ComputeChoice]  # trainable component -> the training rule's (or the override's) compute
    loaded: Mapping[str, str]  # component -> the quantized/fp8 storage a given pipeline already holds
    device: str = "cpu"
    layout: Any = None
    overrides: tuple[Any, ...] = ()

    @property
    def denoiser(self) -> str | None:
        return self.recipe.denoiser

    def refuse_other(self, device: Any = None, layout: Any = None, train: Mapping[str, str] | None = None,
                     overrides: Any = None) -> None:
        """Refuse a setting given beside this recipe that differs from the one it was resolved with.

        Example:
            >>> from hf_precision.runtime.source import CONFIGS_DIR
            >>> tr = resolve_training(CONFIGS_DIR / "stable-diffusion-v1-5", layout="t4")
            >>> tr.refuse_other(layout="t4", train={"unet": "lora"})  # the same: accepted
            >>> tr.refuse_other(layout="a100")
            Traceback (most recent call last):
            ...
            hf_precision.training.rules.TrainingError: prepare_training: layout='a100', but recipe= is a TrainingRecipe resolved with layout='t4'; pass no layout= (the TrainingRecipe holds it), or resolve again with the new value: resolve_training(source, layout='a100', ...)
        """
        same = {"device": lambda v: torch_device(v, "device") == torch_device(self.device, "device"),
                "layout": lambda v: v == self.layout,
                "train": lambda v: dict(v) == dict(self.train),
                "overrides": lambda v: as_list(v) == list(self.overrides)}
        own = {"device": self.device, "layout": self.layout, "train": dict(self.train),
               "overrides": list(self.overrides) or None}
        for key, value in (("device", device), ("layout", layout), ("train", train), ("overrides", overrides)):
            if value is not None and not same[key](value):
                raise TrainingError(f"prepare_training: {key}={value!r}, but recipe= is a TrainingRecipe resolved with "
                                    f"{key}={own[key]!r}; pass no {key}= (the TrainingRecipe holds it), or resolve again "
                                    f"with the new value: resolve_training(source, {key}={value!r}, ...)")


@dataclasses.dataclass(frozen=True)
class _Parts:
    """What resolution reads from a source: no weights, only classes and configs."""

    pipeline_class: str
    configs: dict[str, dict[str, Any]]
    components: list[str]
    models: Any
    loaded: dict[str, str]
    is_dict: bool


def _parts(source: Any) -> _Parts:
    if isinstance(source, (str, os.PathLike)):
        where, index, folder = locate(source)
        return _Parts(str(index.get("_class_name")), component_configs(where, index, folder),
                      list(listed_components(index)), models_of_index(index), {}, False)
    is_dict = isinstance(source, Mapping)
    holder = Components(source) if is_dict else source
    comps = {n: m for n, m in holder.components.items() if isinstance(m, torch.nn.Module)}
    return _Parts(type(holder).__name__, {n: config_dict(m) for n, m in comps.items()}, list(comps),
                  models_of_pipeline(holder), quantized.loaded_storage(holder, comps), is_dict)


class Components:
    """A bag of components standing in for a pipeline (``prepare_training({"unet": m, ...})``)."""

    def __init__(self, parts: Mapping[str, Any]):
        self._parts = dict(parts)
        for name, part in self._parts.items():
            object.__setattr__(self, name, part)

    @property
    def components(self) -> dict[str, Any]:
        return dict(self._parts)


def resolve_training(source: Any, device: Any = "cpu", layout: Any = None, train: Mapping[str, str] | None = None,
                     overrides: Any = None, recipe: str | None = None, force: bool = False,
                     shard: bool = False) -> TrainingRecipe:
    """The recipe a training set-up loads and trains in, from configs and the device rules alone.

    The arguments are :func:`~hf_precision.training.setup.prepare_training`'s; ``source`` may also be a folder, Hub
    id or alias (nothing is loaded), and ``shard`` refuses here what FSDP2 cannot shard. Raises TrainingError for a
    trainable part stored in a form training cannot update, a dict that does not tell two recipes apart (asking for
    ``recipe=``), or no denoiser and nothing said to train.

    Example:
        >>> from hf_precision.runtime.source import CONFIGS_DIR
        >>> tr = resolve_training(CONFIGS_DIR / "stable-diffusion-v1-5", layout="t4")
        >>> tr.recipe.name, dict(tr.train), tr.recipe["unet"].compute, tr.recipe["vae"].compute
        ('sd15', {'unet': 'lora'}, 'float16', 'float32')
    """
    parts = _parts(source)
    name = recipe_name(source, recipe)
    force = force or parts.is_dict  # a dict has no pipeline class to check the recipe against
    fixed = [t for t in [training_overrides(name) if name else None, quantized.loaded_layer(parts.loaded)] if t]
    user = as_list(overrides)

    def resolved(layers: list[Any]) -> Recipe:
        return resolve(name, pipeline_class=parts.pipeline_class, devices=str(device), layout=layout,
                       configs=parts.configs, overrides=layers, components=parts.components, models=parts.models,
                       force=force)

    base = resolved(fixed + user)
    denoiser = base.denoiser  # also for a recipe composed from the classes of a pipeline no recipe lists
    train = dict(train) if train is not None else ({denoiser: "lora"} if denoiser in parts.components else {})
    if not train:
        raise TrainingError(f"prepare_training: recipe {base.name} names no denoiser among {sorted(parts.components)}; "
                            f"say what trains: train={{'<component>': 'lora'}}")
    quantized.refuse_untrainable(base, train, denoiser)
    if shard:
        refuse_unshardable(base, train)
    profile = device_profile(layout if layout is not None else str(device))
    caps = device_caps(profile)
    choices = {comp: training_compute(comp, (*base[comp].dtypes, base[comp].compute), caps.auto, profile.label(),
                                      dict(caps.why))
               for comp, kind in train.items() if method_of(kind).trains_weights and comp in base}
    quantized.keep_loaded_compute(source, parts.loaded, choices)
    rule = {comp: {"dtype": c.dtype, "why": c.rule} for comp, c in choices.items()}
    # the rule sits under the user's overrides: an override of a trainable part's dtype wins, and says so
    final = resolved(fixed + [Override("training rule (hf_precision.training.rules)", {"components": rule})] + user) \
        if rule else base
    for comp, choice in list(choices.items()):
        if final[comp].compute != choice.dtype:
            choices[comp] = ComputeChoice(final[comp].compute,
                                          f"set by the user's override (the training rule said {choice.dtype})")
    return TrainingRecipe(recipe=final, train=train, choices=choices, loaded=parts.loaded, device=str(device),
                          layout=layout, overrides=tuple(user))
