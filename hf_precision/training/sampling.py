"""Validation inside training: sample from the live weights, then put every dtype, device and mode back.

diffusers' examples build a validation pipeline with ``torch_dtype=weight_dtype`` around the live UNet, which casts
its fp32 LoRA weights to fp16; the next step then fails with "Attempting to unscale FP16 gradients"
(huggingface/diffusers#13124, fixed per script in PR #13895). Here the pipeline is used as planned (the recipe's
hooks already make every boundary agree) and whatever the validation code casts or moves is restored on exit:
trainable weights bit for bit from a copy, frozen tensors in dtype and device.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

__all__ = ["sampling"]


@contextlib.contextmanager
def sampling(tp: Any) -> Iterator[Any]:
    comps = tp.components
    modes = {n: m.training for n, m in comps.items()}
    masters = [(p, p.detach().clone()) for _, p in tp.named_parameters()]
    frozen = [(t, t.dtype, t.device) for m in comps.values() for t in (*m.parameters(), *m.buffers()) if not t.requires_grad]
    for module in comps.values():
        module.eval()
    try:
        with torch.no_grad():
            yield tp.pipe
    finally:
        with torch.no_grad():
            for t, dtype, device in frozen:
                if t.dtype != dtype or t.device != device:
                    t.data = t.data.to(device=device, dtype=dtype)
            for p, saved in masters:
                if p.dtype != saved.dtype or p.device != saved.device:
                    p.data = saved
                else:
                    p.copy_(saved)
        for name, module in comps.items():
            module.train(modes[name])
