"""Conditioning a denoiser takes as arguments of their own, built in training as its pipeline's __call__ builds them
from the sample: I2VGen-XL's image latents and CLIP image embedding of the clip's first frame (it trained on zeros).
The reference is the pipeline's own __call__ on the same picture: what it hands the UNet is captured by a hook."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

import hf_precision as hp
from hf_precision.testing import make_pipeline
from hf_precision.training import denoiser_rows

SIDE, FRAMES = 32, 3


def _clip(frames: int = FRAMES) -> tuple[Image.Image, torch.Tensor]:
    """A first frame as the 8-bit picture a user hands __call__, and the (1, 3, frames, H, W) clip in [-1, 1] the
    data loader makes with it as frame 0 (the later frames differ: only the first conditions)."""
    rng = np.random.default_rng(0)
    shots = [rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(frames)]
    clip = torch.stack([torch.from_numpy(s).permute(2, 0, 1).float() / 127.5 - 1 for s in shots], dim=1)
    return Image.fromarray(shots[0]), clip[None]


def _call_inputs_of_pipeline(image: Image.Image, seed: int) -> dict:
    """The UNet's keyword arguments at the first step of I2VGenXLPipeline.__call__ for ``image`` (no guidance)."""
    from hf_precision.runtime.patches import text_model_alias

    pipe = make_pipeline("i2vgenxl", seed=0)
    text_model_alias(pipe.text_encoder)  # diffusers reads text_encoder.text_model, which transformers 5's CLIP lacks
    seen: dict = {}

    def grab(module, args, kwargs):
        seen.update(kwargs) if not seen else None
        raise StopIteration  # one call is enough

    pipe.unet.register_forward_pre_hook(grab, with_kwargs=True)
    torch.manual_seed(seed)  # the VAE's latent sample in prepare_image_latents draws from the global generator
    try:
        pipe(prompt="a cat", image=image, height=SIDE, width=SIDE, num_frames=FRAMES, guidance_scale=1.0,
             num_inference_steps=1, output_type="pt")
    except StopIteration:
        pass
    return seen


def test_i2vgenxl_trains_on_the_first_frames_image_latents_and_embedding_as_call_builds_them():
    image, clip = _clip()
    expected = _call_inputs_of_pipeline(image, seed=7)
    tp = hp.prepare_training(make_pipeline("i2vgenxl", seed=0), device="cpu", train={"unet": "lora"}, rank=2)
    batch = {"latents": tp.encode_images(clip), "prompt_embeds": torch.zeros(1, 4, 4)}
    torch.manual_seed(7)
    batch.update(tp.encode_condition(clip, batch["latents"]))
    module = tp._denoiser()
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective,
                                           tp.alphas_cumprod, torch.Generator().manual_seed(0))
    for arg in ("image_latents", "image_embeddings"):
        assert kwargs[arg].abs().sum() > 0, f"{arg} is zeros"
        torch.testing.assert_close(kwargs[arg].float(), expected[arg].float(), msg=arg)
    # frame 0 is the image's latents, later frames their position (i + 1) / (F - 1), as prepare_image_latents
    later = kwargs["image_latents"][0, :, 1:].transpose(0, 1).flatten(1)
    torch.testing.assert_close(later, torch.tensor([[0.5], [1.0]]).expand_as(later))
    torch.testing.assert_close(kwargs["fps"].float(), torch.full((1,), 16.0))  # __call__'s target_fps default


