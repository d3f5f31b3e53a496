"""What a denoiser class is called with, as recipe data: ``recipes/denoisers.yaml`` read and checked. Torch-free.

One row per model class (fields: the file's header); its extra input builders are code registered by name in the
training layer, passed in, so an unknown name is refused here. The ``latents:`` rows give each VAE class's
compression as formulas of its config (:func:`latent_factor`).
"""

from __future__ import annotations

import ast
import functools
import operator
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import Problems, RecipeError, excerpt
from .files import read_yaml, recipes_dir
from .schema import BOOL, check_row, check_schema, did_you_mean, unknown_keys

__all__ = ["LATENT_KEYS", "ROW_KEYS", "check_denoisers", "latent_factor", "read_denoisers", "read_latents"]

_NAME = re.compile(r"[A-Za-z_]\w*\Z")
_ITEM = re.compile(r"[A-Za-z_]\w*(\[\d+\])?\Z")
_ZEROS = re.compile(r"latents(@[A-Za-z_]\w*)?\Z|token@[A-Za-z_]\w*\Z")
_name = lambda v: isinstance(v, str) and bool(_NAME.match(v))  # noqa: E731
_names = lambda v, null=False: isinstance(v, list) and all((null and x is None) or _name(x) for x in v)  # noqa: E731
_map = lambda v, ok=_name: isinstance(v, dict) and all(_name(k) and ok(x) for k, x in v.items())  # noqa: E731
_number = lambda v: type(v) in (int, float) and v > 0  # noqa: E731
_NAMES = (_names, "a list of names, e.g. [encoder_hidden_states]")
_RETURNS = (lambda v: _names(v, True), "a list of names or null, e.g. [prompt_embeds, null, pooled_prompt_embeds]")
_MAP = (_map, "a mapping of names, e.g. {prompt_embeds: encoder_hidden_states}")
_NUMBER = (_number, "a positive number, e.g. 1000.0")
# key -> (check, what is allowed) or the values allowed; `latent_arg` and `source` are required
ROW_KEYS: dict[str, Any] = {
    "latent_arg": (_name, "a Python identifier, e.g. hidden_states"),
    "source": (lambda v: isinstance(v, str) and bool(v.strip()), "text naming the diffusers pipeline file"),
    "cond": _MAP, "encode": _RETURNS, "per_frame": _NAMES, "extras": _NAMES, "text_layers": _MAP,
    "text_dims": (lambda v: _map(v, lambda x: isinstance(x, str) and bool(_ITEM.match(x))),
                  "a mapping name -> config key or key[i], e.g. {prompt_embeds: caption_channels[1]}"),
    "batch_axis": (lambda v: _map(v, lambda x: type(x) is int and x > 0), "a mapping name -> axis, e.g. {prompt_embeds: 1}"),
    "text_len": (lambda v: _map(v, lambda x: _name(x) or (type(x) is int and x > 0)),
                 "a mapping name -> config key or token count, e.g. {prompt_embeds: max_text_seq_length}"),
    "layout": ("image", "video", "frames_first", "channels_last"), "pack": ("flux", "ltx", "list", "patch", None),
    "timestep_arg": (_name, "a Python identifier, e.g. timestep_ratio"),
    "timestep_scale": _NUMBER, "guidance_scale": _NUMBER,
    "discrete_scale": (lambda v: v is None or _number(v), "a positive number or null"), "flip": BOOL,
    "timestep_in_weights_dtype": BOOL, "reference": BOOL, "negate": BOOL, "clean_first_frame": BOOL,
    "prefix_frame": (_name, "the batch key of the clean prefix latents, e.g. image_latents"),
    "condition": (_map, "a mapping pipeline class -> registered condition builder, e.g. "
                        "{StableDiffusionInpaintPipeline: inpaint_mask}"),
    # how the pipeline's method takes the image: the PIL image a user gives __call__ (Wan, SVD), or the tensor in
    # [-1, 1] __call__ preprocesses it to (FramePack: video_processor.preprocess, then encode_image)
    "image_encode": (lambda v: _map(v, lambda x: isinstance(x, list) and len(x) == 2 and _name(x[0])
                                    and x[1] in ("pil", "pixels")),
                     "a mapping pipeline class -> [its image-encoding method, pil | pixels], e.g. "
                     "{WanImageToVideoPipeline: [encode_image, pil]}"),
    "train_config": (lambda v: _map(v, lambda x: type(x) in (bool, int, float, str)),
                     "a mapping config key -> value, e.g. {force_inference_output: true}"),
    "optional": (lambda v: _map(v, lambda x: isinstance(x, list) and len(x) == 2 and _name(x[0])
                                and isinstance(x[1], str) and bool(_ZEROS.match(x[1]))),
                 "a mapping argument -> [batch key, latents | latents@<config key> | token@<config key>]"),
    "encode_more": (lambda v: isinstance(v, list) and all(isinstance(x, dict) and set(x) == {"options", "returns"}
                                                          and isinstance(x["options"], dict)
                                                          and _names(x["returns"], True) for x in v),
                    "a list of {options: {keyword: value}, returns: [names or null]}"),
}

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Pow: operator.pow}
_NODES = (ast.BinOp, ast.BoolOp, ast.Or, ast.Name, ast.Load, ast.Call, ast.Constant, *_OPS)


