"""Denoisers that take channels beyond the noisy latents (inpainting's mask and masked image, an image-to-video
model's first frame) are trained with what their pipeline builds at inference from the sample, not zeros.

The families are found from the tiny registry's configs (a denoiser whose input channels exceed its latents'), not
listed by hand: each either has a condition builder whose output the denoiser receives exactly as the pipeline's own
prepare_latents / prepare_mask_latents builds it for the same image and generator, or its training is refused with
one clear error naming the pipeline; a new family is one or the other.
"""

from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
import torch

from hf_precision.testing.build import component_configs, find_class
from hf_precision.testing.registry import PIPELINES
from hf_precision.training import denoiser_rows
from hf_precision.training.denoiser_rows import ROWS, TrainingError, condition_channels
from hf_precision.training.inputs.inpaint_mask import random_mask


def _configs(name: str, size: object = "tiny") -> dict[str, tuple[str, dict]]:
    """(class name, config) per model component of a registry row, a derived row's base included (nothing built)."""
    row = PIPELINES[name].row
    base = row.data.get("base")
    out = _configs(base, row.data.get("size") or "tiny") if base else {}
    own, _ = component_configs(row, "tiny" if base else size)
    specs = row.data.get("components", {})
    out.update({k: (specs[k]["class"], cfg) for k, cfg in own.items()
                if isinstance(specs.get(k), dict) and "class" in specs[k]})
    return out


def _conditioned() -> list[tuple[str, str]]:
    """(registry row, denoiser component) of every denoiser with a training row that takes extra channels."""
    import diffusers

    found = []
    for name in PIPELINES:
        for comp, (cls_name, cfg) in _configs(name).items():
            if not hasattr(diffusers, cls_name) and "." not in cls_name:
                continue  # a transformers class (text or image encoder): no denoiser
            cls = find_class(cls_name, name)
            row = next((ROWS[c.__name__] for c in cls.__mro__ if c.__name__ in ROWS), None)
            if row is None:
                continue
            init = inspect.signature(inspect.unwrap(cls.__init__)).parameters
            config = {**{k: p.default for k, p in init.items() if p.default is not p.empty}, **cfg}
            if condition_channels(row, SimpleNamespace(config=config)):
                found.append((name, comp))
    return found


CONDITIONED = _conditioned()
SEED = 3


def _pixels(pipe, name: str) -> torch.Tensor:
    gen = torch.Generator().manual_seed(1)
    size = 32
    if "video" in PIPELINES[name].tags:
        frames = int(PIPELINES[name].call_kwargs().get("num_frames") or 5)
        return torch.rand(1, 3, frames, size, size, generator=gen) * 2 - 1
    return torch.rand(1, 3, size, size, generator=gen) * 2 - 1


# The pipeline's own construction of the extra channels for one image and generator, as the denoiser receives them
# (the pipeline's layout: (B, F, C, h, w) for SVD, packed tokens for Flux Fill), in the order it concatenates them.
def _ref_inpaint(pipe, pixels, latents, gen):
    mask = random_mask(1, *pixels.shape[-2:], gen)  # the same draw as the builder's, from the same generator
    small, masked = pipe.prepare_mask_latents(mask, pixels * (mask < 0.5), 1, *pixels.shape[-2:], torch.float32,
                                              torch.device("cpu"), gen, False)
    return torch.cat([small, masked], dim=1)


def _ref_fill(pipe, pixels, latents, gen):
    mask = random_mask(1, *pixels.shape[-2:], gen)
    mask_p, masked_p = pipe.prepare_mask_latents(mask, pixels * (1 - mask), 1, latents.shape[1], 1,
                                                 *pixels.shape[-2:], torch.float32, torch.device("cpu"), gen)
    return torch.cat([masked_p, mask_p], dim=-1)


def _ref_wan(pipe, pixels, latents, gen):
    _, condition = pipe.prepare_latents(pixels[:, :, 0], 1, latents.shape[1], *pixels.shape[-2:], pixels.shape[2],
                                        torch.float32, torch.device("cpu"), gen)
    return condition


