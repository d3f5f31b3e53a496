"""``hf-precision video`` and ``scripts/generate_video.py``: arguments, their validation, and what is printed; the work
is :mod:`hf_precision.apps.video`'s (:func:`hf_precision.apps.video.run.generate_batch`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..apps.video.spec import model_spec
from ..apps.video.io import DEMO_DEFAULTS, FORMATS, Job, check_out, plan_outputs, read_prompts
from ..apps.video.load import OFFLOAD, MemorySettings
from ..errors import RecipeError
from ..units import format_bytes, parse_size
from .common import add_base_arg, add_recipe_args, command, overrides_from, script_parser

__all__ = ["add_arguments", "build_parser", "main", "run"]


USAGE = """examples:
  %(prog)s --demo --out demo.mp4                      # offline: a tiny random SVD built here
  %(prog)s --model ./Wan2.1-T2V-1.3B-Diffusers --prompt "a cat surfing" --out cat.mp4
  %(prog)s --model ./LTX-Video --prompts prompts.txt --out videos/ --skip-existing
  %(prog)s --model ./CogVideoX-5b-I2V --image photos/ --prompt "slow pan" --out videos/
  %(prog)s --model ./Wan2.1-T2V-14B-Diffusers --prompt "a cat" --out cat.mp4 --plan --device t4 --max-memory 16GB
  %(prog)s --model ./stable-video-diffusion-img2vid-xt --image cat.png --out cat.mp4
  %(prog)s --image cat.png --out cat.gif --frames 14 --decode-chunk-size 2 --offload model
  %(prog)s --image photos/ --out videos/ --format gif  # one videos/<stem>.gif per image
  accelerate launch --multi_gpu --num_processes 2 scripts/generate_video.py --image photos/ --out videos/
      (no GPU: N CPU processes over gloo; add --device cpu to stay on CPU on a GPU machine. accelerate 1.15's
       `launch --cpu` starts a single process: see docs/video.md)

