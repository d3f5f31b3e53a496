"""Where a pipeline lives (a folder, a Hub id, a recipe alias, the configs that ship) and what it is made of.

:func:`locate` finds it and its ``model_index.json``; :func:`component_configs` and :func:`configs_of` (plans, from
the shipped configs offline) its components' configs; the rest its model components, their classes and roles, from
a built pipeline, an index or the class's ``__init__`` signature (what
:func:`hf_precision.recipe.catalog.recipe_for` composes from). A role comes from where diffusers keeps the class,
never from a list of component names.
"""

from __future__ import annotations

import difflib
import importlib
import os
import re
import inspect
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import RecipeError, excerpt, spelled
from ..recipe.files import damaged_file, download_command, read_json
from ..recipe.catalog import list_recipes, pipeline_spec, recipe_classes, suggest_recipe

# The real configs (no weights) that ship for offline plans: hf_precision/model_configs/<hub basename>/.
CONFIGS_DIR = Path(__file__).resolve().parents[1] / "model_configs"

__all__ = ["locate", "check_name", "component_configs", "configs_of", "shipped_configs", "offline_error", "CONFIGS_DIR",
           "role_of", "models_of_pipeline", "models_of_index", "models_of_class", "pipeline_class", "listed_components",
           "component_class"]

def listed_components(index: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Component -> (library, class) of what ``model_index.json`` lists as present: its ``[library, class]`` pairs.
    Keys with a leading underscore are metadata; ``[null, null]`` is an optional component left out.

    Example:
        >>> listed_components({"_class_name": "X", "unet": ["diffusers", "UNet2DConditionModel"], "vae": [None, None]})
        {'unet': ('diffusers', 'UNet2DConditionModel')}
    """
    return {name: (str(spec[0]), str(spec[1])) for name, spec in index.items()
            if not name.startswith("_") and isinstance(spec, (list, tuple)) and len(spec) == 2 and spec[0] and spec[1]}


def _offline_set() -> bool:
    # huggingface_hub reads the variable once, at import: it may have been set since
    from huggingface_hub import constants

    return constants.HF_HUB_OFFLINE or os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def offline_error(name: str, err: BaseException) -> RecipeError:
    why = "HF_HUB_OFFLINE is set" if _offline_set() else "the Hugging Face Hub could not be reached"
    local = f"./{name.split('/')[-1]}"
    return RecipeError(
        f"{name!r}: not a local folder, and {why} ({type(err).__name__}). Download it where there is network "
        f"(`{download_command(name, local)}`) and pass the folder: "
        f"{spelled(f'hf_precision.load_pipeline({local!r})', f'{local} in place of {name}')}")


# How long the Hub's host may take to accept a connection before it counts as unreachable: huggingface_hub itself
# retries a failed request five times over ~25 s before it gives up.
HUB_CONNECT_TIMEOUT_S = 3.0


def _hub_offline() -> BaseException | None:
    """Why the Hub cannot be asked now (HF_HUB_OFFLINE, or its host not answering within HUB_CONNECT_TIMEOUT_S), or
    None. Behind a proxy the proxy decides: huggingface_hub's own request then says."""
    import socket
    import threading
    from urllib.parse import urlparse

    from huggingface_hub import constants

    if _offline_set():
        return ConnectionError("HF_HUB_OFFLINE is set")
    if any(os.environ.get(k) for k in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")):
        return None
    url = urlparse(constants.ENDPOINT)
    address = (url.hostname or "huggingface.co", url.port or (443 if url.scheme == "https" else 80))
    outcome: list[BaseException | None] = []

    def connect() -> None:  # in a thread: the name lookup itself has no timeout
        try:
            socket.create_connection(address, timeout=HUB_CONNECT_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as err:
            outcome.append(err)

    worker = threading.Thread(target=connect, daemon=True)
    worker.start()
    worker.join(HUB_CONNECT_TIMEOUT_S)
    if not outcome:
        return ConnectionError(f"{address[0]}:{address[1]} did not answer within {HUB_CONNECT_TIMEOUT_S:g} s")
    return outcome[0]


def cached_snapshot(repo: str) -> Path | None:
    """The local cache's copy of a Hub pipeline (the folder with its model_index.json), or None."""
    try:
        from huggingface_hub import snapshot_download

        folder = Path(snapshot_download(repo, local_files_only=True))
    except Exception:  # not cached (huggingface_hub raises its own types)
        return None
    return folder if (folder / "model_index.json").is_file() else None


def locate(name_or_path: str | os.PathLike[str]) -> tuple[str, dict[str, Any], Path | None]:
    """Where a pipeline lives: (id or path, its model_index.json, local folder or None).

    Recipe aliases (``"sdxl"``) map to their recipe's Hub id. Where the Hub cannot be asked (offline, or no answer
    within seconds) a cached copy serves as a local folder, else the one-line error comes at once, not after retries.
    """
    text = str(name_or_path)
    folder = Path(text).expanduser()
    if folder.is_dir():
        index = folder / "model_index.json"
        if not index.is_file():
            raise RecipeError(f"{folder}: no model_index.json; point at a diffusers pipeline folder (the one that holds "
                              f"model_index.json and unet/ or transformer/, vae/ ...)")
        return str(folder), read_json(index), folder
    if text in list_recipes("pipeline"):
        model = pipeline_spec(text).get("model")
        if not model:
            raise RecipeError(f"recipe {text!r} names no model; pass a folder or Hub id")
        text = model
    check_name(text)
    import warnings

    from diffusers import DiffusionPipeline

    offline = _hub_offline()
    if offline is not None:  # huggingface_hub would retry for ~25 s: the cached copy, else our message at once
        cached = cached_snapshot(text)
        if cached is not None:
            return str(cached), read_json(cached / "model_index.json"), cached
        raise offline_error(text, offline)
    try:
        with warnings.catch_warnings():  # diffusers passes the Hub a deprecated argument for the user (not theirs)
            warnings.filterwarnings("ignore", message=r"The `local_dir_use_symlinks` argument is deprecated")
            index = DiffusionPipeline.load_config(text)
    except Exception as err:  # offline, unknown repo, no connection: all mean "use a local folder"
        # ... except a cached model_index.json that is damaged (diffusers/configuration_utils.py load_config)
        damaged = re.search(r"config file at '(.+)' is not a valid JSON file", str(err))
        if damaged:
            raise damaged_file(Path(damaged[1]), "not valid JSON", repo=text) from None
        raise offline_error(text, err) from None
    return text, dict(index), None


def check_name(text: str) -> None:
    """Refuse, before any Hub lookup, a name that is neither an existing folder, a recipe alias nor a Hub id.

    A Hub id is ``org/name`` (letters, digits, ``-_.``); ``42``, ``sdxxl`` or ``./missing`` are a typo or a missing
    folder, never something to look up online.

    Example:
        >>> check_name("stabilityai/sdxl-turbo")
        >>> check_name("sdxxl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: 'sdxxl': did you mean 'sdxl'? (no such folder, and not a recipe alias or a Hub \
id (org/name)). Pass an existing diffusers folder, a Hub id such as stabilityai/stable-diffusion-xl-base-1.0, or a \
recipe alias (allegro, ...)
    """

    aliases = list_recipes("pipeline")
    if text in aliases:
        return
    looks_like_path = text.startswith((".", "/", "~")) or os.sep in text and text.count("/") != 1
    if not looks_like_path and re.fullmatch(r"[A-Za-z0-9][\w.-]{0,95}/[A-Za-z0-9][\w.-]{0,95}", text) \
            and ".." not in text and not text.endswith((".", "-")):
        return
    near = [n] if (n := suggest_recipe(text)) else []
    folder = Path(text).expanduser()
    what = "no such folder" + ("" if looks_like_path else ", and not a recipe alias or a Hub id (org/name)")
    if looks_like_path and folder.exists():
        what = "not a folder"
    example = pipeline_spec("sdxl").get("model") if "sdxl" in aliases else "org/name"
    # The suggestion leads: it is the likely fix, and the list of every alias after it is long.
    head = f"did you mean {near[0]!r}? ({what})" if near else what
    raise RecipeError(f"{excerpt(text)}: {head}. Pass an existing diffusers folder, a "
                      f"Hub id such as {example}, or a recipe alias ({', '.join(aliases)})")


def component_configs(where: str, index: Mapping[str, Any], folder: Path | None) -> dict[str, dict[str, Any]]:
    """Each component's ``config.json`` (what recipes ``select:`` on, e.g. the fp16-fix VAE's ``force_upcast``).

    Example:
        >>> import tempfile
        >>> from hf_precision.testing.pipelines import make_sdxl, save_pipeline
        >>> where, index, folder = locate(save_pipeline(make_sdxl(), tempfile.mkdtemp()))
        >>> component_configs(where, index, folder)["vae"]["force_upcast"]
        True
    """
    configs = {}
    for comp in listed_components(index):
        path = folder / comp / "config.json" if folder is not None else None
        if path is not None and path.is_file():
            configs[comp] = read_json(path)
        elif folder is None:
            try:
                from huggingface_hub import hf_hub_download

                cached = Path(hf_hub_download(where, f"{comp}/config.json"))
            except Exception:  # not in the cache, offline: the recipe's select: rules see no config
                continue
            configs[comp] = read_json(cached, repo=where)
    return configs


def shipped_configs() -> dict[str, Path]:
    """The real pipeline configs shipped with hf_precision: folder name and recipe alias -> folder.

    Example:
        >>> shipped_configs()["sdxl"].name
        'stable-diffusion-xl-base-1.0'
    """
    folders = {d.name: d for d in sorted(CONFIGS_DIR.iterdir()) if (d / "model_index.json").is_file()}
    out = dict(folders)
    for alias in list_recipes("pipeline"):
        model = str(pipeline_spec(alias).get("model") or "")
        base = model.rstrip("/").split("/")[-1]
        if base in folders:
            out[alias] = folders[base]
    return out


def configs_of(name: str) -> tuple[str, dict[str, Any], dict[str, dict[str, Any]]]:
    """(source, model_index.json, component -> config.json) for a folder, an alias, or a Hub id.

    Aliases (``"sdxl"``) and Hub ids whose configs ship with hf_precision are read offline from
    ``hf_precision/model_configs``; a Hub id is otherwise fetched (JSON files only, no weights).
    """
    text = str(name)
    folder = Path(text).expanduser()
    if not folder.is_dir():
        shipped = shipped_configs()
        base = text.rstrip("/").split("/")[-1]
        if text in shipped:
            folder = shipped[text]
        elif text.count("/") == 1 and base in shipped and not text.startswith((".", "/", "~")):
            folder = shipped[base]  # a Hub id whose configs ship with hf_precision: no download
        else:
            check_name(text)
    if folder.is_dir():
        index_file = folder / "model_index.json"
        if not index_file.is_file():
            raise RecipeError(f"{folder}: no model_index.json; point at a diffusers pipeline folder (model_index.json "
                              f"and one folder per component with its config.json; weights are not needed)")
        index = read_json(index_file)
        configs = component_configs(str(folder), index, folder)
        try:
            source = str(folder.relative_to(CONFIGS_DIR.parent.parent))
        except ValueError:
            source = str(folder)
        return source, index, configs
    where, index, local = locate(text)  # a Hub id: only the small JSON files are fetched
    return where, dict(index), component_configs(where, index, local)


# diffusers sorts its model classes by what they do (diffusers/models/<kind>/...); transformers models encode.
_ROLE_BY_MODULE = (
    ("diffusers.models.transformers", "denoiser"), ("diffusers.models.unets", "denoiser"),
    ("diffusers.models.autoencoders", "vae"), ("diffusers.models.controlnets", "controlnet"),
    ("diffusers.models.adapter", "controlnet"), ("transformers.", "encoder"),
)


def role_of(cls: type) -> str:
    """``denoiser``, ``vae``, ``controlnet``, ``encoder`` or ``other``, from the module that defines ``cls``.

    Example:
        >>> from diffusers import AutoencoderKL, UNet2DConditionModel
        >>> role_of(UNet2DConditionModel), role_of(AutoencoderKL)
        ('denoiser', 'vae')
    """
    module = getattr(cls, "__module__", "") or ""
    role = next((role for prefix, role in _ROLE_BY_MODULE if module.startswith(prefix)), "other")
    if role == "other" and _takes_timestep(cls):
        role = "denoiser"  # a pipeline's own model (AudioLDM2's UNet, UniDiffuser): it denoises if it takes a timestep
    return role


def _takes_timestep(cls: type) -> bool:
    try:
        params = inspect.signature(cls.forward).parameters
    except (TypeError, ValueError, AttributeError):
        return False
    return bool({"timestep", "timesteps"} & set(params))


def _is_model(cls: Any) -> bool:
    import torch

    return isinstance(cls, type) and issubclass(cls, torch.nn.Module)


def models_of_pipeline(pipe: Any) -> dict[str, tuple[str, str]]:
    """Component -> (class name, role) of a built pipeline's ``nn.Module`` components."""
    import torch

    comps = getattr(pipe, "components", {}) or {}
    return {n: (type(m).__name__, role_of(type(m))) for n, m in comps.items() if isinstance(m, torch.nn.Module)}


def component_class(library: str, name: str, pipeline: str | None = None) -> type | None:
    """The class a ``model_index.json`` entry ``[library, name]`` names, or None: from the library, a diffusers pipeline
    folder of that name (deprecated ones too), else the class of that name the pipeline's own module imports. The last
    two are where diffusers' lookup misses: 0.42 moved Wuerstchen to ``pipelines/deprecated/``, so the Stable Cascade
    decoder's ``PaellaVQModel`` is found neither as the Hub's ``["wuerstchen", ...]`` nor as its saved
    ``["diffusers", ...]``.

    Example:
        >>> component_class("diffusers", "PaellaVQModel", "StableCascadeDecoderPipeline").__name__
        'PaellaVQModel'
        >>> component_class("diffusers", "PaellaVQModel") is None
        True
    """
    for module in (library, f"diffusers.pipelines.{library}", f"diffusers.pipelines.deprecated.{library}"):
        try:
            cls = getattr(importlib.import_module(module), name, None)
        except ImportError:
            cls = None
        if cls is not None:
            return cls
    if pipeline:
        import sys

        import diffusers

        owner = getattr(diffusers, pipeline, None)
        module = sys.modules.get(getattr(owner, "__module__", ""))
        cls = getattr(module, name, None)
        if isinstance(cls, type):
            return cls
    return None


def models_of_index(index: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """Component -> (class name, role) of the model components ``model_index.json`` lists.

    Example:
        >>> models_of_index({"_class_name": "X", "unet": ["diffusers", "UNet2DConditionModel"],
        ...                  "tokenizer": ["transformers", "CLIPTokenizer"], "vae": [None, None]})
        {'unet': ('UNet2DConditionModel', 'denoiser')}
    """
    out = {}
    for name, (library, class_name) in listed_components(index).items():
        cls = component_class(library, class_name, index.get("_class_name"))
        if _is_model(cls):
            out[name] = (class_name, role_of(cls))  # type: ignore[arg-type]
    return out


def pipeline_class(name: str) -> type:
    """The diffusers pipeline class called ``name``; a ``RecipeError`` with close names when there is none."""
    import diffusers

    cls = getattr(diffusers, name, None)
    if not (isinstance(cls, type) and issubclass(cls, diffusers.DiffusionPipeline)):
        near = difflib.get_close_matches(name, [n for n in dir(diffusers) if n.endswith("Pipeline")], n=3, cutoff=0.8)
        raise RecipeError(f"{name!r} is not a diffusers pipeline class"
                          + (f"; did you mean {', '.join(map(repr, near))}?" if near else ""))
    return cls


def check_folder_fits(where: str, index: Mapping[str, Any], cls: Any = None) -> None:
    """Refuse, before any weight is read, a folder that lacks components its pipeline class requires.

    ``model_index.json`` may name a class whose ``__init__`` needs components the folder does not have (an edited
    index, a wrong ``pipeline_class=``); diffusers would fail deep inside ``from_pretrained`` after loading the rest.

    Example:
        >>> check_folder_fits("./x", {"_class_name": "DDPMPipeline", "unet": ["diffusers", "UNet2DModel"]})
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: ./x: DDPMPipeline needs the components scheduler, which model_index.json \
does not list (it lists: unet). Pass pipeline_class= the class this folder was saved from, or fix _class_name \
in model_index.json
    """
    name = getattr(cls, "__name__", None) or str(index.get("_class_name"))
    if cls is None:
        try:
            cls = pipeline_class(name)
        except RecipeError:
            return  # not a class diffusers ships (custom): from_pretrained reports it
    optional = set(getattr(cls, "_optional_components", []) or [])
    listed = {c for c in index if not c.startswith("_")}
    needed = [p.name for p in inspect.signature(cls.__init__).parameters.values()
              if p.name not in ("self", "args", "kwargs") and p.default is inspect.Parameter.empty
              and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.name not in optional]
    missing = [c for c in needed if c not in listed]
    if missing:
        raise RecipeError(f"{where}: {name} needs the components {', '.join(missing)}, which model_index.json does not "
                          f"list (it lists: {', '.join(sorted(listed)) or 'nothing'}). Pass pipeline_class= the class "
                          f"this folder was saved from, or fix _class_name in model_index.json")


def composable_models(where: str, index: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    """The model components of a folder whose class no recipe lists, once the class is known to be diffusers'.

    Composition works for any pipeline class diffusers ships; a ``_class_name`` it does not ship (a typo, an edited
    index) is refused with the close class names and the recipe of the closest one, before any weight is read.
    """
    name = str(index.get("_class_name"))
    try:
        pipeline_class(name)
    except RecipeError as err:
        covered = recipe_classes()
        near = difflib.get_close_matches(name, list(covered), n=1, cutoff=0.8)
        fix = (f"Fix _class_name in model_index.json, or name a recipe and force it: "
               f"{spelled(f'recipe={covered[near[0]]!r}, force=True', f'--recipe {covered[near[0]]} --force')}" if near else
               "Fix _class_name in model_index.json (no shipped recipe is close to it)")
        raise RecipeError(f"{where}: model_index.json names {err}. {fix}") from None
    return models_of_index(index)


def models_of_class(name: str) -> dict[str, tuple[str, str]]:
    """Component -> (class name, role) read from a pipeline class's ``__init__`` signature (no weights, no folder).

    An annotation naming several classes (``Union[ControlNetModel, MultiControlNetModel]``) takes the first model
    class. Optional components (``image_encoder = None``) are listed too: a recipe may plan what is not loaded.

    Example:
        >>> models = models_of_class("StableDiffusionXLControlNetPipeline")
        >>> models["unet"], models["controlnet"][1]
        (('UNet2DConditionModel', 'denoiser'), 'controlnet')
    """
    cls = pipeline_class(name)
    try:
        hints = typing.get_type_hints(cls.__init__)
    except Exception:  # forward references diffusers never imports: fall back to the raw annotations
        hints = {p.name: p.annotation for p in inspect.signature(cls.__init__).parameters.values()}
    out: dict[str, tuple[str, str]] = {}
    for param in inspect.signature(cls.__init__).parameters.values():
        if param.name in ("self", "args", "kwargs"):
            continue
        for candidate in _classes_in(hints.get(param.name, param.annotation)):
            if _is_model(candidate):
                out[param.name] = (candidate.__name__, role_of(candidate))
                break
    return out


def _classes_in(annotation: Any) -> list[Any]:
    if isinstance(annotation, type):
        return [annotation]
    found: list[Any] = []
    for arg in typing.get_args(annotation):
        found += _classes_in(arg)
    return found

