"""How many steps a pipeline can run: its scheduler's schedule, and an image-to-image call's strength (one rule for
generate, video, calibrate and check's default call)."""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ..errors import arg

__all__ = ["call_params", "fewest_steps", "schedulable", "steps_problem"]


def schedulable(scheduler: Any, steps: int = 1) -> bool:
    """Whether a copy of ``scheduler`` makes a finite, non-empty schedule of ``steps`` steps (True when not askable).

    FlowMatchEulerDiscreteScheduler with ``shift_terminal`` (LTX-Video's config) divides by ``1 - sigmas[-1]``, 0 for
    one step: NaN timesteps and an IndexError later. A dynamic-shifting one is probed with the neutral shift, as its
    pipeline computes its own (CogView4's shifts linearly: ``mu`` 1, not 0).

    Example:
        >>> from diffusers import FlowMatchEulerDiscreteScheduler
        >>> ltx = FlowMatchEulerDiscreteScheduler(shift_terminal=0.1)
        >>> schedulable(FlowMatchEulerDiscreteScheduler()), schedulable(ltx), schedulable(ltx, 2)
        (True, False, True)
        >>> schedulable(FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="linear"), 2)
        True
    """
    import copy
    import warnings

    import numpy as np
    import torch

    if scheduler is None or not hasattr(scheduler, "set_timesteps"):
        return True
    probe = copy.deepcopy(scheduler)
    config = getattr(probe, "config", {})
    params = inspect.signature(probe.set_timesteps).parameters
    # the identity shift: exp(mu) = 1 for the exponential time shift, mu = 1 for the linear one (mu 0 there is 0/0)
    identity = 1.0 if config.get("time_shift_type") == "linear" else 0.0
    kwargs = {"mu": identity} if "mu" in params and config.get("use_dynamic_shifting") else {}
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        try:
            probe.set_timesteps(steps, **kwargs)
        except Exception:  # noqa: BLE001 -- a scheduler that refuses the count (or needs pipeline inputs)
            return False
    for name in ("timesteps", "sigmas"):
        value = getattr(probe, name, None)
        if value is None:
            continue
        value = torch.as_tensor(np.asarray(value, dtype=np.float64) if not torch.is_tensor(value) else value).double()
        if value.numel() == 0 or not bool(torch.isfinite(value).all()):
            return False
    return True


def steps_problem(pipe_or_class: Any, steps: int, strength: float | None = None) -> str | None:
    """Why a pipeline cannot run ``steps`` steps, with the fix (``--steps``), or None; one rule for every command.

    Either its scheduler (a pipeline's; a class has no config yet) makes no finite schedule of that many
    (:func:`schedulable`), or an image-to-image call starting ``strength`` (None: the call's default) along denoises no
    step, by the class's own ``get_timesteps`` on a stand-in schedule: SD rounds ``steps x strength`` down
    (pipeline_stable_diffusion_img2img.py), Flux the skipped steps (pipeline_flux_img2img.py:481), so SDXL img2img at
    0.3 and 2 steps runs none (failing inside the VAE) while Flux runs 1.

    Example:
        >>> from types import SimpleNamespace
        >>> from diffusers import FlowMatchEulerDiscreteScheduler, FluxImg2ImgPipeline, StableDiffusionXLImg2ImgPipeline
        >>> pipe = SimpleNamespace(scheduler=FlowMatchEulerDiscreteScheduler(shift_terminal=0.1))
        >>> steps_problem(pipe, 1)[:62], steps_problem(pipe, 2)
        ('--steps 1: FlowMatchEulerDiscreteScheduler cannot make a sched', None)
        >>> steps_problem(StableDiffusionXLImg2ImgPipeline, 2)[:77]
        '--steps 2: StableDiffusionXLImg2ImgPipeline denoises 0 of 2 steps at strength'
        >>> steps_problem(StableDiffusionXLImg2ImgPipeline, 4), steps_problem(FluxImg2ImgPipeline, 2, 0.3)
        (None, None)
    """
    scheduler = None if isinstance(pipe_or_class, type) else getattr(pipe_or_class, "scheduler", None)
    if not schedulable(scheduler, steps):
        more = next((n for n in range(steps + 1, steps + 4) if schedulable(scheduler, n)), None)
        return (f"--steps {steps}: {type(scheduler).__name__} cannot make a schedule of {steps} step(s) from this "
                f"model's scheduler config (its timesteps come out empty or not finite); "
                + (f"use --steps {more} or more" if more else "give the model another scheduler"))
    cls = pipe_or_class if isinstance(pipe_or_class, type) else type(pipe_or_class)
    if strength is None:
        param = call_params(cls).get("strength")
        strength = param.default if param is not None else None
    enough = fewest_steps(cls, steps, strength)
    if enough == steps:
        return None
    count = _denoised(cls, steps, strength)
    return (f"--steps {steps}: {cls.__name__} denoises {count} of {steps} steps at strength "
            f"{strength:g} (it starts from the input image that far along, and skips the rest)"
            + (f"; use --steps {enough} or more" if enough else "") + f" or a larger {arg('strength')}")


