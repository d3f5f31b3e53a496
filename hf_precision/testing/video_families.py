"""Tiny random-weight video pipelines, one per diffusers video pipeline class, built offline.

Each is a row of :data:`ROWS` (gathered in :data:`hf_precision.testing.registry.PIPELINES`): the diffusers
pipeline class, the named recipe it resolves to, its mode (``t2v``, ``i2v``, ``v2v``, ``vace``, ``condition``,
``animate``), a ``build(seed)`` returning a float32 pipeline of a few ten-thousand parameters, the call kwargs for a
2-step run and the denoiser's timestep-embedding MLP (``time_mlp``, where the tests plant an fp16 overflow). Configs
follow ``get_dummy_components`` in diffusers' own tests (``tests/pipelines/<family>/test_*.py``), with the Hub tokenizers
replaced by handmade offline ones::

    >>> import torch
    >>> from hf_precision.testing import PIPELINES
    >>> spec = PIPELINES["wan"]
    >>> pipe = spec.make(0)
    >>> frames = pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0)).frames
    >>> frames.shape  # (batch, frames, height, width, channels)
    (1, 5, 16, 16, 3)

Nothing heavy is imported at module import time.
"""

from __future__ import annotations

from .parts import example_image, finish_pipeline, seeded as _seeded, t5_encoder
from .record import TinyPipeline
from .tokenizers import make_llama_chat_tokenizer, make_llama_tokenizer, make_t5_tokenizer, make_tokenizer

__all__ = ["ROWS"]


# ---------------------------------------------------------------------------------------------
# Shared tiny parts
# ---------------------------------------------------------------------------------------------


def _t5(seed: int, umt5: bool = False, **overrides):
    """Handmade T5 tokenizer + tiny T5 encoder (``umt5``: the UMT5 encoder Wan uses)."""
    return make_t5_tokenizer(), t5_encoder(seed, umt5=umt5, **overrides)


def _image(size: int = 16, seed: int = 0):
    return example_image(size, seed=seed)


def _video(frames: int, size: int = 16):
    return [_image(size, seed=i) for i in range(frames)]


# ---------------------------------------------------------------------------------------------
# Wan 2.1 / 2.2
# ---------------------------------------------------------------------------------------------

_WAN_TRANSFORMER = {
    "patch_size": (1, 2, 2), "num_attention_heads": 2, "attention_head_dim": 12, "in_channels": 16,
    "out_channels": 16, "text_dim": 32, "freq_dim": 256, "ffn_dim": 32, "num_layers": 2,
    "cross_attn_norm": True, "qk_norm": "rms_norm_across_heads", "rope_max_seq_len": 32,
}


def _wan_vae(seed: int):
    from diffusers import AutoencoderKLWan

    return _seeded(seed, lambda: AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                                temperal_downsample=[False, True, True]))


def _wan_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=7.0)


def _build_wan(seed: int):
    from diffusers import WanPipeline, WanTransformer3DModel

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seeded(seed, lambda: WanTransformer3DModel(**_WAN_TRANSFORMER))
    return finish_pipeline(WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed),
                               transformer=transformer, scheduler=_wan_scheduler()))