def _formula(text: Any) -> ast.expr | None:
    """The parsed formula of ints, config keys, ``len``, ``sum``, ``+ - * **`` and ``or``; None when it is not one."""
    try:
        tree = ast.parse(str(text), mode="eval").body if type(text) in (int, str) and len(str(text)) < 200 else None
    except SyntaxError:
        return None
    nodes = list(ast.walk(tree)) if tree is not None else [None]
    calls = [n for n in nodes if isinstance(n, ast.Call)]
    ok = all(isinstance(n, _NODES) and (not isinstance(n, ast.Constant) or type(n.value) is int) for n in nodes) and \
        all(isinstance(c.func, ast.Name) and c.func.id in ("len", "sum") and len(c.args) == 1 and not c.keywords
            and isinstance(c.args[0], ast.Name) for c in calls)
    return tree if ok else None


def latent_factor(formula: int | str, config: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> int:
    """A ``latents:`` formula's value for a VAE config: a key missing there takes its ``defaults`` value, else null
    (``or`` then picks the next term); ``sum(key)`` counts true entries. A RecipeError where the values do not fit.

    Example:
        >>> latent_factor("patch_size * 2 ** sum(scaling)", {"scaling": [True, True, True, False]}, {"patch_size": 4})
        32
        >>> latent_factor("spatial_compression_ratio or 2 ** (len(blocks) - 1)", {"blocks": [1, 2]})
        2
    """
    defaults = defaults or {}

    def value(node: Any) -> Any:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return defaults.get(node.id) if config.get(node.id) is None else config[node.id]
        if isinstance(node, ast.Call):
            seq = value(node.args[0])
            return len(seq) if node.func.id == "len" else sum(bool(x) for x in seq)
        if isinstance(node, ast.BoolOp):
            return next((v for v in map(value, node.values) if v), value(node.values[-1]))
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.Pow) and not (isinstance(right, int) and 0 <= right <= 64):
            raise TypeError(f"exponent {right!r}")
        return _OPS[type(node.op)](left, right)

    tree = _formula(formula)
    try:
        if tree is None:
            raise TypeError("not a formula")
        return int(value(tree))
    except (TypeError, ValueError) as err:
        raise RecipeError(f"latents formula {formula!r} does not fit the VAE config ({err}); give the key it reads "
                          f"a value in the row's defaults, or fix the formula") from None


_FORMULA = (lambda v: (type(v) is int and v > 0) or (isinstance(v, str) and _formula(v) is not None),
            "a whole number above 0 or a formula of the VAE config's keys with + - * **, len(key), "
            "sum(key) (its true entries) and or, e.g. 2 ** (len(block_out_channels) - 1)")
