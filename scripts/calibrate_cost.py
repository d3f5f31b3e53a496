"""Extra time per denoising step of calibrate's recording hooks: a float32 SDXL run with and without them.

Usage: python scripts/calibrate_cost.py [tiny|mid] [pairs]   (CPU, one thread, plain and recording runs interleaved)
Numbers from this script are in docs/calibrate.md ("Cost").
"""
import sys, time, torch, warnings
warnings.simplefilter("ignore")
torch.set_num_threads(1)
from hf_precision.diagnose.calibrator import Recorder
from hf_precision.testing.pipelines import make_sdxl, example_call_kwargs
size = sys.argv[1] if len(sys.argv) > 1 else "tiny"
pipe = make_sdxl(size)
kw = {**example_call_kwargs("sdxl", size=size), "num_inference_steps": 4}
comps = {n: m for n, m in pipe.components.items() if isinstance(m, torch.nn.Module)}
def timed(record):
    rec = Recorder(comps, 65504.0, lambda c: "run") if record else None
    t = time.perf_counter()
    with torch.no_grad():
        pipe(**kw, generator=torch.Generator().manual_seed(0))
    dt = time.perf_counter() - t
    if rec: rec.remove()
    return dt
timed(False); timed(True)
plain, rec = [], []
for _ in range(int(sys.argv[2]) if len(sys.argv) > 2 else 5):
    plain.append(timed(False)); rec.append(timed(True))
p, r = sorted(plain)[len(plain)//2], sorted(rec)[len(rec)//2]
print(f"{size} SDXL, 4 steps, median: plain {p:.3f}s, recording {r:.3f}s: +{(r-p)/4*1000:.0f} ms per step (+{r/p-1:.0%})")
