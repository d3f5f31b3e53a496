"""Transformer image families (SD3, Flux, PixArt-Sigma, Sana, AuraFlow, Lumina 2, HunyuanDiT, QwenImage): each tiny
pipeline is saved once, loaded back through ``load_pipeline`` under several device layouts and with a user's dtype
dict, runs two steps to a finite image, and holds the dtypes its resolved recipe plans. Plain diffusers fails the
same user layout. The shipped real configs build on the meta device with the published parameter counts."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import hf_precision as hp
from hf_precision.recipe import recipe_for_class
from hf_precision.runtime.source import CONFIGS_DIR
from hf_precision.testing import PIPELINES, make_pipeline, save_pipeline, select
from checks import assert_finite, assert_plan_bytes, assert_plan_dtypes, group_id, output_array, same_load

LAYOUTS = ["cpu", "t4", "a100", "m2-macos14"]  # this CPU's own rules, fp16 CUDA, bf16 CUDA, MPS with bf16
HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# PixArt-alpha and DiT: tests/layouts.py; a shares_layout row (Flux Fill: Flux's classes and layout) brings no forward
# these runs do not make
FAMILIES = select("image", "dit", exclude=("core", "shares_layout"))


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """Family -> its tiny pipeline saved once for the module (built lazily)."""
    saved: dict[str, object] = {}

    def get(family: str):
        if family not in saved:
            saved[family] = save_pipeline(make_pipeline(family), tmp_path_factory.mktemp(family))
        return saved[family]

    return get


def _configs(folder) -> dict[str, dict]:
    return {p.parent.name: json.loads(p.read_text()) for p in folder.glob("*/config.json")}


def _run(pipe, family: str):
    spec = PIPELINES[family]  # ready: what the saved folder does not keep (HiDream's sample size)
    return spec.ready(pipe)(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0))


def _alias(family: str) -> str:
    return recipe_for_class(PIPELINES[family].pipeline_class)


@pytest.mark.parametrize("family, layouts", [(f, g) for f in FAMILIES for g in same_load(_alias(f), LAYOUTS)],
                         ids=group_id)
def test_loads_runs_and_follows_the_plan(family, layouts, folders):
    """Each family under each layout of ``LAYOUTS``, one load and run per group of layouts whose recipes load the
    same (tests/checks.py ``same_load``: the A100's and the bf16 Mac's are one, 52 runs were 39); each layout's plan
    for the folder's configs is checked against the one loaded."""
    folder, layout = folders(family), layouts[0]
    pipe = hp.load_pipeline(folder, "cpu", layout=None if layout == "cpu" else layout)
    record = hp.applied(pipe)
    # The plan the loader followed is the one the recipe gives for that device and these configs, derived here
    # independently (no dtype is written down in this test).
    for each in layouts:
        expected = hp.get_recipe(_alias(family), device=each, configs=_configs(folder))
        assert record.recipe.name == expected.name
        present = [p for p in expected.policies if getattr(pipe, p.name, None) is not None]
        assert present, "no planned component is in the pipeline"
        for plan in present:
            got = record.recipe[plan.name]
            assert (got.compute, got.storage, got.keep_fp32) == (plan.compute, plan.storage, plan.keep_fp32), \
                (each, plan.name)
    assert_plan_dtypes(pipe, record.recipe)
    if layout in ("t4", "cpu"):  # plan bytes == every byte loaded, buffers included (PixArt-Sigma's pos_embed)
        assert_plan_bytes(pipe, folder, layout)
    assert_finite(_run(pipe, family))


def _user_dtypes(family: str, folder) -> tuple[dict, torch.dtype]:
    """A user's layout: the denoiser in the first half dtype its recipe tolerates, everything else float32."""
    plan = hp.get_recipe(_alias(family), device="cpu", configs=_configs(folder))["transformer"]
    half = next(HALF[d] for d in plan.dtypes if d in HALF)
    return {"transformer": half, "default": torch.float32}, half


