"""Tiny random-weight pipelines of the UNet image and video families (no Hub, no weights).

One row of :data:`ROWS` (gathered in :data:`hf_precision.testing.registry.PIPELINES`) per pipeline class that a
shipped recipe names and that the tests exercise: SD 1.x/2.x variants (image-to-image, inpainting, ControlNet,
T2I-Adapter, x4 upscaler), SDXL variants (ControlNet, T2I-Adapter, refiner-style image-to-image, inpainting),
AnimateDiff (SD and ControlNet), I2VGen-XL, Kandinsky 3 and Stable Cascade (prior and decoder). Each row builds its pipeline in float32 from a seed, offline (handmade
tokenizers from :mod:`hf_precision.testing.tokenizers`), and gives call kwargs for two denoising steps::

    >>> from hf_precision.testing import PIPELINES, make_pipeline
    >>> pipe = make_pipeline("sd_controlnet")
    >>> out = pipe(**PIPELINES["sd_controlnet"].call_kwargs())
    >>> out.images.shape
    (1, 32, 32, 3)

The tiny sizes follow ``get_dummy_components`` of diffusers' own tests (tests/pipelines/<family>/test_*.py),
shrunk further where the pipeline allows. Nothing heavy is imported at module import time.
"""

from __future__ import annotations

from typing import Any

from .parts import example_image, seeded as _seeded, t5_encoder
from .pipelines import make_sd15, make_sdxl
from .record import TinyPipeline
from .tokenizers import make_t5_tokenizer, make_tokenizer

__all__ = ["ROWS"]


def _image_kwargs(**extra: Any) -> dict[str, Any]:
    return {"prompt": "a cat", "num_inference_steps": 2, "guidance_scale": 5.0, "output_type": "np", **extra}


def _mask(side: int = 32) -> Any:
    from PIL import Image

    mask = Image.new("L", (side, side), 0)
    mask.paste(255, (side // 4, side // 4, 3 * side // 4, 3 * side // 4))
    return mask


def _clip_vision(seed: int, projection_dim: int = 8, image_size: int = 32) -> Any:
    from transformers import CLIPVisionConfig, CLIPVisionModelWithProjection

    config = CLIPVisionConfig(hidden_size=8, projection_dim=projection_dim, num_hidden_layers=1, num_attention_heads=2,
                              image_size=image_size, patch_size=16, intermediate_size=16)
    return _seeded(seed, lambda: CLIPVisionModelWithProjection(config))


def _image_processor(side: int = 32) -> Any:
    import warnings

    from transformers import CLIPImageProcessor

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "torchvision not available, falling back to the PIL processor"
        return CLIPImageProcessor(crop_size=side, size=side)


# ------------------------------------------------------------------------------------------------ SD 1.x / 2.x


def _sd_img2img(seed: int) -> Any:
    from diffusers import StableDiffusionImg2ImgPipeline

    # requires_safety_checker=False as in make_sd15: `.components` leaves the flag out, and diffusers' default (True)
    # with no checker logs a license notice on every load of the saved folder
    return StableDiffusionImg2ImgPipeline(**make_sd15(seed=seed).components, requires_safety_checker=False)


def _sd_inpaint(seed: int) -> Any:
    from diffusers import StableDiffusionInpaintPipeline

    # 9 input channels: latents + mask + masked-image latents, as in the real inpainting checkpoints
    return StableDiffusionInpaintPipeline(**make_sd15({"unet": {"in_channels": 9}}, seed=seed).components,
                                          requires_safety_checker=False)


def _controlnet_from(unet: Any, seed: int) -> Any:
    from diffusers import ControlNetModel

    # two conditioning levels: the control image is downsampled 2x, like the tiny VAE (2 levels)
    return _seeded(seed + 1, lambda: ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(4, 8),
                                                               load_weights_from_unet=False))


def _sd_controlnet(seed: int) -> Any:
    from diffusers import StableDiffusionControlNetPipeline

    base = make_sd15(seed=seed)
    return StableDiffusionControlNetPipeline(**base.components, controlnet=_controlnet_from(base.unet, seed),
                                             requires_safety_checker=False)


def _sd_adapter(seed: int) -> Any:
    from diffusers import StableDiffusionAdapterPipeline, T2IAdapter

    base = make_sd15({"unet": {"down_block_types": ["CrossAttnDownBlock2D", "DownBlock2D"]}}, seed=seed)
    adapter = _seeded(seed + 1, lambda: T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=2,
                                                   adapter_type="full_adapter"))
    components = {k: v for k, v in base.components.items() if k != "image_encoder"}
    return StableDiffusionAdapterPipeline(**components, adapter=adapter, requires_safety_checker=False)


