"""Fixtures that ship: tiny and mid-size random-weight pipelines built from configs, offline.

For the demo, doctests and the suite (like torchao's ``testing/``, accelerate's ``test_utils/``), not the core API.
Every tiny pipeline is a row of ``PIPELINES`` (``registry``), read from ``tiny/*.yaml`` on first use; names are
bound lazily.
"""

from __future__ import annotations

from ..lazy import face

_EXPORTS = {
    **{name: "registry" for name in ("PIPELINES", "TinyPipeline", "make_pipeline", "select", "tiny_pipelines")},
    **{name: "pipelines" for name in ("count_parameters", "example_call_kwargs", "example_img2img_kwargs", "make_dit",
                                      "make_overflowing_vae", "make_pixart", "make_sd15", "make_sdxl", "make_svd",
                                      "save_pipeline")},
    **{name: "tokenizers" for name in ("CLIP_VOCAB_MERGES", "make_bert_tokenizer", "make_gemma_tokenizer",
                                       "make_llama_tokenizer", "make_qwen2_tokenizer", "make_t5_tokenizer",
                                       "make_tokenizer")},
    **{name: "parts" for name in ("example_image", "finish_pipeline")},
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = face(__name__, _EXPORTS)
