"""safetensors headers, checked against their files without torch: the format is an 8-byte length, a JSON header,
then the tensors' bytes (https://github.com/huggingface/safetensors, "Format").

Torch-free, so the command line can find a truncated or corrupt weight file before torch and diffusers are imported
(they take seconds; a header takes microseconds). :mod:`hf_precision.runtime.stream` reads tensors through it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..units import format_bytes

__all__ = ["read_header"]

# Bytes per element of the safetensors dtype names (sub-byte and unknown ones skip the per-tensor size check).
_ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "I16": 2, "U16": 2, "F16": 2,
             "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
# The safetensors library refuses headers above 100,000,000 bytes (safetensors/src/tensor.rs, MAX_HEADER_SIZE).
_MAX_HEADER = 100_000_000


def read_header(path: Path, *, repo: str | None = None) -> tuple[int, dict[str, Any]]:
    """The data offset and the tensor table of a safetensors file, checked against the file before any tensor is read: a
    truncated file, corrupt header or offsets that do not add up are a :class:`~hf_precision.errors.DamagedFileError`
    naming the file, its component and how to get a good copy (not ``requested buffer length ... after offset``).

    Example:
        >>> import tempfile, torch, safetensors.torch
        >>> path = Path(tempfile.mkdtemp()) / "x.safetensors"
        >>> safetensors.torch.save_file({"w": torch.zeros(1000)}, path)
        >>> read_header(path)[1]["w"]["shape"]
        [1000]
        >>> _ = path.write_bytes(path.read_bytes()[:2000])
        >>> read_header(path)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.DamagedFileError: ...x.safetensors: damaged file: truncated: 2.0 kB of an expected 4.1 kB (2,000 of ... bytes); ...
    """
    from ..errors import DamagedFileError
    from ..recipe.files import damaged_file

    def damaged(problem: str) -> DamagedFileError:
        return damaged_file(path, problem, repo=repo)

    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise damaged(f"only {size} bytes, too short for a safetensors file (an 8-byte length, then a header)")
            length = int.from_bytes(head, "little")
            if length > min(size - 8, _MAX_HEADER):
                raise damaged(f"its first 8 bytes give a header of {length:,} bytes, but the file has {size:,} "
                              "bytes: it is truncated or not a safetensors file")
            raw = f.read(length)
    except OSError as err:
        raise DamagedFileError(path, f"cannot read it ({err.strerror or err})",
                               "check that it exists and is readable (permissions, a broken link)") from None
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise damaged(f"its header is not valid JSON ({err}); the file is corrupt") from None
    if not isinstance(header, dict):
        raise damaged(f"its header is a JSON {type(header).__name__}, not an object; the file is corrupt")
    header.pop("__metadata__", None)
    spans = []
    for key, info in header.items():
        ok = isinstance(info, dict) and isinstance(info.get("dtype"), str) and isinstance(info.get("shape"), list) \
            and all(isinstance(d, int) and d >= 0 for d in info["shape"]) \
            and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2 \
            and all(isinstance(o, int) for o in info["data_offsets"]) and 0 <= info["data_offsets"][0] <= info["data_offsets"][1]
        if not ok:
            raise damaged(f"its header entry for {key!r} is not a tensor description (dtype, shape, data_offsets)")
        start, end = info["data_offsets"]
        itemsize = _ITEMSIZE.get(info["dtype"])
        if itemsize is not None and end - start != itemsize * math.prod(info["shape"]):
            raise damaged(f"tensor {key!r} ({info['dtype']} {info['shape']}) has {end - start:,} bytes in the header "
                          f"instead of {itemsize * math.prod(info['shape']):,}; the header is corrupt")
        spans.append((start, end, key))
    spans.sort()
    covered = 0
    for start, end, key in spans:
        if start != covered:  # the safetensors library refuses gaps and overlaps too
            raise damaged(f"tensor {key!r} starts at byte {start:,} of the data, expected {covered:,}; the header is corrupt")
        covered = end
    expected = 8 + length + covered
    if size < expected:
        raise damaged(f"truncated: {format_bytes(size)} of an expected {format_bytes(expected)} ({size:,} of {expected:,} bytes)")
    if size > expected:
        raise damaged(f"{size - expected:,} bytes longer than its header describes ({expected:,} bytes)")
    return 8 + length, header
