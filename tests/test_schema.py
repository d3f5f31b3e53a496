"""Old schemas keep loading: frozen schema-1 files (tests/fixtures/schema1/) resolve to the dtypes they always did."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.recipe.schema import SCHEMAS

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "schema1"
PIPELINE = FIXTURES / "sdxl_pipeline.yaml"
OVERRIDE = FIXTURES / "override.yaml"

# sha256 of the fixtures (line endings normalised). They are frozen: if this fails, restore the file; write a new
# fixture for a new schema instead of editing these.
FROZEN = {
    "sdxl_pipeline.yaml": "beeefccb780a24250f9d893d5265643b57e528b0b298a959a970615418d2bbdb",
    "override.yaml": "688e5ebf57b48f5cb82ca1991090e61034bab6e1bf756f4af4fde28f66ad740c",
}

FP32, BF16, FP16, FP8 = "float32", "bfloat16", "float16", "float8_e4m3fn"

# The frozen pipeline recipe, alone: (text_encoder, text_encoder_2, unet, vae) compute dtypes per device.
PIPELINE_EXPECTED = {
    "cpu-avx512": (FP32, FP32, FP32, FP32),
    "cpu-amx":    (BF16, BF16, BF16, BF16),
    "t4":         (FP16, FP16, FP16, FP32),
    "gtx1660":    (FP32, FP32, FP32, FP32),
    "a100":       (FP16, FP16, FP16, BF16),
    "m1-macos13": (FP16, FP16, FP16, FP32),
    "m2-macos15": (FP16, FP16, FP16, BF16),
    "arc-a770":   (FP16, FP16, FP16, BF16),
}

# With the frozen override on top: per device (text_encoder, text_encoder_2, unet storage, unet compute, vae).
OVERRIDE_EXPECTED = {
    "t4":         (FP32, FP16, FP16, FP16, FP16),   # no bf16: text_encoder falls back to fp32
    "a100":       (BF16, FP16, FP16, FP16, FP16),
    "l4":         (BF16, FP16, FP8, FP16, FP16),    # devices.cuda-sm89: fp8 storage
    "m1-macos13": (FP32, FP16, FP16, FP16, FP32),   # devices.mps: vae float32
    "m2-macos15": (BF16, FP16, FP16, FP16, FP32),
    "cpu-avx2":   (FP32, FP32, FP16, FP16, FP32),   # CPU computes fp16 when forced; nothing else picks it
}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes().replace(b"\r\n", b"\n")).hexdigest()


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_fixtures_are_frozen(name):
    text = (FIXTURES / name).read_text(encoding="utf-8")
    assert text.startswith("# frozen: never edit; old schemas must keep loading")
    assert "\nschema: 1\n" in text
    assert _digest(FIXTURES / name) == FROZEN[name], f"{name} was edited; it is frozen (restore it from git)"


def test_schema_1_is_still_read():
    assert 1 in SCHEMAS


@pytest.mark.parametrize("device", sorted(PIPELINE_EXPECTED))
def test_frozen_pipeline_recipe_loads(device):
    recipe = hp.get_recipe(str(PIPELINE), device=device)
    assert recipe.schema == 1
    assert recipe.sources == (str(PIPELINE),)
    assert recipe.latents_from == "text_encoder_2"
    assert list(recipe.components) == ["text_encoder", "text_encoder_2", "unet", "vae"]
    computes = tuple(p.compute for p in recipe.policies)
    assert computes == PIPELINE_EXPECTED[device]
    assert all(p.storage == p.compute for p in recipe.policies)
    assert recipe["unet"].handed_over == recipe["text_encoder_2"].compute
    assert recipe["vae"].handed_over == FP32
    assert recipe["unet"].keep_fp32 == ("time_embedding", "add_embedding")
    assert recipe["vae"].recipe == "vae.sdxl"


def test_frozen_pipeline_recipe_accepts_path_objects_and_relative_paths(monkeypatch):
    assert hp.get_recipe(PIPELINE, device="t4")["vae"].compute == FP32
    monkeypatch.chdir(FIXTURES.parent)
    relative = "schema1/sdxl_pipeline.yaml"
    recipe = hp.get_recipe(relative, device="a100", configs={"vae": {"force_upcast": False}})
    assert recipe["vae"].recipe == "vae.fp16_fix" and recipe["vae"].compute == FP16


@pytest.mark.parametrize("device", sorted(OVERRIDE_EXPECTED))
@pytest.mark.parametrize("pipeline", ["sdxl", str(PIPELINE)], ids=["shipped", "frozen"])
def test_frozen_override_loads(pipeline, device):
    recipe = hp.get_recipe(pipeline, device=device, overrides=OVERRIDE)
    text_encoder, text_encoder_2, unet_storage, unet_compute, vae = OVERRIDE_EXPECTED[device]
    te, te2, unet, v = (recipe[c] for c in ("text_encoder", "text_encoder_2", "unet", "vae"))
    assert recipe.sources[-1] == str(OVERRIDE)
    # dtypes + why
    assert te.dtypes == (BF16, FP32) and te.compute == te.storage == text_encoder
    assert te.why == "prefer bf16 for the first text encoder"
    assert te2.compute == text_encoder_2 and te2.dtypes == (FP16, BF16, FP32)  # untouched by the override
    # dtype, storage, keep_fp32, output, nan_guard, upcast_attention
    assert (unet.storage, unet.compute) == (unet_storage, unet_compute)
    assert unet.keep_fp32 == ("time_embedding",)
    assert unet.output == "input" and unet.handed_over == te2.compute
    assert unet.nan_guard is True and unet.upcast_attention is True
    # use, entry, output (and the device section)
    assert v.recipe == "vae.fp16_fix" and v.dtypes == (FP16, BF16, FP32)
    assert v.compute == vae and v.entry == ("post_quant_conv", "decoder")
    assert v.output == FP32 and v.handed_over == FP32
    sources = {d.field: d.source for d in v.decisions}
    assert (sources["compute"] == f"{OVERRIDE} devices.mps") is device.startswith("m")


def test_frozen_override_through_the_cli_layers():
    from hf_precision.cli import build_parser
    from hf_precision.cli.common import overrides_from

    args = build_parser().parse_args(["show", str(PIPELINE), "--device", "l4", "--overrides", str(OVERRIDE),
                                      "--set", "unet.storage=float16"])
    recipe = hp.get_recipe(args.name, device=args.device, overrides=overrides_from(args))
    assert (recipe["unet"].storage, recipe["unet"].compute) == (FP16, FP16)  # --set beats the file's device section