def _clips(folder, n: int = 2, frames: int = 5, caption: str = "a clip"):
    """``n`` GIF clips of one caption whose first frames differ (random pictures), frames after it random too."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(1)
    for i in range(n):
        shots = [Image.fromarray(rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8)) for _ in range(frames)]
        shots[0].save(folder / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (folder / f"c{i}.txt").write_text(caption)
    return folder


def test_hunyuan_video_i2v_trains_with_the_prompt_encoded_with_each_clips_first_frame(saved_pipeline, tmp_path):
    """HunyuanVideo I2V's encode_prompt reads the input image beside the prompt (its __call__ passes the picture it
    is given, pipeline_hunyuan_video_image2video.py:831-839): `train` encodes each caption with its clip's first
    frame, cached per (caption, clip), and trains 2 steps (it was refused before loading)."""
    from safetensors.torch import load_file

    import hf_precision.apps.train.batches as train_batches
    from hf_precision.cli import main

    folder, data, out = saved_pipeline("hunyuan_video_i2v"), _clips(tmp_path / "clips"), tmp_path / "out"
    checks, encode = [], train_batches.encode_batch

    def spy(run, indices, *step):  # each step's batch against the pipeline's encode_prompt of (caption, first frame)
        batch = encode(run, indices, *step)
        for row, i in enumerate(indices):
            sample = run.data.samples[i]
            first = Image.open(sample.path).convert("RGB")  # the GIF's frame 0, as the data reads it at 32 px
            want = run.tp.pipe.encode_prompt(prompt=[sample.caption], image=first, device="cpu")[0]
            checks.append((batch["prompt_embeds"][row:row + 1].float(), want.float()))
        return batch

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(train_batches, "encode_batch", spy)
        code = main(["train", "--model", str(folder), "--data", str(data), "--out", str(out), "--resolution", "32",
                     "--frames", "5", "--steps", "2", "--device", "cpu", "--quiet", "--lora-rank", "2"])
    assert code == 0
    texts = [load_file(p)["prompt_embeds"] for p in (out / "cache" / "text").glob("*.safetensors")]
    assert len(texts) == 2 and not torch.allclose(texts[0], texts[1])  # one caption, two first frames
    assert checks
    for got, want in checks:
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_inpainting_trains_on_a_mask_drawn_per_step_with_masked_latents_to_match(saved_pipeline, tmp_path):
    """SD inpainting's mask is drawn per step, as diffusers' train_dreambooth_inpaint.py draws one each time a sample
    is loaded (it was one mask per sample for the whole run, cached with the latents): the cache holds several draws
    of (mask, masked-image latents) per sample, encoded together, and each step picks one by (seed, step, sample),
    so one sample seen at four steps gets more than one mask, and a second run picks the same ones, as does
    --no-cache, which encodes a sample's draws up to the step's pick."""
    from safetensors.torch import load_file

    import hf_precision.apps.train.batches as train_batches
    from hf_precision.apps.train.draws import DRAWS, KEY
    from hf_precision.cli import main

    folder, data = saved_pipeline("sd_inpaint"), tmp_path / "photos"
    data.mkdir()
    Image.fromarray(np.random.default_rng(2).integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8)).save(data / "a.png")
    (data / "a.txt").write_text("a cat")
    encode = train_batches.encode_batch

    def run(out, *extra):
        seen = []

        def spy(run, indices, *args):
            batch = encode(run, indices, *args)
            seen.append(batch["condition_latents"].clone())
            return batch

        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(train_batches, "encode_batch", spy)
            assert main(["train", "--model", str(folder), "--data", str(data), "--out", str(out), "--resolution",
                         str(SIDE), "--steps", "4", "--device", "cpu", "--quiet", "--lora-rank", "2",
                         "--checkpoint-every", "1000", *extra]) == 0
        return seen

    first, again, uncached = run(tmp_path / "one"), run(tmp_path / "two"), run(tmp_path / "three", "--no-cache")
    masks = [c[:, 0] for c in first]
    assert len({m.numpy().tobytes() for m in masks}) > 1, "one mask for every step"
    for other in (again, uncached):  # picked by (seed, step, sample), encoded as the cache holds it: reproducible
        assert len(other) == len(first) and all(torch.equal(a, b) for a, b in zip(first, other))
    (entry,) = [load_file(p) for p in (tmp_path / "one" / "cache" / "latents").glob("*.safetensors")]
    pool = entry[KEY][0]
    assert pool.shape[0] == DRAWS and len({m.numpy().tobytes() for m in pool[:, 0]}) == DRAWS
    for got in first:  # each step's pair is one draw's mask with that draw's masked-image latents
        assert any(torch.equal(got[0], draw) for draw in pool)


def test_hunyuan_video_i2v_token_replace_trains_with_the_image_latents_as_its_clean_first_frame():
    """HunyuanVideo I2V with image_condition_type token_replace (in_channels = the latents'): __call__ puts the
    image's latents in the first latent frame, clean at every step, and steps only the later frames
    (pipeline_hunyuan_video_image2video.py:890-893, :922-926). Training puts the latents prepare_latents makes for
    the clip's first frame there and leaves that frame out of the loss (it trained as text-to-video)."""
    from diffusers import HunyuanVideoTransformer3DModel

    pipe = make_pipeline("hunyuan_video_i2v", seed=0)
    config = {**pipe.transformer.config, "in_channels": pipe.transformer.config.out_channels,
              "image_condition_type": "token_replace"}
    torch.manual_seed(0)
    pipe.transformer = HunyuanVideoTransformer3DModel.from_config(config)
    image, clip = _clip(frames=5)
    with torch.no_grad():
        _, expected = pipe.prepare_latents(pipe.video_processor.preprocess(image, SIDE, SIDE), 1,
                                           config["in_channels"], SIDE, SIDE, 5, torch.float32, torch.device("cpu"),
                                           None, None, "token_replace")
    tp = hp.prepare_training(pipe, device="cpu", train={"transformer": "lora"}, rank=2)
    latents = tp.encode_images(clip)
    batch = {"latents": latents, **tp.encode_condition(clip, latents)}
    torch.testing.assert_close(batch["first_frame_latents"], expected, atol=1e-5, rtol=1e-5)
    batch.update(tp.encode_prompt(["a cat"], image=image))
    # __call__ keeps every 4th image token for token_replace (:779-785); encode_prompt's own default keeps every 2nd
    with torch.no_grad():
        want, every_2nd = (pipe.encode_prompt(image=image, prompt=["a cat"], device="cpu", image_embed_interleave=n)[0]
                           for n in (4, 2))
    assert want.shape != every_2nd.shape or not torch.equal(want, every_2nd)
    torch.testing.assert_close(batch["prompt_embeds"].float(), want.float())
    module = tp._denoiser()
    kwargs, target = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective,
                                                tp.alphas_cumprod, torch.Generator().manual_seed(0))
    torch.testing.assert_close(kwargs["hidden_states"][:, :, :1], expected)
    assert target.shape[2] == latents.shape[2] - 1  # the clean frame is not predicted
    assert torch.isfinite(tp.loss(batch))


