"""The catalog: which recipes ship, what each file says (validated), and the recipe for a pipeline class, shipped
or composed (:func:`recipe_for`). Torch-free.

When no shipped recipe's ``pipelines:`` lists a class (a new pipeline, a ControlNet variant), its recipe is composed:
each model component whose class a component recipe lists gets it (``use:``); the denoiser is the component of role
``denoiser`` (the runtime tells roles from the diffusers module of each class: ``transformers``/``unets`` denoise,
``autoencoders`` encode and decode, ``controlnets`` condition); any other model class keeps a dtype its device
computes, with boundary hooks, and is named in one warning with the override line that pins it.
"""

from __future__ import annotations

import difflib
import functools
import warnings
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..errors import Problems, RecipeError, excerpt, override_line, spelled

FORCE_SDXL = "recipe='sdxl', force=True"  # the example of forcing a recipe onto a class none lists
from .devices import rule_ids
from .files import read_yaml, recipes_dir
from .model import Recipe
from .overrides import Override, override_layer
from .schema import COMPONENT_FILE_KEYS, POLICY_KEYS, check_file, check_pipeline, did_you_mean, video_block

__all__ = ["component_entries", "component_entry", "pipeline_file", "pipeline_spec", "list_recipes", "recipe_classes", "shipped_value",
           "shipped_video", "shipped_sizes",
           "recipe_for_class", "recipes_for_denoiser", "entry_classes", "check_recipe_class", "recipe_components", "recipe_for", "compose_spec",
           "component_spec", "component_recipe_for", "component_recipes_listing", "suggest_recipe", "unknown_recipe", "training_overrides", "ROLES"]

Models = Mapping[str, tuple[str, str]]

# --------------------------------------------------------------------------------------------- the files


def _rel(path: Path) -> str:
    try:
        return str(path.relative_to(recipes_dir().parent))
    except ValueError:
        return str(path)


@functools.lru_cache(maxsize=None)
def _component_file(stem: str) -> tuple[str, dict[str, Any]]:
    path = recipes_dir() / "components" / f"{stem}.yaml"
    if not path.is_file():
        raise KeyError(stem)
    data = read_yaml(path)
    source = _rel(path)
    problems = Problems(source)
    comps = check_file(data, "components", COMPONENT_FILE_KEYS, set(POLICY_KEYS), source, problems)
    problems.raise_if_any()
    return source, comps


def component_entries(stem: str) -> dict[str, Any]:
    """The validated entries of one component recipe file (``recipes/components/<stem>.yaml``).

    Example:
        >>> sorted(component_entries("clip"))
        ['text', 'vision']
    """
    return _component_file(stem)[1]


def pipeline_file(name: str) -> tuple[str, dict[str, Any]]:
    """(source, validated data) of a pipeline recipe: a shipped name or a path to a user's YAML file."""
    if name.endswith((".yaml", ".yml")):
        return _read_pipeline(Path(name), name)  # a user's file is re-read every time: it may have changed
    return _shipped_pipeline(name)


def pipeline_spec(name: str) -> dict[str, Any]:
    """The validated data of a pipeline recipe: a shipped name (``"sdxl"``) or a path to a user's YAML file.

    Example:
        >>> "StableDiffusionXLPipeline" in pipeline_spec("sdxl")["pipelines"]
        True
    """
    return pipeline_file(name)[1]


@functools.lru_cache(maxsize=None)
def _shipped_pipeline(name: str) -> tuple[str, dict[str, Any]]:
    path = recipes_dir() / f"{name}.yaml"
    return _read_pipeline(path, _rel(path))


def _read_pipeline(path: Path, source: str) -> tuple[str, dict[str, Any]]:
    source, data = check_pipeline(read_yaml(path), source, rule_ids())
    training = data.get("training")
    if training is not None:
        if not isinstance(training, Mapping):
            raise RecipeError(f"{source}: training: expected an override mapping like 'components: {{vae: {{dtypes: "
                              f"[bfloat16, float32]}}}}', got {excerpt(training)}")
        override_layer(Override(f"{source} training", training), set(data["components"]), 0)  # raises on a bad key
    return source, data


def training_overrides(name: str) -> Any:
    """A pipeline recipe's ``training:`` section as an override layer under the user's (``None``: none).

    Example:
        >>> training_overrides("sd15").data["components"]["vae"]["dtypes"]
        ['bfloat16', 'float32']
    """
    training = pipeline_spec(name).get("training")
    return None if training is None else Override(f"recipes/{name}.yaml training", training)


