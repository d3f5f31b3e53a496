"""How each denoiser family is called: one row per model class, read from recipes/denoisers.yaml.

A row (its fields: the YAML's header) follows the family's diffusers pipeline, cited per row, so a training step
and the video memory plan (:func:`call_inputs`, on the meta device) feed the denoiser what sampling feeds it. The
noise objective comes from the scheduler config (:func:`hf_precision.training.objectives.objective_of`), not the row.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import torch

from ..errors import Problems
from ..recipe.calls import read_denoisers
from ..recipe.schema import did_you_mean
from . import image_embeds, inputs
# the conditioning channels' functions live in .conditions; they stay readable here, where the rows are
from .conditions import (built_keys, check_built, condition_channels, condition_made, condition_of, latent_channels,
                         named_condition, with_condition_latents)
from .objectives import draw
from .inputs.registry import config_value
from .rules import TrainingError

__all__ = ["DenoiserRow", "ROWS", "add_rows", "row_of", "no_row", "condition_channels", "condition_of",
           "condition_made", "built_keys", "check_built", "noisy_inputs", "call_inputs", "example_batch", "model_output", "config_value",
           "text_length"]

TOKENS = ("flux", "ltx")  # packings that turn latents into a token sequence (the target is packed the same way)
PACKED = (*TOKENS, "patch")  # packings whose target is packed as the latents are (patch: 2x2 patches into channels)


@dataclasses.dataclass(frozen=True)
class DenoiserRow:
    """One denoiser family: a row of recipes/denoisers.yaml (its header says what each field means)."""

    latent_arg: str
    source: str
    cond: Mapping[str, str] = dataclasses.field(default_factory=dict)
    encode: tuple[str | None, ...] = ()
    text_dims: Mapping[str, str] = dataclasses.field(default_factory=dict)
    layout: str = "image"
    pack: str | None = None
    timestep_scale: float = 1000.0
    extras: tuple[str, ...] = ()
    guidance_scale: float = 1.0
    timestep_arg: str = "timestep"
    flip: bool = False
    discrete_scale: float | None = None
    optional: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)
    text_len: Mapping[str, str | int] = dataclasses.field(default_factory=dict)
    encode_more: tuple[tuple[Mapping[str, Any], tuple[str | None, ...]], ...] = ()
    per_frame: tuple[str, ...] = ()
    timestep_in_weights_dtype: bool = False
    reference: bool = False
    negate: bool = False
    batch_axis: Mapping[str, int] = dataclasses.field(default_factory=dict)
    text_layers: Mapping[str, str] = dataclasses.field(default_factory=dict)
    train_config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    condition: Mapping[str, str] = dataclasses.field(default_factory=dict)
    clean_first_frame: bool = False
    prefix_frame: str | None = None
    image_encode: Mapping[str, tuple[str, str]] = dataclasses.field(default_factory=dict)


def _rows(path: str | None = None) -> dict[str, DenoiserRow]:
    rows = read_denoisers(inputs.BUILDERS, path)
    # a row's condition names a registered condition builder (the names are code, so checked here, not in recipe/)
    problems, known = Problems(str(path or "recipes/denoisers.yaml")), sorted(inputs.CONDITIONS)
    for cls, row in rows.items():
        for pipeline, name in (row.get("condition") or {}).items():
            if name not in inputs.CONDITIONS:
                problems.add(f"denoisers.{cls}.condition.{pipeline}", f"no registered condition builder {name!r}; "
                             f"allowed: {', '.join(known)}{did_you_mean(name, known)} (a new one: "
                             f"@hf_precision.training.inputs.condition({name!r}))")
    problems.raise_if_any()
    return {cls: DenoiserRow(**row) for cls, row in rows.items()}


ROWS: dict[str, DenoiserRow] = _rows()


def add_rows(path: str) -> list[str]:
    """Add (or replace) rows from a user's denoisers YAML file (the shape of recipes/denoisers.yaml, checked the same
    way); returns the model classes it gives. A new family is a row, plus at most one registered builder.

    Example:
        >>> import tempfile, pathlib
        >>> path = pathlib.Path(tempfile.mkdtemp()) / "mine.yaml"
        >>> _ = path.write_text("schema: 1\\nkind: denoisers\\ndenoisers:\\n  MyDiT: {latent_arg: hidden_states, "
        ...                     "source: pipeline_my.py}\\n")
        >>> add_rows(str(path)), ROWS.pop("MyDiT").latent_arg
        (['MyDiT'], 'hidden_states')
    """
    rows = _rows(path)
    ROWS.update(rows)
    return list(rows)


def row_of(module: torch.nn.Module, component: str = "the denoiser") -> DenoiserRow:
    """The row for a denoiser, by its class (or a base class); a ``TrainingError`` names the classes known.

    Example:
        >>> from diffusers import SD3Transformer2DModel
        >>> row_of(SD3Transformer2DModel(sample_size=8, num_layers=1, attention_head_dim=8, num_attention_heads=1,
        ...     joint_attention_dim=8, caption_projection_dim=8, pooled_projection_dim=8, out_channels=4)).pack is None
        True
    """
    module = getattr(module, "_orig_mod", module)  # torch.compile(module) wraps it in an OptimizedModule
    for cls in type(module).__mro__:
        if cls.__name__ in ROWS:
            return ROWS[cls.__name__]
    raise no_row(module, component)


def no_row(module: torch.nn.Module, component: str = "the denoiser") -> TrainingError:
    """The error of ``tp.loss`` for a denoiser class without a row: what to do instead (the dtype plan holds either way).

    Example:
        >>> print(no_row(torch.nn.Linear(2, 2), "unet"))  # doctest: +ELLIPSIS
        Linear (unet): no training row for this denoiser class, so tp.loss() cannot build its call...
    """
    name = type(getattr(module, "_orig_mod", module)).__name__
    comp = component if component != "the denoiser" else "<denoiser>"
    return TrainingError(
        f"{name} ({component}): no training row for this denoiser class, so tp.loss() cannot build its call. The "
        f"dtype plan still holds (storage, compute, fp32 masters, boundary hooks: print(tp)); pass the denoiser its "
        f"inputs yourself: `with tp.autocast(): pred = tp.components[{comp!r}](noisy_latents, timestep, ...)`, "
        f"`loss = torch.nn.functional.mse_loss(pred.float(), target)`, then tp.backward(loss) and tp.step(optimizer); "
        f"or add a row for it in a denoisers YAML file (the shape of recipes/denoisers.yaml) and load it with "
        f"hf_precision.training.denoiser_rows.add_rows(path) (known: {', '.join(sorted(ROWS))})")


def noisy_inputs(row: DenoiserRow, module: torch.nn.Module, batch: Mapping[str, Any], objective: str,
                 alphas_cumprod: torch.Tensor | None, generator: torch.Generator | None = None,
                 sigmas: tuple[float, float] | None = None, pipe: Any = None) -> tuple[dict[str, Any], torch.Tensor]:
    """The denoiser's keyword arguments for one training step, and the target its output is compared with.

    ``sigmas``: an ``edm`` objective's (min, max) noise level; the batch may fix ``noise``, ``sigmas`` or
    ``timesteps``. ``pipe`` (``tp.loss`` passes it) refuses a batch without what its condition builder makes
    (:func:`check_built`). A ``prefix_frame`` row (FramePack) noises and predicts the frames after the first.
    """
    if "latents" not in batch:
        raise TrainingError(f"tp.loss(batch): the batch has no 'latents' (keys: {sorted(batch)}); give VAE latents, "
                            f"already scaled (tp.encode_images(pixels) makes them)")
    x0 = inputs.model_layout(row, batch["latents"]).float()
    x0 = _after_prefix(row, module, x0) if row.prefix_frame else x0
    b = x0.shape[0]
    if "condition_latents" not in batch and condition_channels(row, module) and \
            named_condition(row, pipe) not in inputs.ZEROS:  # HunyuanVideo 1.5 T2V: its pipeline's zeros
        missing = condition_channels(row, module)
        raise TrainingError(f"tp.loss(batch): {type(getattr(module, '_orig_mod', module)).__name__} takes {missing} "
                            f"conditioning channels beyond the latents (a mask and masked image, an image-to-video "
                            f"model's first frame) and the batch has no 'condition_latents'; add what the pipeline "
                            f"builds from the sample: batch.update(tp.encode_condition(pixels, batch['latents'])) (zeros "
                            f"only where the pipeline itself gives zeros: condition dropout, its unconditional input; "
                            f"ask for them with batch['condition_latents'] = None)")
    image_embeds.check_batch(row, module, batch)
    if pipe is not None:
        check_built(row, module, pipe, batch)
    _train_config(row, module)
    drawn = {}
    if "noise" not in batch or not {"sigmas", "timesteps"} & set(batch):
        drawn = draw(objective, x0.shape, alphas_cumprod=alphas_cumprod, sigmas=sigmas, generator=generator,
                     device=x0.device)
    # a given noise is in the latents' (VAE) layout; a drawn one in the denoiser's
    noise = inputs.model_layout(row, batch["noise"]).to(x0) if "noise" in batch else drawn["noise"]
    noise = _after_prefix(row, module, noise) if noise.shape != x0.shape and row.prefix_frame else noise
    given = {**drawn, **batch}
    if objective == "flow":
        sigma = given["sigmas"]
        if sigmas is not None and "sigmas" in batch and not bool(((sigma >= sigmas[0]) & (sigma <= sigmas[1])).all()):
            raise TrainingError(f"tp.loss(batch): batch['sigmas'] {sigma.flatten().tolist()} leave the trained "
                                f"denoiser's noise levels [{sigmas[0]:g}, {sigmas[1]:g}] (a Wan 2.2 expert's: the other "
                                f"expert owns the rest); draw them there, or leave them out and tp.loss draws them")
        s = sigma.float().view(b, *[1] * (x0.dim() - 1))
        noisy, target = (1 - s) * x0 + s * noise, noise - x0
        timestep = (1 - sigma.float() if row.flip else sigma.float()) * row.timestep_scale
        target = -target if row.flip else target
        target = -target if row.negate else target  # the pipeline steps with minus the denoiser's output (HiDream)
    elif objective == "edm":
        sigma = given["sigmas"].float().to(x0.device).reshape(-1)
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
        t = given["timesteps"]
        a = alphas_cumprod.to(x0.device)[t.long()].view(b, *[1] * (x0.dim() - 1))
        noisy = a.sqrt() * x0 + (1 - a).sqrt() * noise
        target = noise if objective == "epsilon" else a.sqrt() * noise - (1 - a).sqrt() * x0
        timestep = t if row.discrete_scale is None else t.float() * row.discrete_scale
    if row.clean_first_frame and condition_channels(row, module):
        noisy, target = _clean_first_frame(row, noisy, target, x0)
    elif batch.get("first_frame_latents") is not None:  # HunyuanVideo I2V token_replace: the image's own latents
        noisy, target = _clean_first_frame(row, noisy, target, inputs.model_layout(row, batch["first_frame_latents"]))
    return call_inputs(row, module, batch, noisy, timestep, x0), _pack(row, target) if row.pack in PACKED else target


def _frame_dim(row: DenoiserRow) -> int:
    return 2 if row.layout == "video" else 1  # frames_first (B,F,C,H,W) and channels_last (B,F,H,W,C): axis 1


def _clean_first_frame(row: DenoiserRow, noisy: torch.Tensor, target: torch.Tensor,
                       x0: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    # Kandinsky 5 I2V: the first latent frame is the image's clean latents, never stepped (pipeline_kandinsky_i2v.py:710
    # latents[:, 0:1] = image_latents; :986 steps latents[:, 1:]): it goes in clean (``x0``'s, or HunyuanVideo I2V's
    # image latents) and only the other frames are compared.
    dim = _frame_dim(row)
    noisy = torch.cat([x0.narrow(dim, 0, 1).to(noisy), noisy.narrow(dim, 1, noisy.shape[dim] - 1)], dim=dim)
    return noisy, target.narrow(dim, 1, target.shape[dim] - 1)


def _after_prefix(row: DenoiserRow, module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    # FramePack: the first latent frame is the image its pipeline gives clean beside the stepped frames
    # (pipeline_hunyuan_video_framepack.py:889-895 latents_clean = [image_latents, 1x history]; decoded as
    # [image_latents, the stepped window], :1016-1017): in the loss it would be a target sampling never steps.
    dim = _frame_dim(row)
    if x.shape[dim] < 2:
        name = type(getattr(module, "_orig_mod", module)).__name__
        raise TrainingError(f"tp.loss(batch): {name} denoises the latent frames after a clip's first, which its "
                            f"pipeline gives it clean as {row.prefix_frame}, and the batch's latents have "
                            f"{x.shape[dim]} frame; train on clips of at least 2 latent frames (k * the VAE's time "
                            f"factor + 1 frames, k >= 1: 5 or more for HunyuanVideo's VAE)")
    return x.narrow(dim, 1, x.shape[dim] - 1)


def _train_config(row: DenoiserRow, module: torch.nn.Module) -> None:
    # config values a training step needs (HiDream in train mode returns its output patchified, (B, C, H*W/4, 4),
    # unless force_inference_output: diffusers' train_dreambooth_lora_hidream.py sets it)
    module = getattr(module, "_orig_mod", module)
    wrong = {k: v for k, v in row.train_config.items() if getattr(module, "config", {}).get(k) != v}
    if wrong:
        module.register_to_config(**wrong)


def call_inputs(row: DenoiserRow, module: torch.nn.Module, batch: Mapping[str, Any], noisy: torch.Tensor | None = None,
                timestep: torch.Tensor | None = None, x0: torch.Tensor | None = None) -> dict[str, Any]:
    """The denoiser's keyword arguments for ``noisy`` latents (its layout, before packing; default the batch's) at
    ``timestep`` (default zeros): the training step's call and the video memory plan's.

    Example:
        >>> from diffusers import SD3Transformer2DModel
        >>> m = SD3Transformer2DModel(sample_size=8, num_layers=1, attention_head_dim=8, num_attention_heads=1,
        ...     joint_attention_dim=8, caption_projection_dim=8, pooled_projection_dim=6, in_channels=4, out_channels=4)
        >>> sorted(call_inputs(row_of(m), m, example_batch(m, device="meta")))
        ['encoder_hidden_states', 'hidden_states', 'pooled_projections', 'timestep']
    """
    if noisy is None:
        noisy = inputs.model_layout(row, batch["latents"])
    x0 = noisy if x0 is None else x0
    if timestep is None:
        timestep = torch.zeros(noisy.shape[0], device=noisy.device)
    noisy = with_condition_latents(row, module, noisy, batch)
    patch = getattr(getattr(module, "_orig_mod", module), "config", {}).get("patch_size")
    if noisy.dim() == 4 and isinstance(patch, (list, tuple)) and len(patch) == 3:
        # a denoiser patching (frame, height, width) takes an image as one latent frame (HunyuanImage Refiner,
        # pipeline_hunyuanimage_refiner.py:350; transformer_hunyuanimage.py:789-796); model_output drops it again
        noisy = noisy.unsqueeze(2)
    if row.pack:
        noisy = _pack(row, noisy)
    if row.reference and row.pack in TOKENS:  # Flux Kontext, Qwen-Image Edit: reference tokens after the latents'
        noisy = torch.cat([noisy, *(_pack(row, r).to(noisy) for r in inputs.reference_latents(row, batch))], dim=1)
    if row.timestep_in_weights_dtype:
        timestep = timestep.to(inputs.frozen_dtype(module))
    kwargs: dict[str, Any] = {row.latent_arg: noisy, row.timestep_arg: timestep}
    for key, arg in row.cond.items():
        if batch.get(key) is not None:  # held batch-first; the denoiser takes it with its batch on batch_axis
            kwargs[arg] = batch[key].movedim(0, row.batch_axis[key]) if key in row.batch_axis else batch[key]
    kwargs.update(inputs.optional_inputs(row, module, batch, x0))
    for arg in row.per_frame:
        if kwargs.get(arg) is not None:
            kwargs[arg] = kwargs[arg].repeat_interleave(x0.shape[2], dim=0)
    if row.extras:  # a builder may read the step's timestep (a MeanFlow model's r = t: inputs/meanflow_r.py)
        stepped = {**batch, "timestep": timestep}
        for extra in row.extras:
            kwargs.update(inputs.BUILDERS[extra](row, module, stepped, x0))
    return kwargs


def model_output(out: Any, target: torch.Tensor, row: DenoiserRow) -> torch.Tensor:
    """The prediction in ``out`` comparable with ``target`` (PixArt's learned-sigma half is dropped)."""
    pred = out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)
    if row.pack == "list":  # one (C, 1, H, W) per sample, the frame axis the pipeline added (pipeline_z_image.py)
        pred = torch.stack(list(pred)).squeeze(2)
    if row.pack in TOKENS and pred.shape[1] > target.shape[1]:  # the reference tokens' output is not predicted
        pred = pred[:, :target.shape[1]]
    if row.layout != "image" and row.pack is None and pred.dim() == target.dim() and \
            pred.shape[_frame_dim(row)] == target.shape[_frame_dim(row)] + 1:  # the clean first frame is not predicted
        pred = pred.narrow(_frame_dim(row), 1, target.shape[_frame_dim(row)])
    if pred.dim() == target.dim() + 1 and row.pack is None and pred.shape[2] == 1:  # the frame call_inputs added
        pred = pred.squeeze(2)
    dim = -1 if row.pack in TOKENS else inputs.channel_dim(row)
    if pred.shape != target.shape and pred.shape[dim] == 2 * target.shape[dim]:
        pred = pred.chunk(2, dim=dim)[0]
    return pred


