"""The extra inputs a denoiser family's forward needs beside the noisy latents, registered by name (:func:`builder`;
a row's ``extras`` in recipes/denoisers.yaml names them), each following its diffusers pipeline: SDXL's time ids,
Flux's position ids, CogVideoX's and Allegro's rotary tables, ...; and the latent layout helpers they share.

``row`` is a ``FamilyRow``; it is typed ``Any`` here because ``families`` imports this module.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import torch

__all__ = ["BUILDERS", "builder", "channel_dim", "frozen_dtype", "model_layout", "optional_inputs"]

Builder = Callable[[Any, Any, Mapping[str, Any], torch.Tensor], dict[str, Any]]
BUILDERS: dict[str, Builder] = {}


def builder(name: str) -> Callable[[Builder], Builder]:
    """Register an extra input builder under ``name``, the name a row's ``extras`` gives (recipes/denoisers.yaml).

    A builder takes (row, denoiser, batch, clean latents in the denoiser's layout) and returns keyword arguments.

    Example:
        >>> @builder("my_scale")
        ... def _my_scale(row, module, batch, x0):
        ...     return {"scale": 1.0}
        >>> BUILDERS["my_scale"](None, None, {}, None)
        {'scale': 1.0}
        >>> del BUILDERS["my_scale"]
    """
    def register(fn: Builder) -> Builder:
        BUILDERS[name] = fn
        return fn
    return register


def channel_dim(row: Any) -> int:
    return 2 if row.layout == "frames_first" else 1


def model_layout(row: Any, x: torch.Tensor) -> torch.Tensor:
    if row.layout == "image" and x.dim() == 5 and x.shape[2] == 1:
        return x[:, :, 0]  # a 3D causal VAE (QwenImage) encodes an image as one latent frame; the pipeline packs it 2D
    if row.layout == "frames_first":
        return x.transpose(1, 2)  # the VAE gives (B,C,F,H,W); CogVideoX and SVD take (B,F,C,H,W)
    return x


@builder('sdxl_time_ids')
def _sdxl_time_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if module.config.get("addition_embed_type") != "text_time":
        return {}
    b, h, w = x0.shape[0], x0.shape[-2] * 8, x0.shape[-1] * 8
    ids = batch.get("add_time_ids")
    pooled = batch.get("pooled_prompt_embeds")
    if ids is None:  # original size, crop top-left, target size (pipeline_stable_diffusion_xl.py _get_add_time_ids)
        values = [h, w, 0, 0, h, w]
        if pooled is not None and _time_id_count(module.config, pooled.shape[-1]) == 5:
            # the refiner (requires_aesthetics_score): original size, crop top-left, aesthetic score (default 6.0),
            # pipeline_stable_diffusion_xl_img2img.py _get_add_time_ids
            values = [h, w, 0, 0, 6.0]
        ids = torch.tensor([values], dtype=torch.float32, device=x0.device).expand(b, len(values))
    return {"added_cond_kwargs": {"text_embeds": pooled, "time_ids": ids}}


def _time_id_count(config: Any, pooled_dim: int) -> int:
    # the UNet's add_embedding takes pooled text + addition_time_embed_dim per time id
    return (int(config["projection_class_embeddings_input_dim"]) - pooled_dim) // int(config["addition_time_embed_dim"])


@builder('svd_time_ids')
def _svd_time_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    ids = batch.get("added_time_ids")
    if ids is None:  # fps - 1, motion bucket, noise augmentation (pipeline_stable_video_diffusion.py _get_add_time_ids)
        ids = torch.tensor([[6.0, 127.0, 0.02]], device=x0.device).expand(x0.shape[0], 3)
    return {"added_time_ids": ids}


@builder('flux_ids')
def _flux_ids(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    h, w = x0.shape[-2] // 2, x0.shape[-1] // 2
    img = torch.zeros(h, w, 3, device=x0.device)
    img[..., 1] += torch.arange(h, device=x0.device)[:, None]
    img[..., 2] += torch.arange(w, device=x0.device)[None, :]
    text = batch.get("prompt_embeds")
    tokens = text.shape[1] if text is not None else 1
    return {"img_ids": img.reshape(h * w, 3), "txt_ids": torch.zeros(tokens, 3, device=x0.device)}


@builder('qwen_img_shapes')
def _qwen_img_shapes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_qwenimage.py: img_shapes = [[(1, latent_h // 2, latent_w // 2)]] * batch_size (RoPE positions)
    return {"img_shapes": [[(1, x0.shape[-2] // 2, x0.shape[-1] // 2)]] * x0.shape[0]}


@builder('cogvideox')
def _cogvideox(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed
    from diffusers.pipelines.cogvideo.pipeline_cogvideox import get_resize_crop_region_for_grid

    config = module.config
    out: dict[str, Any] = {}
    if config.get("ofs_embed_dim"):  # CogVideoX 1.5 I2V: pipeline_cogvideox_image2video.py passes ofs = 2.0
        out["ofs"] = x0.new_full((1,), 2.0)
    if not config.get("use_rotary_positional_embeddings"):
        return out
    # pipeline_cogvideox.py _prepare_rotary_positional_embeddings, from latent sizes (the pipeline divides pixel sizes
    # by the VAE factor first): CogVideoX 1.0 crops a grid centred in the base size, 1.5 (patch_size_t) slices one
    # from the maximum size
    frames, p, p_t = x0.shape[1], int(config["patch_size"]), config.get("patch_size_t")
    grid = (x0.shape[-2] // p, x0.shape[-1] // p)
    base_h, base_w = int(config["sample_height"]) // p, int(config["sample_width"]) // p
    dim = int(config["attention_head_dim"])
    if p_t is None:
        crops = get_resize_crop_region_for_grid(grid, base_w, base_h)
        cos, sin = get_3d_rotary_pos_embed(embed_dim=dim, crops_coords=crops, grid_size=grid, temporal_size=frames,
                                           device=x0.device)
    else:
        cos, sin = get_3d_rotary_pos_embed(embed_dim=dim, crops_coords=None, grid_size=grid, grid_type="slice",
                                           temporal_size=(frames + p_t - 1) // p_t, max_size=(base_h, base_w),
                                           device=x0.device)
    out["image_rotary_emb"] = (cos.float(), sin.float())
    return out


@builder('guidance')
def _guidance(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not module.config.get("guidance_embeds"):
        return {}
    value = float(batch.get("guidance", 1.0))
    return {"guidance": torch.full((x0.shape[0],), value * row.guidance_scale, device=x0.device)}


@builder('pixart_micro')
def _pixart_micro(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    if not getattr(module, "use_additional_conditions", False):
        return {"added_cond_kwargs": {"resolution": None, "aspect_ratio": None}}
    b, h, w = x0.shape[0], x0.shape[-2] * 8, x0.shape[-1] * 8
    return {"added_cond_kwargs": {"resolution": torch.tensor([[h, w]], device=x0.device, dtype=torch.float32).expand(b, 2),
                                  "aspect_ratio": torch.tensor([[h / w]], device=x0.device).expand(b, 1)}}


@builder('ltx_sizes')
def _ltx_sizes(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    return {"num_frames": x0.shape[2], "height": x0.shape[3], "width": x0.shape[4]}


def frozen_dtype(module: torch.nn.Module) -> torch.dtype:
    # The frozen weights' dtype (a LoRA base: the compute dtype); a full fine-tune (fp32 masters) computes under
    # autocast, which casts the timestep itself.
    return next((p.dtype for p in module.parameters() if not p.requires_grad and p.is_floating_point()), torch.float32)


def optional_inputs(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # Conditioning the pipeline always passes but a text-to-X training batch may lack (an I2V image, a VACE control
    # video, Cascade's image embeddings): zeros, the unconditional input, as condition dropout trains it.
    config = getattr(module, "config", {})
    out: dict[str, Any] = {}
    for arg, (key, shape) in row.optional.items():
        kind, _, config_key = shape.partition("@")
        dim = int(config.get(config_key) or 0) if config_key else x0.shape[channel_dim(row)]
        if not dim:
            continue
        given = batch.get(key)
        if given is not None:
            out[arg] = given if kind == "token" else model_layout(row, given)
        elif kind == "token":
            out[arg] = x0.new_zeros(x0.shape[0], 1, dim)
        else:
            zeros = list(x0.shape)
            zeros[channel_dim(row)] = dim
            out[arg] = x0.new_zeros(zeros)
    return out


@builder('noise_level')
def _noise_level(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_stable_diffusion_upscale.py: class_labels = noise_level (default 20) added to the low-res image
    if batch.get("class_labels") is not None:
        return {"class_labels": batch["class_labels"]}
    if not module.config.get("num_class_embeds"):
        return {}
    level = batch.get("noise_level", 20)
    return {"class_labels": torch.as_tensor(level, device=x0.device).long().reshape(-1).expand(x0.shape[0])}


@builder('dit_class')
def _dit_class(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    labels = batch.get("class_labels")
    if labels is None:  # pipeline_dit.py class_null: index num_embeds_ada_norm, the unconditional embedding
        labels = torch.full((x0.shape[0],), int(module.config["num_embeds_ada_norm"]), device=x0.device)
    return {"class_labels": labels}


@builder('fps')
def _fps(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_i2vgen_xl.py: fps_tensor = target_fps (default 16) per sample
    return {"fps": torch.as_tensor(batch.get("fps", 16), device=x0.device).reshape(-1).expand(x0.shape[0])}


@builder('cascade_pooled')
def _cascade_pooled(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # The pipelines hand pooled text embeddings as (B, 1, D); unet_stable_cascade.py get_clip_embeddings reads
    # size(1) of what it is given, so a (B, D) tensor would be mis-shaped.
    pooled = batch.get("pooled_prompt_embeds")
    if pooled is None:
        pooled = x0.new_zeros(x0.shape[0], 1, int(module.config["clip_text_pooled_in_channels"]))
    return {"clip_text_pooled": pooled if pooled.dim() == 3 else pooled[:, None]}


@builder('hunyuandit')
def _hunyuandit(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_2d_rotary_pos_embed
    from diffusers.pipelines.hunyuandit.pipeline_hunyuandit import get_resize_crop_region_for_grid

    # pipeline_hunyuandit.py step 7, from latent sizes (the pipeline divides pixel sizes by 8 first)
    config, b, h, w = module.config, x0.shape[0], x0.shape[-2], x0.shape[-1]
    p = int(config["patch_size"])
    grid = (h // p, w // p)
    rotary = get_2d_rotary_pos_embed(module.inner_dim // module.num_heads, get_resize_crop_region_for_grid(grid, 64 // p),
                                     grid, device=x0.device, output_type="pt")
    out: dict[str, Any] = {"image_rotary_emb": tuple(t.float() for t in rotary)}
    if config.get("use_style_cond_and_image_meta_size"):
        ids = batch.get("add_time_ids")  # original size, target size, crop top-left, in pixels
        if ids is None:
            # one row per sample, in memory: the embedder flattens it with .view (embeddings.py
            # HunyuanCombinedTimestepTextSizeStyleEmbedding), which an expanded (stride 0) batch cannot give
            ids = torch.tensor([[h * 8, w * 8, h * 8, w * 8, 0, 0]], dtype=torch.float32, device=x0.device).repeat(b, 1)
        out.update(image_meta_size=ids, style=torch.zeros(b, dtype=torch.long, device=x0.device))
    return out


@builder('allegro_rotary')
def _allegro_rotary(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    from diffusers.models.embeddings import get_3d_rotary_pos_embed_allegro

    # pipeline_allegro.py _prepare_rotary_positional_embeddings, from latent sizes
    config, p = module.config, int(module.config["patch_size"])
    grid = (x0.shape[-2] // p, x0.shape[-1] // p)
    *freqs, grid_t, grid_h, grid_w = get_3d_rotary_pos_embed_allegro(
        embed_dim=int(config["attention_head_dim"]), crops_coords=((0, 0), grid), grid_size=grid,
        temporal_size=x0.shape[2], device=x0.device,
        interpolation_scale=(config["interpolation_scale_t"], config["interpolation_scale_h"], config["interpolation_scale_w"]))
    pos = torch.cartesian_prod(grid_t.long(), grid_h.long(), grid_w.long())
    return {"image_rotary_emb": (tuple(freqs), tuple(pos.reshape(-1, 3).transpose(0, 1).reshape(3, 1, -1).contiguous()))}


@builder('framepack')
def _framepack(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_hunyuan_video_framepack.py, its default inverted anti-drifting sampling, the section next to the
    # image (no padding): frame indices [prefix | window | history 1x, 2x, 4x]; the clean latents are the image
    # latents then the 1x history. A batch without them gets zeros, as the pipeline's history starts.
    b, c, f, h, w = x0.shape
    sizes = (1, 2, 16)
    history = batch.get("history_latents")
    history = x0.new_zeros(b, c, sum(sizes), h, w) if history is None else history[:, :, :sum(sizes)].to(x0)
    prefix = batch.get("image_latents")
    prefix = x0.new_zeros(b, c, 1, h, w) if prefix is None else prefix.to(x0)
    latents_1x, latents_2x, latents_4x = history.split(sizes, dim=2)
    index_prefix, index_latents, index_1x, index_2x, index_4x = torch.arange(
        1 + f + sum(sizes), device=x0.device).split([1, f, *sizes])
    return {"indices_latents": index_latents, "latents_clean": torch.cat([prefix, latents_1x], dim=2),
            "indices_latents_clean": torch.cat([index_prefix, index_1x]), "latents_history_2x": latents_2x,
            "indices_latents_history_2x": index_2x, "latents_history_4x": latents_4x,
            "indices_latents_history_4x": index_4x}


@builder('wan_animate')
def _wan_animate(row: Any, module: Any, batch: Mapping[str, Any], x0: torch.Tensor) -> dict[str, Any]:
    # pipeline_wan_animate.py: the latents' first frame is the reference image, so the pose latents have one frame
    # fewer, and the face video has the segment's pixel frames (4 per latent frame after the first) at the motion
    # encoder's size. Without them: zero pose latents and the pipeline's unconditional face (all pixels -1).
    b, c, f, h, w = x0.shape
    pose = batch.get("pose_latents")
    face = batch.get("face_pixel_values")
    if face is None:
        size = int(module.config["motion_encoder_size"])
        face = x0.new_full((b, 3, 4 * (f - 2) + 1, size, size), -1.0)
    return {"pose_hidden_states": x0.new_zeros(b, c, f - 1, h, w) if pose is None else pose, "face_pixel_values": face}
