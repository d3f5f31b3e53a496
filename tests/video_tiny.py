"""Tiny random-weight video pipelines for the video script's tests (configs after diffusers' own pipeline tests,
``tests/pipelines/{wan,ltx,cogvideo,hunyuan_video}/test_*.py`` ``get_dummy_components``), built offline."""

from __future__ import annotations

from typing import Any

from hf_precision.testing.pipelines import _finish as finish  # noqa: F401  (re-exported for the tests)
from hf_precision.testing.pipelines import make_t5_tokenizer, make_tokenizer


def _seeded(seed: int, build):
    import torch

    torch.manual_seed(seed)
    return build()


def _t5(tokenizer, d_model: int = 32):
    from transformers import T5Config, T5EncoderModel

    return T5EncoderModel(T5Config(vocab_size=max(128, len(tokenizer)), d_model=d_model, d_kv=8, d_ff=32, num_layers=2,
                                   num_heads=4, relative_attention_num_buckets=8))


def make_wan(seed: int = 0, mid: bool = False):
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel
    from transformers import UMT5Config, UMT5EncoderModel

    tok = make_t5_tokenizer()
    # mid: wide enough that activations, not the allocator's noise, dominate the measured peak (docs/video.md)
    d, heads, layers, base = (64, 4, 4, 32) if mid else (32, 2, 2, 3)
    te = _seeded(seed, lambda: UMT5EncoderModel(UMT5Config(vocab_size=max(128, len(tok)), d_model=d, d_kv=8, d_ff=d,
                                                           num_layers=2, num_heads=4,
                                                           relative_attention_num_buckets=8)))
    vae = _seeded(seed, lambda: AutoencoderKLWan(base_dim=base, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                                 temperal_downsample=[False, True, True]))
    tr = _seeded(seed, lambda: WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=heads,
                                                     attention_head_dim=12 if not mid else 32,
                                                     in_channels=16, out_channels=16, text_dim=d, freq_dim=256,
                                                     ffn_dim=32 if not mid else 512, num_layers=layers,
                                                     cross_attn_norm=True, qk_norm="rms_norm_across_heads",
                                                     rope_max_seq_len=32))
    pipe = WanPipeline(tokenizer=tok, text_encoder=te, vae=vae, transformer=tr,
                       scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    return finish(pipe)


def _ltx_parts(seed: int):
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    tok = make_t5_tokenizer()
    te = _seeded(seed, lambda: _t5(tok))
    tr = _seeded(seed, lambda: LTXVideoTransformer3DModel(in_channels=8, out_channels=8, patch_size=1, patch_size_t=1,
                                                          num_attention_heads=4, attention_head_dim=8,
                                                          cross_attention_dim=32, num_layers=1, caption_channels=32))
    vae = _seeded(seed, lambda: AutoencoderKLLTXVideo(
        in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 8, 8),
        decoder_block_out_channels=(8, 8, 8, 8), layers_per_block=(1, 1, 1, 1, 1),
        decoder_layers_per_block=(1, 1, 1, 1, 1), spatio_temporal_scaling=(True, True, False, False),
        decoder_spatio_temporal_scaling=(True, True, False, False), decoder_inject_noise=(False,) * 5,
        upsample_residual=(False,) * 4, upsample_factor=(1,) * 4, timestep_conditioning=False, patch_size=1,
        patch_size_t=1, encoder_causal=True, decoder_causal=False))
    return dict(tokenizer=tok, text_encoder=te, transformer=tr, vae=vae, scheduler=FlowMatchEulerDiscreteScheduler())


def make_ltx(seed: int = 0):
    from diffusers import LTXPipeline

    return finish(LTXPipeline(**_ltx_parts(seed)))


def make_ltx_i2v(seed: int = 0):
    from diffusers import LTXImageToVideoPipeline

    return finish(LTXImageToVideoPipeline(**_ltx_parts(seed)))


def _cog_parts(seed: int, in_channels: int, head_dim: int = 8, **extra: Any):
    from diffusers import AutoencoderKLCogVideoX, CogVideoXDDIMScheduler, CogVideoXTransformer3DModel

    tok = make_t5_tokenizer()
    te = _seeded(seed, lambda: _t5(tok))
    tr = _seeded(seed, lambda: CogVideoXTransformer3DModel(
        num_attention_heads=4, attention_head_dim=head_dim, in_channels=in_channels, out_channels=4, time_embed_dim=2,
        text_embed_dim=32, num_layers=1, sample_width=4, sample_height=4, sample_frames=9, patch_size=2,
        temporal_compression_ratio=4, max_text_seq_length=16, **extra))
    vae = _seeded(seed, lambda: AutoencoderKLCogVideoX(
        in_channels=3, out_channels=3, down_block_types=("CogVideoXDownBlock3D",) * 4,
        up_block_types=("CogVideoXUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), latent_channels=4,
        layers_per_block=1, norm_num_groups=2, temporal_compression_ratio=4))
    return dict(tokenizer=tok, text_encoder=te, transformer=tr, vae=vae, scheduler=CogVideoXDDIMScheduler())


def make_cogvideox(seed: int = 0):
    from diffusers import CogVideoXPipeline

    return finish(CogVideoXPipeline(**_cog_parts(seed, 4)))


def make_cogvideox_i2v(seed: int = 0):
    from diffusers import CogVideoXImageToVideoPipeline

    return finish(CogVideoXImageToVideoPipeline(**_cog_parts(seed, 8, 16, use_rotary_positional_embeddings=True)))


def make_hunyuan(seed: int = 0):
    from diffusers import (AutoencoderKLHunyuanVideo, FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import CLIPTextConfig, CLIPTextModel, LlamaConfig, LlamaModel

    tok = make_tokenizer()
    tok.model_max_length = 4096
    tok2 = make_tokenizer()
    tr = _seeded(seed, lambda: HunyuanVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4)))
    vae = _seeded(seed, lambda: AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True))
    te = _seeded(seed, lambda: LlamaModel(LlamaConfig(bos_token_id=0, eos_token_id=2, hidden_size=16,
                                                      intermediate_size=37, num_attention_heads=4,
                                                      num_hidden_layers=2, pad_token_id=1, vocab_size=128,
                                                      hidden_act="gelu")))
    te2 = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(bos_token_id=0, eos_token_id=1, hidden_size=8,
                                                             intermediate_size=37, num_attention_heads=4,
                                                             num_hidden_layers=2, pad_token_id=1, vocab_size=128,
                                                             hidden_act="gelu", projection_dim=32)))
    pipe = HunyuanVideoPipeline(text_encoder=te, tokenizer=tok, transformer=tr, vae=vae,
                                scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0), text_encoder_2=te2,
                                tokenizer_2=tok2)
    return finish(pipe)


BUILDERS = {"wan": make_wan, "wan_mid": lambda seed=0: make_wan(seed, mid=True), "ltx": make_ltx, "ltx_i2v": make_ltx_i2v, "cogvideox": make_cogvideox,
            "cogvideox_i2v": make_cogvideox_i2v, "hunyuan": make_hunyuan}
