"""Table-driven resolution: every shipped recipe on every kind of device the project promises to plan for.

The expectations below are written from the device facts (issue #2 and docs/DESIGN.md), not computed by the
code under test: a device row says what a component gets for each kind of dtype tolerance, a component row
says which tolerance it has and what it hands over. A recipe added to ``recipes/`` without a row here fails
``test_tables_cover_every_shipped_recipe`` on purpose.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.recipe.model import Decision
from hf_precision.recipe.overrides import Override, parse_set

FP32, BF16, FP16 = "float32", "bfloat16", "float16"
HALF = {BF16, FP16}

# --------------------------------------------------------------------------------------------------------------
# Device facts. Columns: what a component gets whose tolerated compute dtypes are
#   ANY       = [float16, bfloat16, float32]  (most UNets, DiTs, CLIP/T5 encoders, the SD1.x VAE)
#   BF16_ONLY = [bfloat16, float32]           (SDXL VAE, Flux-like DiTs: fp16 overflows)
#   BF16_PREF = [bfloat16, float16, float32]  (video DiTs: bf16 first, fp16 acceptable)
# and whether half-precision components get their attention softmax upcast to fp32.
# --------------------------------------------------------------------------------------------------------------
ANY, BF16_ONLY, BF16_PREF = "any", "bf16_only", "bf16_pref"
# FP32_FIRST = [float32, bfloat16] (Wan, Mochi, Allegro VAEs): float32 on every device unless asked otherwise
FP32_FIRST = "fp32_first"
FP32_ONLY = "fp32_only"  # [float32]: float32 on every device (the x4 upscaler's VAE, the DPT depth estimator)
# FP16_PREF = [float16, float32] (the *_fp16 video transformers): fp16 where the device picks fp16 unasked, else fp32
FP16_PREF = "fp16_pref"

#            device spec                  ANY   BF16_ONLY BF16_PREF upcast   fact
DEVICES = {
    "cpu-avx2":            dict(any=FP32, bf16_only=FP32, bf16_pref=FP32, upcast=False),  # no native bf16: fp32
    "cpu-avx512":          dict(any=FP32, bf16_only=FP32, bf16_pref=FP32, upcast=False),  # avx512_bf16 but no AMX: fp32 is faster
    "cpu-amx":             dict(any=BF16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # AMX: bf16 where tolerated
    "cpu:amx":             dict(any=BF16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # same, described
    "v100":                dict(any=FP16, bf16_only=FP32, bf16_pref=FP16, upcast=False),  # sm 7.0: fp16, no bf16
    "t4":                  dict(any=FP16, bf16_only=FP32, bf16_pref=FP16, upcast=False),  # sm 7.5: fp16, no bf16
    "cuda:sm75":           dict(any=FP16, bf16_only=FP32, bf16_pref=FP16, upcast=False),  # same, described
    "gtx1660":             dict(any=FP32, bf16_only=FP32, bf16_pref=FP32, upcast=False),  # fp16 broken on GTX 16xx
    "a100":                dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # sm 8.0: fp16 and bf16
    "l4":                  dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # sm 8.9
    "h100":                dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # sm 9.0
    "cuda:sm=9.0":         dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # same, described
    "m1-macos13":          dict(any=FP16, bf16_only=FP32, bf16_pref=FP16, upcast=False),  # MPS: no bf16 before macOS 14
    "mps:macos=13.6":      dict(any=FP16, bf16_only=FP32, bf16_pref=FP16, upcast=False),  # same, described
    "m2-macos15":          dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=True),   # bf16; half attention upcast
    "arc-a770":            dict(any=FP16, bf16_only=BF16, bf16_pref=BF16, upcast=False),  # XPU: fp16 and bf16
}
# GPUs without bf16: CUDA below sm 8.0 and MPS before macOS 14 (device tags cuda / mps without cuda-sm80 /
# mps-macos14). Pipeline recipes of bf16-trained video transformers give them an fp16 entry (`devices:` sections).
NO_BF16_GPU = {"v100", "t4", "cuda:sm75", "gtx1660", "m1-macos13", "mps:macos=13.6"}

# --------------------------------------------------------------------------------------------------------------
# Component recipes: tolerance, what they hand over, float32 islands, NaN guard.
#   hands over: "compute" (encoders), "float32" (VAEs: decoded images are fp32), "latents" (denoisers: the
#   dtype the latents arrive in = compute dtype of the pipeline's `latents_from` component; alone: own compute)
# --------------------------------------------------------------------------------------------------------------
SDXL_ISLANDS = ("time_embedding", "add_embedding")
T5_ISLANDS = ("encoder.block.*.layer.*.DenseReluDense.wo",)
VAE_ENTRY = ("encoder", "quant_conv", "post_quant_conv", "decoder")

CLIP_TEXT_ENTRY = ("", "final_layer_norm", "text_model.final_layer_norm", "text_projection")
#                  recipe            tolerance  hands over  keep_fp32       nan_guard  entry
COMPONENTS = {
    "clip.text":    dict(tol=ANY,       out="compute", islands=(),           guard=False, entry=CLIP_TEXT_ENTRY),
    "clip.vision":  dict(tol=ANY,       out="compute", islands=(),           guard=False, entry=("",)),
    "t5.encoder":   dict(tol=ANY,       out="compute", islands=T5_ISLANDS,   guard=False, entry=("",)),
    "unet.sd15":    dict(tol=ANY,       out="latents", islands=(),           guard=False, entry=("",)),
    "unet.sdxl":    dict(tol=ANY,       out="latents", islands=SDXL_ISLANDS, guard=False, entry=("",)),
    "unet.svd":     dict(tol=ANY,       out="latents", islands=SDXL_ISLANDS, guard=False, entry=("",)),
    "dit.dit":      dict(tol=ANY,       out="latents", islands=(),           guard=False, entry=("",)),
    "dit.pixart":   dict(tol=ANY,       out="latents", islands=(),           guard=False, entry=("",)),
    "vae.kl":       dict(tol=ANY,       out="float32", islands=(),           guard=True,  entry=VAE_ENTRY),
    "vae.sdxl":     dict(tol=BF16_ONLY, out="float32", islands=(),           guard=True,  entry=VAE_ENTRY),
    "vae.fp16_fix": dict(tol=ANY,       out="float32", islands=(),           guard=True,  entry=VAE_ENTRY),
    "autoencoders.kl_any": dict(tol=ANY, out="float32", islands=(),       guard=True,  entry=VAE_ENTRY),
    "vae.temporal": dict(tol=ANY,       out="float32", islands=(),           guard=True,  entry=("encoder", "quant_conv", "decoder")),
    # transformer image families (recipes/components/mmdit.yaml, textenc.yaml, autoencoders.yaml)
    "mmdit.sd3":                   dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.sd35":                  dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.sd3_controlnet":        dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "mmdit.flux":                  dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.chroma":                dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.zimage":                dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.flux_controlnet":       dict(tol=BF16_PREF, out="compute", islands=(), guard=False, entry=("",)),
    "mmdit.redux_embedder":        dict(tol=BF16_PREF, out="compute", islands=(), guard=False, entry=("",)),
    "mmdit.auraflow":              dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.hunyuandit":            dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.hunyuandit_controlnet": dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "mmdit.sana":                  dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.sana_controlnet":       dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "mmdit.lumina2":               dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.qwenimage":             dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "mmdit.qwenimage_controlnet":  dict(tol=BF16_PREF, out="compute", islands=(), guard=False, entry=("",)),
    "textenc.gemma2":              dict(tol=BF16_PREF, out="compute", islands=(), guard=True,  entry=("",)),
    "textenc.qwen25vl":            dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "textenc.qwen3":               dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "textenc.bert":                dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "textenc.umt5":                dict(tol=ANY,       out="compute", islands=T5_ISLANDS, guard=False, entry=("",)),
    "textenc.siglip":              dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "autoencoders.kl16":           dict(tol=ANY,       out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "autoencoders.dc":             dict(tol=BF16_PREF, out="float32", islands=(), guard=True,  entry=("encoder", "decoder")),
    "autoencoders.qwenimage":      dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    # video families (recipes/components/video*.yaml)
    "video.wan":           dict(tol=BF16_PREF,  out="latents", islands=("condition_embedder.time_embedder", "rope"), guard=False, entry=("",)),
    "video.ltx":           dict(tol=BF16_ONLY,  out="latents", islands=("time_embed",),  guard=False, entry=("",)),
    "video.cogvideox_5b":  dict(tol=BF16_ONLY,  out="latents", islands=("time_embedding",), guard=False, entry=("",)),
    "video.cogvideox":     dict(tol=BF16_ONLY,  out="latents", islands=("time_embedding",), guard=False, entry=("",)),
    "video.cogvideox_2b":  dict(tol=ANY,        out="latents", islands=("time_embedding",), guard=False, entry=("",)),
    "video.hunyuan_video": dict(tol=BF16_ONLY,  out="latents", islands=("time_text_embed", "context_embedder.time_text_embed"), guard=False, entry=("",)),
    "video.mochi":         dict(tol=BF16_ONLY,  out="latents", islands=("time_embed.timestep_embedder",), guard=False, entry=("",)),
    "video.allegro":       dict(tol=BF16_ONLY,  out="latents", islands=("adaln_single",), guard=False, entry=("",)),
    "video.latte":         dict(tol=ANY,        out="latents", islands=("adaln_single",), guard=False, entry=("",)),
    # the fp16 layouts of the bf16-trained transformers, for NO_BF16_GPU devices
    "video.ltx_fp16": dict(tol=FP16_PREF, out="latents", islands=("time_embed", "norm_out", "proj_out"), guard=False, entry=("",)),
    "video.cogvideox_5b_fp16": dict(tol=FP16_PREF, out="latents", islands=("time_embedding", "norm_final", "norm_out", "proj_out"), guard=False, entry=("",)),
    "video.cogvideox_fp16": dict(tol=FP16_PREF, out="latents", islands=("time_embedding", "norm_final", "norm_out", "proj_out"), guard=False, entry=("",)),
    "video.hunyuan_video_fp16": dict(tol=FP16_PREF, out="latents", islands=("time_text_embed", "context_embedder.time_text_embed", "norm_out", "proj_out"), guard=False, entry=("",)),
    "video.mochi_fp16": dict(tol=FP16_PREF, out="latents", islands=("time_embed", "norm_out", "proj_out"), guard=False, entry=("",)),
    "video.allegro_fp16": dict(tol=FP16_PREF, out="latents", islands=("adaln_single", "norm_out", "proj_out"), guard=False, entry=("",)),
    # LTX-2 (recipes/components/ltx2.yaml): bf16 as released, fp32 without bf16
    "ltx2.text_encoder":   dict(tol=BF16_ONLY,  out="compute", islands=(), guard=True, entry=("",)),
    "ltx2.connectors":     dict(tol=BF16_ONLY,  out="compute", islands=(), guard=False, entry=("",)),
    "ltx2.transformer":    dict(tol=BF16_ONLY,  out="latents", islands=("time_embed", "audio_time_embed"), guard=False, entry=("",)),
    "ltx2.vae":            dict(tol=BF16_ONLY,  out="float32", islands=(), guard=True, entry=("encoder", "decoder")),
    "ltx2.audio_vae":      dict(tol=BF16_ONLY,  out="float32", islands=(), guard=True, entry=("encoder", "decoder")),
    "ltx2.vocoder":        dict(tol=BF16_ONLY,  out="float32", islands=(), guard=False, entry=("",)),
    "video_vae.wan":       dict(tol=FP32_FIRST, out="float32", islands=(), guard=True, entry=VAE_ENTRY),
    "video_vae.ltx":       dict(tol=BF16_ONLY,  out="float32", islands=(), guard=True, entry=("encoder", "decoder")),
    "video_vae.cogvideox": dict(tol=BF16_PREF,  out="float32", islands=(), guard=True, entry=VAE_ENTRY),
    "video_vae.hunyuan_video": dict(tol=BF16_PREF, out="float32", islands=(), guard=True, entry=VAE_ENTRY),
    "video_vae.mochi":     dict(tol=FP32_FIRST, out="float32", islands=(), guard=True, entry=("encoder", "decoder")),
    "video_vae.allegro":   dict(tol=FP32_FIRST, out="float32", islands=(), guard=True, entry=VAE_ENTRY),
    "video_text.umt5":     dict(tol=BF16_PREF,  out="compute", islands=T5_ISLANDS, guard=False, entry=("",)),
    "video_text.llama":    dict(tol=ANY,        out="compute", islands=(), guard=False, entry=("",)),
    "video_text.siglip":   dict(tol=ANY,        out="compute", islands=(), guard=False, entry=("",)),
    # UNet image and video families (ControlNets, adapters, AnimateDiff, I2VGen-XL, Kandinsky 3, Stable Cascade)
    "control.controlnet":     dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "control.adapter":        dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "control.motion_adapter": dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "motion.unet":            dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "motion.i2vgen":          dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "cogview4.glm":           dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "cogview4.transformer":   dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "cogview4.vae":           dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "hunyuan_video15.text_encoder": dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "hunyuan_video15.byt5":   dict(tol=ANY,       out="compute", islands=T5_ISLANDS, guard=False, entry=("",)),
    "hunyuan_video15.transformer": dict(tol=BF16_ONLY, out="latents", islands=("time_embed",), guard=False, entry=("",)),
    "hunyuan_video15.transformer_fp16": dict(tol=FP16_PREF, out="latents", islands=(
        "time_embed", "context_embedder.time_text_embed", "norm_out", "proj_out"), guard=False, entry=("",)),
    "hunyuan_video15.vae":    dict(tol=ANY,       out="float32", islands=(), guard=True,  entry=("encoder", "decoder")),
    "skyreels_v2.transformer": dict(tol=BF16_PREF, out="latents", islands=("condition_embedder.time_embedder", "rope"),
                                    guard=False, entry=("",)),
    "sana_video.transformer": dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "chronoedit.transformer": dict(tol=BF16_PREF, out="latents", islands=("condition_embedder.time_embedder", "rope"),
                                   guard=False, entry=("",)),
    "cosmos.transformer":     dict(tol=BF16_ONLY, out="latents", islands=("learnable_pos_embed",), guard=False,
                                   entry=("",)),
    "kandinsky5.transformer": dict(tol=BF16_ONLY, out="latents", islands=(
        "time_embeddings", "*modulation", "*query_norm", "*key_norm"), guard=False, entry=("",)),
    "easyanimate.transformer": dict(tol=BF16_PREF, out="latents", islands=("time_embedding",), guard=False, entry=("",)),
    "easyanimate.text_encoder": dict(tol=BF16_PREF, out="compute", islands=(), guard=False, entry=("",)),
    "easyanimate.vae":        dict(tol=BF16_PREF, out="float32", islands=(), guard=True, entry=VAE_ENTRY),
    "flux2.text_encoder":     dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "flux2.transformer":      dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "flux2.vae":              dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "ernie_image.text_encoder": dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "ernie_image.transformer":  dict(tol=BF16_ONLY, out="latents", islands=("time_embedding", "adaLN_modulation"), guard=False, entry=("",)),
    "ernie_image.vae":          dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "krea2.text_encoder":     dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "krea2.transformer":      dict(tol=BF16_ONLY, out="latents", islands=("time_embed.linear_1", "time_embed.linear_2"), guard=False, entry=("",)),
    "krea2.vae":              dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "cogview3plus.transformer": dict(tol=BF16_ONLY, out="latents", islands=("time_condition_embed.timestep_embedder", "time_condition_embed.condition_embedder"), guard=False, entry=("",)),
    "cogview3plus.vae":       dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "hidream.llama":          dict(tol=BF16_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "hidream.transformer":    dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "bria.transformer":       dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "bria.vae":               dict(tol=FP32_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
    "ovis_image.transformer": dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "hunyuan_image.byt5":     dict(tol=ANY,       out="compute", islands=T5_ISLANDS, guard=False, entry=("",)),
    "hunyuan_image.transformer": dict(tol=BF16_ONLY, out="latents", islands=("time_guidance_embed",), guard=False,
                                      entry=("",)),
    "hunyuan_image.vae":      dict(tol=BF16_ONLY, out="float32", islands=(), guard=True,  entry=("encoder", "decoder")),
    "hunyuan_image.refiner_vae": dict(tol=BF16_ONLY, out="float32", islands=(), guard=True, entry=("encoder", "decoder")),
    "kandinsky3.unet":        dict(tol=ANY,       out="latents", islands=(), guard=False, entry=("",)),
    "kandinsky3.movq":        dict(tol=ANY,       out="float32", islands=(), guard=True,
                                   entry=("encoder", "quant_conv", "quantize", "post_quant_conv", "decoder")),
    "cascade.prior":          dict(tol=BF16_ONLY, out="latents", islands=(), guard=False, entry=("",)),
    "cascade.decoder":        dict(tol=BF16_PREF, out="latents", islands=(), guard=False, entry=("",)),
    "cascade.vqgan":          dict(tol=BF16_PREF, out="float32", islands=(), guard=True,
                                   entry=("in_block", "down_blocks", "vquantizer", "up_blocks", "out_block")),
    "extras.safety_checker":  dict(tol=ANY,       out="compute", islands=(), guard=False, entry=("",)),
    "extras.depth_estimator": dict(tol=FP32_ONLY, out="compute", islands=(), guard=False, entry=("",)),
    "extras.x4_upscaler_vae": dict(tol=FP32_ONLY, out="float32", islands=(), guard=True,  entry=VAE_ENTRY),
}

# Pipeline recipes: component -> component recipe, and where the latents' dtype comes from.
PIPELINES = {
    "sdxl":   dict(components={"text_encoder": "clip.text", "text_encoder_2": "clip.text", "unet": "unet.sdxl",
                               "vae": "vae.sdxl", "controlnet": "control.controlnet", "adapter": "control.adapter",
                               "image_encoder": "clip.vision"}, latents_from="text_encoder_2"),
    "sd15":   dict(components={"text_encoder": "clip.text", "unet": "unet.sd15", "vae": "vae.kl",
                               "controlnet": "control.controlnet", "adapter": "control.adapter",
                               "image_encoder": "clip.vision", "safety_checker": "extras.safety_checker",
                               "depth_estimator": "extras.depth_estimator"}, latents_from="text_encoder"),
    "svd":    dict(components={"image_encoder": "clip.vision", "unet": "unet.svd", "vae": "vae.temporal"},
                   latents_from="image_encoder"),
    "pixart": dict(components={"text_encoder": "t5.encoder", "transformer": "dit.pixart", "vae": "autoencoders.kl_any"},
                   latents_from="text_encoder"),
    "dit":    dict(components={"transformer": "dit.dit", "vae": "vae.kl"}, latents_from="transformer"),
    "sd3":        dict(components={"text_encoder": "clip.text", "text_encoder_2": "clip.text", "text_encoder_3": "t5.encoder",
                                   "transformer": "mmdit.sd3", "vae": "autoencoders.kl16", "controlnet": "mmdit.sd3_controlnet",
                                   "image_encoder": "textenc.siglip"}, latents_from="text_encoder_3"),
    "flux":       dict(components={"text_encoder": "clip.text", "text_encoder_2": "t5.encoder", "transformer": "mmdit.flux",
                                   "vae": "autoencoders.kl16", "controlnet": "mmdit.flux_controlnet",
                                   "image_encoder": "clip.vision"}, latents_from="text_encoder_2"),
    "chroma":     dict(components={"text_encoder": "t5.encoder", "transformer": "mmdit.chroma", "vae": "autoencoders.kl16",
                                   "image_encoder": "clip.vision"}, latents_from="text_encoder"),
    "cogview4":   dict(components={"text_encoder": "cogview4.glm", "transformer": "cogview4.transformer",
                                   "vae": "cogview4.vae"}, latents_from=None),
    "hunyuan_video15": dict(components={"text_encoder": "hunyuan_video15.text_encoder",
                                        "text_encoder_2": "hunyuan_video15.byt5", "transformer": "hunyuan_video15.transformer",
                                        "vae": "hunyuan_video15.vae", "image_encoder": "video_text.siglip"},
                            latents_from=None, denoiser="transformer",
                            no_bf16={"transformer": "hunyuan_video15.transformer_fp16"}),
    "skyreels_v2": dict(components={"text_encoder": "video_text.umt5", "image_encoder": "clip.vision",
                                    "transformer": "skyreels_v2.transformer", "vae": "video_vae.wan"},
                        latents_from=None, denoiser="transformer"),
    "sana_video": dict(components={"text_encoder": "textenc.gemma2", "transformer": "sana_video.transformer",
                                   "vae": "video_vae.wan"}, latents_from=None, denoiser="transformer"),
    "chronoedit": dict(components={"text_encoder": "video_text.umt5", "image_encoder": "clip.vision",
                                   "transformer": "chronoedit.transformer", "vae": "video_vae.wan"},
                       latents_from=None, denoiser="transformer"),
    "cosmos":     dict(components={"text_encoder": "t5.encoder", "transformer": "cosmos.transformer",
                                   "vae": "video_vae.wan"}, latents_from=None, denoiser="transformer"),
    "kandinsky5": dict(components={"text_encoder": "textenc.qwen25vl", "text_encoder_2": "clip.text",
                                   "transformer": "kandinsky5.transformer", "vae": "video_vae.hunyuan_video"},
                       latents_from=None, denoiser="transformer"),
    "hunyuan_image_refiner": dict(components={"text_encoder": "textenc.qwen25vl",
                                              "transformer": "hunyuan_image.transformer",
                                              "vae": "hunyuan_image.refiner_vae"},
                                  latents_from="transformer", denoiser="transformer"),
    "kandinsky5_image": dict(components={"text_encoder": "textenc.qwen25vl", "text_encoder_2": "clip.text",
                                         "transformer": "kandinsky5.transformer", "vae": "autoencoders.kl16"},
                             latents_from=None, denoiser="transformer"),
    "easyanimate": dict(components={"text_encoder": "easyanimate.text_encoder", "transformer": "easyanimate.transformer",
                                    "vae": "easyanimate.vae"}, latents_from="text_encoder", denoiser="transformer"),
    "flux2":      dict(components={"text_encoder": "flux2.text_encoder", "transformer": "flux2.transformer",
                                   "vae": "flux2.vae"}, latents_from="text_encoder"),
    "ernie_image": dict(components={"text_encoder": "ernie_image.text_encoder", "transformer": "ernie_image.transformer",
                                    "vae": "ernie_image.vae"}, latents_from="transformer"),
    "krea2":      dict(components={"text_encoder": "krea2.text_encoder", "transformer": "krea2.transformer",
                                   "vae": "krea2.vae"}, latents_from="text_encoder"),
    "cogview3plus": dict(components={"text_encoder": "t5.encoder", "transformer": "cogview3plus.transformer",
                                     "vae": "cogview3plus.vae"}, latents_from="text_encoder"),
    "zimage":     dict(components={"text_encoder": "textenc.qwen3", "transformer": "mmdit.zimage",
                                   "vae": "autoencoders.kl16"}, latents_from=None),
    "hidream":    dict(components={"text_encoder": "clip.text", "text_encoder_2": "clip.text",
                                   "text_encoder_3": "t5.encoder", "text_encoder_4": "hidream.llama",
                                   "transformer": "hidream.transformer", "vae": "autoencoders.kl16"},
                   latents_from="text_encoder"),
    "bria":       dict(components={"text_encoder": "t5.encoder", "transformer": "bria.transformer",
                                   "vae": "bria.vae"}, latents_from="transformer"),
    "ovis_image": dict(components={"text_encoder": "textenc.qwen3", "transformer": "ovis_image.transformer",
                                   "vae": "autoencoders.kl16"}, latents_from="text_encoder"),
    "hunyuan_image": dict(components={"text_encoder": "textenc.qwen25vl", "text_encoder_2": "hunyuan_image.byt5",
                                      "transformer": "hunyuan_image.transformer", "vae": "hunyuan_image.vae"},
                          latents_from="transformer"),
    "flux_redux": dict(components={"image_encoder": "textenc.siglip", "image_embedder": "mmdit.redux_embedder",
                                   "text_encoder": "clip.text", "text_encoder_2": "t5.encoder"}, latents_from=None),
    "sana":       dict(components={"text_encoder": "textenc.gemma2", "transformer": "mmdit.sana", "vae": "autoencoders.dc",
                                   "controlnet": "mmdit.sana_controlnet"}, latents_from=None),
    "auraflow":   dict(components={"text_encoder": "textenc.umt5", "transformer": "mmdit.auraflow",
                                   "vae": "autoencoders.kl_any"}, latents_from="text_encoder"),
    "lumina2":    dict(components={"text_encoder": "textenc.gemma2", "transformer": "mmdit.lumina2",
                                   "vae": "autoencoders.kl16"}, latents_from="text_encoder"),
    "hunyuandit": dict(components={"text_encoder": "textenc.bert", "text_encoder_2": "t5.encoder",
                                   "transformer": "mmdit.hunyuandit", "vae": "autoencoders.kl_any",
                                   "controlnet": "mmdit.hunyuandit_controlnet"}, latents_from="transformer"),
    "qwenimage":  dict(components={"text_encoder": "textenc.qwen25vl", "transformer": "mmdit.qwenimage",
                                   "vae": "autoencoders.qwenimage", "controlnet": "mmdit.qwenimage_controlnet"},
                       latents_from="text_encoder"),
    # video families: latents_from None = the pipeline makes fp32 latents and the transformer's entry cast gives
    # them its own compute dtype, which it hands back
    "wan":    dict(components={"text_encoder": "video_text.umt5", "image_encoder": "clip.vision",
                               "transformer": "video.wan", "transformer_2": "video.wan", "vae": "video_vae.wan"},
                   latents_from=None, denoiser="transformer"),
    "ltx":    dict(components={"text_encoder": "t5.encoder", "transformer": "video.ltx", "vae": "video_vae.ltx"},
                   latents_from=None, denoiser="transformer", no_bf16={"transformer": "video.ltx_fp16"}),
    "ltx2":   dict(components={"text_encoder": "ltx2.text_encoder", "connectors": "ltx2.connectors",
                               "transformer": "ltx2.transformer", "vae": "ltx2.vae", "audio_vae": "ltx2.audio_vae",
                               "vocoder": "ltx2.vocoder"}, latents_from=None, denoiser="transformer"),
    "cogvideox": dict(components={"text_encoder": "t5.encoder", "transformer": "video.cogvideox",
                                  "vae": "video_vae.cogvideox"}, latents_from="text_encoder", no_bf16={"transformer": "video.cogvideox_fp16"}),
    "hunyuan_video": dict(components={"text_encoder": "video_text.llama", "text_encoder_2": "clip.text",
                                      "transformer": "video.hunyuan_video", "vae": "video_vae.hunyuan_video",
                                      "image_encoder": "video_text.siglip"}, latents_from=None, denoiser="transformer", no_bf16={"transformer": "video.hunyuan_video_fp16"}),
    "mochi":  dict(components={"text_encoder": "t5.encoder", "transformer": "video.mochi", "vae": "video_vae.mochi"},
                   latents_from=None, denoiser="transformer", no_bf16={"transformer": "video.mochi_fp16"}),
    "allegro": dict(components={"text_encoder": "t5.encoder", "transformer": "video.allegro",
                                "vae": "video_vae.allegro"}, latents_from="text_encoder", no_bf16={"transformer": "video.allegro_fp16"}),
    "latte":  dict(components={"text_encoder": "t5.encoder", "transformer": "video.latte", "vae": "vae.kl"},
                   latents_from="text_encoder"),
    "sd_upscale": dict(components={"text_encoder": "clip.text", "unet": "unet.sd15", "vae": "extras.x4_upscaler_vae"},
                       latents_from="text_encoder"),
    "animatediff": dict(components={"text_encoder": "clip.text", "unet": "motion.unet",
                                    "motion_adapter": "control.motion_adapter", "controlnet": "control.controlnet",
                                    "image_encoder": "clip.vision", "vae": "vae.kl"}, latents_from="text_encoder"),
    "animatediff_sdxl": dict(components={"text_encoder": "clip.text", "text_encoder_2": "clip.text",
                                         "unet": "motion.unet", "motion_adapter": "control.motion_adapter",
                                         "image_encoder": "clip.vision", "vae": "vae.sdxl"}, latents_from="text_encoder_2"),
    "i2vgenxl": dict(components={"text_encoder": "clip.text", "image_encoder": "clip.vision", "unet": "motion.i2vgen",
                                 "vae": "vae.kl"}, latents_from="text_encoder"),
    "kandinsky3": dict(components={"text_encoder": "t5.encoder", "unet": "kandinsky3.unet", "movq": "kandinsky3.movq"},
                       latents_from="text_encoder"),
    "cascade_prior": dict(components={"text_encoder": "clip.text", "image_encoder": "clip.vision",
                                      "prior": "cascade.prior"}, latents_from="prior"),
    "cascade": dict(components={"text_encoder": "clip.text", "decoder": "cascade.decoder", "vqgan": "cascade.vqgan",
                                "prior_text_encoder": "clip.text", "prior_image_encoder": "clip.vision",
                                "prior_prior": "cascade.prior"}, latents_from="decoder"),
}


def expected_compute(device: str, recipe: str) -> str:
    tol = COMPONENTS[recipe]["tol"]
    if tol == FP16_PREF:
        return FP16 if DEVICES[device]["any"] == FP16 else FP32
    return FP32 if tol in (FP32_FIRST, FP32_ONLY) else DEVICES[device][tol]


def assert_component(plan: hp.ComponentPolicy, device: str, recipe: str, latents_dtype: str) -> None:
    spec, facts = COMPONENTS[recipe], DEVICES[device]
    compute = expected_compute(device, recipe)
    # without latents_from (SanaPipeline makes fp32 latents itself) a denoiser hands back what it computes in
    handed = {"compute": compute, "float32": FP32, "latents": latents_dtype or compute}[spec["out"]]
    where = f"{recipe} as {plan.name!r} on {device}"
    assert (plan.storage, plan.compute, plan.handed_over) == (compute, compute, handed), where
    assert plan.recipe == recipe, where
    assert plan.keep_fp32 == spec["islands"], where
    assert plan.entry == spec["entry"], where
    assert plan.nan_guard == (spec["guard"] and compute in HALF), where
    assert plan.upcast_attention == (facts["upcast"] and compute in HALF), where
    fields = [d.field for d in plan.decisions]
    assert {"compute", "storage", "hands over"} <= set(fields), where
    assert all(d.rule.strip() and d.value for d in plan.decisions), where


def test_tables_cover_every_shipped_recipe():
    assert sorted(hp.list_recipes("pipeline")) == sorted(PIPELINES), "add a row to PIPELINES for a new pipeline recipe"
    assert sorted(hp.list_recipes("component")) == sorted(COMPONENTS), "add a row to COMPONENTS for a new component recipe"
    # every preset the issue names is covered by a row
    presets = hp.list_presets()
    for name in ("cpu-avx2", "cpu-avx512", "cpu-amx", "v100", "t4", "gtx1660", "a100", "l4", "h100",
                 "m1-macos13", "m2-macos15", "arc-a770"):
        assert name in presets and name in DEVICES


def test_device_rows_describe_the_devices_the_issue_names():
    """The rows are about the hardware the issue lists, not just about preset names."""
    facts = {name: hp.device_profile(name) for name in DEVICES}
    assert facts["v100"].capability == (7, 0) and facts["t4"].capability == (7, 5)
    assert facts["a100"].capability == (8, 0) and facts["l4"].capability == (8, 9) and facts["h100"].capability == (9, 0)
    assert "GTX 1660" in facts["gtx1660"].name
    assert facts["m1-macos13"].macos[:1] == (13,) and facts["m2-macos15"].macos[:1] == (15,)
    assert facts["arc-a770"].type == "xpu"
    assert "amx_bf16" in facts["cpu-amx"].cpu_flags and "amx_bf16" not in facts["cpu-avx512"].cpu_flags
    assert (facts["cuda:sm75"].type, facts["cuda:sm75"].capability, facts["cuda:sm75"].present) == ("cuda", (7, 5), False)
    assert facts["mps:macos=13.6"].macos == (13, 6)


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("device", list(DEVICES))
def test_pipeline_recipe(pipeline: str, device: str):
    spec = PIPELINES[pipeline]
    recipe = hp.get_recipe(pipeline, device=device)
    assert list(recipe.components) == list(spec["components"])
    assert recipe.latents_from == spec["latents_from"]
    components = dict(spec["components"], **(spec.get("no_bf16", {}) if device in NO_BF16_GPU else {}))
    src = spec["latents_from"] or spec.get("denoiser")
    latents = expected_compute(device, components[src]) if src else None
    for comp, comp_recipe in components.items():
        assert_component(recipe[comp], device, comp_recipe, latents)


@pytest.mark.parametrize("component", sorted(COMPONENTS))
@pytest.mark.parametrize("device", list(DEVICES))
def test_component_recipe(component: str, device: str):
    recipe = hp.get_recipe(component, device=device)
    (plan,) = recipe.policies
    assert plan.name == component.split(".")[0]
    # alone, a denoiser's latents arrive in its own compute dtype
    assert_component(plan, device, component, expected_compute(device, component))


# ------------------------------------------------------------------------------------------- spot checks


def test_known_expectations_spelled_out():
    """The design's examples, literally, so the tables above cannot drift from them unnoticed."""
    def dtypes(name, device, **kw):
        # the four models every SDXL checkpoint has (the recipe also plans ControlNets, adapters, image encoders)
        core = ("text_encoder", "text_encoder_2", "unet", "vae")
        plans = hp.get_recipe(name, device=device, **kw).components.items()
        return {c: p.compute for c, p in plans if name != "sdxl" or c in core}

    assert set(dtypes("sdxl", "cpu-avx512").values()) == {FP32}
    assert set(dtypes("sdxl", "cpu-amx").values()) == {BF16}
    assert dtypes("sdxl", "t4") == {"text_encoder": FP16, "text_encoder_2": FP16, "unet": FP16, "vae": FP32}
    assert dtypes("sdxl", "v100")["vae"] == FP32
    assert set(dtypes("sdxl", "gtx1660").values()) == {FP32}
    assert dtypes("sdxl", "a100") == {"text_encoder": FP16, "text_encoder_2": FP16, "unet": FP16, "vae": BF16}
    assert dtypes("mmdit.flux", "h100") == {"mmdit": BF16}
    assert dtypes("mmdit.flux", "t4") == {"mmdit": FP16}  # diffusers clips fp16 activations (transformer_flux.py:409)
    assert dtypes("sdxl", "m1-macos13")["vae"] == FP32
    assert dtypes("sdxl", "m2-macos15")["vae"] == BF16
    assert hp.get_recipe("sdxl", device="m2-macos15")["unet"].upcast_attention is True
    assert hp.get_recipe("sdxl", device="m1-macos13")["unet"].upcast_attention is False
    assert dtypes("sdxl", "arc-a770")["vae"] == BF16
    svd = hp.get_recipe("svd", device="t4")
    assert (svd["unet"].handed_over, svd["vae"].handed_over, svd["image_encoder"].handed_over) == (FP16, FP32, FP16)


