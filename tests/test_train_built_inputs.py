"""`hf-precision train` hands the denoiser every input its condition builder made, whatever the builder named it:
Wan VACE's control latents (training/inputs/wan_vace_control.py) were built and cached, then dropped by the batch,
and tp.loss refused every step after the model had loaded."""

from __future__ import annotations

import pytest

from checks import write_clips
from hf_precision.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_wan_vace_trains_on_its_control_latents(tmp_path, monkeypatch):
    from hf_precision.testing import make_pipeline, save_pipeline

    pipe = make_pipeline("wan_vace")
    folder = save_pipeline(pipe, tmp_path / "vace")
    clips = write_clips(tmp_path / "clips")
    seen = []
    cls = type(pipe.transformer)
    original = cls.forward

    def recording(self, *args, **kwargs):
        seen.append(kwargs.get("control_hidden_states"))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, "forward", recording)
    assert main(["train", "--model", str(folder), "--data", str(clips), "--out", str(tmp_path / "out"), "--frames", "5",
                 "--resolution", "16", "--device", "cpu", "--quiet", "--steps", "2", "--lora-rank", "4"]) == 0
    assert len(seen) >= 2 and all(c is not None and c.abs().sum() > 0 for c in seen)
    assert (tmp_path / "out" / "pytorch_lora_weights.safetensors").is_file()
