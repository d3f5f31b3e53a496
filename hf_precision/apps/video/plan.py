"""Predicted peak memory of a video run, per phase, from the configs alone; and the cheapest settings that fit.

Weights come from :func:`hf_precision.plan` (each parameter in the dtype the recipe gives it on the asked device).
Activations come from running each phase's module on torch's ``meta`` device (shapes, no storage) and counting the
bytes alive at once (:mod:`hf_precision.apps.video.counting`), with the same code path diffusers runs (VAE tiling,
SVD's decode chunks, feed-forward chunking change the count because they change what is alive at once). What one
denoiser call gets comes from the family's row (:data:`hf_precision.apps.video.families.FAMILIES`).

A phase's peak = weights resident during it (all of them without offload; the running component with
``enable_model_cpu_offload``; about two leaf layers with ``enable_group_offload(offload_type="leaf_level",
use_stream=True)``; one with ``enable_sequential_cpu_offload``) + the activation high-water mark of its forward.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...errors import RecipeError
from ...recipe.devices import speed_note
from ...runtime.memory import available_bytes
from ...units import format_bytes, parse_size
from .counting import count_live_bytes
from .families import Meta, pipeline_recipe
from .load import MemorySettings

__all__ = ["Prediction", "Choice", "predict", "choose", "denoiser_call", "free_memory", "is_accelerator", "quantize_options"]


def free_memory(device: Any) -> int:
    """Free memory of ``device``: CUDA ``mem_get_info``; CPU the available RAM (``MemAvailable``)."""
    available = available_bytes(device)
    if available is not None:
        return available
    import os

    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _meta_modules(index: Mapping[str, Any], configs: Mapping[str, Any], dtypes: Mapping[str, Any]) -> dict[str, Any]:
    from ...diagnose.planner import build_on_meta

    modules = {}
    for name, dtype in dtypes.items():
        spec = index.get(name)
        if not isinstance(spec, (list, tuple)) or name not in configs:
            continue
        modules[name] = build_on_meta(str(spec[0]), str(spec[1]), configs[name], dtype,
                                      pipeline=index.get("_class_name")).eval()
    return modules


def _text_peak(module: Any, length: int, hidden_states: bool = False) -> int:
    import torch

    kwargs: dict[str, Any] = {"output_hidden_states": True} if hidden_states else {}
    length = min(length, int(getattr(module.config, "max_position_embeddings", length) or length))
    with count_live_bytes() as live:
        ids = torch.zeros(1, length, dtype=torch.long, device="meta")
        out = module(input_ids=ids, **kwargs)  # no mask: an all-ones mask is the same, and reading it needs values
        del out
    return live.peak


def _materialise(value: Any, dtype: Any) -> Any:
    """Meta tensors for the :class:`Meta` placeholders of a family's denoiser inputs (nested tuples included)."""
    import torch

    if isinstance(value, Meta):
        kind = {"": dtype, "long": torch.long, "float32": torch.float32}[value.dtype]
        return torch.empty(value.shape, device="meta", dtype=kind)
    if isinstance(value, tuple):
        return tuple(_materialise(v, dtype) for v in value)
    return value


def denoiser_call(spec: Any, config: Mapping[str, Any], dtype: Any, height: int, width: int, frames: int,
                  guidance: bool = True) -> dict[str, Any]:
    """The keyword arguments of one denoiser call of a clip, as meta tensors in ``dtype``.

    Example:
        >>> from hf_precision.apps.video.families import model_spec
        >>> from hf_precision.runtime.source import configs_of
        >>> where, spec = model_spec("wan", configs_only=True)
        >>> call = denoiser_call(spec, configs_of(where)[2]["transformer"], None, 480, 832, 81)
        >>> tuple(call["hidden_states"].shape), tuple(call["encoder_hidden_states"].shape)
        ((1, 16, 21, 60, 104), (1, 512, 4096))
    """
    row = spec.row
    if row.denoiser_inputs is None:
        raise RecipeError(f"--plan: {spec.pipeline} has no row in the video family table "
                          f"(hf_precision/apps/video/families.py), so its denoiser's inputs are unknown")
    batch = row.cfg_batch if guidance else 1
    inputs = row.denoiser_inputs(config, batch, spec.latent_shape(height, width, frames), spec.text_length())
    return {name: _materialise(value, dtype) for name, value in inputs.items()}


def _denoise_peak(spec: Any, module: Any, dtype: Any, height: int, width: int, frames: int, guidance: bool) -> int:
    call = denoiser_call(spec, module.config, dtype, height, width, frames, guidance)
    with count_live_bytes() as live:
        out = module(**call, return_dict=False)
        del out, call
    return live.peak


