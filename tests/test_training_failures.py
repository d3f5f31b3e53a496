"""Each training failure of the user reports, reproduced with plain torch/diffusers/peft, then gone through the
training layer (N steps, finite falling loss, fp32 trainable weights, unchanged frozen weights, half storage).

Reports: Nerogar/OneTrainer#402 (time-embedding Linear, VAE, conv while sampling, inpainting latent_mask),
Nerogar/OneTrainer#752 (CLIP layer_norm with an fp32 embedding), hpcaitech/Open-Sora#379 (bf16 Conv3d),
OpenBMB/MiniCPM-V#318 (a part on another device), huggingface/diffusers#6363 ("Attempting to unscale FP16 gradients").
"""

from __future__ import annotations

import copy

import pytest
import torch

import hf_precision as hp
from hf_precision.training import TrainingError, example_batch
from training_checks import CLIP_NORM, CONV, MATMUL, UNSCALE, assert_planned_storage, run_steps


@pytest.fixture(scope="module")
def sd15():
    from hf_precision.testing import make_pipeline

    return make_pipeline("sd15", seed=0)


@pytest.fixture(scope="module")
def unet_batch(sd15):
    return example_batch(sd15.unet, 2, seed=1)


def test_fp16_unet_with_fp32_latents(sd15, unet_batch):
    unet = copy.deepcopy(sd15.unet).half()
    with pytest.raises(RuntimeError, match=MATMUL):
        unet(unet_batch["latents"], 10, unet_batch["prompt_embeds"])
    tp = hp.prepare_training(copy.deepcopy(sd15), layout="t4", train={"unet": "lora"})
    run_steps(tp, unet_batch, steps=3)  # fp32 latents and embeddings in the batch
    assert tp.scaler is not None and tp.compute_dtype == torch.float16
    assert assert_planned_storage(tp) > 0
    assert tp.components["unet"].conv_in.weight.dtype == torch.float16


def test_fp16_vae_encode_with_fp32_pixels(sd15):
    pixels = torch.rand(1, 3, 16, 16) * 2 - 1
    with pytest.raises(RuntimeError, match=CONV):
        copy.deepcopy(sd15.vae).half().encode(pixels)
    # The inference recipe computes this VAE in fp16 on a T4; training encodes in fp32 (recipes/sd15.yaml training:).
    assert hp.get_recipe("sd15", device="t4")["vae"].compute == "float16"
    tp = hp.prepare_training(copy.deepcopy(sd15), layout="t4", train={"unet": "lora"})
    assert tp.recipe["vae"].compute == "float32"
    latents = tp.encode_images(pixels, generator=torch.Generator().manual_seed(0))
    assert latents.shape == (1, 4, 8, 8) and torch.isfinite(latents).all()
    batch = {"latents": latents.expand(2, -1, -1, -1), "prompt_embeds": tp.encode_prompt(["a cat", "a dog"])["prompt_embeds"]}
    assert batch["prompt_embeds"].dtype == torch.float16  # the fp16 text encoder's output, fed to the UNet as is
    with pytest.raises(TrainingError, match=r"encode_prompt takes no max_length; it takes .*clip_skip"):
        tp.encode_prompt("a cat", max_length=8)
    run_steps(tp, batch, steps=3)


def test_fp32_vae_fed_half_latents_while_sampling():
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("sdxl", seed=0)
    plain = copy.deepcopy(pipe)
    plain.unet.half()
    with pytest.raises(RuntimeError, match=CONV):
        plain.vae.decode(torch.randn(1, 4, 8, 8, dtype=torch.float16))
    tp = hp.prepare_training(pipe, layout="t4", train={"unet": "lora"})
    assert (tp.recipe["unet"].compute, tp.recipe["vae"].compute) == ("float16", "float32")
    run_steps(tp, example_batch(tp.components["unet"], 1), steps=2)
    with tp.sampling() as p:
        images = p("a cat", num_inference_steps=2, output_type="np", generator=torch.Generator().manual_seed(0)).images
        decoded = p.vae.decode(torch.randn(1, 4, 8, 8, dtype=torch.float16)).sample
    assert torch.isfinite(torch.as_tensor(images)).all() and torch.isfinite(decoded).all()


