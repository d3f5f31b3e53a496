"""prepare_training: the inference recipe for frozen parts, fp32 masters for what trains, device-chosen compute.

Frozen components keep their inference recipe and lose their gradients; trainable ones get the training rule's
compute dtype (:mod:`.rules`: bf16, else fp16 + GradScaler, else fp32) and fp32 masters (:mod:`.trainable`). Hooks
give each component its own autocast state (on only for a full fine-tune, whose masters are fp32), so every path
into it (the loss, the user's own, validation, a script's accelerate autocast) computes as planned.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import operator
from collections.abc import Iterator, Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.model import Recipe
from ..runtime.apply import Applied, applied, apply_recipe
from ..runtime.placement import check_placeable, torch_device
from . import control, denoiser_rows, encode, experts, io, objectives, preflight, quantized, report, trainable
from .methods import ComponentSetup, method_of, method_names
from .resolve import Components, TrainingRecipe, resolve_training
from .rules import MASTERS, ComputeChoice, TrainingError
from .scaler import Stepper, parameter_names

__all__ = ["prepare_training", "TrainingSetup"]

_REQUIRES_GRAD = operator.attrgetter("requires_grad")


@dataclasses.dataclass
class TrainingSetup:
    """What :func:`prepare_training` set up; print it for the per-component table (see the module docstring)."""

    pipe: Any
    recipe: Recipe
    applied: Applied
    kinds: dict[str, str]
    choices: dict[str, ComputeChoice]
    device: torch.device
    denoiser_name: str | None
    objective: str
    master: str
    stepper: Stepper
    token_rows: dict[str, trainable.TokenRows]
    tokens: dict[str, list[str]]
    lora_rank: dict[str, int]
    handles: list[Any] = dataclasses.field(default_factory=list, repr=False)
    alphas_cumprod: torch.Tensor | None = None
    sigma_range: tuple[float, float] | None = None
    shard: Any = None  # a training.shard.ShardPlan when prepare_training(..., shard=True)
    _trainable: Any = dataclasses.field(default=None, repr=False)
    _names: Any = dataclasses.field(default=None, repr=False)
    _modules: Any = dataclasses.field(default=None, repr=False)
    _alphas_on: Any = dataclasses.field(default=None, repr=False)

    # ---------------------------------------------------------------- what it is
    @property
    def components(self) -> dict[str, torch.nn.Module]:
        return dict(self._components())

    def _components(self) -> dict[str, torch.nn.Module]:
        # diffusers' `pipe.components` inspects __init__'s signature on every read (three times a step): kept, and
        # read again when an entry is no longer the pipeline's attribute (a component replaced or set to None).
        cached = self._modules
        if cached is None or any(getattr(self.pipe, n, None) is not m for n, m in cached.items()):
            cached = self._modules = {n: m for n, m in self.pipe.components.items() if isinstance(m, torch.nn.Module)}
        return cached

    @property
    def compute_dtype(self) -> torch.dtype:
        """The denoiser's compute dtype (the first trainable component's when there is no denoiser)."""
        name = self.denoiser_name if self.denoiser_name in self.recipe else next(iter(self.choices), self.recipe.policies[0].name)
        return dt.to_torch(self.recipe[name].compute)

    @property
    def autocast_dtype(self) -> torch.dtype | None:
        half = [dt.to_torch(self.recipe[n].compute) for n in self.choices if self.recipe[n].compute in dt.HALF]
        return half[0] if half else None

    @property
    def skipped_steps(self) -> int:
        return self.stepper.skipped

    @property
    def scaler(self) -> torch.amp.GradScaler | None:
        return self.stepper.scaler

    def named_parameters(self) -> list[tuple[str, torch.nn.Parameter]]:
        """(component.parameter, parameter) of every trainable parameter."""
        # Walked every step by tp.step's check: cached until a component or parameter set changes (checked in C).
        comps = self._components()
        key = tuple((n, id(m)) for n, m in comps.items())
        if self._trainable is None or self._trainable[0] != key or not all(map(_REQUIRES_GRAD, self._trainable[2])):
            named = trainable.trainable_parameters(comps.items())
            self._trainable = (key, named, [p for _, p in named])
        return list(self._trainable[1])

    def parameters(self) -> list[torch.nn.Parameter]:
        """The trainable parameters (fp32 masters, or bf16 under ``master="bf16-sr"``): hand them to the optimizer."""
        return [p for _, p in self.named_parameters()]

    def report(self) -> str:
        return report.plan_table(self)

    __str__ = report

    def fingerprint(self) -> str:
        """A short hash of the plan (dtypes, islands, what trains, objective, model): key latent/text caches by it."""
        data = {"recipe": self.recipe.name, "device": self.recipe.device.label(), "master": self.master,
                "objective": self.objective, "model": _model_id(self.pipe),
                "components": {p.name: [p.storage, p.compute, list(self.applied.islands.get(p.name, [])),
                                        self.kinds.get(p.name, "frozen")] for p in self.recipe.policies if p.name in self.components}}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]

    # ---------------------------------------------------------------- the loop
    def autocast(self) -> contextlib.AbstractContextManager[Any]:
        """Autocast in the trainable compute dtype for the user's own loss code (components set their own state)."""
        dtype = self.autocast_dtype
        return torch.autocast(self.device.type, dtype=dtype or torch.float32, enabled=dtype is not None)

    def loss(self, batch: Mapping[str, Any], generator: torch.Generator | None = None) -> torch.Tensor:
        """The denoising loss (MSE against the scheduler's objective) for a batch of latents and conditioning."""
        module = self._denoiser()
        row = denoiser_rows.row_of(module, str(self.denoiser_name))
        if "vae_scale_factor" not in batch and (factor := self._vae_scale_factor()):
            batch = {**batch, "vae_scale_factor": factor}  # pixel sizes in the micro-conditioning
        kwargs, target = denoiser_rows.noisy_inputs(row, module, batch, self.objective, self._alphas(batch), generator,
                                               self.sigma_range, pipe=self.pipe)
        kwargs.update(control.side_inputs(self, module, kwargs, batch))  # a ControlNet's / T2I-Adapter's residuals
        out = module(**kwargs, return_dict=False)
        pred = denoiser_rows.model_output(out, target, row)
        return torch.nn.functional.mse_loss(pred.float(), target.to(pred.device).float())

    def backward(self, loss: torch.Tensor, accelerator: Any = None) -> None:
        """``loss.backward()``, scaled when compute is fp16 (through ``accelerator.backward`` when given), with autocast
        off as torch recommends: a script's ``accelerator.autocast()`` would re-cast fp16 layers' gradients to bf16
        ("Unexpected floating ScalarType in at::autocast::prioritize")."""
        if not loss.requires_grad:
            trains = ", ".join(f"{c}: {k}" for c, k in self.kinds.items() if k != "frozen")
            raise TrainingError(f"tp.backward: the loss does not depend on anything that trains ({trains}): "
                                f"a trained text encoder's output computed under torch.no_grad() or taken from a layer "
                                f"before its adapters, or a loss built from a copy; compute it from tp.encode_prompt(...) "
                                f"inside the step")
        if torch.is_autocast_enabled(self.device.type):
            with torch.autocast(self.device.type, enabled=False):
                self.stepper.backward(loss, accelerator)
        else:
            self.stepper.backward(loss, accelerator)

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Check every optimizer parameter is a master, step (via the scaler under fp16); False when skipped."""
        self.named_parameters()  # refreshes the cache the names come from
        if self._names is None or self._names[0] is not self._trainable:
            self._names = (self._trainable, parameter_names(self._trainable[1]))
        return self.stepper.step(optimizer, self._names[1])

    def restore_masters(self) -> int:
        """Put trainable parameters cast away from the master dtype back into it; returns how many moved."""
        moved = 0
        with torch.no_grad():
            for _, p in self.named_parameters():
                if p.dtype != self.stepper.master_dtype:
                    p.data = p.data.to(self.stepper.master_dtype)
                    moved += 1
                if p.grad is not None and p.grad.dtype != p.dtype:
                    p.grad = p.grad.to(p.dtype)
        return moved

    def check(self, batch: Mapping[str, Any] | None = None) -> None:
        """Preflight: placement, island and master checks, then one tiny forward+backward; raises naming the module."""
        preflight.preflight(self, batch)

    @contextlib.contextmanager
    def sampling(self) -> Iterator[Any]:
        """Validation: eval mode, no grad, the inference recipe's hooks; every dtype, device and mode restored after.

        diffusers' examples build the validation pipeline with ``torch_dtype=weight_dtype``, casting the fp32 LoRA to
        fp16, so the next step fails "Attempting to unscale FP16 gradients" (huggingface/diffusers#13124). Here what
        validation casts or moves is restored: trainable weights bit for bit, frozen tensors in dtype and device.
        """
        comps = self.components
        modes = {n: m.training for n, m in comps.items()}
        masters = [(p, p.detach().clone()) for _, p in self.named_parameters()]
        frozen = [(t, t.dtype, t.device) for m in comps.values() for t in (*m.parameters(), *m.buffers())
                  if not t.requires_grad]
        for module in comps.values():
            module.eval()
        try:
            with torch.no_grad():
                yield self.pipe
        finally:
            with torch.no_grad():
                for t, dtype, device in frozen:
                    if t.dtype != dtype or t.device != device:
                        t.data = t.data.to(device=device, dtype=dtype)
                for p, saved in masters:
                    if p.dtype != saved.dtype or p.device != saved.device:
                        p.data = saved
                    else:
                        p.copy_(saved)
            for name, module in comps.items():
                module.train(modes[name])

    # ---------------------------------------------------------------- data in
    def encode_images(self, pixels: torch.Tensor, generator: torch.Generator | None = None,
                      mode: bool = False) -> torch.Tensor:
        """VAE latents (fp32) of ``pixels`` in [-1, 1], scaled as the pipeline does; ``mode``: its mode, no sample."""
        return encode.encode_images(self, pixels, generator, mode)

    def encode_condition(self, pixels: torch.Tensor, latents: torch.Tensor,
                         generator: torch.Generator | None = None, **given: Any) -> dict[str, torch.Tensor]:
        """What the denoiser takes beyond the noisy latents, built from ``pixels`` as the pipeline does (an inpainting
        mask, an image-to-video first frame; ``{}`` mostly): ``batch.update(tp.encode_condition(pixels, latents))``.
        ``given``: the pipeline's own inputs its builder makes them from (Wan Animate: ``image=``, ``pose_video=``,
        ``face_video=``, as its ``__call__``)."""
        return encode.encode_condition(self, pixels, latents, generator, **given)

    def encode_prompt(self, prompts: str | list[str], **options: Any) -> dict[str, torch.Tensor]:
        """The pipeline's ``encode_prompt`` (no classifier-free guidance, ``options`` passed on) as a batch dict."""
        return encode.encode_prompt(self, prompts, **options)

    # ---------------------------------------------------------------- out
    def save_lora(self, path: Any, dtype: torch.dtype = torch.float16) -> Any:
        """Write the LoRA weights where ``pipe.load_lora_weights(path)`` reads them; returns the file."""
        return io.save_lora(self, path, dtype)

    def save_embeddings(self, path: Any) -> list[Any]:
        """Write the trained token rows in the format ``pipe.load_textual_inversion`` reads; returns the files."""
        return io.save_embeddings(self, path)

    def state_dict(self) -> dict[str, Any]:
        """Scaler state, step and skipped-step counts and the trainable weights (fp32), for resume."""
        return {**self.stepper.state_dict(), "fingerprint": self.fingerprint(),
                "trainable": {n: p.detach().clone() for n, p in self.named_parameters()}}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume: the weights are copied into the masters in place, so their dtype never changes."""
        if state.get("fingerprint") not in (None, self.fingerprint()):
            raise TrainingError(f"tp.load_state_dict: the state was saved under another plan (fingerprint "
                                f"{state.get('fingerprint')}, this one {self.fingerprint()}): same pipeline, layout, "
                                f"train= and master= are needed to resume")
        self.stepper.load_state_dict(dict(state))
        params = dict(self.named_parameters())
        with torch.no_grad():
            for name, value in (state.get("trainable") or {}).items():
                if name not in params:
                    raise TrainingError(f"tp.load_state_dict: saved parameter {name} is not trainable in this plan")
                params[name].copy_(value)

    def remove(self) -> None:
        """Take the autocast guards and the recipe's hooks off (weights stay as they are)."""
        for handle in self.handles:
            handle.remove()
        self.handles.clear()
        self.applied.remove()

    def _alphas(self, batch: Mapping[str, Any]) -> torch.Tensor | None:
        # Kept on the CPU, moved to the latents' device once: a copy from pageable memory waits for the CUDA stream.
        alphas, latents = self.alphas_cumprod, batch.get("latents")
        if alphas is None or not isinstance(latents, torch.Tensor) or latents.device == alphas.device:
            return alphas
        if self._alphas_on is None or self._alphas_on[0] is not alphas or self._alphas_on[1].device != latents.device:
            self._alphas_on = (alphas, alphas.to(latents.device))
        return self._alphas_on[1]

    def _vae_scale_factor(self) -> int | None:
        # the pipeline's own; for a dict, what SDXL / PixArt / HunyuanDiT compute: 2 ** (len(block_out_channels) - 1)
        factor = getattr(self.pipe, "vae_scale_factor", None)
        if isinstance(factor, int):
            return factor
        blocks = getattr(getattr(self._components().get("vae"), "config", None), "get", lambda _: None)("block_out_channels")
        return 2 ** (len(blocks) - 1) if blocks else None

    def _denoiser(self) -> torch.nn.Module:
        comps = self._components()
        if self.denoiser_name is None or self.denoiser_name not in comps:
            # A recipe composed for an unknown pipeline knows no denoiser when its class has no row: name what trains
            trained = [c for c, k in self.kinds.items() if method_of(k).trains_weights]
            if trained:
                raise denoiser_rows.no_row(comps[trained[0]], trained[0])
            raise TrainingError(f"tp.loss: recipe {self.recipe.name} names no denoiser present here "
                                f"(components: {sorted(self.components)}); compute the loss yourself under tp.autocast()")
        return comps[self.denoiser_name]


