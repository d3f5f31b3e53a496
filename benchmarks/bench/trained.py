"""Small models trained by ``hf-precision train`` for the fidelity rows of the benchmarks.

Random weights are chaotic: a difference of one rounding grows over the blocks and the sampling steps, so an output
difference on them measures that chaos as much as the precision of a layout. Here a small pipeline's denoiser (the
Flux transformer of ``benchmarks/bench_quantize.py`` and ``benchmarks/bench_train_fidelity.py``; ``benchmarks/benchmark.py``
measures the SDXL shipped in the package instead, ``hf_precision.apps.shapes_model``) is fitted first, as a
full fine-tune in the fp32 layout with a fixed seed, to the generated coloured shapes of the ``--demo``
(``hf_precision.apps.train.demo``), and then measured. The result is cached under ``bench_output/trained/``
(gitignored) as ``<name>-<fingerprint>``, the fingerprint hashing the architecture and every training setting; a
half-written folder is never read (written beside it and renamed into place). Beside the trained pipeline the folder
keeps the same pipeline before training (``untrained/``), so both can be measured side by side.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench_output" / "trained"
DENOISERS = ("unet", "transformer")


def wide_flux(width: int) -> Any:
    """The tiny Flux pipeline with a wider transformer (so that matmuls, not Python, dominate a call)."""
    import torch
    from diffusers import FluxTransformer2DModel

    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("flux")
    torch.manual_seed(0)
    heads = max(2, width // 64)
    pipe.transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4,
                                              attention_head_dim=width // heads, num_attention_heads=heads,
                                              joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True,
                                              axes_dims_rope=[4, 4, width // heads - 8])
    return pipe


def fingerprint(spec: dict[str, Any]) -> str:
    """Ten hex digits naming a model and its training settings (any change gives a new cache folder).

    Example:
        >>> fingerprint({"size": "tiny", "steps": 4}) == fingerprint({"steps": 4, "size": "tiny"})
        True
    """
    return hashlib.sha1(json.dumps(spec, sort_keys=True, default=str).encode()).hexdigest()[:10]


def trained_pipeline(name: str, build: Callable[[], Any], spec: dict[str, Any], steps: int, *, seed: int = 0,
                     resolution: int = 32, learning_rate: float = 1e-3, batch_size: int = 4,
                     cache: Path = CACHE) -> tuple[Path, dict[str, Any]]:
    """The folder of ``build()``'s pipeline whose denoiser ``hf-precision train --method full`` fitted for ``steps``
    steps (fp32 layout, on CPU), and what the run reported (losses, seconds); made once, then read from ``cache``.

    ``spec`` describes what ``build`` makes (it enters the fingerprint with the training settings). The untrained
    pipeline is kept as ``info["untrained"]``.
    """
    import torch

    from hf_precision.apps.train.demo import make_demo
    from hf_precision.apps.train.loop import train
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.testing import save_pipeline

    settings = {"steps": steps, "seed": seed, "resolution": resolution, "learning_rate": learning_rate,
                "batch_size": batch_size}
    target = Path(cache) / f"{name}-{fingerprint({'model': spec, **settings})}"
    if (target / "trained.json").is_file():
        info = json.loads((target / "trained.json").read_text())
        return target / "trained", {**info, "untrained": str(target / "untrained"), "reused": True}
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".trained-", dir=target.parent))
    try:
        _, data = make_demo(work / "demo", size=resolution)
        base = save_pipeline(build(), work / "untrained")
        torch.manual_seed(seed)
        start = time.perf_counter()
        result = train(TrainSettings(model=str(base), data=str(data), out=str(work / "run"), method="full", steps=steps,
                                     batch_size=batch_size, learning_rate=learning_rate, resolution=resolution,
                                     device="cpu", layout="cpu-avx2", seed=seed, checkpoint_every=10**9, quiet=True))
        seconds = time.perf_counter() - start
        denoiser = next(d for d in DENOISERS if (work / "run" / d).is_dir())
        shutil.copytree(base, work / "trained", ignore=shutil.ignore_patterns(denoiser))
        shutil.copytree(work / "run" / denoiser, work / "trained" / denoiser)
        losses = [result.losses[k] for k in sorted(result.losses)]
        tenth = max(1, len(losses) // 10)
        info = {"name": name, "model": spec, **settings, "denoiser": denoiser, "seconds": round(seconds, 1),
                "torch_threads": torch.get_num_threads(), "loss_first": losses[0], "loss_last": losses[-1],
                "loss_first_tenth": sum(losses[:tenth]) / tenth, "loss_last_tenth": sum(losses[-tenth:]) / tenth,
                "eval_loss": list(result.eval_loss) if result.eval_loss else None,
                "command": "hf-precision train --method full --layout cpu-avx2 (benchmarks/bench/trained.py)"}
        (work / "trained.json").write_text(json.dumps(info, indent=2))
        shutil.rmtree(work / "run")
        shutil.rmtree(work / "demo")
        os.replace(work, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target / "trained", {**info, "untrained": str(target / "untrained"), "reused": False}


def trained_flux(width: int, steps: int, *, seed: int = 0, resolution: int = 32, learning_rate: float = 1e-3,
                 batch_size: int = 4, cache: Path = CACHE) -> tuple[Path, dict[str, Any]]:
    """:func:`trained_pipeline` of :func:`wide_flux` (the model of ``benchmarks/bench_quantize.py``)."""
    return trained_pipeline(f"flux-w{width}", lambda: wide_flux(width), {"family": "flux", "width": width}, steps,
                            seed=seed, resolution=resolution, learning_rate=learning_rate, batch_size=batch_size,
                            cache=cache)
