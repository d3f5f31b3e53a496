#!/usr/bin/env python
"""One real-size LoRA training step on a GPU: the SD 1.5 UNet built from its shipped config (random weights), LoRA
rank 16, through ``hf_precision.prepare_training`` under a bf16 layout and a T4 layout (fp16 + GradScaler); prints
ms/step, peak memory, the trainable dtypes and the frozen storage dtype, paired in one run.

    python benchmarks/train_step_real.py --device cuda --steps 6
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import hf_precision as hp  # noqa: E402
from hf_precision.training import example_batch  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--layouts", default="h100,t4")
    args = parser.parse_args()
    from diffusers import UNet2DConditionModel

    config = json.loads((Path(hp.__file__).parent / "model_configs/stable-diffusion-v1-5/unet/config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("_")}
    for layout in args.layouts.split(","):
        torch.manual_seed(0)
        unet = UNet2DConditionModel(**config)
        tp = hp.prepare_training({"unet": unet}, device=args.device, layout=layout, train={"unet": "lora"}, rank=16)
        opt = torch.optim.AdamW(tp.parameters(), lr=1e-4)
        batch = {k: v.to(args.device) for k, v in example_batch(unet, 2, side=64, tokens=77).items()}
        torch.cuda.reset_peak_memory_stats()
        times, losses = [], []
        for _ in range(args.steps):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            loss = tp.loss(batch)
            tp.backward(loss)
            tp.step(opt)
            opt.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            losses.append(loss.item())
        trainable = {str(p.dtype) for p in tp.parameters()}
        frozen = {str(p.dtype) for p in unet.parameters() if not p.requires_grad}
        print(json.dumps({"layout": layout, "compute": str(tp.compute_dtype), "scaler": tp.scaler is not None,
                          "ms_per_step_median_after_first": round(1000 * sorted(times[1:])[len(times[1:]) // 2], 1),
                          "peak_MiB": round(torch.cuda.max_memory_allocated() / 2**20), "losses": [round(x, 4) for x in losses],
                          "trainable": sorted(trainable), "n_trainable": sum(p.numel() for p in tp.parameters()),
                          "frozen_storage": sorted(frozen), "skipped": tp.skipped_steps}))
        del tp, unet, opt
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
