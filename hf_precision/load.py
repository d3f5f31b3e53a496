"""load_pipeline: build a diffusers pipeline with every component loaded straight into its planned dtype."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from . import dtypes as dt
from .errors import RecipeError
from .recipe import Recipe, _pipeline_file, list_recipes

__all__ = ["load_pipeline", "locate", "component_configs"]


def _offline_error(name: str, err: BaseException) -> RecipeError:
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes")
    why = "HF_HUB_OFFLINE is set" if offline else "the Hugging Face Hub could not be reached"
    return RecipeError(
        f"{name!r}: not a local folder, and {why} ({type(err).__name__}). Download it where there is network "
        f"(`huggingface-cli download {name} --local-dir ./{name.split('/')[-1]}`) and pass the folder: "
        f"hf_precision.load_pipeline('./{name.split('/')[-1]}')")


def locate(name_or_path: str | os.PathLike[str], recipe: str | Recipe | None = None) -> tuple[str, dict[str, Any], Path | None]:
    """Where a pipeline lives: (id or path, its model_index.json, local folder or None).

    Recipe aliases (``"sdxl"``) map to the Hub id written in the recipe.
    """
    text = str(name_or_path)
    folder = Path(text).expanduser()
    if folder.is_dir():
        index = folder / "model_index.json"
        if not index.is_file():
            raise RecipeError(f"{folder}: no model_index.json; point at a diffusers pipeline folder (the one that holds "
                              f"model_index.json and unet/ or transformer/, vae/ ...)")
        return str(folder), json.loads(index.read_text()), folder
    if text in list_recipes("pipeline"):
        model = _pipeline_file(text)[1].get("model")
        if not model:
            raise RecipeError(f"recipe {text!r} names no model; pass a folder or Hub id")
        text = model
    if os.sep in text and text.count("/") != 1 or text.startswith((".", "/", "~")):
        raise RecipeError(f"{text}: no such folder; pass an existing diffusers folder, a Hub id (org/name) or a recipe "
                          f"alias ({', '.join(list_recipes('pipeline'))})")
    from diffusers import DiffusionPipeline

    try:
        index = DiffusionPipeline.load_config(text)
    except Exception as err:  # offline, unknown repo, no connection: all mean "use a local folder"
        raise _offline_error(text, err) from None
    return text, dict(index), None


def component_configs(where: str, index: Mapping[str, Any], folder: Path | None) -> dict[str, dict[str, Any]]:
    """Each component's ``config.json`` (what recipes ``select:`` on, e.g. the fp16-fix VAE's ``force_upcast``).

    Example:
        >>> import tempfile
        >>> from hf_precision.synthetic import make_sdxl, save_pipeline
        >>> where, index, folder = locate(save_pipeline(make_sdxl(), tempfile.mkdtemp()))
        >>> component_configs(where, index, folder)["vae"]["force_upcast"]
        True
    """
    configs = {}
    for comp, spec in index.items():
        if comp.startswith("_") or not isinstance(spec, (list, tuple)) or spec[0] is None:
            continue
        path = folder / comp / "config.json" if folder is not None else None
        if path is not None and path.is_file():
            configs[comp] = json.loads(path.read_text())
        elif folder is None:
            try:
                from huggingface_hub import hf_hub_download

                configs[comp] = json.loads(Path(hf_hub_download(where, f"{comp}/config.json")).read_text())
            except Exception:
                pass
    return configs


def _has_fp16_variant(folder: Path | None) -> bool:
    return folder is not None and any(any(folder.glob(f"*/{p}")) for p in ("*.fp16.safetensors", "*.fp16-*.safetensors"))


def _user_dtype_layer(kwargs: dict[str, Any], components: list[str]) -> dict[str, Any] | None:
    # A dtype passed the diffusers way is taken as an override (lowest priority among overrides): a single dtype
    # forces every component, a dict forces the components it names. Islands, entry casts and the NaN guard stay.
    if "dtype" in kwargs and "torch_dtype" in kwargs:
        raise RecipeError("load_pipeline: pass dtype or torch_dtype, not both (dtype is the current name)")
    value = kwargs.pop("dtype", kwargs.pop("torch_dtype", None))
    if value is None:
        return None
    if isinstance(value, Mapping):
        default = value.get("default")
        layer = {c: {"dtype": dt.from_torch(v) if not isinstance(v, str) else v} for c, v in value.items() if c != "default"}
        if default is not None:
            for c in components:
                layer.setdefault(c, {"dtype": dt.from_torch(default) if not isinstance(default, str) else default})
        return layer
    name = value if isinstance(value, str) else dt.from_torch(value)
    return {c: {"dtype": name} for c in components}


def load_pipeline(name_or_path: str | os.PathLike[str], device: Any = None, *, recipe: Recipe | str | None = None,
                  overrides: Any = None, pipeline_class: Any = None, **kwargs: Any) -> Any:
    """Load a diffusers pipeline with every component in its planned dtype, on its device, agreeing at runtime.

    Args:
        name_or_path: a local diffusers folder, a Hub id, or a recipe alias (``"sdxl"``, ``"svd"``) meaning the
            Hub id written in that recipe. Offline, a Hub id that is not cached fails with how to use a folder.
        device (*optional*): ``"cpu"``, ``"cuda"``, ``"cuda:1"``, ``"mps"`` ... or a mapping component -> device
            (``{"text_encoder": "cpu", "text_encoder_2": "cpu", "default": "cuda"}``); each component gets the
            dtype its own device supports. Default: the best present device.
        recipe (*optional*): a recipe name, or a resolved :class:`Recipe` whose layout is applied as is (how you run
            a T4 layout on this machine: ``recipe=get_recipe("sdxl", device="t4"), device="cpu"``). Default: chosen
            from ``model_index.json``'s ``_class_name``.
        overrides (*optional*): YAML path, dict, or a list of them, merged over the recipe.
        pipeline_class (*optional*): the class to build (``StableDiffusionXLImg2ImgPipeline``, an AutoPipeline);
            defaults to the class in ``model_index.json``.
        **kwargs: passed to ``from_pretrained`` (``variant``, ``revision``, ``cache_dir`` ...). ``dtype`` /
            ``torch_dtype`` are taken as an override (lowest priority); ``use_safetensors=False`` opts in to pickle
            files; remote code is refused.

    Returns:
        The diffusers pipeline itself (not a wrapper), ready to call. ``pipe._hf_precision_applied`` holds the
        :class:`~hf_precision.apply.Applied` report.

    Raises:
        RecipeError: unknown recipe or pipeline class, bad overrides, a dtype the device cannot compute, an
            offline Hub id, remote code.

    Example:
        >>> import tempfile
        >>> from hf_precision import get_recipe
        >>> from hf_precision.synthetic import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> pipe = load_pipeline(folder, "cpu", recipe=get_recipe("sdxl", device="t4"))
        >>> pipe.unet.dtype, pipe.vae.dtype
        (torch.float16, torch.float32)
    """
    import torch
    from diffusers import DiffusionPipeline

    from .apply import apply_recipe, recipe_for_class, resolve_per_device, resolve_placement
    from .devices import device_profile
    for flag in ("trust_remote_code", "custom_pipeline"):
        if kwargs.get(flag):
            raise RecipeError(f"load_pipeline: {flag} is refused: hf_precision never runs code downloaded with a model")
    where, index, folder = locate(name_or_path)
    if recipe is None:
        recipe = recipe_for_class(str(index.get("_class_name")))
    if isinstance(recipe, Recipe):
        recipe_components = [p.name for p in recipe.plans]
    else:
        recipe_components = list(_pipeline_file(str(recipe))[1]["components"])
    layers = [x for x in [_user_dtype_layer(kwargs, recipe_components)] if x]
    if overrides is not None:
        layers += list(overrides) if isinstance(overrides, (list, tuple)) else [overrides]
    if device is None:
        device = device_profile(None).torch_device()
    present = [c for c in recipe_components if c in index]
    placement = resolve_placement(device, present)
    configs = component_configs(where, index, folder)
    if isinstance(recipe, Recipe):
        if layers:
            raise RecipeError("load_pipeline: overrides need a recipe name, not a resolved Recipe: pass recipe='sdxl', "
                              "overrides=... (or resolve with get_recipe(name, device, overrides))")
        resolved = recipe
    else:
        resolved = resolve_per_device(str(recipe), {c: d for c, d in placement.items() if d}, layers, configs)

    plans = {p.name: p for p in resolved.plans}
    half = {"float16", "bfloat16"}
    latents = resolved.latents_from and plans.get(resolved.latents_from)
    default = dt.to_torch(latents.compute) if latents else torch.float32
    # Always give 'default': a component missing from the dict would otherwise load as fp32 (facts 1.2).
    dtype_map: dict[str, Any] = {"default": default}
    for name, plan in plans.items():
        dtype_map[name] = dt.to_torch(plan.compute if plan.storage not in half | {"float32"} else plan.storage)
    denoiser = next((plans[n] for n in ("unet", "transformer") if n in plans), None)
    if "variant" not in kwargs and denoiser is not None and denoiser.storage in half and _has_fp16_variant(folder):
        kwargs["variant"] = "fp16"
    kwargs.setdefault("use_safetensors", True)
    streamed = _stream_components(folder, index, plans, dtype_map, placement, kwargs)
    cls = pipeline_class or DiffusionPipeline
    try:
        pipe = cls.from_pretrained(where, dtype=dtype_map, **streamed, **kwargs)
    except OSError as err:
        if folder is None:
            raise _offline_error(where, err) from None
        raise RecipeError(f"{where}: cannot load it ({err}). If the folder only has .bin files, opt in to pickle "
                          f"files with use_safetensors=False; if it only has fp16 files, pass variant='fp16'") from None
    # Streamed components read their islands exactly as stored, unless they came from the half variant files;
    # everything else went through a half dtype and gets its islands re-read from the full-precision files.
    exact = {n for n in streamed if not kwargs.get("variant") or dtype_map[n] not in (torch.float16, torch.bfloat16)}
    _reload_islands_fp32(pipe, resolved, folder, skip=exact)
    apply_recipe(pipe, resolved, device=placement)
    return pipe


def _stream_components(folder: Path | None, index: Mapping[str, Any], plans: Mapping[str, Any],
                       dtype_map: Mapping[str, Any], placement: Mapping[str, str | None], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Components read tensor by tensor into their planned dtypes (see stream.py); the rest go to from_pretrained."""
    import torch

    from .select import matches
    from .stream import stream_component

    if folder is None or not kwargs.get("use_safetensors", True) or \
            {"device_map", "quantization_config", "low_cpu_mem_usage", "revision"} & set(kwargs):
        return {}
    out = {}
    for name, plan in plans.items():
        spec = index.get(name)
        if not isinstance(spec, (list, tuple)) or len(spec) != 2 or spec[0] is None or name in kwargs:
            continue
        islands = list(plan.keep_fp32) if plan.compute != "float32" else []
        storage = dtype_map[name]

        def target(key: str, _: torch.dtype, islands: list[str] = islands, storage: torch.dtype = storage) -> torch.dtype:
            parts = key.split(".")[:-1]
            inside = islands and any(matches(".".join(parts[:i]), islands) for i in range(1, len(parts) + 1))
            return torch.float32 if inside else storage

        # A component planned in fp32 reads the full-precision files even when the rest use the fp16 variant.
        variant = kwargs.get("variant") if storage in (torch.float16, torch.bfloat16) else None
        module = stream_component(spec[0], spec[1], folder / name, variant=variant, target=target,
                                  device=placement.get(name) or "cpu")
        if module is not None:
            out[name] = module
    return out


