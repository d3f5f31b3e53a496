"""Textual inversion: new rows of a CLIP token table train as fp32 masters; the encoder's weights stay frozen."""

from __future__ import annotations

from typing import Any

from ...errors import RecipeError
from . import Method, ComponentSetup, register_method


class Embedding(Method):
    name = "embedding"
    takes_tokens = True
    selected_by = "embedding"  # --embedding TOKEN alone asks for textual inversion

    def setup(self, s: ComponentSetup) -> None:
        from .. import trainable

        super().setup(s)  # the encoder's weights freeze; the new rows are their own masters
        tokenizer = getattr(s.holder, f"tokenizer{s.name.removeprefix('text_encoder')}", None)
        s.token_rows = trainable.add_tokens(tokenizer, s.module, list(s.tokens or []), s.init_tokens, s.master_dtype)

    def label(self, tp: Any, component: str) -> str:
        return f"embedding {', '.join(tp.tokens.get(component, []))}"

    def shard_problem(self, component: str, storage: str | None) -> str | None:
        return (f"shard: {component} trains new token rows (textual inversion), a few kilobytes: nothing to shard; run "
                f"it without sharding (one process or data parallel)")

    def program_train(self, s: Any, denoiser: str, encoders: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
        clip = [n for n, cls in encoders.items() if "CLIP" in cls]
        if not clip:
            raise RecipeError(f"--embedding {s.embedding}: the model has no CLIP text encoder (only "
                              f"{', '.join(encoders.values()) or 'none'}); textual inversion trains new rows of a CLIP "
                              f"token table (SD 1.x/2.x, SDXL)")
        return {n: "embedding" for n in clip}, {"tokens": {n: [s.embedding] for n in clip},
                                               "init_tokens": {n: [s.init_token] for n in clip}}

    def settings_problems(self, s: Any) -> list[str]:
        problems = []
        if not s.embedding or not (s.embedding.startswith("<") and s.embedding.endswith(">")):
            problems.append(f"--embedding {s.embedding!r}: name the new token in angle brackets, e.g. --embedding "
                            f"\"<my-cat>\" (it must not be a word the tokenizer already has)")
        if not s.init_token:
            problems.append("--init-token: textual inversion starts the new token from an existing one; e.g. "
                            "--init-token cat")
        return problems

    def data_problem(self, s: Any, samples: list[Any]) -> str | None:
        lacking = [smp.path.name for smp in samples if s.embedding not in smp.caption]
        if not lacking:
            return None
        return (f"--embedding {s.embedding}: {len(lacking)} caption(s) do not contain the token "
                f"({', '.join(lacking[:5])}{' ...' if len(lacking) > 5 else ''}); textual inversion learns the token "
                f"from the captions that use it: write it in each (e.g. 'a photo of {s.embedding}'), or pass "
                f"--caption 'a photo of {s.embedding}'")

    def plan_problem(self) -> str | None:
        return ("textual inversion trains a few embedding rows; its memory is the model's weights (hf-precision plan "
                "MODEL --device DEVICE); plan lora or full instead")

    def save(self, tp: Any, folder: Any, dtype: Any, save_module: Any) -> None:
        tp.save_embeddings(folder)

    def reader(self, saved: Any) -> str:
        return f"pipe.load_textual_inversion(<the .safetensors file in {str(saved)!r}>)"


register_method(Embedding())
