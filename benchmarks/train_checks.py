#!/usr/bin/env python
"""Checks of ``hf-precision train`` on a GPU, and the comparison run against diffusers' own
``examples/text_to_image/train_text_to_image_lora.py`` (fetch it from the diffusers repository at the version in
use; it needs ``datasets`` and ``torchvision``). Prints one JSON line per section and writes OUT/results.json.

    python benchmarks/train_checks.py --out checks/ --device cuda --diffusers-script ./train_text_to_image_lora.py
    python benchmarks/train_checks.py --out checks/ --device cuda --sections demo,resume,plan_vs_measured

Sections: demo (the demo on the device), resume (stop after 2 of 6 steps, resume, compare losses; native and T4
layouts), plan_vs_measured (predicted activations + gradients of a training step against
torch.cuda.max_memory_allocated), comparison (diffusers' script under --mixed_precision no/fp16 against
hf-precision train under an fp32 and the T4 layout: exit code, wall time, peak memory, mean loss of the last 5 steps).
"""
import argparse, json, os, subprocess, sys, tempfile, time, traceback
from pathlib import Path

import numpy as np
import torch

_p = argparse.ArgumentParser()
_p.add_argument("--out", required=True)
_p.add_argument("--device", default="cuda")
_p.add_argument("--diffusers-script", default=None)
_p.add_argument("--sections", default="demo,resume,plan_vs_measured,comparison")
ARGS = _p.parse_args()
OUT = Path(ARGS.out)
OUT.mkdir(parents=True, exist_ok=True)
DEV = ARGS.device
W = Path(tempfile.mkdtemp(prefix="train_checks_"))
results = {}


def section(name, fn):
    t = time.time()
    try:
        results[name] = fn()
    except Exception as e:
        traceback.print_exc()
        results[name] = {"error": f"{type(e).__name__}: {e}"[:800]}
    print(f"== {name} ({time.time() - t:.1f}s): {json.dumps(results[name], default=str)[:1500]}", flush=True)
    (OUT / "results.json").write_text(json.dumps(results, indent=1, default=str))


def demo():
    from hf_precision.cli import main
    code = main(["train", "--demo", "--out", str(W / "demo"), "--device", DEV, "--quiet"])
    rec = json.loads((W / "demo" / "training.json").read_text())
    return {"exit": code, "first": rec["first_loss"], "final": rec["final_loss"], "plan": rec["plan"][:600]}


def resume():
    from hf_precision.apps.train.demo import make_demo
    from hf_precision.apps.train.loop import train
    from hf_precision.apps.train.settings import TrainSettings
    model, data = make_demo(W / "rdemo")
    out = {}
    for layout in (None, "t4"):
        def s(o, **kw):
            return TrainSettings(model=str(model), data=str(data), out=str(o), device=DEV, layout=layout, lora_rank=4,
                                 steps=6, batch_size=2, learning_rate=5e-3, resolution=32, checkpoint_every=10,
                                 quiet=True, **kw)
        tag = layout or "native"
        whole = train(s(W / f"whole-{tag}"))
        cut = train(s(W / f"cut-{tag}", stop_after=2))
        rest = train(s(W / f"cut-{tag}", resume="latest"))
        diffs = [abs(whole.losses[k] - rest.losses[k]) for k in whole.losses]
        out[tag] = {"equal": rest.losses == whole.losses, "max_abs_diff": max(diffs), "cut_exit": cut.exit_code,
                    "losses": whole.losses}
    return out


def mid_model():
    from hf_precision.testing.pipelines import make_sd15, save_pipeline
    folder = W / "sd15-mid"
    if not folder.exists():
        save_pipeline(make_sd15(size={"unet": {"block_out_channels": [32, 64], "layers_per_block": 1,
                                                "norm_num_groups": 8}}), folder)
    return folder


def plan_vs_measured():
    import hf_precision as hp
    from hf_precision.apps.train.plan import Options, predict_training
    from hf_precision.training import prepare_training
    if not torch.cuda.is_available():
        return {"skipped": "needs CUDA (on CPU: tests/test_train_plan.py measures the RSS)"}
    folder = mid_model()
    out = {}
    for layout, batch, side in ((None, 4, 64), ("t4", 4, 64), (None, 8, 128)):
        pred = predict_training(str(folder), layout or DEV, rank=4, resolution=side * 2, options=Options(batch, False, True))
        pipe = hp.load_pipeline(str(folder), DEV, layout=layout)
        tp = prepare_training(pipe, device=DEV, layout=layout, train={"unet": "lora"}, rank=4)
        opt = torch.optim.AdamW(tp.parameters(), lr=1e-4)
        data = {"latents": torch.randn(batch, 4, side, side, device=DEV), **tp.encode_prompt(["a cat"] * batch)}
        def step():
            loss = tp.loss(data); tp.backward(loss); tp.step(opt)
        step(); opt.zero_grad(set_to_none=True)
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step(); torch.cuda.synchronize()
        measured = torch.cuda.max_memory_allocated() - base
        predicted = pred.activations + pred.grads
        out[f"{layout or 'native'}-b{batch}-{side}"] = {"compute": str(tp.compute_dtype), "predicted_MiB": predicted / 2**20,
                                                         "measured_MiB": measured / 2**20,
                                                         "ratio": predicted / max(measured, 1)}
        del tp, pipe, opt, data
        torch.cuda.empty_cache()
    return out