def list_recipes(kind: str = "all") -> list[str]:
    """Names of the shipped recipes: pipeline recipes (``sdxl``) and component recipes (``vae.sdxl``).

    Example:
        >>> [n for n in list_recipes("pipeline") if n in ("sdxl", "svd")]
        ['sdxl', 'svd']
    """
    root = recipes_dir()
    pipelines = sorted(p.stem for p in root.glob("*.yaml") if p.stem not in ("devices", "denoisers"))
    components = sorted(f"{p.stem}.{c}" for p in (root / "components").glob("*.yaml") for c in _component_file(p.stem)[1])
    return {"pipeline": pipelines, "component": components}.get(kind, pipelines + components)


def suggest_recipe(name: str) -> str | None:
    """The pipeline recipe a mistyped name most likely means: case-insensitive, by Hub id or its last part, by
    closeness, then by a name the model's Hub id starts with (``stable-diffusion-xl``); ``None`` if nothing is close.

    Example:
        >>> [suggest_recipe(n) for n in ("SDXL", "sdxll", "stabilityai/stable-diffusion-xl-base-1.0", "stable-diffusion-xl")]
        ['sdxl', 'sdxl', 'sdxl', 'sdxl']
        >>> suggest_recipe("qqqqqq") is None
        True
    """
    low = str(name).strip().lower()
    if not low or len(low) > 200:
        return None
    pipelines = list_recipes("pipeline")
    models = {p: str(_shipped_pipeline(p)[1].get("model") or "").lower() for p in pipelines}
    exact = [p for p in pipelines if low in (p.lower(), models[p], models[p].rsplit("/", 1)[-1])]
    if exact:
        return exact[0]
    near = difflib.get_close_matches(low, pipelines, n=1, cutoff=0.6)
    if near:
        return near[0]
    stem = low.rsplit("/", 1)[-1]
    starts = sorted((p for p in pipelines if models[p] and models[p].rsplit("/", 1)[-1].startswith(stem)),
                    key=lambda p: len(models[p]))
    return starts[0] if starts and len(stem) >= 4 else None


def unknown_recipe(name: str) -> RecipeError:
    """The error for a recipe name that is no recipe: the suggestion first, then the pipeline recipes."""
    near = suggest_recipe(name)
    lead = f"did you mean {near!r}? (hf-precision show {near}); " if near else ""
    return RecipeError(f"recipe {excerpt(name)}: unknown; {lead}pipeline recipes: {', '.join(list_recipes('pipeline'))} "
                       f"(component recipes such as vae.sdxl: `hf-precision recipes`)")


def component_entry(ref: str, source: str, path: str) -> tuple[str, dict[str, Any]]:
    """(where, policy) of a component recipe entry ``stem.entry``; ``source``/``path`` name who asked, for the error.

    Example:
        >>> component_entry("vae.sdxl", "my.yaml", "components.vae")[0]
        'recipes/components/vae.yaml:sdxl'
    """
    stem, _, entry = ref.partition(".")
    try:
        file_source, comps = _component_file(stem)
    except KeyError:
        files = sorted(p.stem for p in (recipes_dir() / "components").glob("*.yaml"))
        raise RecipeError(f"{source}: {path}.use: no component recipe file {excerpt(stem)}; allowed: {', '.join(files)}"
                          f"{did_you_mean(stem, files)}") from None
    if entry not in comps:
        raise RecipeError(f"{source}: {path}.use: {file_source} has no entry {excerpt(entry)}; allowed: "
                          f"{', '.join(f'{stem}.{c}' for c in comps)}{did_you_mean(ref, [f'{stem}.{c}' for c in comps])}")
    return f"{file_source}:{entry}", comps[entry]


# ------------------------------------------------------------------------------------ recipes for classes


def recipe_classes() -> dict[str, str]:
    """Pipeline class -> the first shipped pipeline recipe (in name order) whose ``pipelines`` list names it.

    Example:
        >>> recipe_classes()["StableDiffusionXLImg2ImgPipeline"]
        'sdxl'
    """
    covered: dict[str, str] = {}
    for name in list_recipes("pipeline"):
        for cls in pipeline_spec(name).get("pipelines") or ():
            covered.setdefault(str(cls), name)
    return covered


def shipped_value(pipeline_class: Any, key: str) -> tuple[str | None, Any]:
    """(the shipped recipe listing ``pipeline_class`` (a class or its name), its ``key`` such as ``call_needs:`` or
    ``sizes:``), or (None, None): pipeline facts read by class before loading.

    Example:
        >>> shipped_value("HunyuanImageRefinerPipeline", "call_needs"), shipped_value("NoSuchPipeline", "sizes")
        (('hunyuan_image_refiner', ['image']), (None, None))
    """
    name = pipeline_class if isinstance(pipeline_class, str) else getattr(pipeline_class, "__name__", "")
    recipe = recipe_classes().get(name)
    return (recipe, pipeline_spec(recipe).get(key)) if recipe else (None, None)


