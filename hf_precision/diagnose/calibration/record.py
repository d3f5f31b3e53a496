"""What a calibration run records: per module the max ``|input|`` and ``|output|``, in which phase (``Steps``), the
share beyond the target's range, strided samples for the error search, and the run's final output as an array.
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["Stat", "Recorder", "Steps", "output_array"]


@dataclasses.dataclass
class Stat:
    """One module's largest output and input over a run: value, phase and share beyond the range; its call count."""

    out_max: float = 0.0
    out_step: str = ""
    out_share: float = 0.0
    in_max: float = 0.0
    in_step: str = ""
    in_share: float = 0.0
    calls: int = 0


def _tensors(tree: Any, depth: int = 0):
    if isinstance(tree, torch.Tensor):
        if tree.is_floating_point() and tree.numel():
            yield tree
    elif depth < 4 and isinstance(tree, (tuple, list)):
        for x in tree:
            yield from _tensors(x, depth + 1)
    elif depth < 4 and isinstance(tree, Mapping):  # dicts and diffusers/transformers output classes
        for x in tree.values():
            yield from _tensors(x, depth + 1)


def _strided(t: Any, n: int = 512) -> Any:
    """At most ``n`` values of a tensor, evenly strided, as float32 on the CPU: what two runs' outputs are compared by."""
    flat = t.detach().reshape(-1)
    return flat[:: max(1, flat.numel() // n)][:n].float().cpu()


def _relative(got: Any, ref: Any) -> float | None:
    """Mean |got - ref| over mean |ref|, or None when the two samples cannot be compared."""
    if got is None or ref is None or got.shape != ref.shape:
        return None
    scale = float(ref.abs().mean())
    diff = float((got - ref).abs().mean())
    if not math.isfinite(diff) or scale == 0.0:
        return None
    return diff / scale


class Recorder:
    """Forward hooks on every module with parameters: max |input| and |output| per module, per step, per component.

    One ``aminmax`` per new tensor (an input just measured as an output is not read again); the share beyond ``limit``
    is counted only past it. ``first_bad``: the first call (inner modules finish first) with a non-finite output.
    """

    def __init__(self, components: Mapping[str, Any], limit: float, phase: Callable[[str], str],
                 reference: bool = False, samples: dict[tuple[str, str], list[Any]] | None = None,
                 compare: Mapping[tuple[str, str], list[Any]] | None = None):
        self.limit, self.phase, self.reference = limit, phase, reference
        # samples: filled with a strided sample of every call's input and output (the reference run); compare: the
        # reference's samples, against which this run's relative errors per module are summed into `errors`.
        self.samples, self.compare = samples, compare
        self.errors: dict[tuple[str, str], list[float]] = {}
        self._calls: dict[tuple[str, str], int] = {}
        self.stats: dict[tuple[str, str], Stat] = {}
        self.ranges: dict[str, dict[str, float]] = {}
        self.first_bad: tuple[str, str, bool] | None = None
        self.handles: list[Any] = []
        self._seen: dict[int, tuple[Any, float]] = {}
        for comp, root in components.items():
            for name, module in root.named_modules():
                if next(module.parameters(), None) is None:
                    continue
                self.handles.append(module.register_forward_hook(self._hook(comp, name), with_kwargs=True,
                                                                 always_call=True))

    def _measure(self, tree: Any, fills: bool = False) -> tuple[float, float]:
        biggest, tensors = 0.0, []
        for t in _tensors(tree):
            seen = self._seen.get(id(t))
            if seen is not None and seen[0]() is t:
                v = seen[1]  # a module's input is usually the output its producer just had measured
            else:
                low, high = torch.aminmax(t.detach())  # one pass, no |x| copy
                v = max(-float(low), float(high))
                v = math.inf if v != v else v  # NaN: as bad as inf
                if len(self._seen) > 4096:
                    self._seen.clear()
                self._seen[id(t)] = (weakref.ref(t), v)
            if fills and v >= torch.finfo(t.dtype).max:
                # An input at the dtype's extreme in the reference run is a mask's fill value, not an activation:
                # transformers and diffusers fill additive attention masks with torch.finfo(dtype).min or -inf, and
                # the half run builds that mask in its own dtype. Measure the other values.
                t = t.detach()[t.detach().abs() < torch.finfo(t.dtype).max]
                if not t.numel():
                    continue
                v = float(t.abs().max())
            tensors.append(t)
            biggest = max(biggest, v)
        share = 0.0
        if biggest > self.limit:
            beyond = sum(int((~(t.detach().abs() <= self.limit)).sum()) for t in tensors)
            share = beyond / max(1, sum(t.numel() for t in tensors))
        return biggest, share

    def _hook(self, comp: str, name: str) -> Callable[..., None]:
        def post(module: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
            if out is None:
                return None
            o, o_share = self._measure(out)
            # Masks are not activations (a boolean or additive mask of any run: `attention_mask`, `encoder_attention_mask`).
            i, i_share = self._measure((args, {k: v for k, v in kwargs.items() if "mask" not in k}), self.reference)
            step = self.phase(comp)
            s = self.stats.setdefault((comp, name), Stat())
            s.calls += 1
            if o > s.out_max or not s.out_step:
                s.out_max, s.out_step, s.out_share = o, step, o_share
            if i > s.in_max or not s.in_step:
                s.in_max, s.in_step, s.in_share = i, step, i_share
            per = self.ranges.setdefault(comp, {})
            per[step] = max(per.get(step, 0.0), o)
            if self.first_bad is None and not math.isfinite(o):
                self.first_bad = (comp, name, not math.isfinite(i))
            if self.samples is not None or self.compare is not None:
                self._sample((comp, name), args, kwargs, out)
            return None
        return post

    def _sample(self, key: tuple[str, str], args: Any, kwargs: dict[str, Any], out: Any) -> None:
        # The output, and up to three inputs (a cross-attention reads hidden states and the text encoder's output):
        # a module's own share of the error is its output's relative error over the worst of its inputs'.
        ins = [_strided(t) for t, _ in zip(_tensors((args, {k: v for k, v in kwargs.items() if "mask" not in k})), range(3))]
        first_out = next(_tensors(out), None)
        taken = (None if first_out is None else _strided(first_out), ins)
        k = self._calls[key] = self._calls.get(key, 0) + 1
        if self.samples is not None:
            self.samples.setdefault(key, []).append(taken)
        ref = (self.compare or {}).get(key)
        if ref is None or len(ref) < k or not ins:
            return
        out_rel = _relative(taken[0], ref[k - 1][0])
        in_rel = [_relative(a, b) for a, b in zip(ins, ref[k - 1][1])]
        if out_rel is not None and in_rel and None not in in_rel:
            acc = self.errors.setdefault(key, [0.0, 0.0, 0])
            acc[0], acc[1], acc[2] = acc[0] + out_rel, acc[1] + max(in_rel), acc[2] + 1

    @property
    def where(self) -> str:
        """``component.module`` of the first non-finite output ('' when every output was finite)."""
        bad = self.first_bad
        return f"{bad[0]}.{bad[1]}" if bad else ""

    def remove(self) -> None:
        self._seen.clear()
        for h in self.handles:
            h.remove()
        self.handles.clear()


class Steps:
    """Which phase a component call belongs to: 'step k' inside the denoising loop, else before/after it."""

    def __init__(self, denoiser: str | None):
        self.denoiser, self.step, self.calls, self.callback = denoiser, 0, 0, False
        self.bar: Any = None
        self.current = ""

    def on_step_end(self, pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.step = i + 1
        if self.bar is not None:
            self.bar.update(1)
        return {}

    def pre(self, *_: Any, **__: Any) -> None:
        if not self.callback:
            self.step = self.calls
            if self.bar is not None and self.calls:
                self.bar.update(1)
        self.calls += 1

    def phase(self, comp: str) -> str:
        if comp != self.current and self.bar is not None:
            self.current = comp
            self.bar.set_postfix_str(comp, refresh=True)  # the bar shows the component that is running
        if comp == self.denoiser:
            return f"step {self.step}"
        if not self.calls:
            return "before denoising"
        return "after denoising"


def output_array(out: Any) -> Any:
    """A pipeline's output (images, frames, embeddings ...) as one float64 numpy array: what runs are compared by."""
    import numpy as np

    value = None
    for attr in ("images", "image", "frames", "videos", "audios"):  # `image`: KandinskyImagePipelineOutput
        value = getattr(out, attr, None)
        if value is not None:
            break
    if value is None and hasattr(out, "to_tuple"):  # other diffusers outputs (prior embeddings ...): the first field
        value = next((v for v in out.to_tuple() if v is not None), None)
    if value is None:
        value = out[0] if isinstance(out, (tuple, list)) else out
    if isinstance(value, torch.Tensor):
        return value.detach().float().cpu().numpy().astype(np.float64)
    if isinstance(value, list):
        return np.stack([np.asarray(v, dtype=np.float64) for v in value])
    return np.asarray(value, dtype=np.float64)

