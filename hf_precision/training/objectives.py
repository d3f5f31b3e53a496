"""The noise objective of training: which one a scheduler config implies (epsilon, v-prediction, flow matching or
SVD's EDM preconditioning) and the random part of a step drawn under it (noise, then noise levels or timesteps).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["OBJECTIVES", "draw", "objective_of", "sigma_range"]

OBJECTIVES = ("epsilon", "v_prediction", "flow", "edm")
# EDM training draws ln(sigma) ~ N(P_mean, P_std^2) (Karras et al. 2022, "Elucidating the Design Space of
# Diffusion-Based Generative Models", Table 1: P_mean -1.2, P_std 1.2), clipped to the scheduler's sigma range.
EDM_P_MEAN, EDM_P_STD = -1.2, 1.2


def objective_of(scheduler_config: Mapping[str, Any] | None, scheduler_class: str = "") -> str:
    """The noise objective a scheduler config implies: ``flow``, ``edm``, ``v_prediction`` or ``epsilon``; ``edm``:
    SVD's continuous v-prediction, which feeds ``c_noise = 0.25 * ln(sigma)`` and inputs scaled by ``1 / sqrt(sigma^2
    + 1)`` (diffusers ``schedulers/scheduling_euler_discrete.py``, ``scale_model_input``).

    Example:
        >>> objective_of({"prediction_type": "v_prediction"}), objective_of({}, "FlowMatchEulerDiscreteScheduler")
        ('v_prediction', 'flow')
        >>> objective_of({"prediction_type": "v_prediction", "timestep_type": "continuous"}, "EulerDiscreteScheduler")
        'edm'
    """
    config = dict(scheduler_config or {})
    prediction = config.get("prediction_type")
    if scheduler_class.startswith("FlowMatch") or prediction == "flow_prediction" or config.get("use_flow_sigmas"):
        return "flow"
    if prediction == "v_prediction" and config.get("timestep_type") == "continuous":
        return "edm"
    return "v_prediction" if prediction == "v_prediction" else "epsilon"


def sigma_range(scheduler_config: Mapping[str, Any] | None, alphas_cumprod: torch.Tensor | None = None) -> tuple[float, float]:
    """(sigma_min, sigma_max) of an EDM schedule: the config's, else the range its betas give (as the scheduler does).

    Example:
        >>> sigma_range({"sigma_min": 0.002, "sigma_max": 700.0})
        (0.002, 700.0)
    """
    config = dict(scheduler_config or {})
    lo, hi = config.get("sigma_min"), config.get("sigma_max")
    if (lo is None or hi is None) and alphas_cumprod is not None:
        # scheduling_euler_discrete.py: sigmas = sqrt((1 - alphas_cumprod) / alphas_cumprod)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod).sqrt()
        lo = float(sigmas.min()) if lo is None else lo
        hi = float(sigmas.max()) if hi is None else hi
    return float(0.002 if lo is None else lo), float(80.0 if hi is None else hi)


def draw(objective: str, shape: tuple[int, ...], *, alphas_cumprod: torch.Tensor | None = None,
         sigmas: tuple[float, float] | None = None, generator: torch.Generator | None = None,
         device: torch.device | str | None = None) -> dict[str, torch.Tensor]:
    """The random part of a training step for ``shape[0]`` samples: ``noise``, then noise levels (``sigmas``: uniform
    for flow, log-normal for edm, within ``sigmas`` (min, max) where given) or DDPM ``timesteps``, in that order.

    Example:
        >>> d = draw("flow", (2, 4, 8, 8), generator=torch.Generator().manual_seed(0))
        >>> sorted(d), tuple(d["noise"].shape), tuple(d["sigmas"].shape)
        (['noise', 'sigmas'], (2, 4, 8, 8), (2,))
    """
    b, rnd = shape[0], {"generator": generator, "device": device}
    out = {"noise": torch.randn(shape, **rnd)}
    if objective == "flow":  # uniform; within ``sigmas`` where given (a Wan 2.2 expert's window: training.experts)
        lo, hi = sigmas or (0.0, 1.0)
        out["sigmas"] = lo + (hi - lo) * torch.rand(b, **rnd)
    elif objective == "edm":
        lo, hi = sigmas or (0.002, 80.0)
        out["sigmas"] = (EDM_P_MEAN + EDM_P_STD * torch.randn(b, **rnd)).exp().clamp(lo, hi)
    elif alphas_cumprod is not None:
        out["timesteps"] = torch.randint(0, len(alphas_cumprod), (b,), **rnd)
    return out
