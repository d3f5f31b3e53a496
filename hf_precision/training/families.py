"""How each denoiser family takes a training step: one row of data per model class.

A row says which forward argument takes the noisy latents, how the pipeline-level conditioning names
(``prompt_embeds``, ``pooled_prompt_embeds``, ``prompt_attention_mask``, ``image_embeds``, what the pipeline's
``encode_prompt`` returns) map onto the denoiser's keyword arguments, the latent layout and packing (Flux packs 2x2
patches into tokens with position ids; LTX flattens video latents into tokens), how timesteps are scaled, which
extra inputs the forward needs (SDXL's time ids, Flux/HunyuanVideo guidance, LTX's latent sizes) and what
``encode_prompt`` returns in order. Each row follows the family's diffusers pipeline (cited per row), so a
training step feeds the denoiser exactly what sampling feeds it. The noise objective comes from the scheduler
config (:func:`objective_of`), not from the row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from .rules import TrainingError

__all__ = ["FamilyRow", "FAMILIES", "family_of", "objective_of", "sigma_range", "noisy_inputs", "example_batch",
           "model_output", "cogvideox_rotary", "OBJECTIVES"]

OBJECTIVES = ("epsilon", "v_prediction", "flow", "edm")
# EDM training draws ln(sigma) ~ N(P_mean, P_std^2) (Karras et al. 2022, "Elucidating the Design Space of
# Diffusion-Based Generative Models", Table 1: P_mean -1.2, P_std 1.2), clipped to the scheduler's sigma range.
EDM_P_MEAN, EDM_P_STD = -1.2, 1.2


@dataclasses.dataclass(frozen=True)
class FamilyRow:
    """One denoiser family (see the module docstring for the fields' meaning)."""

    latent_arg: str
    cond: Mapping[str, str]
    encode: tuple[str | None, ...]
    text_dims: Mapping[str, str]
    layout: str = "image"            # image (B,C,H,W) | video (B,C,F,H,W) | frames_first (B,F,C,H,W)
    pack: str | None = None          # flux | ltx
    timestep_scale: float = 1000.0   # flow matching: the denoiser takes sigma * timestep_scale
    extras: tuple[str, ...] = ()
    guidance_scale: float = 1.0      # multiplier on the guidance value the pipeline applies before the call
    source: str = ""


_TEXT = {"prompt_embeds": "encoder_hidden_states"}
_MASKED = {"prompt_embeds": "encoder_hidden_states", "prompt_attention_mask": "encoder_attention_mask"}

FAMILIES: dict[str, FamilyRow] = {
    "UNet2DConditionModel": FamilyRow(
        "sample", _TEXT, ("prompt_embeds", None, "pooled_prompt_embeds", None),
        {"prompt_embeds": "cross_attention_dim"}, extras=("sdxl_time_ids",),
        source="pipeline_stable_diffusion.py / pipeline_stable_diffusion_xl.py (added_cond_kwargs text_embeds, time_ids)"),
    "UNetSpatioTemporalConditionModel": FamilyRow(
        "sample", {"image_embeds": "encoder_hidden_states"}, (), {"image_embeds": "cross_attention_dim"},
        layout="frames_first", extras=("svd_time_ids",),
        source="pipeline_stable_video_diffusion.py (image embeddings, added_time_ids fps/motion/noise_aug)"),
    "SD3Transformer2DModel": FamilyRow(
        "hidden_states", {**_TEXT, "pooled_prompt_embeds": "pooled_projections"},
        ("prompt_embeds", None, "pooled_prompt_embeds", None),
        {"prompt_embeds": "joint_attention_dim", "pooled_prompt_embeds": "pooled_projection_dim"},
        source="pipeline_stable_diffusion_3.py (timestep = sigma * 1000)"),
    "FluxTransformer2DModel": FamilyRow(
        "hidden_states", {**_TEXT, "pooled_prompt_embeds": "pooled_projections"},
        ("prompt_embeds", "pooled_prompt_embeds", None),
        {"prompt_embeds": "joint_attention_dim", "pooled_prompt_embeds": "pooled_projection_dim"},
        pack="flux", timestep_scale=1.0, extras=("flux_ids", "guidance"),
        source="pipeline_flux.py (_pack_latents 2x2, img_ids/txt_ids, timestep / 1000, guidance)"),
    "PixArtTransformer2DModel": FamilyRow(
        "hidden_states", _MASKED, ("prompt_embeds", "prompt_attention_mask", None, None),
        {"prompt_embeds": "caption_channels"}, extras=("pixart_micro",),
        source="pipeline_pixart_sigma.py (added_cond_kwargs resolution/aspect_ratio; learned sigma halves)"),
    "SanaTransformer2DModel": FamilyRow(
        "hidden_states", _MASKED, ("prompt_embeds", "prompt_attention_mask", None, None),
        {"prompt_embeds": "caption_channels"}, extras=("guidance",),
        source="pipeline_sana.py (encoder_attention_mask; timestep = sigma * 1000)"),
    "WanTransformer3DModel": FamilyRow(
        "hidden_states", {**_TEXT, "image_embeds": "encoder_hidden_states_image"}, ("prompt_embeds", None),
        {"prompt_embeds": "text_dim"}, layout="video",
        source="pipeline_wan.py (B,C,F,H,W latents; timestep = sigma * 1000)"),
    "CogVideoXTransformer3DModel": FamilyRow(
        "hidden_states", _TEXT, ("prompt_embeds", None), {"prompt_embeds": "text_embed_dim"}, layout="frames_first",
        extras=("cogvideox",),
        source="pipeline_cogvideox.py (latents permuted to B,F,C,H,W; integer timesteps; image_rotary_emb from "
               "_prepare_rotary_positional_embeddings); pipeline_cogvideox_image2video.py (ofs = 2.0)"),
    "LTXVideoTransformer3DModel": FamilyRow(
        "hidden_states", _MASKED, ("prompt_embeds", "prompt_attention_mask", None, None),
        {"prompt_embeds": "caption_channels"}, layout="video", pack="ltx", extras=("ltx_sizes",),
        source="pipeline_ltx.py (_pack_latents to tokens; num_frames/height/width of the latents)"),
    "HunyuanVideoTransformer3DModel": FamilyRow(
        "hidden_states", {**_MASKED, "pooled_prompt_embeds": "pooled_projections"},
        ("prompt_embeds", "pooled_prompt_embeds", "prompt_attention_mask"),
        {"prompt_embeds": "text_embed_dim", "pooled_prompt_embeds": "pooled_projection_dim"}, layout="video",
        extras=("guidance",), guidance_scale=1000.0,
        source="pipeline_hunyuan_video.py (guidance * 1000; timestep = sigma * 1000)"),
    "QwenImageTransformer2DModel": FamilyRow(
        "hidden_states", {"prompt_embeds": "encoder_hidden_states", "prompt_attention_mask": "encoder_hidden_states_mask"},
        ("prompt_embeds", "prompt_attention_mask"), {"prompt_embeds": "joint_attention_dim"},
        pack="flux", timestep_scale=1.0, extras=("qwen_img_shapes", "guidance"),
        source="pipeline_qwenimage.py (_pack_latents 2x2 as Flux, img_shapes, encoder_hidden_states_mask, timestep / 1000; "
               "the transformer multiplies guidance by 1000 itself)"),
}


def family_of(module: torch.nn.Module) -> FamilyRow:
    """The row for a denoiser, by its class (or a base class); a ``TrainingError`` names the families known.

    Example:
        >>> from diffusers import SD3Transformer2DModel
        >>> family_of(SD3Transformer2DModel(sample_size=8, num_layers=1, attention_head_dim=8, num_attention_heads=1,
        ...     joint_attention_dim=8, caption_projection_dim=8, pooled_projection_dim=8, out_channels=4)).pack is None
        True
    """
    module = getattr(module, "_orig_mod", module)  # torch.compile(module) wraps it in an OptimizedModule
    for cls in type(module).__mro__:
        if cls.__name__ in FAMILIES:
            return FAMILIES[cls.__name__]
    raise TrainingError(f"{type(module).__name__}: no training row for this denoiser class; tp.loss() cannot build its "
                        f"call. Known: {', '.join(FAMILIES)}. Compute your own loss under `with tp.autocast():` (the "
                        f"dtype rules still hold), or add a row to hf_precision.training.families.FAMILIES")


def objective_of(scheduler_config: Mapping[str, Any] | None, scheduler_class: str = "") -> str:
    """The noise objective a scheduler config implies: ``flow``, ``edm``, ``v_prediction`` or ``epsilon``.

    ``edm`` is EDM preconditioning as SVD samples it: continuous timesteps with v-prediction make
    ``EulerDiscreteScheduler`` feed the model ``c_noise = 0.25 * ln(sigma)`` and the input scaled by
    ``1 / sqrt(sigma^2 + 1)`` (diffusers ``schedulers/scheduling_euler_discrete.py``: ``timestep_type ==
    "continuous" and prediction_type == "v_prediction"``, ``scale_model_input``).

    Example:
        >>> objective_of({"prediction_type": "v_prediction"}), objective_of({}, "FlowMatchEulerDiscreteScheduler")
        ('v_prediction', 'flow')
        >>> objective_of({"prediction_type": "v_prediction", "timestep_type": "continuous"}, "EulerDiscreteScheduler")
        'edm'
    """
    config = dict(scheduler_config or {})
    prediction = config.get("prediction_type")
    if scheduler_class.startswith("FlowMatch") or prediction == "flow_prediction" or config.get("use_flow_sigmas"):
        return "flow"
    if prediction == "v_prediction" and config.get("timestep_type") == "continuous":
        return "edm"
    return "v_prediction" if prediction == "v_prediction" else "epsilon"


def sigma_range(scheduler_config: Mapping[str, Any] | None, alphas_cumprod: torch.Tensor | None = None) -> tuple[float, float]:
    """(sigma_min, sigma_max) of an EDM schedule: the config's, else the range its betas give (as the scheduler does).

    Example:
        >>> sigma_range({"sigma_min": 0.002, "sigma_max": 700.0})
        (0.002, 700.0)
    """
    config = dict(scheduler_config or {})
    lo, hi = config.get("sigma_min"), config.get("sigma_max")
    if (lo is None or hi is None) and alphas_cumprod is not None:
        # scheduling_euler_discrete.py: sigmas = sqrt((1 - alphas_cumprod) / alphas_cumprod)
        sigmas = ((1 - alphas_cumprod) / alphas_cumprod).sqrt()
        lo = float(sigmas.min()) if lo is None else lo
        hi = float(sigmas.max()) if hi is None else hi
    return float(0.002 if lo is None else lo), float(80.0 if hi is None else hi)


def _channel_dim(row: FamilyRow) -> int:
    return 2 if row.layout == "frames_first" else 1


def _model_layout(row: FamilyRow, x: torch.Tensor) -> torch.Tensor:
    if row.layout == "image" and x.dim() == 5 and x.shape[2] == 1:
        return x[:, :, 0]  # a 3D causal VAE (QwenImage) encodes an image as one latent frame; the pipeline packs it 2D
    if row.layout == "frames_first":
        return x.transpose(1, 2)  # the VAE gives (B,C,F,H,W); CogVideoX and SVD take (B,F,C,H,W)
    return x


def noisy_inputs(row: FamilyRow, module: torch.nn.Module, batch: Mapping[str, Any], objective: str,
                 alphas_cumprod: torch.Tensor | None, generator: torch.Generator | None = None,
                 sigmas: tuple[float, float] | None = None) -> tuple[dict[str, Any], torch.Tensor]:
    """The denoiser's keyword arguments for one training step, and the target its output is compared with.

    ``sigmas`` is the (min, max) noise level of an ``edm`` objective (:func:`sigma_range`); the batch may fix the
    noise (``noise``), the noise levels (``sigmas``: flow and edm) or the timesteps (``timesteps``: DDPM).
    """
    if "latents" not in batch:
        raise TrainingError(f"tp.loss(batch): the batch has no 'latents' (keys: {sorted(batch)}); give VAE latents, "
                            f"already scaled (tp.encode_images(pixels) makes them)")
    x0 = _model_layout(row, batch["latents"]).float()
    b = x0.shape[0]
    noise = batch.get("noise")
    if noise is None:
        noise = torch.randn(x0.shape, generator=generator, device=x0.device) if generator is not None else torch.randn_like(x0)
    else:
        noise = _model_layout(row, noise).to(x0)  # given in the latents' (VAE) layout
    if objective == "flow":
        sigma = batch.get("sigmas")
        if sigma is None:
            sigma = torch.rand(b, generator=generator, device=x0.device) if generator is not None else torch.rand(b, device=x0.device)
        s = sigma.float().view(b, *[1] * (x0.dim() - 1))
        noisy, target = (1 - s) * x0 + s * noise, noise - x0
        timestep = sigma.float() * row.timestep_scale
    elif objective == "edm":
        sigma = batch.get("sigmas")
        if sigma is None:
            z = torch.randn(b, generator=generator, device=x0.device) if generator is not None else torch.randn(b, device=x0.device)
            lo, hi = sigmas or (0.002, 80.0)
            sigma = (EDM_P_MEAN + EDM_P_STD * z).exp().clamp(lo, hi)
        sigma = sigma.float().to(x0.device).reshape(-1)
        sigma = sigma.expand(b) if sigma.numel() == 1 else sigma[:b]  # one level for all, or one per sample
        s = sigma.view(b, *[1] * (x0.dim() - 1))
        c_in = (s ** 2 + 1).rsqrt()
        # The pipeline's latents at sigma are x0 + sigma * noise; scale_model_input divides them by sqrt(sigma^2 + 1),
        # the timestep is c_noise = 0.25 ln(sigma); step() reads the output as v: x0 = -sigma c_in v + c_in^2 sample,
        # so the v that gives back x0 is c_in (noise - sigma x0) (scheduling_euler_discrete.py, step, v_prediction).
        noisy, target = c_in * (x0 + s * noise), c_in * (noise - s * x0)
        timestep = 0.25 * sigma.log()
    else:
        if alphas_cumprod is None:
            raise TrainingError(f"objective {objective} needs the scheduler's noise schedule; the pipeline has no scheduler "
                                f"(pass a pipeline, or components with a 'scheduler')")
        t = batch.get("timesteps")
        if t is None:
            t = torch.randint(0, len(alphas_cumprod), (b,), generator=generator, device=x0.device) if generator is not None \
                else torch.randint(0, len(alphas_cumprod), (b,), device=x0.device)
        a = alphas_cumprod.to(x0.device)[t.long()].view(b, *[1] * (x0.dim() - 1))
        noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
        target = noise if objective == "epsilon" else a.sqrt() * noise - (1 - a).sqrt() * x0
        timestep = t
    noisy = _with_condition_latents(row, module, noisy, batch)
    if row.pack:
        noisy, target = _pack(row, noisy), _pack(row, target)
    kwargs: dict[str, Any] = {row.latent_arg: noisy, "timestep": timestep}
    for key, arg in row.cond.items():
        if batch.get(key) is not None:
            kwargs[arg] = batch[key]
    for extra in row.extras:
        kwargs.update(_EXTRAS[extra](row, module, batch, x0))
    return kwargs, target


def model_output(out: Any, target: torch.Tensor, row: FamilyRow) -> torch.Tensor:
    """The prediction in ``out`` comparable with ``target`` (PixArt's learned-sigma half is dropped)."""
    pred = out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)
    dim = -1 if row.pack else _channel_dim(row)
    if pred.shape != target.shape and pred.shape[dim] == 2 * target.shape[dim]:
        pred = pred.chunk(2, dim=dim)[0]
    return pred


