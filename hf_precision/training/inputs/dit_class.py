"""DiT's class label: the batch's ``class_labels``, else pipeline_dit.py ``__call__``'s ``class_null``, index
``num_embeds_ada_norm``, the unconditional embedding.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from .registry import builder


@builder('dit_class')
def _dit_class(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    labels = batch.get("class_labels")
    if labels is None:  # pipeline_dit.py class_null: index num_embeds_ada_norm, the unconditional embedding
        labels = torch.full((x0.shape[0],), int(module.config["num_embeds_ada_norm"]), device=x0.device)
    return {"class_labels": labels}
