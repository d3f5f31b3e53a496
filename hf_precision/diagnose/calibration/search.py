"""calibrate's search: which modules get a float32 island, from the reference ranges and from the half runs.

``Islands`` holds the search's whole state (islands and whole-float32 components, wide outputs, evidence per island,
the island the error search added last, the first finite state) and the moves of the method in docs/calibrate.md:
``from_ranges`` (step 3), ``add_overflow`` (step 4), ``add_error`` and ``grow`` (step 5), ``fallback``.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

from ...recipe.patterns import inside, outermost
from ...runtime.quantize import is_quantized_tensor
from .record import Recorder, Stat
from .report import Evidence, RunError, moved

__all__ = ["Islands"]


def _parent(name: str) -> str:
    return name.rpartition(".")[0]


class _Chooser:
    """The island rule over one component's reference statistics."""

    def __init__(self, comp: str, root: Any, stats: Mapping[tuple[str, str], Stat], limit: float, delta: int):
        self.comp, self.root, self.limit, self.delta = comp, root, limit, delta
        self.stats = {name: s for (c, name), s in stats.items() if c == comp}
        self._bytes: dict[str, int] = {}
        # Parameters beyond the target's range cannot even be stored in it (a fine-tune's outlier weight): the module
        # that owns them needs an island, whatever its activations do in the reference run.
        self.heavy: dict[str, tuple[float, float]] = {}
        for name, m in root.named_modules():
            own = [t for t in m._parameters.values() if t is not None and t.is_floating_point() and t.numel()]
            if not own:
                continue
            # a backend's quantized weight (torchao, quanto, GGUF) has no abs(): its values are what it dequantizes to
            own = [t.dequantize() if is_quantized_tensor(t) and hasattr(t, "dequantize") else t for t in own]
            peak = max(float(t.detach().abs().max()) for t in own)
            if peak > limit:
                beyond = sum(int((t.detach().abs() > limit).sum()) for t in own) / sum(t.numel() for t in own)
                self.heavy[name] = (peak, beyond)

    def fits(self, name: str) -> bool:
        s = self.stats.get(name)
        return s is not None and s.out_max <= self.limit and s.in_max <= self.limit

    def bytes(self, name: str) -> int:
        if name not in self._bytes:
            m = self.root.get_submodule(name) if name else self.root
            self._bytes[name] = self.delta * sum(t.numel() for t in (*m.parameters(), *m.buffers()) if t.is_floating_point())
        return self._bytes[name]

    def island_for(self, name: str, also_bad: Callable[[str], bool] = lambda _: False) -> str:
        """The innermost module, ``name`` or an ancestor, whose input and output fit the range ('' = the component)."""
        while name and (not self.fits(name) or also_bad(name)):
            name = _parent(name)
        return name

    def flagged(self) -> list[str]:
        heavy = [n for n in self.heavy if n in self.stats]  # a module that does not run in this call needs nothing
        return [*heavy, *(n for n, s in self.stats.items() if s.out_max > self.limit or s.in_max > self.limit)]

    def collapse(self, islands: list[str], slack: float) -> list[str]:
        """Replace sibling islands by their parent when it fits the range and adds at most ``slack`` more bytes."""
        islands = outermost(islands)
        changed = True
        while changed:
            changed = False
            groups: dict[str, list[str]] = {}
            for i in islands:
                if i:
                    groups.setdefault(_parent(i), []).append(i)
            for parent, kids in groups.items():
                if len(kids) < 2 or not parent or not self.fits(parent):
                    continue
                if self.bytes(parent) <= (1 + slack) * sum(self.bytes(k) for k in kids):
                    islands = outermost([parent if i in kids else i for i in islands])
                    changed = True
                    break
        return islands


def _evidence(comp: str, island: str, stats: Mapping[tuple[str, str], Stat], limit: float,
              heavy: Mapping[str, tuple[float, float]] = {}) -> list[Evidence]:
    out = [Evidence(comp, island, name, "weights", peak, "", share) for name, (peak, share) in heavy.items()
           if (comp, name) in stats and (inside(name, [island]) if island else True)]
    for (c, name), s in stats.items():
        if c != comp or not (inside(name, [island]) if island else True):
            continue
        if s.out_max > limit:
            out.append(Evidence(comp, island, name, "output", s.out_max, s.out_step, s.out_share))
        elif s.in_max > limit:
            out.append(Evidence(comp, island, name, "input", s.in_max, s.in_step, s.in_share))
    return sorted(out, key=lambda e: -e.max_abs)