def fewest_steps(cls: Any, steps: int, strength: Any) -> int | None:
    """The fewest steps from ``steps`` up at which image-to-image class ``cls`` denoises one at ``strength``
    (:func:`_denoised`): ``steps`` when they do or no count is known; None when none within ``1 / strength`` more does.

    Example:
        >>> from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionXLPipeline
        >>> fewest_steps(StableDiffusionImg2ImgPipeline, 1, 0.3), fewest_steps(StableDiffusionXLPipeline, 1, 0.3)
        (4, 1)
    """
    if not (isinstance(strength, (int, float)) and 0 < strength <= 1):
        return steps
    count = _denoised(cls, steps, strength)
    if count is None or count >= 1:
        return steps
    return next((n for n in range(steps + 1, steps + 2 + math.ceil(1 / strength))
                 if (_denoised(cls, n, strength) or 0) >= 1), None)


def call_params(cls: Any, method: str = "__call__") -> Mapping[str, Any]:
    """The parameters of a pipeline's ``__call__`` (or another method: ``"encode_prompt"``), for a class, an instance or a
    diffusers class name; empty where it cannot be read. The one reader of what a pipeline is called with.

    Example:
        >>> "strength" in call_params("StableDiffusionImg2ImgPipeline"), call_params("NoSuchPipeline")
        (True, {})
        >>> "image" in call_params("QwenImageEditPipeline", "encode_prompt"), call_params("FluxPipeline", "nothing")
        (True, {})
    """
    if isinstance(cls, str):
        import diffusers

        cls = getattr(diffusers, cls, None)
    function = getattr(cls, method, None) if cls is not None else None
    if function is None:
        return {}
    try:
        return inspect.signature(function).parameters
    except (TypeError, ValueError):
        return {}


def _denoised(cls: Any, steps: int, strength: float) -> int | None:
    """How many of ``steps`` steps an image-to-image class denoises at ``strength``: its own ``get_timesteps`` on a
    stand-in schedule of ``steps`` timesteps (the count does not depend on the scheduler's values); None without one.

    Example:
        >>> from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionXLPipeline
        >>> _denoised(StableDiffusionImg2ImgPipeline, 10, 0.25), _denoised(StableDiffusionXLPipeline, 10, 0.25)
        (2, None)
    """
    from types import SimpleNamespace

    import torch

    get = getattr(cls, "get_timesteps", None)
    if get is None:
        return None
    timesteps = torch.arange(steps, 0, -1)
    schedule = SimpleNamespace(timesteps=timesteps, order=1, set_begin_index=lambda index: None,
                               config=SimpleNamespace(num_train_timesteps=1000))
    known = {"num_inference_steps": steps, "strength": strength, "device": "cpu", "timesteps": timesteps,
             "denoising_start": None}
    try:
        params = list(inspect.signature(get).parameters.values())[1:]
        if any(p.name not in known and p.default is p.empty for p in params):
            return None
        count = get(SimpleNamespace(scheduler=schedule), **{p.name: known[p.name] for p in params if p.name in known})
    except Exception:  # noqa: BLE001 -- a get_timesteps that needs more of the pipeline: no count known
        return None
    count = count[1] if isinstance(count, tuple) and len(count) == 2 else None
    return int(count) if isinstance(count, (int, float)) or torch.is_tensor(count) else None
