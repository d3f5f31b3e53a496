"""Training set-ups beyond a denoiser LoRA, each a class of failure benchmarks/train_sweep.py found: a ControlNet or
T2I-Adapter trained through tp.loss with the UNet frozen, text encoders trained through pipelines whose
encode_prompt is unusual, the SDXL refiner's time ids, MPS's fp32 attention on joint/rotary processors, a full
fine-tune of Sana under fp16 autocast, LoRA on AnimateDiff's motion projections, and what is refused with one
clear error. Each runs 3 steps on a fixed batch (finite falling loss, fp32 masters, frozen weights unchanged)."""

from __future__ import annotations

import pytest
import torch

import hf_precision as hp
from hf_precision.training import TrainingError, example_batch
from training_checks import assert_planned_storage, run_steps


def _make(name):
    from hf_precision.testing import make_pipeline

    return make_pipeline(name, seed=0)


def _control_image(tp, latents):
    f = tp.pipe.vae_scale_factor
    frames = (latents.shape[2],) if latents.dim() == 5 else ()  # AnimateDiff: one control frame per frame
    return torch.rand(latents.shape[0], *frames, 3, latents.shape[-2] * f, latents.shape[-1] * f,
                      generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name, part", [("sd_controlnet", "controlnet"), ("sdxl_adapter", "adapter"),
                                        ("animatediff_controlnet", "controlnet")])
def test_controlnet_or_adapter_trains_beside_a_frozen_unet(name, part):
    """train={"controlnet": "full"} as diffusers' examples/controlnet/train_controlnet.py: the residuals go into the
    frozen fp16 UNet (T4 layout); without a control image the step is refused, naming the batch key."""
    tp = hp.prepare_training(_make(name), layout="t4", train={part: "full"})
    assert tp.kinds["unet"] == "frozen" and tp.components["unet"].dtype == torch.float16
    batch = example_batch(tp.components["unet"], 1)
    with pytest.raises(TrainingError, match="control_image"):
        tp.loss(batch)
    batch["control_image"] = _control_image(tp, batch["latents"])
    run_steps(tp, batch, steps=3, lr=1e-3)
    assert all(n.startswith(part + ".") for n, _ in tp.named_parameters())
    assert assert_planned_storage(tp) > 0


# Pipelines whose encode_prompt needs care to train a text encoder through it: Kandinsky 3's is decorated with
# @torch.no_grad(), Stable Cascade's requires batch_size, I2VGenXL's reads a guidance scale only __call__ sets,
# HunyuanDiT's CLIP side is a BERT (query/key/value); the SDXL refiner takes 5 time ids (an aesthetic score).
@pytest.mark.parametrize("name, train", [
    ("kandinsky3", {"text_encoder": "lora"}),
    ("cascade_prior", {"text_encoder": "lora"}),
    ("i2vgenxl", {"text_encoder": "lora"}),
    ("hunyuandit", {"text_encoder": "lora"}),
    ("sdxl_refiner", {"unet": "lora"}),
])
def test_training_through_the_pipelines_encode_prompt(name, train):
    tp = hp.prepare_training(_make(name), layout="t4", train=train)
    example = example_batch(tp.components[tp.denoiser_name], 1)
    # the latents, and I2VGen-XL's image inputs (its pipeline always builds them: tp.loss refuses a batch without)
    given = {k: example[k] for k in ("latents", "image_latents", "image_embeds") if k in example}

    def loss():
        return tp.loss({**given, **tp.encode_prompt(["a cat"])}, generator=torch.Generator().manual_seed(0))

    run_steps(tp, {}, steps=3, loss_fn=loss)
    assert {n.split(".")[0] for n, _ in tp.named_parameters()} == set(train)


@pytest.mark.parametrize("name", ["sd3", "hunyuan_video"])
def test_fp32_attention_of_macos15_keeps_joint_and_masked_processors(name):
    """MPS >= 14.5 computes attention in fp32: SD3's joint processor returns two outputs and HunyuanVideo's token
    refiner passes a 4D mask, which the classic processor could not take; both keep their own processor."""
    tp = hp.prepare_training(_make(name), layout="m2-macos15")
    denoiser = tp.components[tp.denoiser_name]
    assert any(getattr(m, "upcast_softmax", False) for m in denoiser.modules())
    run_steps(tp, example_batch(denoiser, 1), steps=3)


def test_full_fine_tune_under_fp16_autocast_keeps_explicit_fp32_attention():
    """Sana's linear attention runs its scores in fp32 on purpose; fp16 autocast made the first loss NaN."""
    tp = hp.prepare_training(_make("sana"), layout="t4", train={"transformer": "full"})
    assert tp.compute_dtype == torch.float16 and tp.scaler is not None
    run_steps(tp, example_batch(tp.components["transformer"], 1), steps=3, lr=1e-3)