@dataclasses.dataclass
class Islands:
    """The islands found so far and why; each move adds one and says whether the search can go on.

    Example:
        >>> import torch
        >>> from hf_precision.diagnose.calibration.record import Stat
        >>> net = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)), torch.nn.Linear(2, 2))
        >>> ranges = {"": (1, 1), "0": (1, 1), "0.0": (1, 1e5), "0.1": (1e5, 1), "1": (1, 1)}  # (max |in|, max |out|)
        >>> stats = {("net", m): Stat(in_max=i, out_max=o) for m, (i, o) in ranges.items()}
        >>> Islands.from_ranges({"net": net}, stats, limit=65504.0, delta=2, slack=0.25, recipe={}).islands
        {'net': ['0']}
    """

    choosers: dict[str, _Chooser]
    recipe: Mapping[str, list[str]]  # the recipe's own islands: kept in every run, never searched
    slack: float
    islands: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    whole: list[str] = dataclasses.field(default_factory=list)  # components no island inside can hold
    wide: list[str] = dataclasses.field(default_factory=list)  # whole components whose output leaves the range
    evidence: dict[str, dict[str, list[Evidence]]] = dataclasses.field(default_factory=dict)
    last: tuple[str, str, float] | None = None  # the island the error search added last, and the error before it
    notes: list[str] = dataclasses.field(default_factory=list)
    first_finite: tuple[RunError, dict[str, list[str]], list[str], dict[str, dict[str, list[Evidence]]]] | None = None

    @classmethod
    def from_ranges(cls, components: Mapping[str, Any], stats: Mapping[tuple[str, str], Stat], limit: float,
                    delta: int, slack: float, recipe: Mapping[str, list[str]]) -> Islands:
        """The islands the reference run's ranges call for (step 3): a module whose weights, input or output leave
        the range gets the innermost enclosing module that fits; none fits inside: the whole component."""
        found = cls({n: _Chooser(n, root, stats, limit, delta) for n, root in components.items()}, recipe, slack)
        for n, ch in found.choosers.items():
            chosen = [ch.island_for(m) for m in ch.flagged()]
            if "" in chosen:
                found.whole.append(n)
            else:
                found.islands[n] = ch.collapse(chosen, slack)
        return found

    def kept(self) -> dict[str, list[str]]:
        """Per component what the next run keeps in float32: the recipe's islands and the measured ones."""
        return {n: outermost([*self.recipe.get(n, []), *self.islands.get(n, [])]) for n in self.choosers}

    def remember(self, after: RunError) -> None:
        """Keep the first finite state: what ``fallback`` returns to when the error search did not pay."""
        if after.finite and self.first_finite is None:
            self.first_finite = (after, {n: list(v) for n, v in self.islands.items()}, list(self.whole),
                                 {n: {i: list(e) for i, e in per.items()} for n, per in self.evidence.items()})

    def add_overflow(self, half: Recorder) -> bool:
        """A half run that was not finite (step 4): island its first non-finite module; False: nothing left to try."""
        if half.first_bad is None:
            return False
        comp, name, input_bad = half.first_bad
        ch = self.choosers.get(comp)
        step = half.stats[(comp, name)].out_step
        if ch is not None and comp in self.whole and comp not in self.wide:
            # Everything in the component computes in float32: what went inf is its output, cast to the half dtype
            # on the way out. Hand it on in float32 (the pipeline's latents follow the denoiser's output dtype).
            self.wide.append(comp)
            self.evidence.setdefault(comp, {}).setdefault("", []).append(
                Evidence(comp, "", name or "(output)", "half run", math.inf, step, 1.0))
            return True
        if ch is None or comp in self.whole:
            self.notes.append(f"{comp}{'.' + name if name else ''} is not finite although {comp} is float32: the "
                              "overflow is outside the modules calibrate can island (pipeline code between components)")
            return False
        half_bad = {nm for (c, nm), s in half.stats.items() if c == comp and not math.isfinite(s.in_max)}
        island = ch.island_for(_parent(name) if input_bad else name, lambda m: m in half_bad)
        grown = [i for i in self.islands.get(comp, []) if inside(island, [i])]
        if grown and island:
            # An island's own output overflowed when cast back to the half dtype: take the next level up.
            island = ch.island_for(_parent(grown[0]))
        self._keep(comp, island, [Evidence(comp, island, name, "half run", math.inf, step, 1.0)])
        return True

    def add_error(self, half: Recorder, after: RunError, floor: float) -> bool:
        """A finite half run further from the reference than the bound (step 5): island where its error grows most, or grow
        the island added last when it did not lower the error; False: no module stands out.

        Per module: the relative error of its output (half against reference, strided samples of every call) over that of
        its input, at least ``floor`` (the unit roundoff). A module that rounds like any other has about 1; one that loses
        what its input held (an underflow, an offset swallowing a small signal) far more.
        """
        if self.last is not None and after.mean_abs > 0.7 * self.last[2]:
            added: tuple[str, str] | None = self.grow(*self.last[:2])
        else:
            added = self._worst(half, floor)
        if added is None:
            return False
        self.last = (*added, after.mean_abs)
        return True

    def grow(self, comp: str, island: str) -> tuple[str, str]:
        """Replace ``island`` by the next enclosing module that fits (the whole component when none does): its input
        already carried the loss, so the module that produced that input goes inside too."""
        parent = self.choosers[comp].island_for(_parent(island))
        ev = self.evidence.get(comp, {}).pop(island, [])
        self._keep(comp, parent, ev, [parent if i == island else i for i in self.islands.get(comp, [])])
        return comp, parent

    def _keep(self, comp: str, island: str, evidence: list[Evidence], islands: list[str] | None = None) -> None:
        """Keep ``island`` ('' = the whole component) in float32 with its evidence; ``islands``: the component's
        islands with it in its place (default: the ones so far, then it)."""
        if not island:
            self.whole.append(comp)
            self.islands.pop(comp, None)
            self.evidence.setdefault(comp, {})[""] = evidence
            return
        kept = islands if islands is not None else [*self.islands.get(comp, []), island]
        self.islands[comp] = self.choosers[comp].collapse(kept, self.slack)
        self.evidence.setdefault(comp, {}).setdefault(island, []).extend(evidence)

    def _worst(self, half: Recorder, floor: float) -> tuple[str, str] | None:
        kept = self.kept()
        scored = []
        for (comp, name), (out_rel, in_rel, calls) in half.errors.items():
            if comp not in self.choosers or comp in self.whole or not name or inside(name, kept.get(comp, [])):
                continue
            scored.append((out_rel / calls / max(in_rel / calls, floor), out_rel / calls, comp, name))
        if not scored:
            return None
        top = max(a for a, _, _, _ in scored)
        if top < 8:  # rounding, spread evenly: no module stands out
            return None
        amp, out_rel, comp, name = max((x for x in scored if x[0] >= 0.9 * top), key=lambda x: x[3].count("."))
        island = self.choosers[comp].island_for(name)
        if not island:
            return None
        step = half.stats[(comp, name)].out_step
        self._keep(comp, island, [Evidence(comp, island, name, "error", amp, step, out_rel)])
        return comp, island

    def fallback(self, after: RunError, bound: float) -> RunError:
        """Drop what the error search added when it did not bring the error down by 30%: the first finite state."""
        base = self.first_finite
        if base is None or not after.finite or after.mean_abs <= bound or after.mean_abs <= 0.7 * base[0].mean_abs \
                or base[1] == self.islands:
            return after
        self.notes.append(f"the islands the error search added ({moved(base[1], self.islands)}) brought the mean error "
                          f"only from {base[0].mean_abs:.3g} to {after.mean_abs:.3g}: not kept")
        after, self.islands, self.whole, self.evidence = base
        return after

    def settle(self, stats: Mapping[tuple[str, str], Stat]) -> None:
        """Final evidence: the reference run's out-of-range modules inside each island, and what the half runs
        found; islands left empty go."""
        for n, ch in self.choosers.items():
            if not self.islands.get(n) and n not in self.whole:
                continue
            per = self.evidence.setdefault(n, {})
            for island in self.islands.get(n, []):
                per[island] = _evidence(n, island, stats, ch.limit, ch.heavy) + [
                    e for e in per.get(island, []) if e.where in ("half run", "error")]
            if n in self.whole:
                measured = [e for e in per.get("", []) if e.where == "half run"]
                per[""] = _evidence(n, "", stats, ch.limit, ch.heavy) + measured
        self.islands = {n: v for n, v in self.islands.items() if v}

    def bytes(self, comp: str, island: str = "") -> int:
        """Extra bytes of keeping ``island`` (the whole component by default) in float32 instead of the half dtype."""
        return self.choosers[comp].bytes(island)
