"""load_pipeline: build a diffusers pipeline with every component loaded straight into its planned dtype."""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from .. import dtypes as dt
from ..errors import DamagedFileError, RecipeError
from ..recipe.files import read_json
from ..recipe.catalog import recipe_components, recipe_for
from ..recipe.model import Recipe
from ..recipe.requires import check_packages
from ..recipe.resolution import resolve
from .arguments import as_class, check_keywords, concrete_class, from_pretrained_keywords, index_class, override_layers
from .source import (cached_snapshot, check_folder_fits, component_configs, listed_components, locate, models_of_index,
                     offline_error)

__all__ = ["load_pipeline", "from_pretrained_dtypes", "check_files", "check_variant", "from_pretrained_keywords"]


def check_files(folder: str | os.PathLike[str], index: Mapping[str, Any] | None = None, *, weights: bool = True) -> None:
    """Check every JSON and safetensors file of a pipeline folder (``weights=False``: JSON only); the first damaged one is a
    ``DamagedFileError`` naming the file, its component and the fix. Headers only, so quick: run by the command line
    before torch is imported, and when loading failed, in place of a deep library error.

    Example:
        >>> import tempfile
        >>> from hf_precision.testing import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> check_files(folder)  # a good folder: nothing to say
        >>> _ = (folder / "vae" / "config.json").write_text("{")
        >>> check_files(folder)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.DamagedFileError: ...config.json (component vae): damaged file: not valid JSON ...
    """
    from .headers import read_header  # torch-free: the command line calls this before importing torch

    folder = Path(folder)
    if index is None:
        index = read_json(folder / "model_index.json")
    for comp in listed_components(index):
        comp_dir = folder / comp
        if not comp_dir.is_dir():
            continue
        for file in sorted(comp_dir.iterdir()):
            if file.suffix == ".json":
                read_json(file)
            elif file.suffix == ".safetensors" and weights:
                read_header(file)


def _damage_or_none(where: str, folder: Path | None, index: Mapping[str, Any]) -> DamagedFileError | None:
    if folder is None:  # a Hub id: its files are in the local cache
        folder = cached_snapshot(where)
        if folder is None:
            return None
    try:
        check_files(folder, index)
    except DamagedFileError as err:
        return err
    return None


def _has_fp16_variant(folder: Path | None) -> bool:
    return folder is not None and any(any(folder.glob(f"*/{p}")) for p in ("*.fp16.safetensors", "*.fp16-*.safetensors"))


def check_variant(where: str, folder: Path | None, variant: Any) -> None:
    """Refuse, before any weight is read, a ``variant=`` a local folder has no files of: diffusers would raise its own
    ValueError from inside ``from_pretrained``. The decision is diffusers' own (its ``variant_compatible_siblings``).

    Example:
        >>> import tempfile
        >>> from hf_precision.testing import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> check_variant(str(folder), folder, "fp16")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: ...: variant='fp16': the folder has no weight files of that variant (its variants: none, only the full files); leave variant out to read the full files, in the planned dtypes
    """
    if folder is None or not variant:
        return
    import re

    from diffusers.pipelines.pipeline_loading_utils import variant_compatible_siblings

    names = sorted(str(p.relative_to(folder)) for p in folder.glob("*/*") if p.is_file())
    try:
        variant_compatible_siblings(names, variant=str(variant))
    except ValueError:
        found = sorted({m[1] for n in names if (m := re.search(r"\.(\w+)(?:-\d+-of-\d+)?\.(?:safetensors|bin)$", n))})
        have = ", ".join(repr(v) for v in found) if found else "none, only the full files"
        fix = (f"pass one of them (variant={found[0]!r}) or leave variant out" if found else "leave variant out") + \
            " to read the full files, in the planned dtypes"
        raise RecipeError(f"{where}: variant={variant!r}: the folder has no weight files of that variant (its "
                          f"variants: {have}); {fix}") from None


def _pickle_only(folder: Path | None, index: Mapping[str, Any]) -> list[str]:
    """Components whose folder holds pickle weights (``*.bin``, ``*.pt``) and no safetensors file."""
    if folder is None:
        return []
    out = []
    for comp in listed_components(index):
        d = folder / comp
        if not d.is_dir():
            continue
        names = [p.name for p in d.iterdir()]
        pickled = any(n.endswith((".bin", ".pt", ".pth", ".ckpt")) for n in names)
        if pickled and not any(n.endswith(".safetensors") for n in names):
            out.append(comp)
    return out


