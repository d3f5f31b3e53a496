"""Layer 5: what fits in memory, predicted from configs on the meta device, for every program.

``counting`` (the bytes a forward keeps alive on the meta device), ``peaks`` (the peak of each inference phase: text
encode, image encode, VAE encode and decode, one denoiser call; models built on meta to count them), ``train_step``
(the activations of one training forward and backward, fp8 copies held for backward, a meta model made trainable),
``stand_ins`` (forwards, by module class, that replace one sizing its tensors by values while a step is counted),
``planner`` (:func:`choose`: the first candidate whose prediction fits a budget, and the :class:`Choice` that
describes it; the weights resident under each offload mode), ``geometry`` (how far a VAE compresses space and time).
The image, video and training plans of :mod:`hf_precision.apps` give their candidates and their predict function;
the counting and the choosing are here, once.

Names are bound lazily: a submodule is imported on first use.
"""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    "count_live_bytes": "counting",
    "Choice": "planner", "choose": "planner", "resident_bytes": "planner",
    "vae_factors": "geometry",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
