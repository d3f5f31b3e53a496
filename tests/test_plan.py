"""hf_precision.diagnose.planner: real configs built on the meta device, exact parameter and byte counts, islands and why."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.errors import RecipeError
from hf_precision.diagnose.planner import Plan, build_on_meta, plan
from hf_precision.runtime.source import CONFIGS_DIR, shipped_configs

COUNTS = json.loads((CONFIGS_DIR / "PARAM_COUNTS.json").read_text())["components"]
FOLDER_ALIAS = {"stable-diffusion-xl-base-1.0": "sdxl", "stable-video-diffusion-img2vid-xt": "svd",
                "PixArt-XL-2-1024-MS": "pixart", "DiT-XL-2-256": "dit", "stable-diffusion-v1-5": "sd15"}

SDXL_UNET = 2_567_463_684
SVD_UNET = 1_524_623_082
SDXL_VAE = 83_653_863
CLIP_L = 123_060_480
SDXL_TE2 = 694_659_840
PIXART_T5 = 4_762_310_656
SDXL_ISLANDS = 2_050_560 + 5_245_440  # PARAM_COUNTS children: time_embedding + add_embedding
# Buffers the loaded models hold beside their parameters, in no checkpoint (non-persistent) but in memory all the
# same: CLIP's int64 position_ids (max_position_embeddings 77 text, 257 = (224/14)^2 + 1 vision) and the sin-cos
# position tables of PixArt (64x64 patches of 1152) and DiT (16x16), which follow the compute dtype.
CLIP_IDS = 77 * 8
BUFFERS = {("svd", "image_encoder"): (257 * 8, 0), ("pixart", "transformer"): (0, 4096 * 1152),
           ("dit", "transformer"): (0, 256 * 1152), ("sd15", "text_encoder"): (CLIP_IDS, 0)}  # (int bytes, float values)


def _child(model: str, file: str, child: str) -> int:
    (entry,) = [c for c in COUNTS if c["model"] == model and c["file"] == file]
    return entry["children"][child]


_CACHE: dict[tuple, Plan] = {}


def cached(name: str, device: str, **kwargs) -> Plan:
    """Plans are pure functions of their arguments: build each once per session."""
    key = (name, device, tuple(sorted(kwargs.items())))
    if key not in _CACHE:
        _CACHE[key] = plan(name, device=device, **kwargs)
    return _CACHE[key]


# ------------------------------------------------------------------------------------------ counts


def test_headline_counts():
    p = cached("sdxl", "t4")
    assert p["unet"].params == SDXL_UNET
    assert p["vae"].params == SDXL_VAE
    assert p["text_encoder"].params == CLIP_L
    assert p["text_encoder_2"].params == SDXL_TE2
    assert cached("svd", "t4")["unet"].params == SVD_UNET
    assert cached("pixart", "t4")["text_encoder"].params == PIXART_T5


@pytest.mark.parametrize("entry", COUNTS, ids=lambda e: f"{e['model']}/{e['file']}")
def test_every_component_matches_param_counts(entry):
    folder = CONFIGS_DIR / entry["model"]
    if entry["model"] in FOLDER_ALIAS:
        component = entry["file"].split("/")[0]
        got = cached(FOLDER_ALIAS[entry["model"]], "t4")[component]
        assert got.cls == entry["class"]
        assert got.params == entry["params"]
    else:  # sdxl-vae-fp16-fix: a lone component config
        config = json.loads((folder / entry["file"]).read_text())
        model = build_on_meta("diffusers", config["_class_name"], config)
        assert sum(p.numel() for p in model.parameters()) == entry["params"]


def test_building_on_meta_runs_no_init_fill_and_restores_them(monkeypatch):
    """A meta tensor holds no values: build_on_meta skips torch.nn.init's fills (each a Python decomposition on meta,
    a fifth of the build) and puts them back after, even when the build fails; the param counts above check that
    the shapes stay the same."""
    import torch

    from hf_precision.runtime.meta import INIT_FILLS

    calls = []
    for name in INIT_FILLS:
        monkeypatch.setattr(torch.nn.init, name, lambda t, *a, _n=name, **k: calls.append(_n) or t)
    installed = {name: getattr(torch.nn.init, name) for name in INIT_FILLS}
    vae = build_on_meta("diffusers", "AutoencoderKL", {"block_out_channels": [8], "norm_num_groups": 4})
    assert calls == [] and next(vae.parameters()).device.type == "meta"
    with pytest.raises(RecipeError):
        build_on_meta("diffusers", "NoSuchModel", {})
    assert {name: getattr(torch.nn.init, name) for name in INIT_FILLS} == installed
    torch.nn.Linear(2, 2)  # outside a build: the fills run
    assert calls == ["kaiming_uniform_", "uniform_"], calls


def test_aliases_map_to_the_shipped_folders():
    shipped = shipped_configs()
    assert shipped["sdxl"].name == "stable-diffusion-xl-base-1.0"
    assert shipped["svd"].name == "stable-video-diffusion-img2vid-xt"
    assert {"sdxl", "svd", "pixart", "dit", "sd15"} <= set(shipped)
    assert plan("stabilityai/stable-diffusion-xl-base-1.0", device="t4")["unet"].params == SDXL_UNET  # no download


# ------------------------------------------------------------------------------------------ bytes


def test_sdxl_on_t4_keeps_the_vae_in_fp32_and_bytes_add_up():
    p = cached("sdxl", "t4")
    vae, unet = p["vae"], p["unet"]
    assert (vae.storage, vae.compute, vae.handed_over) == ("float32", "float32", "float32")
    assert vae.total_bytes == SDXL_VAE * 4 and vae.bytes_by_dtype == {"float32": SDXL_VAE * 4}
    assert vae.fp32_why is not None and "bfloat16" in vae.fp32_why and "overflows fp16" in vae.fp32_why

    islands = {i.module: i.params for i in unet.islands}
    assert islands == {"time_embedding": _child("stable-diffusion-xl-base-1.0", "unet/config.json", "time_embedding"),
                       "add_embedding": _child("stable-diffusion-xl-base-1.0", "unet/config.json", "add_embedding")}
    assert sum(islands.values()) == SDXL_ISLANDS
    assert unet.total_bytes == (SDXL_UNET - SDXL_ISLANDS) * 2 + SDXL_ISLANDS * 4
    assert unet.bytes_by_dtype == {"float32": SDXL_ISLANDS * 4, "float16": (SDXL_UNET - SDXL_ISLANDS) * 2}
    assert all("time_embedding.linear_1" in i.why for i in unet.islands)  # the recipe's why, with its source
    assert all("unet.yaml" in i.why for i in unet.islands)
    assert (unet.compute, unet.handed_over) == ("float16", "float16")

    assert p["text_encoder"].total_bytes == CLIP_L * 2 + CLIP_IDS
    assert p["text_encoder"].bytes_by_dtype == {"float16": CLIP_L * 2, "int64": CLIP_IDS}
    assert p["text_encoder_2"].total_bytes == SDXL_TE2 * 2 + CLIP_IDS
    assert p.total_bytes == sum(c.total_bytes for c in p.components.values()) == (
        CLIP_L * 2 + SDXL_TE2 * 2 + (SDXL_UNET - SDXL_ISLANDS) * 2 + SDXL_ISLANDS * 4 + SDXL_VAE * 4 + 2 * CLIP_IDS)
    assert p.fp32_bytes == (CLIP_L + SDXL_TE2 + SDXL_UNET + SDXL_VAE) * 4 + 2 * CLIP_IDS
    assert p.params == CLIP_L + SDXL_TE2 + SDXL_UNET + SDXL_VAE


def test_sdxl_on_a100_runs_the_vae_in_bf16():
    p = cached("sdxl", "a100")
    assert (p["vae"].compute, p["vae"].handed_over) == ("bfloat16", "float32")
    assert p["vae"].total_bytes == SDXL_VAE * 2 and p["vae"].fp32_why is None
    assert p["unet"].total_bytes == (SDXL_UNET - SDXL_ISLANDS) * 2 + SDXL_ISLANDS * 4


def test_table_shows_sizes_the_fp32_comparison_and_why():
    text = str(cached("sdxl", "t4"))
    vae_line = next(line for line in text.splitlines() if line.startswith("vae "))
    assert "AutoencoderKL" in vae_line and "83,653,863" in vae_line and "float32" in vae_line
    assert "whole component" in vae_line and "334.6 MB" in vae_line
    assert "all-fp32" in text and f"{13_875_351_468 + 2 * CLIP_IDS:,} bytes" in text and "saves" in text
    assert "unet.time_embedding" in text and "2,050,560" in text
    assert "stays float32, and why:" in text and "overflows fp16" in text
    assert f"{(SDXL_UNET - SDXL_ISLANDS) * 2:,}" in text  # exact bytes per dtype


def test_modules_lists_every_module():
    p = plan("sdxl", device="t4", modules=True)
    rows = {m.name: m for m in p["unet"].modules}
    assert rows[""].params == SDXL_UNET and rows[""].dtype == "float32+float16"
    assert rows["time_embedding"].island and rows["time_embedding"].params == 2_050_560
    assert rows["time_embedding.linear_1"].dtype == "float32" and rows["time_embedding.linear_1"].island
    assert rows["conv_in"].dtype == "float16" and not rows["conv_in"].island
    assert rows["time_proj"].dtype == "-"
    assert len(p["unet"].modules) > 1000
    assert {m.dtype for m in p["vae"].modules} <= {"float32", "-"}
    text = p.table(modules=True)
    assert "unet.time_embedding.linear_1" in text and "island" in text
    assert "modules:" not in cached("sdxl", "t4").table()


def test_json_round_trip():
    p = plan("sdxl", device="t4", modules=True)
    data = json.loads(p.to_json())
    assert data == p.to_dict()
    assert data["components"]["vae"]["total_bytes"] == SDXL_VAE * 4
    assert data["components"]["unet"]["bytes_by_dtype"]["float32"] == SDXL_ISLANDS * 4
    assert data["components"]["unet"]["island_params"] == SDXL_ISLANDS
    assert data["fp32_bytes"] - data["total_bytes"] == data["saved_bytes"] > 0
    assert data["recipe"]["name"] == "sdxl" and data["recipe"]["components"]["vae"]["compute"] == "float32"
    assert any(m["name"] == "time_embedding" and m["island"] for m in data["components"]["unet"]["modules"])


# ------------------------------------------------------------------------------------------ folders


def test_a_folder_of_configs(tmp_path):
    folder = tmp_path / "my-sdxl"
    shutil.copytree(CONFIGS_DIR / "stable-diffusion-xl-base-1.0", folder)
    p = plan(folder, device="t4")
    assert p.source == str(folder) and p.pipeline == "StableDiffusionXLPipeline"
    assert p["unet"].total_bytes == cached("sdxl", "t4")["unet"].total_bytes
    assert p["vae"].compute == "float32"


def test_a_folder_with_the_fp16_fix_vae(tmp_path):
    folder = tmp_path / "sdxl-fp16-fix"
    shutil.copytree(CONFIGS_DIR / "stable-diffusion-xl-base-1.0", folder)
    shutil.copy(CONFIGS_DIR / "sdxl-vae-fp16-fix" / "config.json", folder / "vae" / "config.json")
    p = plan(folder, device="t4")
    assert p["vae"].compute == "float16" and p["vae"].total_bytes == SDXL_VAE * 2
    assert any("fp16_fix" in d.value and d.field == "recipe" for d in p.recipe["vae"].decisions)


def test_a_folder_without_model_index_is_an_error(tmp_path):
    with pytest.raises(RecipeError, match="no model_index.json"):
        plan(tmp_path, device="t4")


def test_components_without_config_are_skipped(tmp_path):
    folder = tmp_path / "sd15"
    shutil.copytree(CONFIGS_DIR / "stable-diffusion-v1-5", folder)
    shutil.rmtree(folder / "text_encoder")
    p = plan(folder, device="t4")
    assert set(p.components) == {"unet", "vae"}
    assert any("text_encoder" in s and "config.json" in s for s in p.skipped)
    assert "not planned" in p.table()


# ------------------------------------------------------------------------------------------ other pipelines


@pytest.mark.parametrize("name,device,expected", [
    ("svd", "t4", {"image_encoder": "float16", "unet": "float16", "vae": "float16"}),
    ("svd", "gtx1660", {"image_encoder": "float32", "unet": "float32", "vae": "float32"}),
    ("pixart", "t4", {"text_encoder": "float16", "transformer": "float16", "vae": "float16"}),
    ("pixart", "a100", {"text_encoder": "float16", "transformer": "float16", "vae": "float16"}),
    ("dit", "a100", {"transformer": "float16", "vae": "float16"}),
    ("dit", "m1-macos13", {"transformer": "float16", "vae": "float16"}),
    ("sd15", "t4", {"text_encoder": "float16", "unet": "float16", "vae": "float16"}),
    ("sd15", "cpu-avx2", {"text_encoder": "float32", "unet": "float32", "vae": "float32"}),
])
def test_plans_of_other_pipelines(name, device, expected):
    p = cached(name, device)
    assert {n: c.compute for n, c in p.components.items()} == expected
    for c in p.components.values():
        island = c.island_params
        size = {"float32": 4, "float16": 2, "bfloat16": 2}[c.storage]
        ints, floats = BUFFERS.get((name, c.name), (0, 0))
        assert c.total_bytes == (c.params - island) * size + island * 4 + ints + floats * size
        assert c.fp32_bytes == c.params * 4 + ints + floats * 4
        assert (c.fp32_why is not None) == (c.compute == "float32")
    if all(v == "float32" for v in expected.values()):
        assert p.total_bytes == p.fp32_bytes and "device:" in p.table()


def test_svd_and_pixart_islands():
    svd = cached("svd", "t4")["unet"]
    assert {i.module: i.params for i in svd.islands} == {"time_embedding": 2_050_560, "add_embedding": 2_624_000}
    t5 = cached("pixart", "t4")["text_encoder"]
    assert len(t5.islands) == 24 and all(i.module.endswith("DenseReluDense.wo") for i in t5.islands)
    assert t5.bytes_by_dtype["float32"] == t5.island_params * 4
    assert "24 modules" in str(cached("pixart", "t4"))


def test_fp8_storage_counts_layerwise_casting():
    p = plan("sdxl", device="l4", overrides={"unet": {"storage": "float8_e4m3fn"}})
    unet = p["unet"]
    assert (unet.storage, unet.compute) == ("float8_e4m3fn", "float16")
    assert set(unet.bytes_by_dtype) == {"float32", "float16", "float8_e4m3fn"}
    assert unet.bytes_by_dtype["float32"] == SDXL_ISLANDS * 4
    # norms stay float16 (layerwise casting skips them); linear and conv weights are 1 byte each
    assert unet.total_bytes < (SDXL_UNET - SDXL_ISLANDS) * 2 // 2 + SDXL_ISLANDS * 4 + 10_000_000


def test_planned_dtypes_are_what_apply_recipe_does():
    """plan counts with the same rule apply_recipe casts with (fp8 storage included)."""
    from hf_precision.runtime.apply import apply_recipe
    from hf_precision.runtime.layout import planned_dtypes
    from hf_precision.testing.pipelines import make_sdxl

    for overrides in (None, {"unet": {"storage": "float8_e4m3fn"}}):
        pipe = make_sdxl()
        recipe = hp.get_recipe("sdxl", device="l4", overrides=overrides)
        applied = apply_recipe(pipe, recipe, device="cpu")
        assert applied.verify() == []
        for name in ("unet", "vae", "text_encoder"):
            planned = planned_dtypes(getattr(pipe, name), recipe[name], applied.islands[name])
            actual = {n: str(p.dtype).removeprefix("torch.") for n, p in getattr(pipe, name).named_parameters()}
            assert actual == planned


# ------------------------------------------------------------------------------------------ errors


def test_a_pattern_that_matches_nothing_is_an_error_with_a_suggestion():
    with pytest.raises(RecipeError) as info:
        plan("sdxl", device="t4", overrides={"unet": {"keep_fp32": ["time_embeding"]}})
    message = str(info.value)
    assert "unet.keep_fp32" in message and "'time_embeding'" in message
    assert "did you mean" in message and "'time_embedding'" in message


def test_unknown_names_and_devices():
    with pytest.raises(RecipeError, match="no such folder|could not be reached|HF_HUB_OFFLINE"):
        plan("./no-such-folder", device="t4")
    with pytest.raises(RecipeError, match="unknown device type"):
        plan("sdxl", device="tpu")
    with pytest.raises(RecipeError, match="overrides need a recipe name"):
        plan("sdxl", recipe=hp.get_recipe("sdxl", device="t4"), overrides={"vae": {"dtype": "float32"}})


def test_a_resolved_recipe_is_used_as_is():
    recipe = hp.get_recipe("sdxl", device="a100", overrides={"vae": {"dtype": "float32"}})
    p = plan("sdxl", recipe=recipe)
    assert p.recipe is recipe and p["vae"].compute == "float32"


def test_planning_allocates_no_weights():
    psutil = pytest.importorskip("psutil")
    import diffusers  # noqa: F401  (imports are not what is measured)
    import transformers  # noqa: F401

    plan("sd15", device="t4")  # warm up the lazy imports of the model classes
    process = psutil.Process()
    before = process.memory_info().rss
    p = plan("sdxl", device="t4")
    grown = process.memory_info().rss - before
    assert p.total_bytes > 7e9
    assert grown < 500e6, f"planning SDXL grew RSS by {grown / 1e6:.0f} MB"


def test_public_api_and_module_names():
    import hf_precision.diagnose.planner as plan_module

    assert hp.plan("dit", device="a100")["vae"].params == SDXL_VAE
    assert plan_module.Plan is Plan
    assert isinstance(plan_module.plan, type(plan))