def shipped_video(pipeline_class: Any) -> dict[str, Any]:
    """The ``video:`` block of the shipped recipe listing ``pipeline_class``, as that class sees it; ``{}``: none.

    Example:
        >>> shipped_video("ChronoEditPipeline")["first_frame_edit"], shipped_video("WanPipeline").get("first_frame_edit")
        (True, None)
    """
    block = shipped_value(pipeline_class, "video")[1]
    return video_block(block, getattr(pipeline_class, "__name__", pipeline_class)) if block else {}


def shipped_sizes(pipeline_class: Any) -> tuple[str | None, list[tuple[int, int]]]:
    """(the shipped recipe listing ``pipeline_class``, its ``sizes:`` as (height, width); ``[]``: any size).

    Example:
        >>> shipped_sizes("Kandinsky5T2IPipeline")[1][:2], shipped_sizes("FluxPipeline")
        ([(1024, 1024), (1408, 640)], ('flux', []))
    """
    recipe, listed = shipped_value(pipeline_class, "sizes")
    return recipe, [(int(s["height"]), int(s["width"])) for s in listed or ()]


def recipe_for_class(class_name: str) -> str:
    """The shipped pipeline recipe whose ``pipelines`` list names this diffusers pipeline class.

    Example:
        >>> recipe_for_class("StableDiffusionXLImg2ImgPipeline")
        'sdxl'
    """
    covered = recipe_classes()
    if class_name in covered:
        return covered[class_name]
    # Every family's class list would make a page-long line: name the close classes and the recipes only.
    near = difflib.get_close_matches(class_name, list(covered), n=3, cutoff=0.8)
    hint = (f"did you mean {', '.join(f'{c!r} (recipe {covered[c]})' for c in near)}? " if near else "")
    raise RecipeError(f"no recipe for pipeline class {class_name!r}; {hint}pipeline recipes: "
                      f"{', '.join(list_recipes('pipeline'))} "
                      f"(`hf-precision recipes` lists the classes each covers). To use one anyway, name it and force it: "
                      f"{spelled(FORCE_SDXL, '--recipe sdxl --force')}; or write your own recipe YAML that lists the class under pipelines:")


