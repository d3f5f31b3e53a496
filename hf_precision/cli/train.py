"""``hf-precision train`` and ``scripts/train.py``: arguments and dispatch; the work is in
:mod:`hf_precision.apps.train`."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence

from ..errors import RecipeError
from .common import add_base_arg, add_recipe_args, command, overrides_from, script_main, script_parser

__all__ = ["add_arguments", "build_parser", "main", "run"]

USAGE = """examples:
  %(prog)s --demo --out demo-lora                    # offline: tiny model, generated data (< 1 min on 2 cores)
  %(prog)s --model ./stable-diffusion-xl-base-1.0 --data ./photos --out ./my-lora --lora-rank 16 --steps 2000
  %(prog)s --model ./FLUX.1-dev --data ./photos --out ./flux-lora --plan --device t4 --max-memory 16GB
  %(prog)s --model ./Wan2.1-T2V-1.3B-Diffusers --data ./clips --out ./wan-lora --frames 17
  %(prog)s --model ./stable-diffusion-v1-5 --data ./cat --method embedding --embedding "<my-cat>" --init-token cat --out ./ti
  %(prog)s --model ./sd15 --data ./photos --out ./my-lora --resume latest   # continue a run (same loss curve)
  accelerate launch --num_processes 2 scripts/train.py --model ... --data ... --out ...   # data parallel
  torchrun --nproc_per_node 8 -m hf_precision.cli train --model ... --data ... --out ... --shard   # FSDP2

