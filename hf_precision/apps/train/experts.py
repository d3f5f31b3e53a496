"""``--expert``: which denoising expert of a two-expert model (Wan 2.2 A14B: ``transformer`` for high noise,
``transformer_2`` for low noise, switched at ``boundary_ratio``) a run of the training program trains.

People choose per run: ai-toolkit's Wan 2.2 configs (``model_kwargs: train_high_noise / train_low_noise``) and
musubi-tuner (one ``--dit`` per run, its timestep window) train the high-noise expert, the low-noise one, or (ai-toolkit)
both, switching every few steps. The training layer (:mod:`hf_precision.training.experts`) trains one expert per plan,
on the noise levels it owns, so the program offers ``high`` (default: the expert that lays out the composition, and
what a run trained before ``--expert`` existed) and ``low``; a LoRA of each is saved as diffusers' Wan loader reads it
(the low-noise one: ``pipe.load_lora_weights(OUT, load_into_transformer_2=True)``). Read from ``model_index.json``
alone, so a wrong choice is refused before loading.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ...errors import RecipeError

__all__ = ["EXPERT_CHOICES", "boundary_ratio", "expert_train", "expert_line"]

EXPERT_CHOICES = ("high", "low")
_COMPONENT = {"high": "transformer", "low": "transformer_2"}


def boundary_ratio(index: Mapping[str, Any]) -> float | None:
    """The ratio at which a pipeline switches from ``transformer`` to ``transformer_2``; None for one denoiser.

    Example:
        >>> boundary_ratio({"transformer": ["diffusers", "W"], "transformer_2": ["diffusers", "W"], "boundary_ratio": 0.875})
        0.875
        >>> boundary_ratio({"transformer": ["diffusers", "W"], "transformer_2": [None, None], "boundary_ratio": None})
    """
    from ...runtime.source import listed_components

    ratio = index.get("boundary_ratio")
    return float(ratio) if ratio is not None and "transformer_2" in listed_components(index) else None


def expert_train(train: Mapping[str, str], index: Mapping[str, Any], expert: str | None) -> dict[str, str]:
    """``train=`` with the chosen expert in the denoiser's place; refused for a model with one denoiser.

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
    out = dict(train)
    if "transformer" in out:
        out[_COMPONENT[expert]] = out.pop("transformer")
    return out


def expert_line(index: Mapping[str, Any], train: Mapping[str, str]) -> str | None:
    """What a plan or a run prints for a two-expert model: which expert trains, on which timesteps; None otherwise.

    Example:
        >>> idx = {"_class_name": "WanPipeline", "transformer": ["diffusers", "W"], "transformer_2": ["diffusers", "W"],
        ...        "boundary_ratio": 0.875}
        >>> print(expert_line(idx, {"transformer_2": "lora"}))
        experts: WanPipeline switches at boundary_ratio 0.875; this run trains the low-noise expert transformer_2 (timesteps below 0.875 x num_train_timesteps); transformer (high noise) stays frozen (--expert high trains it)
    """
    ratio = boundary_ratio(index)
    if ratio is None:
        return None
    low = "transformer_2" in train
    trained, other = ("low", "high") if low else ("high", "low")
    window = f"timesteps {'below' if low else 'from'} {ratio:g} x num_train_timesteps"
    return (f"experts: {index.get('_class_name')} switches at boundary_ratio {ratio:g}; this run trains the "
            f"{trained}-noise expert {_COMPONENT[trained]} ({window}); {_COMPONENT[other]} ({other} noise) stays "
            f"frozen (--expert {other} trains it)")
