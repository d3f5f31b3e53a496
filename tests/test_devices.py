"""Device profiles: detection of the present machine is replaceable; devices that are not here can be described."""

from __future__ import annotations

import pytest

import hf_precision as hp
from hf_precision.recipe import devices
from hf_precision.recipe.devices import DeviceProfile, SystemProbe, device_caps, device_profile, list_presets, set_probe


class FakeProbe(SystemProbe):
    """A machine made of data: no torch, no /proc."""

    def __init__(self, *, cuda=(), mps_macos=None, flags=("avx2",), cpu="Fake CPU", xpu=0):
        self._cuda = list(cuda)              # [(name, (major, minor)), ...]
        self._mps_macos = mps_macos          # None: no MPS
        self._flags = frozenset(flags)
        self._cpu = cpu
        self._xpu = xpu
        self.calls: list[str] = []

    def cpu_flags(self) -> frozenset[str]:
        return self._flags

    def cpu_name(self) -> str:
        return self._cpu

    def macos(self):
        return self._mps_macos

    def count(self, kind: str) -> int:
        self.calls.append(kind)
        return {"cuda": len(self._cuda), "mps": int(self._mps_macos is not None), "xpu": self._xpu}.get(kind, 1)

    def cuda(self, index: int):
        return self._cuda[index]

    def xpu_name(self, index: int) -> str:
        return f"Fake Arc {index}"


@pytest.fixture
def use_probe():
    """Install a fake probe for one test; the real one comes back in the finalizer, whatever happens."""
    previous = devices._probe

    def install(probe: SystemProbe) -> SystemProbe:
        set_probe(probe)
        return probe

    yield install
    set_probe(previous)
    assert devices._probe is previous


TWO_GPUS = [("NVIDIA GeForce RTX 3080", (8, 6)), ("Tesla T4", (7, 5))]


def test_two_cuda_gpus(use_probe):
    use_probe(FakeProbe(cuda=TWO_GPUS))
    best = device_profile(None)
    assert (best.type, best.index, best.capability, best.present) == ("cuda", 0, (8, 6), True)
    assert best.label() == "cuda:0 (NVIDIA GeForce RTX 3080, sm 8.6)"
    assert device_profile("cuda") == best
    second = device_profile("cuda:1")
    assert (second.index, second.name, second.capability) == (1, "Tesla T4", (7, 5))
    assert second.torch_device() == "cuda:1"
    with pytest.raises(hp.RecipeError) as info:
        device_profile("cuda:2")
    assert "device 'cuda:2': this machine has 2 cuda device(s)" in str(info.value)
    assert "describe it" in str(info.value)
    # resolution follows the detected device
    assert hp.get_recipe("sdxl")["vae"].compute == "bfloat16"          # sm 8.6: bf16 VAE
    assert hp.get_recipe("sdxl", device="cuda:1")["vae"].compute == "float32"  # the T4
    assert hp.get_recipe("sdxl", device="cuda:1").device.present is True


def test_cuda_wins_over_mps_and_xpu(use_probe):
    use_probe(FakeProbe(cuda=TWO_GPUS[1:], mps_macos=(15, 1), xpu=1))
    assert device_profile(None).type == "cuda"
    use_probe(FakeProbe(mps_macos=(15, 1), xpu=1))
    assert device_profile(None).type == "mps"
    use_probe(FakeProbe(xpu=2))
    best = device_profile(None)
    assert (best.type, best.index, best.name) == ("xpu", 0, "Fake Arc 0")
    assert device_profile("xpu:1").name == "Fake Arc 1"


@pytest.mark.parametrize("macos, bf16, vae, upcast", [((13, 6), False, "float32", False),
                                                      ((14, 2), True, "bfloat16", False),
                                                      ((15, 1), True, "bfloat16", True)])
def test_mac(use_probe, macos, bf16, vae, upcast):
    use_probe(FakeProbe(mps_macos=macos))
    profile = device_profile(None)
    assert (profile.type, profile.macos, profile.present) == ("mps", macos, True)
    assert profile.label() == "mps (Apple GPU, macOS " + ".".join(map(str, macos)) + ")"
    caps = device_caps(None)
    assert ("bfloat16" in caps.compute) is bf16
    assert ("bfloat16" in caps.auto) is bf16
    assert caps.upcast_attention is upcast
    recipe = hp.get_recipe("sdxl")
    assert recipe["vae"].compute == vae and recipe["unet"].compute == "float16"
    assert recipe["unet"].upcast_attention is upcast
    assert device_profile("mps") == profile


