"""Layer 4 (torch, diffusers, peft): training under the recipes. ``prepare_training`` puts frozen parts in their
inference recipe, trainable parts in fp32 masters with the device's training compute, and owns loss scaling.

Names are bound lazily: a submodule is imported on first use."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "prepare_training": "setup", "TrainingSetup": "setup", "Components": "resolve",
    "resolve_training": "resolve", "TrainingRecipe": "resolve",
    "TrainingError": "rules", "training_compute": "rules", "TRAINING_ORDER": "rules",
    "ROWS": "denoiser_rows", "DenoiserRow": "denoiser_rows", "row_of": "denoiser_rows", "objective_of": "objectives",
    "example_batch": "denoiser_rows", "add_rows": "denoiser_rows", "call_inputs": "denoiser_rows",
    "stochastic_round_": "scaler", "Stepper": "scaler",
    "TokenRows": "trainable", "default_targets": "trainable",
    "normalise_latents": "encode",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
