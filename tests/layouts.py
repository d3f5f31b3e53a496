"""Every dtype layout of the pipeline-level error table (docs/facts.md#f11-layout-table).

One ``Layout`` per row (S1-S27 SDXL, V1-V9 SVD, P1-P5 PixArt, D1-D3 DiT, plus D2b), on the tiny
random pipelines of ``hf_precision.testing``:

* ``overrides`` says the layout in the DESIGN.md override format (``{component: {"dtype": ...,
  "storage": ..., "keep_fp32": [globs]}}``; components not named stay float32). ``keep_fp32`` globs are
  full-match ``fnmatch.fnmatchcase`` patterns over module names relative to the component.
* ``expect`` is None when plain diffusers runs the layout, else a regex of the ``RuntimeError``.
* ``module`` is the innermost module executing when that error is raised (``"unet.time_embedding.linear_1"``).
* ``setup(pipe)`` does what overrides cannot say (force_upcast, ``pipe.to`` sequences, from_pretrained
  loads, layerwise casting, user-supplied tensors). It may return a dict of extra call kwargs
  (S21's prompt embeds, P3's latents). Rows with a setup still carry the closest dtype plan in ``overrides``.

``apply_plain(pipe, layout)`` applies a layout by hand with plain torch/diffusers, no hf_precision.
"""

from __future__ import annotations

import copy
import fnmatch
import re
import tempfile
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

__all__ = ["LAYOUTS", "LAYOUTS_BY_ID", "Layout", "apply_plain", "matched_modules"]


@dataclass(frozen=True)
class Layout:
    """One row of the error table: a dtype layout and what plain diffusers does with it."""

    id: str
    kind: str  # "sdxl" | "svd" | "pixart" | "dit"
    overrides: Mapping[str, Mapping[str, Any]]
    expect: str | None  # regex of the RuntimeError message; None = runs
    module: str | None  # innermost module executing when it fails
    note: str = ""
    setup: Callable[[Any], dict | None] | None = field(default=None, compare=False)


# ---------------------------------------------------------------------------------------------
# Messages (CPU wording, torch 2.13)
# ---------------------------------------------------------------------------------------------


def _linear(got_input: str, got_weight: str) -> str:
    return re.escape(f"mat1 and mat2 must have the same dtype, but got {got_input} and {got_weight}")


def _conv(input_type: str, bias_type: str) -> str:
    return re.escape(f"Input type ({input_type}) and bias type ({bias_type}) should be the same")


F16, BF16, F32 = "float16", "bfloat16", "float32"
TIME = "unet.time_embedding.linear_1"


def _all(dtype: str, *components: str) -> dict[str, dict[str, Any]]:
    return {name: {"dtype": dtype} for name in components}


SDXL_ALL = ("text_encoder", "text_encoder_2", "unet", "vae")
SVD_ALL = ("image_encoder", "unet", "vae")
PIXART_ALL = ("text_encoder", "transformer", "vae")
DIT_ALL = ("transformer", "vae")


# ---------------------------------------------------------------------------------------------
# Setups: what the override format cannot say
# ---------------------------------------------------------------------------------------------


def force_upcast_true(pipe) -> None:
    """``vae.config.force_upcast = True`` (the SDXL/SVD default, set explicitly)."""
    pipe.vae.register_to_config(force_upcast=True)


def force_upcast_false(pipe) -> None:
    """``vae.config.force_upcast = False`` (as in madebyollin/sdxl-vae-fp16-fix)."""
    pipe.vae.register_to_config(force_upcast=False)


def to_fp16_then_vae_fp32(pipe) -> None:
    """What the ``upcast_vae`` deprecation message recommends: ``pipe.to(fp16); pipe.vae.to(fp32)``."""
    import torch

    pipe.to(torch.float16)
    pipe.vae.to(torch.float32)


def te1_layer_norms_fp16(pipe) -> None:
    """fp16 islands inside an fp32 text encoder: every CLIP LayerNorm of ``text_encoder`` in float16."""
    import torch

    for module in pipe.text_encoder.modules():
        if isinstance(module, torch.nn.LayerNorm):
            module.half()


def fp32_prompt_embeds(pipe) -> dict:
    """The user passes float32 ``prompt_embeds``/``pooled_prompt_embeds`` (random, seeded)."""
    import torch

    gen = torch.Generator().manual_seed(0)
    te1, te2 = pipe.text_encoder.config, pipe.text_encoder_2.config
    length = pipe.tokenizer.model_max_length
    return {
        "prompt": None,
        "prompt_embeds": torch.randn(1, length, te1.hidden_size + te2.hidden_size, generator=gen),
        "pooled_prompt_embeds": torch.randn(1, te2.projection_dim, generator=gen),
    }


