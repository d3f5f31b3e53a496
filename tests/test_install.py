"""What `make test` and `make demo` install: the pinned versions the suite was last green with.

A new release of a dependency must not break a new user's first two commands (issue: PyYAML 6.0.4 changed a
message the suite asserted), so the Makefile installs through constraints.txt, and `make test-latest` is where
new releases are tried first.
"""

from __future__ import annotations

import re
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

try:
    import tomllib
except ImportError:  # Python 3.10: pip carries the same parser
    from pip._vendor import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, Version]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, version = line.partition("==")
            assert version, f"constraints.txt: {line!r} is not an exact pin (name==version)"
            pins[re.sub(r"[-_.]+", "-", name).lower()] = Version(version)
    return pins


def _requirements() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras = project["optional-dependencies"]
    return [Requirement(r) for r in [*project["dependencies"], *extras["test"], *extras["video"]]]


def test_every_dependency_but_torch_is_pinned_within_its_declared_range():
    pins = _pins()
    for req in _requirements():
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        if name in ("torch", "setuptools", "wheel"):  # torch: TORCH_SPEC; build tools: pip's own choice
            assert name not in pins, f"{name} is pinned in constraints.txt, which TORCH_SPEC / pip decide"
            continue
        assert name in pins, f"{req.name} (pyproject.toml) has no pin in constraints.txt: run make test-latest && make lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{name}=={pins[name]} is outside {req}"


def test_the_install_the_readme_names_uses_the_constraints():
    make = (ROOT / "Makefile").read_text(encoding="utf-8")
    install = [line for line in make.replace("\\\n", " ").splitlines() if "pip install" in line and "-e " in line]
    pinned = [line for line in install if "-c $(CONSTRAINTS)" in line]
    latest = [line for line in install if "$(LATEST_VENV)" in line]
    assert pinned and latest and set(pinned).isdisjoint(latest), install
    assert re.search(r"^CONSTRAINTS \?= constraints\.txt$", make, re.M)
    # test-latest takes the newest of everything but torch, which stays TORCH_SPEC (an eager upgrade would pull a
    # CUDA build of several GB)
    assert all("$(CONSTRAINTS)" not in line and "torch-spec.txt" in line for line in latest), latest


def test_every_package_folder_ships_in_the_wheel():
    # pyproject.toml lists its packages by hand: a subpackage left out (hf_precision.training.inputs when it became
    # one) is missing from the wheel, so an installed copy fails on import while the suite, run from the checkout,
    # passes.
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "hf_precision").rglob("__init__.py")}
    assert not found - listed, f"add {sorted(found - listed)} to [tool.setuptools] packages in pyproject.toml"
