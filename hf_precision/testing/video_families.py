"""Tiny random-weight video pipelines, one per diffusers video pipeline class, built offline.

``FAMILIES`` maps a name (``"wan"``, ``"ltx_i2v"``, ...) to a :class:`VideoFamily`: the diffusers
pipeline class, the named recipe it resolves to, its mode (``t2v``, ``i2v``, ``v2v``, ``vace``,
``condition``), a ``build(seed)`` returning a float32 pipeline of a few ten-thousand parameters, and
the call kwargs for a 2-step run. Configs follow ``get_dummy_components`` in diffusers' own tests
(``tests/pipelines/<family>/test_*.py``), with the Hub tokenizers replaced by handmade offline ones::

    >>> import torch
    >>> from hf_precision.testing.video_families import FAMILIES
    >>> spec = FAMILIES["wan"]
    >>> pipe = spec.build(0)
    >>> frames = pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0)).frames
    >>> frames.shape  # (batch, frames, height, width, channels)
    (1, 5, 16, 16, 3)

:func:`plant_fp16_overflow` makes the denoiser's timestep-embedding MLP overflow float16 the way real
video DiTs do (large ``linear_1`` activations, brought back by a small ``linear_2``): finite in float32
or bfloat16, inf/NaN in float16.

Nothing heavy is imported at module import time.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable
from .pipelines import finish_pipeline

__all__ = ["FAMILIES", "VideoFamily", "make_llama_tokenizer", "make_video", "plant_fp16_overflow",
           "video_call_kwargs"]


@dataclass(frozen=True)
class VideoFamily:
    """One tiny video pipeline: how to build it and call it for 2 steps.

    >>> FAMILIES["ltx"].pipeline_class, FAMILIES["ltx"].mode
    ('LTXPipeline', 't2v')
    """

    name: str
    family: str                    # recipe family: wan, ltx, cogvideox, hunyuan_video, mochi, allegro, latte
    pipeline_class: str            # diffusers class name
    mode: str                      # t2v, i2v, v2v, vace, condition
    builder: Callable[[int], Any]
    kwargs: Callable[[], dict] = field(repr=False)
    time_mlp: str = ""             # transformer submodule with linear_1/linear_2 (timestep embedding MLP)
    prepare: Callable[[Any], Any] | None = field(default=None, repr=False)

    def build(self, seed: int = 0):
        """A fresh float32 pipeline, deterministic given ``seed``, ready to call."""
        return self.ready(self.builder(seed))

    def ready(self, pipe):
        """Apply the settings a saved folder does not keep (Allegro's VAE only decodes tiled); returns ``pipe``."""
        if self.prepare is not None:
            self.prepare(pipe)
        return pipe

    def call_kwargs(self, **overrides) -> dict:
        """Kwargs for a 2-step call with ``output_type="np"`` (add a ``generator``)."""
        kwargs = self.kwargs()
        kwargs.update(overrides)
        return kwargs


# ---------------------------------------------------------------------------------------------
# Shared tiny parts
# ---------------------------------------------------------------------------------------------

_T5_TINY = {  # hf-internal-testing/tiny-random-t5 sizes (d_model 32), fewer layers
    "d_model": 32, "d_kv": 8, "d_ff": 37, "num_layers": 2, "num_heads": 4,
    "relative_attention_num_buckets": 8, "dropout_rate": 0.0, "feed_forward_proj": "gated-gelu",
    "is_encoder_decoder": False, "vocab_size": 200,
}


def _seed(seed: int, build: Callable[[], Any]) -> Any:
    import torch

    torch.manual_seed(seed)
    return build()


def _t5(seed: int, umt5: bool = False, **overrides):
    """Handmade T5 tokenizer + tiny T5 encoder (``umt5``: the UMT5 encoder Wan uses)."""
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    from .pipelines import make_t5_tokenizer

    tokenizer = make_t5_tokenizer()
    config = dict(_T5_TINY, **overrides)
    config["vocab_size"] = max(config["vocab_size"], len(tokenizer))
    if umt5:
        return tokenizer, _seed(seed, lambda: UMT5EncoderModel(UMT5Config(**config)))
    return tokenizer, _seed(seed, lambda: T5EncoderModel(T5Config(**config)))



def _image(size: int = 16, seed: int = 0):
    from .pipelines import example_image

    return example_image(size, seed=seed)


def _video(frames: int, size: int = 16):
    return [_image(size, seed=i) for i in range(frames)]


def make_llama_tokenizer():
    """A handmade byte-free Llama BPE tokenizer (letters, digits, a few words), built offline.

    >>> tok = make_llama_tokenizer()
    >>> tok.convert_ids_to_tokens(tok("a cat").input_ids)
    ['\u2581a', '\u2581c', 'a', 't']
    """
    from transformers import LlamaTokenizer

    letters = "abcdefghijklmnopqrstuvwxyz0123456789.,!?'-:;()"
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3, "\u2581": 4}
    for c in letters + letters.upper():
        vocab.setdefault(c, len(vocab))
        vocab.setdefault("\u2581" + c, len(vocab))
    merges = [("\u2581", c) for c in letters + letters.upper()]
    tokenizer = LlamaTokenizer(vocab=vocab, merges=merges, pad_token="<pad>")
    tokenizer.model_max_length = 256
    return tokenizer


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

    return _seed(seed, lambda: AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                                temperal_downsample=[False, True, True]))


