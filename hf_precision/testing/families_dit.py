"""Tiny random-weight pipelines of the transformer image families (SD3, Flux, PixArt-Sigma, Sana, AuraFlow, Lumina 2,
HunyuanDiT, QwenImage), built offline from configs.

The configs follow ``get_dummy_components`` of diffusers' own tests (tests/pipelines/<family>/test_*.py), with the
Hub tokenizers those tests download replaced by the handmade ones of :mod:`hf_precision.testing.tokenizers` (CLIP,
T5, Gemma, Qwen2 byte-level BPE, BERT WordPiece). Each family is a row of :data:`ROWS` (a
:class:`~hf_precision.testing.record.TinyPipeline`: the pipeline class, a ``build(seed)`` that returns the pipeline
in float32, the call kwargs for a 2-step run and the output attribute)::

    >>> from hf_precision.testing import PIPELINES
    >>> spec = PIPELINES["flux"]
    >>> pipe = spec.make(0)
    >>> pipe(**spec.call_kwargs()).images.shape
    (1, 32, 32, 3)

Nothing heavy is imported at module import time.
"""

from __future__ import annotations

from typing import Any

from .parts import example_image, finish_pipeline, seeded as _seeded, t5_encoder
from .record import TinyPipeline
from .tokenizers import make_bert_tokenizer, make_gemma_tokenizer, make_qwen2_tokenizer, make_t5_tokenizer
from .tokenizers import make_tokenizer

__all__ = ["ROWS", "make_auraflow", "make_flux", "make_flux_controlnet", "make_hunyuandit",
           "make_hunyuandit_controlnet", "make_lumina2", "make_pixart_sigma", "make_qwenimage", "make_sana", "make_sd3"]


# --------------------------------------------------------------------------------------------- shared parts


def _vae_kl(**overrides: Any):
    from diffusers import AutoencoderKL

    config = dict(block_out_channels=[8, 16], in_channels=3, out_channels=3, latent_channels=4, layers_per_block=1,
                  norm_num_groups=4, down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                  sample_size=32)
    config.update(overrides)
    return AutoencoderKL(**config)


def _clip(projection: bool):
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_hidden_layers=2,
                            vocab_size=99, max_position_embeddings=77, projection_dim=8, bos_token_id=0,
                            eos_token_id=1, pad_token_id=1)
    return (CLIPTextModelWithProjection if projection else CLIPTextModel)(config)


def _gemma2():
    from transformers import Gemma2Config, Gemma2Model

    config = Gemma2Config(head_dim=16, hidden_size=8, intermediate_size=64, num_attention_heads=2, num_hidden_layers=1,
                          num_key_value_heads=2, vocab_size=64, max_position_embeddings=512, pad_token_id=0,
                          eos_token_id=1, bos_token_id=2, attn_implementation="eager")
    return Gemma2Model(config)


def _text_kwargs(**extra: Any) -> dict[str, Any]:
    return {"prompt": "a cat", "height": 32, "width": 32, "num_inference_steps": 2, "output_type": "np", **extra}


# --------------------------------------------------------------------------------------------- builders