modes (the pipeline class comes from the model folder's model_index.json):
  text-to-video (Wan, LTX-Video, CogVideoX, HunyuanVideo): --prompt TEXT or --prompts FILE (one video per line)
  image-to-video (SVD, Wan I2V, LTX I2V, CogVideoX I2V): --image FILE or FOLDER, plus --prompt where the pipeline
  takes one (--prompts FILE: the i-th line goes with the i-th image in name order)

outputs:
  --image FILE / one --prompt: --out x.mp4 (H.264, yuv420p), --out x.gif, or --out DIR (no suffix): DIR/frame_000.png
  --image FOLDER: --out is a folder; each image IMG.* gives OUT/IMG.mp4, OUT/IMG.gif or OUT/IMG/frame_000.png
  --prompts FILE: --out is a folder; line i gives OUT/00i-<first words>.mp4 (--format, default mp4)
  An output that exists is an error unless --skip-existing (keep it) or --overwrite (replace it). A failed clip is
  reported and the batch goes on (exit code 1 at the end). Bad input (missing or unreadable image, a model that is
  not a video pipeline, impossible sizes or frame counts) exits with code 2 before the model is loaded.
"""


@command("video", "text/image-to-video for Wan, LTX, CogVideoX, HunyuanVideo, SVD: mp4, gif, PNG (try --demo)",
         "hf_precision.cli.video:run", USAGE)
def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``scripts/generate_video.py`` and ``hf-precision video`` (one definition for both)."""
    p.add_argument("--model", default=None,
                   help="local diffusers video model folder or Hub id: Wan, LTX-Video, CogVideoX, HunyuanVideo, SVD "
                        "(default: svd = stabilityai/stable-video-diffusion-img2vid-xt); or a single file with --base")
    add_base_arg(p, "--model")
    p.add_argument("--prompt", default=None, help="text prompt (text-to-video; or with --image where the pipeline takes both)")
    p.add_argument("--prompts", default=None, metavar="FILE", help="a text file with one prompt per line: one video each")
    p.add_argument("--negative-prompt", default=None, help="negative prompt, where the pipeline takes one")
    p.add_argument("--max-sequence-length", type=int, default=None,
                   help="text tokens the prompt is padded to (default: the pipeline's; Wan 512, LTX 128)")
    p.add_argument("--guidance-scale", type=float, default=None, help="classifier-free guidance (default: the pipeline's)")
    p.add_argument("--image", default=None, help="input image file, or a folder of images (png, jpg, webp, bmp, tif)")
    p.add_argument("--out", default=None,
                   help="output: FILE.mp4, FILE.gif or a folder of PNG frames for one image; a folder for a folder of "
                        "images (see 'outputs' below). Default with --demo: demo.mp4")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="output format for a folder of images (default mp4); for one image it must agree with --out")
    p.add_argument("--height", type=int, default=None,
                   help="frame height in pixels (default per family: Wan 480, LTX 480, CogVideoX 480, HunyuanVideo "
                        "320, SVD 576); a multiple of the VAE factor x patch size (16 for Wan, 32 for LTX)")
    p.add_argument("--width", type=int, default=None, help="frame width in pixels (default per family: 832, 704, 720, 512, 1024)")
    p.add_argument("--frames", type=int, default=None,
                   help="number of frames (default per family: Wan 81, LTX 161, CogVideoX 49, HunyuanVideo 61, SVD the "
                        "UNet's num_frames); 3D VAEs need t*k+1 (Wan/CogVideoX/Hunyuan 4k+1, LTX 8k+1)")
    p.add_argument("--steps", type=int, default=None, help="denoising steps (default per family: 50, 30 HunyuanVideo, 25 SVD)")
    p.add_argument("--fps", type=int, default=7, help="frames per second: the video's rate and SVD's fps conditioning (default 7)")
    p.add_argument("--motion-bucket-id", type=int, default=127, help="more motion with higher values (default 127)")
    p.add_argument("--noise-aug-strength", type=float, default=0.02,
                   help="noise added to the conditioning image; more gives more motion, less likeness (default 0.02)")
    p.add_argument("--decode-chunk-size", type=int, default=None,
                   help="frames decoded at once (default 8); 1-2 on 8 GB GPUs: the decode peak grows with it")
    p.add_argument("--offload", choices=OFFLOAD, default=None,
                   help="model: one component at a time on the accelerator (enable_model_cpu_offload); group: layers "
                        "streamed ahead of use (enable_group_offload, CUDA streams); sequential: one layer at a time "
                        "(slowest, least memory; accelerators only). Default: none, or what --max-memory chooses")
    p.add_argument("--vae-tiling", action="store_true", help="decode in spatial tiles (vae.enable_tiling)")
    p.add_argument("--vae-slicing", action="store_true", help="decode one video of the batch at a time (vae.enable_slicing)")
    p.add_argument("--plan", action="store_true",
                   help="print the predicted peak memory per phase and the settings chosen for --max-memory, from the "
                        "configs on the meta device (no weights), and exit")
    p.add_argument("--max-memory", default=None, metavar="SIZE",
                   help="memory budget, e.g. 16GB or 12GiB: choose the cheapest offload/tiling/chunking that fits "
                        "(default with --plan: the device's free memory; on CPU the available RAM)")
    p.add_argument("--layout", default=None,
                   help="resolve the dtypes for another device than the one it runs on, e.g. --device cpu --layout t4 "
                        "(the T4 fp16 layout, run on this CPU)")
    p.add_argument("--skip-existing", action="store_true", help="keep outputs that exist and make only the missing ones")
    p.add_argument("--overwrite", action="store_true", help="replace outputs that exist (default: refuse)")
    p.add_argument("--forward-chunking", action="store_true",
                   help="UNet feed-forward in chunks (unet.enable_forward_chunking): less memory, slower")
    p.add_argument("--seed", type=int, default=0, help="random seed; the same seed gives the same video on any device")
    add_recipe_args(p, layout=False, device_help="device to run on: cpu, cuda, cuda:1, mps, xpu (default: the best present device; "
                                    "under accelerate launch: each process's own device)")
    p.add_argument("--demo", action="store_true",
                   help="build a tiny random SVD pipeline locally and run it (no network, no weights)")
    p.add_argument("--context-parallel", type=int, default=None, metavar="N",
                   help="split each clip's tokens over N GPUs (diffusers ContextParallelConfig, transformers with a "
                        "_cp_plan: Wan, LTX-Video); start N processes with torchrun; every rank runs every clip, the "
                        "main process writes it")
    p.add_argument("--device-map", choices=("balanced",), default=None,
                   help="balanced: place whole components over the visible GPUs (the denoiser alone on the one with "
                        "the most free memory, the rest largest first), each in the recipe's dtypes for its GPU; for a "
                        "model that does not fit one GPU. The placement is printed before loading")
    p.add_argument("--fail-fast", action="store_true", help="stop at the first failed clip (default: report it, go on)")
    p.add_argument("--quiet", action="store_true", help="no progress bars")


