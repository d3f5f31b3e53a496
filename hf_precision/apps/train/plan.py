"""``hf-precision train --plan``: the peak memory of a training run, predicted from the configs without weights.

Per phase:
- **encode** (cache filling, or every batch without a cache): the frozen VAE and text encoders' weights plus the
  activation peak of one batch through the VAE encoder.
- **train step**: resident weights (every component, or only the denoiser once latents and text embeddings are
  cached and the encoders leave the device) + trainable fp32 masters + their gradients + AdamW's two fp32 moments +
  the activation peak of one forward and backward of the denoiser.

Weights come from :func:`hf_precision.plan` (each parameter in the dtype the recipe gives it on the device; a
quantized storage such as ``--set unet.storage=int8`` counted exactly as its backend stores it).
Activations are counted by running the training step of the denoiser on torch's ``meta`` device with autograd on
(:func:`hf_precision.apps.video.counting.count_live_bytes`): what the forward saves for backward stays alive until
backward frees it, and backward's gradients are added. The call is built by the training layer's family row and
the LoRA injected by the layer's own functions, so the count follows the code path of the real step (gradient
checkpointing changes what is saved, and is counted as such).

:func:`choose` takes the first of these settings, cheapest in speed first, whose peak fits ``--max-memory``: as
asked; cached latents (encoders leave the device); + gradient checkpointing; then halved batch sizes.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator, Mapping
from typing import Any

from ...errors import RecipeError

__all__ = ["Options", "TrainingPrediction", "predict_training", "choose", "plan_command", "text_tokens", "held_fp8_copies"]

ADAM_STATES = 2  # exp_avg and exp_avg_sq, fp32 each (torch.optim.AdamW)


@dataclasses.dataclass(frozen=True)
class Options:
    """The settings a plan may change."""

    batch_size: int
    gradient_checkpointing: bool
    cached: bool

    def describe(self) -> str:
        cache = ("cached latents and text embeddings (VAE and text encoders off the device while training)"
                 if self.cached else "encoders stay on the device and encode every batch")
        return f"batch size {self.batch_size}, gradient checkpointing {'on' if self.gradient_checkpointing else 'off'}, {cache}"


@dataclasses.dataclass
class TrainingPrediction:
    """Predicted bytes for one set of options: the parts of the training step and the peak of each phase."""

    options: Options
    weights: dict[str, int]
    trainable_params: int
    masters: int
    grads: int
    optimizer: int
    activations: int
    encode_activations: int
    phases: dict[str, int]
    storage: dict[str, str] = dataclasses.field(default_factory=dict)  # the quantized components' layouts
    fp8_copies: int = 0  # of the activations: compute-dtype copies of fp8-stored weights held for backward

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        """The phase whose figure is the peak (encode: every weight on the device while the cache fills)."""
        return max(self.phases, key=lambda phase: self.phases[phase])

    def verdict(self, budget: int | None) -> str:
        """The peak, the phase that sets it, and whether it fits ``budget``: one line, from the same numbers."""
        line = f"{size_text(self.peak)} ({self.peak_phase})"
        if budget is None:
            return line
        return f"{line} {'fits in' if self.peak <= budget else 'does NOT fit in'} {size_text(budget)}"


def size_text(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


def text_tokens(index: Mapping[str, Any]) -> int:
    """Text tokens the denoiser attends to: CLIP pads to 77; T5/UMT5/Gemma/Llama pipelines pad to at most 512 (Flux
    and Wan 512, SD3 333 (77+256), PixArt/Sana 300): 512 bounds them from above."""
    from ...runtime.source import listed_components

    encoders = [cls for name, (_, cls) in listed_components(index).items() if name.startswith("text_encoder")]
    return 77 if encoders and all(c.startswith("CLIP") for c in encoders) else 512


def meta_module(index: Mapping[str, Any], configs: Mapping[str, Any], name: str, dtype: Any) -> Any:
    from ...diagnose.planner import build_on_meta
    from ...runtime.source import listed_components

    return build_on_meta(*listed_components(index)[name], configs[name], dtype)


def _cast(value: Any, dtype: Any, key: str = "") -> Any:
    import torch

    if isinstance(value, dict):
        return {k: _cast(v, dtype, k) for k, v in value.items()}
    if torch.is_tensor(value) and value.is_floating_point() and key not in ("timestep", "timesteps", "guidance"):
        return value.to(dtype)
    return value


@contextlib.contextmanager
def held_fp8_copies() -> Iterator[dict[int, int]]:
    """Count the compute-dtype copies of fp8 weights that autograd saves for backward: storage -> bytes.

    An fp8-stored layer that gradients pass through computes from ``weight.to(compute)``
    (:func:`hf_precision.runtime.patches.upcast_on_use`); autograd saves that copy for the input's gradient (a
    Linear's or Conv's weight is saved when its input requires grad), so it lives until backward frees it. The
    copies are the outputs of ``_to_copy`` from a float8 tensor (activations never are float8); a saved tensor on
    one of their storages (the copy, or its transpose) is held. Works on the meta device and on real tensors.

    Example:
        >>> import torch
        >>> w = torch.ones(4, 4, dtype=torch.float8_e4m3fn)
        >>> x = torch.ones(2, 4, requires_grad=True)
        >>> with held_fp8_copies() as held:
        ...     y = torch.nn.functional.linear(x, w.to(torch.float32))
        >>> sum(held.values())  # the 4 x 4 fp32 copy: 64 bytes, until backward
        64
    """
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    from ...dtypes import FLOAT8

    fp8 = tuple(getattr(torch, d) for d in FLOAT8)
    copies: dict[int, Any] = {}
    held: dict[int, int] = {}

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and args[0].dtype in fp8 and isinstance(out, torch.Tensor):
                copies[out.untyped_storage()._cdata] = weakref.ref(out)
            return out

    def pack(t: Any) -> Any:
        key = t.untyped_storage()._cdata
        ref = copies.get(key)
        if ref is not None and ref() is not None:  # alive: not a later tensor on a reused address
            held[key] = t.untyped_storage().nbytes()
        return t

    with Copies(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield held


def _step_activations(module: Any, batch: Mapping[str, Any], objective: str, checkpointing: bool,
                      dtype: Any) -> tuple[int, int]:
    """Activation peak (bytes) of one training forward + backward of ``module`` on meta, gradients excluded, and
    the bytes of the fp8 weight copies held for backward within it (:func:`held_fp8_copies`)."""
    import torch

    from ...training.families import family_of, model_output, noisy_inputs
    from ..video.counting import count_live_bytes, with_values

    if checkpointing:
        if not getattr(module, "_supports_gradient_checkpointing", False):
            raise RecipeError(f"--gradient-checkpointing: {type(module).__name__} does not support it")
        module.enable_gradient_checkpointing()
    module.train()
    row = family_of(module)
    meta = {k: with_values(v) if torch.is_tensor(v) else v for k, v in batch.items()}  # masks keep their values
    meta["timesteps"] = torch.zeros(next(iter(meta.values())).shape[0], dtype=torch.long, device="meta")
    with count_live_bytes(grad=True) as live, held_fp8_copies() as held:
        kwargs, target = noisy_inputs(row, module, meta, objective, torch.ones(1000, device="meta"))
        kwargs = _cast(kwargs, dtype)  # what the layer's boundary hooks do at the denoiser's entry
        out = module(**kwargs, return_dict=False)
        loss = torch.nn.functional.mse_loss(model_output(out, target, row).float(), target.float())
        del out, kwargs, target
        copies = sum(held.values())
        loss.backward()
        del loss
    grads = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return max(live.peak - grads, 0), copies  # gradients are counted once, below, with the optimizer


def _store_fp8(module: Any, plan: Any) -> None:
    """Store ``module`` (meta) as the loader stores an fp8 ``plan`` (diffusers' layerwise casting, islands and the
    recipe's skips kept), so the training step on meta computes from upcast copies as the real one does."""
    from ...dtypes import to_torch
    from ...runtime import patches
    from ...runtime.layout import component_islands, layerwise_skip_regexes

    islands = component_islands(plan, module, strict=False)
    patches.store_layerwise(module, to_torch(plan.storage), to_torch(plan.compute),
                            layerwise_skip_regexes(islands, plan.layerwise_skip))


def make_trainable(module: Any, method: str, rank: int) -> int:
    """Make ``module`` trainable as prepare_training would; returns the trainable parameter count."""
    import torch

    from ...training.trainable import default_targets, inject_lora, make_masters

    if method == "lora":
        from peft import LoraConfig

        inject_lora("denoiser", module, LoraConfig(r=rank, lora_alpha=rank, target_modules=default_targets(module),
                                                   init_lora_weights="gaussian"))
    # A full fine-tune computes under autocast from its fp32 masters; meta has no autocast, so the meta module keeps
    # the compute dtype its activations are made in (the masters are counted apart, at 4 bytes each).
    return make_masters(module, method, torch.float32 if method != "full" else next(module.parameters()).dtype)


def _vae_encode_activations(index: Mapping[str, Any], configs: Mapping[str, Any], dtype: Any, batch: int,
                            resolution: int, frames: int) -> int:
    import torch

    from ...training.data import vae_latents
    from ..video.counting import count_live_bytes

    if "vae" not in index or "vae" not in configs:
        return 0
    vae = meta_module(index, configs, "vae", dtype).eval()
    shape = (batch, 3, frames, resolution, resolution) if frames > 1 else (batch, 3, resolution, resolution)
    pixels = torch.empty(*shape, device="meta", dtype=dtype)
    with count_live_bytes() as live:
        out = vae_latents(vae, pixels)  # what train encodes with: folded frames, .latent_dist or .latent
        del out
    return live.peak


@dataclasses.dataclass
class _Model:
    index: dict[str, Any]
    configs: dict[str, Any]
    plan: Any
    denoiser: str
    objective: str
    factor: int
    frame_step: int
    geometry: Any = None  # the size rules and limits `train` checks (apps/train/data.py ModelGeometry)


def planned_model(model: str, device: Any, overrides: Any) -> _Model:
    from ...diagnose.planner import plan as hp_plan
    from ...runtime.source import configs_of
    from ...training.families import objective_of
    from .data import model_geometry

    _, index, configs = configs_of(model)
    p = hp_plan(model, device=device, overrides=overrides)
    denoiser = p.recipe.denoiser if getattr(p.recipe, "denoiser", None) else (
        "transformer" if "transformer" in index else "unet")
    sched = index.get("scheduler") or [None, ""]
    objective = objective_of(configs.get("scheduler", {}), str(sched[1]))
    geo = model_geometry(str(index.get("_class_name")), index, configs)
    if geo.video:  # the geometry's multiple is VAE factor x patch size
        patch = int(_last(configs.get(denoiser, {}).get("patch_size", 1))) if denoiser == "transformer" else 1
        factor = geo.multiple // patch
    else:
        factor = 2 ** (len(configs.get("vae", {}).get("block_out_channels") or [0] * 4) - 1)
    return _Model(index, configs, p, denoiser, objective, factor, geo.frame_step, geo)


def _first(value: Any) -> int:
    return int(value[0] if isinstance(value, (list, tuple)) else value)


def _last(value: Any) -> int:
    return int(value[-1] if isinstance(value, (list, tuple)) else (value or 1))


def predict_training(model: str, device: Any, *, method: str = "lora", rank: int = 16, resolution: int = 512,
                     frames: int = 0, options: Options, overrides: Any = None, _cached_model: _Model | None = None
                     ) -> TrainingPrediction:
    """Predict the peak bytes of a training run of ``model`` on ``device`` (a preset such as ``t4`` needs no GPU).

    Example:
        >>> p = predict_training("sd15", "t4", rank=4, resolution=256, options=Options(1, False, True))
        >>> p.trainable_params > 0 and p.phases["train step"] > p.weights["unet"]
        True
    """
    import torch

    from ...dtypes import FLOAT8
    from ...recipe.quantize import is_quantized
    from ...training.families import example_batch

    m = _cached_model or planned_model(model, device, overrides)
    den = m.plan.components[m.denoiser]
    if method == "full":  # the training layer's one rule, as `train` without --plan applies it before loading
        from ...training.quantized import refuse_untrainable

        refuse_untrainable(m.plan.recipe, {m.denoiser: "full"}, m.denoiser)
    compute = getattr(torch, den.compute)
    module = meta_module(m.index, m.configs, m.denoiser, compute)
    fp8 = den.storage in FLOAT8
    if fp8:  # stored as loaded; the LoRA's gradients pass through it as in training.quantized.upcast_fp8
        _store_fp8(module, m.plan.recipe[m.denoiser])
    trainable = make_trainable(module, method, rank)
    if fp8:
        from ...runtime.patches import upcast_on_use

        upcast_on_use(module, compute)
    side = resolution // m.factor
    latent_frames = (frames - 1) // m.frame_step + 1 if frames > 1 else 1
    batch = example_batch(module, options.batch_size, side=side, frames=latent_frames, tokens=text_tokens(m.index))
    activations, copies = _step_activations(module, batch, m.objective, options.gradient_checkpointing, compute)
    weights = {n: c.total_bytes for n, c in m.plan.components.items()}
    frozen_den = weights[m.denoiser] - (den.total_bytes * trainable // max(den.params, 1) if method == "full" else 0)
    masters = trainable * 4
    grads = trainable * 4
    optimizer = trainable * 4 * ADAM_STATES
    encoders = sum(v for n, v in weights.items() if n != m.denoiser)
    resident = frozen_den + (0 if options.cached else encoders)
    vae_dtype = getattr(torch, m.plan.components["vae"].compute) if "vae" in m.plan.components else compute
    encode = _vae_encode_activations(m.index, m.configs, vae_dtype, options.batch_size, resolution, frames)
    # Encoding (the cache pass before step 1, or every batch without a cache) runs with every component on the device.
    phases = {"encode": sum(weights.values()) + masters + encode,
              "train step": resident + masters + grads + optimizer + activations}
    storage = {n: c.storage for n, c in m.plan.components.items() if is_quantized(c.storage)}
    return TrainingPrediction(options, weights, trainable, masters, grads, optimizer, activations, encode, phases,
                              storage, copies)


def choose(model: str, device: Any, budget: int, *, method: str, rank: int, resolution: int, frames: int,
           batch_size: int, gradient_checkpointing: bool, cached: bool, overrides: Any = None
           ) -> tuple[TrainingPrediction, list[TrainingPrediction]]:
    """The first prediction that fits ``budget``, cheapest in speed first; and every one tried."""
    m = planned_model(model, device, overrides)
    tried = []
    sizes = [batch_size]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    candidates = [Options(batch_size, gradient_checkpointing, cached)]
    for b in sizes:
        candidates += [Options(b, gradient_checkpointing, True), Options(b, True, True)]
    seen = set()
    for opt in candidates:
        if opt in seen:
            continue
        seen.add(opt)
        pred = predict_training(model, device, method=method, rank=rank, resolution=resolution, frames=frames,
                                options=opt, overrides=overrides, _cached_model=m)
        tried.append(pred)
        if pred.peak <= budget:
            return pred, tried
    return min(tried, key=lambda p: p.peak), tried


def print_prediction(pred: TrainingPrediction, budget: int | None) -> None:
    """The plan as the command prints it."""
    print(f"settings: {pred.options.describe()}")
    print("weights (as the recipe stores them): " + ", ".join(
        f"{n} {size_text(b)}" + (f" ({pred.storage[n]}, backend bytes)" if n in pred.storage else "")
        for n, b in pred.weights.items()))
    print(f"trainable: {pred.trainable_params:,} parameters: fp32 masters {size_text(pred.masters)}, gradients "
          f"{size_text(pred.grads)}, AdamW state {size_text(pred.optimizer)}")
    print(f"activations: train step {size_text(pred.activations)} (forward + backward), VAE encode "
          f"{size_text(pred.encode_activations)}")
    if pred.fp8_copies:
        print(f"  of which fp8 weight copies held for backward: {size_text(pred.fp8_copies)} (the fp8 layers compute "
              f"from upcast copies; autograd keeps those on the gradient's path until backward)")
    for phase, peak in pred.phases.items():
        print(f"  {phase:<11} peak {size_text(peak)}")
    print(f"predicted peak: {pred.verdict(budget)}")


def plan_command(args: Any, overrides: Any = None) -> int:
    """``hf-precision train --plan``: print the prediction and the settings chosen for ``--max-memory``."""
    from ...units import parse_size

    if not args.model:
        raise RecipeError("--plan: give --model (a folder, a Hub id whose configs ship, or an alias such as sdxl, flux)")
    device = args.layout or args.device or "cuda"
    method = args.method or ("embedding" if args.embedding else "lora")
    if method == "embedding":
        raise RecipeError("--plan: textual inversion trains a few embedding rows; its memory is the model's weights "
                          "(hf-precision plan MODEL --device DEVICE); plan lora or full instead")
    m = planned_model(args.model, device, overrides)
    resolution = args.resolution or m.geometry.default_resolution(_first(m.configs.get("vae", {}).get("sample_size")
                                                                         or 512))
    m.geometry.buckets(resolution, args.frames)  # the sizes `train` takes, refused as it refuses them
    frames = args.frames or m.geometry.fixed_frames  # none given: one frame, or the one count a model takes
    budget = parse_size(args.max_memory) if args.max_memory else None
    print(f"training plan: {args.model} ({m.plan.pipeline}), {method}"
          f"{f' rank {args.lora_rank}' if method == 'lora' else ''}, {resolution}px, for {device}; "
          f"{m.objective} objective")
    kwargs = dict(method=method, rank=args.lora_rank, resolution=resolution, frames=frames)
    if budget is None:
        pred = predict_training(args.model, device, options=Options(args.batch_size, args.gradient_checkpointing,
                                                                    args.cache), overrides=overrides,
                                _cached_model=m, **kwargs)
        print_prediction(pred, None)
        return 0
    pred, tried = choose(args.model, device, budget, batch_size=args.batch_size,
                         gradient_checkpointing=args.gradient_checkpointing, cached=args.cache,
                         overrides=overrides, **kwargs)
    for other in tried[:-1]:  # its phases too: a setting that did not fit is told apart by the phase that broke it
        phases = ", ".join(f"{phase} {size_text(peak)}" for phase, peak in other.phases.items())
        print(f"  tried {other.options.describe()}: {phases}; peak {other.verdict(budget)}")
    print_prediction(pred, budget)
    if pred.peak > budget:
        weights = sum(pred.weights.values())
        why = (f"the weights alone take {size_text(weights)}" if weights > budget else
               f"the smallest setting tried still needs {size_text(pred.peak)}")
        print(f"nothing tried fits {size_text(budget)}: {why}; lower --resolution, use a device with more memory, or a "
              f"smaller model")
        return 1
    flags = []
    if pred.options.gradient_checkpointing and not args.gradient_checkpointing:
        flags.append("--gradient-checkpointing")
    if pred.options.batch_size != args.batch_size:
        flags.append(f"--batch-size {pred.options.batch_size}")
    print("chosen: " + (" ".join(flags) if flags else "the settings as given") + " (the cache is on by default)")
    return 0