def load_pipeline(name_or_path: str | os.PathLike[str], device: Any = None, *, recipe: Recipe | str | None = None,
                  overrides: Any = None, layout: Any = None, pipeline_class: Any = None, force: bool = False,
                  quantize: Mapping[str, str] | None = None, base: str | os.PathLike[str] | None = None,
                  **kwargs: Any) -> Any:
    """Load a diffusers pipeline with every component in its planned dtype, on its device, agreeing at runtime.

    Args:
        name_or_path: a local diffusers folder, a Hub id, or a recipe alias (``"sdxl"``) meaning its recipe's Hub id.
        device (*optional*): ``"cpu"``, ``"cuda:1"``, ``"mps"`` ... or a mapping component -> device
            (``{"text_encoder": "cpu", "default": "cuda"}``), each component in the dtype its device supports.
            Default: the best present device.
        recipe (*optional*): a recipe name, or a resolved :class:`Recipe` applied as is. Default: chosen from
            ``model_index.json``'s ``_class_name``; ``force=True`` uses it even where its ``pipelines`` lack the class.
        overrides (*optional*): YAML path, dict, or a list of them, merged over the recipe.
        layout (*optional*): the device whose rules choose the dtypes, when not where it runs (``layout="t4",
            device="cpu"``; a preset, ``"cuda:sm=7.5"``, or a mapping component -> device).
        pipeline_class (*optional*): the class to build (an img2img class, an AutoPipeline); default
            ``model_index.json``'s.
        quantize (*optional*): component -> quantized storage (``{"transformer": "int8"}``), as ``--set
            transformer.storage=int8`` (docs/quantization.md); a ``quantization_config=`` of your own passes as is.
        base (*optional*): with a single file as ``name_or_path`` (``.safetensors`` in the diffusers or original
            layout, or ``.gguf``), the folder or Hub id holding the rest; the file replaces the components it holds
            (runtime/single_file.py, runtime/gguf.py).
        **kwargs: passed to ``from_pretrained`` (``variant``, ``revision`` ...; an unknown one is a ``RecipeError``).
            ``dtype`` / ``torch_dtype`` are a lowest-priority override; ``use_safetensors=False`` opts in to ``*.bin``
            files; remote code is refused.

    Returns the pipeline itself; ``hf_precision.applied(pipe)`` returns its
    :class:`~hf_precision.runtime.apply.Applied` report. Raises ``RecipeError`` (before any weight is read where it
    can: unknown names, bad overrides, a dtype the device cannot compute, an uncached Hub id offline, a package the
    recipe ``requires:``), and its subclass ``DamagedFileError`` for an unreadable index, config or safetensors file.

    Example:
        >>> import tempfile
        >>> from hf_precision.testing.pipelines import make_sdxl, save_pipeline
        >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp())
        >>> pipe = load_pipeline(folder, "cpu", layout="t4")
        >>> pipe.unet.dtype, pipe.vae.dtype
        (torch.float16, torch.float32)
    """
    import torch

    from .apply import apply_recipe

    start = time.perf_counter()
    target = _resolve_target(name_or_path, device, recipe, overrides, layout, pipeline_class, force, quantize, base,
                             kwargs)
    resolved, folder = target.resolved, target.folder
    timings = {"resolve": time.perf_counter() - start}
    dtype_map = from_pretrained_dtypes(resolved)
    plans = {p.name: p for p in resolved.policies}
    denoiser = plans.get(resolved.denoiser) if resolved.denoiser else None
    if "variant" not in kwargs and denoiser is not None and denoiser.storage in {"float16", "bfloat16"} \
            and _has_fp16_variant(folder):
        kwargs["variant"] = "fp16"
    kwargs.setdefault("use_safetensors", True)
    from .quantize_load import quantization_kwargs, report_quantization

    quant_notes = quantization_kwargs(resolved, target.where, target.index, folder, kwargs)
    single_note, from_file = None, {}
    if target.single_file is not None and target.single_file.suffix.lower() == ".gguf":
        from .gguf import load_gguf_denoiser

        name, model = load_gguf_denoiser(target.single_file, target.where, target.index, resolved, kwargs)
        kwargs[name] = model
        quant_notes["gguf"] = (name, str(target.single_file))
    elif target.single_file is not None:
        from .single_file import load_single_file

        from_file, single_note = load_single_file(target.single_file, target.where, target.index, resolved, kwargs,
                                                  dtype_map)
        kwargs.update(from_file)
    mark = time.perf_counter()
    placement = {p.name: p.device for p in resolved.policies}
    streamed = _stream_components(folder, target.index, plans, dtype_map, placement, kwargs)
    timings["stream"] = time.perf_counter() - mark
    mark = time.perf_counter()
    pipe = _from_pretrained(target, dtype_map, streamed, kwargs)
    # Streamed components read their islands exactly as stored, unless they came from the half variant files;
    # everything else went through a half dtype and gets its islands re-read from the full-precision files.
    timings["from_pretrained"] = time.perf_counter() - mark
    exact = {n for n in streamed if not kwargs.get("variant") or dtype_map[n] not in (torch.float16, torch.bfloat16)}
    if target.single_file is not None:  # their islands come from the file (GGUF: upcast by apply_recipe), not the base's
        exact |= {resolved.denoiser, *from_file}
    mark = time.perf_counter()
    _reload_islands_fp32(pipe, resolved, folder, skip=exact)
    timings["reload_islands"] = time.perf_counter() - mark
    mark = time.perf_counter()
    record = apply_recipe(pipe, resolved, force=force)
    # what a component set later (pipe.vae = ...) and a pipeline built from this one (from_pipe) are resolved with
    record.inputs.update(recipe=recipe, device=device, force=force, overrides=target.overrides, layout=layout)
    timings["apply"] = time.perf_counter() - mark
    record.actions += report_quantization(pipe, resolved, quant_notes) + ([single_note] if single_note else [])
    record.timings.update(timings)
    return pipe


