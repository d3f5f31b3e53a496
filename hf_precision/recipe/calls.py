"""What a denoiser class is called with, as recipe data: ``recipes/denoisers.yaml`` read and checked. Torch-free.

One row per model class (the fields are described at the top of the file). A row names its extra input builders
(SDXL's time ids, Flux's position ids, ...), code registered by name in the training layer; the names allowed are
passed in, so a row naming no registered builder is refused here, with the file, the key and the names allowed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ..errors import Problems, RecipeError, excerpt
from .files import read_yaml, recipes_dir
from .schema import check_schema, did_you_mean, unknown_keys

__all__ = ["ROW_KEYS", "check_denoisers", "read_denoisers"]

# key -> kind of value; `latent_arg` and `source` are required, the rest have the defaults of the training row
ROW_KEYS = {
    "latent_arg": "name", "source": "text", "cond": "name-map", "encode": "returns", "text_dims": "name-map",
    "text_len": "length-map", "layout": ("image", "video", "frames_first"), "pack": ("flux", "ltx", None),
    "timestep_arg": "name", "timestep_scale": "number", "flip": "bool", "discrete_scale": "number-or-null",
    "timestep_in_weights_dtype": "bool", "guidance_scale": "number", "optional": "optional", "per_frame": "names",
    "extras": "builders", "encode_more": "encode-more",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
_ZEROS = re.compile(r"latents(@[A-Za-z_]\w*)?\Z|token@[A-Za-z_]\w*\Z")
_EXAMPLES = {
    "name": "a Python identifier, e.g. hidden_states", "text": "a non-empty string naming the diffusers pipeline file",
    "name-map": "a mapping of names, e.g. {prompt_embeds: encoder_hidden_states}",
    "returns": "a list of names or null, e.g. [prompt_embeds, null, pooled_prompt_embeds, null]",
    "length-map": "a mapping name -> config key or token count, e.g. {prompt_embeds: max_text_seq_length}",
    "number": "a number, e.g. 1000.0", "bool": "true or false", "number-or-null": "a number or null",
    "optional": "a mapping argument -> [batch key, latents | latents@<config key> | token@<config key>]",
    "names": "a list of names, e.g. [encoder_hidden_states]",
    "encode-more": "a list of {options: {keyword: value}, returns: [names or null]}",
}


def _valid(kind: str, value: Any) -> bool:
    names = lambda v: isinstance(v, list) and all(isinstance(x, str) and _NAME.match(x) for x in v)  # noqa: E731
    if kind == "name":
        return isinstance(value, str) and bool(_NAME.match(value))
    if kind == "text":
        return isinstance(value, str) and bool(value.strip())
    if kind in ("name-map", "length-map"):
        ok = lambda v: _valid("name", v) or (kind == "length-map" and type(v) is int and v > 0)  # noqa: E731
        return isinstance(value, dict) and all(_valid("name", k) and ok(v) for k, v in value.items())
    if kind == "returns":
        return isinstance(value, list) and all(x is None or _valid("name", x) for x in value)
    if kind in ("number", "number-or-null"):
        return (value is None and kind == "number-or-null") or (type(value) in (int, float) and value > 0)
    if kind == "bool":
        return isinstance(value, bool)
    if kind == "optional":
        return isinstance(value, dict) and all(
            _valid("name", k) and isinstance(v, list) and len(v) == 2 and _valid("name", v[0])
            and isinstance(v[1], str) and bool(_ZEROS.match(v[1])) for k, v in value.items())
    if kind in ("names", "builders"):
        return names(value)
    if kind == "encode-more":
        return isinstance(value, list) and all(
            isinstance(v, dict) and set(v) == {"options", "returns"} and isinstance(v["options"], dict)
            and _valid("returns", v["returns"]) for v in value)
    raise AssertionError(kind)


def _row(cls: str, row: Any, builders: list[str], problems: Problems) -> dict[str, Any]:
    path = f"denoisers.{cls}"
    if not isinstance(row, dict):
        problems.add(path, f"expected a mapping with latent_arg and source, got {excerpt(row)}")
        return {}
    unknown_keys(row, set(ROW_KEYS), path, problems)
    for key in ("latent_arg", "source"):
        if key not in row:
            problems.add(f"{path}.{key}", f"missing; every row names it ({_EXAMPLES[str(ROW_KEYS[key])]})")
    out: dict[str, Any] = {}
    for key, value in row.items():
        kind = ROW_KEYS.get(key)
        if kind is None:
            continue
        if isinstance(kind, tuple):
            if value not in kind:
                problems.add(f"{path}.{key}", f"bad value {excerpt(value)}; allowed: "
                             f"{', '.join('null' if k is None else k for k in kind)}{did_you_mean(value, map(str, kind))}")
        elif not _valid(kind, value):
            problems.add(f"{path}.{key}", f"bad value {excerpt(value)}; allowed: {_EXAMPLES.get(kind, _EXAMPLES['names'])}")
            continue
        elif kind == "builders":
            for i, name in enumerate(value):
                if name not in builders:
                    problems.add(f"{path}.{key}[{i}]", f"no registered builder {excerpt(name)}; allowed: "
                                 f"{', '.join(builders)}{did_you_mean(name, builders)} (a new one: "
                                 f"@hf_precision.training.inputs.builder({name!r}))")
        out[key] = _plain(key, value)
    return out


def _plain(key: str, value: Any) -> Any:
    """The row's value as the training row holds it: tuples for lists (frozen rows), pairs for the encode calls."""
    if key == "encode_more":
        return tuple((dict(v["options"]), tuple(v["returns"])) for v in value)
    if key == "optional":
        return {k: tuple(v) for k, v in value.items()}
    return tuple(value) if isinstance(value, list) else value


