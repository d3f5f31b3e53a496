"""Where a half layout's picture departs from fp32's, stage by stage, on the CPU and on CUDA side by side.

    python scripts/gpu_consistency.py [--kinds sdxl,flux] [--devices cpu,cuda]

Why: on the H200 machine (2026-11-26) the demo's tiny SDXL in bf16 and in the T4 layout, and bench_quantize's Flux
samples, differed from their references as much as a picture of another seed does, while the same layouts on the
CPU stay close and the denoiser alone, on captured inputs, matched. Per device and pipeline this prints one JSON
line: the first denoiser call's inputs as each run saw them (the text encoders' and the noise's share), the
denoiser and the VAE decoder each run on the fp32 run's own inputs, the whole picture, the same layout run twice
(repeatability) and the fp32 picture of the next seed (the scale of "another picture"). All as max / mean |diff|.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

HALF_LAYOUT = {"cpu": "cpu-amx", "cuda": None}  # None: the GPU's own rules


def _diff(a, b) -> list[float]:
    a, b = a.float().cpu(), b.float().cpu()
    return [round(float((a - b).abs().max()), 5), round(float((a - b).abs().mean()), 6)]


def _tensors(a, b):
    """(name, tensor of run a, tensor of run b) of a call's float inputs: positional, keyword, one dict level down."""
    import torch

    pairs = [(f"arg{i}", x, y) for i, (x, y) in enumerate(zip(a[0], b[0]))] + [(k, v, b[1][k]) for k, v in a[1].items()]
    for name, x, y in pairs:
        if isinstance(x, dict):
            yield from ((f"{name}.{k}", v, y[k]) for k, v in x.items() if isinstance(v, torch.Tensor) and v.is_floating_point())
        elif isinstance(x, torch.Tensor) and x.is_floating_point():
            yield name, x, y


def _run(pipe, kwargs, seed, denoiser):
    """The picture and the first denoiser call's and first decoder call's inputs."""
    import torch

    seen: dict = {}

    def grab(name):
        def hook(module, args, kw):
            if name not in seen:
                seen[name] = (tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args),
                              {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in kw.items()})
        return hook

    handles = [getattr(pipe, denoiser).register_forward_pre_hook(grab("denoiser"), with_kwargs=True),
               pipe.vae.decoder.register_forward_pre_hook(grab("decoder"), with_kwargs=True)]
    try:
        with torch.no_grad():
            out = pipe(**kwargs, output_type="pt", generator=torch.Generator("cpu").manual_seed(seed))
    finally:
        for h in handles:
            h.remove()
    return out.images, seen


def measure(kind: str, device: str) -> dict:
    import torch

    import hf_precision as hp
    from hf_precision.testing import save_pipeline
    from hf_precision.testing.registry import PIPELINES, make_pipeline

    folder = save_pipeline(make_pipeline(kind), Path(tempfile.mkdtemp()) / kind)
    kwargs = {k: v for k, v in PIPELINES[kind].call_kwargs(num_inference_steps=4).items()
              if k not in ("output_type", "generator")}
    ref = hp.load_pipeline(folder, device, layout="cpu-avx2")
    half = hp.load_pipeline(folder, device, layout=HALF_LAYOUT[device])
    for p in (ref, half):
        p.set_progress_bar_config(disable=True)
    denoiser = "unet" if hasattr(ref, "unet") and ref.unet is not None else "transformer"
    want, seen_ref = _run(ref, kwargs, 0, denoiser)
    got, seen_half = _run(half, kwargs, 0, denoiser)
    again, _ = _run(half, kwargs, 0, denoiser)
    other, _ = _run(ref, kwargs, 1, denoiser)
    inputs = {k: _diff(v, b) for k, v, b in _tensors(seen_ref["denoiser"], seen_half["denoiser"])}
    args, kw = seen_ref["denoiser"]
    with torch.no_grad():
        d_ref = getattr(ref, denoiser)(*args, **kw)[0]
        d_half = getattr(half, denoiser)(*args, **kw)[0]
        z = seen_ref["decoder"][0][0]
        v_ref, v_half = ref.vae.decoder(z), half.vae.decoder(z)
    recipe = hp.applied(half).recipe
    return {"kind": kind, "device": str(device), "half_layout": recipe.device.label(),
            "dtypes": {p.name: p.compute for p in recipe.plans if hasattr(half, p.name)},
            "first_denoiser_inputs": inputs, "denoiser_on_same_inputs": _diff(d_ref, d_half),
            "decoder_on_same_latents": _diff(v_ref, v_half), "picture": _diff(want, got),
            "half_twice": _diff(got, again), "fp32_next_seed": _diff(want, other)}


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--kinds", default="sdxl,flux")
    p.add_argument("--devices", default="cpu,cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    warnings.simplefilter("ignore")
    for device in args.devices.split(","):
        for kind in args.kinds.split(","):
            print(json.dumps(measure(kind, device)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