class _Target(NamedTuple):
    """What ``load_pipeline`` loads: where from, the index it read, the class to build, the class the index names
    (``None`` when diffusers has none of that name) and the resolved recipe."""

    where: str
    index: Mapping[str, Any]
    folder: Path | None
    pipeline_class: Any
    single_file: Path | None
    resolved: Recipe
    saved_class: Any
    overrides: Any = None  # the override layers resolved with (overrides=, dtype=, quantize=)


def _resolve_target(name_or_path: Any, device: Any, recipe: Any, overrides: Any, layout: Any, pipeline_class: Any,
                    force: bool, quantize: Any, base: Any, kwargs: dict[str, Any]) -> _Target:
    """Everything that can be refused before a weight is read: the location, the keywords, the recipe and its plan."""
    from ..recipe.devices import device_profile
    from .placement import check_placeable

    for flag in ("trust_remote_code", "custom_pipeline"):
        if kwargs.get(flag):
            raise RecipeError(f"load_pipeline: {flag} is refused: hf_precision never runs code downloaded with a model")
    from .single_file import split_single_file

    single = split_single_file(name_or_path, base)
    single_file, name_or_path = single if single is not None else (None, name_or_path)
    pipeline_class = as_class(pipeline_class)
    where, index, folder = locate(name_or_path)
    pipeline_class = concrete_class(pipeline_class, where, index, kwargs)  # an AutoPipeline: the class it builds
    built = index_class(where, index) if pipeline_class is None else None
    if built is None:  # another class is built from the folder: the saved class's keywords are taken too
        import diffusers

        built = getattr(diffusers, str(index.get("_class_name")), None)
    check_keywords(kwargs, [c for c in (pipeline_class, built) if isinstance(c, type)])
    check_folder_fits(where, index, pipeline_class)
    check_variant(where, folder, kwargs.get("variant"))
    pipeline = str(getattr(pipeline_class, "__name__", None) or index.get("_class_name"))
    chosen = recipe is None  # chosen by class: resolve refits it to the model classes present
    if recipe is None:  # the shipped recipe for the class, else one composed from its components
        from .source import composable_models

        models = (lambda: models_of_index(index)) if pipeline_class is not None else (lambda: composable_models(where, index))
        recipe = recipe_for(pipeline, models)
    planned = recipe_components(recipe)
    # dtype= applies to the components the folder has, not to the optional ones its recipe could also plan
    present = [c for c in planned if c in listed_components(index)] or planned
    layers = override_layers(kwargs, present, overrides, quantize)
    if device is None:
        device = device_profile(None).torch_device()
    check_placeable(device, recipe)
    resolved = resolve(None if chosen and isinstance(recipe, str) else recipe, pipeline_class=pipeline, devices=device,
                       layout=layout, overrides=layers or None, configs=component_configs(where, index, folder),
                       components=list(listed_components(index)), force=force, models=models_of_index(index))
    check_packages(resolved, pipeline)  # what building or running it needs (recipe `requires:`): before any weight
    return _Target(where, index, folder, pipeline_class, single_file, resolved, built, layers or None)


