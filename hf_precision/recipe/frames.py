"""The latent frame counts a video pipeline's call makes, as its recipe says: the ``video:`` block's
``refused_latent_frames`` (Kandinsky 5 I2V's call writes NaN frames for 2 to 4 latent frames) stepped past. Torch-free.

The one place both the video program (the fix its frame check offers, the size a sweep asks) and check's default call
(the fewest frames it runs) step past refused counts, so the two cannot disagree on which count a call makes.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable

__all__ = ["nearest_latent_frames"]


def nearest_latent_frames(latent: int, refused: Iterable[int]) -> tuple[int | None, int]:
    """The latent frame counts nearest ``latent`` that a call makes, skipping the ``refused`` ones (a recipe's
    ``video.refused_latent_frames``): the largest below it (None when no count of at least 1 is left there) and the
    smallest above it. A VAE that compresses time by ``t`` and keeps the first frame turns latent count ``n`` into
    ``t*(n-1) + 1`` frames.

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
