"""A full fine-tune: every weight an fp32 master, computed under autocast in the component's compute dtype."""

from __future__ import annotations

from typing import Any

from ... import dtypes as dt
from ...recipe.quantize import CHOICES, is_quantized
from ..rules import TrainingError
from . import Method, ComponentSetup, register_method


class Full(Method):
    name = "full"
    trains_weights = True
    every_weight = True

    def owns(self, parameter: str) -> bool:
        return True

    def setup(self, s: ComponentSetup) -> None:
        plan = s.recipe[s.name] if s.name in s.recipe else None
        if plan is not None and plan.storage != plan.compute:
            raise TrainingError(f"train: {s.name}: 'full' cannot train weights stored in {plan.storage} and cast on "
                                f"use; drop the storage override or train a LoRA")
        super().setup(s)

    def storage_text(self, plan: Any) -> str:
        return "float32 (masters)"

    def storage_problem(self, component: str, storage: str, compute: str) -> str | None:
        if is_quantized(storage):
            return (f"train: {component}: 'full' cannot train {storage} weights ({CHOICES[storage].why}): a full "
                    f"fine-tune updates every weight as an fp32 master; train a LoRA on the quantized base "
                    f"(train={{{component!r}: 'lora'}}, --method lora) or load {component} unquantized")
        if storage in dt.FLOAT8:
            return (f"train: {component}: 'full' cannot train {storage} weights (stored fp8, cast to {compute} on "
                    f"use): a full fine-tune updates every weight as an fp32 master, and an fp8 weight has no "
                    f"room for an update; train a LoRA on the fp8 base (train={{{component!r}: 'lora'}}, --method "
                    f"lora) or load {component} with --set {component}.storage={compute}")
        return None


register_method(Full())