def _sd_upscale(seed: int) -> Any:
    from diffusers import DDPMScheduler, StableDiffusionUpscalePipeline

    # the x4 upscaler UNet: 4 latent + 3 low-res image channels in, noise level as class labels
    base = make_sd15({"unet": {"in_channels": 7, "num_class_embeds": 1000}, "vae": {"scaling_factor": 0.08333}},
                     seed=seed)
    return StableDiffusionUpscalePipeline(vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer,
                                          unet=base.unet, low_res_scheduler=DDPMScheduler(), scheduler=base.scheduler,
                                          max_noise_level=350)


# ------------------------------------------------------------------------------------------------ SDXL


def _sdxl_controlnet(seed: int) -> Any:
    from diffusers import StableDiffusionXLControlNetPipeline

    base = make_sdxl(seed=seed)
    return StableDiffusionXLControlNetPipeline(**base.components, controlnet=_controlnet_from(base.unet, seed))


def _sdxl_refiner(seed: int) -> Any:
    from diffusers import StableDiffusionXLImg2ImgPipeline

    # The refiner: no text_encoder; its UNet sees text_encoder_2's hidden states only and an aesthetic score
    # in place of the target size (te2.projection_dim + 5 * addition_time_embed_dim).
    base = make_sdxl({"unet": {"cross_attention_dim": 8, "projection_class_embeddings_input_dim": 8 + 5 * 4}}, seed=seed)
    return StableDiffusionXLImg2ImgPipeline(vae=base.vae, text_encoder=None, text_encoder_2=base.text_encoder_2,
                                            tokenizer=None, tokenizer_2=base.tokenizer_2, unet=base.unet,
                                            scheduler=base.scheduler, requires_aesthetics_score=True,
                                            force_zeros_for_empty_prompt=False)


def _sdxl_inpaint(seed: int) -> Any:
    from diffusers import StableDiffusionXLInpaintPipeline

    return StableDiffusionXLInpaintPipeline(**make_sdxl({"unet": {"in_channels": 9}}, seed=seed).components)


def _sdxl_adapter(seed: int) -> Any:
    from diffusers import StableDiffusionXLAdapterPipeline, T2IAdapter

    base = make_sdxl(seed=seed)
    adapter = _seeded(seed + 1, lambda: T2IAdapter(in_channels=3, channels=[8, 16], num_res_blocks=1, downscale_factor=4,
                                                   adapter_type="full_adapter_xl"))
    return StableDiffusionXLAdapterPipeline(**base.components, adapter=adapter)


def _sdxl_ip_adapter_encoder(seed: int) -> Any:
    from diffusers import StableDiffusionXLPipeline

    # The IP-Adapter image encoder saved with the pipeline (the adapter weights themselves live in the UNet).
    base = make_sdxl(seed=seed)
    components = {**base.components, "image_encoder": _clip_vision(seed), "feature_extractor": _image_processor()}
    return StableDiffusionXLPipeline(**components)


# ------------------------------------------------------------------------------------------------ AnimateDiff


def _motion_adapter(seed: int) -> Any:
    from diffusers import MotionAdapter

    return _seeded(seed + 2, lambda: MotionAdapter(block_out_channels=(8, 16), motion_layers_per_block=1,
                                                   motion_norm_num_groups=2, motion_num_attention_heads=2,
                                                   motion_max_seq_length=8))


