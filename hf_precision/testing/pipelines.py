"""Random-weight diffusers pipelines built from configs (no Hub, no weights).

For tests, the demo, scripts and benchmarks. Every builder works offline, builds in float32 and is
deterministic given ``seed`` (``torch.manual_seed(seed)`` before each component). ``size`` is a preset
name (``"tiny"``, ``"mid"``) or a dict of per-component config overrides merged over a preset::

    >>> from hf_precision.testing.pipelines import make_pipeline, example_call_kwargs
    >>> pipe = make_pipeline("sdxl")                       # 115,931 parameters
    >>> image = pipe(**example_call_kwargs("sdxl")).images  # 32x32, 2 steps, ~50 ms on CPU

The ``"tiny"`` presets are the smallest configs that still run every module (see
``docs/facts.md#f12-the-tiny-test-pipelines-run-every-module``). ``"mid"`` presets keep the real block structure (SDXL UNet
with 3 levels and 1/2/5 transformer layers, SVD UNet with 4 levels) at about 287M (SDXL) / 169M (SVD)
parameters, for memory and speed measurements; call them with ``example_call_kwargs(kind, size="mid")``
(64x64 images).

Nothing heavy is imported at module import time: torch, diffusers and transformers are imported
inside the functions.
"""

from __future__ import annotations

import copy
import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Mapping

__all__ = [
    "CLIP_VOCAB_MERGES",
    "DIT_SIZES",
    "KINDS",
    "PIXART_SIZES",
    "finish_pipeline",
    "SD15_SIZES",
    "SDXL_SIZES",
    "SVD_SIZES",
    "count_parameters",
    "example_call_kwargs",
    "example_img2img_kwargs",
    "make_dit",
    "make_overflowing_vae",
    "make_pipeline",
    "make_pixart",
    "make_sd15",
    "make_sdxl",
    "make_svd",
    "make_t5_tokenizer",
    "make_tokenizer",
    "save_pipeline",
]

KINDS = ("sdxl", "svd", "pixart", "dit", "sd15")

# ---------------------------------------------------------------------------------------------
# Size presets (plain data). Keys are pipeline component names; values are config kwargs.
# ---------------------------------------------------------------------------------------------

_CLIP_TEXT_TINY = {
    "hidden_size": 8,
    "intermediate_size": 16,
    "num_attention_heads": 2,
    "num_hidden_layers": 2,  # SDXL reads hidden_states[-2]: two layers run a real layer
    "vocab_size": 99,
    "max_position_embeddings": 77,
    "projection_dim": 8,
    "bos_token_id": 0,
    "eos_token_id": 1,
    "pad_token_id": 1,
}

_VAE_TINY = {
    "block_out_channels": [8, 16],
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
    "up_block_types": ["UpDecoderBlock2D", "UpDecoderBlock2D"],
    "norm_num_groups": 4,
    "layers_per_block": 1,
    "latent_channels": 4,
    "mid_block_add_attention": True,
    "force_upcast": True,
    "sample_size": 32,
}

_VAE_MID = {
    "block_out_channels": [64, 128, 256, 256],
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "norm_num_groups": 32,
    "layers_per_block": 2,
    "latent_channels": 4,
    "mid_block_add_attention": True,
    "force_upcast": True,
    "sample_size": 256,
    "scaling_factor": 0.13025,
}

_EULER = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "steps_offset": 1,
    "timestep_spacing": "leading",
}

_SVD_EULER = {
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "interpolation_type": "linear",
    "num_train_timesteps": 1000,
    "prediction_type": "v_prediction",
    "sigma_max": 700.0,
    "sigma_min": 0.002,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "timestep_type": "continuous",
    "use_karras_sigmas": True,
}

