"""On-disk cache of VAE latents and text embeddings, keyed by the precision plan's fingerprint.

A cache entry's key hashes the plan fingerprint (dtypes per component, model), the file's path, size and mtime,
its bucket and frame count, and the caption, so a cache made in fp16 is never read by a bf16 run (the NaN of
kohya-ss/sd-scripts PR #1413) and an edited image or caption is encoded again. Entries are safetensors files
written atomically; a damaged entry is encoded again, never trusted.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..outputs import written_atomically

__all__ = ["EncodingCache", "entry_key", "tp_device", "offload_encoders"]


def entry_key(fingerprint: str, kind: str, *parts: Any) -> str:
    """Hex key of one cache entry.

    Example:
        >>> entry_key("abc", "latents", "x.png", 1) != entry_key("abd", "latents", "x.png", 1)
        True
    """
    h = hashlib.sha256(f"{fingerprint}\0{kind}".encode())
    for part in parts:
        h.update(b"\0" + str(part).encode())
    return h.hexdigest()[:32]


@dataclasses.dataclass
class EncodingCache:
    """Latents / embeddings per sample, in ``folder``, valid only for the plan whose fingerprint it was made with.

    Example:
        >>> import tempfile, torch
        >>> c = EncodingCache(Path(tempfile.mkdtemp()), "plan-a")
        >>> c.put("latents", ("x.png",), {"latents": torch.ones(1)}); c.get("latents", ("x.png",))["latents"]
        tensor([1.])
        >>> EncodingCache(c.folder, "plan-b").get("latents", ("x.png",)) is None
        True
    """

    folder: Path
    fingerprint: str

    def _path(self, kind: str, parts: tuple[Any, ...]) -> Path:
        key = entry_key(self.fingerprint, kind, *parts)
        return self.folder / kind / f"{key}.safetensors"

    def get(self, kind: str, parts: tuple[Any, ...]) -> dict[str, Any] | None:
        from safetensors.torch import load_file

        path = self._path(kind, parts)
        if not path.is_file():
            return None
        try:
            return load_file(str(path))
        except Exception:  # a damaged entry (disk full at write time, edited by hand) is encoded again
            return None

    def put(self, kind: str, parts: tuple[Any, ...], tensors: Mapping[str, Any]) -> None:
        from safetensors.torch import save_file

        path = self._path(kind, parts)
        with written_atomically(path) as tmp:
            save_file({k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}, str(tmp),
                      metadata={"fingerprint": self.fingerprint})


def sample_parts(sample: Any) -> tuple[Any, ...]:
    """What identifies a sample's pixels: path, size and mtime of the file, its bucket and frames; and of its
    reference image when it has one (an edit dataset: an edited reference is encoded again)."""
    st = Path(sample.path).stat()
    parts = str(Path(sample.path).resolve()), st.st_size, st.st_mtime_ns, sample.bucket, sample.frames
    ref = getattr(sample, "reference", None)
    if ref is None:
        return parts
    rs = Path(ref).stat()
    return (*parts, "reference", str(Path(ref).resolve()), rs.st_size, rs.st_mtime_ns)


def tp_device(tp: Any) -> Any:
    """The device the denoiser sits on."""
    import torch

    module = tp.components[tp.denoiser_name]
    return next(module.parameters(), torch.empty(0)).device


def offload_encoders(run: Any, device: Any, text: bool = True) -> None:
    """Move the frozen VAE (and text encoders) to ``device``: off the accelerator once their outputs are cached."""
    import torch

    if tp_device(run.tp).type == "cpu":
        return
    for name, module in run.tp.components.items():
        frozen = isinstance(module, torch.nn.Module) and not any(p.requires_grad for p in module.parameters())
        if frozen and (name == "vae" or (text and name.startswith("text_encoder"))):
            module.to(device)
