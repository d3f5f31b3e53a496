"""The extra inputs a denoiser family's forward needs beside the noisy latents, registered by name; a row's
``extras`` in recipes/denoisers.yaml names them. Each builder is one module here, named by the name it registers
and following its diffusers pipeline (cited in the module): ``sdxl_time_ids``, ``flux_ids``, ``cogvideox``, ...
The registry and the latent layout helpers they share are in :mod:`.registry`, re-exported here.

Condition builders (:data:`CONDITIONS`, registered with :func:`condition`; a row's ``condition`` names one per
pipeline class) make, in the encode phase, the channels a denoiser takes beyond the noisy latents from the training
sample itself: ``inpaint_mask``, ``fill_mask``, ``wan_first_frame``, ``svd_image``, ...

A new family needs at most one more: a module here (found on import), or, in a user's own code, a function
registered with :func:`builder` before the denoisers file naming it is read.

Example:
    >>> from hf_precision.training import inputs
    >>> {"sdxl_time_ids", "flux_ids", "guidance"} <= set(inputs.BUILDERS)
    True
    >>> inputs.BUILDERS["flux_ids"].__module__
    'hf_precision.training.inputs.flux_ids'
"""

from __future__ import annotations

import importlib
import pkgutil

from .registry import (BUILDERS, CONDITIONS, DRAWN, ZEROS, Builder, Condition, builder, channel_dim, condition,
                       frozen_dtype, model_layout, optional_inputs, reference_latents)

__all__ = ["BUILDERS", "Builder", "CONDITIONS", "Condition", "DRAWN", "ZEROS", "builder", "condition", "channel_dim", "frozen_dtype",
           "model_layout", "optional_inputs", "reference_latents"]

# Registration is complete once this package is imported: whoever reads BUILDERS (the rows' check, the loss) sees
# every shipped builder, and a new builder module is picked up without an edit here.
for _module in pkgutil.iter_modules(__path__):
    if _module.name != "registry":
        importlib.import_module(f"{__name__}.{_module.name}")
