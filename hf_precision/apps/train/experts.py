"""``--expert``: which denoising expert of a two-expert model (Wan 2.2 A14B: ``transformer`` for high noise,
``transformer_2`` for low noise, switched at ``boundary_ratio``) a run of the training program trains.

ai-toolkit's Wan 2.2 trainer trains both by default (extensions_built_in/diffusion_models/wan22:
``model_kwargs.get("train_high_noise", True)``); musubi-tuner one ``--dit`` per run. A plan trains one expert
(:mod:`hf_precision.training.experts`), so ``both`` (the default) is two runs, into ``OUT/high_noise`` and
``OUT/low_noise``, each read back by diffusers' Wan loader (``load_into_transformer_2=True`` for the low one). Read
from ``model_index.json`` alone, so a wrong choice is refused before loading.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import RecipeError
from ...runtime.source import listed_components, locate
from .settings import check_out_folder, configs_source

__all__ = ["EXPERT_CHOICES", "boundary_ratio", "expert_train", "expert_line", "expert_runs"]

EXPERT_CHOICES = ("high", "low", "both")
_COMPONENT = {"high": "transformer", "low": "transformer_2"}


def boundary_ratio(index: Mapping[str, Any]) -> float | None:
    """The ratio at which a pipeline switches from ``transformer`` to ``transformer_2``; None for one denoiser.

    Example:
        >>> boundary_ratio({"transformer": ["diffusers", "W"], "transformer_2": ["diffusers", "W"], "boundary_ratio": 0.875})
        0.875
        >>> boundary_ratio({"transformer": ["diffusers", "W"], "transformer_2": [None, None], "boundary_ratio": None})
    """
    ratio = index.get("boundary_ratio")
    return float(ratio) if ratio is not None and "transformer_2" in listed_components(index) else None


def expert_train(train: Mapping[str, str], index: Mapping[str, Any], expert: str | None) -> dict[str, str]:
    """``train=`` of one run with the chosen expert in the denoiser's place; refused for a model with one denoiser.

    Example:
        >>> idx = {"_class_name": "WanPipeline", "transformer": ["diffusers", "W"], "transformer_2": ["diffusers", "W"],
        ...        "boundary_ratio": 0.875}
        >>> expert_train({"transformer": "lora"}, idx, "low"), expert_train({"transformer": "lora"}, idx, None)
        ({'transformer_2': 'lora'}, {'transformer': 'lora'})
        >>> expert_train({"unet": "lora"}, {"_class_name": "StableDiffusionPipeline"}, "low")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --expert low: StableDiffusionPipeline has one denoiser...
    """
    if expert is None:
        return dict(train)
    if expert not in EXPERT_CHOICES:
        raise RecipeError(f"--expert {expert}: allowed: {', '.join(EXPERT_CHOICES)}")
    if boundary_ratio(index) is None:
        raise RecipeError(f"--expert {expert}: {index.get('_class_name')} has one denoiser (no transformer_2 with a "
                          f"boundary_ratio, as Wan 2.2 A14B has); drop --expert")
    if expert == "both":
        raise RecipeError("--expert both: two runs, one per expert (a plan trains one); run them with hf-precision "
                          "train, or train() each of hf_precision.apps.train.experts.expert_runs(settings)")
    out = dict(train)
    if "transformer" in out:
        out[_COMPONENT[expert]] = out.pop("transformer")
    return out


def expert_runs(s: Any, say: Any = None) -> list[Any]:
    """The runs of one ``train`` command: the settings as given, or for ``both`` the high-noise run then the low one.

    Under ``--resume`` each expert continues its own checkpoints (a checkpoint path goes to the expert whose folder
    holds it, the other takes its latest); one not started starts fresh, one finished (``training.json``) is skipped
    with a line to ``say``.

    Example:
        >>> import dataclasses
        >>> @dataclasses.dataclass
        ... class S: model: str; out: str; expert: str | None = None; resume: str | None = None; base: str | None = None
        >>> expert_runs(S("sd15", "o"))
        [S(model='sd15', out='o', expert=None, resume=None, base=None)]
    """
    if s.expert not in (None, "both"):
        return [s]
    try:
        index = locate(configs_source(s.model, s.base))[1]
    except RecipeError:
        return [s]  # the run names what is wrong with --model
    if boundary_ratio(index) is None:
        return [s]
    check_out_folder(s.out, s.resume)
    outs = {expert: Path(s.out) / f"{expert}_noise" for expert in ("high", "low")}
    owner = _checkpoint_owner(s.resume, outs)
    runs = []
    for expert, out in outs.items():
        if owner == expert or (owner is None and s.resume is not None and out.is_dir()):
            resume = s.resume
        else:  # not started yet: fresh; the other expert of a checkpoint path: its latest
            resume = "latest" if s.resume is not None and out.is_dir() else None
        if resume is not None and owner != expert and _finished(out, s.steps):
            if say is not None:
                say(f"{out}: the {expert}-noise expert finished its {s.steps} steps (training.json); not trained again")
            continue
        runs.append(dataclasses.replace(s, expert=expert, out=str(out), resume=resume))
    return runs


def _checkpoint_owner(resume: str | None, outs: Mapping[str, Any]) -> str | None:
    """The expert whose folder holds the ``--resume`` checkpoint path (None: ``latest`` or none); else refused."""
    if resume in (None, "latest"):
        return None
    path = Path(resume).expanduser().resolve()
    for expert, out in outs.items():
        if path.is_relative_to(Path(out).resolve()):
            return expert
    raise RecipeError(f"--resume {resume}: --expert both trains each expert from its own checkpoints, in "
                      f"{outs['high']}/checkpoints and {outs['low']}/checkpoints; pass one of those, or --resume latest")


def _finished(out: Any, steps: int) -> bool:
    """Whether ``out`` holds a finished run of ``steps`` steps (``training.json``, written last)."""
    try:
        return int(json.loads((Path(out) / "training.json").read_text(encoding="utf-8"))["steps"]) >= steps
    except (OSError, ValueError, KeyError, TypeError):
        return False


def expert_line(index: Mapping[str, Any], expert: str | None) -> str | None:
    """What a plan or run prints for a two-expert model: which expert(s) train, on which timesteps; else None.

    Example:
        >>> idx = {"_class_name": "WanPipeline", "transformer": ["diffusers", "W"], "transformer_2": ["diffusers", "W"],
        ...        "boundary_ratio": 0.875}
        >>> print(expert_line(idx, "low"))
        experts: WanPipeline switches at boundary_ratio 0.875; this run trains the low-noise expert transformer_2 (timesteps below 0.875 x num_train_timesteps); transformer (high noise) stays frozen (--expert high trains it)
        >>> print(expert_line(idx, None))  # doctest: +ELLIPSIS
        experts: WanPipeline switches at boundary_ratio 0.875; trains both experts, one run each: ...
    """
    ratio = boundary_ratio(index)
    if ratio is None:
        return None
    head = f"experts: {index.get('_class_name')} switches at boundary_ratio {ratio:g}; "
    if expert in (None, "both"):
        return (head + f"trains both experts, one run each: transformer (high noise, timesteps from {ratio:g} x "
                f"num_train_timesteps) into OUT/high_noise, then transformer_2 (low noise, below) into OUT/low_noise "
                f"(--expert high or low trains one)")
    low = expert == "low"
    trained, other = ("low", "high") if low else ("high", "low")
    window = f"timesteps {'below' if low else 'from'} {ratio:g} x num_train_timesteps"
    return (head + f"this run trains the {trained}-noise expert {_COMPONENT[trained]} ({window}); "
            f"{_COMPONENT[other]} ({other} noise) stays frozen (--expert {other} trains it)")
