"""The memory plans of Flux (dev, schnell) and Wan 14B (T2V, I2V) on 12 GB and 16 GB cards name a layout that fits.

The plans count weights from the shipped configs on the meta device; here they are checked against an independent
count: each transformer's parameters written out from its config (the layer sizes of diffusers' model code, summed by
hand) times the bytes per weight of the chosen storage.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_precision as hp

CONFIGS = Path(hp.__file__).parent / "model_configs"
GB = 10**9


def _linear(i: int, o: int) -> int:
    return i * o + o


def flux_params(c: dict) -> int:
    """FluxTransformer2DModel's parameters from its config (transformer_flux.py, by hand)."""
    d = c["num_attention_heads"] * c["attention_head_dim"]
    mlp, head = 4 * d, c["attention_head_dim"]
    embed = _linear(c["in_channels"], d) + _linear(c["joint_attention_dim"], d)
    time = (2 if c["guidance_embeds"] else 1) * (_linear(256, d) + _linear(d, d)) + _linear(c["pooled_projection_dim"], d) + _linear(d, d)
    double = 2 * _linear(d, 6 * d) + 8 * _linear(d, d) + 4 * head + 2 * (_linear(d, mlp) + _linear(mlp, d))
    single = _linear(d, 3 * d) + _linear(d, mlp) + _linear(d + mlp, d) + 3 * _linear(d, d) + 2 * head
    out = _linear(d, 2 * d) + _linear(d, c["patch_size"] ** 2 * c.get("out_channels", c["in_channels"]) or c["in_channels"])
    return embed + time + c["num_layers"] * double + c["num_single_layers"] * single + out


def wan_params(c: dict) -> int:
    """WanTransformer3DModel's parameters from its config (transformer_wan.py, by hand)."""
    d, f, p = c["num_attention_heads"] * c["attention_head_dim"], c["ffn_dim"], 1
    for k in c["patch_size"]:
        p *= k
    total = c["in_channels"] * d * p + d  # patch_embedding (Conv3d)
    total += _linear(c["freq_dim"], d) + _linear(d, d) + _linear(d, 6 * d)  # time embedder and projection
    total += _linear(c["text_dim"], d) + _linear(d, d)  # text embedder
    block = 2 * (4 * _linear(d, d) + 2 * d) + 2 * d + _linear(d, f) + _linear(f, d) + 6 * d
    if c["image_dim"]:
        i = c["image_dim"]
        total += 2 * i + _linear(i, i) + _linear(i, d) + 2 * d  # image embedder: norm, ff, norm
        block += 2 * _linear(c["added_kv_proj_dim"], d) + d  # add_k/add_v and their norm
    return total + c["num_layers"] * block + _linear(d, c["out_channels"] * p) + 2 * d


def _config(folder: str, comp: str = "transformer") -> dict:
    return json.loads((CONFIGS / folder / comp / "config.json").read_text())


@pytest.mark.parametrize("folder,count", [("FLUX.1-dev", flux_params), ("Wan2.1-I2V-14B-480P-Diffusers", wan_params)])
def test_plan_counts_the_transformer_as_the_config_says(folder, count):
    """The planner's parameters and bf16 bytes (islands fp32) against the count by hand x 2 bytes per weight."""
    n = count(_config(folder))
    planned = hp.plan(folder, device="rtx4080")["transformer"]
    assert planned.params == n
    # Wan's rotary tables (rope.freqs_cos/freqs_sin: rope_max_seq_len positions x head dim, non-persistent) are held
    # in memory too, in float32: `rope` is one of its islands; Flux computes its rotary embedding on each call
    c = _config(folder)
    rope = 2 * c["rope_max_seq_len"] * c["attention_head_dim"] if "rope_max_seq_len" in c else 0
    assert rope == 0 or "rope" in planned.keep_fp32
    assert planned.total_bytes == 2 * n + 2 * sum(i.params for i in planned.islands) + 4 * rope


