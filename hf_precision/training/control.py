"""ControlNet and T2I-Adapter residuals inside a training step, fed to the UNet as their pipelines feed them.

A ControlNet takes the UNet's inputs and the control image, and its residuals are added inside the UNet
(controlnet/pipeline_controlnet.py; examples/controlnet/train_controlnet.py); a T2I-Adapter's features go in as
``down_intrablock_additional_residuals`` (t2i_adapter/pipeline_stable_diffusion_adapter.py). ``batch["control_image"]``:
pixels in [0, 1] at the latents' size times the VAE's factor, as ``prepare_image`` gives them; AnimateDiff's
ControlNet takes one per frame ((B, F, 3, H, W) or (B*F, 3, H, W)).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

import torch

from .methods import method_of
from .rules import TrainingError

__all__ = ["SIDE_NETWORKS", "control_stand_in", "side_inputs"]

SIDE_NETWORKS = ("controlnet", "adapter")
# The forward argument each network's residuals go to (unets/unet_2d_condition.py:989-991; UNetMotionModel takes the
# ControlNet's only, unet_motion_model.py:1892); a video UNet's ControlNet runs on every frame (B*F images,
# animatediff/pipeline_animatediff_controlnet.py)
_RESIDUALS = {"controlnet": "down_block_additional_residuals", "adapter": "down_intrablock_additional_residuals"}


def side_inputs(tp: Any, denoiser: torch.nn.Module, kwargs: Mapping[str, Any], batch: Mapping[str, Any]) -> dict[str, Any]:
    """The extra UNet arguments from ``tp``'s ControlNet / T2I-Adapter, which takes part when it trains or the batch
    has a ``control_image`` (a trained one without, or beside a denoiser this layer cannot feed, is refused).

    Example:
        >>> from types import SimpleNamespace
        >>> side_inputs(SimpleNamespace(components={}, kinds={}), torch.nn.Identity(), {}, {})
        {}
    """
    out: dict[str, Any] = {}
    for name, net in ((n, tp.components[n]) for n in SIDE_NETWORKS if n in tp.components):
        trains = method_of(tp.kinds.get(name, "frozen")).trains_weights
        image = batch.get("control_image")
        if image is None:
            if trains:
                raise TrainingError(f"tp.loss: train={{{name!r}: {tp.kinds[name]!r}}} needs the control image: "
                                    f"batch['control_image'], pixels in [0, 1] of shape (B, 3, f H, f W) for latents of "
                                    f"H x W (f: pipe.vae_scale_factor), as the pipeline's prepare_image gives it")
            continue
        base = type(getattr(denoiser, "_orig_mod", denoiser))  # the compiled module's own class
        if _RESIDUALS[name] not in inspect.signature(base.forward).parameters:
            raise TrainingError(f"tp.loss: the {name} ({type(net).__name__}) beside a {base.__name__} is not fed by "
                                f"tp.loss (its forward takes no {_RESIDUALS[name]}); call tp.components[{name!r}] and "
                                f"the denoiser yourself under `with tp.autocast():`")
        video = kwargs["sample"].dim() == 5  # (B, C, F, H, W): the ControlNet runs on every frame (see _RESIDUALS)
        if name == "controlnet":
            out.update(_controlnet(net, _per_frame(kwargs) if video else kwargs,
                                   image.flatten(0, 1) if video and image.dim() == 5 else image, batch))
        else:
            scale = float(batch.get("adapter_conditioning_scale", 1.0))
            out["down_intrablock_additional_residuals"] = [f * scale for f in net(image)]
    return out


def control_stand_in(tp: Any, latents: torch.Tensor) -> dict[str, torch.Tensor]:
    """A zero ``control_image`` for ``latents`` when a ControlNet / T2I-Adapter of ``tp`` trains, else ``{}``.

    ``tp.check()``'s example step needs one: a trained side network refuses a batch without (``side_inputs``), and
    the user's batch is not there yet. Its shape is the pipelines' (one control frame per frame for a video UNet).

    Example:
        >>> from types import SimpleNamespace
        >>> control_stand_in(SimpleNamespace(components={}, kinds={}), torch.zeros(1, 4, 8, 8))
        {}
    """
    trained = [n for n in SIDE_NETWORKS if n in tp.components and method_of(tp.kinds.get(n, "frozen")).trains_weights]
    factor = tp._vae_scale_factor() if trained else None
    if not factor:
        return {}
    frames = (latents.shape[2],) if latents.dim() == 5 else ()
    shape = (latents.shape[0], *frames, 3, latents.shape[-2] * factor, latents.shape[-1] * factor)
    return {"control_image": torch.zeros(shape, device=latents.device)}


def _controlnet(net: torch.nn.Module, kwargs: Mapping[str, Any], image: torch.Tensor,
                batch: Mapping[str, Any]) -> dict[str, Any]:
    extra = {k: kwargs[k] for k in ("added_cond_kwargs", "class_labels") if kwargs.get(k) is not None}
    down, mid = net(kwargs["sample"], kwargs["timestep"], encoder_hidden_states=kwargs.get("encoder_hidden_states"),
                    controlnet_cond=image, conditioning_scale=float(batch.get("controlnet_conditioning_scale", 1.0)),
                    return_dict=False, **extra)
    return {"down_block_additional_residuals": list(down), "mid_block_additional_residual": mid}


def _per_frame(kwargs: Mapping[str, Any]) -> dict[str, Any]:
    # (B,C,F,H,W) latents as B*F images, one timestep per frame; the text is already repeated per frame
    sample = kwargs["sample"]
    frames = sample.shape[2]
    timestep = kwargs["timestep"]
    if isinstance(timestep, torch.Tensor) and timestep.dim() == 1 and timestep.shape[0] == sample.shape[0]:
        timestep = timestep.repeat_interleave(frames)
    return {**kwargs, "sample": sample.transpose(1, 2).flatten(0, 1), "timestep": timestep}
