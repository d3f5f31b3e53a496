"""Checkpoints and outputs of a sharded (``--shard``, FSDP2) run: every rank takes part, one rank writes files.

A sharded checkpoint holds ``sharded/`` (``torch.distributed.checkpoint``: the trainable weights' and optimizer's
shards, loadable at another world size) and the one-process ``state.pt``; rank 0 renames the shared temporary
folder into place after every rank wrote. Outputs are gathered whole and written by rank 0 in the usual formats.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import RecipeError
from ...training.methods import method_of

__all__ = ["SHARDED", "is_sharded", "save_sharded", "load_sharded", "save_full_model", "accelerate_shard", "holding"]

SHARDED = "sharded"


def is_sharded(path: Path) -> bool:
    """Whether a checkpoint folder is a sharded one (``sharded/`` beside ``state.pt``)."""
    return (path / SHARDED / ".metadata").is_file()


def _rank0() -> bool:
    import torch.distributed as dist

    return not dist.is_initialized() or dist.get_rank() == 0


def _barrier() -> None:
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()


def _trainables(tp: Any) -> Any:
    import torch

    # one module over the trained components, so the saved names are "unet.<fqn>" as in the one-process checkpoint
    return torch.nn.ModuleDict({n: m for n, m in tp.components.items()
                                if n in tp.kinds and method_of(tp.kinds[n]).trains_weights})


def _options(strict: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # only what trains is saved; loading it back leaves the frozen weights (not in the checkpoint) as loaded
    return StateDictOptions(ignore_frozen_params=True, strict=strict)


def save_sharded(folder: Path, step: int, tp: Any, optimizer: Any, state: Mapping[str, Any], keep: int) -> Path:
    """Write one sharded checkpoint (every rank calls it); returns its folder."""
    import os

    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    target = folder / f"step-{step:06d}"
    tmp = folder / f".step-{step:06d}.sharding"  # one name on every rank (a shared folder): removed if a save is killed
    if _rank0():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    _barrier()
    model_state, optim_state = get_state_dict(_trainables(tp), optimizer, options=_options())
    dcp.save({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(tmp / SHARDED))
    if _rank0():
        torch.save(dict(state), tmp / "state.pt")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    _barrier()
    return target


def load_sharded(path: Path, tp: Any, optimizer: Any) -> None:
    """Load a sharded checkpoint's trainable weights and optimizer state, at any world size (dcp re-slices them)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    container = _trainables(tp)
    model_state, optim_state = get_state_dict(container, optimizer, options=_options())
    try:
        dcp.load({"model": model_state, "optimizer": optim_state}, checkpoint_id=str(path / SHARDED))
    except Exception as err:  # missing keys, other shapes: torch raises its own types from every rank
        first = str(err).strip().splitlines()[0][:300] if str(err).strip() else type(err).__name__
        raise RecipeError(f"{path}: the sharded checkpoint does not fit this run ({first}); resume with the same "
                          f"--model, method, --lora-rank and trained parts") from None
    set_state_dict(container, optimizer, model_state_dict=model_state, optim_state_dict=optim_state,
                   options=_options(strict=False))


def save_full_model(module: Any, target: Path) -> None:
    """A sharded full fine-tune as a diffusers model folder, gathered to rank 0's CPU (every rank calls it)."""
    from safetensors.torch import save_file
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not _rank0():
        return
    target.mkdir(parents=True, exist_ok=True)
    module.save_config(str(target))
    save_file({k: v.contiguous() for k, v in state.items()}, str(target / "diffusion_pytorch_model.safetensors"),
              metadata={"format": "pt"})


def holding(tp: Any) -> str:
    """One line per rank: its bytes of the sharded weights, the island shards' dtypes, each frozen component's."""
    from ...training.shard import sharded_bytes

    parts, islands = [], []
    for unit in tp.shard.units:
        comp, _, sub = unit.path.partition(".")
        module = tp.components[comp]
        if unit.role == "root":
            local, whole = sharded_bytes(module)
            parts.append(f"{comp} {local:,} of {whole:,} bytes ({local / max(whole, 1):.1%})")
        elif unit.role == "island":
            dtypes = sorted({str(p.dtype).removeprefix("torch.") for p in module.get_submodule(sub).parameters()})
            islands.append(f"{unit.path} {'/'.join(dtypes)}")
    for name, choice in tp.shard.frozen.items():
        if choice.sharded:
            local, whole = sharded_bytes(tp.components[name])
            parts.append(f"frozen {name} {local:,} of {whole:,} bytes ({local / max(whole, 1):.1%})")
    replicated = [f"{c} replicated" for c, f in tp.shard.frozen.items() if not f.sharded]
    return (f"holds {'; '.join(parts)} of the sharded weights"
            + (f"; island shards: {', '.join(islands)}" if islands else "")
            + (f"; frozen: {', '.join(replicated)}" if replicated else ""))


def accelerate_shard() -> bool:
    """Whether accelerate's config asks for FSDP2 (``fsdp_version: 2``); FSDP1 and DeepSpeed/Megatron are refused
    naming what to use. Read from ``accelerate launch``'s environment before the Accelerator is made, which would
    first stop DeepSpeed with "DeepSpeed is not installed" and on the CPU make MULTI_CPU whatever the config says.

    Example:
        >>> import os
        >>> os.environ.get("ACCELERATE_USE_FSDP") is None and accelerate_shard()  # a plain run: nothing asked
        False
    """
    import os

    from accelerate.utils import DistributedType

    def asked(name: str) -> bool:
        return os.environ.get(name, "").lower() in ("1", "true", "yes")

    use = ("use `hf-precision train --shard` under `torchrun --nproc_per_node N` or `accelerate launch` with an FSDP2 "
           "config (fsdp_version: 2): it shards each block in the dtypes of the recipe")
    if asked("ACCELERATE_USE_FSDP"):
        version = int(os.environ.get("FSDP_VERSION") or 1)  # accelerate's FSDP plugin reads the same variable
        if version == 2:
            return True
        raise RecipeError(f"accelerate config selects FSDP version {version}: FSDP1 flattens each wrapped module into "
                          f"one flat parameter of one dtype, so the recipe's fp32 islands and fp32 masters cannot keep "
                          f"their own dtype; {use}")
    kind = next((k for k in (DistributedType.DEEPSPEED, DistributedType.MEGATRON_LM)
                 if asked(f"ACCELERATE_USE_{k.value}")), None)
    if kind is not None:
        raise RecipeError(f"accelerate config selects {kind.value}: it casts and partitions the model as a whole (one "
                          f"dtype for all weights), which the recipe's per-module dtypes and fp32 masters cannot keep; "
                          f"{use}")
    return False