def test_i2vgenxl_batch_without_its_image_is_refused_and_zeros_are_asked_for_by_none(tiny_pipe):
    """tp.loss on latents and prompt alone trained I2VGen-XL's image_latents and image_embeddings on zeros, though
    its pipeline always builds them from the input image: one error naming the keys and both ways out; a key given
    as None is the explicit opt-out (zeros); the memory plan's call (no pipeline) still plans such a batch."""
    import hf_precision as hp
    from hf_precision.training import TrainingError

    tp = hp.prepare_training(tiny_pipe("i2vgenxl"), device="cpu", train={"unet": "lora"}, rank=2)
    module = tp._denoiser()
    full = denoiser_rows.example_batch(module)
    assert {"image_latents", "image_embeds"} <= set(full)  # the stand-ins the plans and family tests train with
    bare = {k: full[k] for k in ("latents", "prompt_embeds")}
    with pytest.raises(TrainingError, match=r"I2VGenXLUNet under I2VGenXLPipeline takes image_latents, image_embeds.*"
                                            r"tp\.encode_condition\(pixels.*batch\['image_latents'\] = None"):
        tp.loss(bare)
    with pytest.raises(TrainingError, match=r"takes image_embeds,? which"):  # one missing: named alone
        tp.loss({**bare, "image_latents": full["image_latents"]})
    assert torch.isfinite(tp.loss(full))
    zeros = {**bare, "image_latents": None, "image_embeds": None}
    assert torch.isfinite(tp.loss(zeros))
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, zeros, tp.objective,
                                           tp.alphas_cumprod, pipe=tp.pipe)
    assert kwargs["image_latents"].abs().sum() == 0 and kwargs["image_embeddings"].abs().sum() == 0
    planned, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, bare, tp.objective,
                                            tp.alphas_cumprod)  # no pipeline: the plan's call, not refused
    assert planned["image_latents"].shape == bare["latents"].shape


