"""Loading a video pipeline with its recipe and the diffusers memory features a run uses (offload, VAE tiling and
slicing, feed-forward chunking, the quantized storage the memory plan chose); components found by role
(:func:`hf_precision.runtime.source.role_of`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ...errors import RecipeError

__all__ = ["OFFLOAD", "MemorySettings", "apply_memory_settings", "components_by_role", "load_video_pipeline", "role"]

OFFLOAD = ("none", "model", "group", "sequential")


def role(module: Any) -> str:
    """What a model component does: ``denoiser``, ``vae``, ``text encoder`` (it reads token ids: T5, CLIP text,
    Llama, Llava), ``image encoder`` (pixels only: CLIP vision), ``controlnet`` or ``other``.

    Example:
        >>> from hf_precision.testing.pipelines import make_svd
        >>> pipe = make_svd()
        >>> role(pipe.unet), role(pipe.image_encoder), role(pipe.vae)
        ('denoiser', 'image encoder', 'vae')
    """
    import inspect

    from ...runtime.source import role_of

    found = role_of(type(module))
    if found != "encoder":
        return found
    try:
        reads_tokens = "input_ids" in inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        reads_tokens = True
    return "text encoder" if reads_tokens else "image encoder"


def components_by_role(pipe: Any, wanted: str) -> list[tuple[str, Any]]:
    """``(name, module)`` of the model components with role ``wanted`` (see :func:`role`), in the pipeline's order;
    ``pipe`` is a pipeline or a mapping name -> module.

    Example:
        >>> from hf_precision.testing.pipelines import make_svd
        >>> [name for name, _ in components_by_role(make_svd(), "denoiser")]
        ['unet']
    """
    import torch

    modules = pipe if isinstance(pipe, Mapping) else pipe.components
    return [(name, m) for name, m in modules.items() if isinstance(m, torch.nn.Module) and role(m) == wanted]


@dataclasses.dataclass(frozen=True)
class MemorySettings:
    """The diffusers memory features a run uses; :mod:`hf_precision.apps.video.plan` chooses them for a budget."""

    offload: str = "none"
    vae_tiling: bool = False
    vae_slicing: bool = False
    forward_chunking: bool = False
    decode_chunk_size: int | None = None
    # (component, storage) pairs: quantized or fp8 storage the memory plan chose (loaded as storage overrides)
    quantize: tuple[tuple[str, str], ...] = ()

    def label(self) -> str:
        parts = [f"offload {self.offload}"]
        parts += [f"{c} {s}" for c, s in self.quantize]
        parts += [name for name, on in (("VAE tiling", self.vae_tiling), ("VAE slicing", self.vae_slicing),
                                        ("feed-forward chunking", self.forward_chunking)) if on]
        if self.decode_chunk_size:
            parts.append(f"decode chunk {self.decode_chunk_size}")
        return ", ".join(parts)


def apply_memory_settings(pipe: Any, settings: MemorySettings, device: Any) -> None:
    """Turn on the diffusers memory features of ``settings`` on a pipeline loaded on the CPU or on ``device``; the offload
    hooks (model, group with CUDA streams where there are any, sequential) move weights as they are, so the recipe's
    dtypes and islands stay.
    """
    import torch

    dev = torch.device(device)
    if settings.offload == "model":
        pipe.enable_model_cpu_offload(device=dev)
    elif settings.offload == "group":
        pipe.enable_group_offload(onload_device=dev, offload_device=torch.device("cpu"), offload_type="leaf_level",
                                  use_stream=dev.type == "cuda")
    elif settings.offload == "sequential":
        pipe.enable_sequential_cpu_offload(device=dev)
    for _, vae in components_by_role(pipe, "vae"):
        if settings.vae_tiling and hasattr(vae, "enable_tiling"):
            vae.enable_tiling()
        if settings.vae_slicing and hasattr(vae, "enable_slicing"):
            vae.enable_slicing()
    if settings.forward_chunking:
        for _, denoiser in components_by_role(pipe, "denoiser"):
            if not hasattr(denoiser, "enable_forward_chunking"):
                raise RecipeError(f"--forward-chunking: {type(denoiser).__name__} has no enable_forward_chunking in "
                                  f"diffusers; drop the option")
            denoiser.enable_forward_chunking()


def load_video_pipeline(model: str, device: Any = None, *, overrides: Any = None,
                        settings: MemorySettings | None = None, single_file: str | None = None, **kwargs: Any) -> Any:
    """Load a video pipeline with its recipe for ``device`` (class and recipe as ``load_pipeline`` chooses them).

    With an offload mode the recipe is resolved for ``device`` but the weights load on the CPU and diffusers' hooks
    move them, so a GPU too small for the whole never holds it. ``device`` may be a mapping component -> device
    (``--device-map balanced``: each component in its device's dtypes, no offload). ``single_file``: a ``.safetensors``
    or ``.gguf`` denoiser in place of ``model``'s. RecipeError for a non-video pipeline, an unknown device, bad
    overrides, or sequential offload on the CPU.
    """
    from ...recipe.devices import device_profile
    from ...recipe.overrides import Override, as_list
    from ...runtime.placement import torch_device
    from ...runtime.load import load_pipeline
    from .spec import model_spec

    settings = settings or MemorySettings()
    if settings.offload not in OFFLOAD:
        raise RecipeError(f"offload={settings.offload!r}: use one of {', '.join(OFFLOAD)}")
    where = model_spec(model)[0]  # refuses a model that is not a video pipeline
    if single_file is not None:
        where, kwargs = single_file, {**kwargs, "base": where}
    layers = as_list(overrides)
    if settings.quantize:  # the storage the memory plan chose: the same as --set C.storage=...
        layers.append(Override("memory plan (--max-memory)",
                               {"components": {c: {"storage": s} for c, s in settings.quantize}}))
    if isinstance(device, Mapping):  # a device per component (--device-map balanced): each resolved for its own
        if settings.offload != "none":
            raise RecipeError(f"offload {settings.offload} with a device per component: offload moves every "
                              f"component onto one device; use one or the other")
        pipe = load_pipeline(where, dict(device), overrides=layers or None, **kwargs)
        apply_memory_settings(pipe, settings, pipe._execution_device)
        return pipe
    dev = torch_device(device if device is not None else device_profile(None).torch_device(), "--device")
    if settings.offload == "none":
        pipe = load_pipeline(where, str(dev), overrides=layers or None, **kwargs)
    else:
        if dev.type == "cpu" and settings.offload == "sequential":
            raise RecipeError("--offload sequential needs an accelerator (cuda, xpu, mps): it streams weights from "
                              "the CPU to one, and on a CPU there is nowhere to stream them to (accelerate's "
                              "sequential hooks also fail there). Use --offload none, model or group")
        # Resolved for the accelerator, loaded on the CPU: the offload hooks move each component when it runs.
        kwargs.setdefault("layout", str(dev))
        pipe = load_pipeline(where, "cpu", overrides=layers or None, **kwargs)
    apply_memory_settings(pipe, settings, dev)
    return pipe
