"""The tiny pipelines as data: read and check the rows of ``hf_precision/testing/tiny/*.yaml`` (and extra files).

A file maps row names to rows; a top-level key starting with ``_`` is no row (it holds YAML anchors), and
``tiny/_presets.yaml`` holds shared configs. A row::

    flux:                                  # the name: PIPELINES["flux"]
      pipeline: FluxPipeline               # the diffusers pipeline class
      recipe: flux                         # the shipped recipe that names it
      tags: [image, dit]                   # image/video, unet/dit, core; shares_layout: another row's classes
                                           # and dtype layout (the per-layout real-forward tests skip it)
      output: images                       # the attribute of the call's output holding the result (default)
      loads: true                          # false: diffusers cannot load the saved folder back
      mode: ""                             # video: t2v, i2v, v2v, vace, condition, animate
      time_mlp: ""                         # the denoiser's timestep-embedding MLP
      prepare: NAME                        # a registered prepare hook (hooks.py)
      base: ROW                            # start from that row's pipeline components...
      size: {unet: {in_channels: 9}}       # ...built with these config overrides
      drop: [image_encoder]                # ...less these
      components:                          # added or replaced, built in this order
        transformer: {class: FluxTransformer2DModel, config: {...}, seed: 0, init: {}, after: NAME}
        vae: {class: AutoencoderKL, preset: vae_kl, config: {...}}   # preset config, then config
        tokenizer: {tokenizer: clip}       # a registered tokenizer
        controlnet: {hook: NAME, seed: 1, config: {...}}             # a registered component hook
        safety_checker: null
      init: {requires_safety_checker: false}    # further pipeline arguments
      sizes: {mid: {COMPONENT: {preset: NAME, KEY: VALUE}}}         # size presets beyond tiny (core rows)
      derive: {unet.cross_attention_dim: [text_encoder.hidden_size, 6 * unet.addition_time_embed_dim]}
      call: {prompt: a cat, image: {image: 32, seed: 1}, ...}      # 2-step call kwargs (values: build.py)
      call_sizes: {mid: {height: 64}}      # call kwargs over `call` at a size preset

``class`` is a name diffusers or transformers exports, or a dotted path to a class. Config values ``$len(C)``,
``$id(C, TOKEN)`` and ``$C.ATTR`` read a component built before (a tokenizer's length, a token's id, an attribute).

    >>> rows = load_rows()
    >>> rows["flux"].data["pipeline"], rows["flux"].source.name
    ('FluxPipeline', 'dit.yaml')
"""

from __future__ import annotations

import copy
import functools
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from ..errors import Problems, RecipeError, excerpt

__all__ = ["ENV", "FOLDER", "Row", "check_size", "known_sizes", "load_rows", "presets", "resolve_call"]

FOLDER = Path(__file__).with_name("tiny")
ENV = "HF_PRECISION_TINY_PIPELINES"  # extra row files, separated by os.pathsep

_ROW_KEYS = {"pipeline", "recipe", "tags", "output", "loads", "mode", "time_mlp", "prepare", "base", "size", "drop",
             "components", "init", "sizes", "derive", "call", "call_sizes"}
_COMPONENT_KEYS = {"class", "tokenizer", "hook", "preset", "config", "init", "seed", "after"}
_KINDS = ("class", "tokenizer", "hook")
_TEXT = ("pipeline", "recipe", "output", "mode", "time_mlp", "base")
_MAPS = ("size", "components", "init", "sizes", "derive", "call", "call_sizes")


@dataclass(frozen=True)
class Row:
    """One row: its ``name``, the file it came from (``source``) and its checked ``data``."""

    name: str
    source: Path
    data: dict[str, Any] = field(repr=False)

    def where(self, key: str) -> str:
        """``FILE: ROW.KEY``, how every error about this row starts."""
        return f"{self.source}: {self.name}.{key}" if key else f"{self.source}: {self.name}"