def _first_transformer_call(name: str, **call) -> dict:
    """The keyword arguments the tiny pipeline ``name``'s __call__ hands its transformer at the first step."""
    pipe = make_pipeline(name, seed=0)
    seen: dict = {}

    def grab(module, args, kwargs):
        seen.update(kwargs)
        raise StopIteration  # one call is enough

    pipe.transformer.register_forward_pre_hook(grab, with_kwargs=True)
    try:
        pipe(num_inference_steps=1, output_type="pt", **call)
    except StopIteration:
        pass
    return seen


def _vace_call_control(frames: int, side: int) -> torch.Tensor:
    """The control_hidden_states WanVACEPipeline.__call__ hands its transformer at the first step of a text-to-video
    run (no video, no mask); prompt embeddings given, so the prompt is not cleaned (ftfy) or encoded."""
    return _first_transformer_call("wan_vace", prompt_embeds=torch.zeros(1, 4, 32), height=side, width=side,
                                   num_frames=frames, guidance_scale=1.0)["control_hidden_states"]


def test_wan_vace_trains_on_the_control_latents_its_text_to_video_call_builds(tiny_pipe):
    """tp.loss filled VACE's control_hidden_states with zeros, though WanVACEPipeline.__call__ without a video feeds
    the latents of a black video under an all-ones mask (pipeline_wan_vace.py:910-926): training taught the control
    branch an input sampling never gives. Now the encode phase builds what __call__ builds, for each clip of a batch;
    a batch without it is refused, with None as the explicit opt-out."""
    from hf_precision.training import TrainingError

    frames, side = 5, 32
    expected = _vace_call_control(frames, side)
    tp = hp.prepare_training(tiny_pipe("wan_vace"), device="cpu", train={"transformer": "lora"}, rank=2)
    clip = torch.rand(2, 3, frames, side, side) * 2 - 1
    batch = {"latents": tp.encode_images(clip), "prompt_embeds": torch.zeros(2, 4, 32)}
    batch.update(tp.encode_condition(clip, batch["latents"]))
    module = tp._denoiser()
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective,
                                           tp.alphas_cumprod, torch.Generator().manual_seed(0), pipe=tp.pipe)
    control = kwargs["control_hidden_states"]
    z = module.config.in_channels
    assert control[:, :2 * z].abs().sum() > 0, "the black video's latents are zeros"  # not what the pipeline feeds
    torch.testing.assert_close(control.float(), expected.float().expand_as(control))
    assert torch.isfinite(tp.loss(batch))
    bare = {k: batch[k] for k in ("latents", "prompt_embeds")}
    with pytest.raises(TrainingError, match=r"WanVACETransformer3DModel under WanVACEPipeline takes control_latents"):
        tp.loss(bare)
    assert torch.isfinite(tp.loss({**bare, "control_latents": None}))


def _framepack_call_and_batch(tiny_pipe, frames: int):
    """The tiny FramePack pipeline's first transformer call on a clip's first frame (one section of a 2-frame latent
    window, its history zeros), and a training plan with a batch of that ``frames``-frame clip built as the encode
    phase builds it (the same generator for the image's latent sample)."""
    image, clip = _clip(frames=frames)
    seen = _first_transformer_call("hunyuan_video_framepack", image=image, prompt="a cat", height=SIDE, width=SIDE,
                                   prompt_template={"template": "{}", "crop_start": 0}, num_frames=5,
                                   latent_window_size=2, max_sequence_length=16,
                                   generator=torch.Generator().manual_seed(3))
    tp = hp.prepare_training(tiny_pipe("hunyuan_video_framepack"), device="cpu", train={"transformer": "lora"},
                             rank=2)
    batch = {k: v for k, v in denoiser_rows.example_batch(tp._denoiser()).items()
             if k not in ("latents", "image_latents")}
    batch["latents"] = tp.encode_images(clip)
    batch.update(tp.encode_condition(clip, batch["latents"], generator=torch.Generator().manual_seed(3)))
    return seen, tp, batch


