"""Size presets of the five core tiny pipelines (plain data), and how a ``size`` argument picks one.

Keys are pipeline component names; values are config kwargs. ``"tiny"`` is the smallest config that still runs
every module (``docs/facts.md#f12-the-tiny-test-pipelines-run-every-module``); ``"mid"`` keeps the real block
structure for memory and speed measurements. A dict ``size`` is merged over a preset (``"base"``, default tiny)::

    >>> configs, explicit = resolve_size("sdxl", {"unet": {"in_channels": 9}})
    >>> configs["unet"]["in_channels"], explicit
    (9, {'unet': {'in_channels'}})
"""

from __future__ import annotations

import copy
from typing import Any, Mapping

from .parts import T5_TINY

__all__ = ["DIT_SIZES", "PIXART_SIZES", "SD15_SIZES", "SDXL_SIZES", "SVD_SIZES", "SIZES", "derive", "resolve_size"]

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
        "text_encoder": dict(T5_TINY),  # d_model == transformer caption_channels
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

SIZES = {"sdxl": SDXL_SIZES, "svd": SVD_SIZES, "pixart": PIXART_SIZES, "dit": DIT_SIZES, "sd15": SD15_SIZES}


def resolve_size(kind: str, size: str | Mapping[str, Any]) -> tuple[dict[str, dict[str, Any]], dict[str, set]]:
    """Return (config per component, explicitly overridden keys per component) for ``kind`` at ``size``."""
    presets = SIZES[kind]
    if isinstance(size, str):
        if size not in presets:
            raise ValueError(f"unknown size {size!r} for {kind}; use one of {sorted(presets)} or a dict of overrides")
        return copy.deepcopy(presets[size]), {}
    if not isinstance(size, Mapping):
        raise TypeError(f"size must be a preset name or a dict of overrides, not {type(size).__name__}")
    overrides = dict(size)
    base = overrides.pop("base", "tiny")
    configs, _ = resolve_size(kind, base)
    explicit: dict[str, set] = {}
    for component, values in overrides.items():
        if component not in configs:
            raise ValueError(f"unknown component {component!r} for {kind}; expected some of {sorted(configs)}")
        if values is None:
            continue
        configs[component] = {**(configs[component] or {}), **values}
        explicit[component] = set(values)
    return configs, explicit


def derive(configs: dict, explicit: dict, component: str, key: str, value: Any) -> None:
    """Set a config value that follows from another component's, unless the caller's ``size`` gave it."""
    if key not in explicit.get(component, set()):
        configs[component][key] = value