def _animatediff(seed: int) -> Any:
    from diffusers import AnimateDiffPipeline

    base = make_sd15(seed=seed)
    components = {k: v for k, v in base.components.items() if k not in ("safety_checker", "requires_safety_checker")}
    return AnimateDiffPipeline(**components, motion_adapter=_motion_adapter(seed))


def _animatediff_controlnet(seed: int) -> Any:
    from diffusers import AnimateDiffControlNetPipeline

    base = make_sd15(seed=seed)
    components = {k: v for k, v in base.components.items() if k not in ("safety_checker", "requires_safety_checker")}
    return AnimateDiffControlNetPipeline(**components, motion_adapter=_motion_adapter(seed),
                                         controlnet=_controlnet_from(base.unet, seed))


# ------------------------------------------------------------------------------------------------ I2VGen-XL


def _i2vgenxl(seed: int) -> Any:
    from diffusers import AutoencoderKL, DDIMScheduler, I2VGenXLPipeline
    from diffusers.models.unets import I2VGenXLUNet
    from transformers import CLIPTextConfig, CLIPTextModel

    unet = _seeded(seed, lambda: I2VGenXLUNet(
        block_out_channels=(4, 8), layers_per_block=1, sample_size=16, in_channels=4, out_channels=4,
        down_block_types=("CrossAttnDownBlock3D", "DownBlock3D"), up_block_types=("UpBlock3D", "CrossAttnUpBlock3D"),
        cross_attention_dim=4, attention_head_dim=4, num_attention_heads=None, norm_num_groups=2))
    # two VAE levels (diffusers' test has one): 16x16 latents keep the temporal attention small
    vae = _seeded(seed, lambda: AutoencoderKL(block_out_channels=(8, 8), in_channels=3, out_channels=3,
                                              down_block_types=["DownEncoderBlock2D"] * 2,
                                              up_block_types=["UpDecoderBlock2D"] * 2, latent_channels=4, sample_size=32,
                                              norm_num_groups=2))
    text_encoder = _seeded(seed, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=4, intermediate_size=16, num_attention_heads=2,
        num_hidden_layers=2, vocab_size=99, hidden_act="gelu", projection_dim=32)))
    return I2VGenXLPipeline(vae=vae, text_encoder=text_encoder, tokenizer=make_tokenizer(),
                            image_encoder=_clip_vision(seed, projection_dim=4), feature_extractor=_image_processor(),
                            unet=unet, scheduler=DDIMScheduler(beta_schedule="scaled_linear", clip_sample=False,
                                                               set_alpha_to_one=False))


# ------------------------------------------------------------------------------------------------ Kandinsky 3


def _kandinsky3(seed: int) -> Any:
    from diffusers import DDPMScheduler, Kandinsky3Pipeline, Kandinsky3UNet, VQModel

    tokenizer = make_t5_tokenizer()
    unet = _seeded(seed, lambda: Kandinsky3UNet(in_channels=4, time_embedding_dim=4, groups=2, attention_head_dim=4,
                                                layers_per_block=3, block_out_channels=(32, 64), cross_attention_dim=4,
                                                encoder_hid_dim=32))
    movq = _seeded(seed, lambda: VQModel(
        block_out_channels=[32, 64], down_block_types=["DownEncoderBlock2D", "AttnDownEncoderBlock2D"], in_channels=3,
        latent_channels=4, layers_per_block=1, norm_num_groups=8, norm_type="spatial", num_vq_embeddings=12,
        out_channels=3, up_block_types=["AttnUpDecoderBlock2D", "UpDecoderBlock2D"], vq_embed_dim=4))
    text_encoder = t5_encoder(seed, vocab_size=max(200, len(tokenizer)))
    scheduler = DDPMScheduler(beta_start=0.00085, beta_end=0.012, steps_offset=1, beta_schedule="squaredcos_cap_v2",
                              clip_sample=True, thresholding=False)
    return Kandinsky3Pipeline(tokenizer=tokenizer, text_encoder=text_encoder, unet=unet, scheduler=scheduler, movq=movq)


