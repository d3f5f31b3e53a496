"""`hf-precision train` on Wan 2.2 Animate (issue 34): beside each clip its denoiser takes the character's reference
image, a pose video and a face video (diffusers 0.42.1 pipeline_wan_animate.py __call__), which the data gives as
metadata.jsonl columns `reference`, `pose` and `face`; the conditioning is the pipeline's own methods' (hf_precision
/training/inputs/wan_animate_reference.py). A data folder without the columns keeps the recipe's refusal, which
names them; a clip without one of them, or with a pose/face video that does not go beside it, is one line before
loading."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from hf_precision.apps.video.io import save_video
from hf_precision.cli import main

pytest.importorskip("imageio_ffmpeg", reason="the clips are mp4 (pip install imageio-ffmpeg)")


def _video(path: Path, frames: int, width: int, height: int, seed: int) -> str:
    save_video(np.random.default_rng(seed).integers(0, 256, (frames, height, width, 3), dtype=np.uint8), path)
    return path.name


def _dataset(d: Path, drop: str | None = None, pose: tuple[int, int, int] = (5, 32, 32),
             face: tuple[int, int, int] = (5, 16, 16), columns: bool = True) -> Path:
    """Two 5-frame 32x32 clips, each with a reference image (48x32), a pose video and a face video (clip 0's of
    ``pose`` and ``face``: frames, width, height), named in metadata.jsonl; clip 1 without its ``drop`` column."""
    d.mkdir(parents=True)
    lines = []
    for i in range(2):
        row = {"file_name": _video(d / f"{i}.mp4", 5, 32, 32, i), "text": f"a dance {i}"}
        Image.fromarray(np.random.default_rng(50 + i).integers(0, 256, (32, 48, 3), dtype=np.uint8)).save(
            d / f"{i}-ref.png")
        own_pose, own_face = (pose, face) if i == 0 else ((5, 32, 32), (5, 16, 16))
        row.update(reference=f"{i}-ref.png", pose=_video(d / f"{i}-pose.mp4", *own_pose, 10 + i),
                   face=_video(d / f"{i}-face.mp4", *own_face, 20 + i))
        if i == 1 and drop:
            row.pop(drop)
        lines.append(json.dumps(row if columns else {k: row[k] for k in ("file_name", "text")}))
    (d / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return d


def _no_loading(monkeypatch):
    import hf_precision.runtime.load as load

    monkeypatch.setattr(load, "load_pipeline", lambda *a, **k: pytest.fail("a model loaded before the bad input"))


def _seen_by_the_denoiser(monkeypatch) -> list[dict[str, torch.Tensor]]:
    """The keyword arguments of every denoiser call of the run, recorded by a forward pre-hook on its transformer."""
    import hf_precision.training as training

    seen: list[dict[str, torch.Tensor]] = []
    prepare = training.prepare_training

    def recording(pipe, *args, **kwargs):
        tp = prepare(pipe, *args, **kwargs)
        tp.components["transformer"].register_forward_pre_hook(
            lambda m, a, kw: seen.append({k: v.detach().clone() for k, v in kw.items() if torch.is_tensor(v)}),
            with_kwargs=True)
        return tp
    monkeypatch.setattr(training, "prepare_training", recording)
    return seen


def _faces(pipe, data: Path) -> list[torch.Tensor]:
    """Each clip's face video as the pipeline hands it the transformer (:1005-1007), from the file as decoded."""
    import imageio.v3 as iio

    return [pipe.video_processor.preprocess_video([Image.fromarray(f) for f in iio.imread(data / f"{i}-face.mp4")],
                                                  height=16, width=16) for i in range(2)]