def check_denoisers(data: Any, source: str, builders: Iterable[str]) -> dict[str, dict[str, Any]]:
    """Model class -> its row (tuples for lists), every problem of the file in one :class:`RecipeError`.

    Example:
        >>> check_denoisers({"schema": 1, "kind": "denoisers", "denoisers": {"MyDiT": {"latent_arg": "hidden_states",
        ...     "extras": ["guidanse"], "source": "pipeline_my.py"}}}, "my.yaml", ["guidance"])
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: my.yaml: denoisers.MyDiT.extras[0]: no registered builder 'guidanse'; allowed: guidance; did you mean 'guidance'? (a new one: @hf_precision.training.inputs.builder('guidanse'))
    """
    problems = Problems(source)
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping with 'schema: 1', 'kind: denoisers' and 'denoisers'")
    check_schema(data, problems)
    unknown_keys(data, {"schema", "kind", "denoisers"}, "", problems)
    if data.get("kind") != "denoisers":
        problems.add("kind", f"{excerpt(data.get('kind'))} is not 'denoisers'; write 'kind: denoisers'")
    rows = data.get("denoisers")
    if not isinstance(rows, dict) or not rows:
        problems.add("denoisers", f"expected model class -> row, got {excerpt(rows)}; e.g. {{MyTransformer: "
                     f"{{latent_arg: hidden_states, source: pipeline_my.py}}}}")
        rows = {}
    names = sorted(builders)
    out = {str(cls): _row(str(cls), row, names, problems) for cls, row in rows.items()}
    problems.raise_if_any()
    return out


def read_denoisers(builders: Iterable[str], path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The checked rows of a denoisers file: the shipped ``recipes/denoisers.yaml``, or a user's file at ``path``.

    Example:
        >>> try:
        ...     read_denoisers(["flux_ids", "guidance"])
        ... except RecipeError as err:
        ...     print(err.problems[0].split(";")[0])
        recipes/denoisers.yaml: denoisers.UNet2DConditionModel.extras[0]: no registered builder 'sdxl_time_ids'
    """
    where = recipes_dir() / "denoisers.yaml" if path is None else Path(path)
    source = "recipes/denoisers.yaml" if path is None else str(path)
    return check_denoisers(read_yaml(where), source, builders)