# SanaPipeline makes its latents in fp32 and casts them to the transformer's and the VAE's dtype itself
# (diffusers/pipelines/sana/pipeline_sana.py:891, :904, :959): plain diffusers runs this layout there. So does
# ZImagePipeline (pipeline_z_image.py:458, :526, :592), and BriaPipeline, which encodes the prompt into the
# transformer's dtype, takes the latents from it and decodes in vae.dtype (pipeline_bria.py:373, :613, :736-737).
# HunyuanImagePipeline does the same (pipeline_hunyuanimage.py:673-674, :713, :858).
# Kandinsky 5 Image casts its latents and text states to the transformer's dtype and its latents to the VAE's
# (pipeline_kandinsky_t2i.py:690, :729-733, :785)
# The HunyuanImage refiner casts its prompt embeddings and input to the transformer's dtype and the image and latents
# to the VAE's (pipeline_hunyuanimage_refiner.py:575, :596, :653, :748).
PLAIN_RUNS = {"sana", "zimage", "bria", "hunyuan_image", "kandinsky5_t2i", "hunyuan_image_refiner"}


@pytest.mark.parametrize("family", FAMILIES)
def test_user_dtype_dict_plain_diffusers_fails_hf_precision_runs(family, folders):
    from diffusers import DiffusionPipeline

    folder = folders(family)
    dtypes, half = _user_dtypes(family, folder)
    plain = DiffusionPipeline.from_pretrained(folder, dtype=dtypes)
    plain.set_progress_bar_config(disable=True)
    if family in PLAIN_RUNS:
        assert np.isfinite(output_array(_run(plain, family))).all()
    else:
        with pytest.raises(RuntimeError, match=r"dtype|type"):
            _run(plain, family)

    pipe = hp.load_pipeline(folder, "cpu", dtype=dtypes)
    assert pipe.transformer.dtype == half
    for name, module in pipe.components.items():
        if name != "transformer" and isinstance(module, torch.nn.Module):
            assert module.dtype == torch.float32, f"{name} is {module.dtype}"
    assert_plan_dtypes(pipe, hp.applied(pipe).recipe)
    assert_finite(_run(pipe, family))


def test_every_family_class_is_named_by_one_recipe():
    for family in FAMILIES:
        spec = PIPELINES[family]
        assert recipe_for_class(spec.pipeline_class) == spec.recipe, family
        assert spec.pipeline_class in hp.get_recipe(spec.recipe).pipelines, family


def test_the_sdxl_vae_is_told_apart_by_config(folders):
    # PixArt-Sigma, AuraFlow and HunyuanDiT ship the SDXL VAE: on a T4 (no bf16) it must not run fp16 unless it is
    # the fp16-fix (force_upcast false), which HunyuanDiT's tiny VAE imitates.
    for family in ("pixart_sigma", "auraflow", "hunyuandit"):
        configs = _configs(folders(family))
        vae = hp.get_recipe(_alias(family), device="t4", configs=configs)["vae"]
        fix = configs["vae"].get("force_upcast") is False
        assert (vae.compute == "float16") == fix, (family, vae.compute, vae.recipe)


# ------------------------------------------------------------------------------------------ real configs

# a recipe's own folder (`plan <alias>`); further sizes of a family (FLUX.1-dev, Wan 14B) are counted by hand against
# their configs in test_quant_memory.py
SHIPPED = sorted(p.parent.name for p in CONFIGS_DIR.glob("*/SOURCE.json")
                 if p.parent.name not in ("FLUX.1-dev", "Wan2.1-T2V-14B-Diffusers", "Wan2.1-I2V-14B-480P-Diffusers"))


def _published(folder: str) -> dict[str, dict]:
    return json.loads((CONFIGS_DIR / folder / "SOURCE.json").read_text())["published_params"]


