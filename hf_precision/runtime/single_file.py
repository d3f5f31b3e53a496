"""A single-file checkpoint as the denoiser of a diffusers pipeline: ``load_pipeline("x.safetensors", base=...)``.

Fine-tunes shared for ComfyUI, A1111 and Civitai are one ``.safetensors`` file, in the diffusers key layout or the
original one diffusers converts; the rest of the pipeline comes from ``base``. The header is checked against the
base's denoiser built on meta (through diffusers' converter for the original layout), so a file of another model
is one error before loading; the tensors are then read into their planned dtypes and handed to
``<ModelClass>.from_single_file(state, config=base, subfolder=...)``. A whole SD/SDXL checkpoint is recognised by
its key prefixes and each planned component in it read the same way. Pickle files are refused (loading one can run
code); GGUF files go to :mod:`hf_precision.runtime.gguf`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..errors import RecipeError, arg, excerpt

__all__ = ["split_single_file", "denoiser_layout", "held_components", "load_single_file", "refuse_unreadable",
           "hub_kwargs", "SAFETENSORS_SUFFIXES"]

SAFETENSORS_SUFFIXES = (".safetensors", ".sft")  # .sft: BFL's own name for the Flux releases
PICKLE_SUFFIXES = (".ckpt", ".pt", ".pth", ".bin", ".pkl")
SINGLE_FILE_SUFFIXES = (".gguf",) + SAFETENSORS_SUFFIXES
# The prefix original checkpoints put before the denoiser's keys (diffusers' single_file_utils.LDM_UNET_KEY).
DENOISER_PREFIX = "model.diffusion_model."
# Where an original whole checkpoint keeps its other components: the VAE (diffusers' LDM_VAE_KEYS), the CLIP text
# encoders of SD 1.x/2.x (cond_stage_model), SDXL (conditioner.embedders) and SD3 (text_encoders).
OTHER_COMPONENTS = {"first_stage_model.": "VAE", "vae.": "VAE", "cond_stage_model.": "text encoder",
                    "conditioner.embedders.": "text encoders", "text_encoders.": "text encoders"}


def split_single_file(name_or_path: str | os.PathLike[str], base: str | os.PathLike[str] | None,
                      caller: str = "load_pipeline") -> tuple[Path, str] | None:
    """(the single file, the diffusers folder or Hub id for the rest), ``None`` for a pipeline folder or Hub id, or a
    ``RecipeError`` saying what to pass.

    Example:
        >>> split_single_file("./my-sdxl", None) is None
        True
        >>> split_single_file("finetune.ckpt", "./sdxl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: load_pipeline: 'finetune.ckpt' is a pickle file, which is refused (loading one can run code); use the model's .safetensors release, ...
    """
    text = str(name_or_path)
    path = Path(text).expanduser()
    suffix = path.suffix.lower()
    if suffix in PICKLE_SUFFIXES:
        raise RecipeError(f"{caller}: {excerpt(text)} is a pickle file, which is refused (loading one can run code); "
                          f"use the model's .safetensors release, or convert it once where you trust it: python -c "
                          f"\"import torch, safetensors.torch as s; d = torch.load('{text}', weights_only=True); "
                          f"s.save_file(d.get('state_dict', d), '{path.with_suffix('.safetensors')}')\"")
    if suffix not in SINGLE_FILE_SUFFIXES and base is None:
        return None
    kind = "a GGUF file" if suffix == ".gguf" else "a single-file checkpoint"
    if base is None:
        example = "black-forest-labs/FLUX.1-dev" if suffix == ".gguf" else "stabilityai/stable-diffusion-xl-base-1.0"
        raise RecipeError(f"{caller}({excerpt(text)}): {kind} holds one model, not a pipeline; pass the diffusers "
                          f"folder (or Hub id) for the rest: {arg('base', example)}")
    if suffix not in SINGLE_FILE_SUFFIXES:
        raise RecipeError(f"{caller}: {arg('base')} is for a single-file checkpoint ({', '.join(SINGLE_FILE_SUFFIXES)}), "
                          f"but {excerpt(text)} is none; pass a diffusers folder without {arg('base')}, or the file")
    if not path.is_file():
        raise RecipeError(f"{caller}: {path}: no such file")
    return path, str(base)


def hub_kwargs(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The keywords of ``load_pipeline`` that ``from_single_file`` also takes: where to read ``base``'s configs from.

    Example:
        >>> hub_kwargs({"revision": "main", "variant": "fp16", "local_files_only": True})
        {'revision': 'main', 'local_files_only': True}
    """
    return {k: kwargs[k] for k in ("revision", "cache_dir", "local_files_only", "token") if k in kwargs}


def refuse_unreadable(path: Path, cls: type, name: str, where: str) -> None:
    """A ``RecipeError`` before loading where diffusers cannot read ``cls`` from a single file: it inherits
    ``from_single_file`` but is in no mapping (HunyuanVideoFramepack's transformer), asked by subclass as diffusers
    does (loaders/single_file_model.py).

    Example:
        >>> import torch
        >>> refuse_unreadable(Path("x.gguf"), torch.nn.Linear, "transformer", "base")
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: x.gguf: Linear (the transformer of base) cannot be read from a single file by diffusers ... (no single-file loader for it); use a diffusers folder instead
    """
    import diffusers

    try:
        from diffusers.loaders.single_file_model import _get_single_file_loadable_mapping_class as mapping
    except ImportError:  # another diffusers: from_single_file itself says
        mapping = None
    if not hasattr(cls, "from_single_file") or (mapping is not None and mapping(cls) is None):
        raise RecipeError(f"{path}: {cls.__name__} (the {name} of {where}) cannot be read from a single file by "
                          f"diffusers {diffusers.__version__} (no single-file loader for it); use a diffusers folder "
                          f"instead")


def _meta_tensors(header: Mapping[str, Any]) -> dict[str, Any]:
    """The file's tensors as meta tensors of their shapes and dtypes: what diffusers' converters need, no bytes."""
    import torch

    from .stream import SAFETENSORS_DTYPES

    return {k: torch.empty(v["shape"], dtype=SAFETENSORS_DTYPES.get(v["dtype"], torch.float32), device="meta")
            for k, v in header.items()}


def held_components(keys: list[str]) -> list[str]:
    """What an original whole checkpoint holds beside its denoiser (``["VAE", "text encoders"]``), from its keys;
    empty for a denoiser alone.

    Example:
        >>> held_components(["model.diffusion_model.out.2.bias", "first_stage_model.decoder.conv_in.bias"])
        ['VAE']
        >>> held_components(["double_blocks.0.img_attn.qkv.weight"])
        []
    """
    if not any(k.startswith(DENOISER_PREFIX) for k in keys):
        return []
    return sorted({what for prefix, what in OTHER_COMPONENTS.items() for k in keys if k.startswith(prefix)})


def _mapping_fn(cls: type) -> Any:
    """diffusers' converter from the original layout to ``cls``'s (loaders/single_file_model.py), or None."""
    try:
        from diffusers.loaders.single_file_model import (SINGLE_FILE_LOADABLE_CLASSES,
                                                         _get_single_file_loadable_mapping_class)
    except ImportError:  # another diffusers: from_single_file converts itself
        return None
    mapping = _get_single_file_loadable_mapping_class(cls)
    return SINGLE_FILE_LOADABLE_CLASSES[mapping]["checkpoint_mapping_fn"] if mapping else None


def _convert(cls: type, config: Mapping[str, Any], tensors: Mapping[str, Any], expected: set[str]) -> dict[str, Any]:
    """``tensors`` in the diffusers layout of ``cls``: as they are when they have every key, else through diffusers'
    converter (a UNet-only file saved without the ``model.diffusion_model.`` prefix, as ComfyUI's ``models/unet``
    files are, is read with it: diffusers' LDM converter only takes prefixed keys). Works on meta tensors too."""
    if expected <= set(tensors):
        return {k: tensors[k] for k in expected}
    fn = _mapping_fn(cls)
    if fn is None:
        raise ValueError(f"diffusers has no converter to {cls.__name__}")
    tries = [dict(tensors)]
    if not any(k.startswith(DENOISER_PREFIX) for k in tensors):
        tries.append({DENOISER_PREFIX + k: v for k, v in tensors.items()})
    best: dict[str, Any] = {}
    error: Exception | None = None
    for attempt in tries:
        try:
            out = dict(fn(checkpoint=attempt, config=dict(config)))
        except Exception as err:  # noqa: BLE001 (a converter fails as it may on foreign keys: KeyError, IndexError ...)
            error = error or err
            continue
        if len(expected & set(out)) > len(expected & set(best)):
            best = out
    if not best and error is not None:
        raise ValueError(f"diffusers' converter to {cls.__name__} cannot read it ({type(error).__name__}: {error})")
    return best


def denoiser_layout(path: Path, model: Any, name: str, where: str, header: Mapping[str, Any] | None = None) -> str:
    """``"diffusers"`` or ``"original"``: a single-file denoiser's key layout, checked from its ``header`` against
    ``model`` (the base's denoiser; meta is enough); another class or size, or missing tensors, is a ``RecipeError``.

    Example:
        >>> import tempfile, torch, safetensors.torch
        >>> path = Path(tempfile.mkdtemp()) / "net.safetensors"
        >>> safetensors.torch.save_file({"weight": torch.zeros(3, 2), "bias": torch.zeros(3)}, path)
        >>> denoiser_layout(path, torch.nn.Linear(2, 3), "unet", "./base")
        'diffusers'
        >>> denoiser_layout(path, torch.nn.Linear(4, 3), "unet", "./base")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: ...net.safetensors: not the unet of ./base: weight is [3, 2] in the file, the base's Linear has [3, 4] ...
    """
    from .headers import read_header

    if header is None:
        _, header = read_header(path)
    keys = list(header)
    state = model.state_dict()
    expected = {k: list(v.shape) for k, v in state.items()}
    cls = type(model)
    fix = (f"pass {arg('base')} the diffusers folder (or Hub id) of the model this file was fine-tuned from, whose {name} is "
           f"a {cls.__name__} of the same size")
    try:
        converted = _convert(cls, getattr(model, "config", {}), _meta_tensors(header), set(expected))
    except ValueError as err:
        raise RecipeError(f"{path}: not the {name} ({cls.__name__}) of {where}: {err}; its keys start "
                          f"{', '.join(keys[:3])}; {fix}") from None
    form = "diffusers" if set(expected) <= set(header) else "original"
    wrong = [(k, list(converted[k].shape), shape) for k, shape in expected.items()
             if k in converted and list(converted[k].shape) != shape]
    if wrong:
        key, found, want = wrong[0]
        raise RecipeError(f"{path}: not the {name} of {where}: {key} is {found} in the file, the base's {cls.__name__} "
                          f"has {want} ({len(wrong)} tensor(s) differ); {fix}")
    missing = sorted(set(expected) - set(converted))
    if missing:
        raise RecipeError(f"{path}: not the {name} ({cls.__name__}) of {where}: read in the {form} layout it lacks "
                          f"{len(missing)} of the {len(expected)} tensors (first: {', '.join(missing[:3])}); {fix}")
    return form


def load_single_file(path: Path, where: str, index: Mapping[str, Any], recipe: Any, kwargs: Mapping[str, Any],
                     dtypes: Mapping[str, Any]) -> tuple[dict[str, Any], str]:
    """Load the components a single ``.safetensors`` file holds: (component -> model, the report's line).

    A denoiser file gives the recipe's denoiser; a whole SD/SDXL checkpoint every planned component diffusers finds in
    it. Each diffusers tensor is read in its planned dtype (``dtypes[component]``, float32 islands as stored) and
    ``from_single_file`` builds the model from the base's config, with a quantized storage's backend config as
    ``from_pretrained`` gets it; text encoders go through diffusers' single-file functions. The file is never held in
    float32 unless stored so.

    Example:
        >>> from hf_precision import get_recipe
        >>> load_single_file(Path("unet.safetensors"), "./vae-only", {"vae": ["diffusers", "AutoencoderKL"]},
        ...                  get_recipe("sdxl", device="t4"), {}, {})
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: unet.safetensors: the base ./vae-only has no denoiser component for the file (recipe sdxl)
    """
    from safetensors import safe_open

    from .headers import read_header
    from .source import component_configs, listed_components

    name = recipe.denoiser
    listed = listed_components(index)
    if listed.get(name) is None:
        raise RecipeError(f"{path}: the base {where} has no denoiser component for the file (recipe {recipe.name})")
    pipeline = str(index.get("_class_name"))
    folder = Path(where) if Path(where).is_dir() else None
    configs = component_configs(where, index, folder)
    cls, meta = _meta_model(path, name, listed[name], configs, where, pipeline)
    refuse_unreadable(path, cls, name, where)
    _, header = read_header(path)
    form = denoiser_layout(path, meta, name, where, header)
    held = held_components(list(header))
    quant = getattr(kwargs.get("quantization_config"), "quant_mapping", None) or {}
    build = _Builder(path, where, recipe, dtypes, quant, hub_kwargs(kwargs))
    with safe_open(str(path), framework="pt") as f:
        if form == "diffusers":  # final names: each tensor is cast as it is read, the file is never held whole
            return {name: build.model(name, cls, meta, _Reader(f, meta.state_dict()))}, build.line(form)
        raw = {k: f.get_tensor(k) for k in f.keys()}
    models = {name: build.model(name, cls, meta, _convert(cls, configs[name], raw, set(meta.state_dict())))}
    for other, spec in listed.items() if held else ():
        if other in models or other not in recipe or other not in configs:
            continue
        model = build.other(other, spec, configs[other], raw, pipeline)
        if model is not None:
            models[other] = model
    return models, build.line(form, held)


class _Reader(Mapping):
    """A file's tensors read on access, so each is cast to its planned dtype before the next is read: a file stored
    in float32 is never held whole in float32 for a half plan."""

    def __init__(self, handle: Any, keys: Any):
        self.handle, self.names = handle, list(keys)

    def __getitem__(self, key: str) -> Any:
        return self.handle.get_tensor(key)

    def __iter__(self) -> Any:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)


