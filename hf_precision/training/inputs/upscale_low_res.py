"""The x4 upscaler's 3 extra channels: the low-resolution image in pixels, at the latents' size, noised to
``noise_level`` by the pipeline's ``low_res_scheduler``, as pipeline_stable_diffusion_upscale.py ``__call__`` builds
it (``noise = randn_tensor(image.shape)``, ``low_res_scheduler.add_noise(image, noise, noise_level)``, default 20:
the class label :mod:`.noise_level` gives the UNet; concatenated after the latents). The low-resolution image is the
sample itself, downscaled (bicubic, antialiased) to the latents' size: the input the pipeline would upscale to it.
"""

from __future__ import annotations

from typing import Any

import torch

from .noise_level import NOISE_LEVEL
from .registry import condition


@condition("upscale_low_res")
def _upscale_low_res(tp: Any, pixels: torch.Tensor, latents: torch.Tensor, generator: Any) -> torch.Tensor:
    low = torch.nn.functional.interpolate(pixels.float(), size=tuple(latents.shape[-2:]), mode="bicubic",
                                          antialias=True, align_corners=False).clamp(-1, 1)
    noise = torch.randn(low.shape, generator=generator, device=low.device, dtype=low.dtype)
    level = torch.tensor([NOISE_LEVEL], dtype=torch.long, device=low.device)
    return tp.pipe.low_res_scheduler.add_noise(low, noise, level)