def _build_wan_i2v(seed: int):
    """Wan 2.1 I2V: CLIP image encoder, 36 input channels (16 noise + 4 mask + 16 image latents)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seeded(seed, lambda: WanTransformer3DModel(**dict(_WAN_TRANSFORMER, in_channels=36, image_dim=4)))
    image_encoder = _seeded(seed, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        intermediate_size=16, patch_size=1)))
    return finish_pipeline(WanImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed), transformer=transformer,
        scheduler=_wan_scheduler(), image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32)))


def _build_wan_vace(seed: int):
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seeded(seed, lambda: WanVACETransformer3DModel(**dict(
        _WAN_TRANSFORMER, num_layers=3, vace_layers=[0, 2], vace_in_channels=96)))
    return finish_pipeline(WanVACEPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed),
                                   transformer=transformer, scheduler=_wan_scheduler()))


def _build_wan_animate(seed: int):
    """Wan 2.2 Animate: 36 input channels (16 noise + 20 reference), pose latents and a face video whose tiny motion
    encoder reads 16x16 faces (one face adapter over the two blocks)."""
    from diffusers import WanAnimatePipeline, WanAnimateTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModel

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seeded(seed, lambda: WanAnimateTransformer3DModel(**dict(
        _WAN_TRANSFORMER, in_channels=36, latent_channels=16, image_dim=4, motion_encoder_size=16,
        motion_encoder_channel_sizes={"4": 8, "8": 8, "16": 8}, motion_style_dim=8, motion_dim=4, motion_encoder_dim=8,
        face_encoder_hidden_dim=8, face_encoder_num_heads=2, inject_face_latents_blocks=2)))
    image_encoder = _seeded(seed, lambda: CLIPVisionModel(CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        intermediate_size=16, patch_size=1)))
    return finish_pipeline(WanAnimatePipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed), scheduler=_wan_scheduler(),
        image_processor=CLIPImageProcessor(crop_size=32, size=32), image_encoder=image_encoder, transformer=transformer))


def _wan_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "a dog", "num_inference_steps": 2, "guidance_scale": 6.0,
            "height": 16, "width": 16, "num_frames": 5, "max_sequence_length": 16, "output_type": "np"}


def _wan_embeds_kwargs() -> dict:
    """Wan I2V/VACE/V2V call ``ftfy.fix_text`` on prompt strings without checking that ftfy is installed
    (diffusers v0.42.1 pipelines/wan/pipeline_wan_i2v.py:97, pipeline_wan_vace.py:111; WanPipeline checks,
    pipeline_wan.py:79): without ftfy a prompt raises NameError, so these calls pass float32 embeddings."""
    import torch

    kwargs = _wan_kwargs()
    del kwargs["prompt"], kwargs["negative_prompt"]
    generator = torch.Generator().manual_seed(1)
    embeds = torch.randn(2, 16, _WAN_TRANSFORMER["text_dim"], generator=generator)
    return dict(kwargs, prompt_embeds=embeds[:1], negative_prompt_embeds=embeds[1:])


def _wan_i2v_kwargs() -> dict:
    return dict(_wan_embeds_kwargs(), image=_image(16))


def _wan_vace_kwargs() -> dict:
    from PIL import Image

    frames = 5
    return dict(_wan_embeds_kwargs(), video=_video(frames), mask=[Image.new("L", (16, 16), 0)] * frames)


def _wan_animate_kwargs() -> dict:
    kwargs = _wan_embeds_kwargs()
    del kwargs["num_frames"]  # one segment of 5 frames
    return dict(kwargs, image=_image(16), pose_video=_video(5), face_video=_video(5), segment_frame_length=5)


# ---------------------------------------------------------------------------------------------
# LTX-Video
# ---------------------------------------------------------------------------------------------


def _ltx_parts(seed: int):
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    tokenizer, text_encoder = _t5(seed)
    transformer = _seeded(seed, lambda: LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32))
    vae = _seeded(seed, lambda: AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False),
        decoder_inject_noise=(False, False, False, False, False), upsample_residual=(False, False, False, False),
        upsample_factor=(1, 1, 1, 1), timestep_conditioning=False, patch_size=1, patch_size_t=1,
        encoder_causal=True, decoder_causal=False))
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                scheduler=FlowMatchEulerDiscreteScheduler())


def _build_ltx(seed: int):
    from diffusers import LTXPipeline

    return finish_pipeline(LTXPipeline(**_ltx_parts(seed)))


def _build_ltx_i2v(seed: int):
    from diffusers import LTXImageToVideoPipeline

    return finish_pipeline(LTXImageToVideoPipeline(**_ltx_parts(seed)))


def _build_ltx_condition(seed: int):
    from diffusers import LTXConditionPipeline

    return finish_pipeline(LTXConditionPipeline(**_ltx_parts(seed)))


def _ltx_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "", "num_inference_steps": 2, "guidance_scale": 3.0,
            "height": 32, "width": 32, "num_frames": 9, "max_sequence_length": 16, "output_type": "np"}


def _ltx_i2v_kwargs() -> dict:
    return dict(_ltx_kwargs(), image=_image(32))


def _ltx_condition_kwargs() -> dict:
    from diffusers.pipelines.ltx.pipeline_ltx_condition import LTXVideoCondition

    return dict(_ltx_kwargs(), conditions=[LTXVideoCondition(image=_image(32), frame_index=0)])


# ---------------------------------------------------------------------------------------------
# CogVideoX
# ---------------------------------------------------------------------------------------------


def _cogvideox_parts(seed: int, **transformer_overrides):
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel

    tokenizer, text_encoder = _t5(seed)
    config = dict(num_attention_heads=4, attention_head_dim=8, in_channels=4, out_channels=4, time_embed_dim=2,
                  text_embed_dim=32, num_layers=1, sample_width=2, sample_height=2, sample_frames=9, patch_size=2,
                  temporal_compression_ratio=4, max_text_seq_length=16)
    config.update(transformer_overrides)
    transformer = _seeded(seed, lambda: CogVideoXTransformer3DModel(**config))
    vae = _seeded(seed, lambda: AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4))
    return dict(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                scheduler=CogVideoXDDIMScheduler())


def _build_cogvideox(seed: int):
    from diffusers import CogVideoXPipeline

    return finish_pipeline(CogVideoXPipeline(**_cogvideox_parts(seed)))


def _build_cogvideox_i2v(seed: int):
    from diffusers import CogVideoXImageToVideoPipeline

    return finish_pipeline(CogVideoXImageToVideoPipeline(**_cogvideox_parts(
        seed, num_attention_heads=2, attention_head_dim=16, in_channels=8, use_rotary_positional_embeddings=True,
        use_learned_positional_embeddings=True)))


def _build_cogvideox_v2v(seed: int):
    from diffusers import CogVideoXVideoToVideoPipeline

    return finish_pipeline(CogVideoXVideoToVideoPipeline(**_cogvideox_parts(seed)))


def _cogvideox_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "", "num_inference_steps": 2, "guidance_scale": 6.0,
            "height": 16, "width": 16, "num_frames": 8, "max_sequence_length": 16, "output_type": "np"}


def _cogvideox_i2v_kwargs() -> dict:
    return dict(_cogvideox_kwargs(), image=_image(16))


def _cogvideox_v2v_kwargs() -> dict:
    kwargs = _cogvideox_kwargs()
    del kwargs["num_frames"]
    return dict(kwargs, video=_video(8), strength=0.5)


# ---------------------------------------------------------------------------------------------
# HunyuanVideo
# ---------------------------------------------------------------------------------------------


def _hunyuan_vae(seed: int):
    from diffusers import AutoencoderKLHunyuanVideo

    return _seeded(seed, lambda: AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True))


def _clip_text(seed: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    return make_tokenizer(), _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=8, intermediate_size=37, layer_norm_eps=1e-05,
        num_attention_heads=4, num_hidden_layers=2, vocab_size=99, hidden_act="gelu", projection_dim=32,
        max_position_embeddings=77)))


def _build_hunyuan_video(seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel
    from transformers import LlamaConfig, LlamaModel

    tokenizer = make_llama_tokenizer()
    text_encoder = _seeded(seed, lambda: LlamaModel(LlamaConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=3, hidden_size=16, intermediate_size=37, num_attention_heads=4,
        num_hidden_layers=2, vocab_size=max(200, len(tokenizer)), hidden_act="gelu")))
    tokenizer_2, text_encoder_2 = _clip_text(seed)
    transformer = _seeded(seed, lambda: HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4)))
    return finish_pipeline(HunyuanVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        transformer=transformer, vae=_hunyuan_vae(seed), scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0)))


def _hunyuan_kwargs() -> dict:
    return {"prompt": "a cat", "prompt_template": {"template": "{}", "crop_start": 0}, "num_inference_steps": 2,
            "guidance_scale": 4.5, "height": 16, "width": 16, "num_frames": 9, "max_sequence_length": 16,
            "output_type": "np"}


def _build_hunyuan_video_i2v(seed: int):
    """HunyuanVideo I2V: a tiny Llava reads image and prompt. The pipeline cuts its template's encoding at fixed places
    (576 image features at 5, ``<|end_header_id|>``): a tokenizer that reads it, 24x24 patches (the real 336 / 14)."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, HunyuanVideoImageToVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from diffusers.pipelines.hunyuan_video.pipeline_hunyuan_video_image2video import DEFAULT_PROMPT_TEMPLATE
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = make_llama_chat_tokenizer(DEFAULT_PROMPT_TEMPLATE["template"])
    text_config = LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, hidden_size=16, intermediate_size=37,
                              num_attention_heads=4, num_hidden_layers=2, vocab_size=len(tokenizer), hidden_act="gelu")
    vision_config = CLIPVisionConfig(hidden_size=8, intermediate_size=37, projection_dim=32, num_attention_heads=4,
                                     num_hidden_layers=2, image_size=336, patch_size=14)
    text_encoder = _seeded(seed, lambda: LlavaForConditionalGeneration(LlavaConfig(
        vision_config=vision_config, text_config=text_config, pad_token_id=3,
        image_token_index=tokenizer.convert_tokens_to_ids("<image>"))))
    tokenizer_2, text_encoder_2 = _clip_text(seed)
    transformer = _seeded(seed, lambda: HunyuanVideoTransformer3DModel(
        in_channels=2 * 4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=False,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type="latent_concat"))
    return finish_pipeline(HunyuanVideoImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        transformer=transformer, vae=_hunyuan_vae(seed), scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        image_processor=CLIPImageProcessor(crop_size=336, size=336)))  # OpenAI CLIP's mean, std, bicubic resize


