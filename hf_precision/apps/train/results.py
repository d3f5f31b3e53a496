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

from ...diagnose.call import call_defaults, call_params, frames_argument, taken
from ...training.methods import method_of
from ..outputs import written_atomically
from .sharded import save_full_model

__all__ = ["log_line", "trim_log", "validate", "save_outputs"]


def log_line(run: Any, step: int, loss: float | None) -> None:
    """Append the step to ``train_log.jsonl`` (main process)."""
    if not run.accelerator.is_main_process:
        return
    row = {"step": step, "loss": loss, "skipped": run.tp.skipped_steps, "lr": run.scheduler.get_last_lr()[0]}
    with open(run.out / "train_log.jsonl", "a", encoding="utf-8") as f:
        f.write(json.dumps(row) + "\n")


def trim_log(run: Any, step: int) -> None:
    """Drop the log rows after ``step``, and any that does not parse (a kill mid-write): a resumed run writes them."""
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


def validation_inputs(pipe: Any, data: Any, size: tuple[int, int] | None = None) -> dict[str, Any]:
    """The inputs beyond the prompt that ``pipe``'s call cannot run without (:func:`call_inputs`), made from the first
    training sample as a user would give them: its reference image (an edit model), else its first frame, as the
    ``image`` (an image-to-video or image-to-image model starts from it) or control image, its clip as the ``video``,
    and the middle of the picture as the inpainting mask (white where the model repaints); at the sample's bucket,
    then fitted to ``size`` (height, width) as ``generate`` fits a user's (:func:`sized_inputs`: SD img2img makes
    its input's size; :func:`fitted_to_area`: Flux Kontext resizes to a megapixel unless told not to). Inputs no
    sample holds are left to the call.

    Example:
        >>> from types import SimpleNamespace
        >>> from diffusers import StableDiffusionPipeline, StableDiffusionInpaintPipeline
        >>> data = SimpleNamespace(frames=None, samples=[SimpleNamespace(bucket=(32, 16))],
        ...                        pixels=lambda i: __import__("torch").zeros(1, 3, 16, 32))
        >>> validation_inputs(StableDiffusionPipeline, data)
        {}
        >>> {k: v.size for k, v in validation_inputs(StableDiffusionInpaintPipeline, data).items()}
        {'image': (32, 16), 'mask_image': (32, 16)}
    """
    import numpy as np
    from PIL import Image

    from ...diagnose.call import call_inputs, fitted_to_area, sized_inputs
    from .data import to_pictures

    cls = pipe if isinstance(pipe, type) else type(pipe)
    needed = call_inputs(cls)
    if not needed or not data.samples:
        return {}
    width, height = data.samples[0].bucket
    frames = to_pictures(data.pixels([0])[0])
    # an edit model's reference (a first-frame edit model's is already its clip's first frame: references.edit_clip)
    reference = data.reference_image(0) if not data.frames and hasattr(data, "reference_image") else None
    picture = reference if reference is not None else frames[0]
    mask = np.zeros((height, width), np.uint8)
    mask[height // 4:3 * height // 4, width // 4:3 * width // 4] = 255
    made = {"image": picture, "control_image": picture, "mask_image": Image.fromarray(mask).convert("RGB"),
            "video": frames, "conditioning_frames": frames}
    inputs = {k: made[k] for k in needed if k in made}
    if size is None:
        return inputs
    params = call_params(cls)
    inputs = sized_inputs(params, inputs, size)
    return {**inputs, **fitted_to_area(params, size, inputs.get("image"))}


def _prompt_length(tp: Any, pipe: Any) -> dict[str, int]:
    """``max_sequence_length`` where the denoiser was built for prompts of exactly as many tokens as training pads
    them to (its row's ``text_len``: CogVideoX's ``max_text_seq_length``; the call's default, 226, fails inside
    diffusers' joint position table on a model built for another length)."""
    from ...training.denoiser_rows import row_of, text_length

    denoiser = tp._denoiser()
    length = text_length(row_of(denoiser), getattr(denoiser, "config", {}), "prompt_embeds")
    return {"max_sequence_length": length} if length and "max_sequence_length" in call_params(pipe) else {}


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
        animate = run.data.animate_inputs(0)
        if animate:  # Wan Animate: the first clip's character, pose and face, at its bucket, one segment of it
            width, height = run.data.samples[0].bucket
            kwargs.update(animate, height=height, width=width, segment_frame_length=run.data.frames)
        else:
            kwargs.update(validation_inputs(pipe, run.data, (s.resolution, s.resolution)))
        kwargs.update(_prompt_length(run.tp, pipe), **call_defaults(pipe))
        params = call_params(pipe)
        # by name, and only where the call takes one (SVD's and Wan Animate's first parameter is their image); only
        # what the call takes (SD upscale's makes its input's size: no height or width)
        prompt = {"prompt": s.validation_prompt} if "prompt" in params else {}
        kwargs = taken(params, kwargs)
        generator = torch.Generator("cpu").manual_seed(s.seed)
        out = pipe(generator=generator, **prompt, **quiet_call(pipe, kwargs))
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