def _from_pretrained(target: _Target, dtype_map: dict[str, Any], streamed: dict[str, Any], kwargs: dict[str, Any]) -> Any:
    """``from_pretrained`` of the class to build, its failures turned into one error naming the file or the fix."""
    from diffusers import DiffusionPipeline

    where, folder, index = target.where, target.folder, target.index
    cls = target.pipeline_class or DiffusionPipeline
    if cls is DiffusionPipeline:
        # The index's own class, not DiffusionPipeline: from_pretrained sorts passed components by cls's
        # _optional_components, so through the base class a component the class's __init__ defaults to None (Wan's
        # transformer, Wan 2.2) was taken for a config keyword and loaded again from the folder over the one passed
        # (a GGUF transformer, a streamed one): pipeline_utils.py _get_signature_keys.
        if isinstance(target.saved_class, type) and issubclass(target.saved_class, DiffusionPipeline):
            cls = target.saved_class
    if kwargs.get("use_safetensors") is False:
        # diffusers passes use_safetensors=False on to transformers, which then refuses the model.safetensors it
        # saves itself (transformers 5 always writes safetensors); None reads safetensors where present, pickle
        # where a component has nothing else: the opt-in the user asked for.
        kwargs["use_safetensors"] = None
    try:
        missed = _missed_by_diffusers(cls, where, index, dtype_map, {**streamed, **kwargs})
        # passed as None, diffusers leaves the component out (passed as itself, it still looks its class up by name)
        pipe = cls.from_pretrained(where, dtype=dtype_map, **dict.fromkeys(missed), **streamed, **kwargs)
        if missed:
            pipe.register_modules(**missed)
        return pipe
    except Exception as err:  # a damaged file surfaces as OSError, SafetensorError, ValueError ...: name it
        damage = _damage_or_none(where, folder, index)
        if damage is not None:
            raise damage from None
        if not isinstance(err, OSError):
            raise
        if folder is None:
            raise offline_error(where, err) from None
        pickled = _pickle_only(folder, index) if kwargs.get("use_safetensors") else []
        if pickled:
            raise RecipeError(f"{where}: {', '.join(pickled)} hold{'s' if len(pickled) == 1 else ''} only pickle weights "
                              f"(.bin), which are refused by default (loading a pickle can run code): opt in with "
                              f"use_safetensors=False if you trust the files, or save them again with "
                              f"safe_serialization=True") from None
        raise RecipeError(f"{where}: cannot load it ({err}). If the folder only has fp16 files, pass variant='fp16'; "
                          f"otherwise no fix is known here: check the folder against the model's file list") from None


# from_pretrained keywords a component loaded on its own shares with the pipeline's
_SHARED = ("variant", "revision", "cache_dir", "local_files_only", "token", "use_safetensors")


def _missed_by_diffusers(cls: Any, where: str, index: Mapping[str, Any], dtype_map: Mapping[str, Any],
                         given: Mapping[str, Any]) -> dict[str, Any]:
    """The components ``from_pretrained`` cannot find by their index's class (the Stable Cascade decoder's
    ``PaellaVQModel``: :func:`~hf_precision.runtime.source.component_class`), loaded here for the built pipeline.
    """
    import diffusers

    from .source import component_class

    missed = {}
    for name, (library, class_name) in listed_components(index).items():
        if name in given or library == "transformers" or getattr(diffusers, class_name, None) is not None \
                or (library != "diffusers" and hasattr(diffusers.pipelines, library)):
            continue  # passed, or where diffusers looks
        model = component_class(library, class_name, cls.__name__)
        if model is not None and model.__module__.startswith("diffusers.") and hasattr(model, "from_pretrained"):
            dtype = dtype_map.get(name, dtype_map.get("default"))
            missed[name] = model.from_pretrained(where, subfolder=name, torch_dtype=dtype,
                                                 **{k: given[k] for k in _SHARED if k in given})
    return missed


