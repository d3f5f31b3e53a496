"""Load a component tensor by tensor, straight into its planned dtype, with plain file reads.

``from_pretrained`` memory-maps the files and every page touched stays in RSS, so fp32 files loaded into fp16 peak
near 2.4x the weights (``benchmarks/benchmark.py``); here the peak is the weights plus one tensor. Anything
unexpected (index gaps, missing or extra keys, shape differences, another library) returns ``None`` and the caller
falls back to ``from_pretrained``: an optimisation, never a second source of truth.
"""

from __future__ import annotations

import mmap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from .headers import read_header

__all__ = ["file_dtypes", "stream_component", "weight_files", "SAFETENSORS_DTYPES"]

SAFETENSORS_DTYPES = {  # a safetensors header's dtype name -> torch's
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
}


_RELEASE_EVERY = 32 * 2**20


def _mapped_tensors(path: Path, base: int, header: dict[str, Any],
                    target: Callable[[str, torch.dtype], torch.dtype]) -> Iterator[tuple[str, torch.Tensor]]:
    """Each tensor of a file, cast (as a fresh copy) to its target dtype.

    The cast reads the memory-mapped page cache directly, and every 32 MiB the pages are dropped from this process
    (MADV_DONTNEED): the RSS holds the converted weights plus at most one tensor (or 32 MiB) of the file.
    """
    page = mmap.PAGESIZE
    released = 0
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        for key, info in header.items():
            dtype = SAFETENSORS_DTYPES[info["dtype"]]
            start, end = (base + o for o in info["data_offsets"])
            if end == start:
                yield key, torch.empty(info["shape"], dtype=dtype)
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # "buffer is not writable": it is only read, then copied
                source = torch.frombuffer(mapped, dtype=dtype, count=(end - start) // dtype.itemsize, offset=start)
            want = target(key, dtype) if dtype.is_floating_point else dtype
            tensor = source.view(info["shape"]).to(want, copy=True)
            del source  # the mapping can only be closed once no tensor views it
            if end - released >= _RELEASE_EVERY:  # one syscall per 32 MiB rather than one per tensor
                mapped.madvise(mmap.MADV_DONTNEED, released, end // page * page - released)
                released = end // page * page
            yield key, tensor


def file_dtypes(path: Path) -> set[torch.dtype]:
    """The floating-point dtypes of the tensors in a safetensors file, read from its header alone.

    Example:
        >>> import tempfile, torch
        >>> from safetensors.torch import save_file
        >>> path = Path(tempfile.mkdtemp()) / "x.safetensors"
        >>> save_file({"w": torch.zeros(2, dtype=torch.float16), "i": torch.zeros(2, dtype=torch.int64)}, path)
        >>> file_dtypes(path)
        {torch.float16}
    """
    _, header = read_header(path)
    dtypes = {SAFETENSORS_DTYPES.get(info["dtype"]) for info in header.values()}
    return {d for d in dtypes if d is not None and d.is_floating_point}


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
            if list(expected[key].shape) != list(info["shape"]) or info["dtype"] not in SAFETENSORS_DTYPES:
                return None
    with torch.no_grad():
        for path, base, header in tables:
            for key, tensor in _mapped_tensors(path, base, header, target):
                _assign(model, key, tensor.to(device))
    if hasattr(model, "tie_weights"):
        model.tie_weights()  # T5's embed_tokens shares shared.weight, which the file stores once
    if any(t.device.type == "meta" for t in (*model.parameters(), *model.buffers())):
        return None
    model.eval()
    return model