@functools.lru_cache(maxsize=None)
def presets() -> dict[str, dict[str, Any]]:
    """The shared configs of ``tiny/_presets.yaml``, by name.

    >>> presets()["t5"]["d_model"]
    32
    """
    return _read(FOLDER / "_presets.yaml")


def load_rows(*extra: str | os.PathLike[str]) -> dict[str, Row]:
    """Every row of the shipped files, the files in ``$HF_PRECISION_TINY_PIPELINES``, then ``extra`` files.

    A bad row (unknown key, hook or preset, a ``base`` that is no row, a name in two files) raises one
    :class:`~hf_precision.errors.RecipeError` naming the file, the row, the key, the value and what is allowed.

    >>> rows = load_rows()
    >>> rows["sd_inpaint"].data["base"], rows["sd_inpaint"].where("size")[-26:]
    ('sd15', 'unet.yaml: sd_inpaint.size')
    """
    files = sorted(p for p in FOLDER.glob("*.yaml") if not p.name.startswith("_"))
    files += [Path(p) for p in os.environ.get(ENV, "").split(os.pathsep) if p] + [Path(p) for p in extra]
    rows: dict[str, Row] = {}
    for path in files:
        for name, data in _read(path).items():
            if str(name).startswith("_"):
                continue
            if name in rows:
                raise RecipeError(f"{path}: {name}: a row of that name is in {rows[name].source} too; rename one")
            rows[name] = _check(Row(str(name), path, data))
    for row in rows.values():
        base = row.data.get("base")
        if base is not None and base not in rows:
            raise RecipeError(f"{row.where('base')}: unknown row {excerpt(base)}; use one of {sorted(rows)}")
    return rows


def _read(path: Path) -> dict[str, Any]:
    if path.parent == FOLDER:  # the shipped files do not change while the process runs: parse them once
        return copy.deepcopy(_read_shipped(path))
    return _parse(path)


@functools.lru_cache(maxsize=None)
def _read_shipped(path: Path) -> dict[str, Any]:
    return _parse(path)


def _parse(path: Path) -> dict[str, Any]:
    import yaml

    try:
        # yaml.safe_load's loader, in C where PyYAML has it (the rows parse in a tenth of the time)
        data = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except OSError as err:
        raise RecipeError(f"{path}: cannot read the tiny-pipeline file ({err.strerror}); check the path") from None
    except yaml.YAMLError as err:
        raise RecipeError(f"{path}: not valid YAML ({str(err).splitlines()[0]}); fix the file") from None
    if not isinstance(data, dict):
        raise RecipeError(f"{path}: a tiny-pipeline file maps row names to rows, not {type(data).__name__}")
    return data


def _check(row: Row) -> Row:
    from .hooks import HOOKS

    problems = Problems(str(row.source))
    data = row.data
    if not isinstance(data, dict):
        raise RecipeError(f"{row.where('')}: a row is a mapping of {sorted(_ROW_KEYS)}, not {excerpt(data)}")
    for key in sorted(set(data) - _ROW_KEYS):
        problems.add(f"{row.name}.{key}", f"unknown key (value {excerpt(data[key])}); allowed: {sorted(_ROW_KEYS)}")
    for key in ("pipeline", "recipe", "call"):
        if key not in data:
            problems.add(f"{row.name}.{key}", "missing; every row names its pipeline class, recipe and call kwargs")
    if "components" not in data and "base" not in data:
        problems.add(f"{row.name}.components", "missing; a row has components, or a base row to start from")
    for key in _TEXT:
        if key in data and not isinstance(data[key], str):
            problems.add(f"{row.name}.{key}", f"bad value {excerpt(data[key])}; a string")
    for key in _MAPS:
        if key in data and not isinstance(data[key], dict):
            problems.add(f"{row.name}.{key}", f"bad value {excerpt(data[key])}; a mapping")
    for key in ("tags", "drop"):
        if key in data and not (isinstance(data[key], list) and all(isinstance(v, str) for v in data[key])):
            problems.add(f"{row.name}.{key}", f"bad value {excerpt(data[key])}; a list of strings")
    if "prepare" in data and data["prepare"] not in HOOKS["prepare"]:
        problems.add(f"{row.name}.prepare", _unknown("prepare hook", data["prepare"], HOOKS["prepare"]))
    components = data.get("components")
    for name, spec in (components.items() if isinstance(components, dict) else ()):
        _check_component(problems, f"{row.name}.components.{name}", spec, HOOKS)
    problems.raise_if_any()
    return row


