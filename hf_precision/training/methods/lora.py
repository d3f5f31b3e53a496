"""LoRA: a low-rank adapter in fp32 on a frozen base that keeps its recipe's storage and compute dtype."""

from __future__ import annotations

from typing import Any

from . import Method, ComponentSetup, register_method


class Lora(Method):
    name = "lora"
    trains_weights = True
    saves_adapter = True

    def owns(self, parameter: str) -> bool:
        return "lora_" in parameter

    def setup(self, s: ComponentSetup) -> None:
        from .. import trainable

        present = trainable.existing_rank(s.module)  # an adapter the user injected before (any path, any dtype)
        if present is None:
            config = s.lora or _config(s.module, s.rank)
            trainable.inject_lora(s.name, s.module, config)
            present = int(getattr(config, "r", s.rank))
        s.lora_rank = present
        super().setup(s)

    def label(self, tp: Any, component: str) -> str:
        return f"lora r={tp.lora_rank[component]}"

    def program_train(self, s: Any, denoiser: str, encoders: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
        return {denoiser: "lora", **({n: "lora" for n in encoders} if s.train_text_encoder else {})}, {"rank": s.lora_rank}

    def settings_problems(self, s: Any) -> list[str]:
        if s.lora_rank < 1:
            return [f"--lora-rank {s.lora_rank}: a LoRA needs rank >= 1 (a rank-0 adapter trains nothing); typical: "
                    f"4-64, e.g. --lora-rank 16"]
        return []

    def plan_label(self, rank: int) -> str:
        return f"lora rank {rank}"

    def save(self, tp: Any, folder: Any, dtype: Any, save_module: Any) -> None:
        tp.save_lora(folder, dtype=dtype)

    def reader(self, saved: Any) -> str:
        from ..io import lora_reader

        return lora_reader(saved)


def _config(module: Any, rank: int) -> Any:
    from peft import LoraConfig

    from .. import trainable

    # As diffusers' LoRA examples: alpha = rank, gaussian A, zero B (the adapter starts as a no-op).
    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=trainable.default_targets(module))


register_method(Lora())
