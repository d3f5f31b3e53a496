"""``hf-precision train --plan``: the plans of :mod:`hf_precision.apps.train.plan` (one process) and
:mod:`hf_precision.apps.train.shard_plan` (per rank), from the command's arguments, printed in binary units
(GiB/MiB, as torch's allocator reports); the predictions and choices are the apps'.
"""

from __future__ import annotations

import argparse
import functools
from typing import Any

from ..errors import RecipeError
from ..units import format_bytes, parse_size

__all__ = ["plan_command", "rank_plan_command", "print_prediction"]


size_text = functools.partial(format_bytes, binary=True)


def _size(args: Any, m: Any) -> tuple[int, int]:
    """``--resolution`` and ``--frames`` as ``train`` takes them: the model's default size where none is given, the
    one frame count a fixed table takes, and one clear refusal past its position tables (as ``train`` refuses)."""
    geo = m.geometry
    resolution = args.resolution or geo.configured_resolution(m.configs)
    geo.buckets(resolution, args.frames)
    return resolution, args.frames or geo.fixed_frames

def print_prediction(pred: Any, budget: int | None) -> None:
    """The plan as the command prints it: settings, weights, trainable state, activations, each phase's peak.

    Example:
        >>> from hf_precision.apps.train.plan import Options, TrainingPrediction
        >>> pred = TrainingPrediction(Options(1, False, True), {"unet": 2 * 2**30}, 10, 40, 40, 80, 2**20, 0,
        ...                           {"encode": 2 * 2**30, "train step": 2 * 2**30 + 2**20 + 160})
        >>> print_prediction(pred, None)  # doctest: +ELLIPSIS
        settings: batch size 1, gradient checkpointing off, cached latents ...
        weights (as the recipe stores them): unet 2.00 GiB
        trainable: 10 parameters: fp32 masters 0.0 MiB, gradients 0.0 MiB, AdamW state 0.0 MiB
        activations: train step 1.0 MiB (forward + backward), VAE encode 0.0 MiB
          encode      peak 2.00 GiB
          train step  peak 2.00 GiB
        predicted peak: 2.00 GiB (train step)
    """
    print(f"settings: {pred.options.describe()}")
    print("weights (as the recipe stores them): " + ", ".join(
        f"{n} {size_text(b)}" + (f" ({pred.storage[n]}, backend bytes)" if n in pred.storage else "")
        for n, b in pred.weights.items()))
    print(f"trainable: {pred.trainable_params:,} parameters: fp32 masters {size_text(pred.masters)}, gradients "
          f"{size_text(pred.grads)}, AdamW state {size_text(pred.optimizer)}")
    print(f"activations: train step {size_text(pred.activations)} (forward + backward), VAE encode "
          f"{size_text(pred.encode_activations)}")
    if pred.text_held:
        print(f"  of which the text encoders' forward held for backward: {size_text(pred.text_held)} (they train: "
              f"encoded every batch with autograd on, alive until the denoiser's backward reaches them)")
    if pred.fp8_copies:
        print(f"  of which fp8 weight copies held for backward: {size_text(pred.fp8_copies)} (the fp8 layers compute "
              f"from upcast copies; autograd keeps those on the gradient's path until backward)")
    for phase, peak in pred.phases.items():
        print(f"  {phase:<11} peak {size_text(peak)}")
    print(f"predicted peak: {pred.verdict(budget)}")


def _planned(args: argparse.Namespace, flag: str) -> tuple[Any, str, dict[str, Any]]:
    """What both plans check before their meta build: a model, a method that has a prediction, a model that can
    train (from model_index.json and the configs alone: a plan for a run `train` refuses would mislead). Returns the method's
    handler, the device planned for and the model index."""
    from ..apps.train.prepare import check_lora_saves, check_trainable
    from ..apps.train.settings import chosen_method
    from ..runtime.source import configs_of
    from ..training.methods import method_of

    if not args.model:
        raise RecipeError("--plan: give --model (a folder, a Hub id whose configs ship, or an alias such as sdxl, flux)")
    handler = method_of(chosen_method(getattr(args, "method", None), args))
    problem = handler.plan_problem()
    if problem:
        raise RecipeError(f"{flag}: {problem}")
    _, index, configs = configs_of(args.model)
    check_trainable(index, configs, fed=True)  # the plan reads no data: `train` checks what the data gives
    check_lora_saves(getattr(args, "train_text_encoder", False), handler.name, index)
    return handler, args.layout or args.device or "cuda", index


