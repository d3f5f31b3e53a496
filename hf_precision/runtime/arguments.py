"""What ``load_pipeline`` is given, checked before any weight is read: keywords, ``pipeline_class=``, ``dtype=``,
``quantize=`` and ``overrides=``, each a ``RecipeError`` naming the keyword, the value and what is allowed."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from .. import dtypes as dt
from ..errors import RecipeError, excerpt
from ..recipe.overrides import Override

__all__ = ["as_class", "concrete_class", "check_keywords", "from_pretrained_keywords", "index_class", "override_layers"]


def _dtype_name(value: Any, keyword: str) -> str:
    """The canonical name of a ``dtype=`` value (a torch dtype or a name), or a RecipeError naming the keyword."""
    name = dt.canonical(value) if isinstance(value, str) else None
    if name is None and not isinstance(value, str):
        try:
            name = dt.canonical(dt.from_torch(value))
        except Exception:  # not a torch dtype at all (an int, a class ...)
            name = None
    if name is None:
        raise RecipeError(f"load_pipeline: {keyword}={excerpt(value)}: not a floating dtype hf_precision can plan; "
                          f"allowed: {dt.allowed_names()} (e.g. dtype=torch.float16, or per component "
                          f"dtype={{'unet': torch.float16, 'default': torch.float32}})")
    return name


def user_dtype_layer(kwargs: dict[str, Any], components: list[str]) -> Override | None:
    # A dtype passed the diffusers way is taken as an override (lowest priority among overrides): a single dtype
    # forces every component, a dict forces the components it names. Islands, entry casts and the NaN guard stay.
    if "dtype" in kwargs and "torch_dtype" in kwargs:
        raise RecipeError("load_pipeline: pass dtype or torch_dtype, not both (dtype is the current name)")
    keyword = "dtype" if "dtype" in kwargs else "torch_dtype"
    value = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    if value is None:
        return None
    source = f"load_pipeline {keyword}="
    if isinstance(value, Mapping):
        default = value.get("default")
        layer: dict[str, Any] = {c: {"dtype": _dtype_name(v, f"{keyword}[{c!r}]")} for c, v in value.items() if c != "default"}
        if default is not None:
            name = _dtype_name(default, f"{keyword}['default']")
            for c in components:
                layer.setdefault(c, {"dtype": name})
        return Override(source, {"components": layer})
    name = _dtype_name(value, keyword)
    return Override(source, {"components": {c: {"dtype": name} for c in components}})


# load_pipeline's own keywords: a misspelling of one of them is suggested too.
OWN_KEYWORDS = ("device", "recipe", "overrides", "layout", "pipeline_class", "force", "quantize", "base")


def from_pretrained_keywords(*classes: Any) -> set[str] | None:
    """The keywords ``from_pretrained`` of these pipeline classes takes, read from diffusers itself (``None`` when its
    source cannot be read): ``DiffusionPipeline.from_pretrained``'s documented and popped arguments plus each
    pipeline's ``__init__`` arguments. diffusers only logs anything else and ignores it.

    Example:
        >>> from diffusers import StableDiffusionXLPipeline
        >>> {"variant", "use_safetensors", "vae", "add_watermarker"} <= from_pretrained_keywords(StableDiffusionXLPipeline)
        True
    """
    import inspect

    from diffusers import DiffusionPipeline

    from .patches import upstream_source

    method = DiffusionPipeline.from_pretrained
    source = upstream_source(method)
    if source is None:
        return None
    names = set(re.findall(r"kwargs\.pop\(\s*[\"'](\w+)[\"']", source))
    names |= set(re.findall(r"^\s+(\w+) \(`", method.__doc__ or "", re.M))
    for cls in classes:
        try:
            params = inspect.signature(cls.__init__).parameters.values()
        except (TypeError, ValueError):
            continue
        names |= {p.name for p in params if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)}
    return names - {"pretrained_model_name_or_path"}


def check_keywords(kwargs: Mapping[str, Any], classes: list[Any]) -> None:
    import difflib

    allowed = from_pretrained_keywords(*classes)
    if allowed is None:
        return
    unknown = [k for k in kwargs if k not in allowed and k not in ("dtype", "torch_dtype")]
    if not unknown:
        return
    options = sorted((allowed | set(OWN_KEYWORDS)) - {"trust_remote_code", "custom_pipeline", "custom_revision"})
    hints = []
    for key in unknown:
        near = difflib.get_close_matches(key, options, n=1, cutoff=0.6) if len(key) < 100 else []
        hints.append(f"{excerpt(key)}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    names = ", ".join(getattr(c, "__name__", str(c)) for c in classes)
    raise RecipeError(f"load_pipeline: unknown keyword{'s' if len(unknown) > 1 else ''} {', '.join(hints)}: neither "
                      f"load_pipeline nor {names}.from_pretrained takes it (diffusers would ignore it). Allowed: "
                      f"{', '.join(options)}")


def index_class(where: str, index: Mapping[str, Any]) -> Any:
    """The diffusers class ``model_index.json`` names, or a RecipeError with the close names and how to go on."""
    from .source import pipeline_class as find_class

    name = str(index.get("_class_name"))
    try:
        return find_class(name)
    except RecipeError as err:
        near = re.findall(r"'(\w+)'", str(err).partition("did you mean")[2])
        fix = (f"pass the class it was saved from, e.g. pipeline_class=diffusers.{near[0]}, or fix _class_name in "
               f"model_index.json" if near else
               "hf_precision never runs custom pipeline code: pass pipeline_class= a diffusers class with the same "
               "components, or fix _class_name in model_index.json")
        raise RecipeError(f"{where}: model_index.json: _class_name {err}; {fix}") from None


def as_class(value: Any) -> Any:
    """``pipeline_class=`` as a class: a diffusers pipeline or AutoPipeline class, or its name."""
    import diffusers

    from .source import pipeline_class as find_class

    if value is None or (isinstance(value, type) and hasattr(value, "from_pretrained")):
        return value
    if isinstance(value, str):
        cls = getattr(diffusers, value, None)
        if isinstance(cls, type) and value.startswith("AutoPipeline") and hasattr(cls, "from_pretrained"):
            return cls
        try:
            return find_class(value)  # a pipeline class, or a RecipeError with the close names
        except RecipeError as err:
            raise RecipeError(f"load_pipeline: pipeline_class={err}") from None
    raise RecipeError(f"load_pipeline: pipeline_class={excerpt(value)}: expected a diffusers pipeline class such as "
                      f"diffusers.StableDiffusionXLImg2ImgPipeline, or its name")


def quantize_layer(quantize: Any, components: list[str]) -> dict[str, Any] | None:
    """``quantize={"transformer": "int8"}`` as an override layer (the same as ``--set transformer.storage=int8``)."""
    if quantize is None:
        return None
    if not isinstance(quantize, Mapping):
        raise RecipeError(f"load_pipeline: quantize={excerpt(quantize)}: expected component -> storage, e.g. "
                          f"quantize={{'transformer': 'int8', 'text_encoder_2': 'nf4'}}; components: {', '.join(components)}")
    return Override("load_pipeline quantize=", {"components": {c: {"storage": v} for c, v in quantize.items()}})


def override_layers(kwargs: dict[str, Any], components: list[str], overrides: Any, quantize: Any) -> list[Any]:
    # Lowest priority first: a diffusers-style dtype=, then the caller's overrides, then quantize=.
    layers = [x for x in [user_dtype_layer(kwargs, components)] if x]
    if overrides is not None:
        layers += list(overrides) if isinstance(overrides, (list, tuple)) else [overrides]
    asked = quantize_layer(quantize, components)
    if asked:
        layers.append(asked)
    return layers


# AutoPipeline class -> (its diffusers mapping, the word its task puts in a class name). diffusers' from_pretrained
# reads _class_name, rewrites it for the task (auto_pipeline.py) and builds the mapped class; the same is done here
# before loading, so the recipe is chosen for the class that is built, not for the AutoPipeline.
_AUTO_TASKS = {"AutoPipelineForText2Image": ("AUTO_TEXT2IMAGE_PIPELINES_MAPPING", None),
               "AutoPipelineForImage2Image": ("AUTO_IMAGE2IMAGE_PIPELINES_MAPPING", "Img2Img"),
               "AutoPipelineForInpainting": ("AUTO_INPAINT_PIPELINES_MAPPING", "Inpaint"),
               "AutoPipelineForText2Audio": ("AUTO_TEXT2AUDIO_PIPELINES_MAPPING", "")}


def _task_class_name(name: str, marker: str | None, kwargs: Mapping[str, Any]) -> str:
    """``_class_name`` rewritten as the AutoPipeline's ``from_pretrained`` does for its task, a ControlNet and PAG."""
    if marker == "":  # text-to-audio: the class as saved
        return name
    if marker and marker in name:
        to_replace = f"{marker}Pipeline"
    else:
        to_replace = "ControlPipeline" if "ControlPipeline" in name else "Pipeline"
    tail = "Pipeline" if marker is None else to_replace
    if kwargs.get("controlnet") is not None:
        union = type(kwargs["controlnet"]).__name__ == "ControlNetUnionModel"
        name = name.replace(to_replace, ("ControlNetUnion" if union else "ControlNet") + tail)
    if kwargs.get("enable_pag"):
        name = name.replace(to_replace, "PAG" + tail)
    if marker and to_replace == "ControlPipeline":
        name = name.replace(to_replace, f"Control{marker}Pipeline")
    return name


