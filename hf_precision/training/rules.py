"""The device rule for training compute, and the error the training layer raises. Torch-free.

bf16 first: it has fp32's range and needs no loss scaling (diffusers' examples, OneTrainer and SimpleTuner default
to it; bghira/SimpleTuner#845 drops fp16 for its GradScaler); else fp16 with a GradScaler and fp32 masters (T4,
V100, MPS before macOS 14); else fp32. What a device "picks unasked" is ``recipes/devices.yaml``'s ``auto`` list.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from ..errors import RecipeError

__all__ = ["TrainingError", "TRAINING_ORDER", "MASTERS", "ComputeChoice", "training_compute"]

# The order training picks compute dtypes in (first that the device picks unasked and the component tolerates).
TRAINING_ORDER = ("bfloat16", "float16", "float32")
MASTERS = ("fp32", "bf16-sr")


class TrainingError(RecipeError):
    """A training set-up that would fail or silently train wrong: names the part, the dtypes/devices and the fix."""


@dataclasses.dataclass(frozen=True)
class ComputeChoice:
    """The compute dtype training picked for a trainable component, and why (``downgrade`` is empty for bf16)."""

    dtype: str
    rule: str
    downgrade: str = ""


def training_compute(component: str, tolerated: Iterable[str], auto: Iterable[str], device: str,
                     why: dict[str, str] | None = None) -> ComputeChoice:
    """Pick a trainable component's compute dtype: the first of bf16, fp16, fp32 the device picks and it tolerates.

    Example:
        >>> training_compute("unet", ["float16", "bfloat16", "float32"], ["float16", "float32"], "Tesla T4").dtype
        'float16'
        >>> training_compute("unet", ["float16", "bfloat16", "float32"], ["float16", "float32", "bfloat16"], "A100").dtype
        'bfloat16'
    """
    tolerated, auto = list(dict.fromkeys(tolerated)), list(auto)
    reasons = "; ".join(f"rule {tag}: {text}" for tag, text in (why or {}).items())
    for dtype in TRAINING_ORDER:
        if dtype in auto and (dtype in tolerated or dtype == "float32"):
            break
    rule = (f"training takes the first of {list(TRAINING_ORDER)} that {device} picks unasked (auto: {auto}) and "
            f"{component} tolerates ({tolerated})")
    if dtype == "bfloat16":
        return ComputeChoice(dtype, rule)
    missing = "bf16 is not picked unasked there" if "bfloat16" not in auto else f"{component} does not tolerate bf16"
    if dtype == "float16":
        what = "fp16 compute with a GradScaler (loss scaling) and fp32 master weights"
    else:
        what = "fp32 compute (no autocast, no loss scaling)"
        missing += "; nor fp16" + (" (not picked unasked there)" if "float16" not in auto else f" ({component} does not tolerate it)")
    return ComputeChoice(dtype, rule, f"{component} on {device}: {missing}, so {what}" + (f" [{reasons}]" if reasons else ""))