def plan_command(args: argparse.Namespace, overrides: Any = None) -> int:
    """``hf-precision train --plan``: print the prediction and the settings chosen for ``--max-memory``.

    Example:
        >>> plan_command(argparse.Namespace(model="sd15", layout=None, device="t4", method=None, embedding=True))
        Traceback (most recent call last):
        hf_precision.errors.RecipeError: --plan: textual inversion trains a few embedding rows; its memory is the model's weights (hf-precision plan MODEL --device DEVICE); plan lora or full instead
    """
    from ..apps.train.experts import expert_line, expert_train
    from ..apps.train.plan import Options, choose, planned_model, predict_training

    handler, device, index = _planned(args, "--plan")

    expert = getattr(args, "expert", None)
    if expert not in (None, "both"):
        expert_train({}, index, expert)  # --expert on a model with one denoiser: refused as the run refuses it
    experts = expert_line(index, expert)
    m = planned_model(args.model, device, overrides)
    resolution, frames = _size(args, m)
    budget = parse_size(args.max_memory) if args.max_memory else None
    print(f"training plan: {args.model} ({m.plan.pipeline}), {handler.plan_label(args.lora_rank)}, {resolution}px, "
          f"for {device}; {m.objective} objective")
    if experts:  # the two experts have one shape: the memory below holds for either
        print(experts)
    kwargs = dict(method=handler.name, rank=args.lora_rank, resolution=resolution, frames=frames)
    # the LoRA handler alone puts adapters on the text encoders (training/methods/lora.py program_train)
    text = bool(getattr(args, "train_text_encoder", False)) and handler.name == "lora"
    if budget is None:
        pred = predict_training(args.model, device, options=Options(args.batch_size, args.gradient_checkpointing,
                                                                    args.cache, text), overrides=overrides,
                                _cached_model=m, **kwargs)
        print_prediction(pred, None)
        return 0
    pred, tried = choose(args.model, device, budget, batch_size=args.batch_size,
                         gradient_checkpointing=args.gradient_checkpointing, cached=args.cache,
                         overrides=overrides, text_encoders=text, **kwargs)
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
    print(f"chosen: {' '.join(_flags(pred.options, args)) or 'the settings as given'} (the cache is on by default)")
    return 0


def rank_plan_command(args: argparse.Namespace, overrides: Any = None) -> int:
    """``train --plan --processes N [--shard] [--max-memory SIZE]``: each rank's peak, and the setting that fits.

    Example:
        >>> rank_plan_command(argparse.Namespace(model="sd15", processes=-2))
        Traceback (most recent call last):
        hf_precision.errors.RecipeError: --processes -2: must be at least 1 (the processes per run, e.g. 8 for 8 GPUs)
    """
    from ..apps.train.plan import Options
    from ..apps.train.shard_plan import predict_rank, rank_ladder, training_model
    from ..memory.planner import choose

    processes = int(args.processes or 1)
    if processes < 1:
        raise RecipeError(f"--processes {processes}: must be at least 1 (the processes per run, e.g. 8 for 8 GPUs)")
    handler, device, _ = _planned(args, "--plan --processes")
    method = handler.name
    m = training_model(args.model, device, overrides)
    resolution, frames = _size(args, m)
    budget = parse_size(args.max_memory) if args.max_memory else None
    print(f"per-rank training plan: {args.model} ({m.plan.pipeline}), {method}, {resolution}px, {processes} "
          f"process(es) on {device}")
    kwargs = dict(method=method, rank=args.lora_rank, resolution=resolution, frames=frames,
                  overrides=overrides, _cached_model=m)
    def predict(candidate: tuple[bool, Options]) -> Any:
        return predict_rank(args.model, device, processes=processes, shard=candidate[0], options=candidate[1], **kwargs)

    if budget is None:
        _print_rank(predict((args.shard, Options(args.batch_size, args.gradient_checkpointing, args.cache))), None)
        return 0
    choice = choose(rank_ladder(args.batch_size, args.gradient_checkpointing, args.cache), predict, budget)
    for pred in choice.tried:
        _print_rank(pred, budget)
    if not choice.fits:
        print(f"nothing tried fits {size_text(budget)} per rank: more processes, a device with more memory, or a lower "
              f"--resolution")
        return 1
    chosen = choice.prediction
    flags = (["--shard"] if chosen.sharded else []) + _flags(chosen.options, args)
    print(f"chosen: {chosen.describe()}: {' '.join(flags) or 'the settings as given'}")
    return 0


def _flags(options: Any, args: argparse.Namespace) -> list[str]:
    """The flags that turn the settings as given into the chosen ``options``."""
    return ((["--gradient-checkpointing"] if options.gradient_checkpointing and not args.gradient_checkpointing
             else []) + ([f"--batch-size {options.batch_size}"] if options.batch_size != args.batch_size else []))


def _print_rank(p: Any, budget: int | None) -> None:
    fits = "" if budget is None else (" fits" if p.peak <= budget else " does NOT fit")
    print(f"  {p.describe()}: per rank weights {size_text(p.weights)}, masters {size_text(p.masters)}, gradients "
          f"{size_text(p.grads)}, AdamW {size_text(p.optimizer)}, gathered units {size_text(p.gathered)}, activations "
          f"{size_text(p.base.activations)} -> peak {size_text(p.peak)}{fits}")
    for choice in p.frozen:  # the frozen components: sharded in their storage dtype or replicated, and why
        print(f"    {choice}")
