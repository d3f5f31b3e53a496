"""The video families as data, and the rules of a video pipeline read from its configs.

``FAMILIES`` holds one :class:`VideoFamily` row per diffusers video family: the pipeline class-name prefix it
matches, the defaults of its model card, the text length and classifier-free-guidance batch its denoiser sees, how
its VAE decodes. What one denoiser call gets is not here: the memory plan builds it from the denoiser class's row of
recipes/denoisers.yaml, as the training loss does. A pipeline without a row here gets ``other``'s defaults.

Everything else is read from the pipeline class and the component configs of ``model_index.json`` (no weights), so
the arguments are checked before anything is loaded. The rules are the ones the diffusers pipelines apply themselves:

* frames: the 3D VAEs compress time by a factor ``t`` and keep the first frame apart, so ``num_frames`` must be
  ``t*k + 1`` (diffusers ``pipeline_wan.py`` warns "num_frames - 1 has to be divisible by vae_scale_factor_temporal";
  ``pipeline_ltx.py`` computes ``(num_frames - 1) // vae_temporal_compression_ratio + 1`` latent frames; CogVideoX and
  HunyuanVideo do the same with their ``temporal_compression_ratio``, Mochi with its 6); SVD takes any count.
* size: height and width must be multiples of the VAE's spatial factor times the transformer's patch size
  (``pipeline_wan.py`` ``check_inputs``: "height and width have to be divisible by 16"; ``pipeline_ltx.py``: 32).

Components are found by role, never by name: the denoiser is the recipe's ``denoiser:`` (else the component whose
class diffusers keeps with the transformers and UNets, :func:`hf_precision.runtime.source.role_of`).
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from collections.abc import Mapping
from typing import Any

from ...errors import RecipeError
from ...memory.geometry import axis_value, vae_factors
from .limits import SizeLimits, size_limits

__all__ = ["FAMILIES", "VideoFamily", "VideoSpec", "family_of", "model_spec", "pipeline_recipe", "spec_of",
           "video_spec"]


@dataclasses.dataclass(frozen=True)
class VideoFamily:
    """One video family: what its pipelines share beyond their configs.

    What one denoiser call gets is the denoiser class's row of recipes/denoisers.yaml, the training loss's too
    (:func:`hf_precision.apps.video.plan.denoiser_call`). ``decode``: ``"video"`` (the VAE decodes the 5D latent
    at once) or ``"frames"`` (a 2D or temporal VAE decodes frames in chunks). ``decode_chunks``: the pipeline stops at the latents
    and the program decodes them ``--decode-chunk-size`` frames at a time, with the noise drawn here in the
    denoiser's compute dtype (SVD). ``vae_tiling``: ``"always"`` for a VAE that only decodes tiled.

    Example:
        >>> family_of("WanImageToVideoPipeline").name, family_of("MochiPipeline").cfg_batch
        ('wan', 2)
    """

    name: str
    prefix: str
    defaults: dict[str, int]
    text_length: int = 256
    text_prefix: int = 0             # template tokens the text encoder reads and the pipeline crops (HunyuanVideo)
    text_hidden_states: bool = False  # the pipeline reads an inner layer of the text encoder, so every layer's
                                      # output is kept (HunyuanVideo: hidden_states[-3])
    cfg_batch: int = 2
    image_encode: str = ""           # what vae.encode gets for an input image: "image", "frame", "clip" or "" (none)
    decode: str = "video"
    decode_chunk: int = 0            # frames the pipeline itself decodes at once ("frames" decode; 0: all)
    decode_chunks: bool = False
    forward_chunking: bool = False   # the memory plan may try the denoiser's feed-forward chunking
    vae_tiling: str = "optional"     # "optional", "always" (a VAE that only decodes tiled) or "never"
    frames_key: str = ""             # the denoiser config key holding the default frame count (SVD: num_frames)
    text_length_key: str = ""        # the denoiser config key fixing the text length (CogVideoX)
    call_options: tuple[str, ...] = ()  # program options passed to the pipeline call (SVD: fps, motion bucket, ...)
    size_multiple: int = 1           # sizes the program accepts: also multiples of this (SVD: 8, whatever its VAE)
    size_note: str = ""              # why sizes are multiples of 8 (SVD), in the size message

    def noise_shape(self, cfg: Mapping[str, Any], frames: int, height: int, width: int) -> tuple[int, ...]:
        """The latents the program draws for a ``decode_chunks`` family (SVD: half the UNet's input channels; the
        other half is the image latent the pipeline concatenates)."""
        return 1, frames, int(cfg["in_channels"]) // 2, height, width


# Defaults: the resolution and frame count each model card shows, steps from the diffusers docs examples. Wan 2.1:
# 480x832, 81 frames (Wan-AI/Wan2.1-T2V-1.3B-Diffusers model card); LTX-Video: 480x704, 161 frames
# (Lightricks/LTX-Video model card); CogVideoX: 480x720, 49 frames (THUDM/CogVideoX-2b model card); HunyuanVideo:
# 320x512, 61 frames (diffusers docs api/pipelines/hunyuan_video.md example); SVD: 576x1024, the UNet's num_frames;
# Mochi: pipeline_mochi.py's own 480x848, 19 frames, 64 steps; Allegro: 720x1280 and 100 steps (rhymes-ai/Allegro
# model card), 85 frames = the 22 latent frames its transformer was trained on (sample_frames); Latte: 512x512,
# 50 steps (pipeline_latte.py), frames fixed by the transformer (video_length).
# Text lengths the pipelines pad to: pipeline_wan.py max_sequence_length=512, pipeline_ltx.py 128,
# pipeline_cogvideox.py 226, pipeline_hunyuan_video.py 256 plus the template's crop_start 95, pipeline_mochi.py 256,
# pipeline_allegro.py 512, pipeline_latte.py 120. CFG batch: the batch the denoiser sees per call with guidance;
# Wan calls the transformer twice with batch 1 and HunyuanVideo embeds guidance (batch 1); the others concatenate the
# unconditional half.
FAMILIES: dict[str, VideoFamily] = {f.name: f for f in (
    VideoFamily("wan", "Wan", {"height": 480, "width": 832, "frames": 81, "steps": 50}, text_length=512,
                cfg_batch=1, image_encode="clip"),
    VideoFamily("ltx", "LTX", {"height": 480, "width": 704, "frames": 161, "steps": 50}, text_length=128,
                image_encode="frame"),
    VideoFamily("cogvideox", "CogVideoX", {"height": 480, "width": 720, "frames": 49, "steps": 50}, text_length=226,
                image_encode="frame", text_length_key="max_text_seq_length"),
    VideoFamily("hunyuan", "HunyuanVideo", {"height": 320, "width": 512, "frames": 61, "steps": 30},
                text_length=256, text_prefix=95, text_hidden_states=True, cfg_batch=1),
    VideoFamily("svd", "StableVideoDiffusion", {"height": 576, "width": 1024, "frames": 0, "steps": 25},
                image_encode="image", decode="frames", decode_chunks=True, forward_chunking=True, vae_tiling="never",
                frames_key="num_frames", call_options=("fps", "motion_bucket_id", "noise_aug_strength"),
                size_multiple=8, size_note="SVD's VAE works on 8x8 blocks"),
    VideoFamily("mochi", "Mochi", {"height": 480, "width": 848, "frames": 19, "steps": 64}),
    # AutoencoderKLAllegro refuses to decode untiled: "Decoding without tiling has not been implemented yet"
    # (diffusers v0.42.1 autoencoder_kl_allegro.py:841), so tiling is turned on whatever the settings say.
    VideoFamily("allegro", "Allegro", {"height": 720, "width": 1280, "frames": 85, "steps": 100}, text_length=512,
                vae_tiling="always"),
    # pipeline_latte.py decode_latents: a 2D VAE, 14 frames at a time
    VideoFamily("latte", "Latte", {"height": 512, "width": 512, "frames": 16, "steps": 50}, text_length=120,
                decode="frames", decode_chunk=14),
    VideoFamily("other", "", {"height": 480, "width": 832, "frames": 49, "steps": 30}),
)}


def family_of(pipeline: str) -> VideoFamily:
    """The row whose prefix starts the pipeline class name (``other`` when none does)."""
    return next((f for f in FAMILIES.values() if f.prefix and pipeline.startswith(f.prefix)), FAMILIES["other"])


@dataclasses.dataclass(frozen=True)
class VideoSpec:
    """The rules of one video pipeline class, derived from its configs.

    ``frame_step``: frames must be ``frame_step*k + 1`` (1: any count). ``size_multiple``: height and width must be
    multiples of it. ``takes_prompt``/``takes_image``: the modes the pipeline has. ``extra``: call kwargs the configs
    fix (CogVideoX's ``max_sequence_length`` is the transformer's ``max_text_seq_length``).
    """

    pipeline: str
    family: str
    denoiser: str
    takes_prompt: bool
    takes_image: bool
    frame_step: int
    size_multiple: int
    defaults: dict[str, int]
    extra: dict[str, Any]
    vae_tiling_required: bool = False
    frames_arg: str = "num_frames"
    fixed_frames: int = 0
    # Wan-style rotary tables (``rope_max_seq_len`` in the transformer config): each of latent frames, rows and
    # columns, in patches, must fit the table (transformer_wan.py WanRotaryPosEmbed.forward slices it); 0: no limit.
    max_positions: int = 0
    patch: int = 1             # the transformer's spatial patch (1 for a UNet)
    spatial: int = 1           # the VAE's spatial factor (the size check may ask more: SVD 8)
    # every bound the configs put on the size and frames (position tables), :mod:`.limits`
    limits: SizeLimits = SizeLimits()
    # the clips the call needs as input (video-to-video: CogVideoX V2V's ``video``; Wan Animate's pose and face)
    input_clips: tuple[str, ...] = ()
    # an image the pipeline takes but documents as optional (LTX condition: text-to-video without it)
    image_optional: bool = False

    @property
    def row(self) -> VideoFamily:
        """The family's row in :data:`FAMILIES`."""
        return FAMILIES[self.family]

    @property
    def mode(self) -> str:
        if self.input_clips:
            return "video-to-video"
        return "+".join(m for m, on in (("text", self.takes_prompt), ("image", self.takes_image)) if on) + "-to-video"

    def check(self, *, height: int, width: int, frames: int) -> list[str]:
        """The problems of a size and frame count for this pipeline (empty when they fit), each with the fix."""
        problems = []
        m = math.lcm(self.size_multiple, self.row.size_multiple)
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % m:
                near = max(m, round(value / m) * m)
                if self.row.size_note:
                    problems.append(f"--{name} {value}: must be a positive multiple of {m} ({self.row.size_note}; "
                                    f"e.g. {near})")
                    continue
                problems.append(f"--{name} {value}: {self.pipeline} needs a positive multiple of {m} (VAE spatial "
                                f"factor x transformer patch size, from the configs); e.g. --{name} {near}")
        if self.fixed_frames:  # one count only: the limits below say which
            pass
        elif frames < 1:
            problems.append(f"--frames {frames}: must be at least 1")
        elif self.frame_step > 1 and (frames - 1) % self.frame_step:
            k = max(0, round((frames - 1) / self.frame_step))
            problems.append(f"--frames {frames}: {self.pipeline}'s VAE compresses time by {self.frame_step} and keeps "
                            f"the first frame, so frames must be {self.frame_step}*k+1; e.g. --frames "
                            f"{self.frame_step * k + 1} or {self.frame_step * (k + 1) + 1}")
        # past the position tables' bounds (read once from the configs: .limits); torch fails mid-run otherwise
        return problems or self.limits.problems(self.pipeline, height=height, width=width, frames=frames)

    def required(self, settings: Any) -> Any:
        """``settings`` (a ``MemorySettings``) with what this family cannot run without: VAE tiling for a VAE that
        only decodes tiled (Allegro). The same object when nothing is missing."""
        if self.vae_tiling_required and not settings.vae_tiling:
            return dataclasses.replace(settings, vae_tiling=True)
        return settings

    def latent_shape(self, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """(frames, height, width) of the latent the denoiser sees, before patching.

        Example:
            >>> idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "WanTransformer3DModel"]}
            >>> spec = video_spec("WanPipeline", idx, {"transformer": {"patch_size": [1, 2, 2]}})
            >>> spec.latent_shape(480, 832, 81)
            (21, 60, 104)
        """
        spatial = self.spatial
        return (frames - 1) // self.frame_step + 1 if self.frame_step > 1 else frames, height // spatial, width // spatial

    def text_length(self) -> int:
        """Prompt tokens the denoiser sees: ``--max-sequence-length`` or the config's, else the family's."""
        fixed = self.extra.get("max_sequence_length")
        return int(fixed) if fixed else self.row.text_length


def _init_default(spec: Any, name: str) -> Any:
    """The default of ``name`` in the ``__init__`` of the diffusers class ``spec`` = [library, class] names."""
    import diffusers

    cls = getattr(diffusers, str((spec or [None, ""])[1]), None)
    param = inspect.signature(cls.__init__).parameters.get(name) if cls is not None else None
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def video_spec(pipeline: str, index: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]]) -> VideoSpec:
    """The rules of a video pipeline from ``model_index.json`` and the component configs.

    Raises:
        RecipeError: the class is not a diffusers video pipeline (its ``__call__`` takes no ``num_frames``, or
            ``video_length`` as Latte's does).

    Example:
        >>> idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "WanTransformer3DModel"]}
        >>> s = video_spec("WanPipeline", idx, {"vae": {"temperal_downsample": [False, True, True]},
        ...                                     "transformer": {"patch_size": [1, 2, 2]}})
        >>> s.mode, s.frame_step, s.size_multiple, s.check(height=480, width=832, frames=80)[0][:12]
        ('text-to-video', 4, 16, '--frames 80:')
    """
    import diffusers

    cls = getattr(diffusers, pipeline, None)
    params = inspect.signature(cls.__call__).parameters if cls is not None else {}
    from ...diagnose.call import call_inputs

    frames_arg = next((a for a in ("num_frames", "video_length") if a in params), None)  # Latte: video_length
    # video-to-video: the frames come from the input clips
    clips = tuple(a for a in call_inputs(cls) if a == "video" or a.endswith("_video"))
    if frames_arg is None and not clips:
        raise RecipeError(f"model_index.json names {pipeline}, which is not a diffusers video pipeline (its __call__ "
                          f"takes no num_frames or video_length); pass a video model folder: Wan, LTX-Video, CogVideoX, HunyuanVideo "
                          f"or Stable Video Diffusion")
    row = family_of(pipeline)
    denoiser = _denoiser(pipeline, index)
    vae_cls = str((index.get("vae") or [None, ""])[1])
    spatial, temporal = vae_factors(vae_cls, configs.get("vae", {}))
    den = configs.get(denoiser, {})
    patch = axis_value(den.get("patch_size", 1))
    extra: dict[str, Any] = {}
    if row.text_length_key and den.get(row.text_length_key):
        extra["max_sequence_length"] = int(den[row.text_length_key])  # the pos-embedding length it was built for
    defaults = dict(row.defaults)
    if row.frames_key:
        defaults["frames"] = int(den.get(row.frames_key, 14))
    positions = int(den.get("rope_max_seq_len") or _init_default(index.get(denoiser), "rope_max_seq_len") or 0)
    limits = size_limits(index, configs, denoiser, spatial=spatial, temporal=temporal, patch=patch,
                         init_default=_init_default)
    fixed = limits.fixed_frames  # Latte's video_length (a config may leave it at the class default)
    # a model card's size the position tables cannot place (a small test model): the largest they can; the one
    # frame count a fixed table takes
    defaults["height"], defaults["width"], defaults["frames"] = limits.cap(
        height=defaults["height"], width=defaults["width"], frames=defaults["frames"])
    return VideoSpec(pipeline=pipeline, family=row.name, denoiser=denoiser, takes_prompt="prompt" in params,
                     takes_image="image" in params, frame_step=temporal if temporal > 1 else 1,
                     size_multiple=spatial * patch, defaults=defaults, extra=extra,
                     vae_tiling_required=row.vae_tiling == "always", frames_arg=frames_arg or "num_frames",
                     fixed_frames=fixed,
                     max_positions=positions, patch=patch, spatial=spatial, limits=limits, input_clips=clips,
                     image_optional="image" in params and "image" not in call_inputs(cls))