# A `latents:` row: a VAE class's compression as the diffusers pipelines compute it from its config
LATENT_KEYS: dict[str, Any] = {
    "spatial": _FORMULA, "temporal": _FORMULA,
    "defaults": (lambda v: isinstance(v, dict) and all(_name(k) for k in v),
                 "a mapping config key -> the value a config without it has, e.g. {patch_size: 4}"),
    "source": ROW_KEYS["source"],
}


def _latent_rows(rows: Any, problems: Problems) -> dict[str, dict[str, Any]]:
    if rows is None:
        return {}
    if not isinstance(rows, dict):
        problems.add("latents", f"expected VAE class -> row, got {excerpt(rows)}; e.g. {{MyAutoencoder: {{spatial: 8, "
                     f"temporal: 4, source: pipeline_my.py}}}}")
        return {}
    for cls, row in rows.items():
        check_row(row, LATENT_KEYS, ("spatial", "temporal", "source"), f"latents.{cls}", problems)
    return {str(cls): row for cls, row in rows.items()}


def _row(cls: str, row: Any, builders: list[str], problems: Problems) -> dict[str, Any]:
    path = f"denoisers.{cls}"
    if not check_row(row, ROW_KEYS, ("latent_arg", "source"), path, problems):
        return {}
    for i, name in enumerate(row.get("extras") if _names(row.get("extras")) else ()):
        if name not in builders:
            problems.add(f"{path}.extras[{i}]", f"no registered builder {excerpt(name)}; allowed: "
                         f"{', '.join(builders)}{did_you_mean(name, builders)} (a new one: "
                         f"@hf_precision.training.inputs.builder({name!r}))")
    return {key: _plain(key, value) for key, value in row.items() if key in ROW_KEYS}


def _plain(key: str, value: Any) -> Any:
    """The row's value as the training row holds it: tuples for lists (frozen rows), pairs for the encode calls."""
    if key == "encode_more":
        return tuple((dict(v["options"]), tuple(v["returns"])) for v in value)
    if key == "optional":
        return {k: tuple(v) for k, v in value.items()}
    return tuple(value) if isinstance(value, list) else value


def check_denoisers(data: Any, source: str, builders: Iterable[str], latents: bool = True) -> dict[str, dict[str, Any]]:
    """Model class -> its row, every problem in one RecipeError; ``latents``: ``latents:`` rows allowed (shipped).

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
    unknown_keys(data, {"schema", "kind", "denoisers", *(["latents"] if latents else [])}, "", problems)
    _latent_rows(data.get("latents"), problems)
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


@functools.lru_cache(maxsize=1)
def _shipped() -> Any:
    """The parsed shipped ``recipes/denoisers.yaml``: its training rows and its latents rows come from one read."""
    return read_yaml(recipes_dir() / "denoisers.yaml")


def read_denoisers(builders: Iterable[str], path: str | Path | None = None) -> dict[str, dict[str, Any]]:
    """The checked rows of a denoisers file: the shipped ``recipes/denoisers.yaml``, or a user's file at ``path``.

    Example:
        >>> try:
        ...     read_denoisers(["flux_ids", "guidance"])
        ... except RecipeError as err:
        ...     print(err.problems[0].split(";")[0])
        recipes/denoisers.yaml: denoisers.UNet2DConditionModel.extras[0]: no registered builder 'sdxl_time_ids'
    """
    if path is None:
        return check_denoisers(_shipped(), "recipes/denoisers.yaml", builders)
    return check_denoisers(read_yaml(path), str(path), builders, latents=False)


def read_latents() -> dict[str, dict[str, Any]]:
    """VAE class -> its ``latents:`` row of the shipped ``recipes/denoisers.yaml`` (``other``: any class without one).

    Example:
        >>> read_latents()["AutoencoderKLMochi"]["temporal"]
        6
    """
    problems = Problems("recipes/denoisers.yaml")
    data = _shipped()
    rows = _latent_rows(data.get("latents") if isinstance(data, dict) else None, problems)
    if "other" not in rows:
        problems.add("latents.other", "missing; it gives the compression of a VAE class without a row")
    problems.raise_if_any()
    return rows
