"""Choosing what fits: the first candidate, cheapest first, whose predicted peak fits a budget.

Each plan gives its candidates in order of cost (image: offload and quantized storage; video: also tiling and
chunking; training: cached latents, checkpointing, smaller batches, sharding) and a predict function. A prediction
has ``peak`` (bytes), ``label()`` and ``details()``; where it has ``quantize`` pairs, :meth:`Choice.describe` adds
what those storages cost in speed on the device.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Generic, Protocol, TypeVar

from ..units import format_bytes

__all__ = ["Prediction", "Choice", "choose", "is_accelerator", "resident_bytes"]


class Prediction(Protocol):
    """What :func:`choose` needs of a prediction."""

    @property
    def peak(self) -> int: ...

    def label(self) -> str: ...

    def details(self) -> str: ...


P = TypeVar("P", bound=Prediction)


@dataclasses.dataclass
class Choice(Generic[P]):
    """The prediction chosen for ``budget``, whether it fits, and every prediction tried (the chosen one last when it
    fits); ``reserve``: budget held back for what predictions leave out; ``device``: where quantized storage speeds
    were measured. The prediction's attributes read through (``choice.settings``).
    """

    prediction: P
    budget: int
    fits: bool
    tried: list[P]
    reserve: int | None = None
    device: Any = None

    def __getattr__(self, name: str) -> Any:
        prediction = self.__dict__.get("prediction")
        if name.startswith("_") or prediction is None:
            raise AttributeError(name)
        return getattr(prediction, name)

    def describe(self) -> str:
        """One line: chosen (or the least memory when nothing fits), for which budget, the settings, the figures.

        Example:
            >>> from types import SimpleNamespace as Pred
            >>> p = Pred(peak=5 * 10**9, label=lambda: "offload model", details=lambda: "peak 5.00 GB")
            >>> Choice(p, 4 * 10**9, False, [p]).describe()
            'nothing fits; least memory for 4.00 GB: offload model; peak 5.00 GB'
        """
        from ..recipe.devices import speed_note

        head = "chosen" if self.fits else "nothing fits; least memory"
        held = f" ({format_bytes(self.reserve)} held back for activations)" if self.reserve is not None else ""
        speed = speed_note(getattr(self.prediction, "quantize", ()), self.device) if self.device is not None else ""
        return (f"{head} for {format_bytes(self.budget)}{held}: {self.prediction.label()}; {self.prediction.details()}"
                + (f"; {speed}" if speed else ""))


def choose(candidates: Iterable[Any], predict: Callable[[Any], P], budget: int, *, reserve: int | None = None,
           device: Any = None) -> Choice[P]:
    """Predict ``candidates`` in order (cheapest first) until one's peak fits ``budget`` less ``reserve``; when none
    does, the one with the least peak (the first of equals). Candidates after the chosen one are not predicted.

    Example:
        >>> from types import SimpleNamespace as Pred
        >>> predict = lambda gb: Pred(peak=gb * 10**9, label=lambda: f"{gb} GB layout", details=lambda: "")
        >>> c = choose([9, 7, 5, 3], predict, 6 * 10**9)
        >>> c.fits, c.prediction.peak, len(c.tried)
        (True, 5000000000, 3)
        >>> choose([9, 7], predict, 8 * 10**9, reserve=2 * 10**9).fits  # 7 GB does not fit beside the 2 GB held back
        False
    """
    tried: list[P] = []
    limit = budget - (reserve or 0)
    for candidate in candidates:
        prediction = predict(candidate)
        tried.append(prediction)
        if prediction.peak <= limit:
            return Choice(prediction, budget, True, tried, reserve, device)
    if not tried:
        raise ValueError("choose: no candidates to predict")
    return Choice(min(tried, key=lambda p: p.peak), budget, False, tried, reserve, device)


def resident_bytes(weights: Mapping[str, int], offload: str, running: Iterable[str] | None = None, *,
                   leaf: Mapping[str, int] | None = None, loose: Mapping[str, int] | None = None,
                   unquantized: Mapping[str, int] | None = None) -> int:
    """Weight bytes on the device while the ``running`` components (default: any one of them) compute.

    ``none``: every weight; ``model`` (``enable_model_cpu_offload``): the largest running component; ``group``
    (leaf-level streamed ``enable_group_offload``): two leaf layers plus parameters on non-leaf modules; ``sequential``:
    one leaf layer plus those. ``leaf``/``loose``/``unquantized`` are in the unquantized layout, so a quantized storage
    shrinks them alike.

    Example:
        >>> w = {"text_encoder": 10, "transformer": 30, "vae": 2}
        >>> resident_bytes(w, "none"), resident_bytes(w, "model"), resident_bytes(w, "model", ["vae"])
        (42, 30, 2)
        >>> resident_bytes(w, "group", ["transformer"], leaf={"transformer": 4}, loose={"transformer": 1},
        ...                unquantized={"transformer": 60})  # stored at half the bytes: (2 x 4 + 1) / 2
        4
    """
    if offload == "none":
        return sum(weights.values())
    present = [n for n in (weights if running is None else running) if n in weights]
    if offload == "model":
        return max((weights[n] for n in present), default=0)
    assert leaf is not None and loose is not None and unquantized is not None, "per-layer offload needs layer sizes"
    per_leaf = 2 if offload == "group" else 1  # group offload with a stream prefetches the next layer
    scale = {n: weights[n] / max(1, unquantized[n]) for n in present}  # quantized leaves shrink
    return max((int((per_leaf * leaf[n] + loose[n]) * scale[n]) for n in present), default=0)


def is_accelerator(layout: Any) -> bool:
    """Whether a device or layout name is an accelerator, where offload can move weights to it: the plans consider
    offload candidates only there.

    Example:
        >>> is_accelerator("t4"), is_accelerator("cpu")
        (True, False)
    """
    from ..recipe.devices import device_profile

    return device_profile(layout).type != "cpu"