def test_framepack_trains_the_window_after_the_first_frame_with_its_latents_as_the_clean_prefix(tiny_pipe):
    """FramePack's latents_clean began with zeros in training, though HunyuanVideoFramepackPipeline.__call__ puts the
    image's VAE latents there (pipeline_hunyuan_video_framepack.py:822, :889-895): the encode phase builds them from
    the clip's first frame. And the first latent frame was also noised and predicted, though the pipeline steps only
    the window after the image (:917-927, :1016-1017 cat([image_latents, latents])): a 9-frame clip (3 latent frames)
    trains the window of 2 the call steps, with the same clean latents, indices and noisy-latent shape."""
    seen, tp, batch = _framepack_call_and_batch(tiny_pipe, frames=9)
    module = tp._denoiser()
    assert batch["latents"].shape[2] == 3
    kwargs, target = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, batch, tp.objective,
                                                tp.alphas_cumprod, torch.Generator().manual_seed(0), pipe=tp.pipe)
    assert kwargs["latents_clean"][:, :, :1].abs().sum() > 0, "the clean prefix is zeros"
    assert kwargs["hidden_states"].shape == seen["hidden_states"].shape == target.shape  # the prefix frame not in it
    for arg in ("latents_clean", "indices_latents_clean", "indices_latents", "latents_history_2x"):
        torch.testing.assert_close(kwargs[arg].float(), seen[arg].float(), msg=arg)
    noise = torch.randn(batch["latents"].shape, generator=torch.Generator().manual_seed(1))
    sigma = torch.tensor([1.0])  # all noise: the target is noise - x0 over the window alone
    _, target = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module,
                                           {**batch, "noise": noise, "sigmas": sigma}, tp.objective, None)
    torch.testing.assert_close(target, (noise - batch["latents"])[:, :, 1:])
    assert torch.isfinite(tp.loss(batch))


def test_framepack_batch_without_image_latents_is_refused_not_given_a_zero_prefix(tiny_pipe):
    """A hand-made batch without image_latents trained with a zero clean prefix, which no sampling run has. The clip's
    own first latent frame is no stand-in: the HunyuanVideo VAE's GroupNorms pool over all frames
    (autoencoder_kl_hunyuan_video.py:156, :159, :489), so it is not the image's own encoding (the pipeline's,
    :551-564). tp.loss refuses, naming image_latents and how to build them; None asks for zeros on purpose; a clip of
    one latent frame leaves no window to train and is refused."""
    from hf_precision.training import TrainingError

    _, tp, batch = _framepack_call_and_batch(tiny_pipe, frames=9)
    module = tp._denoiser()
    with torch.no_grad():
        own = tp.pipe.vae.encode(_clip(frames=9)[1][:, :, :1]).latent_dist.mean * tp.pipe.vae.config.scaling_factor
        whole = tp.pipe.vae.encode(_clip(frames=9)[1]).latent_dist.mean * tp.pipe.vae.config.scaling_factor
    assert not torch.allclose(whole[:, :, :1], own, atol=1e-3)  # why the clip's first latent frame is not taken
    bare = {k: v for k, v in batch.items() if k != "image_latents"}
    with pytest.raises(TrainingError, match=r"HunyuanVideoFramepackTransformer3DModel under "
                                            r"HunyuanVideoFramepackPipeline takes image_latents.*"
                                            r"tp\.encode_condition\(pixels.*batch\['image_latents'\] = None"):
        tp.loss(bare)
    zeros = {**bare, "image_latents": None}
    assert torch.isfinite(tp.loss(zeros))
    kwargs, _ = denoiser_rows.noisy_inputs(denoiser_rows.row_of(module), module, zeros, tp.objective,
                                           tp.alphas_cumprod, pipe=tp.pipe)
    assert kwargs["latents_clean"][:, :, :1].abs().sum() == 0
    with pytest.raises(TrainingError, match=r"latents have 1 frame; train on clips of at least 2 latent frames"):
        tp.loss({**batch, "latents": batch["latents"][:, :, :1]})