def _reload(pipe, *, fp16_variant: bool = False, **from_pretrained_kwargs) -> None:
    """Save a float32 copy of ``pipe``, reload it with ``from_pretrained(**kwargs)``, swap the models in."""
    import torch
    from diffusers import DiffusionPipeline

    from hf_precision.testing.pipelines import save_pipeline

    reference = copy.deepcopy(pipe)
    for component in reference.components.values():
        if isinstance(component, torch.nn.Module):
            component.float()
    with tempfile.TemporaryDirectory(prefix="hf_precision_layout_") as folder:
        save_pipeline(reference, folder, fp16_variant=fp16_variant)
        loaded = DiffusionPipeline.from_pretrained(folder, **from_pretrained_kwargs)
    for name, component in loaded.components.items():
        if isinstance(component, torch.nn.Module):
            setattr(pipe, name, component)


def load_unet_fp16_default_fp32(pipe) -> None:
    """``DiffusionPipeline.from_pretrained(folder, dtype={"unet": fp16, "default": fp32})``."""
    import torch

    _reload(pipe, dtype={"unet": torch.float16, "default": torch.float32})


def load_default_bf16_vae_fp32(pipe) -> None:
    """``DiffusionPipeline.from_pretrained(folder, dtype={"default": bf16, "vae": fp32})``."""
    import torch

    _reload(pipe, dtype={"default": torch.bfloat16, "vae": torch.float32})


def load_fp16_variant_without_dtype(pipe) -> None:
    """``DiffusionPipeline.from_pretrained(folder, variant="fp16")`` with no dtype (folder saved Hub-style)."""
    _reload(pipe, fp16_variant=True, variant="fp16")


def unet_layerwise_fp8_compute_fp32(pipe) -> None:
    """``unet.enable_layerwise_casting(storage_dtype=float8_e4m3fn, compute_dtype=float32)``."""
    import torch

    pipe.unet.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.float32)


def unet_layerwise_fp8_compute_bf16(pipe) -> None:
    """``unet.enable_layerwise_casting(storage_dtype=float8_e4m3fn, compute_dtype=bfloat16)`` on an fp32 UNet."""
    import torch

    pipe.unet.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=torch.bfloat16)


def te2_layerwise_bf16_compute_fp32(pipe) -> None:
    """``apply_layerwise_casting(text_encoder_2, storage_dtype=bfloat16, compute_dtype=float32)``."""
    import torch
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(pipe.text_encoder_2, storage_dtype=torch.bfloat16, compute_dtype=torch.float32)


def pixart_bf16_latents(pipe) -> dict:
    """The user passes bfloat16 ``latents`` (shape of a 32x32 call), so only the T5 embeddings are float32."""
    import torch

    side = 32 // pipe.vae_scale_factor
    gen = torch.Generator().manual_seed(0)
    channels = pipe.transformer.config.in_channels
    return {"latents": torch.randn(1, channels, side, side, generator=gen).to(torch.bfloat16)}


def dit_fp16_then_layerwise_compute_fp32(pipe) -> None:
    """DiT loaded in fp16, then ``enable_layerwise_casting(storage_dtype=fp16, compute_dtype=fp32)``."""
    import torch

    pipe.transformer.to(torch.float16)
    pipe.transformer.enable_layerwise_casting(storage_dtype=torch.float16, compute_dtype=torch.float32)


# ---------------------------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------------------------

