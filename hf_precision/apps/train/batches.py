"""The batches ``hf-precision train``'s loss takes: each sample's latents and conditioning, encoded once into the
cache before step 1 (:func:`fill_cache`) or, without a cache, when the step needs them (:func:`encode_batch`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from . import draws
from .cache import join_padded, offload_encoders, sample_parts, tp_device
from .prepare import Run

__all__ = ["encode_batch", "fill_cache"]


def _text_trained(tp: Any) -> bool:
    # a text encoder that trains (textual inversion, a text LoRA) is encoded every step, never from the cache
    import torch

    return any(p.requires_grad for n, m in tp.components.items() if n.startswith("text_encoder")
               and isinstance(m, torch.nn.Module) for p in m.parameters())


def encode_batch(run: Run, indices: list[int], step: int | None = None) -> dict[str, Any]:
    """The batch the layer's loss takes at ``step``, from the cache where :func:`fill_cache` wrote it, else encoded
    now; a condition drawn per step (an inpainting mask) is the step's pick (:mod:`.draws`)."""
    import torch

    tp = run.tp
    found = [run.cache.get("latents", _latent_key(run, i)) for i in indices] if run.cache is not None else [None]
    if not all(f is not None for f in found):
        # a draw per step (.draws): the sample's draws up to the step's pick, the ones the cache would hold first
        found = [_sample_latents(run, i, draws.choice(run.settings.seed, step, i) + 1) for i in indices]
    latents = torch.cat([f["latents"] for f in found])
    # every encoding beside the latents, whatever its builder named it (an edit's reference latents, the channels
    # beyond the latents, an I2V model's first-frame encodings, Wan VACE's control latents, Wan Animate's pose and
    # face): a list of names here once dropped VACE's control_latents, and tp.loss refused every batch
    keys = set.intersection(*(set(f) for f in found)) - {"latents", draws.KEY}
    refs = {k: torch.cat([f[k] for f in found]).to(tp_device(tp)) for k in sorted(keys)}
    if all(draws.KEY in f for f in found):
        refs["condition_latents"] = draws.pick(found, indices, run.settings.seed, step).to(tp_device(tp))
    cond = None
    if run.cache is not None and not _text_trained(tp):
        texts = [run.cache.get("text", _text_key(run, i)) for i in indices]
        if all(f is not None for f in texts):
            cond = _from_cache(texts, _masks(run))
    if cond is None:
        with (torch.no_grad() if not _text_trained(tp) else contextlib.nullcontext()):
            cond = _encode_text(run, indices)
    device = tp_device(tp)
    return {"latents": latents.to(device), **refs,
            **{k: v.to(device) if torch.is_tensor(v) else v for k, v in cond.items()}}


def _latent_key(run: Run, i: int) -> tuple[Any, ...]:
    """What a sample's cached latents depend on: its file and, where a condition is made, the builder or method that
    made it and the seed of its draws (another one is encoded again)."""
    from ...training.encode import condition_key

    made = (*condition_key(run.tp), *(("draws", draws.DRAWS) if draws.drawn(run.tp) else ()))
    return (*sample_parts(run.data.samples[i]), *made, run.settings.seed) if made else sample_parts(run.data.samples[i])


def _prompt_image(run: Run, i: int) -> Any:
    """The picture the pipeline encodes sample ``i``'s prompt with, else None: its reference image (Qwen-Image Edit)
    or, where encode_prompt needs an image, the clip's first frame (HunyuanVideo I2V,
    pipeline_hunyuan_video_image2video.py:831-839), as at inference."""
    if not _prompt_image_used(run, i):
        return None
    if run.data.samples[i].reference is not None:
        return run.data.reference_image(i)
    from ...training.image_embeds import pil_frames

    return pil_frames(run.data.pixels([i]))[0]


def _text_key(run: Run, i: int) -> tuple[Any, ...]:
    """What a sample's cached conditioning depends on: its caption, and the picture the prompt is encoded with."""
    sample = run.data.samples[i]
    if not _prompt_image_used(run, i):
        return (sample.caption,)
    if sample.reference is None:
        return (sample.caption, "first frame", *sample_parts(sample))
    return (sample.caption, *sample_parts(sample)[-4:], sample.bucket)


def _prompt_image_used(run: Run, i: int) -> bool:
    from ...training.encode import encode_prompt_needs
    from .references import prompt_reads_image

    if run.data.samples[i].reference is not None:
        return prompt_reads_image(run.tp.pipe)
    return "image" in encode_prompt_needs(type(run.tp.pipe))