def _with_condition_latents(row: FamilyRow, module: torch.nn.Module, noisy: torch.Tensor, batch: Mapping[str, Any]) -> torch.Tensor:
    # Inpainting (SD: 4 + 1 mask + 4), image-to-video (Wan I2V 16 + 20, SVD 4 + 4, CogVideoX I2V) concatenate
    # conditioning latents on the channel axis; missing ones are zeros (unconditional, as in condition dropout).
    config = getattr(getattr(module, "_orig_mod", module), "config", {})
    want = int(config.get("in_channels") or 0) // (4 if row.pack == "flux" else 1)
    dim = _channel_dim(row)
    have = noisy.shape[dim]
    if want <= have:
        return noisy
    extra = batch.get("condition_latents")
    if extra is None:
        shape = list(noisy.shape)
        shape[dim] = want - have
        extra = noisy.new_zeros(shape)
    return torch.cat([noisy, extra.to(noisy)], dim=dim)


def _pack(row: FamilyRow, x: torch.Tensor) -> torch.Tensor:
    if row.pack == "flux":  # pipeline_flux.py _pack_latents: 2x2 patches become tokens
        b, c, h, w = x.shape
        return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
    b, c, f, h, w = x.shape  # pipeline_ltx.py _pack_latents with patch sizes 1
    return x.reshape(b, c, f * h * w).transpose(1, 2)