def test_two_steps_train_on_the_pose_and_face_videos_and_the_lora_loads(saved_pipeline, tmp_path, capsys,
                                                                         monkeypatch):
    """A 2-step LoRA run with validation clips exits 0; each denoiser call got non-zero pose latents (one latent
    frame fewer than the latents, whose first is the reference's), a clip's face video as the pipeline makes it, the
    20 reference channels and the reference's CLIP embedding; the LoRA loads into WanAnimatePipeline. Without the
    columns this run was refused before loading."""
    from diffusers import WanAnimatePipeline

    folder, data, out = saved_pipeline("wan_animate"), _dataset(tmp_path / "data"), tmp_path / "out"
    seen = _seen_by_the_denoiser(monkeypatch)
    code = main(["train", "--model", str(folder), "--data", str(data), "--out", str(out), "--frames", "5",
                 "--resolution", "32", "--steps", "2", "--device", "cpu", "--quiet", "--validation-prompt", "a dance",
                 "--validation-inference-steps", "1"])
    stdout, err = capsys.readouterr()
    assert code == 0 and "trained 2 steps" in stdout and "Traceback" not in err, err
    # the validation clips animate the first clip's character, pose and face (the call took none: a TypeError)
    assert (out / "validation" / "step-000002.gif").is_file()
    assert len(seen) >= 2  # the steps, the validation runs' calls and any call the loop makes besides
    pipe = WanAnimatePipeline.from_pretrained(folder)
    faces = _faces(pipe, data)
    for call in seen:
        assert tuple(call["hidden_states"].shape[1:]) == (36, 3, 4, 4)  # 16 noisy + 20 reference, clip + 1 frames
        pose = call["pose_hidden_states"]
        assert tuple(pose.shape[1:]) == (16, 2, 4, 4) and all(p.abs().sum() > 0 for p in pose)
        assert all(any(torch.allclose(face.float(), f[0], atol=1e-5) for f in faces)
                   for face in call["face_pixel_values"])
        assert all(e.abs().sum() > 0 for e in call["encoder_hidden_states_image"])
    from safetensors.torch import load_file

    cached = [load_file(str(f)) for f in sorted((out / "cache" / "latents").glob("*.safetensors"))]
    assert len(cached) == 2 and all(tuple(c["latents"].shape[2:3]) == (3,) for c in cached)  # encoded once, kept
    assert all({"condition_latents", "pose_latents", "face_pixel_values", "image_embeds"} <= set(c) for c in cached)
    pipe.load_lora_weights(out)
    assert any("lora" in n for n, _ in pipe.transformer.named_parameters())


def test_plan_counts_a_wan_animate_step(saved_pipeline, capsys, monkeypatch):
    """`train --plan` reads no data: it plans the step the run makes (it was refused, like the run), on latents of
    the clip's 2 latent frames after the reference's."""
    import hf_precision.memory.train_step as train_step

    frames, count = [], train_step.step_activations

    def counting(module, batch, *args, **kwargs):
        frames.append(batch["latents"].shape[2])
        return count(module, batch, *args, **kwargs)
    monkeypatch.setattr(train_step, "step_activations", counting)
    code = main(["train", "--plan", "--model", str(saved_pipeline("wan_animate")), "--device", "cpu",
                 "--frames", "5", "--resolution", "32"])
    stdout, err = capsys.readouterr()
    assert code == 0 and "predicted peak" in stdout and "Traceback" not in err, err
    assert frames and set(frames) == {3}, frames


COLUMNS_FIX = '"reference": "a-ref.png", "pose": "a-pose.mp4", "face": "a-face.mp4"}'


@pytest.mark.parametrize("kind, says, fix", [
    ("no columns", "WanAnimatePipeline: its denoiser (WanAnimateTransformer3DModel) takes", COLUMNS_FIX),
    ("reference", "clip 1.mp4: no reference image (column 'reference')", COLUMNS_FIX),
    ("pose", "clip 1.mp4: no pose video (column 'pose')", COLUMNS_FIX),
    ("face", "clip 1.mp4: no face video (column 'face')", COLUMNS_FIX),
    ("pose frames", "clip 0.mp4: pose video (column 'pose') 0-pose.mp4 has 9 frame(s), the clip 5", "same frames"),
    ("face frames", "clip 0.mp4: face video (column 'face') 0-face.mp4 has 9 frame(s), the clip 5", "same frames"),
    ("pose size", "clip 0.mp4: pose video (column 'pose') 0-pose.mp4 is 48x32, the clip 32x32", "at the clip's size"),
    ("face size", "clip 0.mp4: face video (column 'face') 0-face.mp4 is 16x12;", "write square face crops"),
])
def test_bad_animate_data_is_one_line_before_loading(kind, says, fix, saved_pipeline, tmp_path, capsys,
                                                     monkeypatch):
    """Each problem of the data is one line naming the clip, the column and the fix, before any model loads; a
    folder without the columns is refused with the recipe's text, which now names them."""
    _no_loading(monkeypatch)
    shapes = {"pose frames": {"pose": (9, 32, 32)}, "face frames": {"face": (9, 16, 16)},
              "pose size": {"pose": (5, 48, 32)}, "face size": {"face": (5, 16, 12)}}.get(kind, {})
    drop = kind if kind in ("reference", "pose", "face") else None
    data = _dataset(tmp_path / "data", drop, columns=kind != "no columns", **shapes)
    out = tmp_path / "out"
    code = main(["train", "--model", str(saved_pipeline("wan_animate")), "--data", str(data), "--out", str(out),
                 "--frames", "5", "--resolution", "32", "--quiet"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2 and len(err) == 1 and says in err[0] and fix in err[0], err
    assert not out.exists()