def _wan_scheduler():
    from diffusers import FlowMatchEulerDiscreteScheduler

    return FlowMatchEulerDiscreteScheduler(shift=7.0)


def _build_wan(seed: int):
    from diffusers import WanPipeline, WanTransformer3DModel

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seed(seed, lambda: WanTransformer3DModel(**_WAN_TRANSFORMER))
    return finish_pipeline(WanPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed),
                               transformer=transformer, scheduler=_wan_scheduler()))


def _build_wan_i2v(seed: int):
    """Wan 2.1 I2V: CLIP image encoder, 36 input channels (16 noise + 4 mask + 16 image latents)."""
    from diffusers import WanImageToVideoPipeline, WanTransformer3DModel
    from transformers import CLIPImageProcessor, CLIPVisionConfig, CLIPVisionModelWithProjection

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seed(seed, lambda: WanTransformer3DModel(**dict(_WAN_TRANSFORMER, in_channels=36, image_dim=4)))
    image_encoder = _seed(seed, lambda: CLIPVisionModelWithProjection(CLIPVisionConfig(
        hidden_size=4, projection_dim=4, num_hidden_layers=2, num_attention_heads=2, image_size=32,
        intermediate_size=16, patch_size=1)))
    return finish_pipeline(WanImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed), transformer=transformer,
        scheduler=_wan_scheduler(), image_encoder=image_encoder,
        image_processor=CLIPImageProcessor(crop_size=32, size=32)))


def _build_wan_vace(seed: int):
    from diffusers import WanVACEPipeline, WanVACETransformer3DModel

    tokenizer, text_encoder = _t5(seed, umt5=True)
    transformer = _seed(seed, lambda: WanVACETransformer3DModel(**dict(
        _WAN_TRANSFORMER, num_layers=3, vace_layers=[0, 2], vace_in_channels=96)))
    return finish_pipeline(WanVACEPipeline(tokenizer=tokenizer, text_encoder=text_encoder, vae=_wan_vae(seed),
                                   transformer=transformer, scheduler=_wan_scheduler()))


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


# ---------------------------------------------------------------------------------------------
# LTX-Video
# ---------------------------------------------------------------------------------------------


