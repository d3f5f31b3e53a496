"""The training plan per device preset for SDXL, Flux and Wan LoRA, against an independent reading of the YAML.

The expectation is derived here from recipes/devices.yaml and the component recipes with plain ``yaml`` (the
rule: a trainable denoiser computes in the first of bf16, fp16, fp32 that the device picks unasked and the
component tolerates; fp16 brings a GradScaler; frozen parts keep their recipe, the recipe's ``training:`` section
merged in), never from the resolver under test or a stored snapshot of its output.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import pytest
import torch
import yaml

import hf_precision as hp

RECIPES = Path(hp.__file__).resolve().parent.parent / "recipes"
PRESETS = ["cpu", "cpu-amx", "t4", "a100", "h100", "m1-macos13", "m2-macos15"]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in str(text).split("."))


def _holds(when: dict, profile) -> bool:
    if when.get("type") and when["type"] != profile.type:
        return False
    for key, have in (("capability", profile.capability), ("macos", profile.macos)):
        if key in when:
            if have is None:
                return False
            op, value = re.fullmatch(r"(>=|<=|<|>|==)?\s*([\d.]+)", str(when[key])).groups()
            have_t = tuple(have)
            cmp = {">=": have_t >= _version(value), "<": have_t < _version(value), "<=": have_t <= _version(value),
                   ">": have_t > _version(value), "==": have_t == _version(value), None: have_t >= _version(value)}
            if not cmp[op]:
                return False
    if "cpu_flags" in when and not set(when["cpu_flags"]) <= set(profile.cpu_flags or ()):
        return False
    if "name_contains" in when and not any(s in (profile.name or "") for s in when["name_contains"]):
        return False
    return True


def auto_dtypes(preset: str) -> list[str]:
    """The `auto` list of devices.yaml for a preset, applying every matching rule in order."""
    rules = yaml.safe_load((RECIPES / "devices.yaml").read_text())["rules"]
    profile = hp.device_profile(preset)
    auto: list[str] = []
    for rule in rules:
        if _holds(rule["when"], profile) and "auto" in rule:
            items = rule["auto"]
            if all(not i.startswith(("+", "-")) for i in items):
                auto = list(items)
            for item in items:
                if item.startswith("+") and item[1:] not in auto:
                    auto.append(item[1:])
                elif item.startswith("-") and item[1:] in auto:
                    auto.remove(item[1:])
    return auto


def component_dtypes(ref: str) -> list[str]:
    stem, _, entry = ref.partition(".")
    data = yaml.safe_load((RECIPES / "components" / f"{stem}.yaml").read_text())["components"][entry]
    return data.get("dtypes") or component_dtypes(data["use"])


def expected(recipe: str, preset: str) -> dict[str, str]:
    spec = yaml.safe_load((RECIPES / f"{recipe}.yaml").read_text())
    auto = auto_dtypes(preset)
    denoiser = spec["denoiser"]
    tolerated = component_dtypes(spec["components"][denoiser]["use"])
    train = next(d for d in ("bfloat16", "float16", "float32") if d in auto and (d in tolerated or d == "float32"))
    vae_ref = spec["components"]["vae"]["use"]
    vae_tolerated = ((spec.get("training") or {}).get("components", {}).get("vae", {}).get("dtypes")
                     or component_dtypes("vae.sdxl" if vae_ref == "vae.sdxl" else vae_ref))
    vae = next((d for d in vae_tolerated if d in auto), "float32")
    return {"denoiser": train, "vae": vae}


@pytest.fixture(scope="module")
def pipes():
    from hf_precision.testing import make_pipeline

    return {name: make_pipeline(name, seed=0) for name in ("sdxl", "flux", "wan")}


def test_the_independent_reading_sees_the_rules():
    # The derivation must be able to disagree with a wrong layer: it gives different answers across presets.
    assert auto_dtypes("t4")[:1] == ["float16"] and "bfloat16" in auto_dtypes("a100")
    assert expected("sdxl", "t4")["denoiser"] == "float16" and expected("flux", "h100")["denoiser"] == "bfloat16"
    assert expected("wan", "m1-macos13")["denoiser"] == "float16" and expected("wan", "m2-macos15")["denoiser"] == "bfloat16"


@pytest.mark.parametrize("recipe", ["sdxl", "flux", "wan"])
@pytest.mark.parametrize("preset", PRESETS)
def test_lora_plan_follows_the_device_rules(pipes, recipe, preset):
    want = expected(recipe, preset)
    tp = hp.prepare_training(copy.deepcopy(pipes[recipe]), device="cpu", layout=None if preset == "cpu" else preset)
    den = tp.denoiser_name
    assert tp.kinds[den] == "lora"
    assert tp.recipe[den].compute == want["denoiser"], str(tp)
    assert tp.compute_dtype == getattr(torch, want["denoiser"])
    assert (tp.scaler is not None) == (want["denoiser"] == "float16")
    assert tp.recipe["vae"].compute == want["vae"], str(tp)
    assert {p.dtype for p in tp.parameters()} == {torch.float32}
    base = tp.components[den]
    frozen = {p.dtype for n, p in base.named_parameters() if not p.requires_grad}
    assert getattr(torch, want["denoiser"]) in frozen  # the frozen base is stored in the compute dtype
    report = str(tp)
    assert ("downgrade:" in report) == (want["denoiser"] != "bfloat16"), report
    if want["denoiser"] == "float16":
        assert "GradScaler" in report and "bf16 is not picked" in report


def test_a_bad_training_section_names_file_and_key(tmp_path):
    text = (RECIPES / "sd15.yaml").read_text().replace("dtypes: [bfloat16, float32]", "dtypez: [bfloat16, float32]")
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(hp.RecipeError, match=r"mine\.yaml training.*components\.vae\.dtypez.*unknown key"):
        hp.get_recipe(str(path), device="cpu")
    path.write_text(text.split("\n# What differs in training")[0] + "\ntraining: [vae]\n")
    with pytest.raises(hp.RecipeError, match=r"mine\.yaml: training: expected an override mapping"):
        hp.get_recipe(str(path), device="cpu")


def test_bad_arguments_are_one_clear_error(pipes):
    from hf_precision.training import TrainingError

    with pytest.raises(TrainingError) as err:
        hp.prepare_training(pipes["sdxl"], train={"unet": "lorra", "text_encoder_3": "full"}, master="fp8")
    text = str(err.value)
    assert "'lorra' is not one of lora, full, embedding, frozen" in text and "unknown component 'text_encoder_3'" in text
    assert "master: 'fp8'" in text
    with pytest.raises(TrainingError, match=r"tokens=\{'text_encoder': \['<my-token>'\]\}"):
        hp.prepare_training(pipes["sdxl"], train={"text_encoder": "embedding"})


def test_fingerprint_follows_the_planned_dtypes(pipes):
    plans = {p: hp.prepare_training(copy.deepcopy(pipes["flux"]), layout=p) for p in ("t4", "a100")}
    again = hp.prepare_training(copy.deepcopy(pipes["flux"]), layout="t4")
    assert plans["t4"].fingerprint() == again.fingerprint()
    assert plans["t4"].fingerprint() != plans["a100"].fingerprint()
    pinned = hp.prepare_training(copy.deepcopy(pipes["flux"]), layout="t4", overrides={"vae": {"dtype": "float16"}})
    assert pinned.recipe["vae"].compute == "float16" and pinned.fingerprint() != again.fingerprint()


def test_a_full_fine_tune_hands_each_rms_norm_its_weights_dtype():
    """Wan's attention norms (torch.nn.RMSNorm) keep fp32 masters in a full fine-tune under fp16 autocast; the CPU's
    autocast leaves rms_norm alone, so an fp16 activation met the fp32 weight and torch fell back from its fused
    kernel with a "Mismatch dtype between input and weight" warning at the first step."""
    from hf_precision.testing import make_pipeline
    from hf_precision.training import example_batch

    tp = hp.prepare_training(make_pipeline("wan"), layout="t4", train={"transformer": "full"})
    model = tp.components["transformer"]
    norms = [m for m in model.modules() if isinstance(m, torch.nn.RMSNorm)]
    met = []
    for norm in norms:  # registered after the layer's own hooks: sees what the norm is handed
        norm.register_forward_pre_hook(lambda m, args: met.append((args[0].dtype, m.weight.dtype)))
    loss = tp.loss(example_batch(model))
    assert norms and len(met) >= len(norms) and torch.isfinite(loss), (len(norms), len(met))
    assert {w for _, w in met} == {torch.float32} and all(x == w for x, w in met), sorted(set(met))