LAYOUTS: tuple[Layout, ...] = (
    # ----------------------------------------------------------------------------------- SDXL
    Layout("S1", "sdxl", {}, None, None, "all float32"),
    Layout("S2", "sdxl", _all(F16, "unet"), _linear("Float", "Half"), TIME, "unet fp16, rest fp32"),
    Layout("S3", "sdxl", _all(BF16, "unet"), _linear("Float", "BFloat16"), TIME, "unet bf16, rest fp32"),
    Layout(
        "S4", "sdxl", _all(F16, "text_encoder"), None, None,
        "te1 fp16 only: torch.concat promotes, then embeds are cast to text_encoder_2.dtype",
    ),
    Layout("S5", "sdxl", _all(F16, "text_encoder_2"), _linear("Half", "Float"), TIME, "te2 fp16 only"),
    Layout(
        "S6", "sdxl", _all(F16, "unet", "text_encoder", "text_encoder_2"),
        _conv("c10::Half", "float"), "vae.post_quant_conv", "unet+te fp16, vae fp32",
    ),
    Layout(
        "S7", "sdxl", _all(BF16, "unet", "text_encoder", "text_encoder_2"),
        _conv("c10::BFloat16", "float"), "vae.post_quant_conv", "unet+te bf16, vae fp32",
    ),
    Layout("S8", "sdxl", _all(BF16, "vae"), _conv("float", "c10::BFloat16"), "vae.post_quant_conv", "vae bf16"),
    Layout(
        "S9", "sdxl", _all(F16, "vae"), None, None,
        "vae fp16 with force_upcast=True: upcast_vae() (FutureWarning), VAE back to fp16 afterwards",
        setup=force_upcast_true,
    ),
    Layout(
        "S10", "sdxl", _all(F16, "vae"), _conv("float", "c10::Half"), "vae.post_quant_conv",
        "vae fp16 with force_upcast=False", setup=force_upcast_false,
    ),
    Layout("S11", "sdxl", _all(F16, *SDXL_ALL), None, None, "pipe.to(torch.float16) on CPU (force_upcast=True)"),
    Layout("S12", "sdxl", _all(BF16, *SDXL_ALL), None, None, "pipe.to(torch.bfloat16) on CPU"),
    Layout(
        "S13", "sdxl", {**_all(F16, "unet", "text_encoder", "text_encoder_2"), "vae": {"dtype": F32}},
        _conv("c10::Half", "float"), "vae.post_quant_conv",
        "pipe.to(fp16); pipe.vae.to(fp32), as the upcast_vae deprecation message recommends",
        setup=to_fp16_then_vae_fp32,
    ),
    Layout(
        "S14", "sdxl", {**_all(BF16, "unet", "text_encoder", "text_encoder_2"), "vae": {"dtype": F32}},
        _conv("c10::BFloat16", "float"), "vae.post_quant_conv", "bf16 pipeline with vae fp32",
    ),
    Layout(
        "S15", "sdxl",
        {**_all(F16, *SDXL_ALL), "unet": {"dtype": F16, "keep_fp32": ["time_embedding"]}},
        _linear("Half", "Float"), TIME, "fp16 with a unet.time_embedding fp32 island",
    ),
    Layout(
        "S16", "sdxl",
        {**_all(F16, *SDXL_ALL), "unet": {"dtype": F16, "keep_fp32": ["add_embedding"]}},
        _linear("Half", "Float"), "unet.add_embedding.linear_1", "fp16 with a unet.add_embedding fp32 island",
    ),
    Layout(
        "S17", "sdxl",
        {**_all(BF16, *SDXL_ALL), "unet": {"dtype": BF16, "keep_fp32": ["*norm*"]}},
        None, None,
        "bf16 (vae too) with every UNet GroupNorm/LayerNorm fp32 ('*norm*' matches exactly those): "
        "CPU norms accept bf16 input with fp32 parameters",
    ),
    Layout(
        "S18", "sdxl", {},
        re.escape("mixed dtype (CPU): expect parameter to have scalar type of Float"),
        "text_encoder.encoder.layers.0.layer_norm1",
        "te1 fp32 with its LayerNorms fp16 (fp16 islands cannot be said with keep_fp32). transformers 5 "
        "CLIPTextModel has no text_model level: te1 paths are encoder.*, te2 paths text_model.encoder.*",
        setup=te1_layer_norms_fp16,
    ),
    Layout(
        "S19", "sdxl",
        {
            **_all(F16, *SDXL_ALL),
            "text_encoder": {"dtype": F16, "keep_fp32": ["*final_layer_norm"]},
            "text_encoder_2": {"dtype": F16, "keep_fp32": ["*final_layer_norm"]},
        },
        None, None, "fp16 with both CLIP final_layer_norm fp32",
    ),
    Layout(
        "S20", "sdxl",
        {**_all(F16, *SDXL_ALL), "text_encoder_2": {"dtype": F16, "keep_fp32": ["text_projection"]}},
        re.escape("expected m1 and m2 to have the same dtype, but got: c10::Half != float"),
        "text_encoder_2.text_projection", "fp16 with text_encoder_2.text_projection fp32 (Linear without bias)",
    ),
    Layout(
        "S21", "sdxl", _all(F16, *SDXL_ALL), None, None,
        "fp16, user passes fp32 prompt_embeds/pooled_prompt_embeds: embeds are cast to te2 dtype, "
        "pooled is promoted by torch.cat and recast in the UNet",
        setup=fp32_prompt_embeds,
    ),
    Layout(
        "S22", "sdxl", _all(F16, "unet"), _linear("Float", "Half"), TIME,
        "from_pretrained(dtype={'unet': fp16, 'default': fp32})", setup=load_unet_fp16_default_fp32,
    ),
    Layout(
        "S23", "sdxl", _all(BF16, "unet", "text_encoder", "text_encoder_2"),
        _conv("c10::BFloat16", "float"), "vae.post_quant_conv",
        "from_pretrained(dtype={'default': bf16, 'vae': fp32})", setup=load_default_bf16_vae_fp32,
    ),
    Layout(
        "S24", "sdxl", _all(F16, "text_encoder", "text_encoder_2"), _linear("Half", "Float"), TIME,
        "from_pretrained(variant='fp16') without dtype: diffusers models load fp32, transformers ('auto') "
        "follows config.json's dtype=float16 -> te fp16, unet/vae fp32",
        setup=load_fp16_variant_without_dtype,
    ),
    Layout(
        "S25", "sdxl", {"unet": {"dtype": F32, "storage": "float8_e4m3fn"}}, None, None,
        "unet layerwise casting, storage fp8 / compute fp32, in an fp32 pipeline",
        setup=unet_layerwise_fp8_compute_fp32,
    ),
    Layout(
        "S26", "sdxl", {"unet": {"dtype": BF16, "storage": "float8_e4m3fn"}}, _linear("Float", "BFloat16"), TIME,
        "fp32 UNet + layerwise storage fp8 / compute bf16 (weights only are cast, never inputs), te/vae fp32",
        setup=unet_layerwise_fp8_compute_bf16,
    ),
    Layout(
        "S27", "sdxl", {"text_encoder_2": {"dtype": F32, "storage": BF16}}, _linear("BFloat16", "Float"), TIME,
        "te2 layerwise casting storage bf16 / compute fp32: transformers .dtype reports the storage dtype, "
        "so prompt embeds are cast to bf16",
        setup=te2_layerwise_bf16_compute_fp32,
    ),
    # ------------------------------------------------------------------------------------ SVD
    Layout("V1", "svd", {}, None, None, "all float32"),
    Layout("V2", "svd", _all(F16, "unet"), _linear("Float", "Half"), TIME, "unet fp16, image_encoder+vae fp32"),
    Layout("V3", "svd", _all(F16, "image_encoder"), _linear("Half", "Float"), TIME, "image_encoder fp16 only"),
    Layout(
        "V4", "svd", _all(F16, "unet", "image_encoder"), _conv("c10::Half", "float"), "vae.decoder.conv_in",
        "unet+image_encoder fp16, vae fp32",
    ),
    Layout(
        "V5", "svd", _all(F16, "vae"), _conv("float", "c10::Half"), "vae.decoder.conv_in",
        "vae fp16 with force_upcast=True: only the encode step is upcast, decode runs in the VAE's own dtype",
        setup=force_upcast_true,
    ),
    Layout("V6", "svd", _all(BF16, "vae"), _conv("float", "c10::BFloat16"), "vae.decoder.conv_in", "vae bf16"),
    Layout("V7", "svd", _all(F16, *SVD_ALL), None, None, "whole pipeline fp16 (bf16 works too)"),
    Layout(
        "V8", "svd", {**_all(F16, *SVD_ALL), "image_encoder": {"dtype": F32}}, _linear("Float", "Half"), TIME,
        "fp16 but image_encoder fp32",
    ),
    Layout(
        "V9", "svd",
        {**_all(F16, *SVD_ALL), "unet": {"dtype": F16, "keep_fp32": ["time_embedding", "add_embedding"]}},
        _linear("Half", "Float"), TIME, "fp16 with unet time/add embedding fp32",
    ),
    # --------------------------------------------------------------------------------- PixArt
    Layout(
        "P1", "pixart", _all(BF16, *PIXART_ALL), None, None,
        "model == inputs; fp32, bf16 and fp16 all run, this row pins the whole-bf16 case",
    ),
    Layout(
        "P2", "pixart", _all(BF16, "transformer"), _conv("float", "c10::BFloat16"), "transformer.pos_embed.proj",
        "transformer bf16, T5 and vae fp32: latents follow the T5 dtype, so hidden_states arrive fp32",
    ),
    Layout(
        "P3", "pixart", _all(BF16, "transformer", "vae"), _linear("Float", "BFloat16"),
        "transformer.caption_projection.linear_1",
        "transformer bf16, T5 fp32. In the pipeline latents follow the T5 dtype, so a fp32 T5 alone "
        "fails first at pos_embed (P2); the row needs user latents in bf16 (setup) so only "
        "encoder_hidden_states are fp32",
        setup=pixart_bf16_latents,
    ),
    Layout(
        "P4", "pixart",
        {
            **_all(BF16, *PIXART_ALL),
            "transformer": {"dtype": BF16, "keep_fp32": ["pos_embed", "*norm*", "adaln_single"]},
        },
        _conv("c10::BFloat16", "float"), "transformer.pos_embed.proj",
        "bf16 with PixArt's _skip_layerwise_casting_patterns (pos_embed, norm, adaln_single) fp32",
    ),
    Layout(
        "P5", "pixart",
        {**_all(BF16, *PIXART_ALL), "transformer": {"dtype": BF16, "keep_fp32": ["adaln_single"]}},
        _linear("BFloat16", "Float"), "transformer.adaln_single.emb.timestep_embedder.linear_1",
        "bf16 with adaln_single fp32: the activation dtype arrives as hidden_dtype=",
    ),
    # ------------------------------------------------------------------------------------ DiT
    Layout(
        "D1", "dit", _all(F16, *DIT_ALL), None, None,
        "model == input; fp32, fp16 and bf16 all run, this row pins the whole-fp16 case",
    ),
    Layout(
        "D2", "dit", _all(F16, "transformer"), _conv("c10::Half", "float"), "vae.post_quant_conv",
        "DiTPipeline creates latents in transformer.dtype, so an fp16 transformer never sees fp32 input in "
        "the pipeline; the fp16 latents then fail in the fp32 VAE. Called directly with fp32 latents the "
        "transformer fails in transformer.pos_embed.proj ('Input type (float) and bias type (c10::Half)'); "
        "see D2b for a pipeline path to that failure",
    ),
    Layout(
        "D2b", "dit", {"transformer": {"dtype": F32, "storage": F16}}, _conv("float", "c10::Half"),
        "transformer.pos_embed.proj",
        "the model-level D2 failure reached through the pipeline. DiT loaded fp16, then "
        "enable_layerwise_casting(storage fp16, compute fp32): transformer.dtype reports fp32 so latents "
        "are fp32, but the skipped pos_embed/norm modules stay fp16",
        setup=dit_fp16_then_layerwise_compute_fp32,
    ),
    Layout(
        "D3", "dit",
        {**_all(F16, *DIT_ALL), "transformer": {"dtype": F16, "keep_fp32": ["transformer_blocks.*.norm1.emb"]}},
        _linear("Half", "Float"), "transformer.transformer_blocks.0.norm1.emb.timestep_embedder.linear_1",
        "fp16 with per-block norm1.emb fp32 (hidden_dtype= passes fp16)",
    ),
)