@pytest.mark.parametrize("flags, auto, unet", [
    (("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"), ("bfloat16", "float32"), "bfloat16"),
    (("avx2", "avx512f", "avx512_bf16"), ("float32",), "float32"),
    (("avx2",), ("float32",), "float32"),
    ((), ("float32",), "float32"),
])
def test_cpu_flags_decide_auto(use_probe, flags, auto, unet):
    use_probe(FakeProbe(flags=flags, cpu="Fake Xeon"))
    profile = device_profile(None)
    assert (profile.type, profile.name, profile.cpu_flags, profile.present) == ("cpu", "Fake Xeon", frozenset(flags), True)
    caps = device_caps("cpu")
    assert caps.auto == auto
    assert ("cpu-amx" in caps.tags) is ("amx_bf16" in flags)
    assert "bfloat16" in caps.compute  # CPU computes bf16 either way; only AMX makes it the default
    assert hp.get_recipe("sdxl", device="cpu")["unet"].compute == unet


def test_probe_is_not_asked_for_a_described_or_preset_device(use_probe):
    probe = use_probe(FakeProbe())
    device_profile("t4"), device_profile("cuda:sm=8.0"), device_profile("mps:macos=15"), device_profile("cpu:amx")
    assert probe.calls == []


def test_set_probe_returns_previous_and_none_restores_the_real_one(use_probe):
    fake = FakeProbe()
    previous = set_probe(fake)
    assert set_probe(None) is fake
    assert type(devices._probe) is SystemProbe
    set_probe(previous)


def test_set_probe_clears_the_cache(use_probe):
    use_probe(FakeProbe(cuda=TWO_GPUS))
    assert device_profile(None).type == "cuda"
    use_probe(FakeProbe())
    assert device_profile(None).type == "cpu"


@pytest.mark.probe
def test_real_probe_answers_on_this_machine():
    """The unreplaced probe returns a usable profile (on this machine most likely the CPU)."""
    profile = device_profile(None)
    assert profile.present and profile.type in ("cpu", "cuda", "mps", "xpu")
    assert isinstance(profile.label(), str) and profile.label().startswith(profile.type)
    assert SystemProbe().count("cpu") == 1
    cpu = device_profile("cpu")
    assert cpu.present and cpu.cpu_flags == SystemProbe().cpu_flags() and cpu.name == SystemProbe().cpu_name()


# ------------------------------------------------------------------------- running as another CPU (env)

AMX = frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"})


def test_real_flags_come_from_proc_cpuinfo_when_not_overridden(monkeypatch):
    monkeypatch.delenv(devices.CPU_FLAGS_ENV, raising=False)
    monkeypatch.delenv(devices.CPU_NAME_ENV, raising=False)
    try:
        lines = open("/proc/cpuinfo", encoding="utf-8").read().splitlines()
    except OSError:
        pytest.skip("no /proc/cpuinfo on this system: the probe reads no CPU flags here")
    keyed = [line.partition(":") for line in lines]
    flags = next((v.split() for k, _, v in keyed if k.strip() in ("flags", "Features")), [])
    assert SystemProbe().cpu_flags() == frozenset(flags)
    assert "HF_PRECISION" not in SystemProbe().cpu_name()


@pytest.mark.parametrize("value, flags", [
    ("avx2,avx512f,avx512_bf16,amx_tile,amx_bf16", AMX),
    ("amx", AMX),                                               # the cpu:amx description's set
    (" AVX2 + avx512f  avx512_bf16,,amx_tile amx_bf16 ", AMX),   # any of ', +' and spaces; case does not matter
    ("avx512", frozenset({"avx2", "avx512f", "avx512_bf16"})),
    ("avx512,avx512_fp16", frozenset({"avx2", "avx512f", "avx512_bf16", "avx512_fp16"})),
    ("avx2", frozenset({"avx2"})),
    ("none", frozenset()),                                      # macOS, Windows; arm64 to the x86 rules
])
def test_cpu_flags_env_replaces_what_the_probe_reads(cpu_as, value, flags):
    caps = cpu_as(value)
    profile = device_profile("cpu")
    assert profile.cpu_flags == flags and profile.present
    assert profile.name.endswith(f"flags from {devices.CPU_FLAGS_ENV}")  # a simulated CPU says so in every label
    assert caps.auto == (("bfloat16", "float32") if "amx_bf16" in flags else ("float32",))
    assert ("cpu-amx" in caps.tags) is ("amx_bf16" in flags)
    assert hp.get_recipe("sdxl", device="cpu")["unet"].compute == caps.auto[0]
    assert device_profile(None).type != "cpu" or device_profile(None) == profile