# ------------------------------------------------------------------------------------------------ Stable Cascade


def _cascade_text_encoder(seed: int) -> Any:
    from transformers import CLIPTextConfig, CLIPTextModelWithProjection

    return _seeded(seed, lambda: CLIPTextModelWithProjection(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32, projection_dim=32, intermediate_size=37,
        num_attention_heads=4, num_hidden_layers=2, vocab_size=99)))


def _cascade_prior(seed: int) -> Any:
    from diffusers import DDPMWuerstchenScheduler, StableCascadePriorPipeline, StableCascadeUNet

    prior = _seeded(seed, lambda: StableCascadeUNet(
        conditioning_dim=32, block_out_channels=(32, 32), num_attention_heads=(2, 2), down_num_layers_per_block=(1, 1),
        up_num_layers_per_block=(1, 1), clip_image_in_channels=8, switch_level=(False,), clip_text_in_channels=32,
        clip_text_pooled_in_channels=32, dropout=(0.0, 0.0), in_channels=16, out_channels=16,
        timestep_ratio_embedding_dim=16))
    return StableCascadePriorPipeline(prior=prior, text_encoder=_cascade_text_encoder(seed), tokenizer=make_tokenizer(),
                                      scheduler=DDPMWuerstchenScheduler(), image_encoder=_clip_vision(seed),
                                      feature_extractor=_image_processor())


def _cascade_decoder(seed: int) -> Any:
    from diffusers import DDPMWuerstchenScheduler, StableCascadeDecoderPipeline, StableCascadeUNet
    from diffusers.pipelines.deprecated.wuerstchen.modeling_paella_vq_model import PaellaVQModel

    decoder = _seeded(seed, lambda: StableCascadeUNet(
        in_channels=4, out_channels=4, conditioning_dim=32, block_out_channels=(16, 32), num_attention_heads=(-1, 2),
        down_num_layers_per_block=(1, 1), up_num_layers_per_block=(1, 1), down_blocks_repeat_mappers=(1, 1),
        up_blocks_repeat_mappers=(2, 1),
        block_types_per_layer=(("SDCascadeResBlock", "SDCascadeTimestepBlock"),
                               ("SDCascadeResBlock", "SDCascadeTimestepBlock", "SDCascadeAttnBlock")),
        clip_text_pooled_in_channels=32, clip_seq=4, effnet_in_channels=16, pixel_mapper_in_channels=3,
        dropout=(0.0, 0.0), timestep_ratio_embedding_dim=16, switch_level=None))
    vqgan = _seeded(seed, lambda: PaellaVQModel(levels=2, bottleneck_blocks=1, embed_dim=8, latent_channels=4,
                                                num_vq_embeddings=8))
    return StableCascadeDecoderPipeline(decoder=decoder, tokenizer=make_tokenizer(),
                                        text_encoder=_cascade_text_encoder(seed), scheduler=DDPMWuerstchenScheduler(),
                                        vqgan=vqgan, latent_dim_scale=4.0)


def _cascade_decoder_kwargs() -> dict[str, Any]:
    import torch

    return {"image_embeddings": torch.randn(1, 16, 2, 2, generator=torch.Generator().manual_seed(3)), "prompt": "a cat",
            "guidance_scale": 2.0, "num_inference_steps": 2, "output_type": "np"}


# ------------------------------------------------------------------------------------------------ registry


def _control(side: int = 32) -> Any:
    return example_image(side, seed=2)


_IMAGE, _VIDEO = ("image", "unet"), ("video", "unet")
_IN = lambda: example_image(32, seed=1)  # noqa: E731 - the input image of image-to-image rows

