"""Predicted peak memory of a video run, per phase, from the configs alone; and the cheapest settings that fit.

A phase's peak = the weights resident during it (:func:`hf_precision.plan`'s bytes; under offload only the running
component, about two leaf layers, or one: :func:`hf_precision.memory.resident_bytes`) + the activation high-water
mark of its forward, run on the ``meta`` device through diffusers' own code path (:mod:`hf_precision.memory.peaks`:
VAE tiling, SVD's decode chunks and feed-forward chunking count as they run). A denoiser call's inputs come from its
class's row of recipes/denoisers.yaml. :func:`choose` gives :func:`hf_precision.memory.choose` the candidates,
fastest first.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...errors import RecipeError
from ...memory import peaks
from ...memory.planner import Choice, is_accelerator, resident_bytes
from ...memory.planner import choose as choose_fitting
from ...runtime.memory import available_bytes
from ...units import format_bytes
from .spec import pipeline_recipe
from .load import MemorySettings

__all__ = ["Prediction", "Choice", "predict", "choose", "denoiser_call", "free_memory", "quantize_options"]


def free_memory(device: Any) -> int:
    """Free memory of ``device``: CUDA ``mem_get_info``; CPU the available RAM (``MemAvailable``; without /proc,
    psutil's reading)."""
    available = available_bytes(device)
    if available is not None:
        return available
    import psutil

    return int(psutil.virtual_memory().available)


def denoiser_call(spec: Any, module: Any, dtype: Any, height: int, width: int, frames: int,
                  guidance: bool = True) -> dict[str, Any]:
    """The keyword arguments of one denoiser call of a clip, as meta tensors (floating ones in ``dtype``), built by
    the training loss's code from the denoiser class's row (recipes/denoisers.yaml).

    Example:
        >>> from hf_precision.apps.video.spec import model_spec
        >>> import torch
        >>> from hf_precision.memory.peaks import meta_module
        >>> from hf_precision.runtime.source import configs_of
        >>> where, spec = model_spec("wan", configs_only=True)
        >>> _, index, configs = configs_of(where)
        >>> den = meta_module(index, configs, "transformer", torch.bfloat16)
        >>> call = denoiser_call(spec, den, None, 480, 832, 81)
        >>> tuple(call["hidden_states"].shape), tuple(call["encoder_hidden_states"].shape)
        ((1, 16, 21, 60, 104), (1, 512, 4096))
    """
    import torch

    from ...memory.counting import with_values
    from ...memory.train_step import cast_floats
    from ...training.denoiser_rows import ROWS, call_inputs, example_batch, row_of
    from ...training.rules import TrainingError

    try:
        row = row_of(module, spec.denoiser)
    except TrainingError:
        raise RecipeError(f"--plan: {spec.pipeline}: {type(module).__name__} has no row in recipes/denoisers.yaml, so "
                          f"its denoiser's inputs are unknown; add one (hf_precision.training.denoiser_rows.add_rows; "
                          f"known: {', '.join(sorted(ROWS))})") from None
    batch = example_batch(module, spec.row.cfg_batch if guidance else 1, tokens=spec.text_length(), device="meta",
                          latent=spec.latent_shape(height, width, frames))
    # its masks (all ones) keep their values, as train --plan's do: FramePack slices the prompt by mask.sum(dim=1)[0],
    # an .item() (transformer_hunyuan_video_framepack.py:328-332) that has no value on meta alone
    batch = {k: with_values(torch.ones(v.shape, dtype=v.dtype)) if torch.is_tensor(v) and not v.is_floating_point()
             else v for k, v in batch.items()}
    return cast_floats(call_inputs(row, module, batch), dtype)


def _decode_peak(spec: Any, vae: Any, dtype: Any, height: int, width: int, frames: int, chunk: int | None,
                 cpu: bool = False) -> int:
    latent = spec.latent_shape(height, width, frames)
    per_call = None
    if spec.row.decode == "frames":  # a 2D or temporal VAE: latent frames decoded a chunk at a time
        per_call = (chunk if spec.row.decode_chunks else spec.row.decode_chunk) or latent[0]
    return peaks.vae_decode_peak(vae, dtype, latent, frames_per_call=per_call, cpu=cpu)


def _vae_encode_shape(spec: Any, height: int, width: int, frames: int) -> tuple[int, ...]:
    """What an image-to-video pipeline hands ``vae.encode`` (the row's ``image_encode``): ``image`` alone (SVD,
    pipeline_stable_video_diffusion.py `_encode_vae_image`); ``clip``, it then frames-1 zero frames (Wan I2V,
    pipeline_wan_i2v.py `prepare_latents`); ``frame``, a 1-frame video (pipeline_ltx_image2video.py,
    pipeline_cogvideox_image2video.py `prepare_latents`).
    """
    kind = spec.row.image_encode
    if kind == "image":
        return 1, 3, height, width
    return 1, 3, frames if kind == "clip" else 1, height, width


# --------------------------------------------------------------------------------------------- prediction


@dataclasses.dataclass
class Prediction:
    """Predicted peak bytes per phase (weights resident + activations) for one set of memory settings."""

    settings: MemorySettings
    phases: dict[str, int]
    weights: dict[str, int]

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def quantize(self) -> tuple[tuple[str, str], ...]:
        return self.settings.quantize

    def label(self) -> str:
        return self.settings.label()

    def details(self) -> str:
        return (f"predicted peak {format_bytes(self.peak)} ("
                + ", ".join(f"{k} {format_bytes(v)}" for k, v in self.phases.items()) + ")")


@dataclasses.dataclass
class _Model:
    spec: Any
    plan: Any
    modules: dict[str, Any]
    dtypes: dict[str, Any]
    text: dict[str, int]
    leaf: dict[str, int]
    loose: dict[str, int]
    cpu: bool = False
    cache: dict[tuple[Any, ...], int] = dataclasses.field(default_factory=dict)

    def cached(self, key: tuple[Any, ...], count: Any) -> int:
        """``count()`` once per key: a meta forward costs seconds, and the candidates share most of them."""
        if key not in self.cache:
            self.cache[key] = count()
        return self.cache[key]

    def named(self, wanted: str) -> list[str]:
        """The components with role ``wanted`` (:func:`hf_precision.apps.video.load.role`)."""
        from .load import components_by_role

        return [name for name, _ in components_by_role(self.modules, wanted)]


_MODELS: dict[tuple[str, str, str], _Model] = {}


def _load_model(where: str, spec: Any, layout: Any, overrides: Any = None) -> _Model:
    key = (str(where), spec.pipeline, str(layout))
    if overrides is None and key in _MODELS:
        return _MODELS[key]
    model = _build_model(where, spec, layout, overrides)
    if overrides is None:
        _MODELS.clear()  # one model at a time: a 14B transformer on meta still has ~10^5 Python objects
        _MODELS[key] = model
    return model


def _build_model(where: str, spec: Any, layout: Any, overrides: Any = None) -> _Model:
    from ... import dtypes as dt
    from ...diagnose.planner import plan
    from ...runtime.source import configs_of, listed_components
    from .load import components_by_role

    _, index, configs = configs_of(where)
    p = plan(where, device=layout, recipe=pipeline_recipe(spec.pipeline, index), overrides=overrides)
    dtypes = {name: dt.to_torch(c.compute) for name, c in p.components.items()}
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()  # casting a meta model logs a keep-in-fp32 notice that concerns real weights only
    try:
        listed = listed_components(index)
        modules = {name: peaks.meta_module(index, configs, name, dtype).eval() for name, dtype in dtypes.items()
                   if name in listed and name in configs}
    finally:
        dlog.set_verbosity(level)
    leaf, loose = {}, {}
    for name, module in modules.items():
        ratio = p[name].total_bytes / max(1, p[name].params)
        sizes = [sum(q.numel() for q in m.parameters(recurse=False)) for m in module.modules()
                 if not list(m.children())]
        leaf[name] = int(max(sizes or [0]) * ratio)
        loose[name] = int(sum(sum(q.numel() for q in m.parameters(recurse=False)) for m in module.modules()
                              if list(m.children())) * ratio)
    text = {}
    for name, module in components_by_role(modules, "text encoder"):
        # HunyuanVideo's Llama reads the prompt template too: text_prefix tokens cropped after encoding
        if "CLIP" in type(module).__name__:  # CLIP tokenizers pad to 77 whatever the family
            text[name] = peaks.text_encode_peak(module, 77)
        else:
            text[name] = peaks.text_encode_peak(module, spec.text_length() + spec.row.text_prefix, spec.row.text_hidden_states)
    return _Model(spec=spec, plan=p, modules=modules, dtypes=dtypes, text=text, leaf=leaf, loose=loose,
                  cpu=p.recipe.device.type == "cpu")


def _weights(model: _Model, quantize: tuple[tuple[str, str], ...] = ()) -> dict[str, int]:
    """Weight bytes per component, with the storage a quantized candidate gives some of them (exact, as plan counts)."""
    from ...runtime.layout import planned_bytes

    weights = {n: c.total_bytes for n, c in model.plan.components.items()}
    for name, storage in quantize:
        weights[name] = model.cached(("weights", name, storage), lambda: planned_bytes(
            model.modules[name], dataclasses.replace(model.plan.recipe[name], storage=storage)))
    return weights


def _resident(model: _Model, names: list[str], offload: str, quantize: tuple[tuple[str, str], ...] = ()) -> int:
    unquantized = {n: c.total_bytes for n, c in model.plan.components.items()}
    return resident_bytes(_weights(model, quantize), offload, names, leaf=model.leaf, loose=model.loose,
                          unquantized=unquantized)


def _image_phase(model: _Model, settings: MemorySettings, vae: str, height: int, width: int, frames: int) -> int:
    """The image encoder (CLIP vision) on the image, then the VAE's encode of what the family hands it."""
    image = []
    for name in model.named("image encoder"):
        peak = model.cached(("image encoder", name),
                            lambda: peaks.image_encode_peak(model.modules[name], model.dtypes[name]))
        image.append(_resident(model, [name], settings.offload, settings.quantize) + peak)
    peak = model.cached(("vae encode", settings.vae_tiling, height, width, frames), lambda: peaks.vae_encode_peak(
        model.modules[vae], _vae_encode_shape(model.spec, height, width, frames), model.dtypes[vae], cpu=model.cpu))
    image.append(_resident(model, [vae], settings.offload, settings.quantize) + peak)
    return max(image)


def _predict(model: _Model, settings: MemorySettings, *, height: int, width: int, frames: int,
             guidance: bool = True) -> Prediction:
    spec = model.spec
    den = model.modules[spec.denoiser]
    if settings.forward_chunking and hasattr(den, "enable_forward_chunking"):
        den.enable_forward_chunking()
    else:  # the UNet has no disable_forward_chunking: undo it through the blocks' own setter
        for m in den.modules():
            if hasattr(m, "set_chunk_feed_forward"):
                m.set_chunk_feed_forward(None)  # TemporalBasicTransformerBlock takes no dim
    vae_name = model.named("vae")[0]
    vae = model.modules[vae_name]
    if hasattr(vae, "enable_tiling"):
        (vae.enable_tiling if settings.vae_tiling else vae.disable_tiling)()
    resident = lambda names: _resident(model, names, settings.offload, settings.quantize)  # noqa: E731
    phases: dict[str, int] = {}
    text_names = model.named("text encoder")
    if text_names:
        phases["text encoding"] = max(resident([n]) + model.text[n] for n in text_names)
    if spec.takes_image and spec.row.image_encode:
        phases["image encoding"] = _image_phase(model, settings, vae_name, height, width, frames)
    call = lambda: denoiser_call(spec, den, model.dtypes[spec.denoiser], height, width, frames, guidance)  # noqa: E731
    phases["denoising"] = resident(model.named("denoiser")) + model.cached(
        ("denoise", settings.forward_chunking, height, width, frames, guidance), lambda: peaks.denoise_peak(den, call))
    phases["VAE decode"] = resident([vae_name]) + model.cached(
        ("decode", settings.vae_tiling, settings.decode_chunk_size, height, width, frames),
        lambda: _decode_peak(spec, vae, model.dtypes[vae_name], height, width, frames, settings.decode_chunk_size,
                             model.cpu))
    return Prediction(settings=settings, phases=phases, weights=_weights(model, settings.quantize))


def predict(where: str, spec: Any, *, layout: Any, height: int, width: int, frames: int,
            settings: MemorySettings | None = None, overrides: Any = None, guidance: bool = True) -> Prediction:
    """Predicted peak memory per phase of one clip, from configs on the meta device (no weights, no GPU).

    Example:
        >>> from hf_precision.apps.video.spec import model_spec
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> p = predict(where, spec, layout="t4", height=256, width=256, frames=14,
        ...             settings=MemorySettings(decode_chunk_size=2))
        >>> sorted(p.phases), p.peak > p.weights["unet"]
        (['VAE decode', 'denoising', 'image encoding'], True)
    """
    model = _load_model(where, spec, layout, overrides)
    return _predict(model, spec.required(settings or MemorySettings()), height=height, width=width, frames=frames, guidance=guidance)


# --------------------------------------------------------------------------------------------- choosing


def quantize_options(model: _Model) -> list[tuple[tuple[str, str], ...]]:
    """Quantized storage the video plan may choose (:func:`hf_precision.recipe.quantize.storage_options`)."""
    from ...recipe.devices import device_caps
    from ...recipe.quantize import storage_options

    present = [n for n in model.plan.components if n in model.modules]
    texts = [n for n in model.named("text encoder") if n in present]
    denoisers = [n for n in model.named("denoiser") if n in present]  # Wan 2.2: transformer and transformer_2
    recipe = model.plan.recipe
    caps = device_caps(recipe.device)
    return storage_options(recipe, denoisers, texts, caps.storage, caps.transformers_only)


def _candidates(spec: Any, accelerator: bool, decode_chunk: int | None,
                quantize: list[tuple[tuple[str, str], ...]] = ()) -> list[MemorySettings]:
    """Settings from fastest to slowest: whole-model offload moves each component once per phase, quantized storage
    costs a dequantization per layer and call, group/sequential offload move weights every step; tiling and
    chunking cost little."""
    row = spec.row
    chunks = [decode_chunk or 8, 4, 2, 1] if row.decode_chunks else [None]
    # SVD's temporal decoder has no tiling (its decode chunk does that job); Allegro's VAE decodes only tiled
    tilings = {"optional": (False, True), "never": (False,), "always": (True,)}[row.vae_tiling]
    offloads = ["none", "model", "group", "sequential"] if accelerator else ["none"]
    order = [(o, ()) for o in offloads[:2]] + [(o, q) for q in quantize for o in offloads[:2]]
    order += [(o, q) for o in offloads[2:] for q in ((), *quantize)]
    out = []
    for offload, quant in order:
        for tiling in tilings:
            for chunk in chunks:
                for ff in ((False, True) if row.forward_chunking else (False,)):
                    out.append(MemorySettings(offload=offload, vae_tiling=tiling, decode_chunk_size=chunk,
                                              forward_chunking=ff, quantize=quant))
    return out


def choose(where: str, spec: Any, *, layout: Any, budget: int, height: int, width: int, frames: int,
           accelerator: bool | None = None, decode_chunk: int | None = None, overrides: Any = None,
           quantize: bool = True) -> Choice[Prediction]:
    """The fastest settings whose predicted peak fits ``budget`` bytes (else the one with the least memory): offload where
    ``accelerator`` (default: whether ``layout`` is one), and beside it and tiling the quantized layouts the recipes
    tolerate on the device (unless ``quantize=False``), the chosen one loaded as ``--set C.storage=...``.

    Example:
        >>> from hf_precision.apps.video.spec import model_spec
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> c = choose(where, spec, layout="t4", budget=8 * 10**9, height=256, width=256, frames=14)
        >>> c.fits, c.prediction.peak <= 8 * 10**9
        (True, True)
    """
    model = _load_model(where, spec, layout, overrides)
    if accelerator is None:
        accelerator = is_accelerator(layout)
    return choose_fitting(_candidates(spec, accelerator, decode_chunk, quantize_options(model) if quantize else []),
                          lambda settings: _predict(model, settings, height=height, width=width, frames=frames),
                          budget, device=model.plan.recipe.device)