def _decode_peak(spec: Any, vae: Any, dtype: Any, height: int, width: int, frames: int, chunk: int | None,
                 cpu: bool = False) -> int:
    import inspect

    import torch

    f, h, w = spec.latent_shape(height, width, frames)
    c = vae.config.latent_channels if "latent_channels" in vae.config else vae.config.z_dim
    meta = {"device": "meta", "dtype": dtype}
    with count_live_bytes(cpu) as live:
        if spec.row.decode == "frames":  # a 2D or temporal VAE: latent frames decoded a chunk at a time
            z = torch.empty(f, c, h, w, **meta)
            n = (chunk if spec.row.decode_chunks else spec.row.decode_chunk) or f
            accepts = "num_frames" in inspect.signature(vae.forward).parameters
            outs = []
            for i in range(0, f, n):  # the pipeline's decode_latents loop; frames go to the CPU as float32
                extra = {"num_frames": min(n, f - i)} if accepts else {}
                part = vae.decode(z[i:i + n], **extra).sample
                outs.append(part.float())
                del part
            out = torch.cat(outs)
        else:
            z = torch.empty(1, c, f, h, w, **meta)
            kwargs = {}
            if getattr(vae.config, "timestep_conditioning", False):
                kwargs["temb"] = torch.zeros(1, **meta)
            out = vae.decode(z, return_dict=False, **kwargs)[0]
            out = out.float()  # video_processor.postprocess_video works in float32
        del out
    return live.peak


def _image_encoder_peak(module: Any, dtype: Any) -> int:
    """CLIP vision encoder on one image at its configured size (SVD resizes to 224 itself, pipeline_stable_video_
    diffusion.py `_encode_image`; Wan I2V reads ``hidden_states[-2]``, pipeline_wan_i2v.py `encode_image`, so every
    layer's output is kept)."""
    import torch

    size = int(getattr(module.config, "image_size", 224))
    # The input exists before the encoder's forward (the pipeline's preprocessing): the measured phase, which starts
    # at that forward, does not include it, so neither does the count.
    pixels = torch.empty(1, 3, size, size, device="meta", dtype=dtype)
    with count_live_bytes() as live:
        out = module(pixel_values=pixels, output_hidden_states=True)
        del out
    return live.peak


def _vae_encode_shape(spec: Any, height: int, width: int, frames: int) -> tuple[int, ...]:
    """What each image-to-video pipeline hands ``vae.encode`` (the row's ``image_encode``): ``image``, the image
    alone (SVD, pipeline_stable_video_diffusion.py `_encode_vae_image`); ``clip``, the image followed by frames-1
    zero frames (Wan I2V, pipeline_wan_i2v.py `prepare_latents`, ``video_condition``); ``frame``, the image as a
    1-frame video (LTX and CogVideoX I2V, pipeline_ltx_image2video.py and pipeline_cogvideox_image2video.py
    `prepare_latents`)."""
    kind = spec.row.image_encode
    if kind == "image":
        return 1, 3, height, width
    return 1, 3, frames if kind == "clip" else 1, height, width


def _vae_encode_peak(spec: Any, vae: Any, dtype: Any, height: int, width: int, frames: int, cpu: bool) -> int:
    import torch

    image = torch.empty(*_vae_encode_shape(spec, height, width, frames), device="meta", dtype=dtype)  # made before
    with count_live_bytes(cpu) as live:
        out = vae.encode(image).latent_dist
        del out
    return live.peak


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
    from ...runtime.source import configs_of
    from .load import components_by_role

    _, index, configs = configs_of(where)
    p = plan(where, device=layout, recipe=pipeline_recipe(spec.pipeline, index), overrides=overrides)
    dtypes = {name: dt.to_torch(c.compute) for name, c in p.components.items()}
    from diffusers.utils import logging as dlog

    level = dlog.get_verbosity()
    dlog.set_verbosity_error()  # casting a meta model logs a keep-in-fp32 notice that concerns real weights only
    try:
        modules = _meta_modules(index, configs, dtypes)
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
            text[name] = _text_peak(module, 77)
        else:
            text[name] = _text_peak(module, spec.text_length() + spec.row.text_prefix, spec.row.text_hidden_states)
    return _Model(spec=spec, plan=p, modules=modules, dtypes=dtypes, text=text, leaf=leaf, loose=loose,
                  cpu=p.recipe.device.type == "cpu")


def _weights(model: _Model, quantize: tuple[tuple[str, str], ...] = ()) -> dict[str, int]:
    """Weight bytes per component, with the storage a quantized candidate gives some of them (exact, as plan counts)."""
    import dataclasses as dc

    from ...runtime.layout import planned_bytes

    weights = {n: c.total_bytes for n, c in model.plan.components.items()}
    for name, storage in quantize:
        key = ("weights", name, storage)
        if key not in model.cache:
            model.cache[key] = planned_bytes(model.modules[name], dc.replace(model.plan.recipe[name], storage=storage))
        weights[name] = model.cache[key]
    return weights


