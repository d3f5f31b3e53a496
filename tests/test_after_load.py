"""What users do to a pipeline after ``hp.load_pipeline``: swap or add components, build another pipeline from it,
cast it, load a LoRA; the plan must still hold and the pipeline must still run (tiny SDXL, T4 layout on the CPU)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from diffusers import AutoencoderKL, AutoencoderTiny, StableDiffusionXLControlNetPipeline

import hf_precision as hp
from hf_precision.testing import example_call_kwargs, make_pipeline

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    from hf_precision.testing import save_pipeline

    return save_pipeline(make_pipeline("sdxl"), tmp_path_factory.mktemp("sdxl"))


@pytest.fixture
def pipe(folder):
    return hp.load_pipeline(folder, "cpu", layout="t4")


def _finite(pipe, kind="sdxl", **kw):
    images = pipe(**{**example_call_kwargs(kind), **kw}, generator=torch.Generator().manual_seed(0)).images
    return bool(np.isfinite(np.asarray(images)).all())


def test_a_vae_swapped_after_load_gets_the_plan_and_the_call_runs(pipe, folder):
    # the classic swap: plain diffusers (and the pipeline before this fix) fails in vae.post_quant_conv with
    # "Input type (c10::Half) and bias type (float) should be the same": fp16 latents into a hook-less fp32 VAE
    old, before, unet_hooks = pipe.vae, hp.applied(pipe), dict(pipe.unet._forward_pre_hooks)
    pipe.vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    record = hp.applied(pipe)
    # only the VAE was applied: the UNet keeps its hooks, and with them what its NaN guard decided
    assert record is before and dict(pipe.unet._forward_pre_hooks) == unet_hooks
    assert record.modules["vae"] is pipe.vae and hp.applied(old) is None   # the old VAE lost its hooks
    assert pipe.unet.dtype == torch.float16 and pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32
    assert record.verify() == [] and any("vae: a AutoencoderKL set after loading" in a for a in record.actions)
    assert _finite(pipe)


def test_the_new_vae_config_chooses_its_rule(pipe, folder):
    # an fp16-fix VAE (force_upcast=False) may run in fp16 on a T4; the shipped SDXL VAE runs in fp32 there
    fix = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float16)
    fix.register_to_config(force_upcast=False)
    pipe.vae = fix
    assert pipe.vae.dtype == torch.float16 and hp.applied(pipe).recipe["vae"].compute == "float16"
    shipped = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float16)
    pipe.vae = shipped
    assert pipe.vae.dtype == torch.float32 and hp.applied(pipe).recipe["vae"].compute == "float32"
    assert _finite(pipe, output_type="pt")


def test_from_pipe_keeps_the_plan_and_plans_the_controlnet(pipe):
    # diffusers' from_pipe casts every shared component to float32 unless given a dtype: the loaded pipeline's
    # fp16 UNet became fp32 (twice the memory), and the fp32 ControlNet had no plan
    controlnet = make_pipeline("sdxl_controlnet").controlnet
    assert controlnet.dtype == torch.float32
    control = StableDiffusionXLControlNetPipeline.from_pipe(pipe, controlnet=controlnet)
    assert pipe.unet.dtype == torch.float16 and pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32
    assert control.controlnet.dtype == torch.float16 and hp.applied(control).modules["controlnet"] is controlnet
    assert _finite(control, "sdxl_controlnet") and _finite(pipe)


def test_from_pipe_with_a_dtype_casts_as_diffusers_does(pipe):
    control = StableDiffusionXLControlNetPipeline.from_pipe(pipe, controlnet=make_pipeline("sdxl_controlnet").controlnet,
                                                           torch_dtype=torch.float32)
    assert control.unet.dtype == torch.float32 and hp.applied(control) is None


def test_apply_recipe_again_restores_the_loaded_plan_after_pipe_to_dtype(pipe):
    with pytest.warns(RuntimeWarning, match="cast the pipeline off its plan"):
        pipe.to(torch.float16)
    assert hp.applied(pipe).verify()  # islands and the fp32 VAE were cast
    hp.apply_recipe(pipe)  # the call verify() names: the plan it was loaded with (the T4's), not this CPU's
    assert pipe.unet.dtype == torch.float16 and pipe.unet.time_embedding.linear_1.weight.dtype == torch.float32
    assert pipe.vae.dtype == torch.float32 and hp.applied(pipe).verify() == []


def _ip_adapter_weights(unet, embed_dim: int, tokens: int = 4) -> dict:
    """Random IP-Adapter weights for ``unet`` in the layout ``load_ip_adapter`` reads (image projection + to_k/v_ip)."""
    cross, channels, ip, key = unet.config.cross_attention_dim, unet.config.block_out_channels, {}, 1
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue  # self-attention gets no IP weights, and no key number
        block = int(name.split(".")[1]) if not name.startswith("mid_block") else None
        width = channels[-1] if block is None else (channels[::-1] if name.startswith("up") else channels)[block]
        ip.update({f"{key}.to_k_ip.weight": torch.randn(width, cross) * 0.02,
                   f"{key}.to_v_ip.weight": torch.randn(width, cross) * 0.02})
        key += 2
    proj = {"proj.weight": torch.randn(cross * tokens, embed_dim) * 0.02, "proj.bias": torch.zeros(cross * tokens),
            "norm.weight": torch.ones(cross), "norm.bias": torch.zeros(cross)}
    return {"image_proj": proj, "ip_adapter": ip}


def test_an_ip_adapter_loaded_later_is_planned_and_unloaded(pipe):
    from transformers import CLIPImageProcessor
    from hf_precision.testing import example_image

    encoder = make_pipeline("sdxl_image_encoder").image_encoder
    # offline, in load_ip_adapter's order: it registers the encoder, then adds projection layers to the UNet
    pipe.register_modules(image_encoder=encoder, feature_extractor=CLIPImageProcessor(
        size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32}))
    assert pipe.image_encoder.dtype == torch.float16 and "image_encoder" in hp.applied(pipe).modules
    pipe.load_ip_adapter(_ip_adapter_weights(pipe.unet, encoder.config.projection_dim), subfolder="", weight_name="",
                         image_encoder_folder=None)
    assert pipe.unet.encoder_hid_proj is not None and hp.applied(pipe).verify() == []
    assert _finite(pipe, ip_adapter_image=example_image(32)) and hp.applied(pipe).verify() == []
    pipe.unload_ip_adapter()  # sets image_encoder to None
    assert "image_encoder" not in hp.applied(pipe).modules and hp.applied(encoder) is None
    assert _finite(pipe)


def test_compiled_wrapper_and_foreign_class_are_left_as_they_are(pipe):
    unet = pipe.unet
    pipe.unet = torch.compile(unet)  # lazy: nothing is compiled until called
    assert hp.applied(pipe).modules["unet"] is unet
    tiny = AutoencoderTiny(encoder_block_out_channels=(8, 8), decoder_block_out_channels=(8, 8),
                           num_encoder_blocks=(1, 1), num_decoder_blocks=(1, 1), latent_channels=4,
                           upsampling_scaling_factor=2).half()
    with pytest.warns(RuntimeWarning, match=r"vae was set to a AutoencoderTiny .* left as it is.*apply_recipe\(pipe, "
                                            r"overrides=\{'vae': \{'use'"):
        pipe.vae = tiny
    assert tiny.dtype == torch.float16 and "vae" not in hp.applied(pipe).modules


def test_lora_on_islands_keeps_them_fp32(pipe, tmp_path):
    from peft import LoraConfig
    from peft.utils import get_peft_model_state_dict

    source = make_pipeline("sdxl")
    targets = ["to_q", "to_v", "time_embedding.linear_1", "add_embedding.linear_2"]
    source.unet.add_adapter(LoraConfig(r=2, lora_alpha=2, target_modules=targets, init_lora_weights=False))
    layers = {k: v.to(torch.bfloat16) for k, v in get_peft_model_state_dict(source.unet).items()}
    type(source).save_lora_weights(tmp_path, unet_lora_layers=layers, safe_serialization=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pipe.load_lora_weights(tmp_path, adapter_name="a")
    assert pipe.unet.time_embedding.linear_1.lora_A["a"].weight.dtype == torch.float32
    assert _finite(pipe)
    pipe.fuse_lora()
    assert pipe.unet.time_embedding.linear_1.base_layer.weight.dtype == torch.float32 and _finite(pipe)
    pipe.unfuse_lora()
    pipe.unload_lora_weights()
    assert hp.applied(pipe).verify() == [] and _finite(pipe)


def test_auto_pipeline_from_pipe_is_planned(pipe):
    from diffusers import AutoPipelineForImage2Image

    hp.apply_recipe(pipe)  # install() wraps the AutoPipelines once their module is imported
    img2img = AutoPipelineForImage2Image.from_pipe(pipe)
    assert hp.applied(img2img).recipe["unet"].compute == "float16" and img2img.unet.dtype == torch.float16


def test_two_pipelines_from_one_keep_their_plans_and_the_source_its_record(pipe, folder):
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLInpaintPipeline

    own_vae = AutoencoderKL.from_pretrained(folder / "vae", torch_dtype=torch.float32)
    img2img = StableDiffusionXLImg2ImgPipeline.from_pipe(pipe, vae=own_vae)  # shares all but the VAE
    inpaint = StableDiffusionXLInpaintPipeline.from_pipe(pipe)  # the source was planned, so this one is too
    assert hp.applied(pipe) is not None and hp.applied(inpaint) is not None and inpaint.unet.dtype == torch.float16
    assert hp.applied(pipe).hooked["vae"] and hp.applied(img2img).modules["vae"] is own_vae
    assert _finite(pipe)  # its own VAE kept its hooks: fp16 latents still reach the fp32 VAE cast


def test_img2img_keeps_a_bfloat16_vae(folder):
    # SDXL img2img's prepare_latents casts a force_upcast VAE to float32 and then to the UNet's dtype: a bf16 VAE
    # (the A100 layout) ended in float16, where the SDXL VAE overflows
    from diffusers import StableDiffusionXLImg2ImgPipeline
    from hf_precision.testing import example_img2img_kwargs

    pipe = hp.load_pipeline(folder, "cpu", layout="a100", pipeline_class=StableDiffusionXLImg2ImgPipeline)
    assert pipe.vae.dtype == torch.bfloat16 and pipe.unet.dtype == torch.float16
    pipe(**example_img2img_kwargs(), generator=torch.Generator().manual_seed(0))
    assert pipe.vae.dtype == torch.bfloat16 and hp.applied(pipe).verify() == []


def test_pipe_to_dtype_warns_once_with_the_fix(pipe):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.to("cpu")  # a move keeps the plan: nothing to say
    with pytest.warns(RuntimeWarning, match=r"pipe.to\(torch.float16\) cast the pipeline off its plan: unet: 4 float32 "
                                            r"island parameters are float16.*re-apply: hf_precision.apply_recipe\(pipe\)"):
        pipe.to(torch.float16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.to(dtype=torch.float16)  # once per record


def test_from_pipe_to_a_class_no_recipe_lists_keeps_the_shared_plans(folder):
    # StableDiffusionXLPAGPipeline gets a recipe composed from its model classes, which cannot tell an SDXL VAE
    # (fp32 on a T4) from an SD 1.x one (fp16): the shared VAE keeps the plan it has, the overrides hold
    from diffusers import StableDiffusionXLPAGPipeline

    pipe = hp.load_pipeline(folder, "cpu", layout="t4", overrides={"text_encoder": {"dtype": "float32"}})
    pag = StableDiffusionXLPAGPipeline.from_pipe(pipe)
    assert hp.applied(pag).recipe.name != hp.applied(pipe).recipe.name
    assert (pag.vae.dtype, pag.text_encoder.dtype, pag.unet.dtype) == (torch.float32, torch.float32, torch.float16)
    assert _finite(pag)
