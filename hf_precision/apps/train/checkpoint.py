"""Checkpoints of a training run: everything a resumed run needs to continue the same loss curve.

A folder ``OUT/checkpoints/step-000100``: trainable weights, optimizer, LR-scheduler and scaler state, RNG states
and the data position, written beside it and renamed into place, so a kill leaves no half folder for ``--resume``.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from ...errors import RecipeError
from ..outputs import written_atomically
from .sharded import is_sharded

__all__ = ["Checkpoints", "Resumed", "check_resume", "data_list", "trainable_state", "load_trainable", "rng_state",
           "set_rng_state"]

_NAME = re.compile(r"step-(\d{6,})")
WEIGHTS, STATE = "trainable.safetensors", "state.pt"


def trainable_named(components: Mapping[str, Any]) -> list[tuple[str, Any]]:
    """(``component.parameter``, parameter) for every trainable parameter, in a fixed order (components by name)."""
    from ...training.trainable import trainable_parameters

    return trainable_parameters(sorted(components.items()))


def trainable_state(components: Mapping[str, Any]) -> dict[str, Any]:
    """A CPU copy of every trainable parameter, by ``component.parameter`` name."""
    return {name: p.detach().to("cpu", copy=True).contiguous() for name, p in trainable_named(components)}


def load_trainable(components: Mapping[str, Any], state: Mapping[str, Any], source: str) -> None:
    """Copy saved trainable weights back in place (dtype and device of the live parameter are kept)."""
    import torch

    live = dict(trainable_named(components))
    missing, unexpected = sorted(set(live) - set(state)), sorted(set(state) - set(live))
    if missing or unexpected:
        raise RecipeError(f"{source}: the checkpoint's trainable weights do not match this run (missing "
                          f"{missing[:3]}, unexpected {unexpected[:3]}); resume with the same --model, method, "
                          f"--lora-rank and trained parts, or start a new --out")
    with torch.no_grad():
        for name, p in live.items():
            if tuple(p.shape) != tuple(state[name].shape):
                raise RecipeError(f"{source}: {name} has shape {tuple(state[name].shape)} in the checkpoint, "
                                  f"{tuple(p.shape)} in this run; resume with the same settings")
            p.copy_(state[name].to(p.device, p.dtype))


def rng_state() -> dict[str, Any]:
    """Every RNG a step reads: torch CPU, and each CUDA device where present."""
    import torch

    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    import torch

    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _complete(path: Path) -> bool:
    # a one-process checkpoint (safetensors weights) or a sharded one (torch.distributed.checkpoint folder)
    return (path / STATE).is_file() and ((path / WEIGHTS).is_file() or (path / "sharded" / ".metadata").is_file())


@dataclasses.dataclass
class Checkpoints:
    """The checkpoints of one output folder.

    Example:
        >>> import tempfile
        >>> ck = Checkpoints(Path(tempfile.mkdtemp()))
        >>> ck.save(3, {"w": __import__("torch").ones(2)}, {"step": 3}).name, ck.latest().name
        ('step-000003', 'step-000003')
    """

    out: Path
    keep: int = 3

    @property
    def folder(self) -> Path:
        return self.out / "checkpoints"

    def all(self) -> list[Path]:
        """Complete checkpoints, oldest first (a temporary folder of an interrupted save is never listed)."""
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir() if p.is_dir() and _NAME.fullmatch(p.name) and _complete(p)]
        return sorted(found, key=lambda p: int(_NAME.fullmatch(p.name)[1]))

    def latest(self) -> Path | None:
        found = self.all()
        return found[-1] if found else None

    def save(self, step: int, weights: Mapping[str, Any], state: Mapping[str, Any]) -> Path:
        """Write one checkpoint atomically and drop the oldest beyond ``keep``."""
        import torch
        from safetensors.torch import save_file

        target = self.folder / f"step-{step:06d}"
        with written_atomically(target, folder=True) as tmp:
            save_file(dict(weights), str(tmp / WEIGHTS))
            torch.save(dict(state), tmp / STATE)
        self.prune()
        return target

    def prune(self) -> None:
        """Drop the oldest checkpoints beyond ``keep`` and the temporary folders of saves that were killed."""
        for old in self.all()[:-self.keep] if self.keep > 0 else []:
            shutil.rmtree(old, ignore_errors=True)
        for stale in self.folder.glob(".step-*"):
            shutil.rmtree(stale, ignore_errors=True)

    def find(self, resume: str) -> Path:
        """The checkpoint ``--resume`` names: ``latest`` or a path; a RecipeError when there is none."""
        if resume == "latest":
            found = self.latest()
            if found is None:
                raise RecipeError(f"--resume latest: no complete checkpoint in {self.folder}; start without --resume, "
                                  f"or pass the --out of the run to continue")
            return found
        path = Path(resume).expanduser()
        if not _complete(path):
            raise RecipeError(f"--resume {resume}: not a checkpoint folder (needs {STATE} and {WEIGHTS} or sharded/); pass "
                              f"'latest' or a folder under {self.folder}")
        return path

    @staticmethod
    def load(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
        """(trainable weights, state) of a checkpoint folder; only tensors and plain data are unpickled."""
        import torch
        from safetensors.torch import load_file

        try:
            weights = load_file(str(path / WEIGHTS))
            state = torch.load(path / STATE, map_location="cpu", weights_only=True)
        except Exception as err:  # a damaged file: safetensors and torch raise their own types
            raise RecipeError(f"{path}: cannot read the checkpoint ({type(err).__name__}: {err}); resume from an "
                              f"older one (--resume {path.parent}/step-...)") from None
        return weights, state


class Resumed(NamedTuple):
    """The checkpoint ``--resume`` continues: its folder, trainable weights and state, read and checked before loading."""

    path: Path
    weights: dict[str, Any]
    state: dict[str, Any]


def data_list(data: Any) -> list[str]:
    """What fixes the batch order: each sample's file, size in bytes and bucket (and its reference's, pose's, face's)."""
    def name(path: Path) -> str:
        return str(path.relative_to(data.folder) if path.is_relative_to(data.folder) else path)

    # an edit dataset's reference (Wan Animate's reference, pose and face videos) is part of the sample: another is
    # other data
    return [f"{name(s.path)}|{s.path.stat().st_size}|{s.bucket[0]}x{s.bucket[1]}"
            + "".join(f"|{name(p)}|{p.stat().st_size}" for p in _beside(s)) for s in data.samples]


def _beside(sample: Any) -> list[Path]:
    """The files a sample trains with beside its own: an edit dataset's reference, Wan Animate's three inputs."""
    return [p for p in (getattr(sample, k, None) for k in ("reference", "pose", "face")) if p is not None]


def check_resume(settings: Any, data: Any, checkpoints: Checkpoints, keys: tuple[str, ...]) -> Resumed | None:
    """The checkpoint of ``--resume``, refused (a RecipeError) when the run's ``keys`` settings or its data changed:
    read from the data folder and the checkpoint alone, so the refusal comes before any model loads.

    Example:
        >>> import tempfile
        >>> check_resume(type("S", (), {"resume": None})(), None, Checkpoints(Path(tempfile.mkdtemp()), 3), ()) is None
        True
    """
    if settings.resume is None:
        return None
    path = checkpoints.find(settings.resume)
    if is_sharded(path):  # the weights stay in their shards until the model is there to take them
        import torch

        weights, state = {}, torch.load(path / "state.pt", map_location="cpu", weights_only=True)
    else:
        weights, state = Checkpoints.load(path)
    now = settings.record()
    changed = [f"{k}: {state['settings'].get(k)!r} -> {now[k]!r}" for k in keys if state["settings"].get(k) != now[k]]
    if changed:
        raise RecipeError(f"--resume {settings.resume}: {path} was made with other settings ({'; '.join(changed)}); "
                          f"a resumed run must keep them to continue the same run; start a new --out to change them")
    then, now_data = state.get("data", []), data_list(data)
    if then != now_data:
        gone, new = sorted(set(then) - set(now_data)), sorted(set(now_data) - set(then))
        raise RecipeError(f"--resume {settings.resume}: the data folder changed since {path.name} ({len(then)} files "
                          f"then, {len(now_data)} now; gone or changed: {[g.split('|')[0] for g in gone[:3]]}, new: "
                          f"{[n.split('|')[0] for n in new[:3]]}); the batches would not be the ones the run was "
                          f"trained on. Restore the folder to continue, or start a new --out with the new data")
    return Resumed(path, weights, state)