def _meta_model(path: Path, name: str, spec: tuple[str, str], configs: Mapping[str, Any], where: str,
                pipeline: str) -> tuple[type, Any]:
    """The class of a component of ``base`` and the component built on the meta device from its config."""
    from .meta import build_on_meta
    from .source import component_class

    cls = component_class(*spec, pipeline)
    if cls is None:
        raise RecipeError(f"{path}: this diffusers has no class {spec[1]} (the {name} of {where})")
    if name not in configs:
        raise RecipeError(f"{path}: the base {where} has no {name}/config.json to build the {spec[1]} from")
    return cls, build_on_meta(*spec, configs[name], pipeline=pipeline)


class _Builder:
    """Builds components from a file's tensors in their planned dtypes, and says what it built."""

    def __init__(self, path: Path, where: str, recipe: Any, dtypes: Mapping[str, Any], quant: Mapping[str, Any],
                 extra: Mapping[str, Any]):
        self.path, self.where, self.recipe, self.dtypes, self.quant, self.extra = path, where, recipe, dtypes, quant, extra
        self.built: list[str] = []
        self.notes: list[str] = []

    def model(self, name: str, cls: type, meta: Any, tensors: Mapping[str, Any]) -> Any:
        """A diffusers model from tensors in its own key layout: planned dtypes, islands float32 as stored."""
        import torch

        from .layout import component_islands

        plan, dtype = self.recipe[name], self.dtypes[name]
        islands = component_islands(plan, meta, strict=False) if plan.compute != "float32" else []
        wanted = set(meta.state_dict())
        fp32 = {k for k in tensors if k in wanted and any(k.startswith(i + ".") for i in islands)}
        state = {}
        for key in [k for k in tensors if k in wanted]:  # one at a time: a lazy `tensors` reads each as it is cast
            value = tensors[key]
            state[key] = value.to(torch.float32 if key in fp32 else dtype) if value.is_floating_point() else value
        quant = self.quant.get(name)
        try:
            model = cls.from_single_file(state, config=self.where, subfolder=name, torch_dtype=dtype,
                                         **({"quantization_config": quant} if quant is not None else {}), **self.extra)
        except (ValueError, KeyError, RuntimeError, OSError) as err:
            raise RecipeError(f"{self.path}: diffusers could not load it as the {name} ({cls.__name__}) of "
                              f"{self.where}: {err}") from None
        with torch.no_grad():  # from_single_file cast the islands with the rest: they get the file's values back
            for key in fp32:
                owner, _, leaf = key.rpartition(".")
                module = model.get_submodule(owner)
                if leaf in module._parameters:
                    module._parameters[leaf].data = state[key]
                elif leaf in module._buffers:
                    module._buffers[leaf] = state[key]
        if quant is not None:
            self._quantize_rest(name, model, meta, islands)
        self.built.append(name)
        return model

    def _quantize_rest(self, name: str, model: Any, meta: Any, islands: list[str]) -> None:
        """Quantize the planned layers ``from_single_file`` left plain, with the backend's own per-layer call: diffusers
        0.42's ``from_single_file`` takes a ``TorchAoConfig`` but leaves every layer float (its ``from_pretrained``
        quantizes them), so the plan's bytes would not hold."""
        from .quantize import quantized_layers
        from .quantize_load import quantize_planned_rest

        plan = self.recipe[name]
        done = quantize_planned_rest(model, plan, set(quantized_layers(meta, plan, islands)))
        if done:
            self.notes.append(f"{name}: {len(done)} layer(s) quantized to {plan.storage} after from_single_file, "
                              f"which read the file without quantizing them")

    def other(self, name: str, spec: tuple[str, str], config: Mapping[str, Any], raw: Mapping[str, Any],
              pipeline: str) -> Any:
        """Another component of a whole checkpoint, or None when the file does not hold it (base gives it)."""
        from diffusers.loaders.single_file_utils import (create_diffusers_clip_model_from_ldm,
                                                         is_clip_model_in_single_file)

        cls, meta = _meta_model(self.path, name, spec, {name: config}, self.where, pipeline)
        if _mapping_fn(cls) is not None:
            expected = set(meta.state_dict())
            try:
                tensors = _convert(cls, config, raw, expected)
            except ValueError:
                return None
            if not expected & set(tensors):
                return None
            missing = sorted(expected - set(tensors))
            if missing:
                raise RecipeError(f"{self.path}: its {name} ({cls.__name__}) lacks {len(missing)} of the "
                                  f"{len(expected)} tensors of the {name} of {self.where} (first: "
                                  f"{', '.join(missing[:3])}); pass {arg('base')} the diffusers folder of the model this "
                                  f"checkpoint was made from")
            return self.model(name, cls, meta, tensors)
        if not is_clip_model_in_single_file(cls, raw):
            return None
        try:
            model = create_diffusers_clip_model_from_ldm(cls, raw, subfolder=name, config=self.where,
                                                         torch_dtype=self.dtypes[name],
                                                         local_files_only=self.extra.get("local_files_only"))
        except (ValueError, KeyError, RuntimeError, OSError) as err:
            raise RecipeError(f"{self.path}: diffusers could not read its {name} ({cls.__name__}) with the config "
                              f"of {self.where}: {err}") from None
        # diffusers picks the encoder's keys by the first prefix whose width matches the config, not by component:
        # when two encoders of the file are as wide (never in a real SDXL: 768 and 1280), the second is read from
        # the first one's keys, and what that one lacks (text_projection) stays on the meta device, to fail mid-call
        unread = [k for k, v in model.state_dict().items() if v.is_meta]
        if unread:
            raise RecipeError(f"{self.path}: diffusers read its {name} ({cls.__name__}) from the keys of another "
                              f"text encoder of the file, leaving {len(unread)} tensor(s) unread ({', '.join(unread[:3])}): "
                              f"its encoders are as wide as each other, which diffusers' single-file reader cannot "
                              f"tell apart; load the file's denoiser alone (save its model.diffusion_model. keys) "
                              f"with {arg('base')} giving the encoders")
        self.built.append(name)
        return model

    def line(self, form: str, held: list[str] | None = None) -> str:
        """The report's line: what came from the file, in which layout and dtypes."""
        comps = ", ".join(f"{n} {str(self.dtypes[n]).replace('torch.', '')}" for n in self.built)
        layout = "diffusers layout" if form == "diffusers" else "original layout, converted by diffusers"
        what = f"whole checkpoint ({' and '.join(held)} beside the denoiser)" if held else "single file"
        return "; ".join([f"loaded from the {what} {self.path} ({layout}): {comps}; islands float32 as stored; the "
                          f"rest from {self.where}", *self.notes])