def _ref_svd(pipe, pixels, latents, gen):
    from diffusers.utils.torch_utils import randn_tensor

    image = pixels[:, :, 0]
    image = image + 0.02 * randn_tensor(image.shape, generator=gen, dtype=image.dtype)  # __call__'s noise_aug
    image_latents = pipe._encode_vae_image(image, torch.device("cpu"), 1, False)
    return image_latents.unsqueeze(1).repeat(1, pixels.shape[2], 1, 1, 1)


def _ref_zeros(pipe, pixels, latents, gen):  # HunyuanVideo 1.5 text-to-video: the pipeline's own zeros
    return torch.cat(pipe.prepare_cond_latents_and_mask(latents, torch.float32, torch.device("cpu")), dim=1)


def _ref_cogvideox(pipe, pixels, latents, gen):
    _, image_latents = pipe.prepare_latents(pixels[:, :, 0], 1, latents.shape[1], pixels.shape[2],
                                            *pixels.shape[-2:], torch.float32, torch.device("cpu"), gen)
    return image_latents


def _ref_hunyuan(pipe, pixels, latents, gen):
    _, image_latents = pipe.prepare_latents(pixels[:, :, 0], 1, latents.shape[1], *pixels.shape[-2:],
                                            pixels.shape[2], torch.float32, torch.device("cpu"), gen)
    image_latents[:, :, 1:] = 0  # __call__, image_condition_type "latent_concat"
    mask = image_latents.new_ones(image_latents.shape[0], 1, *image_latents.shape[2:])
    mask[:, :, 1:] = 0
    return torch.cat([image_latents, mask], dim=1)


def _ref_upscale(pipe, pixels, latents, gen):  # __call__ with the sample downscaled as the low-res input
    from diffusers.utils.torch_utils import randn_tensor

    low = torch.nn.functional.interpolate(pixels, size=tuple(latents.shape[-2:]), mode="bicubic", antialias=True,
                                          align_corners=False).clamp(-1, 1)
    noise = randn_tensor(low.shape, generator=gen, dtype=low.dtype)
    return pipe.low_res_scheduler.add_noise(low, noise, torch.tensor([20], dtype=torch.long))


def _ref_kandinsky5(pipe, pixels, latents, gen):  # its condition channels: the last C + 1 of prepare_latents'
    out = pipe.prepare_latents(pixels[:, :, 0], 1, latents.shape[1], *pixels.shape[-2:], pixels.shape[2],
                               torch.float32, torch.device("cpu"), gen)
    return out[..., latents.shape[1]:]


def _ref_refiner(pipe, pixels, latents, gen):  # the sample is its own input image, encoded as __call__ encodes it
    image_latents = pipe._encode_vae_image(pixels.unsqueeze(2), torch.Generator().manual_seed(0))  # tp's seed
    _, cond = pipe.prepare_latents(image_latents, 1, latents.shape[1], *pixels.shape[-2:], torch.float32,
                                   torch.device("cpu"), gen, latents=torch.zeros_like(image_latents))
    return cond  # (B, C, 1, h, w): the frame axis its transformer patches


def _animate_inputs(pixels):
    """Wan Animate's __call__ inputs for a sample (beside it, not made from it by the pipeline): its first frame as
    the character image, its frames as the pose video, and 16x16 (motion_encoder_size) of them as the face video."""
    from hf_precision.training.image_embeds import pil_frames

    frames = [pil_frames(pixels[:, :, k])[0] for k in range(pixels.shape[2])]
    return {"image": frames[0], "pose_video": frames, "face_video": [f.resize((16, 16)) for f in frames]}


def _ref_animate(pipe, pixels, latents, gen):  # __call__ :974, :1028, :1082-1098, its first segment
    height, width, cpu = *pixels.shape[-2:], torch.device("cpu")
    image = pipe.vae_image_processor.preprocess(_animate_inputs(pixels)["image"], height=height, width=width,
                                                resize_mode="fill")
    reference = pipe.prepare_reference_image_latents(image, 1, generator=gen, device=cpu)
    previous = pipe.prepare_prev_segment_cond_latents(None, batch_size=1, segment_frame_length=pixels.shape[2],
                                                      start_frame=0, height=height, width=width, generator=gen,
                                                      device=cpu)
    return torch.cat([reference, previous], dim=2)