def _reload_islands_fp32(pipe: Any, recipe: Recipe, folder: Path | None, skip: set[str] = frozenset()) -> None:
    """Re-read float32 islands from the checkpoint so they hold the exact stored values, not a half round trip.

    Only the island tensors are read (safetensors reads single tensors), so the model is never built in fp32.
    """
    import torch
    from safetensors import safe_open

    from .apply import component_islands

    for plan in recipe.plans:
        module = getattr(pipe, plan.name, None)
        if module is None or plan.name in skip or not plan.keep_fp32 or plan.compute == "float32":
            continue
        islands = component_islands(plan, module, strict=False)  # apply_recipe reports bad patterns right after
        wanted = {f"{i}.{p}" for i in islands for p, _ in module.get_submodule(i).named_parameters()}
        files = _weight_files(folder / plan.name) if folder is not None else []
        found: dict[str, torch.Tensor] = {}
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                for key in wanted & set(f.keys()):
                    found[key] = f.get_tensor(key)
        with torch.no_grad():
            for key in wanted:
                owner, _, leaf = key.rpartition(".")
                param = module.get_submodule(owner)._parameters[leaf]
                value = found.get(key)
                param.data = (value if value is not None else param.data).to(device=param.device, dtype=torch.float32)


def _weight_files(comp_dir: Path) -> list[Path]:
    # Islands prefer the full-precision files even when the half variant was loaded for everything else.
    from .stream import weight_files

    return weight_files(comp_dir, None) or sorted(comp_dir.glob("*.safetensors"))
