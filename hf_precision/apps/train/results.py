"""What a run leaves behind: the loss log, validation images, and the trained weights with the recipe and plan
recorded beside them. Only the main process writes; every file is written atomically.

``OUT/`` after a LoRA run (``pipe.load_lora_weights(OUT)`` reads it as is)::

    pytorch_lora_weights.safetensors   the LoRA in diffusers/peft format, --save-dtype (default float16); where
                                       diffusers has no LoRA loader for the pipeline (PixArt) instead
    transformer/adapter_model.safetensors  peft's format, adapter_config.json beside it:
                                       PeftModel.from_pretrained(pipe.transformer, OUT/transformer) reads it
    training.json                      settings, the training plan (dtypes per component, rules), fingerprint, losses
    train_log.jsonl                    one line per step: step, loss, skipped steps, learning rate
    validation/step-000100.png         validation images (clips: .gif), before training as step-000000
    checkpoints/step-000100/           resumable state (see checkpoint.py)
    cache/                             latents and text embeddings keyed by the plan fingerprint
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from ...diagnose.call import call_inputs, call_params, frames_argument
from ...errors import RecipeError
from ...training.methods import method_of
from ..outputs import written_atomically

__all__ = ["log_line", "trim_log", "validate", "save_outputs"]


def log_line(run: Any, step: int, loss: float | None) -> None:
    """Append the step to ``train_log.jsonl`` (main process)."""
    if not run.accelerator.is_main_process:
        return
    row = {"step": step, "loss": loss, "skipped": run.tp.skipped_steps, "lr": run.scheduler.get_last_lr()[0]}
    with open(run.out / "train_log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def trim_log(run: Any, step: int) -> None:
    """Drop the log rows after ``step`` (main process): a resumed run writes them again, and the log keeps one line per
    step. A row that does not parse (a kill mid-write) is dropped with them."""
    log = run.out / "train_log.jsonl"
    if not run.accelerator.is_main_process or not log.is_file():
        return
    kept = []
    for line in log.read_text(encoding="utf-8").splitlines():
        try:
            if int(json.loads(line)["step"]) <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            continue
    with written_atomically(log) as tmp:
        tmp.write_text("".join(f"{line}\n" for line in kept), encoding="utf-8")


def validate(run: Any, step: int) -> Path | None:
    """One validation image (or clip) from the live weights through the layer's sampling context."""
    import torch

    s = run.settings
    sharded = run.tp.shard is not None  # the sharded denoiser's forward is a collective: every rank samples
    if not run.accelerator.is_main_process and not sharded:
        run.accelerator.wait_for_everyone()
        return None
    from ...runtime.progress import quiet_call
    from .cache import offload_encoders

    offload_encoders(run, run.accelerator.device if run.accelerator.device.type != "cpu" else "cpu")
    kwargs: dict[str, Any] = {"num_inference_steps": s.validation_inference_steps, "height": s.resolution,
                              "width": s.resolution, "output_type": "np"}
    with torch.random.fork_rng(devices=[]), run.tp.sampling() as pipe:
        frames_arg = frames_argument(call_params(pipe))
        if run.data.frames and frames_arg:  # Sana-Video's call names it `frames`
            kwargs[frames_arg] = run.data.frames
        kwargs.update(_validation_inputs(run, pipe))
        generator = torch.Generator("cpu").manual_seed(s.seed)
        # by keyword: an image-to-video or edit call's first parameter is its image (ChronoEdit, FramePack, Wan I2V)
        out = pipe(prompt=s.validation_prompt, generator=generator, **quiet_call(pipe, kwargs))
    offload_encoders(run, "cpu", True)
    if not run.accelerator.is_main_process:
        run.accelerator.wait_for_everyone()
        return None
    frames = out.frames[0] if hasattr(out, "frames") else None
    folder = run.out / "validation"
    if frames is not None:
        from ..video.io import save_video

        target = save_video(frames, folder / f"step-{step:06d}.gif", fps=8)
    else:
        import numpy as np
        from PIL import Image

        from ..image import output_pictures

        image = Image.fromarray((np.clip(output_pictures(out)[0], 0, 1) * 255).round().astype("uint8"))
        target = folder / f"step-{step:06d}.png"
        with written_atomically(target) as tmp:
            image.save(tmp, format="PNG")
    run.accelerator.wait_for_everyone()
    return target


