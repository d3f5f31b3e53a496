"""``--device-map balanced``: whole components over several devices, each in the recipe's dtypes; the placement is
a pure function of the components' planned bytes and the devices' free memory, tested here with made-up rooms."""

from __future__ import annotations

import re

import pytest

from hf_precision import RecipeError
from hf_precision.apps.video.devices import balanced_placement

GB = 10**9
WAN14B = {"transformer": 28 * GB, "text_encoder": 11 * GB, "vae": GB // 4}


def _check_fits(p):
    for slot, (_, room) in enumerate(p.rooms):
        assert p.used(slot) <= room
    assert set(p.devices) == set(p.sizes)


def test_denoiser_alone_on_the_roomiest_device_the_rest_largest_first():
    p = balanced_placement(WAN14B, [("cuda:0", 24 * GB), ("cuda:1", 40 * GB)], "transformer")
    _check_fits(p)
    assert p.devices == {"transformer": "cuda:1", "text_encoder": "cuda:0", "vae": "cuda:0"}
    assert p.mapping()["default"] == "cuda:1"
    # Three devices: the text encoder takes the roomier of the other two, the VAE the one with most left after it.
    p = balanced_placement(WAN14B, [("cuda:0", 12 * GB), ("cuda:1", 40 * GB), ("cuda:2", 16 * GB)], "transformer")
    _check_fits(p)
    assert p.devices == {"transformer": "cuda:1", "text_encoder": "cuda:2", "vae": "cuda:0"}
    assert "cuda:1 (40.00 GB free): transformer 28.00 GB" in p.describe()


def test_the_denoisers_device_is_shared_only_when_no_other_has_room():
    p = balanced_placement(WAN14B, [("cuda:0", 10 * GB), ("cuda:1", 48 * GB)], "transformer")
    _check_fits(p)
    assert p.devices["text_encoder"] == "cuda:1" and p.devices["vae"] == "cuda:0"
    one = balanced_placement(WAN14B, [("cuda:0", 80 * GB)], "transformer")
    assert set(one.devices.values()) == {"cuda:0"}


@pytest.mark.parametrize("rooms,name", [
    ([("cuda:0", 24 * GB), ("cuda:1", 24 * GB)], "transformer"),  # the denoiser fits no single GPU
    ([("cuda:0", 30 * GB), ("cuda:1", 10 * GB)], "text_encoder"),  # the text encoder fits nowhere after it
])
def test_refused_naming_the_component_its_size_the_rooms_and_the_fix(rooms, name):
    with pytest.raises(RecipeError) as err:
        balanced_placement(WAN14B, rooms, "transformer")
    text = str(err.value)
    assert f"{name} needs {WAN14B[name] / GB:.2f} GB" in text
    for device, room in rooms:
        assert f"{device} {room / GB:.2f} GB free" in text
    assert "--offload model" in text and "--max-memory" in text
    with pytest.raises(RecipeError, match="no accelerator is visible"):
        balanced_placement(WAN14B, [], "transformer")


def test_cli_runs_the_demo_over_two_cpu_devices(tmp_path, capsys, monkeypatch):
    """End to end on CPU: two "devices" that are both the CPU, with made-up rooms that force the UNet onto the
    second and the other components onto the first; the placement is printed and the clip written."""
    from hf_precision.apps.video import devices as video_devices
    from hf_precision.cli.video import main

    seen = {}
    real = video_devices.plan_placement

    def spy(*args, **kwargs):
        seen["placement"] = real(*args, **kwargs)
        return seen["placement"]

    monkeypatch.setattr(video_devices, "device_rooms", lambda: [("cpu", 10 * GB), ("cpu", 20 * GB)])
    monkeypatch.setattr(video_devices, "plan_placement", spy)
    out = tmp_path / "demo.gif"
    assert main(["--demo", "--device-map", "balanced", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    p = seen["placement"]
    assert p.slots["unet"] == 1 and {p.slots[c] for c in p.slots if c != "unet"} == {0}
    assert re.search(r"cpu \(20\.00 GB free\): unet [\d.]+ [kMG]?B", text), text
    assert text.index("device map (balanced") < text.index("wrote ")
    assert out.exists()


def test_cli_refuses_device_map_with_one_device_options(tmp_path, capsys):
    from hf_precision.cli.video import main

    assert main(["--demo", "--device-map", "balanced", "--offload", "model", "--out", str(tmp_path / "x.gif")]) == 2
    assert "does not go with --offload" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
