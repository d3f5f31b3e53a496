"""A MeanFlow model's second timestep: HunyuanImage 2.1's distilled transformer (``use_meanflow``) embeds a timestep
``r`` beside ``t`` and averages the two embeddings (transformer_hunyuanimage.py:250-253), and its pipeline always
passes one, the next step's timestep (pipeline_hunyuanimage.py:755-760). Left out, as before, the training step
conditioned it on ``t``'s embedding alone, which the model never sees at inference. The flow-matching loss trains the
instantaneous velocity, which a MeanFlow model gives at ``r = t`` (the average velocity over an empty interval;
Geng et al. 2025, "Mean Flows for One-step Generative Modeling": u(z, t, t) = v(z, t)), so ``r`` is the sample's
own timestep.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('meanflow_r')
def _meanflow_r(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not module.config.get("use_meanflow") or batch.get("timestep") is None:
        return {}
    return {"timestep_r": batch["timestep"]}
