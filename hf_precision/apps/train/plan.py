"""``hf-precision train --plan``: the peak memory of a training run, predicted from the configs without weights.

Phases: **encode** (every weight, plus one batch through the VAE encoder) and **train step** (resident weights:
every component, or the denoiser alone once the encoders' outputs are cached; fp32 masters, their gradients and
AdamW's two moments; one forward and backward of the denoiser). Weights come from :func:`hf_precision.plan`
(quantized storage counted as its backend stores it); activations from the step run on the ``meta`` device
(:func:`hf_precision.memory.train_step.step_activations`, :func:`hf_precision.memory.peaks.vae_encode_peak`).
:func:`choose` finds the first of :func:`options_ladder` that fits ``--max-memory``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...memory.peaks import meta_module
from ...units import format_bytes

__all__ = ["Options", "TrainingPrediction", "predict_training", "choose", "options_ladder", "planned_model",
           "text_tokens", "ADAM_STATES"]

ADAM_STATES = 2  # exp_avg and exp_avg_sq, fp32 each (torch.optim.AdamW)


@dataclasses.dataclass(frozen=True)
class Options:
    """The settings a plan may change."""

    batch_size: int
    gradient_checkpointing: bool
    cached: bool
    text_encoders: bool = False  # --train-text-encoder: LoRA on every text encoder, encoded every step with autograd

    def describe(self) -> str:
        if self.text_encoders:  # apps/train/batches.py: a text encoder that trains is never read from the cache
            cache = ("cached latents (VAE off the device while training); the text encoders train (LoRA) and encode "
                     "every batch" if self.cached else
                     "encoders stay on the device and encode every batch; the text encoders train (LoRA)")
        else:
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
    text_held: int = 0  # of the activations: what the trained text encoders' forward holds for backward

    @property
    def peak(self) -> int:
        return max(self.phases.values())

    @property
    def peak_phase(self) -> str:
        """The phase whose figure is the peak (encode: every weight on the device while the cache fills)."""
        return max(self.phases, key=lambda phase: self.phases[phase])

    def verdict(self, budget: int | None) -> str:
        """The peak, the phase that sets it, and whether it fits ``budget``: one line, from the same numbers."""
        line = f"{format_bytes(self.peak, binary=True)} ({self.peak_phase})"
        if budget is None:
            return line
        return f"{line} {'fits in' if self.peak <= budget else 'does NOT fit in'} {format_bytes(budget, binary=True)}"

    def label(self) -> str:
        return self.options.describe()

    def details(self) -> str:
        return "predicted peak " + self.verdict(None)


def text_tokens(index: Mapping[str, Any]) -> int:
    """Text tokens the denoiser attends to: CLIP pads to 77; T5/UMT5/Gemma/Llama pipelines pad to at most 512 (Flux
    and Wan 512, SD3 333 (77+256), PixArt/Sana 300): 512 bounds them from above."""
    from ...runtime.source import listed_components

    encoders = [cls for name, (_, cls) in listed_components(index).items() if name.startswith("text_encoder")]
    return 77 if encoders and all(c.startswith("CLIP") for c in encoders) else 512


@dataclasses.dataclass
class PlannedModel:
    """A model's configs and plan, with what the training plan reads from them (denoiser, objective, latent geometry)."""

    index: dict[str, Any]
    configs: dict[str, Any]
    plan: Any
    denoiser: str
    objective: str
    geometry: Any  # the latent factors, size rules and limits `train` checks (apps/train/data.py ModelGeometry)
    # predict_training's results by arguments: the per-rank ladder asks the same meta step (~10 s for Flux) twice
    predictions: dict[tuple[Any, ...], TrainingPrediction] = dataclasses.field(default_factory=dict, repr=False,
                                                                              compare=False)


def planned_model(model: str, device: Any, overrides: Any) -> PlannedModel:
    """The configs and plan of ``model`` on ``device`` (meta device, no weights), read once for every prediction.

    Example:
        >>> m = planned_model("sd15", "t4", None)
        >>> m.denoiser, m.objective, m.geometry.vae_factor
        ('unet', 'epsilon', 8)
    """
    from ...diagnose.planner import plan as hp_plan
    from ...runtime.source import configs_of
    from ...training.objectives import objective_of
    from .data import model_geometry

    _, index, configs = configs_of(model)
    p = hp_plan(model, device=device, overrides=overrides)
    denoiser = p.recipe.denoiser if getattr(p.recipe, "denoiser", None) else (
        "transformer" if "transformer" in index else "unet")
    sched = index.get("scheduler") or [None, ""]
    objective = objective_of(configs.get("scheduler", {}), str(sched[1]))
    return PlannedModel(index, configs, p, denoiser, objective,
                        model_geometry(str(index.get("_class_name")), index, configs))