def _model_id(pipe: Any) -> str:
    for source in (getattr(pipe, "config", None), *[getattr(m, "config", None) for m in pipe.components.values()]):
        name = (source or {}).get("_name_or_path") if isinstance(source, Mapping) else None
        if name:
            return str(name)
    return type(pipe).__name__


def _check_args(comps: Mapping[str, Any], train: Mapping[str, str], master: str, tokens: Mapping[str, Any] | None) -> None:
    problems = []
    for name, kind in train.items():
        if name not in comps:
            problems.append(f"train: unknown component {name!r}; this pipeline has {', '.join(sorted(comps))}")
        if kind not in method_names():
            problems.append(f"train: {name}: {kind!r} is not one of {', '.join(method_names())}")
        elif method_of(kind).takes_tokens and not (tokens or {}).get(name):
            problems.append(f"train: {name}: {kind!r} needs its new tokens: tokens={{{name!r}: ['<my-token>']}}")
    if master not in MASTERS:
        problems.append(f"master: {master!r} is not one of {', '.join(MASTERS)}")
    takers = [n for n in method_names() if method_of(n).takes_tokens]
    for name in tokens or {}:
        if train.get(name) not in takers:
            problems.append(f"tokens: {name!r} is given tokens but train[{name!r}] is {train.get(name, 'frozen')!r}; "
                            f"set train={{{name!r}: {takers[0]!r}}}")
    if problems:
        raise TrainingError(problems)


