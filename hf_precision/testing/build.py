"""The one generic builder: a row of ``hf_precision/testing/tiny/*.yaml`` to a float32 pipeline and its call kwargs.

Every model is built from its own seed (``seed`` plus the component's ``seed``, :func:`~.parts.seeded`), so its
weights do not depend on the order the others were built in. Call-kwarg values are data too: ``{image: 32, seed: 1}``
(a random RGB image), ``{video: 5, size: 16}`` (5 such frames), ``{mask: 32}`` (a white square on black),
``{blank_masks: 5, size: 16}``, ``{randn: [1, 16, 2, 2], seed: 3, index: 0}`` (a seeded draw, row ``index`` of it)
and ``{class: dotted.Path, kwargs: {...}}``::

    >>> call_value({"image": 16, "seed": 1}).size
    (16, 16)
    >>> call_value({"randn": [2, 3], "seed": 0, "index": 1}).shape
    torch.Size([1, 3])
"""

from __future__ import annotations

import copy
import difflib
import importlib
import re
import warnings
from typing import Any, Callable, Mapping

from ..errors import RecipeError, excerpt
from .hooks import HOOKS
from .parts import example_image, seeded
from .rows import Row, check_size, presets

__all__ = ["build_pipeline", "call_value", "component_configs", "find_class"]

# a mapping is made into a value when its keys are one maker and that maker's options, nothing else
_MAKERS = {"image": {"seed"}, "video": {"size"}, "mask": set(), "blank_masks": {"size"}, "randn": {"seed", "index"},
           "class": {"kwargs"}}
_REFERENCE = re.compile(r"^\$(?:len\((\w+)\)|id\((\w+),\s*(.+)\)|(\w+)\.(\w+))$")


def build_pipeline(row: Row, seed: int, size: str | Mapping[str, Any], lookup: Callable[[str], Any]) -> Any:
    """Build ``row``'s pipeline (float32, not yet finished) for ``seed`` at ``size``; ``lookup(name)`` gives a row's
    :class:`~hf_precision.testing.record.TinyPipeline` (for ``base``).

    >>> from hf_precision.testing import PIPELINES
    >>> pipe = build_pipeline(PIPELINES["dit"].row, 0, {"transformer": {"num_layers": 1}}, PIPELINES.__getitem__)
    >>> type(pipe).__name__, len(pipe.transformer.transformer_blocks)
    ('DiTPipeline', 1)
    """
    check_size(row, size)
    data = row.data
    own = data.get("components", {})
    parts: dict[str, Any] = {}
    if "base" in data:
        base_size, size = _split_size(data.get("size", {}), size, own)
        base = lookup(data["base"]).build(seed, base_size)
        parts = {k: v for k, v in base.components.items() if k not in data.get("drop", ())}
    configs, explicit = component_configs(row, size)
    _derive(row, configs, explicit)
    for name, spec in own.items():
        parts[name] = _component(row, name, spec, configs.get(name, {}), parts, seed)
    cls = find_class(data["pipeline"], row.where("pipeline"))
    return cls(**parts, **data.get("init", {}))


def _split_size(row_size: dict, size: str | Mapping[str, Any], own: Mapping[str, Any]) -> tuple[dict, dict]:
    # a derived row's own components take a caller's overrides for them; the rest go to the base build
    given = dict(size) if isinstance(size, Mapping) else {}
    base = copy.deepcopy(row_size)
    for name, values in given.items():
        if name not in own:
            base[name] = {**base.get(name, {}), **(values or {})}
    return base, {k: v for k, v in given.items() if k in own}


def component_configs(row: Row, size: str | Mapping[str, Any]) -> tuple[dict[str, dict], dict[str, set]]:
    """(config per component, the keys a dict ``size`` gave per component) of ``row`` at ``size``.

    >>> from hf_precision.testing.rows import load_rows
    >>> configs, explicit = component_configs(load_rows()["sdxl"], {"unet": {"in_channels": 9}})
    >>> configs["unet"]["in_channels"], explicit
    (9, {'unet': {'in_channels'}})
    """
    components = {k: v for k, v in row.data.get("components", {}).items() if isinstance(v, dict)}
    if isinstance(size, str):
        if size == "tiny":
            return {k: _with_preset(v.get("preset"), v.get("config", {})) for k, v in components.items()}, {}
        preset = row.data["sizes"][size]
        tiny, _ = component_configs(row, "tiny")
        return {k: _with_preset(preset[k].get("preset"), {n: v for n, v in preset[k].items() if n != "preset"})
                if k in preset else tiny[k] for k in components}, {}
    overrides = dict(size)
    configs, _ = component_configs(row, overrides.pop("base", "tiny"))
    explicit: dict[str, set] = {}
    for name, values in overrides.items():
        if name not in configs:
            raise ValueError(f"unknown component {name!r} for {row.name}; expected some of {sorted(configs)}")
        if values is not None:
            configs[name] = {**configs[name], **values}
            explicit[name] = set(values)
    return configs, explicit


def _with_preset(name: str | None, config: Mapping[str, Any]) -> dict[str, Any]:
    return copy.deepcopy({**(presets()[name] if name else {}), **config})


def _derive(row: Row, configs: dict[str, dict], explicit: dict[str, set]) -> None:
    # `derive: {unet.cross_attention_dim: [text_encoder.hidden_size, 6 * unet.addition_time_embed_dim]}`: the sum
    # of the terms, unless the caller's size gave the key itself
    for target, terms in row.data.get("derive", {}).items():
        component, key = target.split(".", 1)
        if key in explicit.get(component, set()):
            continue
        total = 0
        for term in terms:
            factor, _, ref = term.rpartition("*")
            source, name = ref.strip().split(".", 1)
            try:
                total += int(factor or 1) * configs[source][name]
            except (KeyError, ValueError):
                raise RecipeError(f"{row.where('derive.' + target)}: bad term {excerpt(term)}; write COMPONENT.KEY "
                                  "or N * COMPONENT.KEY of a component config") from None
        configs[component][key] = total