def _check_component(problems: Problems, path: str, spec: Any, hooks: dict[str, dict[str, Any]]) -> None:
    if spec is None:
        return
    if not isinstance(spec, dict):
        problems.add(path, f"bad value {excerpt(spec)}; null or a mapping with one of {list(_KINDS)}")
        return
    for key in sorted(set(spec) - _COMPONENT_KEYS):
        problems.add(f"{path}.{key}", f"unknown key (value {excerpt(spec[key])}); allowed: {sorted(_COMPONENT_KEYS)}")
    kinds = [k for k in _KINDS if k in spec]
    if len(kinds) != 1:
        problems.add(path, f"has {kinds or 'none'} of {list(_KINDS)}; a component names exactly one")
    for key, table in (("tokenizer", "tokenizer"), ("hook", "component"), ("after", "after")):
        if key in spec and spec[key] not in hooks[table]:
            problems.add(f"{path}.{key}", _unknown(f"{table} hook", spec[key], hooks[table]))
    if "preset" in spec and spec["preset"] not in presets():
        problems.add(f"{path}.preset", _unknown("preset", spec["preset"], presets()))
    for key in ("config", "init"):
        if key in spec and not isinstance(spec[key], dict):
            problems.add(f"{path}.{key}", f"bad value {excerpt(spec[key])}; a mapping of keyword arguments")
    if "seed" in spec and (not isinstance(spec["seed"], int) or isinstance(spec["seed"], bool)):
        problems.add(f"{path}.seed", f"bad value {excerpt(spec['seed'])}; an integer added to the build's seed")


def _unknown(what: str, value: Any, allowed: Iterable[str]) -> str:
    return f"unknown {what} {excerpt(value)}; use one of {sorted(allowed)} (or register one in hooks.py)"


def known_sizes(row: Row) -> list[str]:
    """The size presets of ``row``: ``tiny`` and those under ``sizes``.

    >>> known_sizes(load_rows()["sdxl"]), known_sizes(load_rows()["flux"])
    (['tiny', 'mid'], ['tiny'])
    """
    return ["tiny", *row.data.get("sizes", {})]


def check_size(row: Row, size: Any) -> None:
    """Raise the one clear error for a ``size`` that ``row`` has no preset for, or that is no preset or dict.

    >>> check_size(load_rows()["flux"], "mid")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown size 'mid' for flux; use one of ['tiny'] or a dict of overrides; sized pipelines: ...
    """
    if isinstance(size, str):
        if size not in known_sizes(row):
            sized = "" if row.data.get("sizes") else "; sized pipelines: those tagged 'core'"
            raise ValueError(f"unknown size {size!r} for {row.name}; use one of {known_sizes(row)} or a dict of "
                             f"overrides{sized}")
    elif not isinstance(size, dict):
        raise TypeError(f"size must be a preset name or a dict of overrides, not {type(size).__name__}")


def resolve_call(row: Row, size: str) -> dict[str, Any]:
    """The call kwargs of ``row`` as data, with those of size preset ``size`` over them.

    >>> resolve_call(load_rows()["svd"], "mid")["image"]
    {'image': 64}
    """
    return {**row.data["call"], **row.data.get("call_sizes", {}).get(size, {})}
