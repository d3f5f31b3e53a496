"""Conditioning that a training script draws anew each step (an inpainting mask), for the cached training program.

diffusers' examples/research_projects/dreambooth_inpaint/train_dreambooth_inpaint.py draws a random mask for every
example of every batch (its ``collate_fn`` calls ``random_mask``) and encodes the masked image in the training loop
(``vae.encode(batch["masked_images"])``); a mask cached with the sample's latents would be one mask for the whole
run. The masked image's latents depend on the mask, so each draw is a VAE encode. Encoding at every step costs a
VAE encoder forward per sample per step and keeps the VAE on the accelerator: for SD 1.5 at 512 px that forward is
1.12 TFLOP against 2.41 TFLOP for the inpainting UNet's forward and backward (torch's FlopCounterMode on the
shipped stable-diffusion-v1-5 configs), nearly half a full fine-tune step again (a LoRA step, without the base
weights' gradients, is cheaper, so its share is larger). So :data:`DRAWS` draws per sample are encoded once, with
the latents (8 VAE encodes per sample before step 1, 8 times the condition's cache), and each step picks one of
them with a generator seeded by (``--seed``, step, sample): a resumed run picks what the uninterrupted one did,
whatever the process count. The price: a sample trains on 8 masks, not a new one each time it is seen.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRAWS", "KEY", "choice", "drawn", "encode_draws", "pick"]

DRAWS = 8  # masks per sample: a sample seen 8 times or fewer never repeats one
KEY = "condition_draws"  # the cache entry: (1, DRAWS, C, h, w), the builder's outputs in draw order


def drawn(tp: Any) -> bool:
    """Whether ``tp``'s denoiser, under its pipeline, takes a condition drawn per step (``condition(drawn=True)``:
    ``inpaint_mask``, ``fill_mask``)."""
    from ...training.denoiser_rows import condition_made, row_of
    from ...training.inputs import DRAWN

    module = tp._denoiser()
    return condition_made(row_of(module), module, tp.pipe) in DRAWN


def encode_draws(tp: Any, pixels: Any, latents: Any, count: int = DRAWS) -> dict[str, Any]:
    """The first ``count`` of a sample's :data:`DRAWS` conditionings, in the order the RNG draws them (the caller
    seeds it per sample; ``--no-cache`` makes only those up to the step's pick): ``{KEY: (1, count, ...)}`` beside
    what the first one gives besides the condition latents."""
    import torch

    made = [tp.encode_condition(pixels, latents) for _ in range(count)]
    rest = {k: v for k, v in made[0].items() if k != "condition_latents"}
    return {**rest, KEY: torch.stack([m["condition_latents"] for m in made], dim=1)}


def pick(found: list[dict[str, Any]], indices: list[int], seed: int, step: int | None) -> Any:
    """The batch's ``condition_latents``: for each sample, the draw a generator seeded by (seed, step, sample index)
    picks; draw 0 where ``step`` is None (the fixed evaluation batch).

    Example:
        >>> import torch
        >>> found = [{KEY: torch.arange(DRAWS).view(1, DRAWS, 1)} for _ in range(2)]
        >>> pick(found, [0, 1], 0, None).flatten().tolist()
        [0, 0]
        >>> torch.equal(pick(found, [0, 1], 0, 5), pick(found, [0, 1], 0, 5))
        True
    """
    import torch

    return torch.cat([f[KEY][:, choice(seed, step, i)] for f, i in zip(found, indices)])


def choice(seed: int, step: int | None, i: int) -> int:
    """Which of sample ``i``'s draws step ``step`` trains on: a generator seeded by (seed, step, i), draw 0 for the
    evaluation batch (``step`` None).

    Example:
        >>> choice(0, None, 3), choice(0, 7, 3) == choice(0, 7, 3), 0 <= choice(1, 2, 3) < DRAWS
        (0, True, True)
    """
    import numpy as np

    return 0 if step is None else int(np.random.default_rng([seed, step, i]).integers(DRAWS))