def test_inpainting_latent_mask_concatenated_in_fp32():
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("sd_inpaint")
    latents = torch.randn(1, 4, 8, 8, dtype=torch.float16)
    mask = torch.ones(1, 1, 8, 8)  # fp32, as OneTrainer made it before PR #409
    cond = torch.cat([latents, mask, latents], dim=1)
    assert cond.dtype == torch.float32  # silently promoted: the failure comes one op later
    plain = copy.deepcopy(pipe.unet).half()
    with pytest.raises(RuntimeError, match=f"{CONV}|{MATMUL}"):
        plain(cond, 10, torch.randn(1, 4, plain.config.cross_attention_dim, dtype=torch.float16))
    tp = hp.prepare_training(pipe, layout="t4", train={"unet": "lora"})
    batch = example_batch(tp.components["unet"], 1)
    batch["condition_latents"] = torch.cat([mask, latents.float()], dim=1)
    run_steps(tp, batch, steps=3)


def test_bf16_conv3d_patch_embedding_with_fp32_input():
    from hf_precision.testing import make_pipeline

    pipe = make_pipeline("wan")
    batch = example_batch(pipe.transformer, 1)
    plain = copy.deepcopy(pipe.transformer).to(torch.bfloat16)
    assert isinstance(plain.patch_embedding, torch.nn.Conv3d)
    with pytest.raises(RuntimeError, match=CONV):
        plain(batch["latents"], torch.tensor([500.0]), batch["prompt_embeds"].bfloat16())
    tp = hp.prepare_training(pipe, layout="a100", train={"transformer": "lora"})
    assert tp.components["transformer"].patch_embedding.weight.dtype == torch.bfloat16
    run_steps(tp, batch, steps=3)


def test_clip_with_fp32_embedding_table_and_textual_inversion(sd15):
    ids = sd15.tokenizer(["a cat"], return_tensors="pt").input_ids
    plain = copy.deepcopy(sd15.text_encoder).half()
    plain.get_input_embeddings().float()
    with pytest.raises(RuntimeError, match=CLIP_NORM):
        plain(ids)
    tp = hp.prepare_training(copy.deepcopy(sd15), layout="t4", train={"text_encoder": "embedding"},
                             tokens={"text_encoder": ["<my-cat>"]}, init_tokens={"text_encoder": ["cat"]})
    encoder = tp.components["text_encoder"]
    assert encoder.dtype == torch.float16 and tp.parameters()[0].dtype == torch.float32
    table_before = encoder.get_input_embeddings().weight.detach().clone()
    batch = example_batch(tp.components["unet"], 1)

    def loss():
        embeds = tp.encode_prompt(["a photo of <my-cat>"])
        return tp.loss({**batch, **embeds}, generator=torch.Generator().manual_seed(0))

    run_steps(tp, batch, steps=3, lr=5e-2, loss_fn=loss)
    rows = encoder.get_input_embeddings()
    after = rows.merged()
    old = [i for i in range(after.shape[0]) if i not in rows.ids]
    assert torch.equal(after[old], table_before[old])  # every old row is untouched
    assert not torch.equal(after[rows.ids], table_before[rows.ids])  # the new row moved
    original = sd15.text_encoder.get_input_embeddings().weight
    assert torch.equal(after[old], original[old].half())