def test_lora_on_every_linear_of_animatediffs_motion_modules():
    """The motion transformer calls proj_in(input=x); peft's LoRA Linear takes forward(x)."""
    from peft import LoraConfig

    tp = hp.prepare_training(_make("animatediff"), layout="t4",
                             lora=LoraConfig(r=2, lora_alpha=2, init_lora_weights="gaussian", target_modules="all-linear"))
    assert any(".motion_modules." in n and "proj_in.lora_A" in n for n, _ in tp.named_parameters())
    run_steps(tp, example_batch(tp.components["unet"], 1), steps=3)


def test_bf16_accelerate_autocast_around_fp16_weights():
    """Accelerator(mixed_precision="bf16").prepare wraps the UNet's forward in a bf16 autocast, inside the forward
    hooks: fp16 weights then met bf16 activations ("mixed dtype (CPU)"); the plan's guard runs inside it."""
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(reset_partial_state=True)
    try:
        accelerator = Accelerator(mixed_precision="bf16", cpu=True)
        tp = hp.prepare_training(_make("sd15"), layout="t4")
        optimizer = torch.optim.AdamW(tp.parameters(), lr=1e-2)
        accelerator.prepare(tp.components["unet"], optimizer)
        batch = example_batch(tp.components["unet"], 1)
        with accelerator.autocast():
            run_steps(tp, batch, steps=3)
    finally:
        AcceleratorState._reset_state(reset_partial_state=True)


def test_refusals_name_the_part_and_the_fix():
    from peft import LoraConfig

    tp = hp.prepare_training(_make("sd15"), layout="t4")
    with pytest.raises(TrainingError, match=r"loss does not depend on anything that trains \(unet: lora\)"):
        tp.backward(torch.zeros((), requires_grad=False))
    with pytest.raises(TrainingError, match=r"train: unet: lora target_modules=\{'no_such_layer'\}.*'all-linear'"):
        hp.prepare_training(_make("sd15"), lora=LoraConfig(r=2, target_modules=["no_such_layer"]))
    i2v = hp.prepare_training(_make("hunyuan_video_i2v"), layout="t4")
    with pytest.raises(TrainingError, match=r"encode_prompt needs image; pass image=\.\.\."):
        i2v.encode_prompt(["a cat"])
    flux = hp.prepare_training(_make("flux_controlnet"), layout="t4", train={"controlnet": "full"})
    batch = example_batch(flux.components["transformer"], 1)
    with pytest.raises(TrainingError, match=r"controlnet \(FluxControlNetModel\) beside a FluxTransformer2DModel"):
        flux.loss({**batch, "control_image": torch.zeros(1, 3, 16, 16)})


def test_cogvideox_i2v_preflight_uses_its_learned_position_size():
    tp = hp.prepare_training(_make("cogvideox_i2v"), layout="t4")
    tp.check()


@pytest.mark.parametrize("name, part", [("sd_controlnet", "controlnet"), ("sdxl_adapter", "adapter"),
                                        ("animatediff_controlnet", "controlnet")])
def test_check_runs_a_trained_side_network_on_a_stand_in_control_image(name, part):
    """tp.check() as docs/training.md's loop calls it (no batch) on a ControlNet / T2I-Adapter run: its example step
    carries a control image, where it refused its own batch ('needs the control image', said to fail in the UNet)."""
    tp = hp.prepare_training(_make(name), layout="t4", train={part: "full"})
    tp.check()
    assert all(p.grad is None for p in tp.parameters())


def test_check_names_the_unfed_side_network_not_a_module():
    """A ControlNet beside a denoiser whose forward takes no residuals: tp.check() says tp.loss's refusal as it is,
    not 'a training step fails in transformer (FluxTransformer2DModel: ...weights...)'."""
    tp = hp.prepare_training(_make("flux_controlnet"), layout="t4", train={"controlnet": "full"})
    with pytest.raises(TrainingError, match=r"^tp\.check: tp\.loss: the controlnet \(FluxControlNetModel\) beside a "
                                            r"FluxTransformer2DModel is not fed") as caught:
        tp.check()
    assert "fails in" not in str(caught.value)


def test_save_lora_of_a_part_the_loader_cannot_write_is_one_clear_error(tmp_path):
    """tp.save_lora on HiDream with a text-encoder LoRA: diffusers' HiDreamImageLoraLoaderMixin.save_lora_weights takes
    transformer_lora_layers only; its TypeError became our error naming the parts and what to do, nothing written."""
    tp = hp.prepare_training(_make("hidream"), train={"transformer": "lora", "text_encoder": "lora"}, rank=2)
    with pytest.raises(TrainingError, match=r"tp\.save_lora: HiDreamImagePipeline's LoRA file .* takes the LoRA of "
                                            r"transformer only, not of text_encoder; save those adapters yourself"):
        tp.save_lora(tmp_path / "out")
    assert not (tmp_path / "out").exists()