def pipeline_recipe(pipeline: str, index: Mapping[str, Any]) -> Any:
    """The recipe ``load_pipeline`` uses for a video pipeline: the shipped one for its class, else the composed one.

    Example:
        >>> from hf_precision.runtime.source import configs_of
        >>> pipeline_recipe("StableVideoDiffusionPipeline", configs_of("svd")[1])
        'svd'
    """
    from ...recipe.catalog import recipe_for
    from ...runtime.source import models_of_index

    return recipe_for(pipeline, lambda: models_of_index(index))  # the one load_pipeline composes (runtime/load.py)


def _denoiser(pipeline: str, index: Mapping[str, Any]) -> str:
    """The recipe's ``denoiser:``, else the first component whose role is ``denoiser``."""
    from ...recipe.catalog import pipeline_spec
    from ...runtime.source import models_of_index

    models = models_of_index(index)
    recipe = pipeline_recipe(pipeline, index)
    named = (pipeline_spec(recipe) if isinstance(recipe, str) else recipe).get("denoiser")
    if named in models:
        return str(named)
    found = sorted(name for name, (_, role) in models.items() if role == "denoiser")
    if not found:
        raise RecipeError(f"model_index.json of {pipeline} lists no denoiser (a transformer or UNet diffusers "
                          f"model); pass a complete video model folder")
    return found[0]