def test_cpu_flag_shorthands_are_the_device_descriptions():
    for short in devices.CPU_FLAG_SETS:
        assert devices.cpu_flags_from_env({devices.CPU_FLAGS_ENV: short}) == device_profile(f"cpu:{short}").cpu_flags


def test_cpu_name_env(cpu_as):
    cpu_as("amx", name="Intel Xeon Platinum 8480+")
    assert device_profile("cpu").label() == "cpu (Intel Xeon Platinum 8480+)"
    assert devices.cpu_name_from_env({devices.CPU_NAME_ENV: "  "}) is None


def test_env_is_read_again_after_set_probe_none(cpu_as, monkeypatch):
    cpu_as("amx")
    assert device_caps("cpu").auto[0] == "bfloat16"
    monkeypatch.setenv(devices.CPU_FLAGS_ENV, "avx2")
    assert device_caps("cpu").auto[0] == "bfloat16"  # profiles are cached for the process ...
    set_probe(None)
    assert device_caps("cpu").auto[0] == "float32"   # ... and set_probe(None) re-reads


class GpuMachineProbe(FakeProbe):
    """GPUs made of data beside the CPU read as on a real machine (HF_PRECISION_CPU_FLAGS, else /proc/cpuinfo)."""

    cpu_flags = SystemProbe.cpu_flags
    cpu_name = SystemProbe.cpu_name


