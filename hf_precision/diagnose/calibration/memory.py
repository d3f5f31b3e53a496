"""Whether calibrate's runs fit the machine: the reference dtype and model offload, chosen before any weight loads
when calibrate is given a folder (the safetensors headers say how many values each component holds)."""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ... import dtypes as dt
from ...errors import RecipeError
from ...runtime.headers import read_header
from ...runtime.memory import available_bytes
from ...runtime.single_file import SAFETENSORS_SUFFIXES
from ...units import format_bytes

__all__ = ["folder_numel", "memory_plan", "open_pipeline"]


def folder_numel(folder: Path) -> dict[str, int]:
    """Component -> number of floating values in its default safetensors files (read from the headers only)."""
    out: dict[str, int] = {}
    for comp in sorted(p for p in folder.iterdir() if p.is_dir()):
        files = [f for f in comp.glob("*.safetensors") if ".fp16." not in f.name and ".bf16." not in f.name]
        if files:
            out[comp.name] = sum(file_numel(f) for f in files)
    return out


def memory_plan(numel: Mapping[str, int], run_on: str, reference: str | None, target: str,
                 resident: int = 0, max_memory: int | None = None) -> tuple[str, bool]:
    """(reference dtype, offload) that fit this machine, or a RecipeError that says what to do.

    ``resident``: bytes of the pipeline already on ``run_on`` (not counted again). ``max_memory``: a budget in bytes
    for everything the runs hold there; with it model offload is chosen on any device, the CPU too (the same code path,
    without a memory gain).
    """
    available = available_bytes(run_on)
    if max_memory is not None:
        available, resident = (max_memory if available is None else min(available, max_memory)), 0
    total, largest = sum(numel.values()), max(numel.values(), default=0)
    # The reference weights stay in memory while a half copy of the component runs: 1 + half/reference per value.
    need = lambda dtype, n: max(0, int(n * (dt.itemsize(dtype) + dt.itemsize(target))) - resident)
    choices = [reference] if reference else ["float32", "bfloat16"]
    if available is None:
        return choices[0], False
    accelerator = not run_on.startswith("cpu") or max_memory is not None
    for ref in choices:
        if need(ref, total) <= available:
            return ref, False
        if accelerator and need(ref, largest) <= available:
            return ref, True  # enable_model_cpu_offload: one component on the accelerator at a time
    budget = " within max_memory" if max_memory is not None else ""
    tried = " nor with model offload (enable_model_cpu_offload: one component at a time)" if accelerator else ""
    raise RecipeError(
        f"calibrate: the {choices[0]} reference run needs about {format_bytes(need(choices[0], total))} "
        f"(largest component {format_bytes(need(choices[0], largest))}); {run_on} has {format_bytes(available)} available{budget}, "
        f"so it fits neither whole{tried}. The islands do not depend on the machine that measures them: run "
        f"calibrate where the model fits (run_on='cuda', CLI --device cuda), with a larger budget (max_memory=..., "
        "CLI --max-memory), or with reference='bfloat16' (CLI --reference bfloat16; ranges only, the error vs "
        "reference is then against bf16), or on a smaller input (fewer --steps do not lower memory)")


def file_numel(path: Path) -> int:
    """The number of floating values a single ``.safetensors`` file holds (its header only); 0 for another format."""
    if path.suffix.lower() not in SAFETENSORS_SUFFIXES:
        return 0  # a GGUF's quantized blocks: the base's own denoiser counts for it
    # the header is checked against the file, its metadata dropped
    return sum(math.prod(i["shape"]) for i in read_header(path)[1].values()
               if str(i.get("dtype", "")).startswith(("F", "BF")))


def open_pipeline(pipe_or_folder: Any, run_on: str, reference: str | None, target: str | None, recipe: str | None,
                  max_memory: int | None, base: Any = None) -> tuple[Any, bool, str, bool]:
    """(pipeline, loaded here, reference dtype, offload): a folder is loaded in the reference dtype that fits (on the CPU
    when the runs offload), a single file as ``load_pipeline(file, base=base)`` (its values counted beside all the
    base's: conservative); a pipeline object is used as it is, its resident weights counted.
    """
    import torch

    if isinstance(pipe_or_folder, (str, os.PathLike)):
        from ...runtime.load import load_pipeline
        from ...runtime.single_file import split_single_file
        from ...runtime.source import locate

        single = split_single_file(pipe_or_folder, base, "calibrate")
        where, _, folder = locate(single[1] if single is not None else pipe_or_folder)
        numel = folder_numel(folder) if folder is not None else {}
        if single is not None:
            numel[str(single[0])] = file_numel(single[0])
        ref_dtype, offload = memory_plan(numel, run_on, reference, target or "float16", max_memory=max_memory)
        source = {"name_or_path": single[0], "base": where} if single is not None else {"name_or_path": where}
        pipe = load_pipeline(device="cpu" if offload else run_on, recipe=recipe, dtype=dt.to_torch(ref_dtype), **source)
        return pipe, True, ref_dtype, offload
    pipe = pipe_or_folder
    models = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
    numel = {n: sum(t.numel() for t in m.parameters() if t.is_floating_point()) for n, m in models.items()}
    resident = sum(t.numel() * t.element_size() for m in models.values() for t in m.parameters()
                   if t.is_floating_point() and t.device.type == torch.device(run_on).type)
    ref_dtype, offload = memory_plan(numel, run_on, reference, target or "float16", resident, max_memory)
    return pipe, False, ref_dtype, offload
