"""Textual inversion: new rows of a CLIP token table train as fp32 masters; the encoder's weights stay frozen."""

from __future__ import annotations

from typing import Any

from . import Method, Setup, register_method


class Embedding(Method):
    name = "embedding"
    takes_tokens = True

    def setup(self, s: Setup) -> None:
        from .. import trainable

        super().setup(s)  # the encoder's weights freeze; the new rows are their own masters
        tokenizer = getattr(s.holder, f"tokenizer{s.name.removeprefix('text_encoder')}", None)
        s.token_rows = trainable.add_tokens(tokenizer, s.module, list(s.tokens or []), s.init_tokens, s.master_dtype)

    def label(self, tp: Any, component: str) -> str:
        return f"embedding {', '.join(tp.tokens.get(component, []))}"

    def shard_problem(self, component: str, storage: str | None) -> str | None:
        return (f"shard: {component} trains new token rows (textual inversion), a few kilobytes: nothing to shard; run "
                f"it without sharding (one process or data parallel)")


register_method(Embedding())
