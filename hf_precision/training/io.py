"""Training results out: LoRA weights in the diffusers/peft layout ``pipe.load_lora_weights`` reads (peft's own
adapter folders for a pipeline diffusers has no LoRA loader for), and trained token rows in the layout
``pipe.load_textual_inversion`` reads. Files are written whole or not at all."""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from ..recipe.files import shared_mode
from .methods import method_of
from .rules import TrainingError

__all__ = ["save_lora", "save_embeddings", "lora_loader", "lora_reader", "lora_save_problem", "LORA_FILE", "PEFT_FILE"]

LORA_FILE = "pytorch_lora_weights.safetensors"
PEFT_FILE = "adapter_model.safetensors"  # peft's PeftModel.save_pretrained names; adapter_config.json beside it


def lora_loader(pipeline: str, recipe_pipelines: Any = ()) -> type | None:
    """The pipeline class whose LoRA loader mixin serves ``pipeline``: itself, else one its recipe names; None where
    diffusers 0.42 has none (PixArt, SVD, DiT): :func:`save_lora` then writes peft's adapter folders.

    Example:
        >>> lora_loader("StableDiffusionXLPipeline").__name__, lora_loader("PixArtSigmaPipeline")
        ('StableDiffusionXLPipeline', None)
    """
    import diffusers

    for name in (pipeline, *recipe_pipelines):
        candidate = getattr(diffusers, str(name), None)
        if candidate is not None and hasattr(candidate, "save_lora_weights"):
            return candidate
    return None


def lora_save_problem(pipeline: str, names: Any, recipe_pipelines: Any = ()) -> str | None:
    """Why the LoRA of components ``names`` of ``pipeline`` cannot be written where ``pipe.load_lora_weights`` reads
    it, or None: diffusers' loader of the pipeline takes some components' LoRA only (HiDream, Wan, HunyuanVideo: the
    transformer's; ``save_lora_weights`` has a ``<component>_lora_layers`` argument per component it writes).

    Example:
        >>> lora_save_problem("StableDiffusionXLPipeline", ["unet", "text_encoder", "text_encoder_2"])
        >>> lora_save_problem("WanPipeline", ["transformer", "text_encoder"])
        "WanPipeline's LoRA file is written by diffusers' WanPipeline.save_lora_weights, which takes the LoRA of transformer only, not of text_encoder"
    """
    import inspect

    loader = lora_loader(pipeline, recipe_pipelines)
    if loader is None:  # peft's own adapter folders: any component
        return None
    takes = [p.removesuffix("_lora_layers") for p in inspect.signature(loader.save_lora_weights).parameters
             if p.endswith("_lora_layers")]
    missing = [n for n in names if _saved_as(loader, n) not in takes]
    if not missing:
        return None
    return (f"{pipeline}'s LoRA file is written by diffusers' {loader.__name__}.save_lora_weights, which takes the "
            f"LoRA of {', '.join(takes)} only, not of {', '.join(missing)}")


def lora_reader(folder: Any, pipe: str = "pipe") -> str:
    """The Python that loads the LoRA :func:`save_lora` wrote in ``folder`` back into ``pipe``.

    Example:
        >>> lora_reader("out")
        "pipe.load_lora_weights('out')"
    """
    folder = Path(folder)
    adapters = sorted(p.parent.name for p in folder.glob(f"*/{PEFT_FILE}"))
    if (folder / LORA_FILE).is_file() or not adapters:
        return f"{pipe}.load_lora_weights({str(folder)!r})"
    return "; ".join(["from peft import PeftModel"] + [
        f"{pipe}.{name} = PeftModel.from_pretrained({pipe}.{name}, {str(folder / name)!r}).merge_and_unload()"
        for name in adapters])


def save_lora(tp: Any, path: Any, dtype: torch.dtype = torch.float16) -> Path:
    """Write the LoRA weights of ``tp``: one ``pytorch_lora_weights.safetensors`` for ``pipe.load_lora_weights``, or,
    without a loader (PixArt), peft's folder per component for ``PeftModel.from_pretrained``; returns what was
    written (:func:`lora_reader` says how to load it).
    """
    from diffusers.utils import convert_state_dict_to_diffusers
    from peft.utils import get_peft_model_state_dict

    names = [name for name, kind in tp.kinds.items() if method_of(kind).saves_adapter]
    if not names:
        raise TrainingError(f"tp.save_lora: nothing trains as LoRA in this plan (train: {tp.kinds})")
    sharded = getattr(tp, "shard", None) is not None
    if sharded:  # every rank gathers the whole adapters (a collective), then only rank 0 writes
        import torch.distributed as dist

        from .shard import full_state
    states = {name: get_peft_model_state_dict(tp.components[name], state_dict=full_state(tp.components[name], "lora_")
                                              if sharded else None) for name in names}
    loader = lora_loader(type(tp.pipe).__name__, tp.recipe.pipelines)
    problem = lora_save_problem(type(tp.pipe).__name__, names, tp.recipe.pipelines)
    if problem:  # the loader's TypeError on an unexpected keyword, once the training is done
        raise TrainingError(f"tp.save_lora: {problem}; save those adapters yourself (peft's "
                            f"get_peft_model_state_dict(tp.components[name])), or train them frozen")
    folder = Path(path)
    if sharded and dist.is_initialized() and dist.get_rank() != 0:
        return folder / LORA_FILE
    folder.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(dir=folder, prefix=".lora-"))
    try:
        if loader is None:
            return _save_peft(tp, names, folder, scratch, dtype, states)
        layers = {f"{_saved_as(loader, name)}_lora_layers": {k: v.detach().to(dtype) for k, v in
                                                             convert_state_dict_to_diffusers(states[name]).items()}
                  for name in names}
        loader.save_lora_weights(save_directory=str(scratch), **layers)
        target = folder / LORA_FILE
        os.replace(scratch / LORA_FILE, target)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return target


def _saved_as(loader: type, name: str) -> str:
    """The component name the loader saves ``name``'s LoRA under: Wan 2.2's ``transformer_2`` as ``transformer``
    (WanLoraLoaderMixin.save_lora_weights takes transformer_lora_layers only; read back with
    ``load_into_transformer_2=True``, diffusers loaders/lora_pipeline.py)."""
    import inspect

    takes = inspect.signature(loader.save_lora_weights).parameters
    return "transformer" if name == "transformer_2" and "transformer_2_lora_layers" not in takes else name


def _save_peft(tp: Any, names: list[str], folder: Path, scratch: Path, dtype: torch.dtype,
               states: dict[str, dict[str, torch.Tensor]]) -> Path:
    """Each component's adapter as ``PeftModel.save_pretrained`` writes it (keys under ``base_model.model.``)."""
    from safetensors.torch import save_file

    for name in names:
        module = tp.components[name]
        state = {f"base_model.model.{k}": v.detach().to(dtype).cpu().contiguous() for k, v in states[name].items()}
        (scratch / name).mkdir()
        module.peft_config["default"].save_pretrained(str(scratch / name))
        save_file(state, str(scratch / name / PEFT_FILE), metadata={"format": "pt"})
    for name in names:  # each component's folder replaced whole
        if (folder / name).exists():
            shutil.rmtree(folder / name)
        os.replace(scratch / name, folder / name)
    return folder


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