def _sdxl_time_ids(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if module.config.get("addition_embed_type") != "text_time":
        return {}
    b, h, w = x0.shape[0], x0.shape[-2] * 8, x0.shape[-1] * 8
    ids = batch.get("add_time_ids")
    if ids is None:  # original size, crop top-left, target size (pipeline_stable_diffusion_xl.py _get_add_time_ids)
        ids = torch.tensor([[h, w, 0, 0, h, w]], dtype=torch.float32, device=x0.device).expand(b, 6)
    return {"added_cond_kwargs": {"text_embeds": batch.get("pooled_prompt_embeds"), "time_ids": ids}}


def _svd_time_ids(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    ids = batch.get("added_time_ids")
    if ids is None:  # fps - 1, motion bucket, noise augmentation (pipeline_stable_video_diffusion.py _get_add_time_ids)
        ids = torch.tensor([[6.0, 127.0, 0.02]], device=x0.device).expand(x0.shape[0], 3)
    return {"added_time_ids": ids}


def _flux_ids(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    img = torch.zeros(h, w, 3, device=x0.device)
    img[..., 1] += torch.arange(h, device=x0.device)[:, None]
    img[..., 2] += torch.arange(w, device=x0.device)[None, :]
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    return {"img_ids": img.reshape(h * w, 3), "txt_ids": torch.zeros(tokens, 3, device=x0.device)}


def _qwen_img_shapes(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_qwenimage.py: img_shapes = [[(1, latent_h // 2, latent_w // 2)]] * batch_size (RoPE positions)
    return {"img_shapes": [[(1, x0.shape[-2] // 2, x0.shape[-1] // 2)]] * x0.shape[0]}


def _cogvideox(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    config = module.config
    out: dict[str, Any] = {}
    if config.get("ofs_embed_dim"):  # CogVideoX 1.5 I2V: pipeline_cogvideox_image2video.py passes ofs = 2.0
        out["ofs"] = x0.new_full((1,), 2.0)
    if config.get("use_rotary_positional_embeddings"):
        out["image_rotary_emb"] = cogvideox_rotary(module, x0.shape[1], x0.shape[-2], x0.shape[-1])
    return out


def cogvideox_rotary(module: Any, frames: int, height: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """CogVideoX's RoPE (cos, sin) for latents of ``frames`` x ``height`` x ``width``, in fp32 on the module's device.

    What pipeline_cogvideox.py ``_prepare_rotary_positional_embeddings`` builds, from latent sizes (the pipeline
    divides pixel sizes by the VAE factor first): CogVideoX 1.0 crops a grid centred in the base size, 1.5
    (``patch_size_t``) slices one from the maximum size.

    Example:
        >>> from diffusers import CogVideoXTransformer3DModel
        >>> m = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, num_layers=1,
        ...     sample_width=8, sample_height=8, use_rotary_positional_embeddings=True, text_embed_dim=8,
        ...     time_embed_dim=4)
        >>> [tuple(t.shape) for t in cogvideox_rotary(m, 2, 8, 8)]
        [(32, 16), (32, 16)]
    """
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config = module.config
    device = next((p.device for p in module.parameters() if p.device.type != "meta"), torch.device("cpu"))
    p, p_t = int(config["patch_size"]), config.get("patch_size_t")
    grid = (height // p, width // p)
    base_h, base_w = int(config["sample_height"]) // p, int(config["sample_width"]) // p
    if p_t is None:
        crops = get_resize_crop_region_for_grid(grid, base_w, base_h)
        cos, sin = get_3d_rotary_pos_embed(embed_dim=int(config["attention_head_dim"]), crops_coords=crops,
                                           grid_size=grid, temporal_size=frames, device=device)
    else:
        cos, sin = get_3d_rotary_pos_embed(embed_dim=int(config["attention_head_dim"]), crops_coords=None, grid_size=grid,
                                           temporal_size=(frames + p_t - 1) // p_t, grid_type="slice",
                                           max_size=(base_h, base_w), device=device)
    return cos.float(), sin.float()


def _guidance(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not module.config.get("guidance_embeds"):
        return {}
    value = float(batch.get("guidance", 1.0))
    return {"guidance": torch.full((x0.shape[0],), value * row.guidance_scale, device=x0.device)}


def _pixart_micro(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not getattr(module, "use_additional_conditions", False):
        return {"added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}
    b, h, w = x0.shape[0], x0.shape[-2] * 8, x0.shape[-1] * 8
    return {"added_cond_kwargs": {"resolution": torch.tensor([[h, w]], device=x0.device, dtype=torch.float32).expand(b, 2),
                                  "aspect_ratio": torch.tensor([[h / w]], device=x0.device).expand(b, 1)}}


def _ltx_sizes(row: FamilyRow, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    return {"num_frames": x0.shape[2], "height": x0.shape[3], "width": x0.shape[4]}


_EXTRAS = {"sdxl_time_ids": _sdxl_time_ids, "svd_time_ids": _svd_time_ids, "flux_ids": _flux_ids,
           "guidance": _guidance, "pixart_micro": _pixart_micro, "ltx_sizes": _ltx_sizes,
           "qwen_img_shapes": _qwen_img_shapes, "cogvideox": _cogvideox}


def example_batch(module: torch.nn.Module, batch_size: int = 1, *, side: int = 8, frames: int = 2, tokens: int = 4,
                  seed: int = 0) -> dict[str, torch.Tensor]:
    """A small random batch shaped for ``module`` from its config: latents (VAE layout) and conditioning.

    Example:
        >>> from diffusers import SD3Transformer2DModel
        >>> m = SD3Transformer2DModel(sample_size=8, num_layers=1, attention_head_dim=8, num_attention_heads=1,
        ...     joint_attention_dim=8, caption_projection_dim=8, pooled_projection_dim=6, in_channels=4, out_channels=4)
        >>> {k: tuple(v.shape) for k, v in example_batch(m).items()}
        {'latents': (1, 4, 8, 8), 'prompt_embeds': (1, 4, 8), 'pooled_prompt_embeds': (1, 6)}
    """
    row = family_of(module)
    config = module.config
    gen = torch.Generator().manual_seed(seed)
    in_c = int(config["in_channels"])
    out_c = int(config.get("out_channels") or in_c)
    channels = in_c // 4 if row.pack == "flux" else min(in_c, out_c)
    if config.get("sample_frames") and config.get("temporal_compression_ratio"):
        # CogVideoX 1.0 sizes its temporal position embedding from the config (cogvideox_transformer_3d.py)
        frames = (int(config["sample_frames"]) - 1) // int(config["temporal_compression_ratio"]) + 1
    if config.get("patch_size_t"):  # CogVideoX 1.5 patches frames in pairs: the pipeline pads latent frames to fit
        frames = -(-frames // int(config["patch_size_t"])) * int(config["patch_size_t"])
    tokens = int(config.get("max_text_seq_length") or tokens)  # CogVideoX: the prompt is padded to this length
    spatial = (frames, side, side) if row.layout in ("video", "frames_first") else (side, side)
    batch = {"latents": torch.randn(batch_size, channels, *spatial, generator=gen)}
    for key, dim_key in row.text_dims.items():
        dim = config.get(dim_key)
        if key == "pooled_prompt_embeds" and dim is None:
            continue
        if config.get("addition_embed_type") == "text_time" and key == "prompt_embeds":
            pooled = int(config["projection_class_embeddings_input_dim"]) - 6 * int(config["addition_time_embed_dim"])
            batch["pooled_prompt_embeds"] = torch.randn(batch_size, pooled, generator=gen)
        shape = (batch_size, int(dim)) if key == "pooled_prompt_embeds" else (batch_size, 1 if key == "image_embeds" else tokens, int(dim))
        batch[key] = torch.randn(*shape, generator=gen)
    if "prompt_attention_mask" in row.cond:
        batch["prompt_attention_mask"] = torch.ones(batch_size, tokens, dtype=torch.long)
    return batch