def concrete_class(cls: Any, where: str, index: Mapping[str, Any], kwargs: dict[str, Any]) -> Any:
    """The class an AutoPipeline ``cls`` builds from this folder (any other class as is), before a weight is read.

    ``enable_pag`` is taken out of ``kwargs`` (the concrete class's ``from_pretrained`` does not take it). A folder
    whose family has no pipeline for the task is a RecipeError naming the class and what to pass instead.

    Example:
        >>> from diffusers import AutoPipelineForImage2Image
        >>> concrete_class(AutoPipelineForImage2Image, "./x", {"_class_name": "StableDiffusionXLPipeline"}, {}).__name__
        'StableDiffusionXLImg2ImgPipeline'
    """
    name = getattr(cls, "__name__", "")
    if name not in _AUTO_TASKS:
        return cls
    from diffusers.pipelines import auto_pipeline

    mapping_name, marker = _AUTO_TASKS[name]
    saved = str(index.get("_class_name"))
    wanted = _task_class_name(saved, marker, kwargs)
    kwargs.pop("enable_pag", None)
    found = auto_pipeline._get_task_class(getattr(auto_pipeline, mapping_name), wanted, throw_error_if_not_exist=False)
    if found is None:
        task = mapping_name.removeprefix("AUTO_").removesuffix("_PIPELINES_MAPPING").lower()
        raise RecipeError(f"{where}: pipeline_class={name}: diffusers has no {task} pipeline for {saved} "
                          f"(model_index.json's _class_name{'; asked for ' + wanted if wanted != saved else ''}). "
                          f"Pass the concrete class to build as pipeline_class=, or leave it out to build {saved}")
    return found
