"""The memory plan of the image program: which offload and which quantized storage fit ``--max-memory``.

Weights are counted exactly, as :func:`hf_precision.plan` counts them (quantized layouts by their backend's bytes);
activations are not simulated here (the video plan does that per phase): a share of the budget is held back for
them (``reserve``, default 20%: a 1024x1024 Flux step at batch 1 uses about 1-2 GB beside its weights). Candidates,
least cost first: everything resident; whole-component offload (each component moves to the device once per call:
``enable_model_cpu_offload``); then the quantized layouts the component recipes tolerate on the device (fp8/int8
storage, then 4-bit; the denoiser first, then the text encoders too), each resident and with offload.
"""

from __future__ import annotations

import dataclasses
from typing import Any

__all__ = ["ImageChoice", "choose_image_layout"]


@dataclasses.dataclass(frozen=True)
class ImageChoice:
    """The layout chosen for a budget: offload mode, quantized storage, predicted resident weight bytes."""

    offload: str
    quantize: tuple[tuple[str, str], ...]
    resident: int
    weights: dict[str, int]
    budget: int
    reserve: int
    fits: bool
    tried: tuple[tuple[str, tuple[tuple[str, str], ...], int], ...]
    device: Any  # the layout's device (a DeviceProfile): where the speed of the chosen storage was measured

    def label(self) -> str:
        return ", ".join([f"offload {self.offload}", *(f"{c} {s}" for c, s in self.quantize)])

    def overrides(self) -> Any:
        """The storage overrides that load this layout (``--set C.storage=...``)."""
        from ..recipe.overrides import Override

        return Override("memory plan (--max-memory)", {"components": {c: {"storage": s} for c, s in self.quantize}})

    def describe(self) -> str:
        from ..recipe.devices import speed_note
        from ..units import format_bytes

        head = "chosen" if self.fits else "nothing fits; least memory"
        speed = speed_note(self.quantize, self.device)
        return (f"{head} for {format_bytes(self.budget)} ({format_bytes(self.reserve)} held back for activations): "
                f"{self.label()}; resident weights {format_bytes(self.resident)}" + (f"; {speed}" if speed else ""))


def _resident(weights: dict[str, int], offload: str) -> int:
    return sum(weights.values()) if offload == "none" else max(weights.values(), default=0)


def choose_image_layout(name_or_path: str, device: Any, budget: int, *, reserve: float = 0.2, overrides: Any = None,
                        accelerator: bool | None = None) -> ImageChoice:
    """The first layout, least cost first, whose resident weights fit ``budget`` minus the activation reserve.

    Example:
        >>> c = choose_image_layout("sdxl", "t4", 6 * 10**9)
        >>> c.fits, c.label()
        (True, 'offload none, unet float8_e4m3fn')
    """
    from ..diagnose.planner import plan
    from ..recipe.devices import device_profile
    from ..recipe.devices import device_caps
    from ..recipe.quantize import storage_options

    base = plan(name_or_path, device=device, overrides=overrides)
    recipe = base.recipe
    if accelerator is None:
        accelerator = device_profile(device).type != "cpu"
    offloads = ["none", "model"] if accelerator else ["none"]
    texts = [n for n in base.components if n.startswith("text_encoder")]
    caps = device_caps(recipe.device)
    options = storage_options(recipe, [recipe.denoiser] if recipe.denoiser else [], texts, caps.storage,
                              caps.transformers_only)
    usable = budget - int(budget * reserve)
    tried = []
    best = None
    for quant in [(), *options]:
        layers = [*([overrides] if overrides else []),
                  {"components": {c: {"storage": s} for c, s in quant}}] if quant else overrides
        weights = {n: c.total_bytes for n, c in (plan(name_or_path, device=device, overrides=layers) if quant
                                                 else base).components.items()}
        for offload in offloads:
            resident = _resident(weights, offload)
            tried.append((offload, quant, resident))
            choice = ImageChoice(offload, quant, resident, weights, budget, budget - usable, resident <= usable,
                                 tuple(tried), recipe.device)
            if choice.fits:
                return choice
            if best is None or resident < best.resident:
                best = choice
    assert best is not None
    return dataclasses.replace(best, tried=tuple(tried))