def prepare_training(pipe: Any, device: Any = None, layout: Any = None, train: Mapping[str, str] | None = None,
                     rank: int = 4, lora: Any = None, tokens: Mapping[str, list[str]] | None = None,
                     init_tokens: Mapping[str, list[str]] | None = None, master: str = "fp32",
                     overrides: Any = None, recipe: str | TrainingRecipe | None = None, force: bool = False,
                     shard: bool | str = False) -> TrainingSetup:
    """Set a pipeline up for training under its recipe (see the module docstring for the rules).

    Args:
        pipe: a diffusers pipeline, or a dict of components (``{"unet": m, "vae": m, "scheduler": s}``).
        device: where it runs (default: a TrainingRecipe's own, else ``"cpu"``). layout: whose device rules choose
            the dtypes (``"t4"``, ``"a100"``); default device.
        train: component -> ``"lora"``, ``"full"``, ``"embedding"`` or ``"frozen"``; default ``{denoiser: "lora"}``.
        rank: LoRA rank when ``lora`` (a ``peft.LoraConfig``) is not given; targets the attention projections.
        tokens / init_tokens: textual inversion: new tokens per text encoder, and words to start them from.
        master: ``"fp32"`` master weights, or ``"bf16-sr"`` (bf16 weights, stochastic rounding; bf16 compute only).
        overrides: the same override forms as ``load_pipeline``; they win over the training rules.
        recipe: the recipe to train under (``"sdxl"``, a YAML file), or the
            :class:`~hf_precision.training.resolve.TrainingRecipe` the pipeline was loaded in (then only masters,
            adapters, the scaler and hooks are attached, and a ``device``, ``layout``, ``train`` or ``overrides``
            beside it must be the one it was resolved with); default: chosen by the pipeline's class, or for a dict
            by its components' classes and configs. A component the recipe does not plan gets a row saying so.
        force: apply a recipe whose ``pipelines:`` list does not name the pipeline's class (as ``apply_recipe``).
        shard: shard what trains with FSDP2 over the launcher's processes (:mod:`hf_precision.training.shard`); each
            frozen component sharded or replicated, whichever a rank holds less of (``tp.shard`` says why);
            ``"cached"``: the same for a run that caches the encoders' outputs (frozen parts stay replicated).

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> tp = prepare_training(make_pipeline("sd15"), layout="t4", train={"unet": "lora"})
        >>> tp.compute_dtype, tp.scaler is not None, {p.dtype for p in tp.parameters()}
        (torch.float16, True, {torch.float32})
    """
    holder = Components(pipe) if isinstance(pipe, Mapping) else pipe
    comps = {n: m for n, m in holder.components.items() if isinstance(m, torch.nn.Module)}
    # a resolved TrainingRecipe keeps its dtypes: a device this machine lacks is named with a present one as the fix
    check_placeable(device, recipe.recipe if isinstance(recipe, TrainingRecipe) else None)
    if isinstance(recipe, TrainingRecipe):  # resolved before loading (the training program): only attach
        recipe.refuse_other(device=device, layout=layout, train=train, overrides=overrides)
        tr, device, train = recipe, recipe.device, recipe.train
    dev = torch_device("cpu" if device is None else device, "device")
    _check_args(comps, dict(train or {}), master, tokens)
    if not isinstance(recipe, TrainingRecipe):
        tr = resolve_training(pipe, device=str(dev), layout=layout, train=train, overrides=overrides, recipe=recipe,
                              force=force, shard=shard)
    record = applied(holder)
    if record is None or record.removed or record.recipe != tr.recipe:  # loaded in it already: not cast again
        record = apply_recipe(holder, recipe=tr.recipe, force=True)
    train, denoiser = dict(tr.train), tr.denoiser
    denoiser, window = experts.expert(holder, train, denoiser)  # Wan 2.2: the expert that trains, on its noise levels
    quantized.upcast_fp8(record.recipe, comps, train, denoiser)  # fp8-stored parts gradients pass through
    quantized.keep_4bit_differentiable(comps, train, denoiser)
    tp = _finish(holder, record, comps, train, dev, denoiser, dict(tr.choices), rank, lora, tokens, init_tokens, master)
    tp.sigma_range = window or tp.sigma_range
    if shard not in (False, True, "cached"):
        raise TrainingError(f"prepare_training(shard={shard!r}): use True (shard over the launcher's processes), "
                            f"'cached' (the same, for a run that caches the encoders' outputs) or False")
    if shard:
        from .shard import shard_training

        tp.shard = shard_training(tp, cached=shard == "cached")
    return tp


