"""What a valid recipe file is: the key tables and every file checker (devices.yaml's: :mod:`.devices_schema`).
Torch-free.

Pure functions of the parsed data, so the catalog, the override layers and the CLI's early checks (before torch)
share them; each adds every problem to a :class:`~hf_precision.errors.Problems`, one error naming them all.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .. import dtypes as dt
from ..errors import Problems, RecipeError, excerpt
from . import quantize

__all__ = ["SCHEMAS", "OUTPUTS", "POLICY_KEYS", "OVERRIDE_KEYS", "PIPELINE_KEYS", "COMPONENT_FILE_KEYS",
           "OVERRIDE_TOP_KEYS", "TYPES", "did_you_mean", "unknown_keys", "check_schema", "check_value", "check_policy",
           "check_file", "check_device_sections", "check_pipeline", "check_row", "check_video", "BOOL",
           "VIDEO_KEYS", "video_block"]

SCHEMAS = (1,)
OUTPUTS = ("input", "compute")
# Keys of a component policy, with the type each must have. `dtype` forces the compute dtype.
POLICY_KEYS: dict[str, str] = {
    "use": "str", "class": "list", "dtypes": "dtype-list", "dtype": "dtype", "storage": "storage", "quantize": "quantize",
    "output": "output", "keep_fp32": "str-list", "entry": "str-list", "nan_guard": "bool",
    "upcast_attention": "bool", "why": "str", "select": "select", "no_cast": "str-list", "layerwise_skip": "str-list",
}
OVERRIDE_KEYS = {"dtype", "storage", "output", "keep_fp32", "nan_guard", "upcast_attention", "why", "use", "dtypes", "entry",
                 "no_cast", "layerwise_skip", "quantize"}
# `training:` an override layer for training (hf_precision.training). `recognise:` component -> {config key: value}
# that tells a dict of components apart (hf_precision.recipe.recognise).
PIPELINE_KEYS = {"schema", "kind", "model", "pipelines", "latents_from", "denoiser", "components", "devices", "why",
                 "training", "recognise", "video", "requires", "call_needs", "sizes", "latent_shift"}
# `call_needs:` __call__ inputs the call cannot run without though its docstring calls them *optional* (the
# HunyuanImage refiner's image). `sizes:` the only {width, height} the call makes (Kandinsky 5 Image swaps any other),
# refused before loading (hf_precision.diagnose.call). `latent_shift: false`: latents scaled without the VAE's
# shift_factor (Kandinsky 5 Image; hf_precision.training.encode). `requires:` packages diffusers does not depend on
# (Cosmos' safety checker), {module, install, why, pipelines, unless}: hf_precision.recipe.requires.
REQUIRES_KEYS: dict[str, Any] = {
    "module": (lambda v: isinstance(v, str) and all(p.isidentifier() for p in v.split(".")),
               "the module to import, e.g. cosmos_guardrail"),
    "install": (lambda v: isinstance(v, str) and bool(v.strip()), "the command that installs it, e.g. "
                "'pip install cosmos_guardrail'"),
    "why": (lambda v: isinstance(v, str) and bool(v.strip()), "where the pipeline needs it, with the file and line"),
    "pipelines": (lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
                  "a list of the recipe's pipeline classes it holds for"),
    "unless": (lambda v: isinstance(v, dict) and bool(v) and all(
        isinstance(c, dict) and bool(c) and all(isinstance(x, (str, int, float, bool)) or x is None for x in c.values())
        for c in v.values()), "component -> {config key: plain value}, e.g. {transformer: {concat_padding_mask: false}}"),
}


COMPONENT_FILE_KEYS = {"schema", "kind", "components"}
OVERRIDE_TOP_KEYS = {"schema", "components", "devices"}
# Device types tensors can sit on (and devices.yaml's `type:` values).
TYPES = ("cpu", "cuda", "mps", "xpu")


def did_you_mean(word: object, options: Iterable[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest option, or ``""``: the tail of every unknown-name message.

    Example:
        >>> did_you_mean("vea", ["vae", "unet"]), did_you_mean("zzz", ["vae"])
        ("; did you mean 'vae'?", '')
    """
    if len(str(word)) > 100:  # no name is that long, and difflib's cost grows with it
        return ""
    near = difflib.get_close_matches(str(word), list(options), n=1, cutoff=0.6)
    return f"; did you mean {near[0]!r}?" if near else ""


