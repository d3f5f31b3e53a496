"""The memory plan of the image program: which offload and which quantized storage fit ``--max-memory``.

Weights are counted exactly, as :func:`hf_precision.plan` counts them; activations are not simulated (the video
plan does that) but a ``reserve`` share of the budget is held back (20%: a 1024x1024 Flux step uses about 1-2 GB
beside its weights). Candidates, cheapest first: all resident; ``enable_model_cpu_offload``; then the quantized
layouts the recipes tolerate on the device (fp8/int8, then 4-bit; the denoiser, then the text encoders too), each
resident and offloaded. :func:`hf_precision.memory.choose` takes the first that fits.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from ..memory.planner import Choice, choose, is_accelerator, resident_bytes
from ..units import format_bytes

__all__ = ["ImageLayout", "choose_image_layout"]


class ImageLayout(NamedTuple):
    """One candidate layout: offload mode, quantized storage (component, storage), resident weight bytes, and the
    weight bytes of each component in that storage."""

    offload: str
    quantize: tuple[tuple[str, str], ...]
    resident: int
    weights: dict[str, int]

    @property
    def peak(self) -> int:
        return self.resident

    def label(self) -> str:
        return ", ".join([f"offload {self.offload}", *(f"{c} {s}" for c, s in self.quantize)])

    def details(self) -> str:
        return f"resident weights {format_bytes(self.resident)}"

    def overrides(self) -> Any:
        """The storage overrides that load this layout (``--set C.storage=...``)."""
        from ..recipe.overrides import Override

        return Override("memory plan (--max-memory)", {"components": {c: {"storage": s} for c, s in self.quantize}})


def choose_image_layout(name_or_path: str, device: Any, budget: int, *, reserve: float = 0.2, overrides: Any = None,
                        accelerator: bool | None = None) -> Choice[ImageLayout]:
    """The first layout, least cost first, whose resident weights fit ``budget`` minus the activation reserve.

    Example:
        >>> c = choose_image_layout("sdxl", "t4", 6 * 10**9)
        >>> c.fits, c.label()
        (True, 'offload none, unet float8_e4m3fn')
    """
    from ..diagnose.planner import plan
    from ..recipe.devices import device_caps
    from ..recipe.overrides import as_list
    from ..recipe.quantize import storage_options

    base = plan(name_or_path, device=device, overrides=overrides)
    recipe = base.recipe
    offloads = ["none", "model"] if (is_accelerator(device) if accelerator is None else accelerator) else ["none"]
    texts = [n for n in base.components if n.startswith("text_encoder")]
    caps = device_caps(recipe.device)
    options = storage_options(recipe, [recipe.denoiser] if recipe.denoiser else [], texts, caps.storage,
                              caps.transformers_only)
    weights: dict[tuple[tuple[str, str], ...], dict[str, int]] = {}

    def predict(candidate: tuple[tuple[tuple[str, str], ...], str]) -> ImageLayout:
        quant, offload = candidate
        if quant not in weights:  # one plan per storage, shared by its offload modes
            layers = [*as_list(overrides), {"components": {c: {"storage": s} for c, s in quant}}]
            planned = plan(name_or_path, device=device, overrides=layers) if quant else base
            weights[quant] = {n: c.total_bytes for n, c in planned.components.items()}
        return ImageLayout(offload, quant, resident_bytes(weights[quant], offload), weights[quant])

    held = int(budget * reserve)
    return choose([(quant, offload) for quant in [(), *options] for offload in offloads], predict, budget,
                  reserve=held, device=recipe.device)
