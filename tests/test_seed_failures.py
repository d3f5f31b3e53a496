"""The failures that started the project, each reproduced with plain diffusers, then fixed by hf_precision."""

from __future__ import annotations

import pytest
import torch

import hf_precision as hp
from hf_precision.testing.pipelines import example_call_kwargs, make_tokenizer
from checks import assert_finite


def test_opensora_video_dit_conv3d_bf16_fed_fp32():
    """Open-Sora: a video DiT with a Conv3d patch embedding in bf16 fed fp32 latents, timesteps and text.

    Open-Sora casts all three at forward entry (hpcaitech/Open-Sora opensora/models/stdit/stdit3.py, STDiT3.forward).
    """
    from diffusers import WanTransformer3DModel

    torch.manual_seed(0)
    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=8, in_channels=4,
                                  out_channels=4, text_dim=16, freq_dim=16, ffn_dim=32, num_layers=1,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)
    assert isinstance(model.patch_embedding, torch.nn.Conv3d)
    latents, timestep, text = torch.randn(1, 4, 2, 8, 8), torch.tensor([500.0]), torch.randn(1, 8, 16)
    reference = model(latents, timestep, text).sample

    model.to(torch.bfloat16)
    with pytest.raises(RuntimeError, match=r"Input type \(float\) and bias type \(c10::BFloat16\)"):
        model(latents, timestep, text)

    recipe = hp.get_recipe("video.wan", device="a100")
    assert recipe["video"].compute == "bfloat16"
    hp.apply_recipe(model, recipe, device="cpu")
    out = model(latents, timestep, text).sample
    assert out.dtype == torch.float32, "the output must come back in the dtype the latents arrived in"
    assert torch.isfinite(out).all()
    assert (out - reference).abs().max() < 0.1


def _tiny_unet(in_channels: int):
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=4, sample_size=8,
                                in_channels=in_channels, out_channels=4, cross_attention_dim=8, attention_head_dim=2,
                                down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                                up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"))


def test_onetrainer_fp16_unet_fed_fp32_timestep_and_latent_mask():
    """OneTrainer: an fp16 inpainting UNet fed an fp32 timestep and an fp32 mask concatenated with fp16 latents."""
    unet = _tiny_unet(in_channels=9).to(torch.float16)
    latents = torch.randn(1, 4, 8, 8, dtype=torch.float16)
    mask, masked = torch.ones(1, 1, 8, 8), torch.randn(1, 4, 8, 8)  # built in fp32 by the data pipeline
    sample = torch.cat([latents, mask, masked], dim=1)
    assert sample.dtype == torch.float32  # cat promotes
    timestep, text = torch.tensor([999.25]), torch.randn(1, 4, 8, dtype=torch.float16)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype, but got Float and Half"):
        unet(sample, timestep, text)

    hp.apply_recipe(unet, hp.get_recipe("unet.sd15", device="t4"), device="cpu")
    out = unet(sample, timestep, text).sample
    assert out.dtype == torch.float32 and torch.isfinite(out).all()
    assert unet.conv_in.weight.dtype == torch.float16


def test_onetrainer_fp16_vae_decodes_fp32_latents():
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    vae = AutoencoderKL(block_out_channels=[8, 16], norm_num_groups=4, layers_per_block=1, latent_channels=4,
                        down_block_types=["DownEncoderBlock2D"] * 2, up_block_types=["UpDecoderBlock2D"] * 2,
                        force_upcast=False).to(torch.float16)
    latents = torch.randn(1, 4, 8, 8)
    with pytest.raises(RuntimeError, match=r"Input type \(float\) and bias type \(c10::Half\)"):
        vae.decode(latents)

    hp.apply_recipe(vae, hp.get_recipe("vae.fp16_fix", device="t4"), device="cpu")
    image = vae.decode(latents).sample
    assert image.dtype == torch.float32 and torch.isfinite(image).all()
    assert vae.decoder.conv_in.weight.dtype == torch.float16
    posterior = vae.encode(torch.randn(1, 3, 16, 16)).latent_dist  # the encode path too
    assert torch.isfinite(posterior.mean).all()