def unknown_keys(data: Mapping[str, Any], allowed: Iterable[str], path: str, problems: Problems) -> None:
    """Add one problem per key of ``data`` not in ``allowed``, listing the allowed keys and the closest one.

    Example:
        >>> p = Problems("my.yaml")
        >>> unknown_keys({"dtpye": "float16"}, {"dtype", "output"}, "components.unet", p)
        >>> p.raise_if_any()
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: my.yaml: components.unet.dtpye: unknown key 'dtpye'; allowed: dtype, output; did you mean 'dtype'?
    """
    allowed = sorted(allowed)
    for key in data:
        if key not in allowed:
            problems.add(f"{path}{'.' if path else ''}{key}",
                         f"unknown key {excerpt(key)}; allowed: {', '.join(allowed)}{did_you_mean(key, allowed)}")


def check_file(data: Any, kind: str, top_keys: set[str], policy_keys: set[str], source: str,
                problems: Problems) -> dict[str, Any]:
    """The checks every recipe file gets: a mapping, schema, known top-level keys, its kind, its component policies."""
    if not isinstance(data, dict):
        raise RecipeError(f"{source}: expected a mapping with 'schema', 'kind: {kind}' and 'components'")
    check_schema(data, problems)
    unknown_keys(data, top_keys, "", problems)
    if data.get("kind") != kind:
        where = "recipes/components/" if kind == "components" else "recipes/"
        problems.add("kind", f"{excerpt(data.get('kind'))} is not {kind!r}; {kind} recipes live in {where}")
    comps = data.get("components")
    if not isinstance(comps, dict) or not comps:
        problems.add("components", "missing or empty; give at least one named component policy")
        comps = {}
    for name, policy in comps.items():
        check_policy(policy, f"components.{name}", problems, allowed=policy_keys)
    return comps


def check_schema(data: Mapping[str, Any], problems: Problems) -> None:
    schema = data.get("schema")
    if schema is None:
        problems.add("schema", "missing; add 'schema: 1' at the top")
    elif schema not in SCHEMAS:
        problems.add("schema", f"{excerpt(schema)} is not supported (this hf_precision reads schema {', '.join(map(str, SCHEMAS))}); "
                     "upgrade hf_precision or rewrite the file for schema 1")


def check_value(kind: str, value: Any, path: str, problems: Problems) -> Any:
    """Validate one policy value and return it normalised (canonical dtype names)."""
    def bad(allowed: str) -> None:
        problems.add(path, f"bad value {excerpt(value)} ({type(value).__name__}); allowed: {allowed}")

    if kind == "dtype":
        canon = dt.canonical(value) if isinstance(value, str) else None
        if canon is None:
            suggestion = did_you_mean(str(value), [a for n, al in dt.DTYPES.items() for a in (n, *al)])
            if str(value).lower() == "half":
                suggestion = " ('half' is ambiguous: write float16 or bfloat16)"
            problems.add(path, f"unknown dtype {excerpt(value)}; allowed: {dt.allowed_names()}{suggestion}")
        return canon
    if kind in ("storage", "quantize"):  # a dtype or a quantized layout: hf_precision/recipe/quantize.py
        check = quantize.check_storage_value if kind == "storage" else quantize.check_quantize_value
        return check(value, path, problems)
    if kind == "dtype-list":
        if not isinstance(value, list) or not value:
            bad("a non-empty list of dtype names, e.g. [float16, bfloat16, float32]")
            return None
        return [check_value("dtype", v, f"{path}[{i}]", problems) for i, v in enumerate(value)]
    if kind in ("str-list", "list"):
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            bad("a list of strings, e.g. [time_embedding, 'down_blocks.*.norm*']")
            return None
        return list(value)
    if kind == "str":
        if not isinstance(value, str):
            bad("a string")
        return value
    if kind == "bool":
        if not isinstance(value, bool):
            bad("true or false")
        return value
    if kind == "output":
        if isinstance(value, str) and value in OUTPUTS:
            return value
        canon = dt.canonical(value) if isinstance(value, str) else None
        if canon is None:
            bad(f"{' or '.join(OUTPUTS)} or a dtype name ({', '.join(dt.DTYPES)})")
        return canon
    if kind == "select":
        if not isinstance(value, list) or not all(isinstance(v, dict) and isinstance(v.get("config"), dict)
                                                  and isinstance(v.get("use"), str) for v in value):
            bad("a list of {config: {key: value}, use: file.entry, why: text}")
        return value
    raise AssertionError(kind)