@pytest.mark.parametrize("device, vae", [("t4", FP16), ("a100", FP16), ("m1-macos13", FP16), ("gtx1660", FP32)])
def test_fp16_fix_vae_selected_by_config(device, vae):
    recipe = hp.get_recipe("sdxl", device=device, configs={"vae": {"force_upcast": False}})
    plan = recipe["vae"]
    assert plan.compute == plan.storage == vae
    assert plan.recipe == "vae.fp16_fix"
    assert plan.dtypes == (FP16, BF16, FP32)
    selected = [d for d in plan.decisions if d.field == "recipe"]
    assert selected and "vae.fp16_fix" in selected[0].rule and "force_upcast" in selected[0].rule


def test_vae_config_without_the_fix_keeps_the_sdxl_vae():
    for configs in (None, {"vae": {"force_upcast": True}}, {"unet": {"force_upcast": False}}):
        plan = hp.get_recipe("sdxl", device="t4", configs=configs)["vae"]
        assert (plan.recipe, plan.compute) == ("vae.sdxl", FP32)
        assert not [d for d in plan.decisions if d.field == "recipe"]


def test_islands_are_reported():
    recipe = hp.get_recipe("sdxl", device="t4")
    unet = recipe["unet"]
    assert unet.keep_fp32 == SDXL_ISLANDS
    (island,) = [d for d in unet.decisions if d.field == "keep_fp32"]
    assert island.value == "time_embedding, add_embedding" and "float32 islands" in island.rule
    assert "no-op" not in island.rule
    assert "time_embedding, add_embedding" in str(recipe)
    assert tuple(recipe.to_dict()["components"]["unet"]["keep_fp32"]) == SDXL_ISLANDS
    # on a device that computes in fp32 anyway the islands are kept but reported as a no-op
    cpu_island = [d for d in hp.get_recipe("sdxl", device="cpu-avx2")["unet"].decisions if d.field == "keep_fp32"]
    assert "no-op" in cpu_island[0].rule


