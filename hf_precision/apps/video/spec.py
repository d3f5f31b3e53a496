"""The rules of a video pipeline: what its recipe's ``video:`` block says, and what its configs say.

A video recipe (recipes/wan.yaml, svd.yaml ...) holds the sampling facts its pipelines share beyond their configs,
cited there (:class:`VideoRow`); a recipe without one, or a composed one, gets devices.yaml's ``video:`` defaults.
What one denoiser call gets is recipes/denoisers.yaml's, built by the memory plan. The rest is read from the
pipeline class and the component configs (no weights), so arguments are checked before loading, by the rules the
pipelines apply themselves:

* frames: 3D VAEs compress time by ``t`` and keep the first frame apart, so ``num_frames`` is ``t*k + 1``
  (``pipeline_wan.py``: "num_frames - 1 has to be divisible by vae_scale_factor_temporal"; ``pipeline_ltx.py``,
  CogVideoX, HunyuanVideo and Mochi alike); SVD takes any count.
* size: a multiple of the VAE's spatial factor times the patch size (``pipeline_wan.py`` ``check_inputs``: 16;
  ``pipeline_ltx.py``: 32).

Components are found by role, never by name (:func:`hf_precision.runtime.source.role_of`).
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

__all__ = ["VideoRow", "VideoSpec", "model_spec", "pipeline_recipe", "spec_of", "video_row", "video_spec"]


@dataclasses.dataclass(frozen=True)
class VideoRow:
    """A recipe's ``video:`` block over devices.yaml's (the keys are described there). ``name``: the recipe's, or
    ``other`` for a recipe without a block (devices.yaml's alone).

    Example:
        >>> video_row("wan").cfg_batch, video_row("mochi").cfg_batch, video_row("sd15").name
        (1, 2, 'other')
    """

    name: str
    defaults: Mapping[str, int]
    text_length: int
    text_prefix: int
    text_hidden_states: bool
    cfg_batch: int
    image_encode: str | None
    decode: str
    decode_chunk: int
    decode_chunks: bool
    forward_chunking: bool
    vae_tiling: str
    frames_key: str | None
    text_length_key: str | None
    call_options: tuple[str, ...]
    size_multiple: int
    size_note: str
    call_frames: int
    call_frames_note: str
    negative_prompt: str | None
    refused_latent_frames: tuple[int, ...] = ()
    refused_frames_note: str = ""
    call_max_frames: int = 0
    call_max_frames_note: str = ""
    default_call_args: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    first_frame_edit: bool = False
    unfed_inputs: str = ""

    def noise_shape(self, cfg: Mapping[str, Any], frames: int, height: int, width: int) -> tuple[int, ...]:
        """The latents the program draws for a ``decode_chunks`` pipeline (SVD: half the UNet's input channels; the
        other half is the image latent the pipeline concatenates)."""
        return 1, frames, int(cfg["in_channels"]) // 2, height, width


def video_row(recipe: str | Mapping[str, Any], pipeline: str | None = None) -> VideoRow:
    """The :class:`VideoRow` of a recipe (a shipped name, a YAML path or a composed recipe's data): its ``video:`` block
    over devices.yaml's (``other`` without one), the ``classes:`` entry for ``pipeline`` over the rest.

    Example:
        >>> i2v = video_row("kandinsky5", "Kandinsky5I2VPipeline")
        >>> i2v.refused_latent_frames, video_row("kandinsky5").refused_latent_frames
        ((1, 2, 3, 4), ())
    """
    from ...recipe.catalog import pipeline_spec
    from ...recipe.devices import video_defaults
    from ...recipe.schema import video_block

    data = pipeline_spec(recipe) if isinstance(recipe, str) else recipe
    block = video_block(data.get("video"), pipeline) if data.get("video") is not None else None
    base = video_defaults()
    row = {**base, **(block or {}), "defaults": {**base["defaults"], **(block or {}).get("defaults", {})}}
    for key in ("call_options", "refused_latent_frames"):
        row[key] = tuple(row[key])
    name = str(recipe) if isinstance(recipe, str) and block is not None else "other"
    return VideoRow(name=name, **row)


@dataclasses.dataclass(frozen=True)
class VideoSpec:
    """The rules of one video pipeline class, derived from its configs: frames ``frame_step*k + 1`` (1: any count), sizes
    multiples of ``size_multiple``, the modes (``takes_prompt``/``takes_image``) and ``extra``, the call kwargs the
    configs fix (CogVideoX's ``max_sequence_length`` is its transformer's ``max_text_seq_length``).
    """

    pipeline: str
    row: VideoRow
    denoiser: str
    takes_prompt: bool
    takes_image: bool
    frame_step: int
    size_multiple: int
    defaults: dict[str, int]
    extra: dict[str, Any]
    frames_arg: str = "num_frames"
    patch: int = 1             # the transformer's spatial patch (1 for a UNet)
    spatial: int = 1           # the VAE's spatial factor (the size check may ask more: SVD 8)
    # every bound the configs put on the size and frames (position tables), :mod:`.limits`
    limits: SizeLimits = SizeLimits()
    # the clips the call needs as input (video-to-video: CogVideoX V2V's ``video``; Wan Animate's pose and face)
    input_clips: tuple[str, ...] = ()
    # an image the pipeline takes but documents as optional (LTX condition: text-to-video without it)
    image_optional: bool = False
    # other inputs the call cannot go without, which no option of `video` gives (AnimateDiff ControlNet's
    # conditioning_frames)
    other_inputs: tuple[str, ...] = ()

    @property
    def fixed_frames(self) -> int:
        """The one frame count a fixed temporal table takes (Latte's ``video_length``); 0: any count."""
        return self.limits.fixed_frames

    @property
    def max_positions(self) -> int:
        """Patches per axis a Wan-style rotary table (``rope_max_seq_len``) holds; 0: no table."""
        return self.limits.max_side // self.size_multiple

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
        if self.row.call_frames and frames != self.row.call_frames:  # the call would make another count, silently
            problems.append(f"--frames {frames}: {self.pipeline} makes {self.row.call_frames} frames whatever it is "
                            f"asked ({self.row.call_frames_note}); use --frames {self.row.call_frames}")
        elif self.fixed_frames:  # one count only: the limits below say which
            pass
        elif frames < 1:
            problems.append(f"--frames {frames}: must be at least 1")
        elif self.row.call_max_frames and frames > self.row.call_max_frames:  # diffusers refuses it after loading
            problems.append(f"--frames {frames}: {self.pipeline} makes at most {self.row.call_max_frames} frames as "
                            f"this program calls it ({self.row.call_max_frames_note}); use --frames "
                            f"{self.row.call_max_frames} or fewer")
        elif self.frame_step > 1 and (frames - 1) % self.frame_step:
            k = max(0, round((frames - 1) / self.frame_step))
            problems.append(f"--frames {frames}: {self.pipeline}'s VAE compresses time by {self.frame_step} and keeps "
                            f"the first frame, so frames must be {self.frame_step}*k+1; e.g. --frames "
                            f"{self.frame_step * k + 1} or {self.frame_step * (k + 1) + 1}")
        elif self._refused(frames):  # the call runs, and writes garbage (Kandinsky 5 I2V: NaN frames)
            latent = self.latent_shape(1, 1, frames)[0]
            fixes = " or ".join(f"--frames {f}" for f in self._allowed_near(frames))
            refused = ", ".join(map(str, self.row.refused_latent_frames))
            problems.append(f"--frames {frames}: {latent} latent frames, a count {self.pipeline}'s call cannot make "
                            f"(it fails for {refused}: {self.row.refused_frames_note}); use {fixes}")
        # past the position tables' bounds (read once from the configs: .limits); torch fails mid-run otherwise
        return problems or self.limits.problems(self.pipeline, height=height, width=width, frames=frames)

    def within(self, *, height: int, width: int, frames: int) -> tuple[int, int, int]:
        """The nearest (height, width, frames) at or below the ones given that this pipeline takes: frames its VAE
        takes (``frame_step*k + 1``, the next one up where none is below), then the bounds of its position tables
        (:meth:`SizeLimits.cap`). What a run that must work asks (benchmarks/command_sweep.py).

        Example:
            >>> idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "WanTransformer3DModel"]}
            >>> spec = video_spec("WanPipeline", idx, {"transformer": {"patch_size": [1, 2, 2]}})
            >>> spec.within(height=480, width=832, frames=80)
            (480, 832, 77)
        """
        step = self.frame_step
        if step > 1 and (frames - 1) % step:
            frames = max((frames - 1) // step * step + 1, step + 1)
        if self.row.call_frames:  # the only count the call makes (ChronoEdit)
            frames = self.row.call_frames
        elif self.row.call_max_frames:  # the most it makes in one window (SkyReels-V2 diffusion forcing)
            frames = min(frames, self.row.call_max_frames)
        height, width, frames = self.limits.cap(height=height, width=width, frames=frames)
        if step > 1 and (frames - 1) % step and not self.limits.fixed_frames:
            frames = (frames - 1) // step * step + 1  # capped below a table's bound: the VAE's count under it
        if self._refused(frames):  # a count the call writes garbage for: the nearest it makes, below first
            frames = self._allowed_near(frames)[0]
        return height, width, frames

    def _refused(self, frames: int) -> bool:
        """Whether the call writes garbage for ``frames`` (its recipe's ``refused_latent_frames``)."""
        return frames >= 1 and self.latent_shape(1, 1, frames)[0] in self.row.refused_latent_frames

    def _allowed_near(self, frames: int) -> list[int]:
        """The frame counts nearest ``frames`` the call makes (``step*k + 1``, no refused latent count: the stepping of
        :func:`~hf_precision.recipe.frames.nearest_latent_frames`): the one below, if any, then the one above, which the
        check of the count it gives judges again.
        """
        from ...recipe.frames import nearest_latent_frames

        near = nearest_latent_frames(self.latent_shape(1, 1, frames)[0], self.row.refused_latent_frames)
        return [(n - 1) * self.frame_step + 1 for n in near if n is not None]

    def required(self, settings: Any) -> Any:
        """``settings`` (a ``MemorySettings``) with what this pipeline cannot run without: VAE tiling for a VAE that
        only decodes tiled (Allegro). The same object when nothing is missing."""
        if self.row.vae_tiling == "always" and not settings.vae_tiling:
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
        """Prompt tokens the denoiser sees: ``--max-sequence-length`` or the config's, else the recipe's."""
        fixed = self.extra.get("max_sequence_length")
        return int(fixed) if fixed else self.row.text_length


def _init_default(spec: Any, name: str) -> Any:
    """The default of ``name`` in the ``__init__`` of the diffusers class ``spec`` = [library, class] names."""
    import diffusers

    cls = getattr(diffusers, str((spec or [None, ""])[1]), None)
    param = inspect.signature(cls.__init__).parameters.get(name) if cls is not None else None
    return None if param is None or param.default is inspect.Parameter.empty else param.default


def video_spec(pipeline: str, index: Mapping[str, Any], configs: Mapping[str, Mapping[str, Any]],
               recipe: str | None = None) -> VideoSpec:
    """The rules of a video pipeline from ``model_index.json``, the component configs and its recipe's ``video:`` block
    (``recipe``: a shipped name or a YAML file; default the one ``load_pipeline`` chooses). RecipeError for a class
    whose ``__call__`` takes no frame count (``num_frames``, Latte's ``video_length``, Sana-Video's ``frames``).

    Example:
        >>> idx = {"vae": ["diffusers", "AutoencoderKLWan"], "transformer": ["diffusers", "WanTransformer3DModel"]}
        >>> s = video_spec("WanPipeline", idx, {"vae": {"temperal_downsample": [False, True, True]},
        ...                                     "transformer": {"patch_size": [1, 2, 2]}})
        >>> s.mode, s.frame_step, s.size_multiple, s.check(height=480, width=832, frames=80)[0][:12]
        ('text-to-video', 4, 16, '--frames 80:')
    """
    import diffusers

    from ...diagnose.call import FRAME_ARGS, call_inputs, call_params, frames_argument

    cls = getattr(diffusers, pipeline, None)
    params = call_params(cls)

    frames_arg = frames_argument(params)  # Latte: video_length; Sana-Video: frames
    # video-to-video: the frames come from the input clips
    needed = call_inputs(cls)
    clips = tuple(a for a in needed if a == "video" or a.endswith("_video"))
    if frames_arg is None and not clips:
        raise RecipeError(f"model_index.json names {pipeline}, which is not a diffusers video pipeline (its __call__ "
                          f"takes none of {', '.join(FRAME_ARGS)}); pass a video model folder: Wan, LTX-Video, CogVideoX, HunyuanVideo "
                          f"or Stable Video Diffusion")
    chosen = recipe or pipeline_recipe(pipeline, index)
    row = video_row(chosen, pipeline)
    denoiser = _denoiser(pipeline, index, chosen)
    vae_cls = str((index.get("vae") or [None, ""])[1])
    spatial, temporal = vae_factors(vae_cls, configs.get("vae", {}))
    den = configs.get(denoiser, {})
    patch = axis_value(den.get("patch_size", 1))
    extra: dict[str, Any] = {}
    if row.text_length_key and den.get(row.text_length_key):
        extra["max_sequence_length"] = int(den[row.text_length_key])  # the pos-embedding length it was built for
    if "use_resolution_binning" in params:
        # the size asked is the size made, as generate's: Sana-Video's binning swaps it for its table's nearest
        # (pipeline_sana_video.py:850-856), past the checks made here, and raises for a transformer whose
        # sample_size has no table (anything but 30 or 22)
        extra["use_resolution_binning"] = False
    defaults = dict(row.defaults)
    if row.frames_key:
        defaults["frames"] = int(den.get(row.frames_key) or _init_default(index.get(denoiser), row.frames_key))
    limits = size_limits(index, configs, denoiser, spatial=spatial, temporal=temporal, patch=patch,
                         init_default=_init_default)
    # a model card's size the position tables cannot place (a small test model): the largest they can; the one
    # frame count a fixed table takes (Latte's video_length: a config may leave it at the class default)
    defaults["height"], defaults["width"], defaults["frames"] = limits.cap(
        height=defaults["height"], width=defaults["width"], frames=defaults["frames"])
    return VideoSpec(pipeline=pipeline, row=row, denoiser=denoiser, takes_prompt="prompt" in params,
                     takes_image="image" in params, frame_step=temporal if temporal > 1 else 1,
                     size_multiple=spatial * patch, defaults=defaults, extra=extra,
                     frames_arg=frames_arg or "num_frames", patch=patch, spatial=spatial, limits=limits,
                     input_clips=clips,
                     image_optional="image" in params and "image" not in needed,
                     other_inputs=tuple(a for a in needed if a not in clips and a != "image"))


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


def _denoiser(pipeline: str, index: Mapping[str, Any], recipe: str | Mapping[str, Any]) -> str:
    """The recipe's ``denoiser:``, else the first component whose role is ``denoiser``."""
    from ...recipe.catalog import pipeline_spec
    from ...runtime.source import models_of_index

    models = models_of_index(index)
    named = (pipeline_spec(recipe) if isinstance(recipe, str) else recipe).get("denoiser")
    if named in models:
        return str(named)
    found = sorted(name for name, (_, role) in models.items() if role == "denoiser")
    if not found:
        raise RecipeError(f"model_index.json of {pipeline} lists no denoiser (a transformer or UNet diffusers "
                          f"model); pass a complete video model folder")
    return found[0]


def model_spec(model: str, configs_only: bool = False) -> tuple[str, VideoSpec]:
    """Where a video model is and its :class:`VideoSpec`, from ``model_index.json`` and the configs (nothing loaded); a
    RecipeError for no such model or no video pipeline. ``configs_only`` (``--plan``): the configs shipped in
    ``hf_precision/model_configs`` count too, as for :func:`hf_precision.plan`.

    Example:
        >>> where, spec = model_spec("svd", configs_only=True)
        >>> spec.row.name, spec.denoiser, spec.mode
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


def spec_of(pipe: Any, recipe: str | None = None) -> VideoSpec:
    """The :class:`VideoSpec` of a built pipeline, from its components' configs (``recipe``: as :func:`video_spec`).

    Example:
        >>> from hf_precision.testing.pipelines import make_svd
        >>> spec_of(make_svd()).frames_arg
        'num_frames'
    """
    index = {name: list(value) for name, value in pipe.config.items()
             if not name.startswith("_") and isinstance(value, (list, tuple))}
    configs = {name: dict(module.config) for name, module in pipe.components.items()
               if isinstance(getattr(module, "config", None), Mapping)}
    return video_spec(type(pipe).__name__, index, configs, recipe)