LAYOUTS_BY_ID: dict[str, Layout] = {layout.id: layout for layout in LAYOUTS}

_SPEC_KEYS = {"dtype", "storage", "keep_fp32"}


def matched_modules(component, patterns) -> list[str]:
    """Names of ``component``'s modules that fully match any glob in ``patterns`` (fnmatchcase)."""
    return [
        name
        for name, _ in component.named_modules()
        if name and any(fnmatch.fnmatchcase(name, pattern) for pattern in patterns)
    ]


def apply_plain(pipe, layout: Layout) -> dict:
    """Apply ``layout`` to ``pipe`` by hand with plain torch/diffusers; return extra call kwargs.

    For each component in ``overrides``: ``component.to(dtype)``, then ``module.float()`` on every module
    matched by a ``keep_fp32`` glob; then ``layout.setup(pipe)``. A component whose ``storage`` differs
    from its ``dtype`` is NOT cast here: its setup applies layerwise casting to the float32 weights, as
    plain diffusers does.
    """
    import torch

    for name, spec in layout.overrides.items():
        unknown = set(spec) - _SPEC_KEYS
        if unknown:
            raise ValueError(f"{layout.id}: {name}: unknown key(s) {sorted(unknown)}")
        component = getattr(pipe, name)
        dtype = spec.get("dtype", F32)
        if spec.get("storage", dtype) == dtype:
            component.to(getattr(torch, dtype))
        patterns = spec.get("keep_fp32", [])
        if patterns:
            kept = set(matched_modules(component, patterns))
            for module_name, module in component.named_modules():
                if module_name in kept:
                    module.float()
    extra = layout.setup(pipe) if layout.setup is not None else None
    return dict(extra or {})