def predict_training(model: str, device: Any, *, method: str = "lora", rank: int = 16, resolution: int = 512,
                     frames: int = 0, options: Options, overrides: Any = None, _cached_model: PlannedModel | None = None
                     ) -> TrainingPrediction:
    """Predict the peak bytes of a training run of ``model`` on ``device`` (a preset such as ``t4`` needs no GPU).

    Example:
        >>> p = predict_training("sd15", "t4", rank=4, resolution=256, options=Options(1, False, True))
        >>> p.trainable_params > 0 and p.phases["train step"] > p.weights["unet"]
        True
    """
    m = _cached_model or planned_model(model, device, overrides)
    key = (method, rank, resolution, frames, options)
    if key not in m.predictions:
        m.predictions[key] = _predict(m, method, rank, resolution, frames, options)
    return m.predictions[key]


def _predict(m: PlannedModel, method: str, rank: int, resolution: int, frames: int, options: Options
             ) -> TrainingPrediction:
    """predict_training on a planned model (its uncached body)."""
    import torch

    from ...dtypes import FLOAT8
    from ...memory.train_step import make_trainable, reads_values, step_activations, store_fp8
    from ...recipe.quantize import is_quantized
    from ...training.denoiser_rows import example_batch
    from ...training.methods import method_of
    from ...training.quantized import refuse_untrainable
    from .references import edits_images

    den = m.plan.components[m.denoiser]

    # the training layer's one rule, as `train` without --plan applies it before loading
    refuse_untrainable(m.plan.recipe, {m.denoiser: method}, m.denoiser)
    compute = getattr(torch, den.compute)
    module = meta_module(m.index, m.configs, m.denoiser, compute)
    fp8 = den.storage in FLOAT8
    if fp8:  # stored as loaded; the LoRA's gradients pass through it as in training.quantized.upcast_fp8
        store_fp8(module, m.plan.recipe[m.denoiser])
    trainable = make_trainable(module, method, rank)
    if fp8:
        from ...runtime.patches import upcast_on_use

        upcast_on_use(module, compute)
    side = resolution // m.geometry.vae_factor
    latent_frames = (frames - 1) // m.geometry.frame_step + 1 if frames > 1 else 1
    from .animate import animates

    # Wan Animate's latents carry the reference's frame before the clip's (training.inputs.wan_animate_reference)
    latent_frames += 1 if animates(m.geometry.pipeline) else 0
    batch = example_batch(module, options.batch_size, side=side, frames=latent_frames, tokens=text_tokens(m.index))
    if edits_images(m.index):  # an edit model trains on a reference image a target's size: its tokens join the sequence
        batch["reference_latents"] = torch.empty_like(batch["latents"])
    try:
        activations, copies = step_activations(module, batch, m.objective, options.gradient_checkpointing, compute)
    except (RuntimeError, NotImplementedError) as err:
        if not reads_values(err):
            raise
        # a forward reading its tensors' values cannot run on the meta device without a stand-in (memory.stand_ins)
        from ...errors import RecipeError

        raise RecipeError(f"--plan: {type(module).__name__} reads values of its own tensors in forward ({err}), so "
                          f"its training step cannot be counted on the meta device; run train without --plan on a "
                          f"few --steps to measure it") from None
    text_trainable, text_held = _text_encoder_parts(m, rank, options) if options.text_encoders else (0, 0)
    trainable += text_trainable
    activations += text_held
    weights = {n: c.total_bytes for n, c in m.plan.components.items()}
    # the denoiser's own weights that train become masters (counted below), no longer frozen storage
    owned = den.total_bytes * (trainable - text_trainable) // max(den.params, 1) if method_of(method).every_weight else 0
    frozen_den = weights[m.denoiser] - owned
    masters = trainable * 4
    grads = trainable * 4
    optimizer = trainable * 4 * ADAM_STATES
    encoders = sum(v for n, v in weights.items() if n != m.denoiser)
    # cached, the VAE and frozen text encoders leave the device (apps/train/cache.py offload_encoders); trained ones stay
    texts = sum(v for n, v in weights.items() if n.startswith("text_encoder")) if options.text_encoders else 0
    resident = frozen_den + (texts if options.cached else encoders)
    vae_dtype = getattr(torch, m.plan.components["vae"].compute) if "vae" in m.plan.components else compute
    encode = _encode_activations(m, vae_dtype, options.batch_size, resolution, frames)
    # Encoding (the cache pass before step 1, or every batch without a cache) runs with every component on the device.
    phases = {"encode": sum(weights.values()) + masters + encode,
              "train step": resident + masters + grads + optimizer + activations}
    storage = {n: c.storage for n, c in m.plan.components.items() if is_quantized(c.storage)}
    return TrainingPrediction(options, weights, trainable, masters, grads, optimizer, activations, encode, phases,
                              storage, copies, text_held)


