"""Each rank's peak memory for ``hf-precision train --plan --processes N [--shard]``, data parallel or sharded (FSDP2).

Built on the one-process prediction (:mod:`.plan`). Data parallel: every rank holds what one process holds.
Sharded (:mod:`hf_precision.training.shard`): the denoiser's weights, masters, gradients and AdamW state split as
FSDP2 chunks rows (rank 0's share, the largest); frozen components as
:func:`hf_precision.training.shard.frozen_choice` decides; gathered whole while computing: the root unit and two
block units (computing and prefetched) with their gradients. :func:`hf_precision.memory.choose` takes the first of
:func:`rank_ladder` that fits ``--max-memory``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ...memory.peaks import meta_module
from ...memory.train_step import make_trainable
from ...training.methods import method_of
from ...units import format_bytes
from .plan import ADAM_STATES, Options, TrainingPrediction, options_ladder, planned_model, predict_training

__all__ = ["RankPrediction", "predict_rank", "rank_ladder", "training_model"]


@dataclasses.dataclass
class RankPrediction:
    """One rank's bytes for one setting: at rest, gathered units and activations; ``peak``: the larger phase."""

    processes: int
    sharded: bool
    base: TrainingPrediction
    weights: int
    masters: int
    grads: int
    optimizer: int
    gathered: int
    encode: int  # the cache pass: encoders whole, the denoiser as this rank holds it, its masters, VAE activations
    frozen: list[Any] = dataclasses.field(default_factory=list)  # sharded: each frozen component's FrozenChoice

    @property
    def options(self) -> Options:
        return self.base.options

    @property
    def at_rest(self) -> int:
        return self.weights + self.masters + self.grads + self.optimizer

    @property
    def peak(self) -> int:
        return max(self.at_rest + self.gathered + self.base.activations, self.encode)

    def describe(self) -> str:
        how = f"sharded over {self.processes} (FSDP2)" if self.sharded else f"data parallel x{self.processes}"
        return f"{how}; {self.options.describe()}"

    label = describe

    def details(self) -> str:
        return f"per rank peak {format_bytes(self.peak, binary=True)}"


def _unit_bytes(module: Any, units: list[Any], denoiser: str) -> tuple[int, int, int]:
    """(root unit, largest block unit, its trainable part) bytes of each unit's own parameters in its param dtype."""
    from ...dtypes import to_torch

    paths = [u.path.partition(".")[2] for u in units]
    owner: dict[int, Any] = {}
    for name, p in module.named_parameters():
        best = max((u for u, path in zip(units, paths) if not path or name.startswith(path + ".")),
                   key=lambda u: len(u.path))
        owner[id(p)] = best
    sizes: dict[str, list[int]] = {u.path: [0, 0] for u in units}
    for _, p in module.named_parameters():
        unit = owner[id(p)]
        size = p.numel() * (to_torch(unit.param_dtype).itemsize if unit.param_dtype else p.element_size())
        sizes[unit.path][0] += size
        if p.requires_grad:
            sizes[unit.path][1] += size
    root = sizes[denoiser][0]
    blocks = [v for path, v in sizes.items() if path != denoiser] or [[0, 0]]
    return root, max(b[0] for b in blocks), max(b[1] for b in blocks)