def from_pretrained_dtypes(recipe: Recipe) -> dict[str, Any]:
    """The ``dtype=`` dict ``from_pretrained`` gets for a resolved recipe: each component's stored dtype (fp8-stored ones
    in their compute dtype: layerwise casting stores them after). ``"default"`` is always given: ``pipeline_utils.py``
    loads a component missing from the dict with ``dtype.get("default", torch.float32)``.

    Example:
        >>> from hf_precision import get_recipe
        >>> from_pretrained_dtypes(get_recipe("sdxl", device="t4"))["vae"]
        torch.float32
    """
    import torch

    plans = {p.name: p for p in recipe.policies}
    latents = plans.get(recipe.latents_from) if recipe.latents_from else None
    dtype_map: dict[str, Any] = {"default": dt.to_torch(latents.compute) if latents else torch.float32}
    for name, plan in plans.items():
        dtype_map[name] = dt.to_torch(plan.compute if plan.storage not in {"float16", "bfloat16", "float32"} else plan.storage)
    return dtype_map


def _stream_components(folder: Path | None, index: Mapping[str, Any], plans: Mapping[str, Any],
                       dtype_map: Mapping[str, Any], placement: Mapping[str, str | None], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """Components read tensor by tensor into their planned dtypes (see stream.py); the rest go to from_pretrained."""
    import torch

    from ..recipe.patterns import matches
    from .stream import stream_component

    if folder is None or not kwargs.get("use_safetensors", True) or \
            {"device_map", "quantization_config", "low_cpu_mem_usage", "revision"} & set(kwargs):
        return {}
    out = {}
    listed = listed_components(index)
    for name, plan in plans.items():
        spec = listed.get(name)
        if spec is None or name in kwargs:
            continue
        islands = list(plan.keep_fp32) if plan.compute != "float32" else []
        storage = dtype_map[name]

        def target(key: str, _: torch.dtype, islands: list[str] = islands, storage: torch.dtype = storage) -> torch.dtype:
            parts = key.split(".")[:-1]
            inside = islands and any(matches(".".join(parts[:i]), islands) for i in range(1, len(parts) + 1))
            return torch.float32 if inside else storage

        # A component planned in fp32 reads the full-precision files even when the rest use the fp16 variant.
        variant = kwargs.get("variant") if storage in (torch.float16, torch.bfloat16) else None
        if (placement.get(name) or "cpu") == "cpu" and _stored_as(folder / name, kwargs.get("variant")) == {storage}:
            # The files from_pretrained would read already hold the planned dtype: it maps them as plain diffusers
            # does (file-backed pages the kernel can drop), where streaming would copy them into private memory.
            continue
        module = stream_component(spec[0], spec[1], folder / name, variant=variant, target=target,
                                  device=placement.get(name) or "cpu")
        if module is not None:
            out[name] = module
    return out


def _stored_as(comp_dir: Path, variant: str | None) -> set[Any]:
    """The floating dtypes a component's safetensors files hold (empty when it has none)."""
    from .stream import file_dtypes, weight_files

    found: set[Any] = set()
    for path in weight_files(comp_dir, variant):
        found |= file_dtypes(path)
    return found


def _reload_islands_fp32(pipe: Any, recipe: Recipe, folder: Path | None, skip: set[str] = frozenset()) -> None:
    """Re-read float32 islands from the checkpoint so they hold the exact stored values, not a half round trip.

    Only the island tensors are read (safetensors reads single tensors), so the model is never built in fp32.
    """
    import torch
    from safetensors import safe_open

    from .layout import component_islands
    from .headers import read_header  # torch-free: the command line calls this before importing torch

    for plan in recipe.policies:
        module = getattr(pipe, plan.name, None)
        if module is None or plan.name in skip or not plan.keep_fp32 or plan.compute == "float32":
            continue
        islands = component_islands(plan, module, strict=False)  # apply_recipe reports bad patterns right after
        wanted = {f"{i}.{p}" for i in islands for p, _ in module.get_submodule(i).named_parameters()}
        files = _weight_files(folder / plan.name) if folder is not None else []
        found: dict[str, torch.Tensor] = {}
        for file in files:
            read_header(file)  # a damaged file is named, not a SafetensorError from inside safe_open
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
