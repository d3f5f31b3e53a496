"""Plain diffusers really fails on these dtype layouts (docs/facts.md#f11-layout-table), row by row.

Each layout of ``tests/layouts.py`` is applied by hand (``apply_plain``: ``.to(dtype)``, ``.float()`` on
keep_fp32 modules, then the row's setup) to a tiny random pipeline, which is then called once. Rows with
an ``expect`` regex must raise that ``RuntimeError`` inside ``layout.module``; the others must run and
return finite output. No hf_precision code other than ``hf_precision.testing`` (the tiny pipelines) is involved.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import numpy as np
import pytest
import torch

try:
    from layouts import LAYOUTS, LAYOUTS_BY_ID, apply_plain, matched_modules
except ImportError:  # tests/ imported as a package
    from tests.layouts import LAYOUTS, LAYOUTS_BY_ID, apply_plain, matched_modules

from hf_precision.testing.pipelines import example_call_kwargs

TABLE_IDS = (
    [f"S{i}" for i in range(1, 28)]
    + [f"V{i}" for i in range(1, 10)]
    + [f"P{i}" for i in range(1, 6)]
    + [f"D{i}" for i in range(1, 4)]
)


class ModuleTrace:
    """Stack of the modules executing (global forward hooks), named ``"{component}.{name}"``."""

    def __init__(self, pipe):
        self.names = {}
        for component_name, component in pipe.components.items():
            if isinstance(component, torch.nn.Module):
                for name, module in component.named_modules():
                    self.names[id(module)] = f"{component_name}.{name}" if name else component_name
        self.stack: list[str] = []

    def pre(self, module, args):
        self.stack.append(self.names.get(id(module), f"<{type(module).__name__}>"))

    def post(self, module, args, output):
        self.stack.pop()

    @property
    def innermost(self) -> str | None:
        return self.stack[-1] if self.stack else None


@contextmanager
def trace_modules(pipe):
    trace = ModuleTrace(pipe)
    handles = [
        torch.nn.modules.module.register_module_forward_pre_hook(trace.pre),
        torch.nn.modules.module.register_module_forward_hook(trace.post),
    ]
    try:
        yield trace
    finally:
        for handle in handles:
            handle.remove()


def _output(kind, result):
    return result.frames if kind == "svd" else result.images


def test_table_is_complete():
    assert [i for i in TABLE_IDS if i not in LAYOUTS_BY_ID] == []
    assert len(LAYOUTS_BY_ID) == len(LAYOUTS), "duplicate layout ids"
    for layout in LAYOUTS:
        assert (layout.expect is None) == (layout.module is None), layout.id
        if layout.expect is not None:
            re.compile(layout.expect)


@pytest.mark.parametrize("layout", LAYOUTS, ids=[layout.id for layout in LAYOUTS])
def test_plain_diffusers(layout, tiny_pipe):
    pipe = tiny_pipe(layout.kind)

    # Vacuity guard: every keep_fp32 glob matches something in the tiny pipeline.
    for name, spec in layout.overrides.items():
        for pattern in spec.get("keep_fp32", []):
            assert matched_modules(getattr(pipe, name), [pattern]), f"{layout.id}: {name}: {pattern!r} matches nothing"

    extra = apply_plain(pipe, layout)

    # Vacuity guard: plain casts really happened (rows without a setup are exactly their overrides).
    if layout.setup is None:
        for name, spec in layout.overrides.items():
            dtype = getattr(torch, spec.get("dtype", "float32"))
            kept = set(matched_modules(getattr(pipe, name), spec.get("keep_fp32", [])))
            for module_name, module in getattr(pipe, name).named_modules():
                in_island = any(module_name == k or module_name.startswith(k + ".") for k in kept)
                expected = torch.float32 if in_island else dtype
                for param in module.parameters(recurse=False):
                    assert param.dtype == expected, f"{layout.id}: {name}.{module_name}: {param.dtype} != {expected}"

    kwargs = {**example_call_kwargs(layout.kind), **extra}
    generator = torch.Generator().manual_seed(0)
    with trace_modules(pipe) as trace:
        if layout.expect is None:
            out = _output(layout.kind, pipe(**kwargs, generator=generator))
        else:
            with pytest.raises(RuntimeError, match=layout.expect):
                pipe(**kwargs, generator=generator)
    if layout.expect is None:
        assert np.isfinite(np.asarray(out, dtype=np.float32)).all(), f"{layout.id}: non-finite output"
    else:
        assert trace.innermost == layout.module, f"{layout.id}: failed in {trace.innermost}, table says {layout.module}"


@pytest.mark.parametrize("kind", ["sdxl", "svd", "pixart", "dit", "sd15"])
def test_saved_pipeline_reloads(kind, saved_pipeline):
    from diffusers import DiffusionPipeline

    pipe = DiffusionPipeline.from_pretrained(saved_pipeline(kind))
    pipe.set_progress_bar_config(disable=True)
    assert {c.dtype for c in pipe.components.values() if isinstance(c, torch.nn.Module)} == {torch.float32}
    out = _output(kind, pipe(**example_call_kwargs(kind), generator=torch.Generator().manual_seed(0)))
    assert np.isfinite(np.asarray(out, dtype=np.float32)).all()


def test_saved_fp16_variant_loads_in_fp16(saved_pipeline):
    from diffusers import DiffusionPipeline

    folder = saved_pipeline("sdxl", fp16_variant=True)
    assert (folder / "unet" / "diffusion_pytorch_model.safetensors").is_file()
    assert (folder / "unet" / "diffusion_pytorch_model.fp16.safetensors").is_file()
    pipe = DiffusionPipeline.from_pretrained(folder, variant="fp16", dtype=torch.float16)
    pipe.set_progress_bar_config(disable=True)
    assert {c.dtype for c in pipe.components.values() if isinstance(c, torch.nn.Module)} == {torch.float16}
    out = _output("sdxl", pipe(**example_call_kwargs("sdxl"), generator=torch.Generator().manual_seed(0)))
    assert np.isfinite(out).all()
