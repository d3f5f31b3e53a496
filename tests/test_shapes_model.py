"""The demo's shipped shapes model: installed with the package, loads offline, is what its rebuild command makes, and
its VAE overflows float16 the way the real SDXL VAE does (so the demo's naive picture is black and the recipe's is not).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def shapes():
    """The shipped model loaded once in fp32, offline (``local_files_only``: nothing may come from the Hub)."""
    import torch
    from diffusers import DiffusionPipeline

    from hf_precision.apps.shapes_model import shipped_folder

    pipe = DiffusionPipeline.from_pretrained(str(shipped_folder()), dtype=torch.float32, use_safetensors=True,
                                             local_files_only=True)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_the_shipped_model_is_package_data_of_the_installed_package(shapes):
    import hf_precision
    from hf_precision.apps.shapes_model import shipped_folder

    folder = shipped_folder()
    assert folder.parent.parent == Path(hf_precision.__file__).parent  # hf_precision/apps/shapes_sdxl
    files = [p.relative_to(folder.parent.parent).as_posix() for p in folder.rglob("*") if p.is_file()]
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["hf_precision"]
    missing = [f for f in files if not any(fnmatch.fnmatchcase(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert not missing, f"not in the wheel (pyproject package-data): {missing}"
    weights = [p for p in folder.rglob("*.safetensors")]
    assert {p.parent.name for p in weights} == {"unet", "vae", "text_encoder", "text_encoder_2"}
    assert not list(folder.rglob("*.bin")) and sum(p.stat().st_size for p in weights) < 6 * 2 ** 20  # a few MB
    assert type(shapes).__name__ == "StableDiffusionXLPipeline"


def test_the_rebuild_command_builds_what_is_shipped():
    """The record beside the weights names the settings this code's rebuild uses (checked without retraining)."""
    import runpy

    from hf_precision.apps import shapes_model
    from hf_precision.testing.pipelines import make_sdxl

    record = shapes_model.shipped_record()
    assert record["fingerprint"] == shapes_model.fingerprint()
    assert (record["spec"], record["training"], record["amplify"]) == (shapes_model.SPEC, shapes_model.TRAINING,
                                                                          shapes_model.AMPLIFY)
    assert record["command"] == "python scripts/build_shapes_model.py"
    script = runpy.run_path(str(ROOT / "scripts" / "build_shapes_model.py"))  # its default --out is the shipped folder
    assert "shapes_model.FOLDER" in Path(script["__file__"]).read_text()
    # the shipped configs are those of make_sdxl(SPEC), the rebuild's starting point
    built = make_sdxl(shapes_model.SPEC, seed=0)
    for name in ("unet", "vae"):
        shipped = json.loads((shapes_model.FOLDER / name / "config.json").read_text())
        for key in ("block_out_channels", "norm_num_groups", "in_channels", "out_channels"):
            assert shipped[key] == built.components[name].config[key], (name, key)
    assert record["decoder_peak"]["after"] > 4 * record["decoder_peak"]["float16_max"]


def test_a_changed_setting_is_refused_with_the_rebuild_command(monkeypatch):
    from hf_precision.apps import shapes_model
    from hf_precision.errors import RecipeError

    monkeypatch.setattr(shapes_model, "TRAINING", {**shapes_model.TRAINING, "seed": 1})
    with pytest.raises(RecipeError, match="scripts/build_shapes_model.py"):
        shapes_model.shipped_folder()


def _latents(vae, shape="square", color=(220, 30, 30)):
    """The latents of one drawn shape (the VAE's encoder: no sampling run needed to get a picture's latents)."""
    import numpy as np
    import torch

    from hf_precision.apps.train.demo import draw_shape

    pixels = torch.from_numpy(np.asarray(draw_shape(shape, color, 32, 0))).permute(2, 0, 1)[None].float() / 127.5 - 1
    with torch.no_grad():
        return vae.encode(pixels).latent_dist.mean, (pixels / 2 + 0.5)


def _decode(vae, latents):
    import torch

    with torch.no_grad():
        image = vae.decode(latents.to(vae.dtype)).sample.float()
    return (image / 2 + 0.5).clamp(0, 1)


def test_the_vae_overflows_float16_and_only_because_of_its_scale(shapes):
    """A float16 decode is inf/NaN; the same VAE without the scale decodes finite in float16 (the overflow is the
    mechanism, not a broken model), and in float32 the scale changes nothing. (The demo test checks the pictures:
    the T4 recipe's is fp32's, the float16 VAE's is black.)"""
    import torch

    from hf_precision.apps.shapes_model import AMPLIFY, amplify_decoder, decoder_peak

    latents, drawn = _latents(shapes.vae)
    want = _decode(shapes.vae, latents)
    assert (want - drawn).abs().mean() < 0.1  # the VAE draws the shape back: a picture, not noise
    assert decoder_peak(shapes.vae, latents) > torch.finfo(torch.float16).max
    assert not torch.isfinite(_decode(copy.deepcopy(shapes.vae).half(), latents)).all()
    plain = amplify_decoder(copy.deepcopy(shapes.vae), 1 / AMPLIFY)
    assert (_decode(plain, latents) - want).abs().max() < 1e-4
    assert torch.isfinite(_decode(plain.half(), latents)).all()


def test_the_model_draws_the_colour_and_the_shape_each_caption_names(shapes):
    """Every training caption, fp32, the demo's own call: the shape's region holds the caption's colour (nearest of
    the training colours), and the corners a square fills but a circle leaves are the colour for a square and the
    background for a circle. The first shipped model drew most captions blue: its epsilon-prediction model read the
    colour from the seed's noise at the first of 8 "leading" steps (t=876)."""
    import numpy as np
    import torch

    from hf_precision.apps.demo_pictures import SHAPES_CALL, colour_read, shape_region
    from hf_precision.apps.shapes_model import PROMPTS
    from hf_precision.apps.train.demo import COLORS, draw_shape

    side = SHAPES_CALL["height"]
    fill = (255, 0, 255)
    circle_any = np.logical_or.reduce([(np.asarray(draw_shape("circle", fill, side, s)) == fill).all(-1)
                                       for s in range(16)])
    corners = shape_region("square", side) & ~circle_any  # inside every square drawn, outside every circle
    background = np.full(3, (200 + 255) / 2)  # draw_shape's backgrounds: every channel drawn from 200..255
    for seed in (0, 1):
        generators = [torch.Generator().manual_seed(seed) for _ in PROMPTS]
        with torch.no_grad():
            images = shapes(prompt=list(PROMPTS), **SHAPES_CALL, generator=generators, output_type="np").images
        for prompt, image in zip(PROMPTS, images):
            read = colour_read(image, prompt)
            colour = next(c for c in COLORS if c in prompt.split())
            assert read["nearest"] == colour, (prompt, seed, read)
            corner = image[corners].mean(0) * 255
            to_colour, to_background = (np.linalg.norm(corner - np.asarray(c)) for c in (COLORS[colour], background))
            assert (to_colour < to_background) == (read["shape"] == "square"), (prompt, seed, corner.round())