def _finish(holder: Any, applied: Applied, comps: dict[str, torch.nn.Module], train: dict[str, str], dev: torch.device,
            denoiser: str | None, choices: dict[str, ComputeChoice], rank: int, lora: Any,
            tokens: Mapping[str, list[str]] | None, init_tokens: Mapping[str, list[str]] | None, master: str) -> TrainingSetup:
    recipe = applied.recipe
    half = {recipe[c].compute for c in choices}
    if master == "bf16-sr" and half != {"bfloat16"}:
        raise TrainingError(f"master='bf16-sr': pure bf16 training needs bf16 compute, but the trainable parts compute in "
                            f"{sorted(half)} on {recipe.device.label()}; use master='fp32' there")
    master_dtype = torch.bfloat16 if master == "bf16-sr" else torch.float32
    stepper = Stepper(dev.type, "float16" in half, master)
    handles: list[Any] = []
    token_rows: dict[str, trainable.TokenRows] = {}
    ranks: dict[str, int] = {}
    for comp, module in comps.items():
        method = method_of(train.get(comp, "frozen"))
        s = ComponentSetup(comp, module, holder, recipe, rank, lora, (tokens or {}).get(comp), (init_tokens or {}).get(comp),
                  master_dtype)
        method.setup(s)
        if s.lora_rank is not None:
            ranks[comp] = s.lora_rank
        if s.token_rows is not None:
            token_rows[comp] = s.token_rows
        module.train(method.trains_weights)  # frozen parts in eval mode (no dropout), as diffusers' examples do
        compute = recipe[comp].compute if comp in recipe else "float32"
        # Only a full fine-tune needs autocast (fp32 masters); a LoRA's base holds the compute dtype and peft casts
        # around its fp32 adapter. Autocast there would also undo processors' fp32 upcasts (Sana: NaN in fp16).
        autocast = dt.to_torch(compute) if method.every_weight and compute in dt.HALF else None
        if autocast is not None:
            trainable.keep_explicit_fp32(module)
            handles += trainable.norms_in_weight_dtype(module)
        handles += trainable.guard(module, dev.type, autocast, inside=True)
        for island in applied.islands.get(comp, []):
            handles += trainable.guard(module.get_submodule(island), dev.type, None)
    objective, alphas, sigmas = _objective(holder, comps.get(denoiser) if denoiser else None)
    return TrainingSetup(pipe=holder, recipe=recipe, applied=applied, kinds={c: train.get(c, "frozen") for c in comps},
                        choices=choices, device=dev, denoiser_name=denoiser, objective=objective, master=master,
                        stepper=stepper, token_rows=token_rows, tokens={k: list(v) for k, v in (tokens or {}).items()},
                        lora_rank=ranks, handles=handles, alphas_cumprod=alphas, sigma_range=sigmas)


