"""A small model trained by ``hf-precision train`` for the fidelity rows of the benchmarks.

Random weights are chaotic: a difference of one rounding grows over the blocks and the sampling steps, so an output
difference on them measures that chaos as much as the precision of a layout. Here the Flux transformer of
``scripts/bench_quantize.py`` is fitted first, as a full fine-tune in the fp32 layout with a fixed seed, to the
generated coloured shapes of the ``--demo`` (``hf_precision.apps.train.demo``), and then measured. The result is
cached under ``bench_output/trained/`` (gitignored), keyed by width, steps, resolution and seed; a half-written
folder is never read (written beside it and renamed into place).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / "bench_output" / "trained"


def wide_flux(width: int) -> Any:
    """The tiny Flux pipeline with a wider transformer (so that matmuls, not Python, dominate a call)."""
    import torch
    from diffusers import FluxTransformer2DModel

    from hf_precision.testing.families_dit import make_flux

    pipe = make_flux()
    torch.manual_seed(0)
    heads = max(2, width // 64)
    pipe.transformer = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=4,
                                              attention_head_dim=width // heads, num_attention_heads=heads,
                                              joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True,
                                              axes_dims_rope=[4, 4, width // heads - 8])
    return pipe


def trained_flux(width: int, steps: int, *, seed: int = 0, resolution: int = 32, learning_rate: float = 1e-3,
                 batch_size: int = 4, cache: Path = CACHE) -> tuple[Path, dict[str, Any]]:
    """The folder of a Flux pipeline whose transformer ``hf-precision train --method full`` fitted for ``steps``
    steps (fp32 layout, on CPU), and what the run reported (losses, seconds); made once, then read from ``cache``."""
    import torch

    from hf_precision.apps.train.demo import make_demo
    from hf_precision.apps.train.loop import train
    from hf_precision.apps.train.settings import TrainSettings
    from hf_precision.testing import save_pipeline

    target = Path(cache) / f"flux-w{width}-steps{steps}-r{resolution}-seed{seed}"
    if (target / "trained.json").is_file():
        return target, json.loads((target / "trained.json").read_text())
    target.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".trained-", dir=target.parent))
    try:
        _, data = make_demo(work, size=resolution)
        base = save_pipeline(wide_flux(width), work / "base")
        torch.manual_seed(seed)
        start = time.perf_counter()
        result = train(TrainSettings(model=str(base), data=str(data), out=str(work / "run"), method="full", steps=steps,
                                     batch_size=batch_size, learning_rate=learning_rate, resolution=resolution,
                                     device="cpu", layout="cpu", seed=seed, checkpoint_every=10**9, quiet=True))
        seconds = time.perf_counter() - start
        shutil.rmtree(base / "transformer")
        shutil.copytree(work / "run" / "transformer", base / "transformer")
        losses = [result.losses[k] for k in sorted(result.losses)]
        tenth = max(1, len(losses) // 10)
        info = {"width": width, "steps": steps, "resolution": resolution, "seed": seed, "learning_rate": learning_rate,
                "batch_size": batch_size, "seconds": round(seconds, 1), "torch_threads": torch.get_num_threads(),
                "loss_first_tenth": sum(losses[:tenth]) / tenth, "loss_last_tenth": sum(losses[-tenth:]) / tenth,
                "command": "hf-precision train --method full --layout cpu (scripts/bench/trained.py)"}
        (base / "trained.json").write_text(json.dumps(info, indent=2))
        os.replace(base, target)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target, info
