"""Fixtures that ship: tiny and mid-size random-weight pipelines built from configs, offline.

Used by the demo, the video demo, doctests and the test suite (like torchao's ``testing/`` and accelerate's
``test_utils/``): fixtures, not the core API. Names are bound lazily."""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {name: "pipelines" for name in (
    "CLIP_VOCAB_MERGES", "DIT_SIZES", "KINDS", "PIXART_SIZES", "SD15_SIZES", "SDXL_SIZES",
    "SVD_SIZES", "count_parameters", "example_call_kwargs", "example_img2img_kwargs", "make_dit", "make_overflowing_vae", "make_pipeline",
    "make_pixart", "make_sd15", "make_sdxl", "make_svd", "make_t5_tokenizer", "make_tokenizer",
    "save_pipeline",
)}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