data: a folder of images (clips for video models) with a caption file beside each (cat.png + cat.txt), or a
metadata.jsonl ({"file_name": "cat.png", "text": "a photo of a cat"} per line). Bad input (no images, missing or
empty captions, corrupt or too small images, short clips, an existing --out, rank 0) exits with code 2 before the
model loads. Ctrl-C saves a checkpoint and exits with 130; --resume latest continues it.
"""


@command("train", "train a LoRA, textual-inversion embedding or full fine-tune with the recipe's precision rules",
         "hf_precision.cli.train:run", USAGE)
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``hf-precision train`` and ``scripts/train.py`` (one definition for both)."""
    p.add_argument("--model", default=None, help="diffusers model folder or Hub id, or a single-file checkpoint with --base")
    add_base_arg(p, "--model")
    p.add_argument("--data", default=None, help="folder of images/clips with caption .txt files, or a metadata.jsonl")
    p.add_argument("--out", default=None, help="output folder (must not exist, except with --resume)")
    p.add_argument("--demo", action="store_true", help="train a tiny random model on generated shapes (offline)")
    from ..training.methods import program_methods

    p.add_argument("--method", choices=program_methods(), default=None,
                   help="lora (default), full fine-tune of the denoiser, embedding (textual inversion), or another "
                        "registered method (hf_precision.training.methods)")
    p.add_argument("--lora-rank", type=int, default=16, help="LoRA rank (default 16)")
    p.add_argument("--train-text-encoder", action="store_true", help="also put LoRA on the text encoders")
    p.add_argument("--embedding", default=None, metavar="TOKEN", help='textual inversion: the new token, e.g. "<my-cat>"')
    p.add_argument("--init-token", default=None, help="textual inversion: the existing token it starts from")
    p.add_argument("--steps", type=int, default=1000, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=1, help="per process")
    p.add_argument("--learning-rate", "--lr", type=float, default=1e-4, help="peak learning rate")
    p.add_argument("--lr-scheduler", default="constant", help="diffusers get_scheduler name (constant, cosine, ...)")
    p.add_argument("--warmup-steps", type=int, default=0, help="learning-rate warmup steps")
    p.add_argument("--resolution", type=int, default=None,
                   help="training area is resolution^2 (aspect-ratio buckets around it); a multiple of the VAE factor "
                        "x patch size. Default: the VAE's sample_size")
    p.add_argument("--frames", type=int, default=None, help="video models: frames per clip (Wan/CogVideoX 4k+1, LTX 8k+1); required for them, except the one count a model is built for (ChronoEdit: 5)")
    p.add_argument("--caption-ext", default=".txt", help="suffix of the caption files (default .txt)")
    p.add_argument("--caption-column", default="text", help="caption key in metadata.jsonl (default text)")
    p.add_argument("--caption", default=None, help="one caption for every file (no caption files needed)")
    p.add_argument("--reference-column", default="reference",
                   help="edit models (Flux Kontext, Qwen-Image Edit): metadata.jsonl key of each target's reference "
                        "image, the picture the edit starts from (the caption is the instruction)")
    p.add_argument("--reference-dir", default=None, metavar="FOLDER",
                   help="edit models: a folder of reference images named as the targets in --data (ai-toolkit's "
                        "control_path); default: none, or the metadata.jsonl column")
    p.add_argument("--expert", choices=("high", "low", "both"), default=None,
                   help="two-expert models (Wan 2.2 A14B: transformer for high noise, transformer_2 for low): train "
                        "one, each on the timesteps it owns, or both (default, as ai-toolkit's): one run each, into "
                        "OUT/high_noise and OUT/low_noise; a low-noise LoRA loads with pipe.load_lora_weights(OUT, "
                        "load_into_transformer_2=True)")
    p.add_argument("--master", choices=("fp32", "bf16-sr"), default="fp32",
                   help="trainable weights: fp32 masters (default) or pure bf16 with stochastic rounding")
    p.add_argument("--seed", type=int, default=0, help="random seed (data order, noise, LoRA init)")
    p.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints (default 500)")
    p.add_argument("--keep-checkpoints", type=int, default=3, help="checkpoints kept in --out (older ones are deleted)")
    p.add_argument("--resume", default=None, metavar="latest|PATH", help="continue from a checkpoint of --out")
    p.add_argument("--validation-prompt", default=None, help="prompt of the validation images (default: none are made)")
    p.add_argument("--validation-every", type=int, default=None,
                   help="steps between validation images (default: only before and after training)")
    p.add_argument("--validation-inference-steps", type=int, default=20, help="denoising steps of a validation image")
    p.add_argument("--no-cache", dest="cache", action="store_false",
                   help="encode every batch (default: cache latents and text embeddings on disk, keyed by the plan)")
    p.add_argument("--on-nan", choices=("stop", "skip"), default="stop",
                   help="a non-finite loss: stop (default) or skip the batch; both name the step and component")
    p.add_argument("--save-dtype", choices=("float16", "bfloat16", "float32"), default="float16",
                   help="dtype of the saved LoRA (default float16, as LoRAs are exchanged)")
    p.add_argument("--gradient-checkpointing", action="store_true", help="recompute activations in the backward pass: less memory, slower steps")
    p.add_argument("--shard", action="store_true",
                   help="under torchrun/accelerate launch: shard what trains over the processes (FSDP2), each block in "
                        "the recipe's dtypes; frozen parts sharded where that holds less, else replicated (the plan says "
                        "which and why). --plan --processes N plans it per rank")
    p.add_argument("--plan", action="store_true",
                   help="print the predicted peak memory (weights, gradients, optimizer, activations) and the settings "
                        "chosen for --max-memory, from the configs on the meta device; no weights, no training")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget for --plan, e.g. 16GB: the settings that fit it are chosen (default: none, "
                        "the plan of the given settings)")
    p.add_argument("--processes", type=int, default=1, metavar="N",
                   help="with --plan: plan each rank of N processes (data parallel, or sharded with --shard)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_recipe_args(p, device_help="device to run on (cpu, cuda, mps; under accelerate launch each process's own), or "
                                   "with --plan a preset to plan for (t4, a100, ...). Default: the best present device")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``scripts/train.py``: ``hf-precision train``'s arguments and examples."""
    return script_parser("train", prog, "Train a LoRA, an embedding or a full fine-tune in the dtypes the recipe "
                                        "picks for the device.")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``scripts/train.py``: bad input prints one message and returns 2."""
    return script_main(build_parser(prog), run, argv)


def _settings(args: argparse.Namespace, model: str, data: str):
    import dataclasses

    from ..apps.train.settings import TrainSettings, chosen_method

    # the flags are named as the settings' fields (--lora-rank = lora_rank); four are worked out here
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainSettings) if hasattr(args, f.name)}
    return TrainSettings(**{**given, "model": model, "data": data, "method": chosen_method(args.method, args),
                            "overrides": overrides_from(args)})


def run(args: argparse.Namespace) -> int:
    """Run ``hf-precision train`` from parsed arguments."""
    if args.plan and args.model and args.base:
        from ..apps.train.settings import configs_source

        # a single file has its base's architecture: the plan is the base's, read from its configs
        args = argparse.Namespace(**{**vars(args), "model": configs_source(args.model, args.base)})
    if args.plan and (args.processes != 1 or args.shard):
        from .train_plan import rank_plan_command

        return rank_plan_command(args, overrides_from(args) or None)
    if args.plan:
        from .train_plan import plan_command

        return plan_command(args, overrides_from(args) or None)
    if args.out is None:
        raise RecipeError("--out: name the output folder (the LoRA, checkpoints and validation images go there)")
    if args.demo:
        return _run_demo(args)
    if not args.model or not args.data:
        raise RecipeError("--model and --data: both are needed (or --demo for an offline run on a tiny model)")
    from ..apps.train.loop import NonFiniteLoss, train

    try:
        from ..apps.train.experts import expert_runs

        for settings in expert_runs(_settings(args, args.model, args.data), say=print):  # two for both experts of Wan 2.2
            code = _report(train(settings))
            if code:
                return code
    except NonFiniteLoss as err:  # not bad input: the run itself went wrong (exit 1, not 2)
        print(f"hf-precision train: stopped: {err}", file=sys.stderr)
        return 1
    return code


def _run_demo(args: argparse.Namespace) -> int:
    from ..apps.train.demo import DEMO_SETTINGS, make_demo
    from ..apps.train.loop import train
    from ..apps.train.settings import check_out_folder

    check_out_folder(args.out, args.resume)
    given = {a for a in vars(args) if getattr(args, a) != build_parser().get_default(a)}
    for key, value in DEMO_SETTINGS.items():  # the demo's own settings, where the command line gives none
        if key not in given:
            setattr(args, key, value)
    if args.device is None:
        args.device = "cpu"
    import torch

    # The tiny model's ops are too small to split over threads: on a busy 2-core machine one thread is ~8x faster.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with tempfile.TemporaryDirectory(prefix="hf_precision_train_demo_") as work:
            model, data = make_demo(work)
            result = train(_settings(args, str(model), str(data)))
    finally:
        torch.set_num_threads(threads)
    if result.eval_loss and result.main_process:
        before, after = result.eval_loss
        print(f"evaluation loss on a fixed batch (fixed noise and timesteps): {before:.4f} before, {after:.4f} after "
              f"({'falls' if after < before else 'does not fall'})")
    return _report(result)


def _report(result) -> int:
    if not result.main_process:  # under accelerate launch: the main process reports the run once
        return 130 if result.exit_code == 130 else 0
    if result.exit_code == 130:
        print(f"interrupted at step {result.step}: checkpoint saved in {result.out}/checkpoints; continue with the "
              f"same command and --resume latest", file=sys.stderr)
        return 130
    losses = result.losses
    if losses:
        first, last = losses[min(losses)], losses[max(losses)]
        print(f"trained {result.step} step{'s' * (result.step != 1)}: loss {first:.4f} (step {min(losses)}) -> {last:.4f} (step {max(losses)}); "
              f"{result.skipped} skipped step(s)")
    if result.saved is not None:
        from ..training.methods import method_of

        how = method_of(result.method).reader(result.saved)
        if result.low_noise and how.endswith("')"):  # diffusers' Wan loader puts a transformer LoRA into transformer_2
            how = how[:-1] + ", load_into_transformer_2=True)"
        print(f"wrote {result.saved} ({how} reads it; training.json beside it)")
    return 0