def predict_rank(model: str, device: Any, *, processes: int, shard: bool, method: str = "lora", rank: int = 16,
                 resolution: int = 512, frames: int = 0, options: Options, overrides: Any = None,
                 _cached_model: Any = None) -> RankPrediction:
    """One rank's predicted bytes for ``processes`` processes, data parallel or sharded.

    Example:
        >>> opts = Options(1, False, True)
        >>> ddp = predict_rank("sd15", "t4", processes=8, shard=False, rank=4, resolution=256, options=opts)
        >>> fsdp = predict_rank("sd15", "t4", processes=8, shard=True, rank=4, resolution=256, options=opts)
        >>> fsdp.weights < ddp.weights / 4 and fsdp.masters < ddp.masters
        True
    """
    import torch

    from ...training.shard import plan_units, rank_share

    m = _cached_model or training_model(model, device, overrides)
    base = predict_training(model, device, method=method, rank=rank, resolution=resolution, frames=frames,
                            options=options, overrides=overrides, _cached_model=m)
    encoders = sum(v for n, v in base.weights.items() if n != m.denoiser)
    if not shard or processes <= 1:
        frozen = base.phases["train step"] - base.masters - base.grads - base.optimizer - base.activations
        return RankPrediction(processes, False, base, frozen, base.masters, base.grads, base.optimizer, 0,
                              base.phases["encode"])
    choices = _frozen_choices(m, base, processes, options.cached)
    # cached: the encoders leave the device after the cache pass (held whole in it); else each as its choice holds it
    replicated = 0 if options.cached else sum(c.held for c in choices)
    den = m.plan.components[m.denoiser]
    module = meta_module(m.index, m.configs, m.denoiser, getattr(torch, den.compute))
    make_trainable(module, method, rank)
    trainable = [p for p in module.parameters() if p.requires_grad]
    frozen = [p for p in module.parameters() if not p.requires_grad]
    # the recipe's storage bytes of the frozen denoiser weights, split as the meta module's (compute dtype) split
    frozen_share = rank_share(frozen, processes) / max(sum(p.numel() * p.element_size() for p in frozen), 1)
    frozen_den = int((base.weights[m.denoiser] - (den.total_bytes if method_of(method).every_weight else 0)) * frozen_share)
    masters = rank_share(trainable, processes, 4)
    names = dict(module.named_modules())
    islands = {m.denoiser: [i for i in m.plan.recipe[m.denoiser].keep_fp32 if i in names]}
    units = plan_units(m.plan.recipe, {m.denoiser: method}, islands, {m.denoiser: module})
    root, block, block_grads = _unit_bytes(module, units, m.denoiser)
    gathered = root + 2 * block + block_grads
    encode = encoders + frozen_den + masters + base.encode_activations
    return RankPrediction(processes, True, base, frozen_den + replicated, masters, masters,
                          masters * ADAM_STATES, gathered, encode, choices)


def _frozen_choices(m: Any, base: TrainingPrediction, processes: int, cached: bool) -> list[Any]:
    """Each frozen component's :func:`hf_precision.training.shard.frozen_choice`, from its meta module and bytes."""
    import torch

    from ...training.shard import frozen_choice

    out = []
    for name, size in base.weights.items():
        if name == m.denoiser or not size:
            continue
        module = meta_module(m.index, m.configs, name, getattr(torch, m.plan.components[name].compute))
        out.append(frozen_choice(name, module, processes, weight_bytes=size, cached=cached))
    return out


def training_model(model: str, device: Any, overrides: Any = None) -> Any:
    """The plan's model under the training recipe: its ``training:`` overrides (SD 1.x: fp32 VAE), then the user's.

    Example:
        >>> training_model("sd15", "t4").plan.components["vae"].compute
        'float32'
    """
    from ...recipe.catalog import training_overrides

    extra = list(overrides) if isinstance(overrides, (list, tuple)) else ([] if overrides is None else [overrides])
    first = planned_model(model, device, overrides)
    layer = training_overrides(first.plan.recipe.name)
    return planned_model(model, device, [layer, *extra]) if layer else first


def rank_ladder(batch_size: int, checkpointing: bool, cached: bool) -> list[tuple[bool, Options]]:
    """(sharded, options) to try, cheapest first: data parallel as asked, then sharded along ``options_ladder``.

    Example:
        >>> [(shard, o.batch_size, o.gradient_checkpointing) for shard, o in rank_ladder(1, False, True)]
        [(False, 1, False), (True, 1, False), (True, 1, True)]
    """
    ladder = options_ladder(batch_size, checkpointing, cached)
    return [(False, ladder[0])] + [(True, o) for o in ladder]