def check_policy(policy: Any, path: str, problems: Problems, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(policy, dict):
        problems.add(path, f"expected a mapping of policy keys, got {excerpt(policy)}; e.g. {{dtype: float16}}")
        return {}
    unknown_keys(policy, allowed, path, problems)
    return {k: check_value(POLICY_KEYS[k], v, f"{path}.{k}", problems) for k, v in policy.items() if k in allowed}


# A recipe's `video:` block: what its pipelines share beyond their configs; devices.yaml's gives every key's default.
# Each key: (check, what is allowed) or the values allowed.
_WHOLE = lambda v: type(v) is int and v >= 0  # noqa: E731
_IDENT = lambda v: v is None or (isinstance(v, str) and v.isidentifier())  # noqa: E731
BOOL = (lambda v: isinstance(v, bool), "true or false")
VIDEO_SIZES = ("height", "width", "frames", "steps")
VIDEO_KEYS: dict[str, Any] = {
    "defaults": (lambda v: isinstance(v, dict), "a mapping of height, width, frames, steps to whole numbers "
                 "(frames 0: the denoiser config's frames_key), e.g. {height: 480, width: 832, frames: 81, steps: 50}"),
    "text_length": (lambda v: _WHOLE(v) and v > 0, "the prompt tokens the pipeline pads to, e.g. 226"),
    "text_prefix": (_WHOLE, "template tokens the pipeline crops, 0 or more, e.g. 95"),
    "text_hidden_states": BOOL,
    "cfg_batch": (lambda v: v in (1, 2) and type(v) is int, "1 (the pipeline calls the denoiser once per half, or "
                  "embeds guidance) or 2 (it concatenates the unconditional half)"),
    "image_encode": ("image", "frame", "clip", None), "decode": ("video", "frames"),
    "decode_chunk": (_WHOLE, "frames the pipeline decodes at once, 0 for all, e.g. 14"),
    "decode_chunks": BOOL, "forward_chunking": BOOL,
    "vae_tiling": ("optional", "always", "never"),
    "frames_key": (_IDENT, "a denoiser config key or null, e.g. num_frames"),
    "text_length_key": (_IDENT, "a denoiser config key or null, e.g. max_text_seq_length"),
    "call_options": (lambda v: isinstance(v, list) and all(map(_IDENT, v)) and None not in v,
                     "a list of the program's options passed to the pipeline call, e.g. [fps, motion_bucket_id]"),
    "size_multiple": (lambda v: _WHOLE(v) and v > 0, "a whole number above 0, e.g. 8"),
    "size_note": (lambda v: isinstance(v, str), "text saying why sizes are multiples of size_multiple"),
    "call_frames": (_WHOLE, "the one frame count the pipeline's call makes whatever it is asked, 0 for any, e.g. 5"),
    "call_frames_note": (lambda v: isinstance(v, str), "text saying where the call fixes its frame count"),
    "negative_prompt": (lambda v: v is None or isinstance(v, str), "the negative prompt the call gets when none is "
                        "given, or null for the pipeline's own default, e.g. ''"),
    "refused_latent_frames": (lambda v: isinstance(v, list) and all(_WHOLE(x) and x > 0 for x in v),
                              "a list of latent frame counts the call cannot make (it writes garbage for them), "
                              "e.g. [2, 3, 4]"),
    "refused_frames_note": (lambda v: isinstance(v, str), "text saying where the call fails for those counts"),
    "call_max_frames": (_WHOLE, "the most frames the pipeline's call makes as the commands call it, 0 for any, "
                        "e.g. 97"),
    "call_max_frames_note": (lambda v: isinstance(v, str), "text saying where the call refuses more frames"),
    "first_frame_edit": BOOL,
    "unfed_inputs": (lambda v: isinstance(v, str), "text naming the denoiser's inputs beyond the clips that the "
                     "train program needs data for and where to give them, or '' for none"),
    "default_call_args": (lambda v: isinstance(v, dict) and all(isinstance(k, str) and k.isidentifier() for k in v)
                          and not any(isinstance(x, (dict, list)) for x in v.values()),
                          "call keyword -> plain value check's default call passes, e.g. {overlap_history: 1}"),
}
# `classes:` in a video block: keys for one pipeline class only (Kandinsky 5 I2V's refused frame counts)
VIDEO_CLASS_KEY = "classes"


def video_block(block: Mapping[str, Any] | None, pipeline: str | None = None) -> dict[str, Any]:
    """A recipe's ``video:`` block as ``pipeline`` sees it: its ``classes:`` entry for that class over the rest.

    Example:
        >>> video_block({"cfg_batch": 1, "classes": {"B": {"cfg_batch": 2}}}, "B")
        {'cfg_batch': 2}
        >>> video_block({"cfg_batch": 1, "classes": {"B": {"cfg_batch": 2}}}, "A")
        {'cfg_batch': 1}
    """
    block = dict(block or {})
    per_class = block.pop(VIDEO_CLASS_KEY, None) or {}
    return {**block, **(per_class.get(pipeline) or {})}


def check_video(block: Any, problems: Problems, complete: bool = False, pipelines: Sequence[str] = ()) -> None:
    """The problems of a ``video:`` block (``complete``: devices.yaml's, which gives every key and every default;
    ``pipelines``: the recipe's classes, which its ``classes:`` entries must name).

    Example:
        >>> p = Problems("my.yaml")
        >>> check_video({"cfg_batch": 3, "decode": "frame"}, p)
        >>> print("\\n".join(p.items))
        my.yaml: video.cfg_batch: bad value 3; allowed: 1 (the pipeline calls the denoiser once per half, or embeds guidance) or 2 (it concatenates the unconditional half)
        my.yaml: video.decode: bad value 'frame'; allowed: video, frames; did you mean 'frames'?
    """
    if not check_row(block, {**VIDEO_KEYS, VIDEO_CLASS_KEY: (lambda v: True, "")}, (), "video", problems):
        return
    classes = block.get(VIDEO_CLASS_KEY, {})
    if not isinstance(classes, dict):
        problems.add(f"video.{VIDEO_CLASS_KEY}", f"expected pipeline class -> video keys, got {excerpt(classes)}; "
                     "e.g. {Kandinsky5I2VPipeline: {refused_latent_frames: [2, 3, 4]}}")
        classes = {}
    for name, keys in classes.items():
        where = f"video.{VIDEO_CLASS_KEY}.{name}"
        if name not in pipelines:
            problems.add(where, f"unknown class {excerpt(name)}; this recipe names {', '.join(pipelines) or 'none'}"
                         f"{did_you_mean(name, pipelines)}")
        check_row(keys, {k: v for k, v in VIDEO_KEYS.items() if k != "defaults"}, (), where, problems)
    sizes = block.get("defaults") if isinstance(block.get("defaults"), dict) else {}
    check_row(sizes, dict.fromkeys(VIDEO_SIZES, (_WHOLE, "a whole number, 0 or more, e.g. 480")), (), "video.defaults",
              problems)
    missing = [k for k in VIDEO_KEYS if k not in block] + [f"defaults.{k}" for k in VIDEO_SIZES if k not in sizes]
    if sizes.get("frames") == 0 and not block.get("frames_key") and not complete:
        problems.add("video.defaults.frames", "0 takes the count from the denoiser config's frames_key, which this "
                     "block does not name; give a count (e.g. frames: 49) or name the key (e.g. frames_key: "
                     "num_frames)")
    if complete and missing:
        problems.add("video", f"missing {', '.join(missing)}: this block gives every video key its default")


def check_row(row: Any, keys: Mapping[str, Any], required: Sequence[str], path: str, problems: Problems) -> bool:
    """Add the problems of one data row: not a mapping, an unknown or missing key, a value its key's entry in
    ``keys`` refuses (``(check, what is allowed)`` or the values allowed). True when it is a mapping.

    Example:
        >>> p = Problems("my.yaml")
        >>> check_row({"layout": "vidoe", "steps": 0}, {"layout": ("image", "video"),
        ...           "steps": (lambda v: v > 0, "a whole number above 0")}, ["layout"], "video", p)
        True
        >>> p.items
        ["my.yaml: video.layout: bad value 'vidoe'; allowed: image, video; did you mean 'video'?", 'my.yaml: video.steps: bad value 0; allowed: a whole number above 0']
    """
    if not isinstance(row, dict):
        problems.add(path, f"expected a mapping with {', '.join(required or keys)}, got {excerpt(row)}")
        return False
    unknown_keys(row, set(keys), path, problems)
    for key in required:
        if key not in row:
            problems.add(f"{path}.{key}", f"missing; every row names it ({keys[key][1]})")
    for key, value in row.items():
        kind = keys.get(key, (lambda v: True, ""))
        if not callable(kind[0]) and (value not in kind or isinstance(value, bool)):
            problems.add(f"{path}.{key}", f"bad value {excerpt(value)}; allowed: "
                         f"{', '.join('null' if k is None else k for k in kind)}{did_you_mean(value, map(str, kind))}")
        elif callable(kind[0]) and not kind[0](value):
            problems.add(f"{path}.{key}", f"bad value {excerpt(value)}; allowed: {kind[1]}")
    return True


def check_device_sections(devices: Any, components: set[str] | None, tags: Sequence[str], problems: Problems) -> dict[str, dict[str, dict[str, Any]]]:
    if devices is None:
        return {}
    if not isinstance(devices, dict):
        problems.add("devices", f"expected a mapping of device tag -> components, got {excerpt(devices)}")
        return {}
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for tag, comps in devices.items():
        if tag not in tags:
            problems.add(f"devices.{tag}", f"unknown device tag {excerpt(tag)}; allowed: {', '.join(tags)}{did_you_mean(tag, tags)}")
            continue
        if not isinstance(comps, dict):
            problems.add(f"devices.{tag}", f"expected component -> policy, got {excerpt(comps)}")
            continue
        out[tag] = {}
        for comp, policy in comps.items():
            if components is not None and comp not in components:
                problems.add(f"devices.{tag}.{comp}", f"unknown component {excerpt(comp)}; this recipe has {', '.join(sorted(components))}"
                             f"{did_you_mean(comp, components)}")
                continue
            out[tag][comp] = check_policy(policy, f"devices.{tag}.{comp}", problems, allowed=OVERRIDE_KEYS)
    return out


def check_pipeline(data: Any, source: str, tags: Sequence[str]) -> tuple[str, dict[str, Any]]:
    problems = Problems(source)
    comps = check_file(data, "pipeline", PIPELINE_KEYS, set(POLICY_KEYS) - {"select"}, source, problems)
    check_device_sections(data.get("devices"), set(comps), tags, problems)
    for key in ("latents_from", "denoiser"):
        if data.get(key) is not None and data[key] not in comps:
            problems.add(key, f"{excerpt(data[key])} is not one of its components {sorted(comps)}")
    _check_recognise(data.get("recognise"), set(comps), problems)
    _check_requires(data.get("requires"), data.get("pipelines"), problems)
    needs = data.get("call_needs")
    if needs is not None and not (isinstance(needs, list) and needs and all(isinstance(n, str) and n.isidentifier()
                                                                             for n in needs)):
        problems.add("call_needs", f"expected a list of __call__ argument names, got {excerpt(needs)}; e.g. [image]")
    _check_sizes(data.get("sizes"), problems)
    if data.get("latent_shift") not in (None, True, False):
        problems.add("latent_shift", f"bad value {excerpt(data['latent_shift'])}; allowed: true or false (false: the "
                     "pipeline scales latents without the VAE's shift_factor)")
    if "video" in data:
        listed = data.get("pipelines")
        check_video(data["video"], problems, pipelines=[str(c) for c in listed] if isinstance(listed, list) else [])
    problems.raise_if_any()
    return source, data


def _check_requires(requires: Any, pipelines: Any, problems: Problems) -> None:
    if requires is None:
        return
    if not isinstance(requires, list):
        problems.add("requires", f"expected a list of {{module, install, why}}, got {excerpt(requires)}; e.g. "
                     "[{module: cosmos_guardrail, install: pip install cosmos_guardrail, why: ...}]")
        return
    listed = [str(c) for c in pipelines] if isinstance(pipelines, list) else []
    for i, entry in enumerate(requires):
        if check_row(entry, REQUIRES_KEYS, ("module", "install", "why"), f"requires[{i}]", problems):
            for name in entry.get("pipelines") or []:
                if name not in listed:
                    problems.add(f"requires[{i}].pipelines", f"unknown class {excerpt(name)}; this recipe names "
                                 f"{', '.join(listed) or 'none'}{did_you_mean(name, listed)}")


def _plain(value: Any) -> bool:
    return isinstance(value, (str, int, float, bool)) or value is None


def _check_sizes(sizes: Any, problems: Problems) -> None:
    """Add the problem of a ``sizes:`` entry: not a non-empty list of ``{width, height}`` whole numbers above 0.

    Example:
        >>> p = Problems("my.yaml")
        >>> _check_sizes([{"height": 0, "width": 1024}], p)
        >>> print(p.items[0])
        my.yaml: sizes: expected a list of {width, height} the call makes (whole numbers above 0), got [{'height': 0, 'width': 1024}]; e.g. [{width: 1024, height: 1024}, {width: 1408, height: 640}]
    """
    if sizes is None:
        return
    if not (isinstance(sizes, list) and sizes and all(
            isinstance(s, dict) and set(s) == {"width", "height"} and all(_WHOLE(v) and v > 0 for v in s.values())
            for s in sizes)):
        problems.add("sizes", f"expected a list of {{width, height}} the call makes (whole numbers above 0), got "
                     f"{excerpt(sizes)}; e.g. [{{width: 1024, height: 1024}}, {{width: 1408, height: 640}}]")


def _check_recognise(recognise: Any, components: set[str], problems: Problems) -> None:
    if recognise is None:
        return
    example = "e.g. {unet: {addition_embed_type: text_time}}"
    if not isinstance(recognise, dict) or not recognise:
        problems.add("recognise", f"expected component -> {{config key: value}}, got {excerpt(recognise)}; {example}")
        return
    for comp, values in recognise.items():
        if comp not in components:
            problems.add(f"recognise.{comp}", f"unknown component {excerpt(comp)}; this recipe has "
                         f"{', '.join(sorted(components))}{did_you_mean(str(comp), components)}")
        elif not isinstance(values, dict) or not values or not all(
                _plain(v) or isinstance(v, list) and all(_plain(x) for x in v) for v in values.values()):
            problems.add(f"recognise.{comp}", f"expected {{config key: value}} with plain values (text, numbers, "
                         f"true/false, null, or a list of them), got {excerpt(values)}; {example}")
