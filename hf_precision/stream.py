"""Load a component tensor by tensor, straight into its planned dtype, with plain file reads.

``from_pretrained`` memory-maps the safetensors files: every page it touches counts in the process's RSS until
the file is closed, so loading fp32 files into fp16 peaks near 2.4x the final weights (measured in
``scripts/benchmark.py``). Here each tensor is read with ``readinto`` into a buffer of the file's dtype and cast
to its target (float32 for islands): the peak is the final weights plus one tensor. Anything unexpected (sharded
index gaps, missing or extra keys, shape differences, another library) returns ``None`` and the caller falls back to
``from_pretrained``, so this is an optimisation, never a second source of truth.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

__all__ = ["read_header", "read_tensor", "stream_component", "weight_files"]

_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


def read_header(path: Path) -> tuple[int, dict[str, Any]]:
    """The data offset and the tensor table of a safetensors file (its documented 8-byte length + JSON header)."""
    with open(path, "rb") as f:
        length = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(length))
    header.pop("__metadata__", None)
    return 8 + length, header


def read_tensor(f: Any, base: int, info: dict[str, Any], scratch: torch.Tensor | None = None) -> torch.Tensor:
    """Read one tensor of an open safetensors file (no memory map).

    With ``scratch`` (a uint8 buffer at least as large as the tensor) the bytes land there and the returned tensor is
    a view of it, valid until the next read: callers cast or copy it. Reusing one buffer keeps the allocator from
    piling up freed temporaries (glibc keeps them resident once its mmap threshold has grown).
    """
    dtype = _DTYPES[info["dtype"]]
    start, end = info["data_offsets"]
    if scratch is None:
        out = torch.empty(info["shape"], dtype=dtype)
        raw = out.view(-1).view(torch.uint8)
    else:
        raw = scratch[: end - start]
        out = raw.view(dtype).view(info["shape"]) if end > start else torch.empty(info["shape"], dtype=dtype)
    if end > start:
        f.seek(base + start)
        if f.readinto(raw.numpy()) != end - start:
            raise OSError(f"{f.name}: truncated tensor data")
    return out


def weight_files(comp_dir: Path, variant: str | None) -> list[Path]:
    """The safetensors files of one component, for the variant asked (falls back to the plain files)."""
    files = sorted(comp_dir.glob("*.safetensors"))
    tagged = [f for f in files if f".{variant}." in f.name or f".{variant}-" in f.name] if variant else []
    plain = [f for f in files if ".fp16." not in f.name and ".fp16-" not in f.name]
    return tagged or plain


def _build_empty(library: str, class_name: str, comp_dir: Path) -> torch.nn.Module | None:
    from accelerate import init_empty_weights

    if library == "diffusers":
        import diffusers

        cls = getattr(diffusers, class_name, None)
        if cls is None or not hasattr(cls, "from_config"):
            return None
        with init_empty_weights():
            return cls.from_config(cls.load_config(comp_dir))
    if library == "transformers":
        import transformers

        cls = getattr(transformers, class_name, None)
        if cls is None or not hasattr(cls, "config_class"):
            return None
        config = cls.config_class.from_pretrained(comp_dir)
        with init_empty_weights():
            return cls._from_config(config)
    return None


def _assign(model: torch.nn.Module, key: str, tensor: torch.Tensor) -> None:
    # Placed directly (not through accelerate's set_module_tensor_to_device, which would cast the value back to
    # the empty model's fp32 unless told otherwise, and may copy it again).
    owner_name, _, leaf = key.rpartition(".")
    owner = model.get_submodule(owner_name) if owner_name else model
    if leaf in owner._parameters:
        old = owner._parameters[leaf]
        grad = old.requires_grad and tensor.is_floating_point() if old is not None else False
        owner._parameters[leaf] = torch.nn.Parameter(tensor, requires_grad=grad)
    else:
        owner._buffers[leaf] = tensor


def stream_component(library: str, class_name: str, comp_dir: Path, *, variant: str | None,
                     target: Callable[[str, torch.dtype], torch.dtype], device: str = "cpu") -> torch.nn.Module | None:
    """Build a component on the meta device and fill it tensor by tensor; ``None`` when it does not fit.

    ``target(key, file_dtype)`` gives the dtype of each floating tensor (islands: float32).
    """
    files = weight_files(comp_dir, variant)
    if not files:
        return None
    try:
        model = _build_empty(library, class_name, comp_dir)
    except Exception:  # an unusual class or config: let from_pretrained deal with it
        return None
    if model is None:
        return None
    expected = model.state_dict()
    tables = [(f, *read_header(f)) for f in files]
    keys = [k for _, _, header in tables for k in header]
    if len(keys) != len(set(keys)) or not set(keys) <= set(expected):
        return None  # renamed keys (e.g. an older transformers layout) or duplicates: not ours to interpret
    for _, _, header in tables:
        for key, info in header.items():
            if list(expected[key].shape) != list(info["shape"]) or info["dtype"] not in _DTYPES:
                return None
    largest = max((i["data_offsets"][1] - i["data_offsets"][0] for _, _, h in tables for i in h.values()), default=0)
    scratch = torch.empty(largest, dtype=torch.uint8)
    with torch.no_grad():
        for path, base, header in tables:
            with open(path, "rb", buffering=0) as f:
                for key, info in header.items():
                    view = read_tensor(f, base, info, scratch)
                    want = target(key, view.dtype) if view.is_floating_point() else view.dtype
                    tensor = view.to(want, copy=True)  # a fresh tensor: the scratch buffer is reused
                    _assign(model, key, tensor.to(device))
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # T5's embed_tokens shares shared.weight, which the file stores once
    if any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers())):
        return None
    model.eval()
    return model
