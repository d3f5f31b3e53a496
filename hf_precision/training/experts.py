"""Two denoising experts (Wan 2.2 A14B): which one a training step trains, and on which noise levels.

diffusers' Wan 2.2 pipelines switch at ``boundary_ratio * num_train_timesteps``: ``transformer`` denoises every
``t`` above, ``transformer_2`` the rest (pipeline_wan.py ``__call__``). So one expert trains per run, its sigmas
drawn from its window (``tp.sigma_range``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .methods import method_of
from .rules import TrainingError

__all__ = ["EXPERTS", "expert"]

EXPERTS = ("transformer", "transformer_2")  # high noise, low noise


def expert(pipe: Any, train: Mapping[str, str], denoiser: str | None,
           timestep_scale: float = 1000.0) -> tuple[str | None, tuple[float, float] | None]:
    """The denoiser a step trains and its flow sigma window: ``(denoiser, None)`` for a pipeline with one expert.

    Example:
        >>> from types import SimpleNamespace
        >>> wan22 = SimpleNamespace(config={"boundary_ratio": 0.875}, components={"transformer": 1, "transformer_2": 2},
        ...                         scheduler=SimpleNamespace(config={"num_train_timesteps": 1000}))
        >>> expert(wan22, {"transformer_2": "lora"}, "transformer"), expert(wan22, {"transformer": "lora"}, "transformer")
        (('transformer_2', (0.0, 0.875)), ('transformer', (0.875, 1.0)))
        >>> expert(SimpleNamespace(config={}, components={"transformer": 1}), {"transformer": "lora"}, "transformer")
        ('transformer', None)
    """
    ratio = dict(getattr(pipe, "config", None) or {}).get("boundary_ratio")
    components = getattr(pipe, "components", {})
    if denoiser != EXPERTS[0] or components.get(EXPERTS[1]) is None:
        return denoiser, None
    if ratio is None and getattr(pipe, "config", None) is None:  # a dict of components: no pipeline config
        raise TrainingError(
            "prepare_training: the components hold two denoising experts (transformer and transformer_2, as Wan 2.2), "
            "and a dict does not say at which noise level the pipeline switches them (its config's boundary_ratio); "
            "pass the pipeline (e.g. WanPipeline(..., boundary_ratio=0.875)), or leave transformer_2 out of the dict")
    if ratio is None:  # the pipeline runs transformer alone (pipeline_wan.py: boundary_timestep None)
        return denoiser, None
    scheduler = getattr(pipe, "scheduler", None) or components.get("scheduler")
    steps = float(dict(getattr(scheduler, "config", None) or {}).get("num_train_timesteps", timestep_scale))
    boundary = float(ratio) * steps / timestep_scale  # the sigma at boundary_timestep
    trained = [c for c in EXPERTS if method_of(train.get(c, "frozen")).trains_weights]
    if len(trained) > 1:
        raise TrainingError(
            f"prepare_training(train={dict(train)}): {type(pipe).__name__} switches experts at boundary_ratio {ratio} "
            f"(t >= {ratio * steps:g}: transformer, below: transformer_2), so a step's noise level belongs to one of "
            f"them; train one per run: train={{'transformer': 'lora'}} (high noise) or "
            f"train={{'transformer_2': 'lora'}} (low noise)")
    if trained == [EXPERTS[1]]:
        return EXPERTS[1], (0.0, boundary)
    return EXPERTS[0], (boundary, 1.0)
