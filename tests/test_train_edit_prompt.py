"""Captions encoded one at a time (the caption cache; an edit pair's caption with its own reference) joined into one
batch as the pipeline's own encode_prompt of the batch gives it: Qwen-Image keeps no padding for a single prompt
(its mask is then None), so two captions of different token lengths could not be joined (torch.cat raised)."""

from __future__ import annotations

import torch

from hf_precision.apps.train.batches import _cacheable, _from_cache


def test_captions_of_different_lengths_join_as_the_pipelines_batch(tiny_pipes):
    from hf_precision.testing import make_pipeline

    if "qwenimage" not in tiny_pipes:  # the session's read-only tiny pipeline (conftest), encode_prompt only
        tiny_pipes["qwenimage"] = make_pipeline("qwenimage", size="tiny", seed=0)
    pipe = tiny_pipes["qwenimage"]
    captions = ["a cat", "a much longer caption about a dog on a red chair"]
    with torch.no_grad():
        embeds, mask = pipe.encode_prompt(captions, device="cpu")
        names = ("prompt_embeds", "prompt_attention_mask")
        entries = [_cacheable(dict(zip(names, pipe.encode_prompt([c], device="cpu")))) for c in captions]
    assert mask is not None and entries[0]["prompt_embeds"].shape[1] < entries[1]["prompt_embeds"].shape[1]
    batch = _from_cache(entries, ("prompt_attention_mask",))
    assert torch.equal(batch["prompt_attention_mask"], mask.long())
    assert batch["prompt_embeds"].shape == embeds.shape
    assert torch.allclose(batch["prompt_embeds"], embeds, atol=1e-5)