ROWS = (
    TinyPipeline("sd_img2img", "StableDiffusionImg2ImgPipeline", "sd15", _sd_img2img,
                 lambda: _image_kwargs(image=_IN(), strength=0.75), _IMAGE),
    TinyPipeline("sd_inpaint", "StableDiffusionInpaintPipeline", "sd15", _sd_inpaint,
                 lambda: _image_kwargs(image=_IN(), mask_image=_mask(), height=32, width=32, strength=1.0), _IMAGE),
    TinyPipeline("sd_controlnet", "StableDiffusionControlNetPipeline", "sd15", _sd_controlnet,
                 lambda: _image_kwargs(image=_control(), height=32, width=32), _IMAGE),
    TinyPipeline("sd_adapter", "StableDiffusionAdapterPipeline", "sd15", _sd_adapter,
                 lambda: _image_kwargs(image=_control(), height=32, width=32), _IMAGE),
    TinyPipeline("sd_upscale", "StableDiffusionUpscalePipeline", "sd_upscale", _sd_upscale,
                 lambda: _image_kwargs(image=example_image(8, seed=1), noise_level=20), _IMAGE),
    TinyPipeline("sdxl_controlnet", "StableDiffusionXLControlNetPipeline", "sdxl", _sdxl_controlnet,
                 lambda: _image_kwargs(image=_control(), height=32, width=32), _IMAGE),
    TinyPipeline("sdxl_refiner", "StableDiffusionXLImg2ImgPipeline", "sdxl", _sdxl_refiner,
                 lambda: _image_kwargs(image=_IN(), strength=0.6), _IMAGE),
    TinyPipeline("sdxl_inpaint", "StableDiffusionXLInpaintPipeline", "sdxl", _sdxl_inpaint,
                 lambda: _image_kwargs(image=_IN(), mask_image=_mask(), height=32, width=32, strength=1.0), _IMAGE),
    TinyPipeline("sdxl_adapter", "StableDiffusionXLAdapterPipeline", "sdxl", _sdxl_adapter,
                 lambda: _image_kwargs(image=_control(), height=32, width=32), _IMAGE),
    TinyPipeline("sdxl_image_encoder", "StableDiffusionXLPipeline", "sdxl", _sdxl_ip_adapter_encoder,
                 lambda: _image_kwargs(height=32, width=32), _IMAGE),
    TinyPipeline("animatediff", "AnimateDiffPipeline", "animatediff", _animatediff,
                 lambda: _image_kwargs(num_frames=2, height=32, width=32), _VIDEO, output="frames", mode="t2v"),
    TinyPipeline("animatediff_controlnet", "AnimateDiffControlNetPipeline", "animatediff", _animatediff_controlnet,
                 lambda: _image_kwargs(num_frames=2, height=32, width=32, conditioning_frames=[_control(), _control()]),
                 _VIDEO, output="frames", mode="t2v"),
    TinyPipeline("i2vgenxl", "I2VGenXLPipeline", "i2vgenxl", _i2vgenxl,
                 lambda: _image_kwargs(image=_IN(), num_frames=2, height=32, width=32, decode_chunk_size=2,
                                       target_fps=4, clip_skip=None), _VIDEO, output="frames", mode="i2v"),
    TinyPipeline("kandinsky3", "Kandinsky3Pipeline", "kandinsky3", _kandinsky3,
                 lambda: _image_kwargs(height=16, width=16, guidance_scale=3.0), _IMAGE),
    TinyPipeline("cascade_prior", "StableCascadePriorPipeline", "cascade_prior", _cascade_prior,
                 lambda: {"prompt": "a cat", "height": 128, "width": 128, "guidance_scale": 2.0,
                          "num_inference_steps": 2, "output_type": "pt"}, _IMAGE, output="image_embeddings"),
    # diffusers cannot load its saved folder: model_index names PaellaVQModel, which diffusers does not export
    TinyPipeline("cascade_decoder", "StableCascadeDecoderPipeline", "cascade", _cascade_decoder,
                 _cascade_decoder_kwargs, _IMAGE, loads=False),
)