def check_validation(pipeline: Any) -> None:
    """Refuse ``--validation-prompt`` for a pipeline class (or its name) whose call needs an input besides the prompt
    and an image, which validation does not make (an inpainting mask); ``train`` asks before loading.

    Example:
        >>> check_validation("StableDiffusionPipeline"), check_validation("NoSuchPipeline")
        (None, None)
    """
    import diffusers

    cls = getattr(diffusers, pipeline, None) if isinstance(pipeline, str) else pipeline
    others = [k for k in call_inputs(cls) if k != "image"] if cls is not None else []
    if others:
        raise RecipeError(f"--validation-prompt: {cls.__name__}'s call needs {', '.join(others)} beside the prompt, "
                          f"which validation does not make; drop --validation-prompt")


def _validation_inputs(run: Any, pipe: Any) -> dict[str, Any]:
    """The input image a validation call needs besides its prompt: the first sample's, as the data gives it to
    training (an edit pair's reference, a clip's first frame); any other input the call cannot go without is refused,
    before the first step."""
    from PIL import Image

    from .data import to_pixels
    from .images import open_image

    check_validation(type(pipe))
    if "image" not in call_inputs(type(pipe)):
        return {}
    sample = run.data.samples[0]
    if sample.reference is not None:
        return {"image": open_image(sample.reference)}
    if sample.frames:  # the clip's first frame at its bucket, as training sees it
        first = ((to_pixels(sample, 1)[:, 0].permute(1, 2, 0) + 1) * 127.5).round().clamp(0, 255).byte()
        return {"image": Image.fromarray(first.numpy())}
    return {"image": open_image(sample.path)}


def _versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for name in ("torch", "diffusers", "transformers", "peft", "accelerate", "hf-precision"):
        try:
            out[name] = md.version(name)
        except md.PackageNotFoundError:
            pass
    return out


def _module_saver(sharded: bool) -> Any:
    """How a trained component is written whole: its shards gathered (a collective), or ``save_pretrained``."""
    if sharded:
        from .sharded import save_full_model

        return save_full_model
    return lambda module, folder: module.save_pretrained(folder, safe_serialization=True)


def save_outputs(run: Any, step: int, losses: dict[int, float]) -> Path | None:
    """The trained weights in the format their loader reads, and ``training.json`` beside them."""
    import torch

    s, tp, out = run.settings, run.tp, run.out
    run.accelerator.wait_for_everyone()
    sharded = tp.shard is not None  # gathering the shards is a collective: every rank takes part, rank 0 writes
    if not run.accelerator.is_main_process and not sharded:
        return None
    dtype = getattr(torch, s.save_dtype)  # one of settings.SAVE_DTYPES, checked before loading
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".save-")) if run.accelerator.is_main_process else out / ".not-written"
    try:
        method_of(s.method).save(tp, tmp, dtype, _module_saver(sharded))
        if not run.accelerator.is_main_process:
            return None
        saved = _move_into(tmp, out)
    finally:
        if run.accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
    record = {
        "settings": s.record(), "steps": step, "skipped_steps": tp.skipped_steps,
        "final_loss": losses.get(step), "first_loss": losses.get(min(losses)) if losses else None,
        "fingerprint": tp.fingerprint(), "plan": tp.report(), "saved": [p.name for p in saved],
        "save_dtype": s.save_dtype, "versions": _versions(), "command": " ".join(sys.argv),
        **({"shard": str(tp.shard)} if sharded else {}),
    }
    with written_atomically(out / "training.json") as f:
        f.write_text(json.dumps(record, indent=2, default=str), encoding="utf-8")
    return out


def _move_into(tmp: Path, out: Path) -> list[Path]:
    """Rename each written entry onto its place in ``out`` (each rename is atomic; an old entry is replaced)."""
    moved = []
    for entry in sorted(tmp.iterdir()):
        target = out / entry.name
        if target.is_dir():
            shutil.rmtree(target)
        os.replace(entry, target)
        moved.append(target)
    return moved