GIVEN = {"WanAnimatePipeline": _animate_inputs}  # inputs of __call__ a builder makes the channels from
REFERENCES = {"StableDiffusionInpaintPipeline": _ref_inpaint, "StableDiffusionXLInpaintPipeline": _ref_inpaint,
              "FluxFillPipeline": _ref_fill, "WanImageToVideoPipeline": _ref_wan, "StableVideoDiffusionPipeline": _ref_svd,
              "CogVideoXImageToVideoPipeline": _ref_cogvideox, "HunyuanVideoImageToVideoPipeline": _ref_hunyuan,
              "HunyuanVideo15Pipeline": _ref_zeros, "StableDiffusionUpscalePipeline": _ref_upscale,
              "Kandinsky5I2VPipeline": _ref_kandinsky5,
              "SkyReelsV2ImageToVideoPipeline": _ref_wan, "HunyuanImageRefinerPipeline": _ref_refiner,
              "ChronoEditPipeline": _ref_wan, "WanAnimatePipeline": _ref_animate}


def _received(tp, batch: dict, extra: int) -> torch.Tensor:
    """The extra channels the training step's call gives the denoiser (its own layout), the latents' cut off."""
    module = tp._denoiser()
    row = denoiser_rows.row_of(module)
    kwargs = denoiser_rows.call_inputs(row, module, {**denoiser_rows.example_batch(module), **batch})  # + prompt
    given = kwargs[row.latent_arg]
    if row.pack == "flux":
        return given[..., -4 * extra:]
    dim = denoiser_rows.inputs.channel_dim(row)
    return given.narrow(dim, given.shape[dim] - extra, extra)


def test_the_families_are_found_from_the_configs():
    found = {name for name, _ in CONDITIONED}
    assert {"sd_inpaint", "sdxl_inpaint", "flux_fill", "wan_i2v", "svd"} <= found
    assert not {"sd15", "sdxl", "flux", "wan"} & found  # text-to-X denoisers take no extra channels


@pytest.mark.parametrize("name,component", CONDITIONED, ids=[n for n, _ in CONDITIONED])
def test_training_feeds_what_the_pipeline_builds(name, component, tiny_pipe):
    import hf_precision as hp

    pipeline_class = PIPELINES[name].pipeline_class
    cls_name, config = _configs(name)[component]
    cls = find_class(cls_name, name)
    row = next(ROWS[c.__name__] for c in cls.__mro__ if c.__name__ in ROWS)
    if not any(c.__name__ in row.condition for c in find_class(pipeline_class, name).__mro__):
        # no builder for this pipeline: refused loudly, never trained on zeros
        with pytest.raises(TrainingError, match=f"{pipeline_class}: its denoiser .* no condition builder"):
            denoiser_rows.condition_of(row, None, find_class(pipeline_class, name))
        return
    assert pipeline_class in REFERENCES, f"{name}: add the pipeline's own construction to REFERENCES"
    pipe = tiny_pipe(name)
    tp = hp.prepare_training(pipe, device="cpu", train={component: "lora"}, rank=2)
    pixels = _pixels(pipe, name)
    latents = tp.encode_images(pixels, torch.Generator().manual_seed(0))
    given = GIVEN[pipeline_class](pixels) if pipeline_class in GIVEN else {}
    condition = tp.encode_condition(pixels, latents, torch.Generator().manual_seed(SEED), **given)
    extra = condition_channels(row, tp._denoiser())
    got = _received(tp, {"latents": latents, **condition}, extra)
    with torch.no_grad():
        want = REFERENCES[pipeline_class](pipe, pixels, latents, torch.Generator().manual_seed(SEED))
    if pipeline_class != "HunyuanVideo15Pipeline":  # zeros only where the pipeline gives zeros
        assert got.abs().sum() > 0  # main trained these channels on zeros
    torch.testing.assert_close(got, want.to(got.dtype), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name,component", CONDITIONED, ids=[n for n, _ in CONDITIONED])
def test_the_program_refuses_a_family_without_a_builder_before_loading(name, component):
    """`train` and `train --plan` read the denoiser's config: a pipeline no condition builder serves is refused there,
    one line naming it, not after its weights have loaded (nothing is built here); one with a builder passes."""
    from hf_precision.apps.train.prepare import check_trainable
    from hf_precision.errors import RecipeError

    pipeline_class = PIPELINES[name].pipeline_class
    cls_name, config = _configs(name)[component]
    cls = find_class(cls_name, name)
    init = inspect.signature(inspect.unwrap(cls.__init__)).parameters
    config = {**{k: p.default for k, p in init.items() if p.default is not p.empty}, **config}  # as a saved config
    index = {"_class_name": pipeline_class, component: ["diffusers", cls.__name__], "vae": ["diffusers", "AutoencoderKL"]}
    row = next(ROWS[c.__name__] for c in cls.__mro__ if c.__name__ in ROWS)
    try:
        denoiser_rows.condition_of(row, None, find_class(pipeline_class, name))
    except TrainingError:
        # no builder, or (Wan-Animate) data no flag of the program reads: the refusal names that data
        with pytest.raises(RecipeError, match=f"^--model: {pipeline_class}: its denoiser .* (no condition builder|"
                                              f"data this program has no flag for)"):
            check_trainable(index, {component: config})
        return
    try:
        check_trainable(index, {component: config})
    except RecipeError as err:  # refused for another reason the program gives (no encode_prompt): not the condition
        assert "condition builder" not in str(err)


def test_a_batch_without_the_condition_is_refused(tiny_pipe):
    """tp.loss on latents alone would train the extra channels on zeros: one error naming what to add, and the
    explicit opt-out (the key given as None: zeros, as condition dropout trains them)."""
    import hf_precision as hp

    tp = hp.prepare_training(tiny_pipe("sd_inpaint"), device="cpu", train={"unet": "lora"}, rank=2)
    batch = denoiser_rows.example_batch(tp.components["unet"])
    assert tuple(batch["condition_latents"].shape[1:2]) == (5,)  # the plans' stand-in has the condition's shape
    del batch["condition_latents"]
    with pytest.raises(TrainingError, match=r"takes 5 conditioning channels .*tp\.encode_condition\(pixels.*"
                                            r"batch\['condition_latents'\] = None"):
        tp.loss(batch)
    module = tp.components["unet"]
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, {**batch, "condition_latents": None},
                                           tp.objective, tp.alphas_cumprod, pipe=tp.pipe)
    assert kwargs["sample"].shape[1] == 9 and kwargs["sample"][:, 4:].abs().sum() == 0  # the zeros asked for


