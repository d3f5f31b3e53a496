"""Layer 5: what fits in memory, predicted from configs on the meta device, for every program.

``counting`` (bytes a forward keeps alive on meta), ``peaks`` (each inference phase's peak), ``train_step`` (one
training step's activations and fp8 copies), ``stand_ins`` (forwards, by module class, that replace one sizing its
tensors by values while a step is counted), ``planner`` (:func:`choose`: the first candidate that fits a budget;
the weights resident under each offload mode), ``geometry`` (a VAE's space and time factors). The apps give their
candidates and predict functions; the counting and the choosing are here, once. Submodules load lazily.
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