WRAP = ("import sys, time, runpy, atexit, torch\n"
        "t0 = time.time()\n"
        "def done():\n"
        "    peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0\n"
        "    print('PEAK', peak, 'WALL', time.time() - t0, flush=True)\n"
        "atexit.register(done)\n"
        "target = sys.argv[1]; sys.argv = sys.argv[1:]\n"
        "if target == 'hfp':\n"
        "    sys.argv[0] = 'hf-precision'\n"
        "    from hf_precision.cli import main\n"
        "    code = main(sys.argv[1:])\n"
        "    done(); sys.exit(code)\n"
        "runpy.run_path(target, run_name='__main__')\n")


def comparison():
    from PIL import Image
    from hf_precision.apps.train.demo import COLORS, SHAPES, draw_shape
    folder = mid_model()
    data = W / "cmpdata"
    data.mkdir(exist_ok=True)
    rows = []
    for i, (name, rgb) in enumerate(COLORS.items()):
        for j, shape in enumerate(SHAPES):
            draw_shape(shape, rgb, 128, seed=i * 2 + j).save(data / f"{name}-{shape}.png")
            rows.append({"file_name": f"{name}-{shape}.png", "text": f"a {name} {shape}"})
    (data / "metadata.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    steps, out = 30, {}
    if not ARGS.diffusers_script:
        return {"skipped": "pass --diffusers-script PATH (diffusers examples/text_to_image/train_text_to_image_lora.py)"}
    script = Path(ARGS.diffusers_script)
    runs = {
        "diffusers fp32": [str(script), "--mixed_precision", "no"],
        "diffusers fp16": [str(script), "--mixed_precision", "fp16"],
        "hf-precision fp32 (layout cpu-avx2)": ["hfp", "train", "--layout", "cpu-avx2"],
        "hf-precision t4 (fp16 + GradScaler)": ["hfp", "train", "--layout", "t4"],
    }
    for name, head in runs.items():
        o = W / ("cmp-" + name.split()[0] + "-" + name.split()[1])
        if head[0] == "hfp":
            args = [*head, "--model", str(folder), "--data", str(data), "--out", str(o), "--resolution", "128",
                    "--batch-size", "4", "--steps", str(steps), "--learning-rate", "1e-3", "--lora-rank", "4",
                    "--device", DEV, "--quiet", "--checkpoint-every", "1000", "--no-cache"]
        else:
            args = [*head, "--pretrained_model_name_or_path", str(folder), "--train_data_dir", str(data),
                    "--resolution", "128", "--center_crop", "--train_batch_size", "4", "--max_train_steps", str(steps),
                    "--learning_rate", "1e-3", "--rank", "4", "--lr_scheduler", "constant", "--seed", "0",
                    "--output_dir", str(o), "--dataloader_num_workers", "0", "--report_to", "tensorboard"]
        t = time.time()
        p = subprocess.run([sys.executable, "-c", WRAP, *args], capture_output=True, text=True, timeout=240,
                           env={**os.environ, "HF_HUB_OFFLINE": "1"})
        wall = time.time() - t
        (OUT / (o.name + ".log")).write_text(p.stdout[-20000:] + "\n---\n" + p.stderr[-20000:])
        peak = [l for l in p.stdout.splitlines() if l.startswith("PEAK")]
        losses = []
        if head[0] == "hfp" and (o / "train_log.jsonl").exists():
            losses = [json.loads(l)["loss"] for l in (o / "train_log.jsonl").read_text().splitlines()]
        else:
            try:
                from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
                ev = next((o / "logs").rglob("events.out.tfevents*"))
                acc = EventAccumulator(str(ev.parent)); acc.Reload()
                losses = [e.value for e in acc.Scalars("train_loss")]
            except Exception as e:
                losses = [f"no loss: {e}"]
        rate = [l for l in p.stderr.replace("\r", "\n").splitlines() if "it/s" in l or "s/it" in l or "step/s" in l]
        out[name] = {"rc": p.returncode, "wall_s": round(wall, 1), "peak": peak[-1] if peak else None,
                     "mean_loss_last5": (float(np.mean([x for x in losses[-5:] if isinstance(x, float)])) if losses else None),
                     "n_losses": len(losses), "rate": rate[-1][-90:] if rate else None,
                     "tail": "" if p.returncode == 0 else p.stderr[-600:]}
    return out


section("versions", lambda: {"torch": torch.__version__, "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None})
for name in ARGS.sections.split(","):
    section(name, globals()[name])
