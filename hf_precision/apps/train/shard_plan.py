"""``hf-precision train --plan --processes N [--shard]``: each rank's peak memory, data parallel or sharded (FSDP2).

Built on the one-process prediction (:mod:`.plan`: activations of one per-process batch, counted on the meta device;
weights in the recipe's dtypes). Per rank, for N processes:

- **data parallel** (DDP): every rank holds what one process holds.
- **sharded** (``--shard``, :mod:`hf_precision.training.shard`): the trained denoiser's weights, fp32 masters,
  gradients and AdamW state are split over the ranks, each parameter padded along its first dimension to a multiple
  of N as FSDP2 pads it; frozen components stay replicated. While a unit computes it is gathered whole: the component's
  own unit (held through the step), and two block units at a time (the one computing and the one prefetched), with
  their gradients before the reduce-scatter.

The first setting that fits ``--max-memory`` is chosen, cheapest first: data parallel as asked, sharded as asked,
then the one-process ladder (cached latents, gradient checkpointing, halved batches) with sharding.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from ...errors import RecipeError
from .plan import (ADAM_STATES, Options, TrainingPrediction, make_trainable, meta_module, planned_model,
                   predict_training, size_text)

__all__ = ["RankPrediction", "predict_rank", "shard_bytes", "rank_plan_command"]


@dataclasses.dataclass
class RankPrediction:
    """One rank's bytes for one setting: at rest (weights, masters, gradients, AdamW state), gathered units, and
    activations; ``peak`` is the train step's (or the encode pass's, when larger)."""

    processes: int
    sharded: bool
    base: TrainingPrediction
    weights: int
    masters: int
    grads: int
    optimizer: int
    gathered: int
    encode: int  # the cache pass: encoders whole, the denoiser as this rank holds it, its masters, VAE activations

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


def shard_bytes(params: Iterable[Any], processes: int, dtype_bytes: int | None = None) -> int:
    """Bytes one rank holds of ``params`` sharded over ``processes`` as FSDP2 shards them (dim 0 padded to a
    multiple of N); ``dtype_bytes`` overrides the element size (the fp32 masters, gradients).

    Example:
        >>> import torch
        >>> shard_bytes([torch.empty(5, 2)], 2)  # rows 5 -> padded 6, 3 rows of 2 fp32 each
        24
    """
    total = 0
    for p in params:
        rows = p.shape[0] if p.dim() > 0 else 1
        rest = p.numel() // max(rows, 1) if p.dim() > 0 else 1
        total += math.ceil(rows / processes) * rest * (dtype_bytes or p.element_size())
    return total


def _unit_bytes(module: Any, units: list[Any], denoiser: str) -> tuple[int, int, int]:
    """(root unit bytes, largest block unit bytes, largest block unit's trainable bytes), each gathered in its
    param dtype (a unit's own parameters: those not inside a nested unit)."""
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

    from ...training.shard import plan_units

    m = _cached_model or training_model(model, device, overrides)
    base = predict_training(model, device, method=method, rank=rank, resolution=resolution, frames=frames,
                            options=options, overrides=overrides, _cached_model=m)
    encoders = sum(v for n, v in base.weights.items() if n != m.denoiser)
    replicated = 0 if options.cached else encoders
    if not shard or processes <= 1:
        frozen = base.phases["train step"] - base.masters - base.grads - base.optimizer - base.activations
        return RankPrediction(processes, False, base, frozen, base.masters, base.grads, base.optimizer, 0,
                              base.phases["encode"])
    den = m.plan.components[m.denoiser]
    module = meta_module(m.index, m.configs, m.denoiser, getattr(torch, den.compute))
    make_trainable(module, method, rank)
    trainable = [p for p in module.parameters() if p.requires_grad]
    frozen = [p for p in module.parameters() if not p.requires_grad]
    # the recipe's storage bytes of the frozen denoiser weights, split as the meta module's (compute dtype) split
    frozen_share = shard_bytes(frozen, processes) / max(sum(p.numel() * p.element_size() for p in frozen), 1)
    frozen_den = int((base.weights[m.denoiser] - (den.total_bytes if method == "full" else 0)) * frozen_share)
    masters = shard_bytes(trainable, processes, 4)
    islands = {m.denoiser: [i for i in m.plan.recipe[m.denoiser].keep_fp32 if _has(module, i)]}
    units = plan_units(m.plan.recipe, {m.denoiser: method}, islands, {m.denoiser: module})
    root, block, block_grads = _unit_bytes(module, units, m.denoiser)
    gathered = root + 2 * block + block_grads
    encode = encoders + frozen_den + masters + base.encode_activations
    return RankPrediction(processes, True, base, frozen_den + replicated, masters, masters,
                          masters * ADAM_STATES, gathered, encode)


def training_model(model: str, device: Any, overrides: Any = None) -> Any:
    """The plan's model under the training recipe: the recipe's training overrides first (what prepare_training
    layers on, e.g. an fp32 VAE for SD 1.x), then the user's."""
    from ...recipe.catalog import training_overrides

    extra = list(overrides) if isinstance(overrides, (list, tuple)) else ([] if overrides is None else [overrides])
    first = planned_model(model, device, overrides)
    layer = training_overrides(first.plan.recipe.name)
    return planned_model(model, device, [layer, *extra]) if layer else first


def _has(module: Any, path: str) -> bool:
    try:
        module.get_submodule(path)
    except AttributeError:
        return False
    return True


def _ladder(batch_size: int, checkpointing: bool, cached: bool) -> list[tuple[bool, Options]]:
    sizes = [batch_size]
    while sizes[-1] > 1:
        sizes.append(sizes[-1] // 2)
    out = [(False, Options(batch_size, checkpointing, cached)), (True, Options(batch_size, checkpointing, cached))]
    for b in sizes:
        out += [(True, Options(b, checkpointing, True)), (True, Options(b, True, True))]
    return list(dict.fromkeys(out))


def rank_plan_command(args: Any, overrides: Any = None) -> int:
    """``train --plan --processes N [--shard] [--max-memory SIZE]``: each rank's peak, and the setting that fits."""
    from ...units import parse_size

    if not args.model:
        raise RecipeError("--plan: give --model (a folder, a Hub id whose configs ship, or an alias such as sdxl, flux)")
    processes = int(args.processes or 1)
    if processes < 1:
        raise RecipeError(f"--processes {processes}: must be at least 1 (the processes per run, e.g. 8 for 8 GPUs)")
    method = args.method or "lora"
    if method == "embedding":
        raise RecipeError("--plan --processes: textual inversion is not sharded; plan lora or full")
    device = args.layout or args.device or "cuda"
    m = training_model(args.model, device, overrides)
    resolution = args.resolution or int(m.configs.get("vae", {}).get("sample_size") or 512)
    budget = parse_size(args.max_memory) if args.max_memory else None
    print(f"per-rank training plan: {args.model} ({m.plan.pipeline}), {method}, {resolution}px, {processes} "
          f"process(es) on {device}")
    kwargs = dict(method=method, rank=args.lora_rank, resolution=resolution, frames=args.frames or 0,
                  overrides=overrides, _cached_model=m)
    if budget is None:
        ladder = [(args.shard, Options(args.batch_size, args.gradient_checkpointing, args.cache))]
    else:
        ladder = _ladder(args.batch_size, args.gradient_checkpointing, args.cache)
    chosen = None
    for shard, opts in ladder:
        pred = predict_rank(args.model, device, processes=processes, shard=shard, options=opts, **kwargs)
        _print_rank(pred, budget)
        if budget is None or pred.peak <= budget:
            chosen = pred
            break
    if chosen is None:
        print(f"nothing tried fits {size_text(budget)} per rank: more processes, a device with more memory, or a lower "
              f"--resolution")
        return 1
    if budget is not None:
        flags = (["--shard"] if chosen.sharded else []) + (
            ["--gradient-checkpointing"] if chosen.options.gradient_checkpointing and not args.gradient_checkpointing
            else []) + ([f"--batch-size {chosen.options.batch_size}"] if chosen.options.batch_size != args.batch_size
                        else [])
        print(f"chosen: {chosen.describe()}: {' '.join(flags) or 'the settings as given'}")
    return 0


def _print_rank(p: RankPrediction, budget: int | None) -> None:
    fits = "" if budget is None else (" fits" if p.peak <= budget else " does NOT fit")
    print(f"  {p.describe()}: per rank weights {size_text(p.weights)}, masters {size_text(p.masters)}, gradients "
          f"{size_text(p.grads)}, AdamW {size_text(p.optimizer)}, gathered units {size_text(p.gathered)}, activations "
          f"{size_text(p.base.activations)} -> peak {size_text(p.peak)}{fits}")
