"""The tiny test pipelines are data: rows of hf_precision/testing/tiny/*.yaml, one generic builder, named hooks.

A new family is a YAML row (here FluxImg2ImgPipeline, which the shipped rows lack) loaded through the same loader,
built, saved and run through ``load_pipeline``; a bad row is one clear error naming the file, row, key and value.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

import hf_precision as hp
from hf_precision.testing.registry import PIPELINES, TinyPipelines, tiny_pipelines
from hf_precision.testing.rows import ENV

# A whole family as data: every component by class and config (presets from tiny/_presets.yaml), a tokenizer kind,
# and call kwargs with a seeded input image.
NEW_FAMILY = """
flux_img2img:
  pipeline: FluxImg2ImgPipeline
  recipe: flux
  tags: [image, dit]
  components:
    transformer:
      class: FluxTransformer2DModel
      config: {patch_size: 1, in_channels: 16, out_channels: 16, num_layers: 1, num_single_layers: 1,
               attention_head_dim: 16, num_attention_heads: 2, joint_attention_dim: 32, pooled_projection_dim: 8,
               guidance_embeds: true, axes_dims_rope: [4, 4, 8]}
    scheduler: {class: FlowMatchEulerDiscreteScheduler}
    vae:
      class: AutoencoderKL
      preset: vae_kl
      config: {use_quant_conv: false, use_post_quant_conv: false, shift_factor: 0.1159, scaling_factor: 0.3611}
    text_encoder: {class: CLIPTextModel, preset: clip_text}
    tokenizer: {tokenizer: clip}
    text_encoder_2: {class: T5EncoderModel, preset: t5}
    tokenizer_2: {tokenizer: t5}
  call: {prompt: a cat, image: {image: 32, seed: 1}, strength: 0.75, height: 32, width: 32, num_inference_steps: 2,
         guidance_scale: 3.5, max_sequence_length: 16, output_type: np}
"""


def _write(tmp_path, text: str, name: str = "rows.yaml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_a_new_family_is_one_yaml_row(tmp_path):
    from hf_precision.testing import save_pipeline

    rows = tiny_pipelines(_write(tmp_path, NEW_FAMILY))
    assert "flux_img2img" not in PIPELINES and {"flux", "flux_img2img"} <= set(rows)
    spec = rows["flux_img2img"]
    folder = save_pipeline(spec.make(seed=0), tmp_path / "saved")
    pipe = hp.load_pipeline(folder, "cpu")
    assert type(pipe).__name__ == "FluxImg2ImgPipeline" and hp.applied(pipe).recipe.name.startswith(spec.recipe)
    out = spec.result(pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0)))
    assert out.shape == (1, 32, 32, 3) and bool((out == out).all())


def test_extra_row_files_come_from_the_environment_too(tmp_path, monkeypatch):
    monkeypatch.setenv(ENV, str(_write(tmp_path, NEW_FAMILY)))
    rows = TinyPipelines()
    assert rows["flux_img2img"].pipeline_class == "FluxImg2ImgPipeline"
    assert rows["flux_img2img"].source.name == "rows.yaml"


@pytest.mark.parametrize("row, message", [
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: dit, colour: red}",
     "x.colour: unknown key (value 'red'); allowed: ["),
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, components: {tokenizer: {tokenizer: sentencepiece}}}",
     "x.components.tokenizer.tokenizer: unknown tokenizer hook 'sentencepiece'; use one of ['bert', 'clip'"),
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: dit, components: {c: {hook: nope}}}",
     "x.components.c.hook: unknown component hook 'nope'; use one of ['controlnet_from_unet']"),
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: dit, prepare: tile}",
     "x.prepare: unknown prepare hook 'tile'; use one of ['allegro_tiling', 'hidream_sample_size', "
     "'hunyuan_image_lengths', 'hunyuan_video15_lengths', 'kandinsky5_t2i_resolutions']"),
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: dit, components: {vae: {class: A, preset: vea}}}",
     "x.components.vae.preset: unknown preset 'vea'; use one of ["),
    ("x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: ditt}", "x.base: unknown row 'ditt'; use one of ["),
    ("dit: {pipeline: DiTPipeline, recipe: dit, call: {}, base: sd15}", "dit: a row of that name is in "),
])
def test_a_bad_row_is_one_clear_error(tmp_path, row, message):
    path = _write(tmp_path, row)
    with pytest.raises(hp.RecipeError) as caught:
        tiny_pipelines(path)
    assert str(caught.value).startswith(f"{path}: ") and message in str(caught.value), str(caught.value)


def test_an_unknown_class_is_named_when_the_row_is_built(tmp_path):
    path = _write(tmp_path, "x: {pipeline: DiTPipeline, recipe: dit, call: {}, base: dit,"
                            " components: {vae: {class: AutoencoderKLL}}}")
    with pytest.raises(hp.RecipeError, match=r"rows.yaml: x.components.vae.class: unknown class 'AutoencoderKLL'; "
                                             r"use a class diffusers or transformers exports \(did you mean "
                                             r"'AutoencoderKL'\?\)"):
        tiny_pipelines(path)["x"].make()


def test_a_derived_row_overrides_its_base_and_each_component_has_its_own_seed():
    # sd_inpaint is sd15 with a 9-channel UNet; the text encoder, from the same seed, has the same weights
    base, inpaint = PIPELINES["sd15"].make(seed=0), PIPELINES["sd_inpaint"].make(seed=0)
    assert (base.unet.config.in_channels, inpaint.unet.config.in_channels) == (4, 9)
    assert type(inpaint).__name__ == "StableDiffusionInpaintPipeline"
    for a, b in zip(base.text_encoder.parameters(), inpaint.text_encoder.parameters()):
        assert torch.equal(a, b)
    other = PIPELINES["sd15"].make(seed=1)
    assert not torch.equal(next(base.unet.parameters()), next(other.unet.parameters()))


def test_a_dict_size_overrides_any_row_and_derived_values_follow():
    sdxl = PIPELINES["sdxl"].make(size={"text_encoder": {"hidden_size": 16}})
    assert sdxl.unet.config.cross_attention_dim == 16 + 8  # derive: text_encoder + text_encoder_2 hidden sizes
    with pytest.raises(ValueError, match="unknown size 'mid' for flux; use one of \\['tiny'\\]"):
        PIPELINES["flux"].make(size="mid")


def test_importing_the_testing_package_reads_no_row_and_imports_no_diffusers():
    code = ("import sys, hf_precision.testing as t; from hf_precision.testing import PIPELINES, make_pipeline; "
            "print(sorted({'diffusers', 'yaml', 'torch'} & set(sys.modules)), PIPELINES._rows)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[0] == "[] None"
