"""Every command on every family of the testing registry, as a user runs it (issue 34).

For each family of ``hf_precision.testing.PIPELINES`` the tiny pipeline is saved to a folder (``save_pipeline``),
and the commands ``plan``, ``show``, ``check``, ``calibrate``, ``generate`` (image families) or ``video`` (video
families), ``train --plan`` and a 2-step ``train`` run on it, on this CPU's own layout and on ``--layout t4``; ``check-nf4`` is
``check`` with the first transformers text encoder stored in nf4. The training data are tiny photos (image families)
or GIF clips (video families, as many frames as each is asked: :func:`make_clips`) with captions.
A pipeline whose call needs an input image (``needed_inputs``: SVD, I2VGenXL, Wan/LTX/CogVideoX/HunyuanVideo I2V,
Flux Kontext, SD/SDXL img2img, ...) gets a generated 32-pixel picture as ``--image`` in the commands that take one
(``calibrate``, ``generate``, ``video``), and an inpainting pipeline a 32-pixel mask as ``--mask`` as well
(``calibrate``, ``generate``), except one run per command kept without it to show the refusal
(:data:`WITHOUT_IMAGE`). A call that needs what no flag gives (ControlNet's control image) stays refused.

A run passes when it exits 0 and its stderr holds only our lines (``hf-precision ...``) and progress bars. A run
that exits 2 with exactly one line ``hf-precision CMD: error: ...`` is a clean refusal (REFUSED). Anything else is a
failure: an exception out of ``main`` (a traceback), another exit code, several error lines, or lines on stderr that
diffusers, transformers or a backend printed (the first one is named).

All runs share one process, so the imports are paid once; each run's stderr (the file descriptor, where compiled
code writes too) and stdout are captured on their own, as tests/test_stderr_ours.py does. Torch runs on one thread:
the tiny models are dominated by per-op overhead.

Usage (the full sweep: 1,148 runs on 72 families in about 5 minutes on 2 CPU cores, 2026-11-29)::

    python benchmarks/command_sweep.py
    python benchmarks/command_sweep.py --families wan,sana --commands check,train-plan --layouts t4 --json out.json
    python benchmarks/command_sweep.py --case wan:check+calibrate:t4 --case sana:train-plan:cpu

Exit status: 0 when every run passed or was refused cleanly, 1 when any failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # this checkout's hf_precision, not an installed one
from hf_precision.testing.cli_runs import judge  # noqa: E402
# run: generate (image families) or video (video families); check-nf4: check with the first transformers text encoder
# stored in nf4 (bitsandbytes on the CPU, whose block is wider than a tiny encoder's narrowest layer)
COMMANDS = ("plan", "show", "check", "check-nf4", "calibrate", "run", "train-plan", "train")
LAYOUTS = ("cpu", "t4")
FRAMES = 9  # 4k+1 (Wan, CogVideoX, HunyuanVideo) and 8k+1 (LTX): the fewest most VAEs take; others: video_size
SIDE = 32
# a run past what a family's configs allow, asked on purpose: the command refuses it in one line before loading
PAST_LIMITS = {("animatediff", "run"): "--frames 9"}
# the commands with an --image option (calibrate; run: generate's and video's): an image-to-image/video pipeline
# gets the sweep's picture, as a user runs it, and an inpainting one the sweep's mask (--mask: calibrate and generate);
# one family per command is run without them on purpose, to show that refusal (its message names --image)
TAKES_IMAGE = {"calibrate": ("image", "video"), "run": ("image", "video")}
TAKES_MASK = {"calibrate": ("image",), "run": ("image",)}
WITHOUT_IMAGE = {("svd", "calibrate"), ("wan_i2v", "run")}


def run_cli(argv: list[str]) -> tuple[object, str, str, str | None]:
    """``hf_precision.cli.main(argv)`` with fd 1 and fd 2 captured: (exit code, stderr, stdout, crash or None)."""
    from hf_precision.cli import main

    sys.stdout.flush()
    sys.stderr.flush()
    crash = None
    with tempfile.TemporaryFile() as err_sink, tempfile.TemporaryFile() as out_sink:
        saved = os.dup(2), os.dup(1)
        os.dup2(err_sink.fileno(), 2)
        os.dup2(out_sink.fileno(), 1)
        try:
            try:
                code = main(argv)
            except SystemExit as exit_:
                code = exit_.code
            except BaseException as exc:  # noqa: BLE001 - a crash is what the sweep reports
                if isinstance(exc, KeyboardInterrupt):
                    raise
                code = None
                frame = traceback.extract_tb(exc.__traceback__)[-1]
                crash = (f"{type(exc).__name__}: {str(exc).splitlines()[0][:160] if str(exc) else ''} "
                         f"({Path(frame.filename).name}:{frame.lineno})")
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os.dup2(saved[0], 2)
            os.dup2(saved[1], 1)
            os.close(saved[0])
            os.close(saved[1])
        err_sink.seek(0)
        out_sink.seek(0)
        return code, err_sink.read().decode(errors="replace"), out_sink.read().decode(errors="replace"), crash


def make_data(root: Path) -> dict[str, Path]:
    """Two 32-pixel photos, each with a caption file, and a reference picture of each for the edit models; the input picture of the image-to-image/video pipelines (a colour
    gradient, :data:`SIDE` pixels) and the mask of the inpainting ones (its middle: white where it repaints). The
    clips are :func:`make_clips`', as long as each family asks."""
    import numpy as np
    from PIL import Image

    images, references = root / "photos", root / "references"
    images.mkdir(parents=True, exist_ok=True)
    references.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        Image.fromarray(np.full((32, 32, 3), 60 + 40 * i, np.uint8)).save(images / f"i{i}.png")
        Image.fromarray(np.full((32, 32, 3), 200 - 40 * i, np.uint8)).save(references / f"i{i}.png")
        (images / f"i{i}.txt").write_text("a cat")
    y, x = np.mgrid[0:SIDE, 0:SIDE] * (255 // SIDE)
    Image.fromarray(np.stack([x, y, 255 - x], axis=-1).astype(np.uint8)).save(root / "input.png")
    mask = np.zeros((SIDE, SIDE), np.uint8)
    mask[SIDE // 4:3 * SIDE // 4, SIDE // 4:3 * SIDE // 4] = 255
    Image.fromarray(mask).save(root / "mask.png")
    return {"image": images, "references": references, "input": root / "input.png", "mask": root / "mask.png"}


def make_clips(root: Path, frames: int) -> Path:
    """Two 32-pixel GIF clips of at least ``frames`` frames (:data:`FRAMES` at least), each with a caption file:
    ``train`` refuses a clip shorter than the ``--frames`` it is given, and a family asks the frames its recipe
    takes (:func:`video_size`: Kandinsky 5 I2V 17, whose call fails for 1 to 4 latent frames)."""
    import numpy as np
    from PIL import Image

    count = max(frames, FRAMES)
    clips = root / f"clips-{count}"
    clips.mkdir(parents=True, exist_ok=True)
    for i in range(2):
        shots = [Image.fromarray(np.full((32, 32, 3), (20 * f + 10 * i) % 256, np.uint8)) for f in range(count)]
        shots[0].save(clips / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (clips / f"c{i}.txt").write_text("a clip")
    return clips


def save_family(kind: str, root: Path) -> tuple[Path, str]:
    """The tiny pipeline of ``kind`` saved under ``root``: (folder, pipeline class name)."""
    from hf_precision.testing import make_pipeline
    from hf_precision.testing.pipelines import save_pipeline

    folder = root / kind
    if not (folder / "model_index.json").is_file():
        save_pipeline(make_pipeline(kind, size="tiny", seed=0), folder)
    return folder, json.loads((folder / "model_index.json").read_text())["_class_name"]


def _text_encoder(folder: Path) -> str | None:
    """The first transformers text encoder of a saved pipeline (the one nf4 can store on the CPU), or None."""
    index = json.loads((folder / "model_index.json").read_text())
    return next((k for k, v in index.items() if k.startswith("text_encoder") and isinstance(v, list)
                 and v[0] == "transformers"), None)


def video_size(folder: Path) -> tuple[int, int, int]:
    """(height, width, frames) the sweep asks of a video model: :data:`SIDE` x :data:`SIDE` and :data:`FRAMES`, brought
    within what its configs allow, as a user reads them from a refusal: frames its VAE takes (Mochi's 6k+1: 7) and
    the bounds of its position tables (AnimateDiff's 8 motion positions, Latte's one frame count, CogVideoX I2V's one
    learned size). :data:`PAST_LIMITS` keeps one run past them, to show the refusal."""
    from hf_precision.apps.video.spec import model_spec
    from hf_precision.errors import RecipeError

    try:
        spec = model_spec(str(folder))[1]
    except RecipeError:  # not a video pipeline by its signature: the command names why
        return SIDE, SIDE, FRAMES
    return spec.within(height=SIDE, width=SIDE, frames=FRAMES)


def image_size(cls: str) -> tuple[int, int]:
    """(height, width) the sweep asks of an image model: :data:`SIDE` x :data:`SIDE`, or, where its recipe lists the
    only sizes its call makes (``sizes:``, Kandinsky 5 Image), the smallest of them, as a user reads them from the
    refusal."""
    from hf_precision.recipe.catalog import shipped_sizes

    sizes = shipped_sizes(cls)[1]
    return min(sizes, key=lambda s: s[0] * s[1]) if sizes else (SIDE, SIDE)


def train_data(cls: str, data: dict[str, Path], clips: Path | None) -> str:
    """The ``--data`` (and ``--reference-dir``) of ``train`` for a family: the clips of a video model, the photos of an
    image model, and for an edit model trained on (reference, target) pairs as clips (ChronoEdit: its recipe's
    ``video: first_frame_edit``) the photos with the references beside them."""
    from hf_precision.recipe.catalog import shipped_video

    if shipped_video(cls).get("first_frame_edit"):
        return f"{data['image']} --reference-dir {data['references']}"
    return str(clips if clips is not None else data["image"])


def image_input(folder: Path, video: bool) -> tuple[bool, bool]:
    """(whether ``calibrate``/``generate``/``video`` get ``--image``, whether ``video`` gets a prompt) for a saved
    pipeline, from what the commands read of its call: an image it cannot go without, with at most a mask beside it
    (``needed_inputs``; no flag gives another input, so a pipeline that also needs a control image or a clip stays
    refused) and, for a video model, whether the call takes a prompt at all (SVD takes none; ``video`` refuses
    --prompt for it)."""
    from hf_precision.apps.video.spec import model_spec
    from hf_precision.diagnose.call import needed_inputs
    from hf_precision.errors import RecipeError

    needed = needed_inputs(folder)[1]
    image = "image" in needed and set(needed) <= {"image", "mask_image"}
    if not video:
        return image, True
    try:
        spec = model_spec(str(folder))[1]
    except RecipeError:  # not a video pipeline by its signature: the command names why
        return image, True
    image = spec.takes_image and not spec.image_optional and not spec.input_clips and not spec.other_inputs
    return image, spec.takes_prompt or not image


def command_lines(kind: str, folder: Path, cls: str, data: Path | str, layout: str, out: Path,
                  picture: Path | None = None, mask: Path | None = None) -> dict[str, str]:
    """The command line of each sweep command for one family and layout (``cpu``: this CPU's own layout);
    ``picture`` and ``mask``: the input image and inpainting mask given to the commands that take them, where the
    pipeline's call needs them."""
    from hf_precision.diagnose.call import needed_inputs
    from hf_precision.testing import PIPELINES

    video = "video" in PIPELINES[kind].tags
    needs_image, prompted = image_input(folder, video) if picture is not None else (False, True)
    lay = "" if layout == "cpu" else f" --layout {layout}"
    run = f"--device cpu{lay}"
    height, width, count = video_size(folder) if video else (*image_size(cls), 1)
    size = f"--height {height} --width {width}"
    frames = f" --frames {count}" if video else ""
    # training crops the photos at any size: the sizes a call makes (image_size) do not bind it
    resolution = f"--resolution {max(height, width) if video else SIDE}"
    tag = f"{kind}-{layout}"
    lines = {
        "plan": f"plan {folder} {run}",
        "show": f"show --class {cls} {run} --brief",
        "check": f"check {folder} {run}",
        "check-nf4": f"check {folder} {run} --set {_text_encoder(folder)}.storage=nf4" if _text_encoder(folder) else None,
        "calibrate": f"calibrate {folder} {run} {size}{frames} --steps 2 --no-progress --out {out / tag}-islands.yaml",
        "run": (f"video --model {folder}{' --prompt ' + repr('a cat') if prompted else ''} {size}{frames} --steps 2 {run} --quiet "
                f"--out {out / tag}.gif" if video else
                f"generate {folder} --prompt 'a cat' {size} --steps 2 {run} --out {out / tag}.png"),
        "train-plan": f"train --plan --model {folder} --data {data} --out {out / tag}-plan {resolution}{frames} {run}",
        "train": (f"train --model {folder} --data {data} --out {out / tag}-lora {resolution}{frames} --steps 2 "
                  f"--checkpoint-every 1000 {run} --quiet"),
    }
    for name, kinds in TAKES_IMAGE.items() if needs_image else ():
        if ("video" if video else "image") in kinds and (kind, name) not in WITHOUT_IMAGE:
            lines[name] = f"{lines[name]} --image {picture}"
            if mask is not None and "mask_image" in needed_inputs(folder)[1] and \
                    ("video" if video else "image") in TAKES_MASK.get(name, ()):
                lines[name] = f"{lines[name]} --mask {mask}"
    for (family, name), past in PAST_LIMITS.items():
        if family == kind:
            lines[name] = f"{lines[name]} {past}"  # argparse: the last --frames wins
    return lines


def sweep(families: list[str], commands: list[str], layouts: list[str], root: Path, emit=print) -> list[dict]:
    """Run the commands on the families and layouts; ``emit`` gets one line per run. Returns one dict per run."""
    from hf_precision.testing import PIPELINES

    data = make_data(root / "data")
    results = []
    for kind in families:
        try:
            folder, cls = save_family(kind, root / "models")
        except Exception as exc:  # noqa: BLE001 - a family the registry cannot save is a result too
            results.append(dict(family=kind, command="save", layout="-", status="FAIL", reason=repr(exc)[:200]))
            emit(f"{kind:26} {'save':11} {'-':4} FAIL {exc!r}"[:300])
            continue
        video = "video" in PIPELINES[kind].tags
        for old in (root / "out").glob(f"{kind}-*"):  # a --workdir used before: train refuses an --out that exists
            shutil.rmtree(old) if old.is_dir() else old.unlink()
        for layout in layouts:
            clips = make_clips(root / "data", video_size(folder)[2]) if video else None
            lines = command_lines(kind, folder, cls, train_data(cls, data, clips), layout, root / "out", data["input"],
                                  data["mask"])
            for name in commands:
                if lines[name] is None:  # check-nf4 without a transformers text encoder
                    continue
                start = time.perf_counter()
                code, err, out, crash = run_cli(shlex.split(lines[name]))
                status, reason = judge(lines[name], code, err, out, crash)
                row = dict(family=kind, command=name, layout=layout, status=status, reason=reason,
                           seconds=round(time.perf_counter() - start, 1), argv=lines[name])
                results.append(row)
                emit(f"{kind:26} {name:11} {layout:4} {status:7} {row['seconds']:6.1f}s {reason}".rstrip())
    return results


def summary(results: list[dict]) -> str:
    """One table: per command, the count of PASS, REFUSED and FAIL runs."""
    rows = ["command      PASS  REFUSED  FAIL"]
    for name in [*COMMANDS, "save"]:
        mine = [r for r in results if r["command"] == name]
        if mine:
            count = {s: sum(r["status"] == s for r in mine) for s in ("PASS", "REFUSED", "FAIL")}
            rows.append(f"{name:11} {count['PASS']:5} {count['REFUSED']:8} {count['FAIL']:5}")
    total = {s: sum(r["status"] == s for r in results) for s in ("PASS", "REFUSED", "FAIL")}
    rows.append(f"{'all':11} {total['PASS']:5} {total['REFUSED']:8} {total['FAIL']:5}")
    return "\n".join(rows)


def _pick(text: str | None, allowed, what: str) -> list[str]:
    chosen = list(allowed) if not text else [x.strip() for x in text.split(",") if x.strip()]
    unknown = sorted(set(chosen) - set(allowed))
    if unknown:
        raise SystemExit(f"command_sweep: unknown {what} {unknown}; use some of {sorted(allowed)}")
    return chosen


def _case(text: str) -> tuple[str, str, str]:
    parts = text.split(":")
    if len(parts) != 3:
        raise SystemExit(f"command_sweep: --case {text!r}: write FAMILY:CMD[+CMD]:LAYOUT[+LAYOUT], e.g. wan:check:t4")
    return parts[0], parts[1], parts[2]


def main(argv: list[str] | None = None) -> int:
    """Parse the options, run the sweep, print the lines and the summary; 1 when any run failed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", help="comma-separated registry names (default: all)")
    parser.add_argument("--commands", help=f"comma-separated, of {','.join(COMMANDS)} (default: all)")
    parser.add_argument("--layouts", help="comma-separated, of cpu,t4 (default: both)")
    parser.add_argument("--case", action="append", default=[], metavar="FAMILY:CMD[+CMD]:LAYOUT[+LAYOUT]",
                        help="one family's commands and layouts (repeatable; replaces --families/--commands/--layouts)")
    parser.add_argument("--workdir", help="folder for models, data and outputs (default: a temporary one)")
    parser.add_argument("--json", help="write every run's result to this file")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("CUDA_VISIBLE_DEVICES", "")  # this CPU's layout, on any machine
    import torch

    from hf_precision.testing import PIPELINES

    torch.set_num_threads(1)
    families = _pick(args.families, PIPELINES, "families")
    commands = _pick(args.commands, COMMANDS, "commands")
    layouts = _pick(args.layouts, LAYOUTS, "layouts")
    cases = [(families, commands, layouts)]
    if args.case:
        cases = [([f], _pick(c.replace("+", ","), COMMANDS, "commands"), _pick(l.replace("+", ","), LAYOUTS, "layouts"))
                 for f, c, l in (_case(text) for text in args.case)]
        _pick(",".join(c[0][0] for c in cases), PIPELINES, "families")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.workdir or tmp)
        results = [row for fams, cmds, lays in cases
                   for row in sweep(fams, cmds, lays, root, emit=lambda line: print(line, flush=True))]
    print(summary(results))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 1 if any(r["status"] == "FAIL" for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
