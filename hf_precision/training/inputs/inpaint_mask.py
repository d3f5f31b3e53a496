"""SD 1.5 / SDXL inpainting UNets' 5 extra channels: the mask resized to the latents and the masked image's latents,
as pipeline_stable_diffusion_inpaint.py / pipeline_stable_diffusion_xl_inpaint.py ``prepare_mask_latents`` build
them (``masked_image = init_image * (mask < 0.5)``, ``interpolate(mask, latent size)``, VAE latents times
``scaling_factor``); the UNet takes ``cat([latents, mask, masked_image_latents])``. The mask is a random rectangle or
ellipse per sample, as diffusers' examples/research_projects/dreambooth_inpaint/train_dreambooth_inpaint.py:58-79
(``random_mask``) draws it for training. :func:`random_mask` is shared with Flux Fill's builder (:mod:`.fill_mask`).
"""

from __future__ import annotations

from typing import Any

import torch

from .registry import condition


def random_mask(b: int, height: int, width: int, generator: torch.Generator | None = None,
                device: Any = None) -> torch.Tensor:
    """(b, 1, height, width) masks of 1 (repaint) and 0 (keep): per sample a rectangle or an ellipse of random size
    and centre, drawn as train_dreambooth_inpaint.py:58-79 ``random_mask`` draws it (size up to the whole image,
    centre where half the size fits), with torch's generator instead of Python's ``random``.

    Example:
        >>> m = random_mask(2, 16, 8, torch.Generator().manual_seed(0))
        >>> tuple(m.shape), sorted(set(m.flatten().tolist())) <= [0.0, 1.0]
        ((2, 1, 16, 8), True)
    """
    def randint(lo: int, hi: int) -> int:  # inclusive, as random.randint
        return int(torch.randint(lo, hi + 1, (1,), generator=generator))

    ys = torch.arange(height, dtype=torch.float32).view(-1, 1)
    xs = torch.arange(width, dtype=torch.float32).view(1, -1)
    masks = []
    for _ in range(b):
        sw, sh = randint(0, width), randint(0, height)
        cx, cy = randint(sw // 2, width - sw // 2), randint(sh // 2, height - sh // 2)
        x0, x1, y0, y1 = cx - sw // 2, cx + sw // 2, cy - sh // 2, cy + sh // 2
        if randint(0, 1) == 0:  # PIL's rectangle includes both corners
            m = (xs >= x0) & (xs <= x1) & (ys >= y0) & (ys <= y1)
        else:  # the ellipse inscribed in that box
            rx, ry = max((x1 - x0) / 2, 0.5), max((y1 - y0) / 2, 0.5)
            m = ((xs - (x0 + x1) / 2) / rx) ** 2 + ((ys - (y0 + y1) / 2) / ry) ** 2 <= 1
        masks.append(m.float())
    return torch.stack(masks).unsqueeze(1).to(device)


@condition("inpaint_mask", drawn=True)
def _inpaint_mask(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    mask = random_mask(pixels.shape[0], pixels.shape[-2], pixels.shape[-1], generator, pixels.device)
    masked = tp.encode_images(pixels * (mask < 0.5), generator)
    small = torch.nn.functional.interpolate(mask, size=tuple(latents.shape[-2:]))  # nearest, as the pipeline
    return torch.cat([small.to(masked), masked], dim=1)
