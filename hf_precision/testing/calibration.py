"""Tiny pipelines with planted fp16 overflows, for ``hf_precision.diagnose.calibrate`` and its tests.

Each ``plant_*`` function scales the weights of known modules so that an intermediate activation leaves fp16's
range (max 65504) while the module tree around it stays in range: the float32 run is finite and sane, the all-fp16
run is not, and the smallest fp32 island that fixes it is known in advance. The SD3 and Wan builders follow
diffusers' own fast-test dummies (``get_dummy_components`` in diffusers ``tests/pipelines/stable_diffusion_3`` and
``tests/pipelines/wan``) with the Hub tokenizers and T5 configs replaced by offline ones.
"""

from __future__ import annotations

from typing import Any

from .pipelines import finish_pipeline, make_t5_tokenizer, make_tokenizer

__all__ = ["make_sd3", "make_wan", "plant_vae_up_block", "plant_t5_feed_forward", "plant_time_embedding",
           "sd3_call_kwargs", "wan_call_kwargs", "module_bytes"]


def _seeded(seed: int, build: Any) -> Any:
    import torch

    torch.manual_seed(seed)  # each component's weights depend on its own seed only
    return build()



def _t5(vocab: int, seed: int, umt5: bool = False):
    from transformers import T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    # SD3 and Wan use T5 v1.1 (gated-GELU feed-forward: wo(gelu(wi_0(x)) * wi_1(x))), the variant whose fp16
    # overflow made transformers keep `wo` in fp32 (transformers T5PreTrainedModel._keep_in_fp32_modules).
    # Wan's encoder is umT5 (the same gated feed-forward, per-layer relative attention bias).
    config_class, model_class = (UMT5Config, UMT5EncoderModel) if umt5 else (T5Config, T5EncoderModel)
    config = config_class(vocab_size=vocab, d_model=32, d_kv=8, d_ff=37, num_layers=2, num_heads=4,
                          relative_attention_num_buckets=8, feed_forward_proj="gated-gelu", dropout_rate=0.0)
    return _seeded(seed, lambda: model_class(config))


def make_sd3(seed: int = 0):
    """A random-weight ``StableDiffusion3Pipeline`` in float32: two CLIP encoders, a gated T5, a 1-layer MMDiT.

    >>> pipe = make_sd3()
    >>> pipe(**sd3_call_kwargs()).images.shape
    (1, 32, 32, 3)
    """
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    clip = dict(bos_token_id=0, eos_token_id=1, hidden_size=32, intermediate_size=37, layer_norm_eps=1e-05,
                num_attention_heads=4, num_hidden_layers=2, pad_token_id=1, vocab_size=1000, hidden_act="gelu",
                projection_dim=32)
    tokenizer_3 = make_t5_tokenizer()
    transformer = _seeded(seed, lambda: SD3Transformer2DModel(
        sample_size=32, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
        caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64, out_channels=4))
    vae = _seeded(seed, lambda: AutoencoderKL(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(4,), layers_per_block=1, latent_channels=4,
        norm_num_groups=1, use_quant_conv=False, use_post_quant_conv=False, shift_factor=0.0609, scaling_factor=1.5035))
    pipe = StableDiffusion3Pipeline(
        scheduler=FlowMatchEulerDiscreteScheduler(),
        text_encoder=_seeded(seed, lambda: CLIPTextModelWithProjection(CLIPTextConfig(**clip))),
        text_encoder_2=_seeded(seed + 1, lambda: CLIPTextModelWithProjection(CLIPTextConfig(**clip))),
        text_encoder_3=_t5(max(128, len(tokenizer_3)), seed),
        tokenizer=make_tokenizer(), tokenizer_2=make_tokenizer(), tokenizer_3=tokenizer_3,
        transformer=transformer, vae=vae)
    return finish_pipeline(pipe)


def sd3_call_kwargs(output_type: str = "np") -> dict[str, Any]:
    """Call kwargs that run :func:`make_sd3` in well under a second."""
    return {"prompt": "a cat", "height": 32, "width": 32, "num_inference_steps": 2, "guidance_scale": 5.0,
            "max_sequence_length": 16, "output_type": output_type}