def make_sd3(seed: int = 0):
    """A random-weight ``StableDiffusion3Pipeline`` (two CLIP towers, T5, SD3 transformer, 16-channel-style VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline

    transformer = _seeded(seed, lambda: SD3Transformer2DModel(
        sample_size=16, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=16, out_channels=4))
    pipe = StableDiffusion3Pipeline(
        transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_seeded(seed, lambda: _vae_kl(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                                          scaling_factor=1.5035)),
        text_encoder=_seeded(seed, lambda: _clip(True)), tokenizer=make_tokenizer(),
        text_encoder_2=_seeded(seed + 1, lambda: _clip(True)), tokenizer_2=make_tokenizer(),
        text_encoder_3=t5_encoder(seed), tokenizer_3=make_t5_tokenizer(),
    )
    return finish_pipeline(pipe)


def _flux_parts(seed: int, in_channels: int = 16, guidance: bool = True) -> dict[str, Any]:
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxTransformer2DModel

    transformer = _seeded(seed, lambda: FluxTransformer2DModel(
        patch_size=1, in_channels=in_channels, out_channels=4 * 4, num_layers=1, num_single_layers=1,
        attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=8,
        guidance_embeds=guidance, axes_dims_rope=[4, 4, 8]))
    return dict(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_seeded(seed, lambda: _vae_kl(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.1159,
                                          scaling_factor=0.3611)),
        text_encoder=_seeded(seed, lambda: _clip(False)), tokenizer=make_tokenizer(),
        text_encoder_2=t5_encoder(seed), tokenizer_2=make_t5_tokenizer(),
    )


def make_flux(seed: int = 0):
    """A random-weight ``FluxPipeline`` (dev-style: guidance embedding on)."""
    from diffusers import FluxPipeline

    return finish_pipeline(FluxPipeline(**_flux_parts(seed)))


def make_flux_controlnet(seed: int = 0):
    """A random-weight ``FluxControlNetPipeline`` (the Flux transformer plus a one-block Flux ControlNet)."""
    from diffusers import FluxControlNetModel, FluxControlNetPipeline

    controlnet = _seeded(seed, lambda: FluxControlNetModel(
        patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=32, pooled_projection_dim=8, guidance_embeds=True, axes_dims_rope=[4, 4, 8]))
    return finish_pipeline(FluxControlNetPipeline(**_flux_parts(seed), controlnet=controlnet))


def make_pixart_sigma(seed: int = 0):
    """A random-weight ``PixArtSigmaPipeline`` whose VAE has the SDXL VAE's config (scaling_factor 0.13025)."""
    from diffusers import DPMSolverMultistepScheduler, PixArtSigmaPipeline, PixArtTransformer2DModel

    from .sizes import PIXART_SIZES

    transformer = _seeded(seed, lambda: PixArtTransformer2DModel(**PIXART_SIZES["tiny"]["transformer"]))
    pipe = PixArtSigmaPipeline(
        tokenizer=make_t5_tokenizer(), text_encoder=t5_encoder(seed), transformer=transformer,
        vae=_seeded(seed, lambda: _vae_kl(scaling_factor=0.13025, force_upcast=True)),
        scheduler=DPMSolverMultistepScheduler(),
    )
    return finish_pipeline(pipe)


def make_sana(seed: int = 0):
    """A random-weight ``SanaPipeline`` (Gemma 2 text encoder, linear-attention DiT, DC-AE)."""
    from diffusers import AutoencoderDC, FlowMatchEulerDiscreteScheduler, SanaPipeline, SanaTransformer2DModel

    transformer = _seeded(seed, lambda: SanaTransformer2DModel(
        patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_attention_heads=2, attention_head_dim=4,
        num_cross_attention_heads=2, cross_attention_head_dim=4, cross_attention_dim=8, caption_channels=8,
        sample_size=32))
    vae = _seeded(seed, lambda: AutoencoderDC(
        in_channels=3, latent_channels=4, attention_head_dim=2, encoder_block_types=("ResBlock", "EfficientViTBlock"),
        decoder_block_types=("ResBlock", "EfficientViTBlock"), encoder_block_out_channels=(8, 8),
        decoder_block_out_channels=(8, 8), encoder_qkv_multiscales=((), (5,)), decoder_qkv_multiscales=((), (5,)),
        encoder_layers_per_block=(1, 1), decoder_layers_per_block=[1, 1], downsample_block_type="conv",
        upsample_block_type="interpolate", decoder_norm_types="rms_norm", decoder_act_fns="silu", scaling_factor=0.41407))
    pipe = SanaPipeline(tokenizer=make_gemma_tokenizer(), text_encoder=_seeded(seed, _gemma2), vae=vae,
                        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    return finish_pipeline(pipe)


def make_auraflow(seed: int = 0):
    """A random-weight ``AuraFlowPipeline`` (UMT5 encoder; the VAE has the SDXL VAE's config)."""
    from diffusers import AuraFlowPipeline, AuraFlowTransformer2DModel, FlowMatchEulerDiscreteScheduler

    transformer = _seeded(seed, lambda: AuraFlowTransformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, num_mmdit_layers=1, num_single_dit_layers=1, attention_head_dim=8,
        num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32, out_channels=4, pos_embed_max_size=64))
    pipe = AuraFlowPipeline(
        tokenizer=make_t5_tokenizer(), text_encoder=t5_encoder(seed, umt5=True),
        vae=_seeded(seed, lambda: _vae_kl(scaling_factor=0.13025, force_upcast=True)), transformer=transformer,
        scheduler=FlowMatchEulerDiscreteScheduler())
    return finish_pipeline(pipe)