def test_every_decision_carries_a_rule():
    for device in ("t4", "m2-macos15", "cpu-amx"):
        recipe = hp.get_recipe("sdxl", device=device, configs={"vae": {"force_upcast": False}})
        for plan in recipe.policies:
            assert plan.decisions
            for d in plan.decisions:
                assert isinstance(d, Decision)
                assert d.field and d.value and d.rule.strip() and d.source, (plan.name, d)
    # the device rule is named where it decides
    unet = hp.get_recipe("sdxl", device="m2-macos15")["unet"]
    (upcast,) = [d for d in unet.decisions if d.field == "upcast_attention"]
    assert "mps-macos14.5" in upcast.rule
    compute = [d for d in hp.get_recipe("sdxl", device="t4")["vae"].decisions if d.field == "compute"][0]
    assert "bfloat16" in compute.rule and "float32" in compute.rule


def test_recipe_is_frozen():
    recipe = hp.get_recipe("sdxl", device="t4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe.name = "other"  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe["vae"].compute = FP16  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        recipe["vae"].decisions[0].value = FP16  # type: ignore[misc]
    assert isinstance(recipe.policies, tuple) and isinstance(recipe["unet"].keep_fp32, tuple)
    # the components mapping is a fresh view: changing it does not change the recipe
    recipe.components.pop("vae")
    assert "vae" in recipe and recipe["vae"].compute == FP32


def test_recipe_prints_as_a_table():
    recipe = hp.get_recipe("sdxl", device="t4")
    text = str(recipe)
    lines = text.splitlines()
    assert lines[0].startswith("recipe sdxl for cuda (Tesla T4, sm 7.5)")
    assert "tags: cuda" in lines[0]
    header = lines[1].split()
    assert header[:3] == ["component", "storage", "compute"] and "islands" in lines[1]
    assert set(lines[2]) <= {"-", " "}
    rows = {line.split()[0]: line.split() for line in lines[3:3 + len(recipe.policies)]}
    assert set(rows) == set(recipe.components) >= {"text_encoder", "text_encoder_2", "unet", "vae"}
    assert rows["vae"][1:4] == [FP32, FP32, FP32]
    assert rows["unet"][1:4] == [FP16, FP16, FP16]
    assert "decisions:" in text and "vae.compute = float32" in text
    brief = recipe.table(why=False)
    assert "decisions:" not in brief and len(brief.splitlines()) == 3 + len(recipe.policies)


def test_recipe_serialises_to_json():
    recipe = hp.get_recipe("sdxl", device="m2-macos15", overrides={"unet": {"keep_fp32": ["time_embedding"]}})
    data = json.loads(recipe.to_json())
    assert data["name"] == "sdxl" and data["schema"] == 1 and data["latents_from"] == "text_encoder_2"
    assert data["device"]["type"] == "mps" and data["device"]["macos"] == "15.1"
    assert data["device_tags"] == list(recipe.device_tags)
    assert list(data["components"]) == list(recipe.components)
    for name, plan in recipe.components.items():
        got = data["components"][name]
        assert (got["storage"], got["compute"], got["handed_over"]) == (plan.storage, plan.compute, plan.handed_over)
        assert got["keep_fp32"] == list(plan.keep_fp32)
        assert got["upcast_attention"] == plan.upcast_attention
        assert [d["field"] for d in got["decisions"]] == [d.field for d in plan.decisions]
    assert json.loads(recipe.to_json(indent=None)) == data


def test_resolving_does_not_import_torch():
    code = ("import sys, hf_precision as hp\n"
            "r = hp.get_recipe('sdxl', device='t4')\n"
            "hp.get_recipe('svd', device='cuda:sm=8.0', overrides={'vae': {'dtype': 'float32'}})\n"
            "[hp.get_recipe(n, device='m2-macos15') for n in hp.list_recipes()]\n"
            "str(r); r.to_json()\n"
            "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if m.startswith('torch'))\n"
            "print('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


# ------------------------------------------------------------------------------------------- overrides


def test_override_merge_order_file_then_dict_then_set(tmp_path):
    file = tmp_path / "mine.yaml"
    file.write_text("schema: 1\ncomponents:\n"
                    "  text_encoder: {dtype: float32}\n"
                    "  unet: {dtype: float32, keep_fp32: [time_embedding]}\n"
                    "  vae: {dtype: float32}\n")
    as_dict = {"unet": {"dtype": "bfloat16"}, "vae": {"dtype": "bfloat16"}}
    as_set = Override("--set", parse_set(["unet.dtype=fp16"]))
    recipe = hp.get_recipe("sdxl", device="a100", overrides=[file, as_dict, as_set])
    assert recipe["text_encoder"].compute == FP32      # only the file sets it
    assert recipe["text_encoder_2"].compute == FP16    # nobody sets it: the recipe
    assert recipe["vae"].compute == BF16               # dict beats file
    assert recipe["unet"].compute == FP16              # --set beats dict and file
    assert recipe["unet"].keep_fp32 == ("time_embedding",)  # a list replaces the recipe's list
    src = lambda comp: next(d.source for d in recipe[comp].decisions if d.field == "compute")
    assert (src("text_encoder"), src("vae"), src("unet")) == (str(file), "overrides dict #2", "--set")
    assert recipe.sources == ("recipes/sdxl.yaml", str(file), "overrides dict #2", "--set")
    # the CLI builds the same order: --overrides files first, then --set flags
    from hf_precision.cli import build_parser
    from hf_precision.cli.common import overrides_from

    args = build_parser().parse_args(["show", "sdxl", "--set", "unet.dtype=fp16", "--overrides", str(file)])
    layers = overrides_from(args)
    assert layers[0] == str(file) and layers[-1].source == "--set"
    assert hp.get_recipe("sdxl", device="a100", overrides=layers)["unet"].compute == FP16


def test_later_override_file_wins(tmp_path):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("schema: 1\ncomponents: {vae: {dtype: float32}, unet: {dtype: float32}}\n")
    b.write_text("schema: 1\ncomponents: {vae: {dtype: bfloat16}}\n")
    recipe = hp.get_recipe("sdxl", device="h100", overrides=[a, b])
    assert (recipe["vae"].compute, recipe["unet"].compute) == (BF16, FP32)


@pytest.mark.parametrize("device, unet", [("a100", BF16), ("l4", BF16), ("t4", FP16), ("gtx1660", FP32),
                                          ("m2-macos15", FP16), ("cpu-amx", BF16)])
def test_device_sections_apply_only_on_matching_tags(device, unet):
    overrides = {"devices": {"cuda-sm80": {"unet": {"dtype": "bfloat16"}}}}
    assert hp.get_recipe("sdxl", device=device, overrides=overrides)["unet"].compute == unet


def test_device_sections_order_within_and_across_layers(tmp_path):
    # within one layer the matching device section beats the layer's plain components
    layer = {"components": {"unet": {"dtype": "float32"}}, "devices": {"cuda-sm80": {"unet": {"dtype": "bfloat16"}}}}
    assert hp.get_recipe("sdxl", device="a100", overrides=layer)["unet"].compute == BF16
    assert hp.get_recipe("sdxl", device="t4", overrides=layer)["unet"].compute == FP32
    # a later layer's plain value beats an earlier layer's device section
    file = tmp_path / "dev.yaml"
    file.write_text("schema: 1\ndevices:\n  mps-macos14: {vae: {dtype: float32}}\n  mps: {unet: {dtype: float32}}\n")
    on15 = hp.get_recipe("sdxl", device="m2-macos15", overrides=[file])
    on13 = hp.get_recipe("sdxl", device="m1-macos13", overrides=[file])
    assert (on15["vae"].compute, on15["unet"].compute) == (FP32, FP32)
    assert on13["unet"].compute == FP32 and on13["vae"].compute == FP32  # mps tag matches both, 14 only on 15
    assert hp.get_recipe("sdxl", device="m2-macos15", overrides=[file, {"vae": {"dtype": "bf16"}}])["vae"].compute == BF16
    assert hp.get_recipe("sdxl", device="a100", overrides=[file])["vae"].compute == BF16  # no mps tag: untouched
    # --set can address a device section too
    flags = Override("--set", parse_set(["devices.cuda-sm89.vae.dtype=float32"]))
    assert hp.get_recipe("sdxl", device="l4", overrides=flags)["vae"].compute == FP32
    assert hp.get_recipe("sdxl", device="a100", overrides=flags)["vae"].compute == BF16


def test_forced_dtype_outside_the_tolerated_list_is_accepted_with_a_note():
    recipe = hp.get_recipe("sdxl", device="a100", overrides={"vae": {"dtype": "float16"}})
    vae = recipe["vae"]
    assert (vae.storage, vae.compute, vae.handed_over) == (FP16, FP16, FP32)
    (decision,) = [d for d in vae.decisions if d.field == "compute"]
    assert "forced" in decision.rule and "outside the tolerated" in decision.rule and "bfloat16" in decision.rule
    assert decision.source == "overrides dict"
    assert vae.nan_guard is True
    # inside the list: no note
    inside = [d for d in hp.get_recipe("sdxl", device="a100", overrides={"vae": {"dtype": "fp32"}})["vae"].decisions
              if d.field == "compute"][0]
    assert "forced" in inside.rule and "outside" not in inside.rule


def test_storage_override_differs_from_compute():
    recipe = hp.get_recipe("sdxl", device="l4", overrides={"unet": {"storage": "fp8"}})
    unet = recipe["unet"]
    assert (unet.storage, unet.compute, unet.handed_over) == ("float8_e4m3fn", FP16, FP16)
    assert any(d.field == "storage" and "cast to the compute dtype" in d.rule for d in unet.decisions)


def test_denoiser_hands_over_the_latents_dtype_not_its_own():
    # the UNet computes bf16 but the latents follow text_encoder_2 (fp16): that is what the pipeline sees
    recipe = hp.get_recipe("sdxl", device="a100", overrides={"unet": {"dtype": "bfloat16"}})
    assert (recipe["unet"].compute, recipe["unet"].handed_over) == (BF16, FP16)
    recipe = hp.get_recipe("sdxl", device="a100", overrides={"text_encoder_2": {"dtype": "bfloat16"}})
    assert (recipe["unet"].compute, recipe["unet"].handed_over) == (FP16, BF16)
    hand = [d for d in recipe["unet"].decisions if d.field == "hands over"][0]
    assert "text_encoder_2" in hand.rule


def test_device_profile_object_is_accepted():
    profile = hp.DeviceProfile(type="cuda", name="Tesla T4", capability=(7, 5))
    assert hp.get_recipe("sdxl", device=profile)["vae"].compute == FP32
    assert hp.get_recipe("sdxl", device=profile).device is profile