def test_cascade_decoder_batch_without_effnet_is_refused_not_trained_on_zeros(tiny_pipe):
    """tp.loss gave the Stable Cascade decoder zeros for effnet, though StableCascadeDecoderPipeline.__call__ always
    feeds it the prior's image_embeddings (pipeline_stable_cascade.py:445-449) and cannot make them from a picture:
    the encode phase and the loss refuse, naming effnet; a given effnet trains, None asks for the zeros."""
    from hf_precision.training import TrainingError

    tp = hp.prepare_training(tiny_pipe("cascade_decoder"), device="cpu", train={"decoder": "lora"}, rank=2)
    module = tp._denoiser()
    full = denoiser_rows.example_batch(module)
    assert full["effnet"].shape[1] == module.config.effnet_in_channels
    pixels = torch.rand(1, 3, 32, 32) * 2 - 1
    with pytest.raises(TrainingError, match=r"StableCascadeDecoderPipeline: its decoder takes effnet \(16 channels\)"
                                            r".*batch\['effnet'\] = None"):
        tp.encode_condition(pixels, full["latents"])
    bare = {k: v for k, v in full.items() if k != "effnet"}
    with pytest.raises(TrainingError, match=r"StableCascadeUNet under StableCascadeDecoderPipeline takes effnet"):
        tp.loss(bare)
    assert torch.isfinite(tp.loss(full))
    assert torch.isfinite(tp.loss({**bare, "effnet": None}))


def _gif_clips(data, count: int):
    """``count`` 9-frame GIF clips of SIDE pixels, each frame another grey, with a caption file: training data."""
    data.mkdir()
    for i in range(count):
        shots = [Image.fromarray(np.full((SIDE, SIDE, 3), (40 * f + 90 * i) % 256, np.uint8)) for f in range(9)]
        shots[0].save(data / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (data / f"c{i}.txt").write_text("a clip")
    return data


def test_framepack_train_command_steps_the_window_after_each_clips_first_frame(saved_pipeline, tmp_path, monkeypatch):
    """A 2-step `hf-precision train` on the tiny FramePack folder with 9-frame clips exits 0, and each step feeds
    the transformer what a sampling section feeds it: the window of 2 latent frames after the first, and the first
    frame's own image latents (the encode phase's, cached with the clip) as the clean prefix."""
    from hf_precision.cli import main

    data = _gif_clips(tmp_path / "clips", count=2)
    fed = []
    real = denoiser_rows.noisy_inputs

    def spy(row, module, batch, *args, **kwargs):
        out = real(row, module, batch, *args, **kwargs)
        fed.append((batch["latents"].shape[2], out[0]["hidden_states"].shape[2], out[1].shape[2],
                    float(out[0]["latents_clean"][:, :, :1].abs().sum())))
        return out

    monkeypatch.setattr(denoiser_rows, "noisy_inputs", spy)
    code = main(["train", "--model", str(saved_pipeline("hunyuan_video_framepack")), "--data", str(data), "--out",
                 str(tmp_path / "lora"), "--resolution", str(SIDE), "--frames", "9", "--steps", "2",
                 "--checkpoint-every", "1000", "--device", "cpu", "--quiet"])
    assert code == 0 and len(fed) >= 2
    assert all(clip == 3 and window == target == 2 and prefix > 0 for clip, window, target, prefix in fed), fed


@pytest.mark.parametrize("plan", [False, True])
def test_framepack_train_refuses_clips_of_one_latent_frame_before_loading(plan, saved_pipeline, tmp_path, capsys,
                                                                          monkeypatch):
    """`--frames 1` leaves FramePack only the clean prefix frame and no window to train: `train` and `train --plan`
    refuse it in one line before loading (they loaded the model, then failed at the first step), naming the frames
    that work; the frames of the tiny HunyuanVideo VAE's rule above one latent frame are taken."""
    from hf_precision.apps.train.data import model_geometry
    from hf_precision.cli import main
    from hf_precision.runtime.source import configs_of

    folder = saved_pipeline("hunyuan_video_framepack")
    monkeypatch.setattr("hf_precision.runtime.load.load_pipeline",
                        lambda *a, **k: pytest.fail("loaded before refusing --frames 1"))
    data = _gif_clips(tmp_path / "clips", count=1)
    code = main(["train", *(["--plan"] if plan else []), "--model", str(folder), "--data", str(data), "--out",
                 str(tmp_path / "o"), "--resolution", str(SIDE), "--frames", "1", "--device", "cpu"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("error:") == 1, err
    assert "--frames 1: HunyuanVideoFramepackPipeline trains the latent frames after a clip's first" in err
    assert "image_latents" in err and "e.g. --frames 5" in err
    _, index, configs = configs_of(str(folder))
    assert model_geometry(str(index["_class_name"]), index, configs).frame_problem(5) is None