SDXL_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "text_encoder": dict(_CLIP_TEXT_TINY),
        "text_encoder_2": dict(_CLIP_TEXT_TINY),
        "unet": {
            "block_out_channels": [8, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D"],
            "up_block_types": ["CrossAttnUpBlock2D", "UpBlock2D"],
            "attention_head_dim": [2, 2],
            "use_linear_projection": True,
            "transformer_layers_per_block": [1, 1],
            "addition_embed_type": "text_time",
            "addition_time_embed_dim": 4,
            # derived when not given: te2.projection_dim + 6 * addition_time_embed_dim
            "projection_class_embeddings_input_dim": 32,
            # derived when not given: te1.hidden_size + te2.hidden_size
            "cross_attention_dim": 16,
            "sample_size": 16,
            "in_channels": 4,
            "out_channels": 4,
        },
        "vae": dict(_VAE_TINY),
        "scheduler": dict(_EULER),
    },
    "mid": {
        "text_encoder": {
            "hidden_size": 256,
            "intermediate_size": 1024,
            "num_attention_heads": 4,
            "num_hidden_layers": 4,
            "vocab_size": 1000,
            "max_position_embeddings": 77,
            "projection_dim": 256,
            "hidden_act": "quick_gelu",
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        "text_encoder_2": {
            "hidden_size": 512,
            "intermediate_size": 2048,
            "num_attention_heads": 8,
            "num_hidden_layers": 6,
            "vocab_size": 1000,
            "max_position_embeddings": 77,
            "projection_dim": 512,
            "hidden_act": "gelu",
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        "unet": {
            # SDXL-base structure (3 levels, 1/2/5 transformer layers, head dim 32) at 0.4x width
            "block_out_channels": [128, 256, 512],
            "layers_per_block": 2,
            "norm_num_groups": 32,
            "down_block_types": ["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"],
            "up_block_types": ["CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
            "attention_head_dim": [4, 8, 16],
            "use_linear_projection": True,
            "transformer_layers_per_block": [1, 2, 5],
            "addition_embed_type": "text_time",
            "addition_time_embed_dim": 128,
            "projection_class_embeddings_input_dim": 512 + 6 * 128,
            "cross_attention_dim": 256 + 512,
            "sample_size": 32,
            "in_channels": 4,
            "out_channels": 4,
        },
        "vae": dict(_VAE_MID),
        "scheduler": dict(_EULER),
    },
}

SD15_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "text_encoder": dict(_CLIP_TEXT_TINY),
        "unet": {
            "block_out_channels": [8, 16],
            "layers_per_block": 1,
            "norm_num_groups": 4,
            "down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"],
            "up_block_types": ["UpBlock2D", "CrossAttnUpBlock2D"],
            "attention_head_dim": 2,
            "cross_attention_dim": 8,  # derived when not given: text_encoder.hidden_size
            "sample_size": 16,
            "in_channels": 4,
            "out_channels": 4,
        },
        "vae": dict(_VAE_TINY),
        "scheduler": dict(_EULER),
    },
    "mid": {
        "text_encoder": {
            "hidden_size": 384,
            "intermediate_size": 1536,
            "num_attention_heads": 6,
            "num_hidden_layers": 6,
            "vocab_size": 1000,
            "max_position_embeddings": 77,
            "projection_dim": 384,
            "bos_token_id": 0,
            "eos_token_id": 1,
            "pad_token_id": 1,
        },
        "unet": {
            "block_out_channels": [128, 256, 512, 512],
            "layers_per_block": 2,
            "norm_num_groups": 32,
            "down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"],
            "up_block_types": ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3,
            "attention_head_dim": 8,
            "cross_attention_dim": 384,
            "sample_size": 32,
            "in_channels": 4,
            "out_channels": 4,
        },
        "vae": dict(_VAE_MID),
        "scheduler": dict(_EULER),
    },
}