def test_devices_on_a_gpu_machine_lists_and_reads_its_cpu(use_probe, monkeypatch, capsys):
    """`hf-precision devices` where this machine is a GPU: a "this cpu" row too (what it offloads or places on its
    CPU follows the CPU's rules), so the CPU is read and a bad HF_PRECISION_CPU_FLAGS is the user error it is on a
    CPU-only machine (it exited 0 on a CUDA machine: nothing read the CPU)."""
    import json

    from hf_precision.cli import main

    h200 = [("NVIDIA H200", (9, 0))]
    use_probe(GpuMachineProbe(cuda=h200))
    assert main(["devices", "--json"]) == 0
    rows = {r["device"]: r for r in json.loads(capsys.readouterr().out)}
    assert list(rows)[:2] == ["this machine", "this cpu"]
    assert rows["this machine"]["label"] == "cuda:0 (NVIDIA H200, sm 9.0)"
    cpu = device_caps("cpu")
    assert (rows["this cpu"]["label"], rows["this cpu"]["auto"]) == (cpu.profile.label(), list(cpu.auto))
    monkeypatch.setenv(devices.CPU_FLAGS_ENV, "amx_bf16;avx2")
    use_probe(GpuMachineProbe(cuda=h200))  # drops the profiles read before the variable was set
    assert main(["devices"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("hf-precision devices: error: HF_PRECISION_CPU_FLAGS='amx_bf16;avx2'")


# ---------------------------------------------------------------------------------------- descriptions


def test_described_gtx_1660():
    profile = device_profile("cuda:sm=8.0,name=GeForce GTX 1660")
    assert (profile.type, profile.capability, profile.name, profile.present) == ("cuda", (8, 0), "GeForce GTX 1660", False)
    caps = device_caps(profile)
    assert "cuda-gtx16" in caps.tags
    assert "float16" not in caps.compute and "float16" not in caps.storage
    with pytest.raises(hp.RecipeError) as info:
        hp.get_recipe("sdxl", device=profile, overrides={"unet": {"dtype": "float16"}})
    assert "float16 cannot be computed" in str(info.value) and "GTX 1660" in str(info.value)
    assert device_caps("gtx1660").tags == ("cuda", "cuda-gtx16")


@pytest.mark.parametrize("spec, fields", [
    ("cuda:sm75", dict(type="cuda", capability=(7, 5))),
    ("cuda:sm_86", dict(type="cuda", capability=(8, 6))),
    ("cuda:sm=8.9", dict(type="cuda", capability=(8, 9))),
    ("cuda:cc=9.0,name=H100", dict(type="cuda", capability=(9, 0), name="H100")),
    ("mps:macos=13.6", dict(type="mps", macos=(13, 6))),
    ("mps:macos=15.1,name=Apple M3", dict(type="mps", macos=(15, 1), name="Apple M3")),
    ("cpu:amx", dict(type="cpu", cpu_flags=frozenset({"avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}))),
    ("cpu:avx2", dict(type="cpu", cpu_flags=frozenset({"avx2"}))),
    ("cpu:flags=avx2+amx_bf16", dict(type="cpu", cpu_flags=frozenset({"avx2", "amx_bf16"}))),
    ("xpu:name=Intel Arc B580", dict(type="xpu", name="Intel Arc B580")),
])
def test_spec_parsing(spec, fields):
    profile = device_profile(spec)
    for key, value in fields.items():
        assert getattr(profile, key) == value, (spec, key)
    assert profile.present is False


@pytest.mark.parametrize("spec, tags", [
    ("cuda:sm75", ("cuda",)),
    ("cuda:sm61", ("cuda", "cuda-pascal")),
    ("cuda:sm80", ("cuda", "cuda-sm80")),
    ("cuda:sm90", ("cuda", "cuda-sm80", "cuda-sm89")),
    ("mps:macos=13.6", ("mps",)),
    ("mps:macos=14.2", ("mps", "mps-macos14")),
    ("mps:macos=14.5", ("mps", "mps-macos14", "mps-macos14.5")),
    ("cpu:avx512", ("cpu",)),
    ("cpu:amx", ("cpu", "cpu-amx")),
])
def test_described_devices_get_the_rules_of_their_facts(spec, tags):
    assert device_caps(spec).tags == tags


def test_presets_list():
    presets = list_presets()
    for name in ("cpu-avx2", "cpu-avx512", "cpu-amx", "v100", "t4", "gtx1660", "a100", "l4", "h100",
                 "m1-macos13", "m2-macos15", "arc-a770"):
        assert isinstance(presets[name], DeviceProfile), name
        assert presets[name].present is False
    assert presets["t4"] == DeviceProfile(type="cuda", name="Tesla T4", capability=(7, 5))
    assert presets["a100"].capability == (8, 0) and presets["h100"].capability == (9, 0)
    assert presets["m1-macos13"].macos == (13, 6) and presets["m2-macos15"].macos == (15, 1)
    assert presets["arc-a770"].type == "xpu"
    assert hp.list_presets() == presets
    # presets are case-insensitive names
    assert device_profile("T4") == presets["t4"]


def test_label():
    assert DeviceProfile(type="cuda", capability=(7, 5), name="Tesla T4").label() == "cuda (Tesla T4, sm 7.5)"
    assert DeviceProfile(type="cuda", index=1, capability=(8, 0), name="A100").label() == "cuda:1 (A100, sm 8.0)"
    assert DeviceProfile(type="mps", name="Apple M1", macos=(13, 6)).label() == "mps (Apple M1, macOS 13.6)"
    assert DeviceProfile(type="cuda", capability=(7, 5)).label() == "cuda (sm 7.5)"
    assert DeviceProfile(type="cpu").label() == "cpu"
    assert device_profile("cpu:amx").label() == "cpu (amx_bf16+amx_tile+avx512_bf16)"
    assert device_profile("cpu:avx2").label() == "cpu (no bf16 ISA)"
    assert device_profile("cpu-amx").label() == "cpu (Xeon with AMX (Sapphire Rapids))"
    assert device_profile("arc-a770").label() == "xpu (Intel Arc A770)"


def test_profile_to_dict():
    d = device_profile("m2-macos15").to_dict()
    assert d == {"type": "mps", "index": None, "name": "Apple M2", "capability": None, "macos": "15.1",
                 "cpu_flags": [], "present": False}
    assert device_profile("t4").to_dict()["capability"] == "7.5"


def test_profile_is_frozen_and_hashable():
    import dataclasses

    profile = device_profile("t4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        profile.name = "other"  # type: ignore[misc]
    assert {profile: 1}[device_profile("t4")] == 1


def test_devices_yaml_is_validated_like_every_recipe_file():
    # Before, only `kind` was checked: a typo under `when:` was ignored, so the rule then held for every CUDA device.
    import yaml

    from hf_precision.recipe.devices_schema import check_devices_file
    from hf_precision.recipe.files import recipes_dir

    shipped = yaml.safe_load((recipes_dir() / "devices.yaml").read_text())
    check_devices_file(shipped, "devices.yaml")  # the shipped file is valid
    typo = dict(shipped, rules=[*shipped["rules"], {"id": "cuda-typo", "when": {"type": "cuda", "capabilty": ">=9.0"},
                                                   "auto": ["+bfloat16"]}])
    with pytest.raises(hp.RecipeError, match=r"rules\[\d+\] \(cuda-typo\)\.when\.capabilty: unknown key 'capabilty'.*did you mean 'capability'"):
        check_devices_file(typo, "devices.yaml")
    bad = dict(shipped, presets={"x": {"type": "gpu", "capability": "7.5"}}, extra=1)
    with pytest.raises(hp.RecipeError) as err:
        check_devices_file(bad, "devices.yaml")
    assert "unknown key 'extra'" in str(err.value) and "unknown device type 'gpu'" in str(err.value)