# CogVideoX's tiny transformer learned its positions for 16x16 pixels only (its config's sample size)
@pytest.mark.parametrize("kind,frames,side", [("sd_inpaint", None, 32), ("cogvideox_i2v", 5, 16)])
def test_the_train_program_trains_on_the_condition_it_caches(kind, frames, side, saved_pipeline, tmp_path):
    """`hf-precision train` (2 steps) on an inpainting and an image-to-video model: the cached sample holds the
    condition its pipeline builds (a 0/1 mask and the masked image; the first frame's latents), not zeros."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file

    from hf_precision.cli import main

    data = tmp_path / "d"
    data.mkdir()
    rng = np.random.default_rng(0)
    for i in range(2):
        shots = [Image.fromarray(rng.integers(0, 255, (side, side, 3), dtype=np.uint8)) for _ in range(frames or 1)]
        if frames:
            shots[0].save(data / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        else:
            shots[0].save(data / f"c{i}.png")
        (data / f"c{i}.txt").write_text("a cat")
    out = tmp_path / "o"
    args = ["train", "--model", str(saved_pipeline(kind)), "--data", str(data), "--out", str(out), "--resolution",
            str(side), "--device", "cpu", "--steps", "2", "--quiet", *(["--frames", str(frames)] if frames else [])]
    assert main(args) == 0
    entries = [load_file(str(p)) for p in sorted((out / "cache" / "latents").glob("*.safetensors"))]
    # an inpainting mask is drawn per step: the sample's draws, one picked per step (tests/test_condition_inputs.py)
    key = "condition_draws" if kind == "sd_inpaint" else "condition_latents"
    assert len(entries) == 2 and all(e[key].abs().sum() > 0 for e in entries)
    if kind == "sd_inpaint":
        mask = entries[0][key][:, :, 0]
        assert set(mask.unique().tolist()) <= {0.0, 1.0}
    else:  # the first latent frame holds the image, the rest are zeros (pipeline_cogvideox_image2video.py)
        cond = entries[0]["condition_latents"]
        assert cond[:, :, 0].abs().sum() > 0 and cond[:, :, 1:].abs().sum() == 0


def test_the_cache_key_of_a_sample_names_its_condition(tiny_pipe, tmp_path):
    """A sample's cached latents hold its condition: an entry written without one (or under another seed, whose
    mask differs) is another key, encoded again, never read as this one."""
    import hf_precision as hp
    from hf_precision.apps.train.cache import sample_parts
    from hf_precision.apps.train.data import Sample
    from hf_precision.apps.train.batches import _latent_key

    (tmp_path / "a.png").write_bytes(b"x")
    sample = Sample(tmp_path / "a.png", "a cat", (32, 32), (32, 32))
    keys = {}
    for kind, component in (("sd_inpaint", "unet"), ("sd15", "unet")):
        tp = hp.prepare_training(tiny_pipe(kind), device="cpu", train={component: "lora"}, rank=2)
        for seed in (0, 1):
            run = SimpleNamespace(tp=tp, data=SimpleNamespace(samples=[sample]), settings=SimpleNamespace(seed=seed))
            keys[kind, seed] = _latent_key(run, 0)
    assert keys["sd15", 0] == keys["sd15", 1] == sample_parts(sample)  # no condition: the file alone, as before
    assert keys["sd_inpaint", 0] != keys["sd_inpaint", 1] and sample_parts(sample) != keys["sd_inpaint", 0]
    assert "inpaint_mask" in keys["sd_inpaint", 0]


def test_kandinsky5_i2v_trains_with_its_first_frame_clean_and_unpredicted(tiny_pipe):
    """Kandinsky 5 I2V keeps the image's latents as the first frame at every step and steps frames 1: only
    (pipeline_kandinsky_i2v.py:710, :986): the step feeds that frame clean and compares the others."""
    import hf_precision as hp

    tp = hp.prepare_training(tiny_pipe("kandinsky5_i2v"), device="cpu", train={"transformer": "lora"}, rank=2)
    module = tp._denoiser()
    row = denoiser_rows.row_of(module)
    pixels = torch.rand(1, 3, 5, 32, 32, generator=torch.Generator().manual_seed(1)) * 2 - 1
    batch = denoiser_rows.example_batch(module)
    batch["latents"] = tp.encode_images(pixels)
    batch.update(tp.encode_condition(pixels, batch["latents"]))
    kwargs, target = denoiser_rows.noisy_inputs(row, module, batch, tp.objective, tp.alphas_cumprod)
    x0 = denoiser_rows.inputs.model_layout(row, batch["latents"])  # (B, F, H, W, C)
    c, frames = x0.shape[-1], x0.shape[1]
    given = kwargs["hidden_states"]
    torch.testing.assert_close(given[:, :1, ..., :c], x0[:, :1])  # clean
    assert not torch.allclose(given[:, 1:, ..., :c], x0[:, 1:])  # noised
    assert torch.equal(given[:, 0, ..., -1], torch.ones_like(given[:, 0, ..., -1]))  # the mask, as the pipeline's
    assert target.shape[1] == frames - 1
    assert torch.isfinite(tp.loss(batch))


def test_hunyuan_video15_text_to_video_trains_on_its_pipelines_zeros_without_asking(tiny_pipe):
    """HunyuanVideo 1.5's text-to-video pipeline feeds its transformer zero condition latents and mask
    (pipeline_hunyuan_video1_5.py prepare_cond_latents_and_mask): tp.loss fills them as the pipeline does (it refused
    the batch), the same loss as the zeros tp.encode_condition makes; without a pipeline (the memory plan's call)
    the stand-in rule is unchanged."""
    import hf_precision as hp

    tp = hp.prepare_training(tiny_pipe("hunyuan_video15"), device="cpu", train={"transformer": "lora"}, rank=2)
    module = tp._denoiser()
    batch = denoiser_rows.example_batch(module)
    zeros = torch.zeros_like(batch.pop("condition_latents"))
    made = tp.encode_condition(torch.zeros(1, 3, 5, 16, 16), batch["latents"])["condition_latents"]
    assert made.abs().sum() == 0 and made.shape == zeros.shape
    bare = tp.loss(batch, generator=torch.Generator().manual_seed(0))
    given = tp.loss({**batch, "condition_latents": zeros}, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(bare, given)
    with pytest.raises(TrainingError, match="conditioning channels"):
        denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective, None)