def _text_encoder_parts(m: PlannedModel, rank: int, options: Options) -> tuple[int, int]:
    """The text encoders as ``train --train-text-encoder`` trains them: their LoRA's trainable parameters (the
    training layer's own injection, training.methods.lora) and the bytes their forward on one batch of captions
    holds for backward (:func:`hf_precision.memory.train_step.text_encoder_held`)."""
    import torch

    from ...memory.train_step import make_trainable, text_encoder_held

    trainable = held = 0
    for name in [n for n in m.plan.components if n.startswith("text_encoder")]:
        module = meta_module(m.index, m.configs, name, getattr(torch, m.plan.components[name].compute))
        trainable += make_trainable(module, "lora", rank)
        # --gradient-checkpointing checkpoints the denoiser alone (apps/train/prepare.py): the encoders save it all
        held += text_encoder_held(module, options.batch_size, text_tokens(m.index))
    return trainable, held


def _encode_activations(m: PlannedModel, dtype: Any, batch: int, resolution: int, frames: int) -> int:
    """The VAE encode of one batch, as train encodes it (folded frames, ``.latent_dist`` sampled or ``.latent``)."""
    from ...memory.peaks import vae_encode_peak
    from ...training.encode import vae_latents

    if "vae" not in m.index or "vae" not in m.configs:
        return 0
    vae = meta_module(m.index, m.configs, "vae", dtype).eval()
    shape = (batch, 3, frames, resolution, resolution) if frames > 1 else (batch, 3, resolution, resolution)
    return vae_encode_peak(vae, shape, dtype, encode=vae_latents)


def options_ladder(batch_size: int, gradient_checkpointing: bool, cached: bool, text_encoders: bool = False
                   ) -> list[Options]:
    """The settings to try, cheapest in speed first: as asked; cached; + gradient checkpointing; then halved batches
    (``text_encoders``, whether they train, is the run's choice and stays as given).

    Example:
        >>> [(o.batch_size, o.gradient_checkpointing, o.cached) for o in options_ladder(2, False, False)]
        [(2, False, False), (2, False, True), (2, True, True), (1, False, True), (1, True, True)]
    """
    sizes = [batch_size]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    candidates = [Options(batch_size, gradient_checkpointing, cached, text_encoders)]
    for b in sizes:
        candidates += [Options(b, gradient_checkpointing, True, text_encoders), Options(b, True, True, text_encoders)]
    return list(dict.fromkeys(candidates))


def choose(model: str, device: Any, budget: int, *, method: str, rank: int, resolution: int, frames: int,
           batch_size: int, gradient_checkpointing: bool, cached: bool, overrides: Any = None,
           text_encoders: bool = False) -> tuple[TrainingPrediction, list[TrainingPrediction]]:
    """The first prediction of :func:`options_ladder` that fits ``budget`` (else the least peak); and every one tried.

    Example:
        >>> import tempfile
        >>> from hf_precision.testing import make_pipeline, save_pipeline
        >>> with tempfile.TemporaryDirectory() as tmp:
        ...     tiny = str(save_pipeline(make_pipeline("sd15"), tmp))
        ...     chosen, tried = choose(tiny, "t4", 10**12, method="lora", rank=4, resolution=32, frames=0,
        ...                            batch_size=2, gradient_checkpointing=False, cached=True)
        >>> chosen.options == Options(2, False, True), len(tried)  # the settings as asked fit: one prediction
        (True, 1)
    """
    from ...memory.planner import choose as choose_fitting

    m = planned_model(model, device, overrides)
    choice = choose_fitting(options_ladder(batch_size, gradient_checkpointing, cached, text_encoders),
                            lambda opt: predict_training(model, device, method=method, rank=rank, resolution=resolution,
                                                         frames=frames, options=opt, overrides=overrides,
                                                         _cached_model=m), budget)
    return choice.prediction, choice.tried