def _pack(row: DenoiserRow, x: torch.Tensor) -> Any:
    if row.pack == "list":  # pipeline_z_image.py: latents.unsqueeze(2).unbind(0), a list of (C, 1, H, W)
        return list(x.unsqueeze(2).unbind(0))
    if row.pack == "patch":  # pipeline_ernie_image.py _patchify_latents: 2x2 patches become channels
        b, c, h, w = x.shape
        return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 1, 3, 5, 2, 4).reshape(b, c * 4, h // 2, w // 2)
    if row.pack == "flux":  # pipeline_flux.py _pack_latents: 2x2 patches become tokens
        b, c, h, w = x.shape
        return x.view(b, c, h // 2, 2, w // 2, 2).permute(0, 2, 4, 1, 3, 5).reshape(b, (h // 2) * (w // 2), c * 4)
    b, c, f, h, w = x.shape  # pipeline_ltx.py _pack_latents with patch sizes 1
    return x.reshape(b, c, f * h * w).transpose(1, 2)


def text_length(row: DenoiserRow, config: Mapping[str, Any], key: str) -> int | None:
    """The tokens the denoiser was built to take under conditioning ``key``: its row's ``text_len``, a number or a
    config key (CogVideoX pads the prompt to ``max_text_seq_length``, HunyuanDiT to ``text_len`` / ``text_len_t5``:
    their position or padding tables); None where the row fixes none.

    Example:
        >>> row = DenoiserRow("hidden_states", "", text_len={"prompt_embeds": "max_text_seq_length", "image_embeds": 257})
        >>> [text_length(row, {"max_text_seq_length": 226}, k) for k in ("prompt_embeds", "image_embeds", "x")]
        [226, 257, None]
    """
    length = row.text_len.get(key)
    if isinstance(length, int):
        return length
    value = config.get(length) if length else None
    return int(value) if value else None


def example_batch(module: torch.nn.Module, batch_size: int = 1, *, side: int = 8, frames: int = 2, tokens: int = 4,
                  seed: int = 0, latent: tuple[int, ...] | None = None, device: Any = None) -> dict[str, torch.Tensor]:
    """A small random batch shaped for ``module`` from its config: latents (VAE layout) and conditioning; ``latent``:
    the latents' ([frames,] height, width) as they are, not fitted; ``device="meta"``: shapes only.

    Example:
        >>> from diffusers import SD3Transformer2DModel
        >>> m = SD3Transformer2DModel(sample_size=8, num_layers=1, attention_head_dim=8, num_attention_heads=1,
        ...     joint_attention_dim=8, caption_projection_dim=8, pooled_projection_dim=6, in_channels=4, out_channels=4)
        >>> {k: tuple(v.shape) for k, v in example_batch(m).items()}
        {'latents': (1, 4, 8, 8), 'prompt_embeds': (1, 4, 8), 'pooled_prompt_embeds': (1, 6)}
    """
    row = row_of(module)
    config = module.config
    gen = torch.Generator().manual_seed(seed)
    device = torch.device(device or "cpu")

    def randn(*shape: int) -> torch.Tensor:  # meta: shapes only, nothing drawn
        return torch.empty(shape, device=device) if device.type == "meta" else torch.randn(*shape, generator=gen).to(device)

    channels = latent_channels(row, config)
    if latent is None:
        latent = inputs.registry.fitted_latent(row, config, side, frames)
    batch = {"latents": randn(batch_size, channels, *latent)}
    if condition_channels(row, module):  # a mask and masked image, a first frame: random stand-ins of their shape
        batch["condition_latents"] = randn(batch_size, condition_channels(row, module), *latent)
    for key, dim_key in row.text_dims.items():
        dim = config_value(config, dim_key)
        if dim is None:  # a part this configuration lacks (no pooled projection; Cascade's decoder has no clip_text)
            continue
        if config.get("addition_embed_type") == "text_time" and key == "prompt_embeds":
            pooled = int(config["projection_class_embeddings_input_dim"]) - 6 * int(config["addition_time_embed_dim"])
            batch["pooled_prompt_embeds"] = randn(batch_size, pooled)
        # CogVideoX pads the prompt to max_text_seq_length, HunyuanDiT to text_len / text_len_t5 (its padding table)
        # else the prompt, one token for an image embedding (SVD)
        length = text_length(row, config, key) or (1 if key == "image_embeds" else tokens)
        shape = (batch_size, int(dim)) if key == "pooled_prompt_embeds" else (batch_size, length, int(dim))
        layers = config.get(row.text_layers[key]) if key in row.text_layers else None
        if isinstance(layers, int):  # that many hidden states stacked per token (Krea 2's num_text_layers)
            shape = (*shape[:2], layers, shape[2])
        elif layers is not None:  # one hidden state per layer the denoiser indexes (HiDream's llama_layers)
            shape = (batch_size, max(layers) + 1, *shape[1:])
        batch[key] = randn(*shape)
    width = image_embeds.image_width(row, module) if row.image_encode else None
    if width and image_embeds.IMAGE_KEY not in batch:  # FramePack's optional SigLIP states: a stand-in token
        batch[image_embeds.IMAGE_KEY] = randn(batch_size, 1, width)
    if row.prefix_frame and row.prefix_frame not in batch:  # FramePack's image latents: one clean latent frame
        batch[row.prefix_frame] = randn(batch_size, channels, 1, *latent[-2:])
    built = row.optional.values() if row.condition and not condition_channels(row, module) else ()
    for key, shape in built:  # what a condition builder makes (I2VGen-XL's image latents, embedding): tp.loss wants it
        dim = config_value(config, shape.partition("@")[2]) if "@" in shape else channels
        if key not in batch and dim:
            batch[key] = randn(batch_size, 1, int(dim)) if shape.startswith("token") else randn(batch_size, int(dim), *latent)
    for key in row.cond:
        embeds = batch.get(key.replace("attention_mask", "embeds"))
        if key.startswith("prompt_attention_mask") and embeds is not None:
            batch[key] = torch.ones(batch_size, embeds.shape[1], dtype=torch.long, device=embeds.device)
    return batch
