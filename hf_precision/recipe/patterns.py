"""The project's single module-matching rule: case-sensitive globs, full match, over dotted module names.

``time_embedding`` matches exactly that module; ``down_blocks.*.norm*`` matches ``down_blocks.0.norm1``; ``*``
crosses dots (fnmatch semantics). Patterns are NOT regular expressions and never match by substring.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from fnmatch import fnmatchcase

from ..errors import RecipeError, override_line

__all__ = ["matches", "match_modules", "outermost", "suggest", "inside", "resolve_islands"]


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


def inside(name: str, roots: Iterable[str]) -> bool:
    """Whether a dotted module name is one of ``roots`` or nested inside one.

    Example:
        >>> inside("time_embedding.linear_1", ["time_embedding"]), inside("time_embedding_2", ["time_embedding"])
        (True, False)
    """
    # O(depth), not O(roots): asked for every module against every island (~170 when every UNet norm is one).
    if not isinstance(roots, (set, frozenset)):
        roots = set(roots)
    if name in roots:
        return True
    dot = name.find(".")
    while dot != -1:
        if name[:dot] in roots:
            return True
        dot = name.find(".", dot + 1)
    return False


def resolve_islands(component: str, patterns: Sequence[str], names: Sequence[str], *, owner: str,
                    active: bool = True, strict: bool = True) -> list[str]:
    """The float32 islands of a component: the outermost of ``names`` its ``keep_fp32`` ``patterns`` match, in
    pattern order (shared by :func:`hf_precision.apply_recipe` and :func:`hf_precision.plan`). ``active=False`` (fp32
    compute): checked, no islands. ``strict``: a pattern matching nothing is a RecipeError suggesting close names;
    ``component`` and ``owner`` (its class) name it.

    Example:
        >>> resolve_islands("unet", ["time_embedding"], ["time_embedding", "time_embedding.linear_1"], owner="UNet")
        ['time_embedding']
    """
    if not patterns:
        return []
    matched = match_modules(names, list(patterns))
    missing = [p for p, m in matched.items() if not m]
    if missing and strict:
        close = {p: suggest(p, names) for p in missing}
        hints = "; ".join(f"{p!r}: did you mean {close[p] or 'nothing close'}?" for p in missing)
        # the fix keeps the matching patterns and puts the closest name in place of the others (or drops them)
        fixed = list(dict.fromkeys(close[p][0] if close.get(p) else p for p in patterns if p not in close or close[p]))
        raise RecipeError(f"{component}.keep_fp32: pattern(s) {missing} match no module of {owner} "
                          f"({hints}). Patterns are full-match globs over module names; fix: "
                          f"{override_line(component, 'keep_fp32', fixed)}")
    return outermost([n for p in patterns for n in matched[p]]) if active else []