@pytest.mark.parametrize("folder", SHIPPED)
def test_shipped_configs_match_published_param_counts(folder):
    from hf_precision.diagnose.planner import build_on_meta

    index = json.loads((CONFIGS_DIR / folder / "model_index.json").read_text())
    assert _published(folder), f"{folder}/SOURCE.json names no published parameter count"
    for component, published in _published(folder).items():
        library, cls = index[component]
        config = json.loads((CONFIGS_DIR / folder / component / "config.json").read_text())
        model = build_on_meta(library, cls, config)
        # A figure for one part of the model (Mochi's "362M" VAE is its decoder) is checked against that part.
        part = getattr(model, published["part"]) if published.get("part") else model
        params = sum(p.numel() for p in part.parameters())
        if published.get("exact"):
            assert params == published["params"], (component, params)
        else:  # a rounded figure from a model card or paper ("12B"): within 2%
            assert abs(params - published["params"]) <= 0.02 * published["params"], (component, params)


@pytest.mark.parametrize("device", ["t4", "a100"])
@pytest.mark.parametrize("folder", SHIPPED)
def test_plan_of_the_shipped_model_works_offline(folder, device):
    """`hf-precision plan <alias> --device t4|a100` builds every component of the shipped folder on the meta device,
    and each planned dtype is the one the recipe resolves for that device and those configs."""
    from hf_precision.runtime.source import configs_of

    alias = next(n for n in hp.list_recipes("pipeline") if (hp.get_recipe(n).model or "").rsplit("/", 1)[-1] == folder)
    plan = hp.plan(alias, device=device)
    assert plan.source.endswith(folder)
    assert plan.total_bytes > 0 and all(c.params > 0 for c in plan.components.values())
    expected = hp.get_recipe(alias, device=device, configs=configs_of(alias)[2])
    assert {n: c.compute for n, c in plan.components.items()} == {n: expected[n].compute for n in plan.components}


def test_hunyuan_images_shortened_tiny_prompt_keeps_valid_and_padded_tokens_in_both_streams():
    """The tiny HunyuanImage row pads to fewer text tokens than the pipeline's 1000 + 128 (hook hunyuan_image_lengths:
    those tokens were its tiny run's cost); both streams still carry the prompt's tokens and padding, so the
    transformer's valid/masked sorting of each stream (transformer_hunyuanimage.py:821-830) runs in every test."""
    spec = PIPELINES["hunyuan_image"]
    pipe = make_pipeline("hunyuan_image")
    assert (pipe.tokenizer_max_length, pipe.tokenizer_2_max_length) != (1000, 128)
    for prompt in (spec.call_kwargs()["prompt"], spec.call_kwargs()["negative_prompt"] + ' "x"'):
        _, mask, _, mask_2 = pipe.encode_prompt(prompt, device="cpu")
        for stream in (mask, mask_2):
            assert 0 < int(stream.sum()) < stream.numel(), (prompt, stream)


def test_hunyuan_images_distilled_embedders_run_in_the_fp32_island_of_a_half_layout():
    """HunyuanImage 2.1 distilled embeds its guidance (in the transformer's dtype, pipeline_hunyuanimage.py:733) and
    a MeanFlow second timestep (the latents' dtype, :755-762) beside the timestep; the shares_layout row is kept out
    of the per-layout tests because both embedders sit in time_guidance_embed, the recipe's fp32 island. This runs
    them there once under bf16: both reach the island in fp32 and the image is finite."""
    spec = PIPELINES["hunyuan_image_distilled"]
    pipe = spec.ready(make_pipeline("hunyuan_image_distilled"))
    hp.apply_recipe(pipe, hp.get_recipe("hunyuan_image", device="a100"), device="cpu")
    embed = pipe.transformer.time_guidance_embed
    assert pipe.transformer.dtype == torch.bfloat16 and embed.guidance_embedder is not None
    seen = {}
    for name in ("timestep_embedder_r", "guidance_embedder"):
        getattr(embed, name).register_forward_pre_hook(lambda m, args, name=name: seen.update({name: args[0].dtype}))
    assert_finite(pipe(**spec.call_kwargs(), generator=torch.Generator().manual_seed(0)))
    assert seen == {"timestep_embedder_r": torch.float32, "guidance_embedder": torch.float32}
