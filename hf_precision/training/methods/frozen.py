"""Frozen: the component keeps its inference recipe and has no gradients."""

from __future__ import annotations

from . import Method, register_method


class Frozen(Method):
    name = "frozen"
    program = False  # what the program trains is never nothing


register_method(Frozen())
