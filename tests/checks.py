"""Assertions shared by the loader tests: outputs are finite, parameters follow the plan."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

import hf_precision as hp
from hf_precision.recipe.model import Recipe


def same_load(recipe: str, devices: Any) -> list[tuple[str, ...]]:
    """``devices`` grouped by what loading and running ``recipe``'s pipeline on this CPU reads of their recipes: every
    component's plan (storage, compute, islands, entries, attention upcast, NaN guard, quantization; not its words)
    and what the device computes (the NaN guard's fallbacks). Devices of one group load the same, byte for byte, so
    a test that loads and runs a pipeline runs once per group (t4, then cpu-avx512, then cpu first where the group
    has it: the layouts the plan-bytes checks take). Computed from the recipes, so a device whose rules change gets
    a run of its own.

    >>> same_load("sdxl", ["t4", "v100", "a100"])
    [('t4', 'v100'), ('a100',)]
    """
    import json

    groups: dict[str, list[str]] = {}
    for device in devices:
        plans = [{k: v for k, v in p.to_dict().items() if k not in ("why", "decisions", "resolved_for", "device")}
                 for p in hp.get_recipe(recipe, device=device).policies]
        key = json.dumps([plans, hp.device_caps(device).compute], sort_keys=True, default=str)
        groups.setdefault(key, []).append(device)
    first = ("t4", "cpu-avx512", "cpu")
    return [tuple(sorted(g, key=lambda d: first.index(d) if d in first else len(first))) for g in groups.values()]


def group_id(value: Any) -> str:
    """A pytest id for a group of ``same_load``: its devices joined by ``+``."""
    return "+".join(value) if isinstance(value, tuple) else str(value)


def output_array(out: Any) -> np.ndarray:
    """The images or frames of a pipeline output as one float array."""
    data = getattr(out, "images", None)
    if data is None:  # Kandinsky 5 Image's output names its pictures `image`
        data = getattr(out, "image", None)
    if data is None:
        data = out.frames
    if isinstance(data, torch.Tensor):
        return data.float().cpu().numpy()
    if isinstance(data, list):
        return np.stack([np.asarray(x, dtype=np.float32) for x in data])
    return np.asarray(data, dtype=np.float32)


def assert_finite(out: Any) -> np.ndarray:
    arr = output_array(out)
    assert arr.size > 0
    assert np.isfinite(arr).all(), f"{(~np.isfinite(arr)).sum()} non-finite values in the output"
    return arr


def assert_plan_dtypes(pipe: Any, recipe: Recipe) -> None:
    """Every floating parameter of each planned component holds the planned dtype; islands hold float32.

    Guards against vacuous passes: a half plan must have half parameters, and islands must be non-empty.
    """
    record = hp.applied(pipe)
    assert record is not None, "the pipeline was not applied"
    for plan in recipe.policies:
        module = getattr(pipe, plan.name, None)
        if module is None:
            continue
        islands = record.islands.get(plan.name, [])
        inside = lambda name: any(name == i or name.startswith(i + ".") for i in islands)
        seen = set()
        for name, param in module.named_parameters():
            if not param.is_floating_point():
                continue
            have = str(param.dtype).removeprefix("torch.")
            if inside(name.rsplit(".", 1)[0]):
                assert have == "float32", f"{plan.name}.{name} is {have}, island should be float32"
            elif plan.storage != plan.compute:
                assert have in (plan.storage, plan.compute), f"{plan.name}.{name} is {have}"
            else:
                assert have == plan.storage, f"{plan.name}.{name} is {have}, plan says {plan.storage}"
            seen.add(have)
        assert plan.storage in seen or plan.compute in seen, f"{plan.name}: no parameter in {plan.storage}"
        if plan.keep_fp32 and plan.compute != "float32":
            left = any("left to the layerwise casting" in a for a in record.actions)
            assert islands or left, f"{plan.name}: keep_fp32 {plan.keep_fp32} produced no island"


def held_bytes(module: Any) -> int:
    """Every byte a module holds, counted here independently of the library: each parameter and buffer once,
    persistent or not, a quantized tensor by its inner tensors (data, scales, zero points)."""
    from hf_precision.runtime.quantize import tensor_bytes

    tensors = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(tensor_bytes(t) for t in tensors.values())


def assert_plan_bytes(pipe: Any, folder: Any, layout: Any, overrides: Any = None) -> None:
    """``hp.plan`` of the folder counts every byte each loaded component holds (:func:`held_bytes`), and the
    library's own measure (``module_bytes``) agrees."""
    from hf_precision.runtime.quantize import module_bytes

    planned = hp.plan(folder, device=layout, overrides=overrides)
    assert planned.components, "nothing planned"
    held = {c: held_bytes(getattr(pipe, c)) for c in planned.components}
    assert held == {c: p.total_bytes for c, p in planned.components.items()}
    assert held == {c: module_bytes(getattr(pipe, c)) for c in planned.components}


def write_clips(folder: Any, frames: int = 5, side: int = 16, caption: str = "a cat walking") -> Any:
    """Two GIF clips of ``frames`` frames (grey ramps, one per clip) with a caption file each: a video training set."""
    from pathlib import Path

    from PIL import Image

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        shots = [Image.fromarray(np.full((side, side, 3), (20 * j + 50 * i) % 256, np.uint8)) for j in range(frames)]
        shots[0].save(folder / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (folder / f"c{i}.txt").write_text(caption)
    return folder
