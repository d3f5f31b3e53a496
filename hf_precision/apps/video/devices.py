"""``--device-map balanced``: whole components placed over the visible accelerators, in the recipe's dtypes.

The denoiser goes alone on the device with the most room (its activations need the rest), the other components,
largest first, on the other device with the most room left; sizes are :func:`hf_precision.plan`'s bytes (islands
included), and the ``{component: device}`` result goes to :func:`hf_precision.load_pipeline`. Not accelerate's
``infer_auto_device_map`` (it splits one module by submodules in one dtype), nor diffusers' ``device_map="balanced"``
(pipelines/pipeline_loading_utils.py ``_assign_components_to_devices``: one ``torch_dtype``, round-robin, and a
component that does not fit goes to the CPU silently; here it is refused, with the fix).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from ...errors import RecipeError
from ...units import format_bytes

__all__ = ["Placement", "balanced_placement", "device_rooms", "plan_placement"]

FIX = ("run it on one GPU with --offload model (one component at a time on the GPU) or --max-memory SIZE (the "
       "cheapest offload/tiling that fits), instead of --device-map balanced")


@dataclasses.dataclass(frozen=True)
class Placement:
    """Where each component goes, and how full each device is (``rooms[i]`` is ``(device, free bytes)``)."""

    devices: dict[str, str]
    slots: dict[str, int]
    sizes: dict[str, int]
    rooms: list[tuple[str, int]]
    denoiser: str

    def mapping(self) -> dict[str, str]:
        """The ``device=`` argument of :func:`hf_precision.load_pipeline` (the rest go with the denoiser)."""
        return {**self.devices, "default": self.devices[self.denoiser]}

    def used(self, slot: int) -> int:
        return sum(self.sizes[c] for c, s in self.slots.items() if s == slot)

    def describe(self) -> str:
        lines = ["device map (balanced; components in the recipe's dtypes):"]
        for i, (device, room) in enumerate(self.rooms):
            names = [c for c, s in self.slots.items() if s == i]
            held = ", ".join(f"{c} {format_bytes(self.sizes[c])}" for c in names) or "nothing"
            lines.append(f"  {device} ({format_bytes(room)} free): {held}; {format_bytes(room - self.used(i))} left")
        return "\n".join(lines)


def balanced_placement(sizes: Mapping[str, int], rooms: Sequence[tuple[str, int]], denoiser: str) -> Placement:
    """Place whole components: the denoiser alone on the device with the most room, the rest largest first.

    ``sizes`` are bytes per component, ``rooms`` ``(device, free bytes)`` per device (a device may be listed twice).

    Example:
        >>> GB = 10**9
        >>> p = balanced_placement({"transformer": 28 * GB, "text_encoder": 11 * GB, "vae": GB},
        ...                        [("cuda:0", 24 * GB), ("cuda:1", 40 * GB)], "transformer")
        >>> p.devices
        {'transformer': 'cuda:1', 'text_encoder': 'cuda:0', 'vae': 'cuda:0'}

    Raises:
        RecipeError: no devices, or a component that fits on none of them (its size, the devices' room, the fix).
    """
    if not rooms:
        raise RecipeError(f"--device-map balanced: no accelerator is visible; {FIX}")
    if denoiser not in sizes:
        raise RecipeError(f"--device-map balanced: no size for the denoiser {denoiser!r} (components: "
                          f"{', '.join(sizes)})")
    left = [room for _, room in rooms]
    slots: dict[str, int] = {}

    def refuse(name: str) -> RecipeError:
        taken = {i: [c for c, s in slots.items() if s == i] for i in range(len(rooms))}
        state = "; ".join(f"{d} {format_bytes(r)} free" + (f", {format_bytes(r - left[i])} taken by {', '.join(taken[i])}"
                                                   if taken[i] else "") for i, (d, r) in enumerate(rooms))
        return RecipeError(f"--device-map balanced: {name} needs {format_bytes(sizes[name])} in the recipe's dtypes and no "
                           f"device has that room left ({state}); {FIX}")

    # The most room first; on a tie the first listed (cuda:0 before cuda:1).
    home = max(range(len(rooms)), key=lambda i: (left[i], -i))
    if sizes[denoiser] > left[home]:
        raise refuse(denoiser)
    slots[denoiser] = home
    left[home] -= sizes[denoiser]
    for name in sorted((c for c in sizes if c != denoiser), key=lambda c: -sizes[c]):
        others = [i for i in range(len(rooms)) if i != home and left[i] >= sizes[name]]
        if others:
            slot = max(others, key=lambda i: (left[i], -i))
        elif left[home] >= sizes[name]:
            slot = home  # no other device has room: share the denoiser's, as on one GPU
        else:
            raise refuse(name)
        slots[name] = slot
        left[slot] -= sizes[name]
    order = [denoiser, *(c for c in sizes if c != denoiser)]
    return Placement(devices={c: rooms[slots[c]][0] for c in order}, slots={c: slots[c] for c in order},
                     sizes={c: int(sizes[c]) for c in order}, rooms=[(d, int(r)) for d, r in rooms], denoiser=denoiser)


def device_rooms() -> list[tuple[str, int]]:
    """``(device, free bytes)`` of every visible accelerator (CUDA ``mem_get_info``, XPU ``mem_get_info``)."""
    import torch

    if torch.cuda.is_available():
        return [(f"cuda:{i}", int(torch.cuda.mem_get_info(i)[0])) for i in range(torch.cuda.device_count())]
    if hasattr(torch, "xpu") and torch.xpu.is_available():
        return [(f"xpu:{i}", int(torch.xpu.mem_get_info(i)[0])) for i in range(torch.xpu.device_count())]
    return []


def plan_placement(where: str, spec: Any, rooms: Sequence[tuple[str, int]], *, layout: Any = None,
                   overrides: Any = None) -> Placement:
    """The balanced placement of a video model (folder or Hub id) from its configs, sized for ``layout`` (default the
    first device of ``rooms``; on mixed GPU kinds a recipe may give another device another dtype, not shown).

    Example:
        >>> from hf_precision.apps.video.spec import model_spec
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> p = plan_placement(where, spec, [("cuda:0", 16 * 10**9), ("cuda:1", 8 * 10**9)], layout="t4")
        >>> p.devices["unet"], p.devices["image_encoder"], p.devices["vae"]
        ('cuda:0', 'cuda:1', 'cuda:1')
    """
    from ...diagnose.planner import plan
    from ...runtime.source import configs_of
    from .spec import pipeline_recipe

    if not rooms:
        raise RecipeError(f"--device-map balanced: no accelerator is visible; {FIX}")
    index = configs_of(where)[1]
    p = plan(where, device=layout or rooms[0][0], recipe=pipeline_recipe(spec.pipeline, index), overrides=overrides)
    sizes = {name: c.total_bytes for name, c in p.components.items()}
    return balanced_placement(sizes, rooms, spec.denoiser)