def model_spec(model: str, configs_only: bool = False) -> tuple[str, VideoSpec]:
    """Where a video model is and its :class:`VideoSpec` (mode, frame and size rules), read from ``model_index.json``
    and the component configs; nothing is loaded.

    With ``configs_only`` (``--plan``) the configs shipped in ``hf_precision/model_configs`` also count (``svd``,
    ``stabilityai/stable-video-diffusion-img2vid-xt``), as for :func:`hf_precision.plan`.

    Raises:
        RecipeError: no such model, or not a video pipeline.

    Example:
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> spec.family, spec.denoiser, spec.mode
        ('svd', 'unet', 'image-to-video')
    """
    from ...runtime.source import component_configs, configs_of, locate

    if configs_only:
        where = model
        _, index, configs = configs_of(model)
    else:
        where, index, folder = locate(model)
        configs = component_configs(where, index, folder)
    try:
        spec = video_spec(str(index.get("_class_name")), index, configs)
    except RecipeError as err:
        raise RecipeError(f"--model {model}: {err}") from None
    return where, spec


def spec_of(pipe: Any) -> VideoSpec:
    """The :class:`VideoSpec` of a built pipeline, from its components' configs.

    Example:
        >>> from hf_precision.testing.pipelines import make_svd
        >>> spec_of(make_svd()).frames_arg
        'num_frames'
    """
    index = {name: list(value) for name, value in pipe.config.items()
             if not name.startswith("_") and isinstance(value, (list, tuple))}
    configs = {name: dict(module.config) for name, module in pipe.components.items()
               if isinstance(getattr(module, "config", None), Mapping)}
    return video_spec(type(pipe).__name__, index, configs)
