"""LoRA: a low-rank adapter in fp32 on a frozen base that keeps its recipe's storage and compute dtype."""

from __future__ import annotations

from typing import Any

from . import Method, Setup, register_method


class Lora(Method):
    name = "lora"
    trains_weights = True
    saves_adapter = True

    def owns(self, parameter: str) -> bool:
        return "lora_" in parameter

    def setup(self, s: Setup) -> None:
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


def _config(module: Any, rank: int) -> Any:
    from peft import LoraConfig

    from .. import trainable

    # As diffusers' LoRA examples: alpha = rank, gaussian A, zero B (the adapter starts as a no-op).
    return LoraConfig(r=rank, lora_alpha=rank, init_lora_weights="gaussian", target_modules=trainable.default_targets(module))


register_method(Lora())