def test_add_adapter_on_fp16_unet_then_gradscaler(sd15, unet_batch):
    from peft import LoraConfig

    config = LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian", target_modules=["to_q", "to_k", "to_v", "to_out.0"])
    unet = copy.deepcopy(sd15.unet).half()
    unet.add_adapter(config)
    assert {p.dtype for p in unet.parameters() if p.requires_grad} == {torch.float16}  # peft's inject path
    scaler = torch.amp.GradScaler("cpu")
    optimizer = torch.optim.AdamW([p for p in unet.parameters() if p.requires_grad], lr=1e-3)
    with torch.autocast("cpu", dtype=torch.float16):
        out = unet(unet_batch["latents"].half(), 10, unet_batch["prompt_embeds"].half()).sample
    scaler.scale(out.float().pow(2).mean()).backward()
    with pytest.raises(ValueError, match=UNSCALE):
        scaler.step(optimizer)
    # The same pre-injected fp16 adapter through the layer: made fp32, scaled steps work.
    pipe = copy.deepcopy(sd15)
    pipe.unet.half()
    pipe.unet.add_adapter(config)
    tp = hp.prepare_training(pipe, layout="t4", train={"unet": "lora"})
    run_steps(tp, unet_batch, steps=3)


def test_step_names_a_parameter_cast_back_to_half(sd15, unet_batch):
    tp = hp.prepare_training(copy.deepcopy(sd15), layout="t4", train={"unet": "lora"})
    optimizer = torch.optim.AdamW(tp.parameters(), lr=1e-3)
    tp.backward(tp.loss(unet_batch))
    tp.components["unet"].to(torch.float16)  # what diffusers#13124's validation did to the live UNet
    with pytest.raises(TrainingError, match=r"unet\.down_blocks\.0\..*lora_A\.default\.weight \(float16\)"):
        tp.step(optimizer)
    assert tp.restore_masters() > 0
    tp.step(optimizer)


def test_part_on_another_device_is_named_by_the_preflight(sd15):
    layer = torch.nn.Linear(4, 4, device="meta")
    with pytest.raises((RuntimeError, NotImplementedError), match="meta"):
        layer(torch.ones(1, 4))
    tp = hp.prepare_training(copy.deepcopy(sd15), train={"unet": "lora"})
    tp.check()  # a correct set-up passes
    proj = tp.components["unet"].down_blocks[0].attentions[0].proj_in
    proj.to_empty(device="meta")  # a part never loaded, as a vision tower left behind
    with pytest.raises(TrainingError, match=r"unet\.down_blocks\.0\.attentions\.0\.proj_in: weight is on the meta device"):
        tp.check()


@pytest.mark.gpu
def test_frozen_part_left_on_cpu_beside_a_cuda_denoiser_is_named(sd15):
    """The MiniCPM-V case on a real second device: parts on cuda, one frozen part left on the CPU."""
    tp = hp.prepare_training(copy.deepcopy(sd15), device="cuda", train={"unet": "lora"})
    assert tp.components["unet"].conv_in.weight.device.type == "cuda"
    tp.check()  # a correct set-up passes: the plan says "cuda", the tensors sit on cuda:0
    encoder = tp.components["text_encoder"]
    layer = encoder.get_submodule(next(n for n, _ in encoder.named_modules() if n.endswith("encoder.layers.0")))
    layer.to("cpu")  # a frozen component's block left behind
    with pytest.raises(TrainingError, match=r"text_encoder\.(\S+\.)?encoder\.layers\.0\.\S+: on cpu, the rest of "
                                            r"text_encoder is planned on cuda"):
        tp.check()
    layer.to("cuda")
    tp.components["unet"].conv_in.to("cpu")  # a frozen layer of the trained denoiser itself
    with pytest.raises(TrainingError, match=r"unet\.conv_in: on cpu, the rest of unet is planned on cuda"):
        tp.check()


def test_half_module_inside_an_fp32_island_is_named():
    from hf_precision.testing import make_pipeline

    tp = hp.prepare_training(make_pipeline("sdxl", seed=0), layout="t4", train={"unet": "lora"})
    assert "time_embedding" in tp.applied.islands["unet"]
    tp.check()
    tp.components["unet"].time_embedding.linear_1.half()
    with pytest.raises(TrainingError, match=r"unet\.time_embedding\.linear_1: float16 inside the fp32 island"):
        tp.check()