def _ltx_parts(seed: int):
    from diffusers import AutoencoderKLLTXVideo, FlowMatchEulerDiscreteScheduler, LTXVideoTransformer3DModel

    tokenizer, text_encoder = _t5(seed)
    transformer = _seed(seed, lambda: LTXVideoTransformer3DModel(
        in_channels=8, out_channels=8, patch_size=1, patch_size_t=1, num_attention_heads=4, attention_head_dim=8,
        cross_attention_dim=32, num_layers=1, caption_channels=32))
    vae = _seed(seed, lambda: AutoencoderKLLTXVideo(
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
    transformer = _seed(seed, lambda: CogVideoXTransformer3DModel(**config))
    vae = _seed(seed, lambda: AutoencoderKLCogVideoX(
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

    return _seed(seed, lambda: AutoencoderKLHunyuanVideo(
        in_channels=3, out_channels=3, latent_channels=4, down_block_types=("HunyuanVideoDownBlock3D",) * 4,
        up_block_types=("HunyuanVideoUpBlock3D",) * 4, block_out_channels=(8, 8, 8, 8), layers_per_block=1,
        act_fn="silu", norm_num_groups=4, scaling_factor=0.476986, spatial_compression_ratio=8,
        temporal_compression_ratio=4, mid_block_add_attention=True))


def _clip_text(seed: int):
    from transformers import CLIPTextConfig, CLIPTextModel

    from .pipelines import make_tokenizer

    return make_tokenizer(), _seed(seed, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=8, intermediate_size=37, layer_norm_eps=1e-05,
        num_attention_heads=4, num_hidden_layers=2, vocab_size=99, hidden_act="gelu", projection_dim=32,
        max_position_embeddings=77)))


def _build_hunyuan_video(seed: int):
    from diffusers import FlowMatchEulerDiscreteScheduler, HunyuanVideoPipeline, HunyuanVideoTransformer3DModel
    from transformers import LlamaConfig, LlamaModel

    tokenizer = make_llama_tokenizer()
    text_encoder = _seed(seed, lambda: LlamaModel(LlamaConfig(
        bos_token_id=1, eos_token_id=2, pad_token_id=3, hidden_size=16, intermediate_size=37, num_attention_heads=4,
        num_hidden_layers=2, vocab_size=max(200, len(tokenizer)), hidden_act="gelu")))
    tokenizer_2, text_encoder_2 = _clip_text(seed)
    transformer = _seed(seed, lambda: HunyuanVideoTransformer3DModel(
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
    """HunyuanVideo I2V: a tiny Llava text encoder (Llama + CLIP vision) reads the image with the prompt."""
    from diffusers import (FlowMatchEulerDiscreteScheduler, HunyuanVideoImageToVideoPipeline,
                           HunyuanVideoTransformer3DModel)
    from transformers import CLIPImageProcessor, CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration

    tokenizer = make_llama_tokenizer()
    text_config = LlamaConfig(bos_token_id=1, eos_token_id=2, pad_token_id=3, hidden_size=16, intermediate_size=37,
                              num_attention_heads=4, num_hidden_layers=2, vocab_size=200, hidden_act="gelu")
    vision_config = CLIPVisionConfig(hidden_size=8, intermediate_size=37, projection_dim=32, num_attention_heads=4,
                                     num_hidden_layers=2, image_size=224)
    text_encoder = _seed(seed, lambda: LlavaForConditionalGeneration(LlavaConfig(
        vision_config=vision_config, text_config=text_config, pad_token_id=3, image_token_index=199)))
    tokenizer_2, text_encoder_2 = _clip_text(seed)
    transformer = _seed(seed, lambda: HunyuanVideoTransformer3DModel(
        in_channels=2 * 4 + 1, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
        num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=False,
        text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type="latent_concat"))
    image_processor = CLIPImageProcessor(
        crop_size=224, do_center_crop=True, do_normalize=True, do_resize=True, resample=3, size=224,
        image_mean=[0.48145466, 0.4578275, 0.40821073], image_std=[0.26862954, 0.26130258, 0.27577711])
    return finish_pipeline(HunyuanVideoImageToVideoPipeline(
        tokenizer=tokenizer, text_encoder=text_encoder, tokenizer_2=tokenizer_2, text_encoder_2=text_encoder_2,
        transformer=transformer, vae=_hunyuan_vae(seed), scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0),
        image_processor=image_processor))


def _hunyuan_i2v_kwargs() -> dict:
    template = {"template": "{}", "crop_start": 0, "image_emb_len": 49, "image_emb_start": 5, "image_emb_end": 54}
    return dict(_hunyuan_kwargs(), image=_image(16), prompt_template=template, max_sequence_length=64)


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

    vae = _seed(seed, lambda: AutoencoderKLMochi(
        latent_channels=12, out_channels=3, encoder_block_out_channels=(32, 32, 32, 32),
        decoder_block_out_channels=(32, 32, 32, 32), layers_per_block=(1, 1, 1, 1, 1)))
    return finish_pipeline(MochiPipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=_seed(seed, transformer),
                                 vae=vae, scheduler=FlowMatchEulerDiscreteScheduler()))


def _mochi_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "", "num_inference_steps": 2, "guidance_scale": 4.5,
            "height": 16, "width": 16, "num_frames": 7, "max_sequence_length": 16, "output_type": "np"}


def _build_allegro(seed: int):
    from diffusers import AllegroPipeline, AllegroTransformer3DModel, AutoencoderKLAllegro, DDIMScheduler

    tokenizer, text_encoder = _t5(seed, d_model=24)
    transformer = _seed(seed, lambda: AllegroTransformer3DModel(
        num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, num_layers=1,
        cross_attention_dim=24, sample_width=8, sample_height=8, sample_frames=8, caption_channels=24))
    vae = _seed(seed, lambda: AutoencoderKLAllegro(
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
    transformer = _seed(seed, lambda: LatteTransformer3DModel(
        sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8, num_attention_heads=3, caption_channels=32,
        in_channels=4, cross_attention_dim=24, out_channels=8, attention_bias=True, activation_fn="gelu-approximate",
        num_embeds_ada_norm=1000, norm_type="ada_norm_single", norm_elementwise_affine=False, norm_eps=1e-6,
        video_length=2))
    vae = _seed(seed, lambda: AutoencoderKL(
        block_out_channels=[8, 16], norm_num_groups=4, layers_per_block=1, latent_channels=4,
        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2))
    return finish_pipeline(LattePipeline(tokenizer=tokenizer, text_encoder=text_encoder, transformer=transformer, vae=vae,
                                 scheduler=DDIMScheduler()))


def _latte_kwargs() -> dict:
    return {"prompt": "a cat", "negative_prompt": "a dog", "num_inference_steps": 2, "guidance_scale": 5.0,
            "height": 16, "width": 16, "video_length": 2, "clean_caption": False, "output_type": "np"}


# ---------------------------------------------------------------------------------------------
# Registry
# ---------------------------------------------------------------------------------------------

FAMILIES: dict[str, VideoFamily] = {spec.name: spec for spec in (
    VideoFamily("wan", "wan", "WanPipeline", "t2v", _build_wan, _wan_kwargs, "condition_embedder.time_embedder"),
    VideoFamily("wan_i2v", "wan", "WanImageToVideoPipeline", "i2v", _build_wan_i2v, _wan_i2v_kwargs,
                "condition_embedder.time_embedder"),
    VideoFamily("wan_vace", "wan", "WanVACEPipeline", "vace", _build_wan_vace, _wan_vace_kwargs,
                "condition_embedder.time_embedder"),
    VideoFamily("ltx", "ltx", "LTXPipeline", "t2v", _build_ltx, _ltx_kwargs, "time_embed.emb.timestep_embedder"),
    VideoFamily("ltx_i2v", "ltx", "LTXImageToVideoPipeline", "i2v", _build_ltx_i2v, _ltx_i2v_kwargs,
                "time_embed.emb.timestep_embedder"),
    VideoFamily("ltx_condition", "ltx", "LTXConditionPipeline", "condition", _build_ltx_condition,
                _ltx_condition_kwargs, "time_embed.emb.timestep_embedder"),
    VideoFamily("cogvideox", "cogvideox", "CogVideoXPipeline", "t2v", _build_cogvideox, _cogvideox_kwargs,
                "time_embedding"),
    VideoFamily("cogvideox_i2v", "cogvideox", "CogVideoXImageToVideoPipeline", "i2v", _build_cogvideox_i2v,
                _cogvideox_i2v_kwargs, "time_embedding"),
    VideoFamily("cogvideox_v2v", "cogvideox", "CogVideoXVideoToVideoPipeline", "v2v", _build_cogvideox_v2v,
                _cogvideox_v2v_kwargs, "time_embedding"),
    VideoFamily("hunyuan_video", "hunyuan_video", "HunyuanVideoPipeline", "t2v", _build_hunyuan_video,
                _hunyuan_kwargs, "time_text_embed.timestep_embedder"),
    VideoFamily("hunyuan_video_i2v", "hunyuan_video", "HunyuanVideoImageToVideoPipeline", "i2v",
                _build_hunyuan_video_i2v, _hunyuan_i2v_kwargs, "time_text_embed.timestep_embedder"),
    VideoFamily("mochi", "mochi", "MochiPipeline", "t2v", _build_mochi, _mochi_kwargs,
                "time_embed.timestep_embedder"),
    VideoFamily("allegro", "allegro", "AllegroPipeline", "t2v", _build_allegro, _allegro_kwargs,
                "adaln_single.emb.timestep_embedder", _allegro_tiling),
    VideoFamily("latte", "latte", "LattePipeline", "t2v", _build_latte, _latte_kwargs,
                "adaln_single.emb.timestep_embedder"),
)}


def make_video(name: str, seed: int = 0):
    """Build the tiny pipeline registered as ``name`` in ``FAMILIES``.

    >>> type(make_video("cogvideox")).__name__
    'CogVideoXPipeline'
    """
    if name not in FAMILIES:
        raise ValueError(f"unknown video family {name!r}; use one of {sorted(FAMILIES)}")
    return FAMILIES[name].build(seed)


def video_call_kwargs(name: str, **overrides) -> dict:
    """2-step call kwargs for ``FAMILIES[name]`` (``output_type="np"``).

    >>> video_call_kwargs("wan")["num_inference_steps"]
    2
    """
    return FAMILIES[name].call_kwargs(**overrides)


def plant_fp16_overflow(pipe, name: str, *, scale: float = 1e5, bias: float = 6.5e4, back: float = 1.5e-5):
    """Make the denoiser's timestep-embedding MLP overflow float16, in place; returns ``pipe``.

    ``linear_1.weight`` is multiplied by ``scale`` and its bias set to ``bias`` (close to fp16's maximum,
    65504), and ``linear_2.weight`` multiplied by ``back``: the MLP output keeps its float32 magnitude,
    but ``linear_1``'s activations are inf in float16, so an all-fp16 run gives inf/NaN frames while a
    run that keeps this MLP in float32 stays finite. Real models overflow in the same place (Wan keeps
    ``time_embedder`` in fp32: ``_keep_in_fp32_modules`` in diffusers' transformer_wan.py).

    >>> import torch
    >>> pipe = plant_fp16_overflow(make_video("wan"), "wan")
    >>> mlp = pipe.transformer.condition_embedder.time_embedder
    >>> x = torch.ones(1, mlp.linear_1.in_features)
    >>> bool(torch.isfinite(mlp(x)).all()), bool(torch.isfinite(mlp.half()(x.half())).all())
    (True, False)
    """
    import torch

    mlp = pipe.transformer.get_submodule(FAMILIES[name].time_mlp)
    with torch.no_grad():
        mlp.linear_1.weight.mul_(scale)
        mlp.linear_1.bias.fill_(bias)
        mlp.linear_2.weight.mul_(back)
    return pipe