def make_lumina2(seed: int = 0):
    """A random-weight ``Lumina2Pipeline`` (Gemma 2 text encoder, Lumina-Next-style DiT, Flux-style VAE)."""
    from diffusers import FlowMatchEulerDiscreteScheduler, Lumina2Pipeline, Lumina2Transformer2DModel

    transformer = _seeded(seed, lambda: Lumina2Transformer2DModel(
        sample_size=16, patch_size=2, in_channels=4, hidden_size=8, num_layers=2, num_refiner_layers=1,
        num_attention_heads=1, num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5,
        scaling_factor=1.0, axes_dim_rope=[4, 2, 2], cap_feat_dim=8))
    pipe = Lumina2Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(),
        vae=_seeded(seed, lambda: _vae_kl(use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609,
                                          scaling_factor=1.5035)),
        text_encoder=_seeded(seed, _gemma2), tokenizer=make_gemma_tokenizer())
    return finish_pipeline(pipe)


def make_hunyuandit(seed: int = 0):
    """A random-weight ``HunyuanDiTPipeline`` (BERT + T5 encoders; the VAE has the sdxl-vae-fp16-fix config).

    The VAE downsamples by 8, as every HunyuanDiT VAE: pipeline_hunyuandit.py sizes its rotary grid as
    ``height // 8 // patch_size`` whatever the VAE, so a narrower one gives more tokens than rotary positions."""
    from diffusers import DDPMScheduler, HunyuanDiT2DModel, HunyuanDiTPipeline
    from transformers import BertConfig, BertModel

    transformer = _seeded(seed, lambda: HunyuanDiT2DModel(
        sample_size=16, num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3, in_channels=4,
        cross_attention_dim=32, cross_attention_dim_t5=32, pooled_projection_dim=16, hidden_size=24,
        activation_fn="gelu-approximate"))
    bert = _seeded(seed, lambda: BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                                      intermediate_size=37, vocab_size=128, max_position_embeddings=128),
                                           add_pooling_layer=False))
    pipe = HunyuanDiTPipeline(
        vae=_seeded(seed, lambda: _vae_kl(block_out_channels=[8] * 4, down_block_types=["DownEncoderBlock2D"] * 4,
                                          up_block_types=["UpDecoderBlock2D"] * 4, scaling_factor=0.13025,
                                          force_upcast=False)),
        text_encoder=bert, tokenizer=make_bert_tokenizer(), transformer=transformer, scheduler=DDPMScheduler(),
        safety_checker=None, feature_extractor=None, requires_safety_checker=False,
        text_encoder_2=t5_encoder(seed), tokenizer_2=make_t5_tokenizer())
    return finish_pipeline(pipe)


def make_hunyuandit_controlnet(seed: int = 0):
    """A random-weight ``HunyuanDiTControlNetPipeline`` (the HunyuanDiT parts plus a HunyuanDiT ControlNet)."""
    from diffusers import HunyuanDiT2DControlNetModel, HunyuanDiTControlNetPipeline

    parts = dict(make_hunyuandit(seed).components)
    controlnet = _seeded(seed, lambda: HunyuanDiT2DControlNetModel(
        sample_size=16, transformer_num_layers=2, patch_size=2, attention_head_dim=8, num_attention_heads=3,
        in_channels=4, cross_attention_dim=32, cross_attention_dim_t5=32, pooled_projection_dim=16, hidden_size=24,
        activation_fn="gelu-approximate"))
    return finish_pipeline(HunyuanDiTControlNetPipeline(**parts, controlnet=controlnet))


