"""Training results out: LoRA weights in the diffusers/peft layout ``pipe.load_lora_weights`` reads, and trained
token rows in the layout ``pipe.load_textual_inversion`` reads. Files are written whole or not at all."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..recipe.files import shared_mode
from .rules import TrainingError

__all__ = ["save_lora", "save_embeddings", "LORA_FILE"]

LORA_FILE = "pytorch_lora_weights.safetensors"


def _pipeline_class(tp: Any) -> type:
    import diffusers

    cls = type(tp.pipe)
    if hasattr(cls, "save_lora_weights"):
        return cls
    for name in tp.recipe.pipelines:
        candidate = getattr(diffusers, name, None)
        if candidate is not None and hasattr(candidate, "save_lora_weights"):
            return candidate
    raise TrainingError(f"tp.save_lora: no diffusers pipeline class of recipe {tp.recipe.name} can save LoRA weights "
                        f"(tried {type(tp.pipe).__name__}, {', '.join(tp.recipe.pipelines) or '-'})")


def save_lora(tp: Any, path: Any, dtype: torch.dtype = torch.float16) -> Path:
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    layers = {}
    for name, kind in tp.kinds.items():
        if kind == "lora":
            state = get_peft_model_state_dict(tp.components[name])
            layers[f"{name}_lora_layers"] = {k: v.detach().to(dtype) for k, v in convert_state_dict_to_diffusers(state).items()}
    if not layers:
        raise TrainingError(f"tp.save_lora: nothing trains as LoRA in this plan (train: {tp.kinds})")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".lora-"))
    try:
        _pipeline_class(tp).save_lora_weights(save_directory=str(scratch), **layers)
        target = folder / LORA_FILE
        os.replace(scratch / LORA_FILE, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def save_embeddings(tp: Any, path: Any) -> list[Path]:
    """One ``{token: row}`` safetensors file per new token (``<path>/<component>.<token>.safetensors``)."""
    from safetensors.torch import save_file

    if not tp.token_rows:
        raise TrainingError("tp.save_embeddings: no component trains new tokens (train={...: 'embedding'}, tokens=...)")
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for comp, rows in tp.token_rows.items():
        for i, token in enumerate(tp.tokens[comp]):
            safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", token).strip("_") or f"token{i}"
            target = folder / f"{comp}.{safe}.safetensors"
            fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
            os.close(fd)
            try:
                save_file({token: rows.rows[i].detach().to(rows.weight.dtype).cpu().contiguous()}, tmp)
                shared_mode(tmp)
                os.replace(tmp, target)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
            written.append(target)
    return written