def _objective(holder: Any, denoiser: torch.nn.Module | None) -> tuple[str, torch.Tensor | None, tuple[float, float] | None]:
    scheduler = getattr(holder, "scheduler", None)
    if scheduler is None:  # not `or`: DDPMWuerstchenScheduler's __len__ reads a config key its config lacks
        scheduler = holder.components.get("scheduler")
    if scheduler is None:
        row = denoiser_rows.row_of(denoiser) if denoiser is not None else None
        return ("epsilon" if row is not None and row.latent_arg == "sample" else "flow"), _alphas({}), None
    config = dict(scheduler.config)
    objective = objectives.objective_of(config, type(scheduler).__name__)
    if objective == "flow":
        return objective, None, None
    # The scheduler's own schedule (CogVideoXDDIMScheduler's SNR shift is not in a DDPM one rebuilt from the config)
    own = getattr(scheduler, "alphas_cumprod", None)
    if own is None and hasattr(scheduler, "_alpha_cumprod"):
        # DDPMWuerstchenScheduler (Stable Cascade) has a cosine schedule in continuous t in [0, 1]: tabulated at
        # t = i / 1000, the step the Cascade row's timestep_ratio (t * 1e-3) reads back
        own = scheduler._alpha_cumprod(torch.arange(1000) / 1000, "cpu")
    alphas = own.detach().float().cpu() if isinstance(own, torch.Tensor) and own.dim() == 1 else _alphas(config)
    return objective, alphas, (objectives.sigma_range(config, alphas) if objective == "edm" else None)


def _alphas(config: Mapping[str, Any]) -> torch.Tensor:
    from diffusers import DDPMScheduler

    # `_use_default_values` would make from_config take DDPM's own defaults (betas 1e-4..0.02) for the keys it lists
    kept = {k: v for k, v in config.items() if k != "prediction_type" and not k.startswith("_")}
    return DDPMScheduler.from_config(kept).alphas_cumprod.float()