def make_wan(seed: int = 0):
    """A random-weight ``WanPipeline`` (text to video) in float32, from diffusers' Wan fast-test dummy.

    >>> pipe = make_wan()
    >>> pipe(**wan_call_kwargs()).frames.shape
    (1, 5, 16, 16, 3)
    """
    from diffusers import AutoencoderKLWan, FlowMatchEulerDiscreteScheduler, WanPipeline, WanTransformer3DModel

    tokenizer = make_t5_tokenizer()
    vae = _seeded(seed, lambda: AutoencoderKLWan(base_dim=3, z_dim=16, dim_mult=[1, 1, 1, 1], num_res_blocks=1,
                                                 temperal_downsample=[False, True, True]))
    transformer = _seeded(seed, lambda: WanTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=16, out_channels=16,
        text_dim=32, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, qk_norm="rms_norm_across_heads",
        rope_max_seq_len=32))
    pipe = WanPipeline(tokenizer=tokenizer, text_encoder=_t5(max(128, len(tokenizer)), seed, umt5=True), vae=vae,
                       transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=7.0))
    return finish_pipeline(pipe)


def wan_call_kwargs(output_type: str = "np") -> dict[str, Any]:
    """Call kwargs that run :func:`make_wan` fast (5 frames of 16x16)."""
    return {"prompt": "a cat", "negative_prompt": "a dog", "height": 16, "width": 16, "num_frames": 5,
            "num_inference_steps": 2, "guidance_scale": 5.0, "max_sequence_length": 16, "output_type": output_type}


def _scale(module, weight: float, bias: float | None = None, fill_bias: float | None = None) -> None:
    import torch

    with torch.no_grad():
        module.weight.mul_(weight)
        if module.bias is not None:
            if fill_bias is not None:
                module.bias.fill_(fill_bias)
            elif bias is not None:
                module.bias.mul_(bias)


def plant_vae_up_block(vae, block: int = 0, resnets: tuple[int, ...] = (0, 1), scale: float = 1e5) -> list[str]:
    """Make ``decoder.up_blocks.<block>.resnets.<i>.conv1`` overflow fp16; each resnet's output stays in range.

    ``conv1`` (weight and bias) is multiplied by ``scale``; the GroupNorm after it (``norm2``) normalises the large
    values again, so each resnet, and the up block, hand on ordinary values. Returns the planted module names.
    """
    names = []
    for i in resnets:
        _scale(vae.decoder.up_blocks[block].resnets[i].conv1, scale, scale)
        names.append(f"decoder.up_blocks.{block}.resnets.{i}.conv1")
    return names


def plant_t5_feed_forward(t5, block: int = 1, scale: float = 1e3) -> list[str]:
    """Make the gated feed-forward of T5 block ``block`` overflow fp16 at the input of its ``wo``.

    ``wi_0`` and ``wi_1`` are multiplied by ``scale`` (their outputs stay below 65504) and ``wo`` by
    ``1 / scale**2``: the product ``gelu(wi_0(x)) * wi_1(x)`` that ``wo`` reads is about ``scale**2`` times larger
    (beyond fp16's range), and ``wo`` brings it back, so the block's output is what it was. Returns ``[wo]``.
    """
    ff = t5.encoder.block[block].layer[-1].DenseReluDense
    _scale(ff.wi_0, scale)
    _scale(ff.wi_1, scale)
    _scale(ff.wo, 1.0 / scale**2)
    return [f"encoder.block.{block}.layer.{len(t5.encoder.block[block].layer) - 1}.DenseReluDense.wo"]


def plant_time_embedding(transformer, path: str = "condition_embedder.time_embedder") -> list[str]:
    """Make a time-embedding MLP (``linear_1 -> SiLU -> linear_2``) overflow fp16 between its two layers.

    ``linear_1.weight`` x1e5 with its bias set to 6.5e4 puts its outputs around fp16's maximum, and
    ``linear_2.weight`` x1.5e-5 brings them back: the MLP's output is sane in fp32, inf/NaN in fp16.
    Returns ``[path.linear_1]``.
    """
    mlp = transformer.get_submodule(path)
    _scale(mlp.linear_1, 1e5, fill_bias=6.5e4)
    _scale(mlp.linear_2, 1.5e-5)
    return [f"{path}.linear_1"]


def module_bytes(module, itemsize: int = 4) -> int:
    """Bytes of a module's floating parameters and buffers at ``itemsize`` bytes per value."""
    return itemsize * sum(t.numel() for t in (*module.parameters(), *module.buffers()) if t.is_floating_point())
