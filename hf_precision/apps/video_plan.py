"""Predicted peak memory of a video run, per phase, from the configs alone; and the cheapest settings that fit.

Weights come from :func:`hf_precision.plan` (each parameter in the dtype the recipe gives it on the asked device).
Activations come from running each phase's module on torch's ``meta`` device (shapes, no storage) under a
``TorchDispatchMode`` that adds up the bytes of every tensor the ops create and subtracts them when Python frees the
tensor: its high-water mark is the activation peak of that forward, with the same code path diffusers runs (VAE
tiling, SVD's decode chunks, feed-forward chunking change the count because they change what is alive at once).
Attention is counted as a fused kernel (flash / memory-efficient SDPA: the output, not the score matrix), which is
what ``F.scaled_dot_product_attention`` runs on CUDA and on CPU.

A phase's peak = weights resident during it (all of them without offload; the running component with
``enable_model_cpu_offload``; about two leaf layers with ``enable_group_offload(offload_type="leaf_level",
use_stream=True)``; one with ``enable_sequential_cpu_offload``) + the activation high-water mark of its forward.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import weakref
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import RecipeError
from ..runtime.memory import available_bytes
from .video import MemorySettings

__all__ = ["count_live_bytes", "Prediction", "Choice", "predict", "choose", "parse_size", "free_memory", "print_plan", "choose_for_args", "quantize_options",
           "pipeline_recipe"]

# Text sequence lengths the pipelines pad to (diffusers pipeline_wan.py max_sequence_length=512, pipeline_ltx.py 128,
# pipeline_cogvideox.py 226, pipeline_hunyuan_video.py 256 plus the template's crop_start 95).
TEXT_LENGTH = {"wan": 512, "ltx": 128, "cogvideox": 226, "hunyuan": 256 + 95, "other": 256}
# Batch the denoiser sees per call with guidance: LTX, CogVideoX and SVD concatenate the unconditional half;
# Wan calls the transformer twice with batch 1; HunyuanVideo embeds guidance (batch 1).
CFG_BATCH = {"wan": 1, "ltx": 2, "cogvideox": 2, "hunyuan": 1, "svd": 2, "other": 2}


def parse_size(text: str) -> int:
    """Bytes of ``16GB`` (10^9), ``12GiB`` (2^30), ``800MB``, ``1.5T``; a plain number is GB.

    Example:
        >>> parse_size("16GB"), parse_size("1GiB"), parse_size("0.5")
        (16000000000, 1073741824, 500000000)
    """
    m = re.fullmatch(r"\s*([\d.]+)\s*([KMGT]?)(i?)B?\s*", str(text), flags=re.IGNORECASE)
    if not m or m[1].count(".") > 1:
        raise RecipeError(f"--max-memory {text}: use a size such as 16GB, 12GiB or 800MB")
    unit = m[2].upper() or "G"
    base = 1024 if m[3] else 1000
    return int(float(m[1]) * base ** ("KMGT".index(unit) + 1))


def free_memory(device: Any) -> int:
    """Free memory of ``device``: CUDA ``mem_get_info``; CPU the available RAM (``MemAvailable``)."""
    available = available_bytes(device)
    if available is not None:
        return available
    import os

    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


# --------------------------------------------------------------------------------------------- counting on meta


class _LiveBytes:
    """High-water mark of the bytes of tensors created by ops (meta device) and still referenced from Python."""

    def __init__(self) -> None:
        self.live = 0
        self.peak = 0
        self.refs: dict[int, list[int]] = {}

    def add(self, t: Any) -> None:
        key = t.untyped_storage()._cdata
        entry = self.refs.get(key)
        if entry is None:
            entry = self.refs[key] = [t.untyped_storage().nbytes(), 0]
            self.live += entry[0]
            self.peak = max(self.peak, self.live)
        entry[1] += 1
        weakref.finalize(t, self._drop, key)

    def _drop(self, key: int) -> None:
        entry = self.refs.get(key)
        if entry is None:
            return
        entry[1] -= 1
        if entry[1] <= 0:
            self.live -= entry[0]
            del self.refs[key]


def _cpu_conv3d_workspace(args: Any, out: Any) -> int:
    """Transient bytes PyTorch's CPU conv3d takes beyond its output (aten/src/ATen/native/Convolution.cpp,
    ``ConvParams::use_mkldnn``): float32 with ``N*C*D*H <= 20480`` and a kernel of at most 3x3 runs ``slow_conv3d``,
    which unfolds the input into a (C_in*kD*kH*kW) x (output voxels) column buffer; otherwise oneDNN, which reorders
    a copy of the input."""
    x, w = args[0], args[1]
    if x.dim() != 5 or x.dtype.itemsize != 4:
        return 0
    groups = args[8] if len(args) > 8 else 1
    n, c, d, h = x.shape[:4]
    native = groups == 1 and not (w.shape[-1] > 3 and w.shape[-2] > 3) and n == 1 and n * c * d * h <= 20480
    if native:
        return int(w.shape[1] * w.shape[2] * w.shape[3] * w.shape[4] * out.shape[2] * out.shape[3] * out.shape[4]
                   * x.element_size())
    return int(x.numel() * x.element_size())


@contextlib.contextmanager
def _counting(cpu: bool = False, grad: bool = False) -> Iterator[_LiveBytes]:
    import torch
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    live = _LiveBytes()

    class Mode(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in tree_flatten(out)[0]:
                if isinstance(t, torch.Tensor) and t.device.type == "meta":
                    live.add(t)
            if cpu and func is torch.ops.aten.convolution.default:
                live.peak = max(live.peak, live.live + _cpu_conv3d_workspace(args, out))
            return out

    sdpa = F.scaled_dot_product_attention

    class FusedWithGrad(torch.autograd.Function):
        """A flash kernel under autograd: saves q, k, v, the output and the per-row logsumexp; backward gives
        gradients shaped like q, k, v (what torch's flash/efficient SDPA backward allocates)."""

        @staticmethod
        def forward(ctx, query, key, value):
            out = query.new_empty((*query.shape[:-1], value.shape[-1]))
            lse = query.new_empty(query.shape[:-1], dtype=torch.float32)
            ctx.save_for_backward(query, key, value, out, lse)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, _, _ = ctx.saved_tensors
            return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)

    def fused(query, key, value, *args, **kwargs):  # a fused kernel: the output, no (L x S) score matrix
        if torch.is_grad_enabled() and (query.requires_grad or key.requires_grad or value.requires_grad):
            return FusedWithGrad.apply(query, key, value)
        return query.new_empty((*query.shape[:-1], value.shape[-1]))

    F.scaled_dot_product_attention = fused
    try:
        with (torch.enable_grad() if grad else torch.no_grad()), Mode():
            yield live
    finally:
        F.scaled_dot_product_attention = sdpa