def _hunyuan_i2v_kwargs() -> dict:  # the pipeline's own prompt template, as a user's call has it
    return {k: v for k, v in dict(_hunyuan_kwargs(), image=_image(16)).items() if k != "prompt_template"}


def _build_hunyuan_video_framepack(seed: int):
    """FramePack: the HunyuanVideo parts plus a SigLIP image encoder, a history embedder and an image projection."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, HunyuanVideoFramepackPipeline,
                           HunyuanVideoFramepackTransformer3DModel)
    from transformers import SiglipImageProcessor, SiglipVisionConfig, SiglipVisionModel

    parts = _build_hunyuan_video(seed).components
    transformer = _seeded(seed, lambda: HunyuanVideoFramepackTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=2, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), has_image_proj=True, image_proj_dim=8,
        has_clean_x_embedder=True))
    image_encoder = _seeded(seed, lambda: SiglipVisionModel(SiglipVisionConfig(
        hidden_size=8, intermediate_size=16, num_hidden_layers=1, num_attention_heads=2, image_size=16, patch_size=8)))
    return finish_pipeline(HunyuanVideoFramepackPipeline(
        **{k: v for k, v in parts.items() if k != "transformer"}, transformer=transformer, image_encoder=image_encoder,
        feature_extractor=SiglipImageProcessor(size={"height": 16, "width": 16})))


def _hunyuan_framepack_kwargs() -> dict:
    # one latent window of 2 frames (5 video frames): one section, its history all zeros
    return dict(_hunyuan_kwargs(), image=_image(16), num_frames=5, latent_window_size=2)


# ---------------------------------------------------------------------------------------------
# Mochi, Allegro, Latte
# ---------------------------------------------------------------------------------------------


def _build_mochi(seed: int):
    from diffusers import AutoencoderKLMochi, FlowMatchEulerDiscreteScheduler, MochiPipeline, MochiTransformer3DModel

    tokenizer, text_encoder = _t5(seed)

    def transformer():
        model = MochiTransformer3DModel(
            patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
            in_channels=12, out_channels=None, qk_norm="rms_norm", text_embed_dim=32, time_embed_dim=4,
            activation_fn="swiglu", max_sequence_length=16)
        model.pos_frequencies.data.zero_()  # as diffusers' test: random frequencies make RoPE meaningless
        return model

    vae = _seeded(seed, lambda: AutoencoderKLMochi(
        latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1)))
    return finish_pipeline(MochiPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=_seeded(seed, transformer),
                                 vae=vae, scheduler=FlowMatchEulerDiscreteScheduler()))


def _mochi_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "", "num_inference_steps": 2, "guidance_scale": 4.5,
            "height": 16, "width": 16, "num_frames": 7, "max_sequence_length": 16, "output_type": "np"}


def _build_allegro(seed: int):
    from diffusers import AllegroPipeline, AllegroTransformer3DModel, AutoencoderKLAllegro, DDIMScheduler

    tokenizer, text_encoder = _t5(seed, d_model=24)
    transformer = _seeded(seed, lambda: AllegroTransformer3DModel(
        num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=1,
        cross_attention_dim=24, sample_width=8, sample_height=8, sample_frames=8, caption_channels=24))
    vae = _seeded(seed, lambda: AutoencoderKLAllegro(
        in_channels=3, out_channels=3, down_block_types=("AllegroDownBlock3D",) * 4,
        up_block_types=("AllegroUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4))
    return finish_pipeline(AllegroPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                                   scheduler=DDIMScheduler()))


def _allegro_tiling(pipe):
    # AutoencoderKLAllegro._decode raises NotImplementedError without tiling (diffusers v0.42.1
    # models/autoencoders/autoencoder_kl_allegro.py:841); tiling is not saved in the folder. Its tile is
    # 24 frames x sample_size (autoencoder_kl_allegro.py:789-795): larger than the tiny 8x16x16 video, so no
    # tile would be decoded and the frames would be all zeros; one tile is the whole tiny video here.
    pipe.vae.enable_tiling()
    pipe.vae.kernel = pipe.vae.stride = (8, 16, 16)


def _allegro_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "", "num_inference_steps": 2, "guidance_scale": 6.0,
            "height": 16, "width": 16, "num_frames": 8, "max_sequence_length": 16, "clean_caption": False,
            "output_type": "np"}


def _build_latte(seed: int):
    from diffusers import AutoencoderKL, DDIMScheduler, LattePipeline, LatteTransformer3DModel

    tokenizer, text_encoder = _t5(seed)
    transformer = _seeded(seed, lambda: LatteTransformer3DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=3, caption_channels=32,
        in_channels=4, cross_attention_dim=24, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
        video_length=2))
    vae = _seeded(seed, lambda: AutoencoderKL(
        block_out_channels=[8, 16], norm_num_groups=4, layers_per_block=1, latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2))
    return finish_pipeline(LattePipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                                 scheduler=DDIMScheduler()))


def _latte_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "a dog", "num_inference_steps": 2, "guidance_scale": 5.0,
            "height": 16, "width": 16, "video_length": 2, "clean_caption": False, "output_type": "np"}


# ---------------------------------------------------------------------------------------------
# Rows
# ---------------------------------------------------------------------------------------------

_VIDEO = ("video", "dit")
_FRAMES = {"output": "frames"}

ROWS = (
    TinyPipeline("wan", "WanPipeline", "wan", _build_wan, _wan_kwargs, _VIDEO,
                 mode="t2v", time_mlp="condition_embedder.time_embedder", **_FRAMES),
    TinyPipeline("wan_i2v", "WanImageToVideoPipeline", "wan", _build_wan_i2v, _wan_i2v_kwargs, _VIDEO,
                 mode="i2v", time_mlp="condition_embedder.time_embedder", **_FRAMES),
    TinyPipeline("wan_vace", "WanVACEPipeline", "wan", _build_wan_vace, _wan_vace_kwargs, _VIDEO,
                 mode="vace", time_mlp="condition_embedder.time_embedder", **_FRAMES),
    TinyPipeline("wan_animate", "WanAnimatePipeline", "wan", _build_wan_animate, _wan_animate_kwargs, _VIDEO,
                 mode="animate", time_mlp="condition_embedder.time_embedder", **_FRAMES),
    TinyPipeline("ltx", "LTXPipeline", "ltx", _build_ltx, _ltx_kwargs, _VIDEO,
                 mode="t2v", time_mlp="time_embed.emb.timestep_embedder", **_FRAMES),
    TinyPipeline("ltx_i2v", "LTXImageToVideoPipeline", "ltx", _build_ltx_i2v, _ltx_i2v_kwargs, _VIDEO,
                 mode="i2v", time_mlp="time_embed.emb.timestep_embedder", **_FRAMES),
    TinyPipeline("ltx_condition", "LTXConditionPipeline", "ltx", _build_ltx_condition, _ltx_condition_kwargs, _VIDEO,
                 mode="condition", time_mlp="time_embed.emb.timestep_embedder", **_FRAMES),
    TinyPipeline("cogvideox", "CogVideoXPipeline", "cogvideox", _build_cogvideox, _cogvideox_kwargs, _VIDEO,
                 mode="t2v", time_mlp="time_embedding", **_FRAMES),
    TinyPipeline("cogvideox_i2v", "CogVideoXImageToVideoPipeline", "cogvideox",
                 _build_cogvideox_i2v, _cogvideox_i2v_kwargs, _VIDEO, mode="i2v", time_mlp="time_embedding", **_FRAMES),
    TinyPipeline("cogvideox_v2v", "CogVideoXVideoToVideoPipeline", "cogvideox",
                 _build_cogvideox_v2v, _cogvideox_v2v_kwargs, _VIDEO, mode="v2v", time_mlp="time_embedding", **_FRAMES),
    TinyPipeline("hunyuan_video", "HunyuanVideoPipeline", "hunyuan_video", _build_hunyuan_video, _hunyuan_kwargs,
                 _VIDEO, mode="t2v", time_mlp="time_text_embed.timestep_embedder", **_FRAMES),
    TinyPipeline("hunyuan_video_i2v", "HunyuanVideoImageToVideoPipeline", "hunyuan_video", _build_hunyuan_video_i2v,
                 _hunyuan_i2v_kwargs, _VIDEO, mode="i2v", time_mlp="time_text_embed.timestep_embedder", **_FRAMES),
    TinyPipeline("hunyuan_video_framepack", "HunyuanVideoFramepackPipeline", "hunyuan_video",
                 _build_hunyuan_video_framepack, _hunyuan_framepack_kwargs, _VIDEO, mode="i2v",
                 time_mlp="time_text_embed.timestep_embedder", **_FRAMES),
    TinyPipeline("mochi", "MochiPipeline", "mochi", _build_mochi, _mochi_kwargs, _VIDEO,
                 mode="t2v", time_mlp="time_embed.timestep_embedder", **_FRAMES),
    TinyPipeline("allegro", "AllegroPipeline", "allegro", _build_allegro, _allegro_kwargs, _VIDEO,
                 mode="t2v", time_mlp="adaln_single.emb.timestep_embedder", prepare=_allegro_tiling, **_FRAMES),
    TinyPipeline("latte", "LattePipeline", "latte", _build_latte, _latte_kwargs, _VIDEO,
                 mode="t2v", time_mlp="adaln_single.emb.timestep_embedder", **_FRAMES),
)