def _component(row: Row, name: str, spec: Any, config: dict, parts: dict, seed: int) -> Any:
    if spec is None:
        return None
    if "tokenizer" in spec:
        return HOOKS["tokenizer"][spec["tokenizer"]]()
    config = _references(row, name, config, parts)
    own_seed = seed + spec.get("seed", 0)
    if "hook" in spec:
        return seeded(own_seed, lambda: HOOKS["component"][spec["hook"]](parts, **config))
    cls = find_class(spec["class"], row.where(f"components.{name}.class"))
    if not _is_module(cls):  # schedulers, image processors: no weights, nothing to seed
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "torchvision not available, falling back to the PIL processor"
            return cls(**config)

    def build() -> Any:
        config_class = getattr(cls, "config_class", None)
        if cls.__module__.startswith("transformers.") and config_class is not None:
            model = cls(config_class(**config), **spec.get("init", {}))
        else:
            model = cls(**config, **spec.get("init", {}))
        if "after" in spec:
            HOOKS["after"][spec["after"]](model)
        return model

    return seeded(own_seed, build)


def _is_module(cls: type) -> bool:
    import torch

    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def _references(row: Row, name: str, value: Any, parts: dict) -> Any:
    # `$len(tokenizer)`, `$id(tokenizer, <image>)`, `$tokenizer.eos_token_id`: facts of a component built before
    if isinstance(value, dict):
        return {k: _references(row, name, v, parts) for k, v in value.items()}
    if isinstance(value, list):
        return [_references(row, name, v, parts) for v in value]
    if not (isinstance(value, str) and value.startswith("$")):
        return value
    match = _REFERENCE.match(value)
    source = match and (match[1] or match[2] or match[4])
    if source not in parts:
        raise RecipeError(f"{row.where('components.' + name + '.config')}: bad reference {excerpt(value)}; write "
                          f"$len(C), $id(C, TOKEN) or $C.ATTR of a component built before, one of {sorted(parts)}")
    if match[1]:
        return len(parts[source])
    if match[2]:
        return parts[source].convert_tokens_to_ids(match[3].strip())
    return getattr(parts[source], match[5])


def find_class(name: str, where: str) -> type:
    """The class ``name`` names: a name diffusers or transformers exports, or a dotted path ``module.Class``.

    >>> find_class("AutoencoderKL", "row").__name__
    'AutoencoderKL'
    >>> find_class("AutoencoderKLL", "tiny.yaml: vae.class")
    Traceback (most recent call last):
    ...
    hf_precision.errors.RecipeError: tiny.yaml: vae.class: unknown class 'AutoencoderKLL'; use a class diffusers or \
transformers exports (did you mean 'AutoencoderKL'?), or a dotted path module.Class
    """
    if "." in name:
        module, _, attr = name.rpartition(".")
        try:
            return getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError):
            raise RecipeError(f"{where}: unknown class {excerpt(name)}; no {attr!r} in module {module!r}") from None
    import diffusers
    import transformers

    for package in (diffusers, transformers):
        try:
            return getattr(package, name)
        except (AttributeError, ImportError):
            continue
    close = difflib.get_close_matches(name, [*dir(diffusers), *dir(transformers)], n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise RecipeError(f"{where}: unknown class {excerpt(name)}; use a class diffusers or transformers exports{hint}, "
                      "or a dotted path module.Class")


def call_value(value: Any) -> Any:
    """A call kwarg's value from its data (see the module doc); plain values pass through."""
    if isinstance(value, list):
        return [call_value(v) for v in value]
    if not isinstance(value, dict):
        return value
    makers = [k for k in _MAKERS if k in value]
    if len(makers) != 1 or not set(value) - {makers[0]} <= _MAKERS[makers[0]]:
        return {k: call_value(v) for k, v in value.items()}
    return _MAKE[makers[0]](value)


def _call_kwargs(kwargs: dict) -> dict:
    # each value on its own: a kwargs mapping that happens to hold an `image` key is no image maker
    return {k: call_value(v) for k, v in kwargs.items()}


def _mask(spec: dict) -> Any:
    from PIL import Image

    side = spec["mask"]
    mask = Image.new("L", (side, side), 0)
    mask.paste(255, (side // 4, side // 4, 3 * side // 4, 3 * side // 4))
    return mask


def _blank_masks(spec: dict) -> list:
    from PIL import Image

    return [Image.new("L", (spec["size"], spec["size"]), 0)] * spec["blank_masks"]


def _randn(spec: dict) -> Any:
    import torch

    draw = torch.randn(*spec["randn"], generator=torch.Generator().manual_seed(spec.get("seed", 0)))
    return draw if "index" not in spec else draw[spec["index"]:spec["index"] + 1]


_MAKE: dict[str, Callable[[dict], Any]] = {
    "image": lambda spec: example_image(spec["image"], seed=spec.get("seed", 0)),
    "video": lambda spec: [example_image(spec["size"], seed=i) for i in range(spec["video"])],
    "mask": _mask,
    "blank_masks": _blank_masks,
    "randn": _randn,
    "class": lambda spec: find_class(spec["class"], "call")(**_call_kwargs(spec.get("kwargs", {}))),
}
