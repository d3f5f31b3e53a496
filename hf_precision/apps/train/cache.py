"""On-disk cache of VAE latents and text embeddings, keyed by the precision plan's fingerprint.

A key hashes the plan fingerprint and the sample (file, size, mtime, bucket, caption), so an fp16 cache is never
read by a bf16 run (the NaN of kohya-ss/sd-scripts PR #1413) and an edited sample is encoded again. Entries are
written atomically; a damaged one is encoded again.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..outputs import written_atomically

__all__ = ["EncodingCache", "entry_key", "tp_device", "offload_encoders", "join_padded"]


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
    """What identifies a sample's pixels: its file's path, size and mtime, bucket and frames, and those of each file
    it trains beside (its reference, Wan Animate's pose and face videos)."""
    st = Path(sample.path).stat()
    parts: tuple[Any, ...] = str(Path(sample.path).resolve()), st.st_size, st.st_mtime_ns, sample.bucket, sample.frames
    for key in ("reference", "pose", "face"):
        path = getattr(sample, key, None)
        if path is not None:
            rs = Path(path).stat()
            parts = (*parts, key, str(Path(path).resolve()), rs.st_size, rs.st_mtime_ns)
    return parts


def tp_device(tp: Any) -> Any:
    """The device the denoiser sits on."""
    import torch

    module = tp.components[tp.denoiser_name]
    return next(module.parameters(), torch.empty(0)).device


def offload_encoders(run: Any, device: Any, text: bool = True) -> None:
    """Move the frozen VAE and image encoder (and text encoders) to ``device`` once their outputs are cached."""
    import torch

    if tp_device(run.tp).type == "cpu":
        return
    for name, module in run.tp.components.items():
        frozen = isinstance(module, torch.nn.Module) and not any(p.requires_grad for p in module.parameters())
        if frozen and (name in ("vae", "image_encoder") or (text and name.startswith("text_encoder"))):
            module.to(device)


def join_padded(texts: list[Mapping[str, Any]], keys: list[str], masks: list[str]) -> dict[str, Any]:
    """The tensors ``keys`` of captions encoded one at a time, as one batch: where lengths differ (Qwen-Image keeps
    no padding for one prompt) they are zero-padded to the longest and each of ``masks`` rebuilt as the pipeline
    pads a batch of prompts; without a mask, one error naming the fix.

    Example:
        >>> import torch
        >>> b = join_padded([{"e": torch.ones(1, 2, 3)}, {"e": torch.ones(1, 4, 3)}], ["e"], ["m"])
        >>> tuple(b["e"].shape), b["m"].tolist()
        ((2, 4, 3), [[1, 1, 0, 0], [1, 1, 1, 1]])
    """
    import torch
    from torch.nn.functional import pad

    from ...errors import RecipeError

    out: dict[str, Any] = {}
    lengths: list[int] | None = None
    for k in [k for k in keys if k not in masks] + [k for k in keys if k in masks]:
        parts = [t[k] for t in texts]
        if k in masks and lengths is not None:
            continue  # rebuilt below over the padded length
        long = max(p.shape[1] if p.dim() > 1 else 0 for p in parts)
        if all(p.dim() > 1 and p.shape[1] == long for p in parts) or any(p.dim() < 2 for p in parts):
            out[k] = torch.cat(parts)
            continue
        if not masks:
            raise RecipeError(f"--batch-size: the captions of one batch encode to different lengths "
                              f"({', '.join(str(p.shape[1]) for p in parts)} tokens of {k!r}) and the model's "
                              f"conditioning has no attention mask to pad them under; use --batch-size 1")
        lengths = lengths or [p.shape[1] for p in parts]
        out[k] = torch.cat([pad(p, (0, 0) * (p.dim() - 2) + (0, long - p.shape[1])) for p in parts])
    if lengths is not None:
        for m in masks:
            rows = [t[m].to(torch.long) if m in t else torch.ones(1, n, dtype=torch.long)
                    for t, n in zip(texts, lengths)]
            out[m] = torch.cat([pad(r, (0, max(lengths) - r.shape[1])) for r in rows])
    return out
