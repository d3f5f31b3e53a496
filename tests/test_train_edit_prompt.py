"""An edit model whose pipeline encodes the prompt with the reference image (Qwen-Image Edit: its __call__ passes
the resized reference to ``encode_prompt(image=...)``, pipeline_qwenimage_edit.py) trains on the conditioning of
(caption, reference), as inference gives it, not of the caption alone.

No tiny Qwen-Image Edit is built here: its Qwen2VLProcessor cannot be made or loaded without torchvision. The tiny
Flux Kontext (an edit model of the registry) stands in, its ``encode_prompt`` given an ``image`` parameter that
shifts the embeddings by the image's mean: what matters is what the training program hands that parameter.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hf_precision.cli import main


@pytest.fixture(scope="module")
def kontext(saved_pipeline) -> Path:
    return saved_pipeline("flux_kontext")


def _pairs(tmp_path: Path) -> Path:
    """Two targets with one caption and different references (a caption-only cache key would merge them)."""
    d = tmp_path / "data"
    (d / "src").mkdir(parents=True)
    lines = []
    for i in range(2):
        rng = np.random.default_rng(i)
        Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(d / f"{i}.png")
        Image.fromarray(np.full((32, 32, 3), 40 + 150 * i, dtype=np.uint8)).save(d / "src" / f"{i}.png")
        lines.append(json.dumps({"file_name": f"{i}.png", "text": "make it red", "reference": f"src/{i}.png"}))
    (d / "metadata.jsonl").write_text("\n".join(lines) + "\n")
    return d


@pytest.mark.parametrize("cache", [True, False], ids=["cache", "no-cache"])
def test_prompt_is_encoded_with_each_samples_reference(kontext, tmp_path, monkeypatch, cache):
    import torch
    from diffusers import FluxKontextPipeline

    import hf_precision.apps.train.loop as loop

    original = FluxKontextPipeline.encode_prompt
    calls, checking = [], []

    def encode_prompt(self, prompt, prompt_2=None, device=None, num_images_per_prompt=1, prompt_embeds=None,
                      pooled_prompt_embeds=None, max_sequence_length=512, lora_scale=None, image=None):
        embeds, pooled, ids = original(self, prompt, prompt_2, device, num_images_per_prompt, prompt_embeds,
                                       pooled_prompt_embeds, max_sequence_length, lora_scale)
        if not checking:
            calls.append((list(prompt), image))
        if image is not None:  # a stand-in for the VL encoder reading the image with the instruction
            embeds = embeds + float(np.asarray(image, dtype=np.float32).mean()) / 255.0
        return embeds, pooled, ids

    monkeypatch.setattr(FluxKontextPipeline, "encode_prompt", encode_prompt)
    batches = []
    encode = loop._encode

    def spy(run, indices):
        batch = encode(run, indices)
        checking.append(True)
        want = [run.tp.pipe.encode_prompt([run.data.samples[i].caption], image=Image.open(run.data.samples[i].reference),
                                          device=batch["prompt_embeds"].device, max_sequence_length=
                                          batch["prompt_embeds"].shape[1])[0] for i in indices]
        checking.clear()
        batches.append((batch["prompt_embeds"], torch.cat(want)))
        return batch

    monkeypatch.setattr(loop, "_encode", spy)
    out = tmp_path / "out"
    assert main(["train", "--model", str(kontext), "--data", str(_pairs(tmp_path)), "--out", str(out), "--steps", "1",
                 "--batch-size", "2", "--device", "cpu", "--quiet", "--lora-rank", "2",
                 *([] if cache else ["--no-cache"])]) == 0
    training = [im for p, im in calls if p == ["make it red"]]
    # each reference reached encode_prompt with its caption, as the image its target was cropped to
    assert all(im is not None and im.size == (32, 32) for im in training), training
    assert sorted({round(float(np.asarray(im).mean())) for im in training}) == [40, 190]
    assert batches
    for got, want in batches:  # the training batch holds (caption, reference)'s embeds, the two samples apart
        assert torch.allclose(got.float(), want.float(), atol=1e-5)
        assert not torch.allclose(got[0], got[1])
