"""One test per kind of bad input: each raises ``RecipeError`` (a ``ValueError``) whose message names the source,
the key path, the bad value, what is allowed and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import hf_precision as hp
from hf_precision.recipe import devices
from hf_precision.recipe.overrides import Override, parse_set


def raises(fn, *args, **kwargs) -> str:
    """Run ``fn`` expecting a RecipeError; return its message."""
    with pytest.raises(hp.RecipeError) as info:
        fn(*args, **kwargs)
    assert isinstance(info.value, ValueError)
    assert "Traceback" not in str(info.value)
    return str(info.value)


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def as_set(*flags: str) -> dict:
    return Override("--set", parse_set(flags))


# ---------------------------------------------------------------------------------------- unknown names


def test_unknown_key_in_override_file(tmp_path):
    path = write(tmp_path, "typo.yaml", "schema: 1\ncomponents:\n  unet: {dtpye: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(str(path))
    assert "components.unet.dtpye" in msg and "unknown key 'dtpye'" in msg
    assert "allowed: dtype, dtypes, entry, keep_fp32" in msg
    assert "did you mean 'dtype'?" in msg


def test_unknown_top_level_key(tmp_path):
    path = write(tmp_path, "top.yaml", "schema: 1\ncomponent:\n  unet: {dtype: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "top.yaml: component: unknown key 'component'" in msg
    assert "allowed: components, devices, schema" in msg and "did you mean 'components'?" in msg


def test_unknown_key_in_a_pipeline_recipe_file(tmp_path):
    path = write(tmp_path, "arch.yaml", "schema: 1\nkind: pipeline\nlatent_from: unet\n"
                                        "components:\n  unet: {use: unet.sd15, dtpyes: [float16]}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "2 problems" in msg
    assert "arch.yaml: latent_from: unknown key 'latent_from'" in msg and "did you mean 'latents_from'?" in msg
    assert "arch.yaml: components.unet.dtpyes: unknown key 'dtpyes'" in msg and "did you mean 'dtypes'?" in msg


def test_unknown_component(tmp_path):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"vea": {"dtype": "float32"}})
    assert "overrides dict: components.vea: unknown component 'vea'" in msg
    assert "this recipe has " + ", ".join(sorted(hp.get_recipe("sdxl", device="t4").components)) in msg
    assert "did you mean 'vae'?" in msg
    path = write(tmp_path, "comp.yaml", "schema: 1\ncomponents:\n  transformer: {dtype: float16}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "comp.yaml: components.transformer: unknown component 'transformer'" in msg


def test_unknown_component_in_a_device_section():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"devices": {"cuda": {"unet2": {"dtype": "float32"}}}})
    assert "devices.cuda.unet2: unknown component 'unet2'" in msg and "did you mean 'unet'?" in msg


def test_unknown_device_tag_in_a_device_section():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"devices": {"cuda-sm8": {"vae": {"dtype": "float32"}}}})
    assert "devices.cuda-sm8: unknown device tag 'cuda-sm8'" in msg
    assert "allowed: cpu, cpu-amx, cuda" in msg and "did you mean 'cuda-sm8" in msg


def test_unknown_recipe_name():
    msg = raises(hp.get_recipe, "sdxll", device="t4")
    assert "recipe 'sdxll': unknown; did you mean 'sdxl'?" in msg  # the suggestion first (issue 25)
    assert "pipeline recipes: " + ", ".join(hp.list_recipes("pipeline")) in msg


def test_unknown_component_recipe_entry():
    msg = raises(hp.get_recipe, "vae.sdxll", device="t4")
    assert "has no entry 'sdxll'" in msg and "vae.sdxl" in msg and "did you mean 'vae.sdxl'?" in msg
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"vae": {"use": "vea.kl"}})
    assert "components.vae.use: no component recipe file 'vea'" in msg and "did you mean 'vae'?" in msg


@pytest.mark.parametrize("bad, hint", [("fp17", "did you mean 'fp16'?"), ("bfloat61", "did you mean 'bfloat16'?"),
                                       ("half", "'half' is ambiguous: write float16 or bfloat16")])
def test_unknown_dtype_name(bad, hint):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"unet": {"dtype": bad}})
    assert f"overrides dict: components.unet.dtype: unknown dtype {bad!r}" in msg
    assert "allowed: float32, bfloat16, float16, float8_e4m3fn, float8_e5m2 (aliases: fp32" in msg
    assert hint in msg


def test_unknown_dtype_in_a_dtype_list(tmp_path):
    path = write(tmp_path, "list.yaml", "schema: 1\ncomponents:\n  unet: {dtypes: [float16, bf61]}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "components.unet.dtypes[1]: unknown dtype 'bf61'" in msg and "did you mean 'bf16'?" in msg


# --------------------------------------------------------------------------------------------- devices


@pytest.mark.parametrize("spec, why", [
    ("cuda:sm", "cannot read 'sm'"),
    ("tpu", "unknown device type 'tpu'"),
    ("mps:name=x", "a described MPS device needs its macOS version (mps:macos=13.6)"),
    ("cuda:name=Tesla T4", "a described CUDA device needs its compute capability"),
    ("cuda:sm=abc", "capability='abc' is not a version like 8.0"),
    ("cuda:sm75,ram=16", "unknown field 'ram' (fields: sm/cc, macos, name, flags)"),
])
def test_unknown_device_spec(spec, why):
    msg = raises(hp.get_recipe, "sdxl", device=spec)
    assert msg.startswith(f"device {spec!r}: {why}")
    # the fix: presets and how to describe a device
    assert "use a preset (" in msg and "t4" in msg and "m1-macos13" in msg
    assert "cuda:sm75" in msg and "mps:macos=13.6" in msg
    raises(hp.device_profile, spec)


class NoAcceleratorProbe(devices.SystemProbe):
    def count(self, kind: str) -> int:
        return 1 if kind == "cpu" else 0

    def cpu_flags(self) -> frozenset[str]:
        return frozenset({"avx2"})

    def cpu_name(self) -> str:
        return "Test CPU"


@pytest.fixture
def no_accelerator():
    previous = devices.set_probe(NoAcceleratorProbe())
    yield
    devices.set_probe(previous)


@pytest.mark.parametrize("spec", ["cuda", "cuda:1", "mps", "xpu"])
def test_absent_device_tells_how_to_describe_one(no_accelerator, spec):
    msg = raises(hp.get_recipe, "sdxl", device=spec)
    kind = spec.split(":")[0]
    assert f"device {spec!r}: this machine has no {kind} device (present: cpu)" in msg
    assert "to plan for one, name a preset or describe it" in msg
    assert "cuda:sm75" in msg and "mps:macos=13.6" in msg and "t4" in msg
    # issue 25: the fix for running is named (layout=), and only the devices that are here are called present
    assert "layout=" in msg and "--layout" in msg and "--device cpu" in msg
    assert "a present device (cpu)" in msg and "cuda:1, mps" not in msg
    # and the default falls back to the CPU instead of failing
    assert hp.device_profile(None).type == "cpu"


@pytest.mark.parametrize("value, bad", [("amx_bf16;avx2", "'amx_bf16;avx2'"), ("avx2,none", "'none'"),
                                        ("-avx2", "'-avx2'"), ("avx2,amx/bf16", "'amx/bf16'")])
def test_bad_cpu_flags_env_names_the_variable(monkeypatch, value, bad):
    monkeypatch.setenv(devices.CPU_FLAGS_ENV, value)
    devices.set_probe(None)
    try:
        msg = raises(hp.get_recipe, "sdxl", device="cpu")
    finally:
        monkeypatch.undo()
        devices.set_probe(None)
    assert msg.startswith(f"HF_PRECISION_CPU_FLAGS={value!r}: {bad} is not a CPU flag name")
    assert "allowed: flag names as /proc/cpuinfo spells them" in msg and "amx, avx512, avx2" in msg
    assert "HF_PRECISION_CPU_FLAGS=avx2,avx512f,avx512_bf16,amx_tile,amx_bf16" in msg and "unset it" in msg


@pytest.mark.parametrize("value", ["Xeon\nRapids", "x" * 201])
def test_bad_cpu_name_env_names_the_variable(value):
    msg = raises(devices.cpu_name_from_env, {devices.CPU_NAME_ENV: value})
    assert msg.startswith("HF_PRECISION_CPU_NAME=") and "one printable line of at most 200 characters" in msg


def test_dtype_the_device_cannot_compute_names_the_fix():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=as_set("vae.dtype=bf16"))
    assert msg.startswith("--set: components.vae.dtype: bfloat16 cannot be computed on cuda (Tesla T4, sm 7.5)")
    assert "allowed there: float32, float16" in msg
    assert "bf16 needs compute capability 8.0" in msg  # the device rule that says why
    assert "fix: --set vae.dtype=float32" in msg and "components: {vae: {dtype: float32}}" in msg


def test_every_uncomputable_dtype_is_reported_together():
    msg = raises(hp.get_recipe, "sdxl", device="gtx1660", overrides={"unet": {"dtype": "fp16"}, "vae": {"dtype": "bf16"}})
    assert msg.startswith("2 problems:")
    assert "components.unet.dtype: float16 cannot be computed on cuda (NVIDIA GeForce GTX 1660 SUPER, sm 7.5)" in msg
    assert "fix: --set unet.dtype=float32" in msg
    assert "components.vae.dtype: bfloat16 cannot be computed" in msg and "fix: --set vae.dtype=float32" in msg


def test_storage_the_device_cannot_hold():
    # fp8 storage needs no fp8 hardware (cast per layer on use), but MPS has no float8 dtypes at all.
    msg = raises(hp.get_recipe, "sdxl", device="m1-macos13", overrides={"unet": {"storage": "fp8"}})
    assert "components.unet.storage: float8_e4m3fn cannot be stored on mps (Apple M1, macOS 13.6)" in msg
    assert "allowed there: float32, float16" in msg and "fix: --set unet.storage=float16" in msg


def test_uncomputable_dtype_in_a_device_section_names_its_source(tmp_path):
    path = write(tmp_path, "dev.yaml", "schema: 1\ndevices:\n  mps: {vae: {dtype: bfloat16}}\n")
    msg = raises(hp.get_recipe, "sdxl", device="m1-macos13", overrides=path)
    assert f"{path} devices.mps: components.vae.dtype: bfloat16 cannot be computed on mps (Apple M1, macOS 13.6)" in msg
    assert "fix: --set vae.dtype=float32" in msg
    assert hp.get_recipe("sdxl", device="m2-macos15", overrides=path)["vae"].compute == "bfloat16"


# ------------------------------------------------------------------------------------------ wrong types


@pytest.mark.parametrize("policy, path, allowed", [
    ({"keep_fp32": "time_embedding"}, "components.unet.keep_fp32", "a list of strings"),
    ({"nan_guard": "yes"}, "components.unet.nan_guard", "true or false"),
    ({"upcast_attention": 1}, "components.unet.upcast_attention", "true or false"),
    ({"dtypes": "float16"}, "components.unet.dtypes", "a non-empty list of dtype names"),
    ({"output": "latents"}, "components.unet.output", "input or compute or a dtype name"),
    ({"entry": [1, 2]}, "components.unet.entry", "a list of strings"),
])
def test_wrong_type(policy, path, allowed):
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides={"unet": policy})
    (value,) = policy.values()
    assert f"overrides dict: {path}: bad value {value!r} ({type(value).__name__}); allowed: {allowed}" in msg


def test_wrong_type_of_a_whole_policy(tmp_path):
    path = write(tmp_path, "flat.yaml", "schema: 1\ncomponents:\n  vae: float32\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "flat.yaml: components.vae: expected a mapping of policy keys, got 'float32'" in msg
    assert "e.g. {dtype: float16}" in msg
    path = write(tmp_path, "list.yaml", "- vae\n- unet\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "list.yaml: expected a mapping" in msg and "got list" in msg


def test_wrong_type_of_overrides_argument():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=[42])
    assert "overrides: expected a YAML path, a dict or a list of them, got int 42" in msg


def test_wrong_types_in_yaml_file(tmp_path):
    path = write(tmp_path, "types.yaml", "schema: 1\ncomponents:\n  unet:\n    keep_fp32: time_embedding\n"
                                         "    nan_guard: \"yes\"\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith("2 problems:")
    assert "types.yaml: components.unet.keep_fp32: bad value 'time_embedding' (str); allowed: a list of strings" in msg
    assert "types.yaml: components.unet.nan_guard: bad value 'yes' (str); allowed: true or false" in msg


# ------------------------------------------------------------------------- several problems of one file


def test_all_errors_of_one_file_are_reported_together(tmp_path):
    path = write(tmp_path, "many.yaml",
                 "schema: 1\n"
                 "components:\n"
                 "  unet: {dtpye: float16, keep_fp32: time_embedding, nan_guard: \"yes\"}\n"
                 "  vea: {dtype: float32}\n"
                 "  vae: {dtype: fp17}\n"
                 "devices:\n"
                 "  cuda-sm8: {vae: {dtype: float32}}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.splitlines()[0] == "6 problems:"
    lines = msg.splitlines()[1:]
    assert len(lines) == 6 and all(line.startswith(f"  - {path}: ") for line in lines)
    for needle in ("components.unet.dtpye: unknown key", "components.unet.keep_fp32: bad value",
                   "components.unet.nan_guard: bad value", "components.vea: unknown component",
                   "components.vae.dtype: unknown dtype 'fp17'", "devices.cuda-sm8: unknown device tag"):
        assert sum(needle in line for line in lines) == 1, needle
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device="t4", overrides=path)
    assert len(info.value.problems) == 6


# ----------------------------------------------------------------------------------------- YAML itself


def test_malformed_yaml_reports_the_line(tmp_path):
    path = write(tmp_path, "broken.yaml",
                 "schema: 1\n"             # line 1
                 "components:\n"           # line 2
                 "  vae:\n"                # line 3
                 "    dtype: float32\n"    # line 4
                 "   storage: float32\n")  # line 5: bad indentation
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: line 5, column 4: malformed YAML")
    assert "fix the syntax there" in msg


def test_malformed_yaml_unclosed_bracket(tmp_path):
    path = write(tmp_path, "bracket.yaml", "schema: 1\ncomponents:\n  unet: {keep_fp32: [time_embedding}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert re.search(r"bracket\.yaml: line 3, column \d+: malformed YAML", msg), msg


def test_malformed_pipeline_recipe_file(tmp_path):
    path = write(tmp_path, "arch.yaml", "schema: 1\nkind: pipeline\ncomponents:\n  unet: {use: unet.sd15\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert str(path) in msg and "malformed YAML" in msg and re.search(r"line \d+, column \d+", msg)


@pytest.mark.parametrize("tag", ["!!python/object/apply:os.system", "!!python/object/apply:subprocess.call",
                                 "!!python/object/apply:subprocess.check_call"])
def test_yaml_tags_that_build_python_objects_are_refused(tmp_path, tag):
    marker = tmp_path / "pwned"
    command = f"touch {marker}"
    arg = f'["{command}"]' if tag.endswith("system") else f'[["touch", "{marker}"]]'
    path = write(tmp_path, "evil.yaml", f"schema: 1\ncomponents:\n  vae: {tag} {arg}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: line 3: refused YAML tag")
    assert "recipes are plain data" in msg and "remove tags such as !!python/object" in msg
    assert not marker.exists(), "the YAML tag ran a command"


def test_yaml_tag_in_a_set_flag_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    msg = raises(parse_set, [f'vae.dtype=!!python/object/apply:os.system ["touch {marker}"]'])
    assert "refused YAML tag" in msg and "--set" in msg
    assert not marker.exists()


def test_yaml_tag_in_a_pipeline_recipe_file_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = write(tmp_path, "arch.yaml", f'schema: 1\nkind: pipeline\nmodel: !!python/object/apply:os.system ["touch {marker}"]\n'
                                        "components:\n  unet: {use: unet.sd15}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "line 3: refused YAML tag" in msg
    assert not marker.exists()


# --------------------------------------------------------------------------------------- files, schema


def test_missing_override_file(tmp_path):
    path = tmp_path / "nope.yaml"
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert msg.startswith(f"{path}: file not found") and "check the path" in msg


def test_missing_pipeline_recipe_file(tmp_path):
    path = tmp_path / "sub" / "gone.yaml"
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert msg.startswith(f"{path}: file not found")
    assert "relative paths are taken from" in msg


def test_unsupported_schema(tmp_path):
    path = write(tmp_path, "future.yaml", "schema: 2\ncomponents:\n  vae: {dtype: float32}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert f"{path}: schema: 2 is not supported (this hf_precision reads schema 1)" in msg
    assert "upgrade hf_precision or rewrite the file for schema 1" in msg


def test_unsupported_schema_of_a_pipeline_recipe(tmp_path):
    path = write(tmp_path, "future_arch.yaml", "schema: 2\nkind: pipeline\ncomponents:\n  unet: {use: unet.sd15}\n")
    msg = raises(hp.get_recipe, str(path), device="t4")
    assert "future_arch.yaml: schema: 2 is not supported" in msg


def test_missing_schema_key(tmp_path):
    path = write(tmp_path, "noschema.yaml", "components:\n  vae: {dtype: float32}\n")
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=path)
    assert "noschema.yaml: schema: missing; add 'schema: 1' at the top" in msg


# ------------------------------------------------------------------------------------------- --set flags


@pytest.mark.parametrize("flag", ["vae.dtype", "vae=float32", "vae.dtype.x=float32", ".dtype=float32",
                                  "vae.=float32", "device.cuda.vae.dtype=float32"])
def test_bad_set_syntax(flag):
    msg = raises(parse_set, [flag])
    assert f"--set: {flag!r}: expected component.key=value (e.g. --set vae.dtype=float32)" in msg
    assert "devices.TAG.component.key=value" in msg


def test_bad_set_flags_are_reported_together():
    msg = raises(parse_set, ["vae.dtype", "unet=fp16", "unet.keep_fp32=[a"])
    assert msg.startswith("3 problems:")
    assert "'unet.keep_fp32=[a'" in msg and "malformed YAML" in msg


def test_bad_set_value_names_set_as_source():
    msg = raises(hp.get_recipe, "sdxl", device="t4", overrides=as_set("unet.dtpye=fp16", "vae.nan_guard=maybe"))
    assert msg.startswith("2 problems:")
    assert "--set: components.unet.dtpye: unknown key 'dtpye'" in msg and "did you mean 'dtype'?" in msg
    assert "--set: components.vae.nan_guard: bad value 'maybe' (str); allowed: true or false" in msg
