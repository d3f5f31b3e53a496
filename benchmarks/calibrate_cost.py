"""Extra time per denoising step of calibrate's recording hooks: a float32 SDXL run with and without them.

Usage: python benchmarks/calibrate_cost.py [tiny|mid] [pairs]

CPU, one torch thread, plain and recording runs interleaved, median of ``pairs``; process CPU time, which a machine
shared with other jobs disturbs far less than wall time. The numbers are in docs/calibrate.md ("Cost").
"""

from __future__ import annotations

import sys
import time
import warnings

import torch

from hf_precision.diagnose.calibration.record import Recorder
from hf_precision.testing.pipelines import example_call_kwargs, make_sdxl

STEPS = 4


def main(size: str = "tiny", pairs: int = 5) -> None:
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    pipe = make_sdxl(size)
    kwargs = {**example_call_kwargs("sdxl", size=size), "num_inference_steps": STEPS}
    comps = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}

    def timed(record: bool) -> float:
        recorder = Recorder(comps, 65504.0, lambda component: "run") if record else None
        start = time.process_time()
        with torch.no_grad():
            pipe(**kwargs, generator=torch.Generator().manual_seed(0))
        took = time.process_time() - start
        if recorder is not None:
            recorder.remove()
        return took

    timed(False), timed(True)  # warm-up
    plain, recording = [], []
    for _ in range(pairs):
        plain.append(timed(False))
        recording.append(timed(True))
    p, r = sorted(plain)[pairs // 2], sorted(recording)[pairs // 2]
    print(f"{size} SDXL, {STEPS} steps, median CPU time: plain {p:.3f}s, recording {r:.3f}s: "
          f"+{(r - p) / STEPS * 1000:.0f} ms per step (+{r / p - 1:.0%})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "tiny", int(sys.argv[2]) if len(sys.argv) > 2 else 5)
