"""Image-to-video denoisers conditioned on an image encoder's embedding of the first frame (Wan 2.1 I2V's CLIP
hidden states, SVD's CLIP image embeds, FramePack's SigLIP states) are trained on that embedding as the pipeline's
own encode_image makes it from the sample's first frame: not without it (Wan trained with no image tokens), not a
crash (SVD's UNet had no encoder_hidden_states), not zeros (FramePack)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from hf_precision.training import denoiser_rows
from hf_precision.training.rules import TrainingError

SIDE = 32


def _frames(n: int = 5) -> tuple[list[Image.Image], torch.Tensor]:
    """n 8-bit frames and the (1, 3, n, H, W) clip in [-1, 1] the data loader makes of them."""
    rng = np.random.default_rng(0)
    shots = [rng.integers(0, 255, (SIDE, SIDE, 3), dtype=np.uint8) for _ in range(n)]
    clip = torch.stack([torch.from_numpy(s).permute(2, 0, 1).float() / 127.5 - 1 for s in shots], dim=1)
    return [Image.fromarray(s) for s in shots], clip[None]


# the pipeline's own encoding of the first frame, as its __call__ runs it for that image
REFERENCES = {
    "wan_i2v": lambda pipe, image: pipe.encode_image(image, torch.device("cpu")),
    "svd": lambda pipe, image: pipe._encode_image(image, torch.device("cpu"), 1, False),
    "hunyuan_video_framepack": lambda pipe, image: pipe.encode_image(
        pipe.video_processor.preprocess(image, SIDE, SIDE), device=torch.device("cpu")),
}
COMPONENT = {"svd": "unet"}


def _received(tp, batch: dict) -> torch.Tensor:
    """The image embedding the training step's call hands the denoiser (its cond or optional argument)."""
    module = tp._denoiser()
    row = denoiser_rows.row_of(module)
    kwargs = denoiser_rows.call_inputs(row, module, batch)
    arg = row.cond.get("image_embeds") or next(a for a, (key, _) in row.optional.items() if key == "image_embeds")
    assert arg in kwargs, f"the denoiser gets no {arg}"
    return kwargs[arg]


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_the_denoiser_receives_the_pipelines_image_encoding(name, tiny_pipe):
    import hf_precision as hp

    pipe = tiny_pipe(name)
    tp = hp.prepare_training(pipe, device="cpu", train={COMPONENT.get(name, "transformer"): "lora"}, rank=2)
    images, clip = _frames()
    batch = {"latents": tp.encode_images(clip)}
    batch.update(tp.encode_condition(clip, batch["latents"], torch.Generator().manual_seed(0)))
    module = tp._denoiser()
    text = {k: v for k, v in denoiser_rows.example_batch(module).items() if k not in ("latents", "image_embeds")}
    got = _received(tp, {**text, **batch})
    with torch.no_grad():
        want = REFERENCES[name](pipe, images[0])
    assert got.abs().sum() > 0  # FramePack trained on zeros here
    torch.testing.assert_close(got.float(), want.float(), rtol=1e-5, atol=1e-5)
    # the first frame's, not another's
    other = tp.encode_condition(clip.flip(2), batch["latents"])["image_embeds"]
    assert not torch.allclose(other, got.float())
    assert torch.isfinite(tp.loss({**text, **batch}))


def test_a_batch_without_the_image_embedding_is_refused(tiny_pipe):
    """Wan 2.1 I2V trained with no image tokens when the batch lacked them: one error naming what to add."""
    import hf_precision as hp

    tp = hp.prepare_training(tiny_pipe("wan_i2v"), device="cpu", train={"transformer": "lora"}, rank=2)
    batch = denoiser_rows.example_batch(tp._denoiser())
    del batch["image_embeds"]
    with pytest.raises(TrainingError, match=r"takes an image embedding of width \d+ .*tp\.encode_condition\(pixels"):
        tp.loss(batch)


def test_a_pipeline_the_row_names_no_image_encoder_for_is_refused():
    """A denoiser that takes an image embedding under a pipeline the row has no method for: refused, not trained
    without it."""
    from types import SimpleNamespace

    import diffusers

    from hf_precision.training.image_embeds import image_encode_of

    row = denoiser_rows.ROWS["WanTransformer3DModel"]
    i2v = SimpleNamespace(config={"image_dim": 8})
    with pytest.raises(TrainingError, match=r"^WanPipeline: its denoiser .*known: WanImageToVideoPipeline"):
        image_encode_of(row, i2v, diffusers.WanPipeline)
    assert image_encode_of(row, SimpleNamespace(config={"image_dim": None}), diffusers.WanPipeline) is None  # 2.2


def test_the_cache_key_names_the_image_encoder(tiny_pipe):
    from hf_precision.training.encode import condition_key
    import hf_precision as hp

    tp = hp.prepare_training(tiny_pipe("wan_i2v"), device="cpu", train={"transformer": "lora"}, rank=2)
    assert condition_key(tp) == ("condition", "wan_first_frame", "image_embeds", "encode_image", "pil")