def count_live_bytes(cpu: bool = False, grad: bool = False) -> contextlib.AbstractContextManager[Any]:
    """Count the bytes of meta tensors the ops inside create, while they are alive: ``.peak`` is the high-water mark.

    ``grad=True`` keeps autograd on, so what a forward saves for backward (alive until backward frees it) and the
    gradients backward makes are counted too: the activation peak of a training step (the training plan uses it).

    Example:
        >>> import torch
        >>> with count_live_bytes() as live:
        ...     x = torch.empty(256, device="meta") * 2   # the empty input and the product: 2 x 1 KiB
        >>> live.peak
        2048
    """
    return _counting(cpu, grad)


def _meta_modules(index: Mapping[str, Any], configs: Mapping[str, Any], dtypes: Mapping[str, Any]) -> dict[str, Any]:
    from ..diagnose.planner import build_on_meta

    modules = {}
    for name, dtype in dtypes.items():
        spec = index.get(name)
        if not isinstance(spec, (list, tuple)) or name not in configs:
            continue
        # .to("meta") also moves buffers made with legacy constructors (torch.Tensor([..])) that stayed on the CPU
        modules[name] = build_on_meta(str(spec[0]), str(spec[1]), configs[name]).to("meta", dtype).eval()
    return modules


def _text_peak(module: Any, length: int) -> int:
    import torch

    kwargs: dict[str, Any] = {}
    if "Llama" in type(module).__name__:
        kwargs["output_hidden_states"] = True  # HunyuanVideo reads hidden_states[-3]: every layer's output is kept
    length = min(length, int(getattr(module.config, "max_position_embeddings", length) or length))
    with _counting() as live:
        ids = torch.zeros(1, length, dtype=torch.long, device="meta")
        out = module(input_ids=ids, **kwargs)  # no mask: an all-ones mask is the same, and reading it needs values
        del out
    return live.peak


