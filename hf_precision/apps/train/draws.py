"""Conditioning that a training script draws anew each step (an inpainting mask), for the cached training program.

diffusers' examples/research_projects/dreambooth_inpaint/train_dreambooth_inpaint.py draws a random mask for every
example (``collate_fn`` calls ``random_mask``) and encodes the masked image in the loop; one cached mask would be one
mask for the whole run. Encoding every step costs a VAE forward per sample (SD 1.5 at 512 px: 1.12 TFLOP against
2.41 for the inpainting UNet's forward and backward, torch's FlopCounterMode on the shipped configs). So
:data:`DRAWS` draws per sample are encoded once with the latents, and each step picks one with a generator seeded by
(``--seed``, step, sample), which a resumed run repeats at any process count. The price: 8 masks per sample.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DRAWS", "KEY", "choice", "drawn", "encode_draws", "pick"]

DRAWS = 8  # masks per sample: a sample seen 8 times or fewer never repeats one
KEY = "condition_draws"  # the cache entry: (1, DRAWS, C, h, w), the builder's outputs in draw order


def drawn(tp: Any) -> bool:
    """Whether ``tp``'s denoiser takes a condition drawn per step (``condition(drawn=True)``: ``inpaint_mask``)."""
    from ...training.denoiser_rows import condition_made, row_of
    from ...training.inputs import DRAWN

    module = tp._denoiser()
    return condition_made(row_of(module), module, tp.pipe) in DRAWN


def encode_draws(tp: Any, pixels: Any, latents: Any, count: int = DRAWS) -> dict[str, Any]:
    """The first ``count`` of a sample's draws in RNG order, as ``{KEY: (1, count, ...)}`` and the first's rest."""
    import torch

    made = [tp.encode_condition(pixels, latents) for _ in range(count)]
    rest = {k: v for k, v in made[0].items() if k != "condition_latents"}
    return {**rest, KEY: torch.stack([m["condition_latents"] for m in made], dim=1)}


def pick(found: list[dict[str, Any]], indices: list[int], seed: int, step: int | None) -> Any:
    """The batch's ``condition_latents``: each sample's draw by :func:`choice`.

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
    """Which of sample ``i``'s draws step ``step`` trains on (seeded by (seed, step, i)); 0 when ``step`` is None.

    Example:
        >>> choice(0, None, 3), choice(0, 7, 3) == choice(0, 7, 3), 0 <= choice(1, 2, 3) < DRAWS
        (0, True, True)
    """
    import numpy as np

    return 0 if step is None else int(np.random.default_rng([seed, step, i]).integers(DRAWS))
