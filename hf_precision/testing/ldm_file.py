"""Write a diffusers pipeline's weights in the original (LDM/SGM) single-file layout that Civitai, A1111 and ComfyUI
ship (``model.diffusion_model.``, ``first_stage_model.``, ``cond_stage_model.`` or ``conditioner.embedders.``).

diffusers only converts the other way (loaders/single_file_utils.py ``convert_ldm_unet_checkpoint``,
``convert_ldm_vae_checkpoint``, ``convert_ldm_clip_checkpoint``, ``convert_open_clip_checkpoint``); each function
here reverses one and raises unless diffusers' conversion gives the very same state dict back.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["to_ldm_unet", "to_ldm_vae", "to_ldm_clip", "to_open_clip", "sdxl_checkpoint"]

# Where an SDXL checkpoint keeps its components (diffusers' CHECKPOINT_KEY_NAMES / LDM_CLIP_PREFIX_TO_REMOVE)
SDXL_PREFIXES = {"unet": "model.diffusion_model.", "vae": "first_stage_model.",
                 "text_encoder": "conditioner.embedders.0.transformer.", "text_encoder_2": "conditioner.embedders.1.model."}


def _same(back: Mapping[str, Any], state: Mapping[str, Any], what: str) -> None:
    import torch

    def same(a: Any, b: Any) -> bool:  # meta tensors (plans of real sizes) have shapes only
        return a is b or (a.shape == b.shape and (a.is_meta or b.is_meta or torch.equal(a, b)))

    if back.keys() != state.keys() or not all(same(back[k], state[k]) for k in state):
        raise AssertionError(f"{what} disagrees with diffusers' converter: {sorted(set(back) ^ set(state))[:4]}")


def to_ldm_unet(state: Mapping[str, Any], config: Mapping[str, Any], prefix: str = "model.diffusion_model.") -> dict:
    """A diffusers UNet2DConditionModel state dict in the original LDM/SGM key layout (SD 1.x/2.x/SDXL checkpoints): the
    fixed layers from diffusers' ``DIFFUSERS_TO_LDM_MAPPING``, the blocks numbered as the LDM UNet numbers them
    (input, middle and output blocks). ``prefix=""`` gives ComfyUI's ``models/unet`` files.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> unet = make_pipeline("sd15").unet
        >>> sorted(to_ldm_unet(unet.state_dict(), unet.config))[0]
        'model.diffusion_model.input_blocks.0.0.bias'
    """
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING, convert_ldm_unet_checkpoint

    table = DIFFUSERS_TO_LDM_MAPPING["unet"]
    fixed = {**table["layers"], **(table["addition_embed_type"] if config.get("addition_embed_type") == "text_time" else {})}
    resnet = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
              "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}
    per = config["layers_per_block"] + 1
    with_attention = {i for i, t in enumerate(config["up_block_types"]) if "CrossAttn" in t}
    out = {}
    for key, value in state.items():
        if key in fixed:
            out[prefix + fixed[key]] = value
            continue
        p = key.split(".")
        if p[0] == "mid_block":
            kind, index, rest = p[1], int(p[2]), p[3:]
            head = f"middle_block.{2 * index if kind == 'resnets' else 1}"
        elif p[2] in ("downsamplers", "upsamplers"):
            b, rest = int(p[1]), p[4:]
            head = (f"input_blocks.{1 + b * per + per - 1}.0.op" if p[0] == "down_blocks" else
                    f"output_blocks.{b * per + per - 1}.{2 if b in with_attention else 1}.conv")
            rest = rest[1:]  # the `conv` of diffusers' Downsample2D/Upsample2D
        else:
            b, kind, index, rest = int(p[1]), p[2], int(p[3]), p[4:]
            block = f"input_blocks.{1 + b * per + index}" if p[0] == "down_blocks" else f"output_blocks.{b * per + index}"
            head = f"{block}.{0 if kind == 'resnets' else 1}"
        if "resnets" in key:
            rest = [resnet.get(rest[0], rest[0])] + rest[1:]
        out[prefix + ".".join([head, *rest])] = value
    back = convert_ldm_unet_checkpoint(dict(out) if prefix else {"model.diffusion_model." + k: v for k, v in out.items()},
                                       dict(config))
    _same(back, state, "to_ldm_unet")
    return out


def to_ldm_vae(state: Mapping[str, Any], config: Mapping[str, Any], prefix: str = "first_stage_model.") -> dict:
    """A diffusers AutoencoderKL state dict in the original LDM layout (its ``first_stage_model.`` of a whole
    checkpoint): diffusers' table for the fixed layers, ``down.{i}.block.{j}`` / ``up.{n-1-i}.block.{j}`` resnets,
    ``mid.block_{1,2}`` and ``mid.attn_1`` with 1x1 convolutions for the attention's projections.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> vae = make_pipeline("sd15").vae
        >>> "first_stage_model.decoder.mid.attn_1.q.weight" in to_ldm_vae(vae.state_dict(), vae.config)
        True
    """
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING, convert_ldm_vae_checkpoint

    fixed = DIFFUSERS_TO_LDM_MAPPING["vae"]
    attention = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out": "proj_out"}
    ups = len(config["up_block_types"])
    out = {}
    for key, value in state.items():
        p = key.split(".")
        if key in fixed:
            new = fixed[key]
        elif p[1] == "mid_block" and p[2] == "resnets":
            new = ".".join([p[0], "mid", f"block_{int(p[3]) + 1}", *p[4:]])
        elif p[1] == "mid_block":  # attentions.0.<layer>.(0.)weight
            new = ".".join([p[0], "mid", "attn_1", attention[p[4]], p[-1]])
            value = value[:, :, None, None] if value.dim() == 2 else value
        else:
            block = int(p[2]) if p[0] == "encoder" else ups - 1 - int(p[2])
            where = "down" if p[0] == "encoder" else "up"
            if p[3] == "resnets":
                rest = [("nin_shortcut" if p[5] == "conv_shortcut" else p[5]), *p[6:]]
                new = ".".join([p[0], where, str(block), "block", p[4], *rest])
            else:  # downsamplers.0.conv / upsamplers.0.conv
                new = ".".join([p[0], where, str(block), "downsample" if where == "down" else "upsample", *p[5:]])
        out[prefix + new] = value
    _same(convert_ldm_vae_checkpoint(dict(out), dict(config)), state, "to_ldm_vae")
    return out


def to_ldm_clip(state: Mapping[str, Any], prefix: str = "cond_stage_model.transformer.") -> dict:
    """A transformers CLIPTextModel state dict as SD 1.x (``cond_stage_model.transformer.``) or SDXL's first encoder
    (``conditioner.embedders.0.transformer.``) stores it: the transformers keys under ``text_model.`` (transformers
    >= 5.6 flattened CLIPTextModel and dropped that level; diffusers strips it again when the model has none).

    Example:
        >>> to_ldm_clip({"embeddings.token_embedding.weight": 0})
        {'cond_stage_model.transformer.text_model.embeddings.token_embedding.weight': 0}
    """
    return {prefix + (k if k.startswith("text_model.") else "text_model." + k): v for k, v in state.items()}


def to_open_clip(state: Mapping[str, Any], prefix: str = "conditioner.embedders.1.model.") -> dict:
    """A transformers CLIPTextModelWithProjection state dict in OpenCLIP's layout, as SDXL checkpoints store ViT-bigG
    (``text_projection`` transposed, q/k/v concatenated as ``attn.in_proj_*``), checked against diffusers'
    ``convert_open_clip_checkpoint``.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> encoder = make_pipeline("sdxl").text_encoder_2
        >>> sorted(to_open_clip(encoder.state_dict()))[:2]
        ['conditioner.embedders.1.model.ln_final.bias', 'conditioner.embedders.1.model.ln_final.weight']
    """
    import torch
    from diffusers.loaders.single_file_utils import DIFFUSERS_TO_LDM_MAPPING, convert_open_clip_checkpoint

    fixed = DIFFUSERS_TO_LDM_MAPPING["openclip"]["layers"]
    parts = {"self_attn.out_proj": "attn.out_proj", "layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc",
             "mlp.fc2": "mlp.c_proj"}
    out: dict[str, Any] = {}
    layer = "text_model.encoder.layers."
    for key, value in state.items():
        if key in fixed:
            out[prefix + fixed[key]] = value.T.contiguous() if key == "text_projection.weight" else value
        elif key.startswith(layer) and ".self_attn." in key and not key.split(".")[-2] == "out_proj":
            continue  # q, k, v: concatenated below
        elif key.startswith(layer):
            index, rest = key[len(layer):].split(".", 1)
            for old, new in parts.items():
                rest = rest.replace(old, new)
            out[f"{prefix}transformer.resblocks.{index}.{rest}"] = value
    layers = sorted({int(k[len(layer):].split(".")[0]) for k in state if k.startswith(layer)})
    for i in layers:
        for kind in ("weight", "bias"):
            qkv = [state[f"{layer}{i}.self_attn.{p}_proj.{kind}"] for p in "qkv"]
            out[f"{prefix}transformer.resblocks.{i}.attn.in_proj_{kind}"] = torch.cat(qkv)
    # the model is read only for the width when the file has no text_projection; this one has
    _same(convert_open_clip_checkpoint(None, out, prefix=prefix), state, "to_open_clip")
    return out


def sdxl_checkpoint(pipe: Any) -> dict:
    """An SDXL pipeline's UNet, VAE and both text encoders as one original whole checkpoint's state dict (the
    layout of Civitai's SDXL files and of stabilityai's ``sd_xl_base_1.0.safetensors``).

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> keys = sdxl_checkpoint(make_pipeline("sdxl"))
        >>> sorted({k.split(".")[0] for k in keys})
        ['conditioner', 'first_stage_model', 'model']
    """
    return {**to_ldm_unet(pipe.unet.state_dict(), pipe.unet.config, SDXL_PREFIXES["unet"]),
            **to_ldm_vae(pipe.vae.state_dict(), pipe.vae.config, SDXL_PREFIXES["vae"]),
            **to_ldm_clip(pipe.text_encoder.state_dict(), SDXL_PREFIXES["text_encoder"]),
            **to_open_clip(pipe.text_encoder_2.state_dict(), SDXL_PREFIXES["text_encoder_2"])}