def _text_len(spec: Any) -> int:
    """Tokens the denoiser sees: ``--max-sequence-length`` or the config's, else the pipeline's default."""
    fixed = spec.extra.get("max_sequence_length")
    return int(fixed) if fixed else TEXT_LENGTH.get(spec.family, 256) - (95 if spec.family == "hunyuan" else 0)


def _latent_shape(spec: Any, config: Mapping[str, Any], height: int, width: int, frames: int) -> tuple[int, ...]:
    spatial = spec.size_multiple // _patch(spec, config)
    f = (frames - 1) // spec.frame_step + 1 if spec.frame_step > 1 else frames
    return f, height // spatial, width // spatial


def _patch(spec: Any, config: Mapping[str, Any]) -> int:
    p = config.get("patch_size", 1) if spec.denoiser == "transformer" else 1
    return int(p[-1] if isinstance(p, (list, tuple)) else (p or 1))


def _denoise_peak(spec: Any, module: Any, dtype: Any, height: int, width: int, frames: int, guidance: bool) -> int:
    import torch

    cfg = module.config
    f, h, w = _latent_shape(spec, cfg, height, width, frames)
    b = CFG_BATCH.get(spec.family, 2) if guidance else 1
    meta = {"device": "meta", "dtype": dtype}
    with _counting() as live:
        t = torch.ones(b, **meta)
        if spec.family == "wan":
            x = torch.empty(b, cfg.in_channels, f, h, w, **meta)
            text = torch.empty(b, _text_len(spec), cfg.text_dim, **meta)
            extra = {}
            if cfg.get("image_dim"):
                extra["encoder_hidden_states_image"] = torch.empty(b, 257, cfg.image_dim, **meta)
            out = module(hidden_states=x, timestep=t, encoder_hidden_states=text, return_dict=False, **extra)
        elif spec.family == "ltx":
            p, pt = cfg.patch_size, cfg.patch_size_t
            x = torch.empty(b, (f // pt) * (h // p) * (w // p), cfg.in_channels, **meta)
            text = torch.empty(b, _text_len(spec), cfg.caption_channels, **meta)
            mask = torch.ones(b, _text_len(spec), device="meta", dtype=torch.long)
            out = module(hidden_states=x, encoder_hidden_states=text, timestep=t, encoder_attention_mask=mask,
                         num_frames=f // pt, height=h // p, width=w // p, rope_interpolation_scale=(1.0, 1.0, 1.0),
                         return_dict=False)
        elif spec.family == "cogvideox":
            x = torch.empty(b, f, cfg.in_channels, h, w, **meta)
            text = torch.empty(b, _text_len(spec), cfg.text_embed_dim, **meta)
            rope = None
            if cfg.get("use_rotary_positional_embeddings"):
                p = cfg.patch_size
                seq = f * (h // p) * (w // p) // int(cfg.get("patch_size_t") or 1)
                rope = (torch.empty(seq, cfg.attention_head_dim, device="meta"),) * 2
            out = module(hidden_states=x, encoder_hidden_states=text, timestep=t, image_rotary_emb=rope,
                         return_dict=False)
        elif spec.family == "hunyuan":
            x = torch.empty(b, cfg.in_channels, f, h, w, **meta)
            length = _text_len(spec)
            text = torch.empty(b, length, cfg.text_embed_dim, **meta)
            mask = torch.ones(b, length, device="meta", dtype=torch.long)
            pooled = torch.empty(b, cfg.pooled_projection_dim, **meta)
            out = module(hidden_states=x, timestep=t, encoder_hidden_states=text, encoder_attention_mask=mask,
                         pooled_projections=pooled, guidance=t * 1000 if cfg.get("guidance_embeds") else None,
                         return_dict=False)
        elif spec.family == "svd":
            x = torch.empty(b, frames, cfg.in_channels, h, w, **meta)
            text = torch.empty(b, 1, cfg.cross_attention_dim, **meta)
            ids = torch.empty(b, 3, **meta)
            out = module(x, t, encoder_hidden_states=text, added_time_ids=ids, return_dict=False)
        else:
            raise RecipeError(f"--plan: no denoiser inputs known for {spec.pipeline}")
        del out
    return live.peak


def _decode_peak(spec: Any, vae: Any, dtype: Any, den_config: Mapping[str, Any], height: int, width: int,
                 frames: int, chunk: int | None, cpu: bool = False) -> int:
    import torch

    f, h, w = _latent_shape(spec, den_config, height, width, frames)
    c = vae.config.latent_channels if "latent_channels" in vae.config else vae.config.z_dim
    meta = {"device": "meta", "dtype": dtype}
    with _counting(cpu) as live:
        if spec.family == "svd":
            z = torch.empty(frames, c, h, w, **meta)
            n = chunk or frames
            outs = []
            for i in range(0, frames, n):  # the pipeline's decode_latents loop; frames go to the CPU as float32
                part = vae.decode(z[i:i + n], num_frames=min(n, frames - i)).sample
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
    with _counting() as live:
        out = module(pixel_values=pixels, output_hidden_states=True)
        del out
    return live.peak


def _vae_encode_shape(spec: Any, height: int, width: int, frames: int) -> tuple[int, ...]:
    """What each image-to-video pipeline hands ``vae.encode``: SVD the image alone (pipeline_stable_video_diffusion.py
    `_encode_vae_image`); Wan I2V the image followed by frames-1 zero frames (pipeline_wan_i2v.py `prepare_latents`,
    ``video_condition``); LTX and CogVideoX I2V the image as a 1-frame video (pipeline_ltx_image2video.py and
    pipeline_cogvideox_image2video.py `prepare_latents`)."""
    if spec.family == "svd":
        return 1, 3, height, width
    return 1, 3, frames if spec.family == "wan" else 1, height, width


def _vae_encode_peak(spec: Any, vae: Any, dtype: Any, height: int, width: int, frames: int, cpu: bool) -> int:
    import torch

    image = torch.empty(*_vae_encode_shape(spec, height, width, frames), device="meta", dtype=dtype)  # made before
    with _counting(cpu) as live:
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


def pipeline_recipe(spec: Any, index: Mapping[str, Any]) -> Any:
    """The recipe ``load_pipeline`` uses for a video pipeline: the shipped one for its class, else the composed one.

    Example:
        >>> from hf_precision.apps.video import model_spec
        >>> from hf_precision.runtime.source import configs_of
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> pipeline_recipe(spec, configs_of(where)[1])
        'svd'
    """
    from ..recipe.catalog import recipe_for
    from ..runtime.source import models_of_index

    return recipe_for(spec.pipeline, lambda: models_of_index(index))  # the one load_pipeline composes (runtime/load.py)


def _build_model(where: str, spec: Any, layout: Any, overrides: Any = None) -> _Model:
    from .. import dtypes as dt
    from ..diagnose.planner import plan
    from ..runtime.source import configs_of

    _, index, configs = configs_of(where)
    p = plan(where, device=layout, recipe=pipeline_recipe(spec, index), overrides=overrides)
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
    for name, module in modules.items():
        if name.startswith("text_encoder"):
            # HunyuanVideo's Llama reads the prompt template too: 95 tokens cropped after encoding
            length = 77 if "CLIP" in type(module).__name__ else _text_len(spec) + (95 if spec.family == "hunyuan" else 0)
            text[name] = _text_peak(module, length)
    return _Model(spec=spec, plan=p, modules=modules, dtypes=dtypes, text=text, leaf=leaf, loose=loose,
                  cpu=p.recipe.device.type == "cpu")


def _weights(model: _Model, quantize: tuple[tuple[str, str], ...] = ()) -> dict[str, int]:
    """Weight bytes per component, with the storage a quantized candidate gives some of them (exact, as plan counts)."""
    import dataclasses as dc

    from ..runtime.layout import planned_bytes

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
    vae = model.modules["vae"]
    if hasattr(vae, "enable_tiling"):
        (vae.enable_tiling if settings.vae_tiling else vae.disable_tiling)()
    phases: dict[str, int] = {}
    text_names = [n for n in model.modules if n.startswith("text_encoder")]
    if text_names:
        phases["text encoding"] = max(_resident(model, [n], settings.offload, settings.quantize) + model.text[n] for n in text_names)
    if spec.takes_image and spec.family in ("svd", "wan", "ltx", "cogvideox"):
        image = []
        if "image_encoder" in model.modules:
            key = ("image encoder",)
            if key not in model.cache:
                model.cache[key] = _image_encoder_peak(model.modules["image_encoder"], model.dtypes["image_encoder"])
            image.append(_resident(model, ["image_encoder"], settings.offload, settings.quantize) + model.cache[key])
        key = ("vae encode", settings.vae_tiling, height, width, frames)
        if key not in model.cache:
            model.cache[key] = _vae_encode_peak(spec, vae, model.dtypes["vae"], height, width, frames, model.cpu)
        image.append(_resident(model, ["vae"], settings.offload, settings.quantize) + model.cache[key])
        phases["image encoding"] = max(image)
    key = ("denoise", settings.forward_chunking, height, width, frames, guidance)
    if key not in model.cache:
        model.cache[key] = _denoise_peak(spec, den, model.dtypes[spec.denoiser], height, width, frames, guidance)
    act = model.cache[key]
    phases["denoising"] = _resident(model, [spec.denoiser, "transformer_2"], settings.offload, settings.quantize) + act
    key = ("decode", settings.vae_tiling, settings.decode_chunk_size, height, width, frames)
    if key not in model.cache:
        model.cache[key] = _decode_peak(spec, vae, model.dtypes["vae"], den.config, height, width, frames,
                                        settings.decode_chunk_size, model.cpu)
    dec = model.cache[key]
    phases["VAE decode"] = _resident(model, ["vae"], settings.offload, settings.quantize) + dec
    return Prediction(settings=settings, phases=phases, weights=_weights(model, settings.quantize))


def predict(where: str, spec: Any, *, layout: Any, height: int, width: int, frames: int,
            settings: MemorySettings | None = None, overrides: Any = None, guidance: bool = True) -> Prediction:
    """Predicted peak memory per phase of one clip, from configs on the meta device (no weights, no GPU).

    Example:
        >>> from hf_precision.apps.video import model_spec
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> p = predict(where, spec, layout="t4", height=256, width=256, frames=14,
        ...             settings=MemorySettings(decode_chunk_size=2))
        >>> sorted(p.phases), p.peak > p.weights["unet"]
        (['VAE decode', 'denoising', 'image encoding'], True)
    """
    model = _load_model(where, spec, layout, overrides)
    return _predict(model, settings or MemorySettings(), height=height, width=width, frames=frames,
                    guidance=guidance)


# --------------------------------------------------------------------------------------------- choosing


def quantize_options(model: _Model) -> list[tuple[tuple[str, str], ...]]:
    """Quantized storage the video plan may choose (:func:`hf_precision.recipe.quantize.storage_options`)."""
    from ..recipe.devices import device_caps
    from ..recipe.quantize import storage_options

    present = [n for n in model.plan.components if n in model.modules]  # Wan 2.1 has no transformer_2
    texts = [n for n in present if n.startswith("text_encoder")]
    recipe = model.plan.recipe
    return storage_options(recipe, [d for d in (model.spec.denoiser, "transformer_2") if d in present], texts,
                           device_caps(recipe.device).storage)


def _candidates(spec: Any, accelerator: bool, decode_chunk: int | None,
                quantize: list[tuple[tuple[str, str], ...]] = ()) -> list[MemorySettings]:
    """Settings from fastest to slowest: whole-model offload moves each component once per phase, quantized storage
    costs a dequantization per layer and call, group/sequential offload move weights every step; tiling and
    chunking cost little."""
    chunks = [decode_chunk or 8, 4, 2, 1] if spec.family == "svd" else [None]
    offloads = ["none", "model", "group", "sequential"] if accelerator else ["none"]
    order = [(o, ()) for o in offloads[:2]] + [(o, q) for q in quantize for o in offloads[:2]]
    order += [(o, q) for o in offloads[2:] for q in ((), *quantize)]
    out = []
    for offload, quant in order:
        for tiling in (False, True):
            for chunk in chunks:
                for ff in ((False, True) if spec.family == "svd" else (False,)):
                    if spec.family == "svd" and tiling:
                        continue  # SVD's temporal decoder has no tiling; its decode chunk does that job
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

    @property
    def settings(self) -> MemorySettings:
        return self.prediction.settings

    def describe(self) -> str:
        p = self.prediction
        head = ("chosen" if self.fits else "nothing fits; least memory") + f" for {_gb(self.budget)}: {p.settings.label()}"
        return f"{head}; predicted peak {_gb(p.peak)} (" + ", ".join(f"{k} {_gb(v)}" for k, v in p.phases.items()) + ")"


def size_text(n: int) -> str:
    """A byte count for people: GB from 0.1 GB up, MiB below.

    Example:
        >>> size_text(12 * 10**9), size_text(3 * 2**20)
        ('12.00 GB', '3.0 MiB')
    """
    return f"{n / 1e9:.2f} GB" if n >= 1e8 else f"{n / 2**20:.1f} MiB"


_gb = size_text


def choose(where: str, spec: Any, *, layout: Any, budget: int, height: int, width: int, frames: int,
           accelerator: bool = True, decode_chunk: int | None = None, overrides: Any = None,
           quantize: bool = True) -> Choice:
    """The fastest settings whose predicted peak fits ``budget`` bytes (else the one with the least memory).

    Quantized storage (``quantize=False`` leaves it out) is considered beside offload and tiling, among the layouts
    the component recipes tolerate on the device; the chosen one is loaded as ``--set C.storage=...``.

    Example:
        >>> from hf_precision.apps.video import model_spec
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
            return Choice(prediction=p, budget=budget, fits=True, tried=tried)
    return Choice(prediction=min(tried, key=lambda p: p.peak), budget=budget, fits=False, tried=tried)


def _accelerator(layout: Any) -> bool:
    from ..recipe.devices import device_profile

    return device_profile(layout).type != "cpu"


def choose_for_args(where: str, spec: Any, args: Any, device: Any) -> Choice:
    """The choice for parsed CLI arguments (``--max-memory``, ``--layout``/``--device``, sizes)."""
    layout = args.layout or device
    budget = parse_size(args.max_memory) if args.max_memory else free_memory(device)
    return choose(where, spec, layout=layout, budget=budget, height=args.height, width=args.width,
                  frames=args.frames, accelerator=_accelerator(layout), decode_chunk=args.decode_chunk_size)


def print_plan(where: str, spec: Any, args: Any) -> int:
    """``--plan``: weights per component, the predicted peak per phase, and the settings for the budget."""
    from ..recipe.devices import device_profile

    layout = args.layout or args.device or str(device_profile(None).torch_device())
    if args.max_memory:
        budget = parse_size(args.max_memory)
    elif args.device is not None and not device_profile(args.device).present:
        # A preset (t4) or a description plans for a device that is not here: its free memory cannot be read.
        raise RecipeError(f"--plan --device {args.device}: {device_profile(args.device).label()} is not on this machine, "
                          f"so its free memory is unknown; give the budget: --max-memory SIZE (e.g. --max-memory 16GB "
                          f"for a 16 GB card)")
    else:
        budget = free_memory(args.device or "cpu")
    choice = choose(where, spec, layout=layout, budget=budget, height=args.height, width=args.width,
                    frames=args.frames, accelerator=_accelerator(layout), decode_chunk=args.decode_chunk_size)
    p = choice.prediction
    print(f"plan: {spec.pipeline} ({spec.mode}) for {device_profile(layout).label()}, {args.width}x{args.height}, "
          f"{args.frames} frames (configs on the meta device, no weights)")
    print("weights: " + ", ".join(f"{n} {_gb(b)}" for n, b in p.weights.items()) + f"; total {_gb(sum(p.weights.values()))}")
    print(f"{'settings':58} " + " ".join(f"{k:>15}" for k in p.phases) + f" {'peak':>10}")
    for t in choice.tried:
        print(f"{t.settings.label():58} " + " ".join(f"{_gb(v):>15}" for v in t.phases.values()) + f" {_gb(t.peak):>10}")
    print(choice.describe())
    return 0