def entry_classes(spec: Mapping[str, Any], seen: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The model classes a recipe's component entry lists, following its ``use:`` chain; ``()``: any class.

    Example:
        >>> entry_classes({"use": "unet.sdxl"}), entry_classes({"dtype": "float32"})
        (('UNet2DConditionModel',), ())
    """
    if spec.get("class"):
        return tuple(str(c) for c in spec["class"])
    ref = spec.get("use")
    if not ref or ref in seen:
        return ()
    return entry_classes(component_entry(str(ref), "recipes", "use")[1], (*seen, str(ref)))


@functools.lru_cache(maxsize=None)
def _denoiser_index() -> dict[tuple[str, str], tuple[str, ...]]:
    """(denoiser component, model class) -> every shipped pipeline recipe that plans it, in name order."""
    index: dict[tuple[str, str], tuple[str, ...]] = {}
    for name in list_recipes("pipeline"):
        spec = pipeline_spec(name)
        denoiser = spec.get("denoiser")
        if denoiser and denoiser in spec["components"]:
            for cls in entry_classes(spec["components"][denoiser]):
                index[(str(denoiser), cls)] = (*index.get((str(denoiser), cls), ()), name)
    return index


def recipes_for_denoiser(component: str, class_name: str) -> list[str]:
    """The shipped pipeline recipes whose denoiser is ``component`` of model class ``class_name`` (name order), read
    from the class lists without resolving; ``recognise:`` tells apart those sharing a class (:mod:`.recognise`).

    Example:
        >>> recipes_for_denoiser("transformer", "FluxTransformer2DModel"), recipes_for_denoiser("unet", "NoSuchModel")
        (['flux'], [])
        >>> recipes_for_denoiser("unet", "UNet2DConditionModel")
        ['sd15', 'sd_upscale', 'sdxl']
    """
    return list(_denoiser_index().get((component, class_name), ()))


def check_recipe_class(recipe: str, listed: Iterable[str], pipeline_class: str | None, force: bool = False) -> None:
    """Refuse a pipeline recipe for a pipeline class it does not list (its islands and entry points may not fit);
    component recipes (``listed`` empty) fit any pipeline; ``force=True`` opts in.

    Example:
        >>> check_recipe_class("sdxl", ["StableDiffusionXLPipeline"], "StableVideoDiffusionPipeline")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: recipe 'sdxl' is for StableDiffusionXLPipeline, not \
StableVideoDiffusionPipeline: its components, float32 islands and entry points may not fit. The recipe that lists \
StableVideoDiffusionPipeline: svd: pass recipe='svd' (CLI: --recipe svd), or leave the recipe out to have it \
chosen; to apply 'sdxl' anyway: force=True (CLI: --force)
    """
    listed = tuple(listed)
    if force or not pipeline_class or not listed or pipeline_class in listed:
        return
    others = [n for n in list_recipes("pipeline") if pipeline_class in (pipeline_spec(n).get("pipelines") or ())]
    if others:
        fix = (f"The recipe{'s' if len(others) > 1 else ''} that list{'' if len(others) > 1 else 's'} {pipeline_class}: "
               f"{', '.join(others)}: pass {spelled(f'recipe={others[0]!r}', f'--recipe {others[0]}')}, or leave the recipe out to "
               f"have it chosen")
    else:
        fix = (f"No shipped recipe lists {pipeline_class}: leave the recipe out and one is composed from the "
               f"pipeline's components")
    raise RecipeError(f"recipe {excerpt(recipe)} is for {', '.join(listed)}, not {pipeline_class}: its components, "
                      f"float32 islands and entry points may not fit. {fix}; to apply {excerpt(recipe)} anyway: "
                      f"{spelled('force=True', '--force')}")


def recipe_components(recipe: str | Recipe) -> list[str]:
    """The component names a recipe plans, without resolving it (a resolved Recipe, a pipeline or component recipe).

    Example:
        >>> recipe_components("svd"), recipe_components("vae.sdxl")
        (['image_encoder', 'unet', 'vae'], ['vae'])
    """
    if isinstance(recipe, Recipe):
        return [p.name for p in recipe.policies]
    if isinstance(recipe, Mapping):
        return list(recipe["components"])
    name = str(recipe)
    if name in list_recipes("pipeline") or name.endswith((".yaml", ".yml")):
        return list(pipeline_spec(name)["components"])
    return [name.split(".", 1)[0]]


def recipe_for(pipeline_class: str, models: Models | Callable[[], Models] | None = None) -> str | dict[str, Any]:
    """The recipe for a pipeline class: the name of the shipped one that lists it, else the data composed
    (:func:`compose_spec`) from ``models`` (component -> (model class, role), or a function returning them, called
    only then). With ``models=None`` a class no recipe lists raises a RecipeError naming close classes and recipes.

    Example:
        >>> recipe_for("StableDiffusionXLPipeline")
        'sdxl'
        >>> recipe_for("MyPipeline", {"transformer": ("FluxTransformer2DModel", "denoiser")})["components"]
        {'transformer': {'use': 'mmdit.flux'}}
    """
    shipped = recipe_classes().get(pipeline_class)
    if shipped is not None:
        return shipped
    if models is None:
        return recipe_for_class(pipeline_class)  # raises, naming the close classes
    return compose_spec(pipeline_class, models() if callable(models) else models)


# --------------------------------------------------------------------------------------------- composing


# What a model component does in a pipeline, from the diffusers/transformers module that defines its class.
ROLES = ("denoiser", "vae", "controlnet", "encoder", "other")
# Unknown model classes: the first the device picks unasked, with the NaN guard (where they overflow is unknown).
UNKNOWN_DTYPES = ["bfloat16", "float16", "float32"]


def component_recipes_listing(class_name: str) -> list[str]:
    """Every component recipe entry (``stem.entry``) whose ``class:`` list names this model class, in file order.

    Example:
        >>> component_recipes_listing("UNet2DConditionModel"), component_recipes_listing("NoSuchModel")
        (['unet.sd15', 'unet.sdxl'], [])
    """
    return [f"{path.stem}.{entry}" for path in sorted((recipes_dir() / "components").glob("*.yaml"))
            for entry, policy in component_entries(path.stem).items() if class_name in (policy.get("class") or ())]


def component_recipe_for(class_name: str) -> str | None:
    """The component recipe (``"clip.text"``) whose ``class:`` list names this model class, or ``None``.

    Example:
        >>> component_recipe_for("CLIPTextModelWithProjection"), component_recipe_for("NoSuchModel")
        ('clip.text', None)
    """
    return next(iter(component_recipes_listing(class_name)), None)


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
    """A pipeline recipe's data (the schema of ``recipes/*.yaml``) for ``pipeline_class``, from ``models``:
    component -> (model class, role in :data:`ROLES`), ``nn.Module`` components only (tokenizers have no dtype).

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