def test_onetrainer_sdxl_output_embedding_layer_norm_half_vs_float():
    """OneTrainer builds SDXL's pooled 'output embedding' by calling text_encoder_2's final_layer_norm and
    text_projection on fp32 hidden states; with an fp16 encoder the layer_norm sees Half weights vs Float input.

    Nerogar/OneTrainer modules/model/util/clip_util.py (encode_clip) calls final_layer_norm by hand.
    """
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    torch.manual_seed(0)
    config = CLIPTextConfig(hidden_size=8, intermediate_size=16, num_attention_heads=2, num_hidden_layers=2,
                            vocab_size=99, max_position_embeddings=77, projection_dim=8, bos_token_id=0,
                            eos_token_id=1, pad_token_id=1)
    te2 = CLIPTextModelWithProjection(config).to(torch.float16)
    hidden = torch.randn(1, 5, 8)  # fp32, as the training loop keeps them
    with pytest.raises(RuntimeError, match=r"mixed dtype \(CPU\)|expected scalar type Float but found Half"):
        te2.text_model.final_layer_norm(hidden)

    hp.apply_recipe(te2, hp.get_recipe("clip.text", device="t4"), device="cpu")
    normed = te2.text_model.final_layer_norm(hidden)
    pooled = te2.text_projection(normed[:, -1].float())
    assert normed.dtype == torch.float16 and torch.isfinite(pooled).all()
    ids = make_tokenizer()("a cat", return_tensors="pt").input_ids
    assert torch.isfinite(te2(ids).text_embeds).all()  # the normal forward still works


def test_imaginairy_svd_fp16_on_cpu_with_fp32_noise(tiny_pipe, saved_pipeline):
    """brycedrennan/imaginAIry#442: SVD in fp16 with noise created in fp32 fails with mat1/mat2 Float vs Half
    (their fix was creating the noise in fp16). hf_precision runs the fp16 layout on the CPU whatever dtype the noise
    has."""
    plain = tiny_pipe("svd").to(torch.float16)
    noise = torch.randn(1, 2, 4, 16, 16)  # fp32 noise, as the user made it (32x32 frames, VAE factor 2)
    with pytest.raises(RuntimeError, match="mat1 and mat2 must have the same dtype, but got Float and Half"):
        plain(**example_call_kwargs("svd"), latents=noise, generator=torch.Generator().manual_seed(0))

    pipe = hp.load_pipeline(saved_pipeline("svd"), "cpu", recipe=hp.get_recipe("svd", device="t4"))
    assert pipe.unet.dtype == torch.float16 and pipe.vae.dtype == torch.float16
    out = pipe(**example_call_kwargs("svd"), latents=noise, generator=torch.Generator().manual_seed(0))
    frames = assert_finite(out)
    assert frames.shape[1] == 2


@pytest.mark.gpu
def test_omnilmm_vision_encoder_on_another_device(saved_pipeline):
    """OmniLMM / MiniCPM-V: the vision encoder's weights sit on another device than its input."""
    pipe = hp.load_pipeline(saved_pipeline("svd"), {"image_encoder": "cuda", "default": "cpu"},
                            recipe=hp.get_recipe("svd", device="t4"))
    assert pipe.image_encoder.device.type == "cuda" and pipe.unet.device.type == "cpu"
    pixel_values = torch.randn(1, 3, 224, 224)  # on the CPU, float32
    weight = pipe.image_encoder.vision_model.embeddings.patch_embedding.weight  # on CUDA, float16 (t4 recipe)
    with pytest.raises(RuntimeError) as info:
        torch.nn.functional.conv2d(pixel_values, weight)
    # CUDA words this "Input type (torch.FloatTensor) and weight type (torch.cuda.HalfTensor) should be the same
    # ...", other builds "Expected all tensors to be on the same device ...": judge what explain reports, not one
    # wording. It is a device mismatch, and when the wording carries the dtypes, a dtype mismatch too.
    err = hp.explain_error(info.value)
    assert isinstance(err, hp.MismatchError) and err.kind == "device", str(info.value)
    assert {err.got.split(":")[0], err.expected.split(":")[0]} == {"cpu", "cuda"}
    if err.sides_known:
        assert err.got == "cpu" and err.expected.startswith("cuda")
    if err.dtypes is not None:
        assert err.dtypes == ("float32", str(weight.dtype).removeprefix("torch."))
        assert str(err).startswith("device and dtype mismatch")
    assert torch.isfinite(pipe.image_encoder(pixel_values).image_embeds).all()
    assert_finite(pipe(**example_call_kwargs("svd"), generator=torch.Generator().manual_seed(0)))