def make_qwenimage(seed: int = 0):
    """A random-weight ``QwenImagePipeline`` (Qwen2.5-VL text encoder, MMDiT, causal 3D VAE)."""
    from diffusers import AutoencoderKLQwenImage, FlowMatchEulerDiscreteScheduler, QwenImagePipeline, QwenImageTransformer2DModel
    from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration

    tokenizer = make_qwen2_tokenizer()
    special = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|vision_start|>", "<|vision_end|>", "<|image_pad|>")}
    transformer = _seeded(seed, lambda: QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=3,
        joint_attention_dim=16, guidance_embeds=False, axes_dims_rope=(8, 4, 4)))
    vae = _seeded(seed, lambda: AutoencoderKLQwenImage(
        base_dim=8, z_dim=4, dim_mult=[1, 2, 4], num_res_blocks=1, temperal_downsample=[False, True],
        latents_mean=[0.0] * 4, latents_std=[1.0] * 4))
    config = Qwen2_5_VLConfig(
        text_config={"hidden_size": 16, "intermediate_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2,
                     "num_key_value_heads": 2, "vocab_size": len(tokenizer), "bos_token_id": None,
                     "eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
                     "rope_scaling": {"mrope_section": [1, 1, 2], "rope_type": "default", "type": "default"},
                     "rope_theta": 1000000.0},
        vision_config={"depth": 2, "hidden_size": 16, "intermediate_size": 16, "num_heads": 2, "out_hidden_size": 16},
        hidden_size=16, vocab_size=len(tokenizer), vision_start_token_id=special["<|vision_start|>"],
        vision_end_token_id=special["<|vision_end|>"], vision_token_id=special["<|image_pad|>"],
        image_token_id=special["<|image_pad|>"])
    text_encoder = _seeded(seed, lambda: Qwen2_5_VLForConditionalGeneration(config))
    pipe = QwenImagePipeline(scheduler=FlowMatchEulerDiscreteScheduler(), vae=vae, text_encoder=text_encoder,
                             tokenizer=tokenizer, transformer=transformer)
    return finish_pipeline(pipe)


_IMAGE = ("image", "dit")

ROWS = (
    TinyPipeline("sd3", "StableDiffusion3Pipeline", "sd3", make_sd3,
                 lambda: _text_kwargs(guidance_scale=5.0, max_sequence_length=16), _IMAGE),
    TinyPipeline("flux", "FluxPipeline", "flux", make_flux,
                 lambda: _text_kwargs(guidance_scale=3.5, max_sequence_length=16), _IMAGE),
    TinyPipeline("flux_controlnet", "FluxControlNetPipeline", "flux", make_flux_controlnet, lambda: _text_kwargs(
        guidance_scale=3.5, max_sequence_length=16, control_image=example_image(32, seed=2),
        controlnet_conditioning_scale=0.7), _IMAGE),
    TinyPipeline("pixart_sigma", "PixArtSigmaPipeline", "pixart", make_pixart_sigma, lambda: _text_kwargs(
        guidance_scale=4.5, use_resolution_binning=False, clean_caption=False, max_sequence_length=16), _IMAGE),
    TinyPipeline("sana", "SanaPipeline", "sana", make_sana, lambda: _text_kwargs(
        guidance_scale=4.5, max_sequence_length=16, complex_human_instruction=None, use_resolution_binning=False,
        clean_caption=False), _IMAGE),
    TinyPipeline("auraflow", "AuraFlowPipeline", "auraflow", make_auraflow,
                 lambda: _text_kwargs(guidance_scale=5.0, max_sequence_length=16), _IMAGE),
    TinyPipeline("lumina2", "Lumina2Pipeline", "lumina2", make_lumina2,
                 lambda: _text_kwargs(guidance_scale=4.0, max_sequence_length=16, system_prompt=""), _IMAGE),
    TinyPipeline("hunyuandit", "HunyuanDiTPipeline", "hunyuandit", make_hunyuandit, lambda: _text_kwargs(
        guidance_scale=5.0, use_resolution_binning=False), _IMAGE),
    TinyPipeline("hunyuandit_controlnet", "HunyuanDiTControlNetPipeline", "hunyuandit", make_hunyuandit_controlnet,
                 lambda: _text_kwargs(guidance_scale=5.0, use_resolution_binning=False,
                                      control_image=example_image(32, seed=2)), _IMAGE),
    TinyPipeline("qwenimage", "QwenImagePipeline", "qwenimage", make_qwenimage,
                 lambda: _text_kwargs(true_cfg_scale=1.0, max_sequence_length=16), _IMAGE),
)
