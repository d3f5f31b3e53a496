"""The extra inputs a denoiser family's forward needs beside the noisy latents, registered by name (see
:mod:`.registry`)."""

from .registry import BUILDERS, builder, channel_dim, frozen_dtype, model_layout, optional_inputs

__all__ = ["BUILDERS", "builder", "channel_dim", "frozen_dtype", "model_layout", "optional_inputs"]
