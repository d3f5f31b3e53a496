"""A line per measurement with the time spent and the estimated time left.

The run is planned up front as a list of steps, each of a *kind* (``load``, ``unet_call`` ...) with a first
guess of its duration. Once a step of a kind has been measured, the remaining steps of that kind are estimated
from the measured mean: the estimate corrects itself after the first step of each kind, whatever the machine.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TextIO

from hf_precision.units import format_seconds


def _duration(seconds: float | None) -> str:
    """``format_seconds``, or ``?`` when unknown."""
    return "?" if seconds is None or seconds != seconds or seconds < 0 else format_seconds(seconds)


class Progress:
    """Counts planned steps and prints ``[k/n  elapsed, ~left] what`` before each one.

    Example:
        >>> clock = iter([0.0, 0.0, 2.0, 2.0, 4.0]).__next__
        >>> p = Progress(clock=clock, out=None)
        >>> p.plan("call", 3, guess=10.0)
        >>> p.eta()
        30.0
        >>> with p.step("call", "first call"):
        ...     pass
        >>> p.eta()  # two calls left, at the measured 2 s each
        4.0
        >>> import io
        >>> p = Progress(clock=iter([0.0, 0.0, 0.0, 5.0, 5.0]).__next__, out=io.StringIO())
        >>> p.plan("load", 3, guess=20.0)
        >>> with p.step("load", "loading"):
        ...     pass
        >>> p.say("next"); p.out.getvalue().splitlines()[-1]
        '[  1/3  5 s elapsed, ~10 s left] next'
        >>> p = Progress(clock=lambda: 0.0, out=None)
        >>> with p.step("extra", "not planned"):
        ...     pass
        >>> p.plan("load", 2, 1.0); p.skip("load")
        >>> p.done, p.total, p.eta()
        (1, 2, 1.0)
    """

    def __init__(self, *, clock: Callable[[], float] = time.perf_counter, out: TextIO | None = sys.stdout):
        self.clock, self.out = clock, out
        self.start = clock()
        self.guess: dict[str, float] = {}
        self.left: dict[str, int] = {}
        self.spent: dict[str, list[float]] = {}
        self.done = 0
        self.total = 0

    def plan(self, kind: str, count: int, guess: float) -> None:
        """Add ``count`` steps of ``kind``, each guessed to take ``guess`` seconds until one is measured."""
        self.left[kind] = self.left.get(kind, 0) + count
        self.guess.setdefault(kind, guess)
        self.total += count

    def scale(self, kinds: tuple[str, ...], factor: float) -> None:
        """Multiply the guesses of ``kinds`` by ``factor`` (a measured slowdown); measured steps are left as they are.

        Example:
            >>> p = Progress(clock=lambda: 0.0, out=None)
            >>> p.plan("call", 2, guess=3.0); p.scale(("call",), 59.0)
            >>> p.eta()
            354.0
        """
        for kind in kinds:
            if kind in self.guess:
                self.guess[kind] *= factor

    def estimate(self, kind: str) -> float:
        measured = self.spent.get(kind)
        return sum(measured) / len(measured) if measured else self.guess.get(kind, 0.0)

    def eta(self) -> float:
        """Seconds the planned steps that have not run yet are expected to take."""
        return sum(n * self.estimate(kind) for kind, n in self.left.items() if n > 0)

    def say(self, message: str) -> None:
        if self.out is not None:
            elapsed = self.clock() - self.start
            print(f"[{self.done:>3}/{self.total}  {_duration(elapsed)} elapsed, ~{_duration(self.eta())} left] "
                  f"{message}", file=self.out, flush=True)

    @contextmanager
    def step(self, kind: str, label: str) -> Iterator[None]:
        """Time one planned step of ``kind``; an unplanned kind is counted too (the total grows)."""
        if self.left.get(kind, 0) <= 0:
            self.plan(kind, 1, self.guess.get(kind, 0.0))
        self.say(label)
        t0 = self.clock()
        try:
            yield
        finally:
            self.spent.setdefault(kind, []).append(self.clock() - t0)
            self.left[kind] -= 1
            self.done += 1

    def skip(self, kind: str, count: int = 1) -> None:
        """Drop planned steps that will not run after all."""
        n = min(count, self.left.get(kind, 0))
        self.left[kind] = self.left.get(kind, 0) - n
        self.total -= n

    def summary(self) -> dict[str, Any]:
        return {"elapsed_s": self.clock() - self.start, "steps": self.done,
                "per_kind_s": {k: sum(v) / len(v) for k, v in self.spent.items()}}