def _encode_text(run: Run, indices: list[int]) -> dict[str, Any]:
    """The conditioning of samples ``indices``: one call, or one per sample where the prompt is encoded with a
    picture (QwenImageEditPlusPipeline reads a list of images as pictures of every prompt); none without
    encode_prompt (SVD: its conditioning is the image embedding, made with the latents)."""
    if not hasattr(run.tp.pipe, "encode_prompt"):
        return {}
    if not any(_prompt_image_used(run, i) for i in indices):
        return dict(run.tp.encode_prompt(run.data.captions(indices)))
    return _from_cache([_cacheable(run.tp.encode_prompt([run.data.samples[i].caption], image=_prompt_image(run, i)))
                        for i in indices], _masks(run))


def _masks(run: Run) -> tuple[str, ...]:
    """The batch keys of the family's text attention masks (Qwen-Image: prompt_attention_mask)."""
    from ...training.denoiser_rows import row_of

    row = row_of(run.tp._denoiser())
    return tuple(n for names in (row.encode, *(m for _, m in row.encode_more)) for n in names if n and "mask" in n)


def _cacheable(cond: Any) -> dict[str, Any]:
    """One caption's conditioning as the cache stores it: tensors, and lists of them (Z-Image) as ``KEY.0``, ..."""
    import torch

    out = {k: v for k, v in cond.items() if torch.is_tensor(v)}
    for k, v in cond.items():
        if isinstance(v, (list, tuple)) and v and all(torch.is_tensor(t) for t in v):
            out.update({f"{k}.{i}": t for i, t in enumerate(v)})
    return out


def _from_cache(texts: list[dict[str, Any]], masks: tuple[str, ...] = ()) -> dict[str, Any]:
    """A batch's conditioning from its captions' cache entries, joined by :func:`~.cache.join_padded`."""
    import re

    items: dict[str, list[Any]] = {}
    for entry in texts:
        for k in sorted((k for k in entry if re.fullmatch(r".+\.\d+", k)), key=lambda k: int(k.rsplit(".", 1)[1])):
            items.setdefault(k.rsplit(".", 1)[0], []).append(entry[k])
    plain = [k for k in texts[0] if not re.fullmatch(r".+\.\d+", k)]
    return {**join_padded(texts, plain, list(masks)), **items}


def _sample_latents(run: Run, i: int, count: int | None = None) -> dict[str, Any]:
    """Sample ``i``'s latents, reference latents and condition, drawn under the sample's own seed in a forked RNG, so
    the cache and ``--no-cache`` agree whatever batch or process it is in; ``count``: draws to make (:mod:`.draws`)."""
    import torch

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(run.settings.seed * 1_000_003 + i)
        pixels = run.data.pixels([i])
        out = {"latents": run.tp.encode_images(pixels)}
        if draws.drawn(run.tp):  # an inpainting mask: several draws, one picked per step (.draws)
            out.update(draws.encode_draws(run.tp, pixels, out["latents"], count or draws.DRAWS))
        else:  # Wan Animate's conditioning comes from the clip's reference, pose and face videos (and hands back
            # the latents with the reference's frame first: training.inputs.wan_animate_reference)
            out.update(run.tp.encode_condition(pixels, out["latents"], **run.data.animate_inputs(i)))
        # a first-frame edit model's reference is already its clip's first frame (references.edit_clip)
        reference = None if run.data.frames else run.data.reference_pixels([i])
        if reference is not None:
            out["reference_latents"] = run.tp.encode_images(reference)
        return out


def fill_cache(run: Run) -> None:
    """Encode every sample once before the first step (the main process writes), the training RNG untouched; frozen
    encoders then leave the accelerator until validation needs them."""
    import torch

    acc, tp, data = run.accelerator, run.tp, run.data
    text = not _text_trained(tp)
    if acc.is_main_process:
        for i in range(len(data.samples)):
            parts = _latent_key(run, i)
            if run.cache.get("latents", parts) is None:
                run.cache.put("latents", parts, _sample_latents(run, i))
            if text and run.cache.get("text", _text_key(run, i)) is None:
                with torch.no_grad():
                    cond = _encode_text(run, [i])
                run.cache.put("text", _text_key(run, i), _cacheable(cond))
    acc.wait_for_everyone()
    offload_encoders(run, "cpu", text)
