"""A pipeline borrowed for a few runs and handed back as it came (calibrate's, and check's and training's too).

``Session`` snapshots every parameter and buffer (references: a casting run replaces ``.data``) and the VAEs'
``force_upcast``, silences the progress bar, sets up model offload, runs seeded, and on exit restores all of it and
re-applies the recipe the pipeline came with.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from ...runtime.progress import quiet_progress

__all__ = ["Session"]


class Session:
    """Runs of one pipeline, handed back as it came.

    ``restore``: snapshot parameters, buffers and ``force_upcast`` on entry and put them back after each run and on
    exit (a run may apply a recipe that casts them). ``offload_on``: run with ``enable_model_cpu_offload(device=...)``.
    ``handback``: on exit take those hooks off, put each component back and re-apply the recipe the pipeline had.

    Example:
        >>> import torch
        >>> from types import SimpleNamespace
        >>> pipe = SimpleNamespace(components={"net": torch.nn.Linear(2, 2)})
        >>> weight = pipe.components["net"].weight.data_ptr()
        >>> with Session(pipe, restore=True) as session:  # a run that casts; the weights come back
        ...     session.run(lambda p: p.components["net"].double()(torch.ones(2, dtype=torch.float64)).dtype)
        torch.float64
        >>> pipe.components["net"].weight.dtype, pipe.components["net"].weight.data_ptr() == weight
        (torch.float32, True)
    """

    def __init__(self, pipe: Any, *, restore: bool = False, offload_on: str | None = None, handback: bool = False):
        import torch

        self.pipe = pipe
        self.components = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
        self._restore, self._offload_on, self._handback = restore, offload_on, handback
        self.offloaded = False  # whether accelerate's hooks place the components (set up here or before)
        self._stack = contextlib.ExitStack()
        self._saved: list[tuple[Any, str, str, Any]] = []
        self._upcast: dict[str, Any] = {}
        self._placed: dict[str, Any] = {}
        self._ours = False
        self._previous: Any = None

    def __enter__(self) -> Session:
        from ...runtime.apply import applied

        comps = self.components
        self._placed = {n: next((t.device for t in m.parameters()), None) for n, m in comps.items()}
        already = any(hasattr(m, "_hf_hook") for m in comps.values())
        self._ours = self._offload_on is not None and not already
        if self._offload_on is not None:
            self.pipe.enable_model_cpu_offload(device=self._offload_on)
        # A pipeline already offloaded (accelerate hooks) stays where it is: the hooks move each component when it runs.
        self.offloaded = self._offload_on is not None or already
        self._previous = applied(self.pipe) if self._handback else None
        if self._restore:
            self._saved = [(owner, kind, leaf, tensor.data) for m in comps.values() for owner in m.modules()
                           for kind in ("_parameters", "_buffers") for leaf, tensor in getattr(owner, kind).items()
                           if tensor is not None]
            self._upcast = {n: m.config.force_upcast for n, m in comps.items()
                            if hasattr(getattr(m, "config", None), "force_upcast")}
        self._stack.enter_context(quiet_progress(self.pipe))
        return self

    def on_exit(self, fn: Callable[[], Any]) -> None:
        """Call ``fn`` on exit, before the pipeline is restored (last registered, first called)."""
        self._stack.callback(fn)

    def restore(self) -> None:
        """Put back every parameter and buffer a run replaced, and the VAEs' ``force_upcast``."""
        for owner, kind, leaf, data in self._saved:
            current = getattr(owner, kind).get(leaf)
            if current is not None and current.data is not data:
                current.data = data
        for n, value in self._upcast.items():
            self.components[n].register_to_config(force_upcast=value)

    def run(self, call: Callable[[Any], Any] | Mapping[str, Any], seed: int | None = None,
            hooks: tuple[Any, ...] = ()) -> Any:
        """One run without gradients: ``call(pipe)``, or ``pipe(**call)``. With ``seed``, torch's global generator and
        a fresh ``generator`` in the call's kwargs start from it, so every run draws the same noise. ``hooks`` (things
        with ``remove()``) are removed afterwards, also when the run raised; then the pipeline is restored."""
        import torch

        try:
            if seed is not None:
                torch.manual_seed(seed)
            with torch.no_grad():
                if callable(call):
                    return call(self.pipe)
                args = dict(call)
                if seed is not None:
                    gen = args.get("generator")
                    where = gen.device if isinstance(gen, torch.Generator) else "cpu"
                    args["generator"] = torch.Generator(where).manual_seed(seed)
                return self.pipe(**args)
        finally:
            for hook in hooks:
                hook.remove()
            self.restore()

    def __exit__(self, *exc: Any) -> None:
        from ...runtime.apply import apply_recipe

        self._stack.close()
        self.restore()
        if self._ours and self._handback:  # the caller's pipeline goes back without our offload hooks, where it was
            self.pipe.remove_all_hooks()
            for n, where in self._placed.items():
                if where is not None:
                    self.components[n].to(where)
        if self._previous is not None:
            apply_recipe(self.pipe, self._previous.recipe)
