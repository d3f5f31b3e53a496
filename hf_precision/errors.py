"""The one error type users see for bad input, and a collector that reports every problem of a source at once."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["RecipeError", "Problems"]


class RecipeError(ValueError):
    """Bad recipe, override, device or pipeline input.

    Every message names the source (file or ``dict``/``--set``), the key path, the bad value, what is
    allowed and the fix. Several problems found in one source are reported together, one per line.
    """

    def __init__(self, problems: str | Iterable[str]):
        if isinstance(problems, str):
            problems = [problems]
        self.problems: tuple[str, ...] = tuple(problems)
        super().__init__(self.problems[0] if len(self.problems) == 1 else
                         f"{len(self.problems)} problems:\n" + "\n".join(f"  - {p}" for p in self.problems))


class Problems:
    """Collects problems while walking a source, then raises them together."""

    def __init__(self, source: str):
        self.source = source
        self.items: list[str] = []

    def add(self, path: str, message: str) -> None:
        where = f"{self.source}: {path}" if path else self.source
        self.items.append(f"{where}: {message}")

    def raise_if_any(self) -> None:
        if self.items:
            raise RecipeError(self.items)