SVD_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "image_encoder": {
            "hidden_size": 8,
            "projection_dim": 8,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "image_size": 224,  # the pipeline resizes PIL input to 224x224
            "patch_size": 32,  # 49 patches
            "intermediate_size": 16,
        },
        "unet": {
            "block_out_channels": [32, 32],  # GroupNorm groups are hard-coded to 32
            "layers_per_block": 1,
            "in_channels": 8,
            "out_channels": 4,
            "down_block_types": ["CrossAttnDownBlockSpatioTemporal", "DownBlockSpatioTemporal"],
            "up_block_types": ["UpBlockSpatioTemporal", "CrossAttnUpBlockSpatioTemporal"],
            "cross_attention_dim": 8,  # derived when not given: image_encoder.projection_dim
            "num_attention_heads": [2, 2],
            "addition_time_embed_dim": 4,
            "projection_class_embeddings_input_dim": 12,  # derived: 3 * addition_time_embed_dim
            "sample_size": 16,
        },
        "vae": {
            "block_out_channels": [32, 32],
            "down_block_types": ["DownEncoderBlock2D", "DownEncoderBlock2D"],
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            # layers_per_block=1 would skip the temporal decoder mid-block attention
            "layers_per_block": 2,
            "force_upcast": True,
            "sample_size": 32,
        },
        "scheduler": dict(_SVD_EULER),
        "feature_extractor": {"crop_size": 224, "size": {"shortest_edge": 224}},
    },
    "mid": {
        "image_encoder": {
            "hidden_size": 256,
            "projection_dim": 512,
            "num_hidden_layers": 4,
            "num_attention_heads": 4,
            "image_size": 224,
            "patch_size": 14,
            "intermediate_size": 1024,
            "hidden_act": "gelu",
        },
        "unet": {
            # SVD structure (4 levels, temporal blocks) at 0.3x width
            "block_out_channels": [96, 192, 384, 384],
            "layers_per_block": 2,
            "in_channels": 8,
            "out_channels": 4,
            "down_block_types": ["CrossAttnDownBlockSpatioTemporal"] * 3 + ["DownBlockSpatioTemporal"],
            "up_block_types": ["UpBlockSpatioTemporal"] + ["CrossAttnUpBlockSpatioTemporal"] * 3,
            "cross_attention_dim": 512,
            "num_attention_heads": [3, 6, 12, 12],
            "transformer_layers_per_block": 1,
            "addition_time_embed_dim": 128,
            "projection_class_embeddings_input_dim": 384,
            "sample_size": 32,
        },
        "vae": {
            "block_out_channels": [64, 128, 256, 256],
            "down_block_types": ["DownEncoderBlock2D"] * 4,
            "in_channels": 3,
            "out_channels": 3,
            "latent_channels": 4,
            "layers_per_block": 2,
            "force_upcast": True,
            "sample_size": 256,
            "scaling_factor": 0.18215,
        },
        "scheduler": dict(_SVD_EULER),
        "feature_extractor": {"crop_size": 224, "size": {"shortest_edge": 224}},
    },
}

PIXART_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "text_encoder": {
            "d_model": 32,  # == transformer caption_channels
            "d_kv": 8,
            "d_ff": 37,
            "num_layers": 2,
            "num_heads": 4,
            "relative_attention_num_buckets": 8,
            "dropout_rate": 0.0,
            "feed_forward_proj": "gated-gelu",
            "is_encoder_decoder": False,
            "vocab_size": 200,  # >= the handmade T5 tokenizer's vocabulary
        },
        "transformer": {
            "sample_size": 8,
            "num_layers": 2,
            "patch_size": 2,
            "attention_head_dim": 8,
            "num_attention_heads": 3,
            "caption_channels": 32,
            "cross_attention_dim": 24,
            "in_channels": 4,
            "out_channels": 8,
            "norm_type": "ada_norm_single",
            "num_embeds_ada_norm": 1000,
        },
        "vae": dict(_VAE_TINY),
        "scheduler": {},  # DPMSolverMultistepScheduler defaults
    },
    "mid": {
        "text_encoder": {
            "d_model": 512,
            "d_kv": 64,
            "d_ff": 1024,
            "num_layers": 6,
            "num_heads": 8,
            "relative_attention_num_buckets": 32,
            "dropout_rate": 0.0,
            "feed_forward_proj": "gated-gelu",
            "is_encoder_decoder": False,
            "vocab_size": 1000,
        },
        "transformer": {
            "sample_size": 32,
            "num_layers": 12,
            "patch_size": 2,
            "attention_head_dim": 64,
            "num_attention_heads": 8,
            "caption_channels": 512,
            "cross_attention_dim": 512,
            "in_channels": 4,
            "out_channels": 8,
            "norm_type": "ada_norm_single",
            "num_embeds_ada_norm": 1000,
        },
        "vae": dict(_VAE_MID),
        "scheduler": {},
    },
}

DIT_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "transformer": {
            "sample_size": 8,
            "num_layers": 2,
            "patch_size": 2,
            "attention_head_dim": 8,
            "num_attention_heads": 2,
            "in_channels": 4,
            "out_channels": 8,
            "norm_type": "ada_norm_zero",
            "num_embeds_ada_norm": 1000,
        },
        "vae": dict(_VAE_TINY),
        "scheduler": {},  # DDIMScheduler defaults
    },
    "mid": {
        "transformer": {
            "sample_size": 32,
            "num_layers": 12,
            "patch_size": 2,
            "attention_head_dim": 64,
            "num_attention_heads": 8,
            "in_channels": 4,
            "out_channels": 8,
            "norm_type": "ada_norm_zero",
            "num_embeds_ada_norm": 1000,
        },
        "vae": dict(_VAE_MID),
        "scheduler": {},
    },
}