def test_svd_trains_on_its_first_frames_image_embedding(saved_pipeline, tmp_path):
    """`hf-precision train` (2 steps) on SVD, refused before for having no encode_prompt: its UNet's conditioning is
    the first frame's CLIP image embedding, cached with the latents as the pipeline's _encode_image makes it."""
    from safetensors.torch import load_file

    from hf_precision.cli import main

    data = tmp_path / "d"
    data.mkdir()
    images = [im.resize((16, 16)) for im in _frames(2)[0]]  # the tiny UNet's step costs ~4 s at 32 px, 3 frames
    for i in range(2):
        shots = images[i:] + images[:i]
        shots[0].save(data / f"c{i}.gif", save_all=True, append_images=shots[1:], duration=100)
        (data / f"c{i}.txt").write_text("a cat")  # read by no encoder: SVD has none
    out = tmp_path / "o"
    args = ["train", "--model", str(saved_pipeline("svd")), "--data", str(data), "--out", str(out), "--resolution",
            "16", "--device", "cpu", "--steps", "2", "--quiet", "--frames", "2"]
    assert main(args) == 0
    entries = [load_file(str(p)) for p in sorted((out / "cache" / "latents").glob("*.safetensors"))]
    assert len(entries) == 2
    embeds = [e["image_embeds"] for e in entries]
    assert all(e.shape[:2] == (1, 1) and e.abs().sum() > 0 for e in embeds)
    assert not torch.allclose(embeds[0], embeds[1])  # each sample's own first frame


def test_the_image_encoder_leaves_the_accelerator_once_cached():
    """Its output is cached with the latents: like the VAE it is moved off the training device for the steps."""
    from types import SimpleNamespace

    from hf_precision.apps.train.cache import offload_encoders

    frozen = lambda: torch.nn.Linear(2, 2).requires_grad_(False)  # noqa: E731
    comps = {"unet": torch.nn.Linear(2, 2, device="meta"), "vae": frozen(), "image_encoder": frozen()}
    offload_encoders(SimpleNamespace(tp=SimpleNamespace(components=comps, denoiser_name="unet")), "meta", False)
    assert {n: m.weight.device.type for n, m in comps.items()} == {"unet": "meta", "vae": "meta", "image_encoder": "meta"}


def test_every_image_encode_entry_names_a_pipeline_method_that_takes_the_image():
    """Row data, checked against diffusers: the class exists, has the method, and the method takes the image."""
    import diffusers

    from hf_precision.diagnose.steps import call_params

    entries = [(p, m) for row in denoiser_rows.ROWS.values() for p, (m, _) in row.image_encode.items()]
    assert {p for p, _ in entries} >= {"WanImageToVideoPipeline", "StableVideoDiffusionPipeline"}
    for pipeline, method in entries:
        assert {"image", "images"} & set(call_params(getattr(diffusers, pipeline), method)), (pipeline, method)


def test_a_bad_image_encode_entry_is_one_error_line():
    from hf_precision.errors import RecipeError
    from hf_precision.recipe.calls import check_denoisers

    data = {"schema": 1, "kind": "denoisers", "denoisers": {"MyDiT": {
        "latent_arg": "hidden_states", "source": "pipeline_my.py", "image_encode": {"MyPipeline": ["encode_image", "png"]}}}}
    with pytest.raises(RecipeError, match=r"^my\.yaml: denoisers\.MyDiT\.image_encode: .*\[its image-encoding method, "
                                          r"pil \| pixels\]") as err:
        check_denoisers(data, "my.yaml", [])
    assert "\n" not in str(err.value)


def test_the_program_refuses_an_image_embedding_nothing_makes_before_loading():
    """`train` and `train --plan` read the denoiser's config: one taking image tokens under a pipeline whose row names
    no image encoder for it is refused there, one line; Wan 2.2's I2V config (image_dim null) and 2.1's pass."""
    from hf_precision.apps.train.prepare import check_trainable
    from hf_precision.errors import RecipeError

    index = lambda p: {"_class_name": p, "transformer": ["diffusers", "WanTransformer3DModel"],  # noqa: E731
                       "vae": ["diffusers", "AutoencoderKLWan"]}
    config = {"in_channels": 16, "out_channels": 16, "image_dim": 8}
    with pytest.raises(RecipeError, match=r"^--model: WanPipeline: its denoiser \(WanTransformer3DModel\) takes an "
                                          r"image embedding"):
        check_trainable(index("WanPipeline"), {"transformer": config})
    check_trainable(index("WanPipeline"), {"transformer": {**config, "image_dim": None}})
    check_trainable(index("WanImageToVideoPipeline"), {"transformer": {**config, "in_channels": 36}})