def build_parser(prog: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``scripts/generate_video.py``: ``hf-precision video``'s arguments and examples."""
    return script_parser("video", prog, "Text-to-video and image-to-video for Wan, LTX-Video, CogVideoX, HunyuanVideo "
                                        "and Stable Video Diffusion, in the dtypes the recipe picks for your device, "
                                        "with a memory plan that fits the GPU.")


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Entry point of ``scripts/generate_video.py``: bad input prints one message and returns 2."""
    from .common import script_main

    # outputs are renamed into place only when complete: an interrupt leaves nothing partial
    return script_main(build_parser(prog), run, argv,
                       interrupted="interrupted; finished outputs are kept, the one in progress was not written")


def _check_numbers(args: argparse.Namespace, spec: Any) -> None:
    problems = spec.check(height=args.height, width=args.width, frames=args.frames)
    for name, low in (("steps", 1), ("fps", 1), ("decode_chunk_size", 1), ("motion_bucket_id", 0)):
        value = getattr(args, name)
        if value is not None and value < low:
            problems.append(f"--{name.replace('_', '-')} {value}: must be at least {low}")
    if args.noise_aug_strength < 0:
        problems.append(f"--noise-aug-strength {args.noise_aug_strength}: must be >= 0")
    if problems:
        raise RecipeError(problems)


def _check_mode(args: argparse.Namespace, spec: Any) -> None:
    if args.prompt is not None and args.prompts is not None:
        raise RecipeError("--prompt and --prompts: give one of them")
    has_text = args.prompt is not None or args.prompts is not None
    if spec.input_clips:  # the command line gives a prompt and an image, no clip
        clips = ", ".join(f"{c}=[frames]" for c in spec.input_clips)
        raise RecipeError(f"{spec.pipeline} is video-to-video: its call needs {' and '.join(spec.input_clips)} (input "
                          f"clips), which video has no option for; call it in Python: pipe = hp.load_pipeline("
                          f"{args.model!r}, device); pipe(prompt=..., {clips})")
    if spec.other_inputs:  # e.g. AnimateDiff ControlNet's control clip: refused here, not after loading
        given = ", ".join(f"{c}=..." for c in spec.other_inputs)
        raise RecipeError(f"{spec.pipeline} needs {' and '.join(spec.other_inputs)} besides the prompt, which video has "
                          f"no option for; call it in Python: pipe = hp.load_pipeline({args.model!r}, device); "
                          f"pipe(prompt=..., {given})")
    if spec.takes_image and not spec.takes_prompt and has_text:
        raise RecipeError(f"{spec.pipeline} is image-to-video without a prompt: drop --prompt/--prompts")
    if not spec.takes_image and args.image:
        raise RecipeError(f"{spec.pipeline} is text-to-video: it takes no --image; use an image-to-video model "
                          f"(e.g. Wan-AI/Wan2.1-I2V-14B-480P-Diffusers, Lightricks/LTX-Video with "
                          f"LTXImageToVideoPipeline, THUDM/CogVideoX-5b-I2V) or drop --image")
    if spec.takes_image and not args.image and not spec.image_optional:
        raise RecipeError(f"{spec.pipeline} is image-to-video: give --image FILE or FOLDER")
    if (not spec.takes_image or (spec.image_optional and not args.image)) and not has_text:
        raise RecipeError(f"{spec.pipeline} is text-to-video: give --prompt TEXT or --prompts FILE")


def _demo_inputs(workdir: Path, image: str | None) -> tuple[str, str]:
    """Save a tiny random SVD pipeline and (unless one was given) a synthetic input image under ``workdir``."""
    import numpy as np
    from PIL import Image

    from ..testing.pipelines import make_svd, save_pipeline

    model = save_pipeline(make_svd(), workdir / "tiny-svd")
    if image is None:
        y, x = np.mgrid[0:128, 0:128] / 127.0
        rgb = np.stack([x, y, 1 - (x - 0.5) ** 2 * 4 * (y > 0.5)], axis=-1)
        image = str(workdir / "demo.png")
        Image.fromarray((rgb * 255).astype(np.uint8)).save(image)
    return str(model), image


def run(args: argparse.Namespace) -> int:
    """Run the video command from parsed arguments (``hf-precision video`` calls this). Raises RecipeError on bad input."""
    if args.demo and (args.model or args.base):
        flag = "--model" if args.model else "--base"
        raise RecipeError(f"--demo builds its own tiny model; drop {flag} (or drop --demo to use your model)")
    if args.skip_existing and args.overwrite:
        raise RecipeError("--skip-existing and --overwrite: choose one")
    if not args.demo and not args.out and not args.plan:
        raise RecipeError("--out is required: FILE.mp4, FILE.gif, or a folder")
    if args.demo and not args.plan:
        check_out(args.out or "demo.mp4", args.format)  # before --demo builds its model
    if args.device_map:
        clash = [flag for flag, on in (("--device", args.device is not None),
                                       ("--offload", args.offload not in (None, "none")),
                                       ("--max-memory", args.max_memory is not None),
                                       ("--context-parallel", bool(args.context_parallel)), ("--plan", args.plan)) if on]
        if clash:
            raise RecipeError(f"--device-map balanced places whole components on all visible GPUs; it does not go "
                              f"with {', '.join(clash)} (one device, offload onto one GPU, or a split of the tokens): "
                              f"drop one of them")
    if args.device is not None and not args.plan:  # --plan plans for any device, a preset such as t4 included
        from ..runtime.placement import torch_device

        torch_device(args.device, "--device")  # a preset such as t4 fails here, not after --demo built its model
    with contextlib.ExitStack() as stack:
        if args.demo:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="hf_precision_video_")))
            model, image = _demo_inputs(workdir, args.image)
        else:
            model, image = args.model or "svd", args.image
        single = None
        if args.base:
            from ..runtime.single_file import split_single_file

            # the file has its base's architecture: the spec, the sizes and the memory plan are the base's
            single, model = split_single_file(model, args.base, "video --model")
        jobs: list[Job] = []
        if not args.plan:  # inputs and outputs first: a missing image fails before any model lookup
            prompts = read_prompts(args.prompts) if args.prompts else ([args.prompt] if args.prompt is not None else None)
            existing = "skip" if args.skip_existing else ("overwrite" if args.overwrite else "error")
            jobs = plan_outputs(image, args.out or "demo.mp4", args.format, prompts=prompts, existing=existing)
        where, spec = model_spec(model, configs_only=args.plan)
        if args.max_sequence_length is not None:
            spec = dataclasses.replace(spec, extra={**spec.extra, "max_sequence_length": args.max_sequence_length})
        defaults = dict(DEMO_DEFAULTS) if args.demo else {**spec.defaults, "decode_chunk_size": 8}
        for key, value in defaults.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value or None)
        if args.frames is None:
            args.frames = spec.defaults["frames"]
        _check_numbers(args, spec)
        if not args.demo:
            _check_mode(args, spec)
        if args.plan:
            return print_plan(where, spec, args)
        if not jobs:
            print(f"nothing to do: all {args.out} outputs exist (--skip-existing)", flush=True)
            return 0
        return _generate(args, where, spec, jobs, single)


def _settings(args: argparse.Namespace, where: str, spec: Any, device: Any) -> MemorySettings:
    """The memory settings of the flags, or the plan's choice for ``--max-memory`` (printed)."""
    if args.max_memory is None:
        return MemorySettings(offload=args.offload or "none", vae_tiling=args.vae_tiling,
                              vae_slicing=args.vae_slicing, forward_chunking=args.forward_chunking,
                              decode_chunk_size=args.decode_chunk_size if spec.row.decode_chunks else None)
    from ..apps.video.plan import choose, free_memory

    layout = args.layout or device
    budget = parse_size(args.max_memory) if args.max_memory else free_memory(device)
    choice = choose(where, spec, layout=layout, budget=budget, height=args.height, width=args.width,
                    frames=args.frames, decode_chunk=args.decode_chunk_size)
    print(choice.describe(), flush=True)
    return choice.settings


def _generate(args: argparse.Namespace, model: str, spec: Any, jobs: list[Job], single: Path | None = None) -> int:
    from ..apps.video.run import BatchOptions, generate_batch

    # the flags are named as the options' fields (--fps = fps); two are worked out here
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(BatchOptions) if hasattr(args, f.name)}
    options = BatchOptions(**{**given, "overrides": overrides_from(args) or None,
                              "single_file": str(single) if single else None})
    return generate_batch(model, spec, jobs, options, settings=lambda device: _settings(args, model, spec, device))


