"""`hf-precision train` bad input: each defect of the issue gives one clear error (exit 2) before any model loads,
and nothing is written. Plus the data conventions (captions beside, metadata.jsonl), buckets and the batch order."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hf_precision.apps.train.data import ModelGeometry, Sample, epoch_batches, make_buckets, read_data
from hf_precision.cli import main
from hf_precision.errors import RecipeError


@pytest.fixture(scope="module")
def sd15(tmp_path_factory) -> Path:
    from hf_precision.testing.pipelines import make_sd15, save_pipeline

    return save_pipeline(make_sd15(), tmp_path_factory.mktemp("sd15"))


@pytest.fixture(scope="module")
def wan(tmp_path_factory) -> Path:
    from hf_precision.testing import make_pipeline, save_pipeline

    return save_pipeline(make_pipeline("wan"), tmp_path_factory.mktemp("wan"))


@pytest.fixture(autouse=True)
def _no_model_loads(monkeypatch):
    # Every check here must happen before a model loads: loading is made to fail loudly.
    import hf_precision.runtime.load as load

    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded before the bad input was found")

    monkeypatch.setattr(load, "load_pipeline", refuse)


def _image(path: Path, size=(32, 32), seed=0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(path)
    return path


def _folder(tmp_path: Path, n: int = 3, size=(32, 32)) -> Path:
    d = tmp_path / "data"
    d.mkdir()
    for i in range(n):
        _image(d / f"{i}.png", size, i)
        (d / f"{i}.txt").write_text(f"a cat {i}")
    return d


def _train(capsys, *args: str) -> tuple[int, str]:
    code = main(["train", *args, "--quiet"])
    return code, capsys.readouterr().err


def _fails(capsys, model: Path, data: Path, out: Path, *extra: str) -> str:
    code, err = _train(capsys, "--model", str(model), "--data", str(data), "--out", str(out), *extra)
    assert code == 2, err
    assert err.count("error:") == 1 and "Traceback" not in err
    assert not out.exists(), "a failed run must write nothing"
    return err


def test_no_images(capsys, sd15, tmp_path):
    d = tmp_path / "empty"
    d.mkdir()
    (d / "notes.md").write_text("x")
    err = _fails(capsys, sd15, d, tmp_path / "o")
    assert "no images" in err and str(d) in err and ".png" in err and "caption" in err


def test_missing_and_empty_captions_are_named_together(capsys, sd15, tmp_path):
    d = _folder(tmp_path, 4)
    (d / "1.txt").unlink()
    (d / "2.txt").write_text("  \n")
    err = _fails(capsys, sd15, d, tmp_path / "o")
    assert "1.png" in err and "no caption file" in err and "2.txt" in err and "empty" in err
    assert "--caption" in err  # the fix


def test_corrupt_and_truncated_images(capsys, sd15, tmp_path):
    d = _folder(tmp_path, 3)
    (d / "0.png").write_bytes(b"not a png at all")
    whole = (d / "1.png").read_bytes()
    (d / "1.png").write_bytes(whole[: len(whole) // 2])
    err = _fails(capsys, sd15, d, tmp_path / "o")
    assert "0.png" in err and "1.png" in err and "corrupt or truncated" in err
    assert "2.png" not in err


def test_image_too_small(capsys, sd15, tmp_path):
    d = _folder(tmp_path, 2)
    _image(d / "1.png", (16, 16))
    err = _fails(capsys, sd15, d, tmp_path / "o", "--resolution", "32")
    assert "1.png" in err and "16x16" in err and "--resolution 16" in err


def test_resolution_not_a_multiple_of_the_model(capsys, sd15, tmp_path):
    err = _fails(capsys, sd15, _folder(tmp_path), tmp_path / "o", "--resolution", "31")
    assert "--resolution 31" in err and "multiple of 2" in err and "--resolution 32" in err


def test_existing_output_folder(capsys, sd15, tmp_path):
    out = tmp_path / "o"
    out.mkdir()
    (out / "old.safetensors").write_text("keep me")
    code, err = _train(capsys, "--model", str(sd15), "--data", str(_folder(tmp_path)), "--out", str(out))
    assert code == 2 and "exists and is not empty" in err and "--resume latest" in err
    assert [p.name for p in out.iterdir()] == ["old.safetensors"]


@pytest.mark.parametrize("flag,value,words", [("--lora-rank", "0", "rank >= 1"), ("--steps", "0", "at least 1"),
                                              ("--learning-rate", "0", "must be > 0")])
def test_bad_numbers(capsys, sd15, tmp_path, flag, value, words):
    err = _fails(capsys, sd15, _folder(tmp_path), tmp_path / "o", flag, value)
    assert f"{flag} {value}" in err and words in err


def test_clip_with_too_few_frames(capsys, wan, tmp_path):
    d = tmp_path / "clips"
    d.mkdir()
    for name, n in (("long", 9), ("short", 3)):
        frames = [Image.fromarray(np.full((16, 16, 3), 25 * i, np.uint8)) for i in range(n)]
        frames[0].save(d / f"{name}.gif", save_all=True, append_images=frames[1:], duration=100)
        (d / f"{name}.txt").write_text("a cat walking")
    err = _fails(capsys, wan, d, tmp_path / "o", "--frames", "5", "--resolution", "16")
    assert "short.gif" in err and "3 frame(s)" in err and "long.gif" not in err
    err = _fails(capsys, wan, d, tmp_path / "o", "--frames", "6", "--resolution", "16")
    assert "--frames 6" in err and "4*k+1" in err


def test_corrupt_mp4_clip(capsys, wan, tmp_path):
    # imageio's FFMPEG plugin writes the good clip; without it there is no mp4 to damage
    pytest.importorskip("imageio_ffmpeg", reason="writing an mp4 needs an ffmpeg backend (pip install imageio-ffmpeg)")
    import imageio.v2 as imageio

    d = tmp_path / "clips"
    d.mkdir()
    writer = imageio.get_writer(str(d / "good.mp4"), format="FFMPEG", mode="I", fps=8, codec="libx264",
                                pixelformat="yuv420p", macro_block_size=1)
    for i in range(5):
        writer.append_data(np.full((16, 16, 3), 30 * i, np.uint8))
    writer.close()
    (d / "bad.mp4").write_bytes((d / "good.mp4").read_bytes()[:40])
    for name in ("good", "bad"):
        (d / f"{name}.txt").write_text("a cat walking")
    err = _fails(capsys, wan, d, tmp_path / "o", "--frames", "5", "--resolution", "16")
    assert "bad.mp4: cannot decode it as a video" in err and "good.mp4" not in err and "ffmpeg version" not in err


def test_image_folder_for_a_video_model(capsys, wan, tmp_path):
    err = _fails(capsys, wan, _folder(tmp_path), tmp_path / "o", "--frames", "5", "--resolution", "16")
    assert "no clips" in err and "a video model: it trains on clips; add clips with a caption" in err, err


def test_metadata_jsonl(tmp_path):
    d = _folder(tmp_path, 2)
    for p in d.glob("*.txt"):
        p.unlink()
    (d / "metadata.jsonl").write_text(json.dumps({"file_name": "0.png", "text": "a red cat"}) + "\n"
                                      + json.dumps({"file_name": "1.png", "text": "a blue cat"}) + "\n")
    data = read_data(d, ModelGeometry("StableDiffusionPipeline", 8), 32)
    assert sorted(s.caption for s in data.samples) == ["a blue cat", "a red cat"]
    (d / "metadata.jsonl").write_text('{"file_name": "0.png", "text": ""}\n{"file_name": "9.png", "text": "x"}\nnope\n')
    with pytest.raises(RecipeError) as err:
        read_data(d, ModelGeometry("StableDiffusionPipeline", 8), 32)
    text = str(err.value)
    assert "line 1" in text and "empty" in text and "9.png" in text and "line 3" in text and "not valid JSON" in text
    (d / "metadata.jsonl").write_text('{"file_name": "0.png", "text": "a red cat"}\n{"file_name": "1.png", "text": "a b\n')
    with pytest.raises(RecipeError, match=r"metadata.jsonl: line 2, column 32: not valid JSON \(Unterminated string "
                                          r"starting at: column 32\)"):
        read_data(d, ModelGeometry("StableDiffusionPipeline", 8), 32)


def test_buckets_follow_aspect_ratio(tmp_path):
    d = tmp_path / "d"
    d.mkdir()
    for name, size in (("wide", (64, 32)), ("tall", (32, 64)), ("square", (40, 40))):
        _image(d / f"{name}.png", size)
        (d / f"{name}.txt").write_text("a cat")
    data = read_data(d, ModelGeometry("StableDiffusionPipeline", 8), 32)
    buckets = {s.path.stem: s.bucket for s in data.samples}
    assert buckets["square"] == (32, 32)
    assert buckets["wide"][0] > buckets["wide"][1] and buckets["tall"][0] < buckets["tall"][1]
    for w, h in buckets.values():
        assert w % 8 == 0 and h % 8 == 0 and w * h <= 32 * 32
    assert data.pixels([0]).shape[1:] == (3, data.samples[0].bucket[1], data.samples[0].bucket[0])
    assert all(w * h <= 64 * 64 and w % 16 == 0 for w, h in make_buckets(64, 16))


def test_batch_order_is_fixed_by_seed_and_epoch_and_split_between_processes():
    samples = [Sample(Path(f"{i}"), "c", (32, 32), (32, 32) if i < 5 else (40, 24)) for i in range(8)]
    a = epoch_batches(samples, 2, seed=1, epoch=0, world=2)
    assert a == epoch_batches(samples, 2, seed=1, epoch=0, world=2)
    assert a != epoch_batches(samples, 2, seed=1, epoch=1, world=2)
    for batch in a:
        assert len(batch) == 4 and len({samples[i].bucket for i in batch}) == 1


def test_text_encoder_lora_the_pipelines_loader_cannot_save_is_refused_before_loading(capsys, saved_pipeline, tmp_path):
    """HiDream's (and Wan's, HunyuanVideo's) diffusers LoRA loader writes the transformer's LoRA only: with
    --train-text-encoder the run trained every step, then died in save_lora_weights on 'unexpected keyword argument
    text_encoder_lora_layers'. Refused before any model loads, naming the loader and what it takes."""
    err = _fails(capsys, saved_pipeline("hidream"), _folder(tmp_path), tmp_path / "o", "--train-text-encoder",
                 "--resolution", "32")
    says = "--train-text-encoder: HiDreamImagePipeline's LoRA file is written by diffusers' " \
           "HiDreamImagePipeline.save_lora_weights, which takes the LoRA of transformer only"
    assert says in err, err
    code, err = _train(capsys, "--plan", "--model", str(saved_pipeline("hidream")), "--out", str(tmp_path / "p"),
                       "--device", "t4", "--resolution", "32", "--train-text-encoder")  # the plan of that run too
    assert code == 2 and err.count("error:") == 1 and says in err, err
