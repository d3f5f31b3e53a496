"""The latent frame counts a video pipeline's call makes: its recipe's ``refused_latent_frames`` (Kandinsky 5 I2V
writes NaN frames for 2 to 4) stepped past, in one place for the video program and check. Torch-free.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

__all__ = ["nearest_latent_frames"]


def nearest_latent_frames(latent: int, refused: Iterable[int]) -> tuple[int | None, int]:
    """The latent frame counts nearest ``latent`` that a call makes, ``refused`` skipped: the largest below (None if
    none is left) and the smallest above (a VAE compressing time by ``t`` makes ``t*(n-1) + 1`` frames of ``n``).

    Example:
        >>> nearest_latent_frames(3, [1, 2, 3, 4])  # Kandinsky 5 I2V asked for 9 frames (3 latent): only 17 above
        (None, 5)
        >>> nearest_latent_frames(1, [])  # the fewest above one latent frame: check's default call for most models
        (None, 2)
        >>> nearest_latent_frames(6, [2, 5])
        (4, 7)
    """
    refused = set(refused)
    below = next((n for n in range(latent - 1, 0, -1) if n not in refused), None)
    above = next(n for n in itertools.count(latent + 1) if n not in refused)
    return below, above
