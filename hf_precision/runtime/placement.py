"""Where tensors can be placed here: a device spec checked before anything moves, and where a tensor landed."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ..errors import RecipeError, spelled

CPU = "cpu"
from ..recipe.devices import device_profile, present_devices
from ..recipe.model import Recipe

__all__ = ["torch_device", "check_placeable", "same_device"]


def torch_device(spec: Any, what: str) -> torch.device:
    """A device tensors can be placed on here, or a ``RecipeError`` that explains presets are for planning only,
    or that this machine has no such device (and how to run its layout on one it has).

    Example:
        >>> torch_device("cpu", "device")
        device(type='cpu')
    """
    try:
        dev = torch.device(spec)
    except (RuntimeError, TypeError):
        raise RecipeError(f"{what}: {spec!r} is not a device this process can place tensors on (present here: "
                          f"{', '.join(present_devices())}). "
                          f"To run the layout of a device you do not have, resolve it for that device and place it here: "
                          f"{spelled(f'layout={spec!r}, device={CPU!r}', f'--layout {spec} --device cpu')}") from None
    if dev.type in ("cuda", "mps", "xpu"):
        # A device this machine lacks: our one error naming layout=, not torch's "Torch not compiled with CUDA
        # enabled" from the first tensor moved there (layout= or a resolved Recipe skips the rules' own check).
        device_profile(str(dev))
    return dev


def check_placeable(device: Any, recipe: Any = None) -> None:
    """Each device of ``device`` (one, or component -> device) is one tensors can be placed on here (:func:`torch_device`);
    for a resolved :class:`Recipe` (fixed dtypes) the fix named for a missing device is a present one, not ``layout=``.

    Example:
        >>> check_placeable({"unet": "cpu", "default": None})
    """
    for spec in (device.values() if isinstance(device, Mapping) else [device]):
        if spec is None:
            continue
        try:
            torch_device(spec, "device")
        except RecipeError as err:
            if not isinstance(recipe, Recipe) or "this machine has no" not in str(err):
                raise
            raise RecipeError(f"device {spec!r}: this machine has no such device (present: "
                              f"{', '.join(present_devices())}); recipe= is a resolved Recipe, which keeps the dtypes it "
                              f"was resolved for ({recipe.policies[0].resolved_for}): place it on a present device, "
                              f"e.g. device='cpu'") from None


def same_device(planned: Any, actual: torch.device) -> bool:
    """Whether a tensor on ``actual`` is where ``planned`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``) puts it: an index-less
    plan means the current device (``.to("cuda")`` lands there though ``cuda != cuda:0``), not a misplacement.

    Example:
        >>> same_device("cuda", torch.device("cuda", 0)), same_device("cuda", torch.device("cuda", 1))
        (True, False)
        >>> same_device("cpu", torch.device("cpu")), same_device("cuda:0", torch.device("cpu"))
        (True, False)
    """
    planned = torch.device(planned)
    if planned.type != actual.type:
        return False
    if planned.index is None and actual.index is not None:
        backend = getattr(torch, planned.type, None)
        try:  # torch.cuda.current_device() (xpu, mps alike); a build without the backend places on index 0
            current = int(backend.current_device()) if hasattr(backend, "current_device") else 0
        except (RuntimeError, AssertionError, AttributeError):
            current = 0
        return actual.index == current
    return planned.index == actual.index or actual.index is None