_SIZES = {"sdxl": SDXL_SIZES, "svd": SVD_SIZES, "pixart": PIXART_SIZES, "dit": DIT_SIZES, "sd15": SD15_SIZES}

# Handmade CLIP BPE: <|startoftext|>, <|endoftext|>, a-z, a-z</w>, digits, punctuation, a few merges.
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_PUNCTUATION = ".,!?'-"
_MERGES = ["a t</w>", "c at</w>", "t h", "th e</w>", "d o", "do g</w>"]
CLIP_VOCAB_MERGES: dict[str, Any] = {
    "vocab": (
        ["<|startoftext|>", "<|endoftext|>"]
        + list(_LETTERS)
        + [c + "</w>" for c in _LETTERS]
        + list("0123456789")
        + list(_PUNCTUATION)
        + [m.replace(" ", "") for m in _MERGES]
    ),
    "merges": _MERGES,
}


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------


def _resolve_size(kind: str, size: str | Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, set]]:
    """Return (config per component, explicitly overridden keys per component)."""
    presets = _SIZES[kind]
    if isinstance(size, str):
        if size not in presets:
            raise ValueError(f"unknown size {size!r} for {kind}; use one of {sorted(presets)} or a dict of overrides")
        return copy.deepcopy(presets[size]), {}
    if not isinstance(size, Mapping):
        raise TypeError(f"size must be a preset name or a dict of overrides, not {type(size).__name__}")
    overrides = dict(size)
    base = overrides.pop("base", "tiny")
    configs, _ = _resolve_size(kind, base)
    explicit: dict[str, set] = {}
    for component, values in overrides.items():
        if component not in configs:
            raise ValueError(f"unknown component {component!r} for {kind}; expected some of {sorted(configs)}")
        if values is None:
            continue
        configs[component] = {**(configs[component] or {}), **values}
        explicit[component] = set(values)
    return configs, explicit


def _derive(configs: dict, explicit: dict, component: str, key: str, value: Any) -> None:
    if key not in explicit.get(component, set()):
        configs[component][key] = value


def count_parameters(pipe) -> dict[str, int]:
    """Parameter count per ``nn.Module`` component plus ``"total"``.

    >>> count_parameters(make_sdxl())["total"]
    115931
    """
    import torch

    counts = {}
    for name, component in pipe.components.items():
        if isinstance(component, torch.nn.Module):
            counts[name] = sum(p.numel() for p in component.parameters())
    counts["total"] = sum(counts.values())
    return counts


def _seeded(seed: int, build: Callable[[], Any]) -> Any:
    """Build one component from a fixed seed, so each component's weights do not depend on the others'."""
    import torch

    torch.manual_seed(seed)
    return build()


def make_tokenizer(folder: str | Path | None = None):
    """A handmade CLIP BPE tokenizer (76 tokens, ``model_max_length=77``), built offline.

    ``vocab.json`` and ``merges.txt`` are written to ``folder`` (a temporary directory when None) and
    loaded with ``CLIPTokenizer.from_pretrained``. Unknown characters map to ``<|endoftext|>``.

    >>> tok = make_tokenizer()
    >>> tok("a cat").input_ids  # <|startoftext|> a</w> cat</w> <|endoftext|>
    [0, 28, 71, 1]
    """
    from transformers import CLIPTokenizer

    vocab = {token: i for i, token in enumerate(CLIP_VOCAB_MERGES["vocab"])}
    merges = "#version: 0.2\n" + "\n".join(CLIP_VOCAB_MERGES["merges"]) + "\n"

    def _write_and_load(path: Path):
        path.mkdir(parents=True, exist_ok=True)
        (path / "vocab.json").write_text(json.dumps(vocab), encoding="utf-8")
        (path / "merges.txt").write_text(merges, encoding="utf-8")
        return CLIPTokenizer.from_pretrained(str(path), model_max_length=77)

    if folder is not None:
        return _write_and_load(Path(folder))
    with tempfile.TemporaryDirectory(prefix="hf_precision_tok_") as tmp:
        return _write_and_load(Path(tmp))


