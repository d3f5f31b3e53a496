"""The project's single module-matching rule: case-sensitive globs, full match, over dotted module names.

``time_embedding`` matches exactly that module; ``down_blocks.*.norm*`` matches ``down_blocks.0.norm1``; ``*``
crosses dots (fnmatch semantics). Patterns are NOT regular expressions and never match by substring.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

__all__ = ["matches", "match_modules", "outermost", "suggest"]


def matches(name: str, patterns: Iterable[str]) -> bool:
    """Whether a dotted module name fully matches any glob.

    Example:
        >>> matches("down_blocks.0.norm1", ["down_blocks.*.norm*"]), matches("norm1", ["norm"])
        (True, False)
    """
    return any(fnmatchcase(name, p) for p in patterns)


def match_modules(names: Iterable[str], patterns: Sequence[str]) -> dict[str, list[str]]:
    """For each pattern, the names it matches (in the given order)."""
    names = list(names)
    return {p: [n for n in names if fnmatchcase(n, p)] for p in patterns}


def outermost(names: Iterable[str]) -> list[str]:
    """Drop names nested inside another name of the set: islands are hooked at their outermost module only.

    Example:
        >>> outermost(["time_embedding", "time_embedding.linear_1", "add_embedding"])
        ['time_embedding', 'add_embedding']
    """
    names = list(dict.fromkeys(names))
    kept = set(names)
    if "" in kept:
        return [""]
    def nested(name: str) -> bool:
        parts = name.split(".")
        return any(".".join(parts[:i]) in kept for i in range(1, len(parts)))
    return [n for n in names if not nested(n)]


def suggest(pattern: str, names: Iterable[str], n: int = 3) -> list[str]:
    """Close module names for a pattern that matched nothing (outermost names are preferred)."""
    names = list(names)
    short = [x for x in names if x.count(".") <= pattern.count(".") + 1]
    return difflib.get_close_matches(pattern, short or names, n=n, cutoff=0.5)