def _resident(model: _Model, names: list[str], offload: str, quantize: tuple[tuple[str, str], ...] = ()) -> int:
    weights = _weights(model, quantize)
    if offload == "none":
        return sum(weights.values())
    present = [n for n in names if n in weights]
    if offload == "model":
        return max((weights[n] for n in present), default=0)
    per_leaf = 2 if offload == "group" else 1  # group offload with a stream prefetches the next layer
    scale = {n: weights[n] / max(1, model.plan.components[n].total_bytes) for n in present}  # quantized leaves shrink
    return max((int((per_leaf * model.leaf[n] + model.loose[n]) * scale[n]) for n in present), default=0)


def _image_phase(model: _Model, settings: MemorySettings, vae: str, height: int, width: int, frames: int) -> int:
    """The image encoder (CLIP vision) on the image, then the VAE's encode of what the family hands it."""
    image = []
    for name in model.named("image encoder"):
        key = ("image encoder", name)
        if key not in model.cache:
            model.cache[key] = _image_encoder_peak(model.modules[name], model.dtypes[name])
        image.append(_resident(model, [name], settings.offload, settings.quantize) + model.cache[key])
    key = ("vae encode", settings.vae_tiling, height, width, frames)
    if key not in model.cache:
        model.cache[key] = _vae_encode_peak(model.spec, model.modules[vae], model.dtypes[vae], height, width, frames,
                                            model.cpu)
    image.append(_resident(model, [vae], settings.offload, settings.quantize) + model.cache[key])
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
    key = ("denoise", settings.forward_chunking, height, width, frames, guidance)
    if key not in model.cache:
        model.cache[key] = _denoise_peak(spec, den, model.dtypes[spec.denoiser], height, width, frames, guidance)
    phases["denoising"] = resident(model.named("denoiser")) + model.cache[key]
    key = ("decode", settings.vae_tiling, settings.decode_chunk_size, height, width, frames)
    if key not in model.cache:
        model.cache[key] = _decode_peak(spec, vae, model.dtypes[vae_name], height, width, frames,
                                        settings.decode_chunk_size, model.cpu)
    phases["VAE decode"] = resident([vae_name]) + model.cache[key]
    return Prediction(settings=settings, phases=phases, weights=_weights(model, settings.quantize))


def predict(where: str, spec: Any, *, layout: Any, height: int, width: int, frames: int,
            settings: MemorySettings | None = None, overrides: Any = None, guidance: bool = True) -> Prediction:
    """Predicted peak memory per phase of one clip, from configs on the meta device (no weights, no GPU).

    Example:
        >>> from hf_precision.apps.video.families import model_spec
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


@dataclasses.dataclass
class Choice:
    """The settings chosen for a budget, the prediction for them, and the budget."""

    prediction: Prediction
    budget: int
    fits: bool
    tried: list[Prediction]
    device: Any  # the layout's device (a DeviceProfile): where the speed of the chosen storage was measured

    @property
    def settings(self) -> MemorySettings:
        return self.prediction.settings

    def describe(self) -> str:
        p = self.prediction
        head = ("chosen" if self.fits else "nothing fits; least memory") + f" for {format_bytes(self.budget)}: {p.settings.label()}"
        speed = speed_note(p.settings.quantize, self.device)
        return (f"{head}; predicted peak {format_bytes(p.peak)} (" + ", ".join(f"{k} {format_bytes(v)}" for k, v in p.phases.items())
                + ")" + (f"; {speed}" if speed else ""))


def choose(where: str, spec: Any, *, layout: Any, budget: int, height: int, width: int, frames: int,
           accelerator: bool = True, decode_chunk: int | None = None, overrides: Any = None,
           quantize: bool = True) -> Choice:
    """The fastest settings whose predicted peak fits ``budget`` bytes (else the one with the least memory).

    Quantized storage (``quantize=False`` leaves it out) is considered beside offload and tiling, among the layouts
    the component recipes tolerate on the device; the chosen one is loaded as ``--set C.storage=...``.

    Example:
        >>> from hf_precision.apps.video.families import model_spec
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> c = choose(where, spec, layout="t4", budget=8 * 10**9, height=256, width=256, frames=14)
        >>> c.fits, c.prediction.peak <= 8 * 10**9
        (True, True)
    """
    model = _load_model(where, spec, layout, overrides)
    tried = []
    for settings in _candidates(spec, accelerator, decode_chunk, quantize_options(model) if quantize else []):
        p = _predict(model, settings, height=height, width=width, frames=frames)
        tried.append(p)
        if p.peak <= budget:
            return Choice(prediction=p, budget=budget, fits=True, tried=tried, device=model.plan.recipe.device)
    return Choice(prediction=min(tried, key=lambda p: p.peak), budget=budget, fits=False, tried=tried,
                  device=model.plan.recipe.device)


def is_accelerator(layout: Any) -> bool:
    """Whether a device or layout name is an accelerator, where offload can move weights to it.

    Example:
        >>> is_accelerator("t4"), is_accelerator("cpu")
        (True, False)
    """
    from ...recipe.devices import device_profile

    return device_profile(layout).type != "cpu"