def make_t5_tokenizer():
    """A handmade T5 tokenizer (Unigram over single characters and a few words), built offline.

    No sentencepiece model is needed: transformers 5 builds ``T5Tokenizer`` from a list of
    ``(piece, score)`` pairs. Ids: ``<pad>=0, </s>=1, <unk>=2``; 10 ``<extra_id_*>`` sentinels.

    >>> make_t5_tokenizer()("a cat").input_ids[-1]
    1
    """
    from transformers import T5Tokenizer

    pieces = [("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), ("\u2581", -2.0)]
    pieces += [(c, -5.0) for c in _LETTERS + "0123456789" + _PUNCTUATION]
    pieces += [("\u2581" + c, -4.0) for c in _LETTERS]
    pieces += [(w, -1.0) for w in ("\u2581a", "\u2581cat", "\u2581dog", "\u2581the", "\u2581photo", "\u2581of")]
    seen: set = set()
    vocab = []
    for piece, score in pieces:
        if piece not in seen:
            seen.add(piece)
            vocab.append((piece, score))
    extra_ids = 10
    vocab += [(f"<extra_id_{i}>", 0.0) for i in range(extra_ids - 1, -1, -1)]
    return T5Tokenizer(vocab=vocab, extra_ids=extra_ids, model_max_length=512)


# ---------------------------------------------------------------------------------------------
# Builders
# ---------------------------------------------------------------------------------------------


def make_sdxl(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableDiffusionXLPipeline`` in float32 (tiny: 115,931 parameters).

    >>> pipe = make_sdxl()
    >>> pipe(**example_call_kwargs("sdxl")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionXLPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    configs, explicit = _resolve_size("sdxl", size)
    te1, te2 = configs["text_encoder"], configs["text_encoder_2"]
    time_dim = configs["unet"]["addition_time_embed_dim"]
    _derive(configs, explicit, "unet", "cross_attention_dim", te1["hidden_size"] + te2["hidden_size"])
    _derive(configs, explicit, "unet", "projection_class_embeddings_input_dim", te2["projection_dim"] + 6 * time_dim)

    unet = _seeded(seed, lambda: UNet2DConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(**te1)))
    text_encoder_2 = _seeded(seed, lambda: CLIPTextModelWithProjection(CLIPTextConfig(**te2)))
    scheduler = EulerDiscreteScheduler(**configs["scheduler"])
    pipe = StableDiffusionXLPipeline(
        vae=vae,
        text_encoder=text_encoder,
        text_encoder_2=text_encoder_2,
        tokenizer=make_tokenizer(),
        tokenizer_2=make_tokenizer(),
        unet=unet,
        scheduler=scheduler,
        image_encoder=None,
        feature_extractor=None,
    )
    return finish_pipeline(pipe)


def make_sd15(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableDiffusionPipeline`` in float32 (no safety checker).

    >>> pipe = make_sd15()
    >>> pipe(**example_call_kwargs("sd15")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, EulerDiscreteScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    configs, explicit = _resolve_size("sd15", size)
    _derive(configs, explicit, "unet", "cross_attention_dim", configs["text_encoder"]["hidden_size"])

    unet = _seeded(seed, lambda: UNet2DConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(**configs["text_encoder"])))
    pipe = StableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=make_tokenizer(),
        unet=unet,
        scheduler=EulerDiscreteScheduler(**configs["scheduler"]),
        safety_checker=None,
        feature_extractor=None,
        image_encoder=None,
        requires_safety_checker=False,
    )
    return finish_pipeline(pipe)


def make_svd(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``StableVideoDiffusionPipeline`` in float32 (tiny: 990,393 parameters).

    >>> pipe = make_svd()
    >>> pipe(**example_call_kwargs("svd")).frames.shape
    (1, 2, 32, 32, 3)
    """
    import warnings

    from diffusers import (
        AutoencoderKLTemporalDecoder,
        EulerDiscreteScheduler,
        StableVideoDiffusionPipeline,
        UNetSpatioTemporalConditionModel,
    )
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    configs, explicit = _resolve_size("svd", size)
    time_dim = configs["unet"]["addition_time_embed_dim"]
    _derive(configs, explicit, "unet", "cross_attention_dim", configs["image_encoder"]["projection_dim"])
    _derive(configs, explicit, "unet", "projection_class_embeddings_input_dim", 3 * time_dim)

    unet = _seeded(seed, lambda: UNetSpatioTemporalConditionModel(**configs["unet"]))
    vae = _seeded(seed, lambda: AutoencoderKLTemporalDecoder(**configs["vae"]))
    image_encoder = _seeded(seed, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(**configs["image_encoder"])))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torchvision not available, falling back to the PIL processor"
        feature_extractor = CLIPImageProcessor(**configs["feature_extractor"])
    pipe = StableVideoDiffusionPipeline(
        vae=vae,
        image_encoder=image_encoder,
        unet=unet,
        scheduler=EulerDiscreteScheduler(**configs["scheduler"]),
        feature_extractor=feature_extractor,
    )
    return finish_pipeline(pipe)


def make_pixart(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``PixArtAlphaPipeline`` in float32 (tiny T5 encoder + handmade T5 tokenizer).

    >>> pipe = make_pixart()
    >>> pipe(**example_call_kwargs("pixart")).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, DPMSolverMultistepScheduler, PixArtAlphaPipeline, PixArtTransformer2DModel
    from transformers import T5Config, T5EncoderModel

    configs, explicit = _resolve_size("pixart", size)
    tokenizer = make_t5_tokenizer()
    _derive(configs, explicit, "transformer", "caption_channels", configs["text_encoder"]["d_model"])
    configs["text_encoder"]["vocab_size"] = max(configs["text_encoder"]["vocab_size"], len(tokenizer))

    transformer = _seeded(seed, lambda: PixArtTransformer2DModel(**configs["transformer"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    text_encoder = _seeded(seed, lambda: T5EncoderModel(T5Config(**configs["text_encoder"])))
    pipe = PixArtAlphaPipeline(
        tokenizer=tokenizer,
        text_encoder=text_encoder,
        vae=vae,
        transformer=transformer,
        scheduler=DPMSolverMultistepScheduler(**configs["scheduler"]),
    )
    return finish_pipeline(pipe)


def make_dit(size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """A random-weight ``DiTPipeline`` in float32 (class-conditional; 1000 classes).

    >>> pipe = make_dit()
    >>> pipe(**example_call_kwargs("dit")).images.shape
    (1, 16, 16, 3)
    """
    from diffusers import AutoencoderKL, DDIMScheduler, DiTPipeline, DiTTransformer2DModel

    configs, _ = _resolve_size("dit", size)
    transformer = _seeded(seed, lambda: DiTTransformer2DModel(**configs["transformer"]))
    vae = _seeded(seed, lambda: AutoencoderKL(**configs["vae"]))
    pipe = DiTPipeline(transformer=transformer, vae=vae, scheduler=DDIMScheduler(**configs["scheduler"]))
    return finish_pipeline(pipe)


_BUILDERS = {"sdxl": make_sdxl, "svd": make_svd, "pixart": make_pixart, "dit": make_dit, "sd15": make_sd15}


def make_pipeline(kind: str, size: str | Mapping[str, Any] = "tiny", seed: int = 0):
    """Build a random-weight pipeline of ``kind`` (one of ``KINDS``).

    >>> type(make_pipeline("dit")).__name__
    'DiTPipeline'
    """
    if kind not in _BUILDERS:
        raise ValueError(f"unknown pipeline kind {kind!r}; use one of {list(KINDS)}")
    return _BUILDERS[kind](size=size, seed=seed)


def make_overflowing_vae(seed: int = 0, scale: float = 1e5):
    """A tiny ``AutoencoderKL`` whose decoder really overflows float16, plus latents to decode with it.

    ``decoder.conv_in`` (weight and bias) is multiplied by ``scale``, so its output exceeds fp16's maximum
    (65504): the decode is finite in float32 (the GroupNorm that follows normalises the large values) and
    inf/NaN in float16, which is what the NaN guard is for. Returns ``(vae, latents)``; latents are float32.

    >>> import torch
    >>> vae, latents = make_overflowing_vae()
    >>> bool(torch.isfinite(vae.decode(latents).sample).all())
    True
    >>> bool(torch.isfinite(vae.half().decode(latents.half()).sample).all())
    False
    """
    import torch
    from diffusers import AutoencoderKL

    def build():
        vae = AutoencoderKL(block_out_channels=[8, 16], norm_num_groups=4, layers_per_block=1, latent_channels=4,
                            down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                            force_upcast=False)
        with torch.no_grad():
            vae.decoder.conv_in.weight.mul_(scale)
            vae.decoder.conv_in.bias.mul_(scale)
        return vae.eval()

    vae = _seeded(seed, build)
    latents = torch.randn(1, 4, 8, 8, generator=torch.Generator().manual_seed(seed + 1))
    return vae, latents


def finish_pipeline(pipe):
    """Put a freshly built test pipeline in inference form: every model in eval mode, progress bars off.

    Example:
        >>> finish_pipeline(make_sdxl()).unet.training
        False
    """
    for component in pipe.components.values():
        if hasattr(component, "eval") and hasattr(component, "parameters"):
            component.eval()
    pipe.set_progress_bar_config(disable=True)
    return pipe


# ---------------------------------------------------------------------------------------------
# Saving and call kwargs
# ---------------------------------------------------------------------------------------------


def save_pipeline(pipe, folder: str | Path, *, fp16_variant: bool = False) -> Path:
    """Save ``pipe`` with safetensors; with ``fp16_variant`` also write ``*.fp16.safetensors`` files.

    The fp16 files come from a deep copy cast to float16, so ``pipe`` itself is unchanged and the folder
    holds both the float32 default files and the ``variant="fp16"`` files. As on the Hub (SDXL base,
    SVD), the variant save leaves ``"dtype": "float16"`` in the transformers ``config.json`` files, so
    with transformers 5 (default ``dtype="auto"``) a load *without* ``dtype`` gives float16 text/image
    encoders next to a float32 UNet and VAE, with or without ``variant="fp16"`` (row S24).

    >>> import tempfile
    >>> folder = save_pipeline(make_sdxl(), tempfile.mkdtemp(), fp16_variant=True)
    >>> sorted(p.name for p in (folder / "unet").iterdir())
    ['config.json', 'diffusion_pytorch_model.fp16.safetensors', 'diffusion_pytorch_model.safetensors']
    """
    import torch

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    pipe.save_pretrained(str(folder), safe_serialization=True)
    if fp16_variant:
        half = copy.deepcopy(pipe)
        for component in half.components.values():
            if isinstance(component, torch.nn.Module):
                component.to(torch.float16)
        half.save_pretrained(str(folder), safe_serialization=True, variant="fp16")
    return folder


def example_image(size: int = 32, seed: int = 0):
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (size, size, 3), dtype=np.uint8))


def example_call_kwargs(kind: str, *, size: str = "tiny", output_type: str = "np") -> dict[str, Any]:
    """The smallest call kwargs that run a pipeline of ``kind`` fast (no ``generator``: add one).

    ``size="mid"`` uses 64x64 images so that the 4-level SVD UNet gets 8x8 latents.

    >>> import torch
    >>> pipe = make_sdxl()
    >>> out = pipe(**example_call_kwargs("sdxl"), generator=torch.Generator().manual_seed(0))
    >>> out.images.dtype
    dtype('float32')
    """
    side = 32 if size == "tiny" else 64
    if kind in ("sdxl", "sd15"):
        return {
            "prompt": "a cat",
            "height": side,
            "width": side,
            "num_inference_steps": 2,
            "guidance_scale": 5.0,
            "output_type": output_type,
        }
    if kind == "svd":
        return {
            "image": example_image(side),
            "height": side,
            "width": side,
            "num_frames": 2,
            "num_inference_steps": 2,
            "decode_chunk_size": 2,
            "output_type": output_type,
        }
    if kind == "pixart":
        return {
            "prompt": "a cat",
            "height": side,
            "width": side,
            "num_inference_steps": 2,
            "guidance_scale": 4.5,
            "use_resolution_binning": False,
            "clean_caption": False,
            "max_sequence_length": 16,
            "output_type": output_type,
        }
    if kind == "dit":
        return {"class_labels": [1], "num_inference_steps": 2, "guidance_scale": 4.0, "output_type": output_type}
    raise ValueError(f"unknown pipeline kind {kind!r}; use one of {list(KINDS)}")


def example_img2img_kwargs(*, output_type: str = "np") -> dict[str, Any]:
    """Call kwargs for ``StableDiffusionXLImg2ImgPipeline(**make_sdxl().components)``.

    >>> from diffusers import StableDiffusionXLImg2ImgPipeline
    >>> pipe = StableDiffusionXLImg2ImgPipeline(**make_sdxl().components)
    >>> pipe(**example_img2img_kwargs()).images.shape
    (1, 32, 32, 3)
    """
    return {
        "prompt": "a cat",
        "image": example_image(32, seed=1),
        "strength": 0.6,
        "num_inference_steps": 2,
        "guidance_scale": 5.0,
        "output_type": output_type,
    }
