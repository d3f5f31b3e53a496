"""Models built from their ``config.json`` on torch's meta device: real module names and shapes, no weights.

The planner counts bytes on them; the loader reads from them which layers a quantization backend will convert.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import RecipeError

if TYPE_CHECKING:
    from torch import nn

__all__ = ["build_on_meta", "quiet"]


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the config warnings diffusers and transformers log while building from a config."""
    import warnings

    from diffusers.utils import logging as dlog
    from transformers.utils import logging as tlog

    levels = dlog.get_verbosity(), tlog.get_verbosity()
    dlog.set_verbosity_error()
    tlog.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        dlog.set_verbosity(levels[0])
        tlog.set_verbosity(levels[1])


def build_on_meta(library: str, class_name: str, config: Mapping[str, Any], dtype: Any = None, *,
                  pipeline: str | None = None) -> nn.Module:
    """Build a model from its config on the meta device: real shapes and module names, no memory for weights.

    Diffusers classes use ``from_config`` (``Transformer2DModel`` dispatches to PixArt's or DiT's); transformers ones
    their config class, with the class ``model_index.json`` names (``pipeline``'s module may be the only one importing
    it: :func:`~hf_precision.runtime.source.component_class`), else ``config.architectures[0]`` (``AutoModel`` would
    build T5's decoder too). Under ``torch.device("meta")`` T5's tied embedding counts once
    (``accelerate.init_empty_weights()`` counts 131,596,288 parameters too many). ``dtype`` casts every floating tensor
    and moves to meta the buffers a legacy ``torch.Tensor([..])`` left on the CPU, without diffusers'
    ``_keep_in_fp32_modules`` warning (a plan that keeps them float32 casts them itself).

    Example:
        >>> import torch
        >>> m = build_on_meta("diffusers", "AutoencoderKL", {"block_out_channels": [8], "norm_num_groups": 4})
        >>> next(m.parameters()).device.type
        'meta'
        >>> next(build_on_meta("diffusers", "AutoencoderKL", {"norm_num_groups": 4}, torch.float16).parameters()).dtype
        torch.float16
    """
    model = _build(library, class_name, config, pipeline)
    if dtype is not None:
        with quiet():
            model.to("meta", dtype)
    return model


# torch.nn.init's in-place fills, which every Linear, Conv and Embedding constructor calls: on meta they fill
# nothing, yet each still runs a Python decomposition of uniform_ / normal_ (torch/_decomp/decompositions.py:3538
# uniform_), a third of a tiny family's `--plan` time. transformers skips its own _init_weights on meta already
# (transformers/modeling_utils.py:3107 init_weights); its tie_weights, which build_on_meta counts on, runs.
INIT_FILLS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
              "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_", "sparse_")


def _unfilled(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    return tensor


@contextlib.contextmanager
def _no_fills() -> Iterator[None]:
    """``torch.nn.init``'s fills left undone while a model is built on meta (restored after, on error too)."""
    from torch.nn import init

    saved = {name: getattr(init, name) for name in INIT_FILLS if hasattr(init, name)}
    for name in saved:
        setattr(init, name, _unfilled)
    try:
        yield
    finally:
        for name, fill in saved.items():
            setattr(init, name, fill)


def _build(library: str, class_name: str, config: Mapping[str, Any], pipeline: str | None) -> nn.Module:
    import torch

    with quiet(), _no_fills():
        if library == "transformers":
            import transformers

            model_type = config.get("model_type")
            if model_type not in transformers.CONFIG_MAPPING:
                raise RecipeError(f"{class_name}: config.json has model_type {model_type!r}, which this transformers "
                                  f"{transformers.__version__} does not know; upgrade transformers")
            conf = transformers.CONFIG_MAPPING[model_type].from_dict(dict(config))
            cls = getattr(transformers, class_name, None)
            if cls is None and getattr(conf, "architectures", None):
                cls = getattr(transformers, conf.architectures[0], None)
            if cls is None:
                raise RecipeError(f"{class_name}: not a transformers class (transformers {transformers.__version__})")
            with torch.device("meta"):
                return cls(conf)
        import diffusers

        from .source import component_class

        cls = component_class(library or "diffusers", class_name, pipeline)
        if cls is None or not hasattr(cls, "from_config"):
            raise RecipeError(f"{class_name}: not a diffusers model class (diffusers {diffusers.__version__}); "
                              f"upgrade diffusers or check model_index.json")
        with torch.device("meta"):
            return cls.from_config(dict(config))
