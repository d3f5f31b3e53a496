"""The batches ``hf-precision train``'s loss takes: each sample's latents and conditioning (its caption's encoding,
the conditioning channels or image encodings its denoiser takes, an inpainting mask's draws), encoded once into the
cache before step 1 (:func:`fill_cache`) or, without a cache, when the step needs them (:func:`encode_batch`).
"""

from __future__ import annotations

import contextlib
from typing import Any

from .cache import join_padded, offload_encoders, sample_parts, tp_device
from .prepare import Run

__all__ = ["encode_batch", "fill_cache"]


def _text_trained(tp: Any) -> bool:
    # a text encoder that trains (textual inversion, a text LoRA) is encoded every step, never from the cache
    import torch

    return any(p.requires_grad for n, m in tp.components.items() if n.startswith("text_encoder")
               and isinstance(m, torch.nn.Module) for p in m.parameters())


def encode_batch(run: Run, indices: list[int], step: int | None = None) -> dict[str, Any]:
    """The batch the layer's loss takes at ``step``: latents and conditioning, read from the cache where
    :func:`fill_cache` wrote them, else encoded now (``--no-cache``, or a text encoder that trains); a condition
    drawn per step (an inpainting mask) is the step's pick among the sample's draws (:mod:`.draws`)."""
    import torch

    from . import draws

    tp = run.tp
    found = [run.cache.get("latents", _latent_key(run, i)) for i in indices] if run.cache is not None else [None]
    if not all(f is not None for f in found):
        # a draw per step (.draws): the sample's draws up to the step's pick, the ones the cache would hold first
        found = [_sample_latents(run, i, draws.choice(run.settings.seed, step, i) + 1) for i in indices]
    latents = torch.cat([f["latents"] for f in found])
    # an edit dataset's reference images (the layer appends their latents to the token sequence); the channels a
    # denoiser takes beyond the latents (inpainting's mask and masked image, an I2V model's first frame)
    refs = {k: torch.cat([f[k] for f in found]).to(tp_device(tp)) for k in ("reference_latents", "condition_latents",
            "image_embeds", "image_latents", "first_frame_latents", "pose_latents", "face_pixel_values")
            if all(k in f for f in found)}  # and an I2V model's encodings of the first frame: its image embedding,
    # I2VGen-XL's image latents, HunyuanVideo I2V's; Wan Animate's pose latents and face video
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
    """What a sample's cached latents depend on: its file (:func:`~.cache.sample_parts`) and, where the denoiser takes
    conditioning channels or an image embedding, the builder or pipeline method that made them and the seed its mask
    or noise was drawn with: another builder, method or seed is another conditioning, encoded again."""
    from ...training.encode import condition_key
    from .draws import DRAWS, drawn

    made = (*condition_key(run.tp), *(("draws", DRAWS) if drawn(run.tp) else ()))
    return (*sample_parts(run.data.samples[i]), *made, run.settings.seed) if made else sample_parts(run.data.samples[i])


def _prompt_image(run: Run, i: int) -> Any:
    """The picture the pipeline encodes sample ``i``'s prompt with, else None: its reference image (Qwen-Image Edit:
    its __call__ passes the reference to encode_prompt) or, where encode_prompt needs an image and the data gives no
    reference, the clip's first frame, the picture an image-to-video __call__ is given and encodes the prompt with
    (HunyuanVideo I2V, pipeline_hunyuan_video_image2video.py:831-839): the denoiser then sees the conditioning it
    gets at inference."""
    if not _prompt_image_used(run, i):
        return None
    if run.data.samples[i].reference is not None:
        return run.data.reference_image(i)
    from ...training.image_embeds import pil_frames

    return pil_frames(run.data.pixels([i]))[0]


def _text_key(run: Run, i: int) -> tuple[Any, ...]:
    """What a sample's cached conditioning depends on: its caption, and the picture the prompt is encoded with where
    it is (a reference's file and bucket; else the sample's own file and bucket, its first frame): one caption over
    two such pictures is two conditionings."""
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
    """The conditioning of samples ``indices``: their captions in one call, or, where the prompt is encoded with
    each sample's reference, one call per sample (QwenImageEditPlusPipeline reads a list of images as pictures of
    every prompt, not one per prompt), joined as the cache joins them; none where the pipeline has no encode_prompt
    (SVD: its denoiser's conditioning is the first frame's image embedding, made with the latents)."""
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
    """The tensors of one caption's conditioning, as the cache stores them: a list of tensors (Z-Image's unpadded
    prompt, one per caption) as its items ``KEY.0``, ``KEY.1``, ...; other values are not stored."""
    import torch

    out = {k: v for k, v in cond.items() if torch.is_tensor(v)}
    for k, v in cond.items():
        if isinstance(v, (list, tuple)) and v and all(torch.is_tensor(t) for t in v):
            out.update({f"{k}.{i}": t for i, t in enumerate(v)})
    return out


def _from_cache(texts: list[dict[str, Any]], masks: tuple[str, ...] = ()) -> dict[str, Any]:
    """A batch's conditioning from its captions' cache entries (:func:`_cacheable`): tensors joined on the batch axis,
    ``KEY.i`` items back into one list per key, in caption order; captions of other lengths padded under ``masks``
    (:func:`~.cache.join_padded`)."""
    import re

    items: dict[str, list[Any]] = {}
    for entry in texts:
        for k in sorted((k for k in entry if re.fullmatch(r".+\.\d+", k)), key=lambda k: int(k.rsplit(".", 1)[1])):
            items.setdefault(k.rsplit(".", 1)[0], []).append(entry[k])
    plain = [k for k in texts[0] if not re.fullmatch(r".+\.\d+", k)]
    return {**join_padded(texts, plain, list(masks)), **items}


def _sample_latents(run: Run, i: int, count: int | None = None) -> dict[str, Any]:
    """Sample ``i``'s latents (and its reference image's, in an edit dataset, by the same VAE path; and the
    conditioning channels its denoiser takes, built from the sample as the pipeline builds them), drawn from the
    VAE's distribution under the sample's own seed in a forked RNG: what the cache holds and what ``--no-cache``
    encodes are the same, whatever batch or process the sample is in. ``count``: how many of a per-step condition's
    draws to make (:mod:`.draws`; all by default)."""
    import torch

    from .draws import DRAWS, drawn, encode_draws

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(run.settings.seed * 1_000_003 + i)
        pixels = run.data.pixels([i])
        out = {"latents": run.tp.encode_images(pixels)}
        if drawn(run.tp):  # an inpainting mask: several draws, one picked per step (.draws)
            out.update(encode_draws(run.tp, pixels, out["latents"], count or DRAWS))
        else:  # Wan Animate's conditioning comes from the clip's reference, pose and face videos (and hands back
            # the latents with the reference's frame first: training.inputs.wan_animate_reference)
            out.update(run.tp.encode_condition(pixels, out["latents"], **run.data.animate_inputs(i)))
        # a first-frame edit model's reference is already its clip's first frame (references.edit_clip)
        reference = None if run.data.frames else run.data.reference_pixels([i])
        if reference is not None:
            out["reference_latents"] = run.tp.encode_images(reference)
        return out


def fill_cache(run: Run) -> None:
    """Encode every sample once before the first step (main process writes; the others wait and read).

    Each sample is encoded under its own seed in a forked RNG, so the latents do not depend on batch order or on
    whether the cache existed, and the training RNG is untouched: a resumed run reads what the first run wrote and
    draws the same noise. Frozen encoders then leave the accelerator until validation needs them.
    """
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