@pytest.mark.parametrize("model,device,gb", [("FLUX.1-dev", "rtx3060", 12), ("FLUX.1-schnell", "rtx4080", 16)])
def test_image_plan_names_a_flux_layout_that_fits(model, device, gb):
    """bf16 weights do not fit; the plan names quantized storage (with offload) whose bytes are the chosen storage's
    bits per weight (scales and the unquantized norms/embedders on top) and that fits beside the activation reserve."""
    from hf_precision.apps.image_plan import choose_image_layout

    n = flux_params(_config(model))
    assert 2 * n > gb * GB  # the bf16 transformer alone does not fit: the plan must quantize
    c = choose_image_layout(model, device, gb * GB)
    assert c.fits and c.resident <= gb * GB - c.reserve and c.quantize
    storage = dict(c.quantize)["transformer"]
    bits = {"int8": 8, "float8_e4m3fn": 8, "nf4": 4}[storage]
    assert n * bits // 8 <= c.weights["transformer"] < n * bits / 8 * 1.15 + 0.05 * n
    assert storage in hp.get_recipe("flux", device=device)["transformer"].quantize
    assert c.label() in c.describe() and "held back for activations" in c.describe()
    assert _measured_speed_said(c.describe(), "transformer", storage)


def _measured_speed_said(text: str, component: str, storage: str) -> bool:
    """The plan quotes the CUDA figure devices.yaml records for the chosen denoiser storage, and the run behind it."""
    import yaml

    from hf_precision.recipe.files import recipes_dir

    entries = yaml.safe_load((recipes_dir() / "devices.yaml").read_text())["measured_speed"]
    cuda = next(e for e in entries if e["device"] == "cuda")
    if storage not in cuda["relative"]:
        return f"{component} {storage}: not measured on cuda" in text
    return (f"{component} {storage} {cuda['relative'][storage]:.2f}x the half layout per call" in text
            and cuda["source"] in text)


def test_video_plan_names_a_wan_14b_layout_that_fits_12gb():
    """Wan 2.1 T2V 14B (28.6 GB of bf16 transformer) on a 12 GB RTX 3060: the plan names offload with quantized
    storage whose transformer bytes match the hand count x bits per weight, and its predicted peak fits. (A short
    clip keeps the meta-device VAE decode cheap; the weights, what decides the layout here, do not depend on it.)"""
    from hf_precision.apps.video.spec import model_spec
    from hf_precision.apps.video.plan import choose

    n = wan_params(_config("Wan2.1-T2V-14B-Diffusers"))
    assert 2 * n > 12 * GB
    where, spec = model_spec("Wan2.1-T2V-14B-Diffusers", configs_only=True)
    c = choose(where, spec, layout="rtx3060", budget=12 * GB, height=240, width=416, frames=5)
    assert c.fits and c.prediction.peak <= 12 * GB
    storage = dict(c.settings.quantize).get("transformer")
    bits = {None: 16, "int8": 8, "float8_e4m3fn": 8, "nf4": 4}[storage]
    assert n * bits // 8 <= c.prediction.weights["transformer"] < n * bits / 8 * 1.15 + 0.05 * n
    assert storage is None or storage in c.settings.label()
    assert storage is None or _measured_speed_said(c.describe(), "transformer", storage)


def test_a_bad_measured_speed_entry_is_named():
    from hf_precision.recipe.devices_schema import check_devices_file

    bad = {"schema": 1, "kind": "devices", "rules": [], "presets": {},
           "measured_speed": [{"device": "cuda", "source": "", "relative": {"int9": 1.1, "nf4": -1}}]}
    with pytest.raises(hp.RecipeError) as info:
        check_devices_file(bad, "devices.yaml")
    message = str(info.value)
    for part in ("measured_speed[0].source", "measured_speed[0].relative.int9", "measured_speed[0].relative.nf4"):
        assert part in message