def print_plan(where: str, spec: Any, args: argparse.Namespace) -> int:
    """``--plan``: weights per component, the predicted peak per phase, and the settings for the budget."""
    from ..apps.video.plan import choose, free_memory
    from ..recipe.devices import device_profile

    here = args.device or str(device_profile(None).torch_device())  # where the clip would run: the budget's device
    layout = args.layout or here
    if args.max_memory:
        budget = parse_size(args.max_memory)
    elif args.device is not None and not device_profile(args.device).present:
        # A preset (t4) or a description plans for a device that is not here: its free memory cannot be read.
        raise RecipeError(f"--plan --device {args.device}: {device_profile(args.device).label()} is not on this machine, "
                          f"so its free memory is unknown; give the budget: --max-memory SIZE (e.g. --max-memory 16GB "
                          f"for a 16 GB card)")
    else:
        budget = free_memory(here)
    choice = choose(where, spec, layout=layout, budget=budget, height=args.height, width=args.width,
                    frames=args.frames, decode_chunk=args.decode_chunk_size)
    p, gb = choice.prediction, format_bytes
    print(f"plan: {spec.pipeline} ({spec.mode}) for {device_profile(layout).label()}, {args.width}x{args.height}, "
          f"{args.frames} frames (configs on the meta device, no weights)")
    print("weights: " + ", ".join(f"{n} {gb(b)}" for n, b in p.weights.items()) + f"; total {gb(sum(p.weights.values()))}")
    wide = max([58, *(len(t.settings.label()) for t in choice.tried)])  # quantized rows' labels run longer
    print(f"{'settings':{wide}} " + " ".join(f"{k:>15}" for k in p.phases) + f" {'peak':>10}")
    for t in choice.tried:
        print(f"{t.settings.label():{wide}} " + " ".join(f"{gb(v):>15}" for v in t.phases.values())
              + f" {gb(t.peak):>10}")
    print(choice.describe())
    return 0
