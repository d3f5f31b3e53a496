"""What each video pipeline family takes: mode (text/image to video), frame and size rules, defaults, extra kwargs.

Everything is read from the pipeline class and the component configs of ``model_index.json`` (no weights), so the
arguments are checked before anything is loaded. The rules are the ones the diffusers pipelines apply themselves:

* frames: the 3D VAEs compress time by a factor ``t`` and keep the first frame apart, so ``num_frames`` must be
  ``t*k + 1`` (diffusers ``pipeline_wan.py`` warns "num_frames - 1 has to be divisible by vae_scale_factor_temporal";
  ``pipeline_ltx.py`` computes ``(num_frames - 1) // vae_temporal_compression_ratio + 1`` latent frames; CogVideoX and
  HunyuanVideo do the same with their ``temporal_compression_ratio``); SVD takes any count.
* size: height and width must be multiples of the VAE's spatial factor times the transformer's patch size
  (``pipeline_wan.py`` ``check_inputs``: "height and width have to be divisible by 16"; ``pipeline_ltx.py``: 32).
"""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any

from ..errors import RecipeError

__all__ = ["VideoSpec", "video_spec", "FAMILY_DEFAULTS"]

# Defaults per family: the resolution and frame count each model card shows, steps from the diffusers docs examples.
# Wan 2.1: 480x832, 81 frames (Wan-AI/Wan2.1-T2V-1.3B-Diffusers model card); LTX-Video: 480x704, 161 frames
# (Lightricks/LTX-Video model card); CogVideoX: 480x720, 49 frames (THUDM/CogVideoX-2b model card); HunyuanVideo:
# 320x512, 61 frames (diffusers docs api/pipelines/hunyuan_video.md example); SVD: 576x1024, the UNet's num_frames.
FAMILY_DEFAULTS: dict[str, dict[str, int]] = {
    "wan": {"height": 480, "width": 832, "frames": 81, "steps": 50},
    "ltx": {"height": 480, "width": 704, "frames": 161, "steps": 50},
    "cogvideox": {"height": 480, "width": 720, "frames": 49, "steps": 50},
    "hunyuan": {"height": 320, "width": 512, "frames": 61, "steps": 30},
    "svd": {"height": 576, "width": 1024, "frames": 0, "steps": 25},
    "other": {"height": 480, "width": 832, "frames": 49, "steps": 30},
}


# VAEs whose decode refuses to run untiled: Allegro's raises "Decoding without tiling has not been implemented yet"
# (diffusers v0.42.1 autoencoder_kl_allegro.py:841), so the video program turns tiling on whatever the settings say.
TILED_ONLY_VAES = frozenset({"AutoencoderKLAllegro"})


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
    frame_factor: int = 1      # the VAE's temporal compression times the transformer's temporal patch

    @property
    def mode(self) -> str:
        return "+".join(m for m, on in (("text", self.takes_prompt), ("image", self.takes_image)) if on) + "-to-video"

    def check(self, *, height: int, width: int, frames: int) -> list[str]:
        """The problems of a size and frame count for this pipeline (empty when they fit), each with the fix."""
        problems = []
        m = self.size_multiple
        for name, value in (("height", height), ("width", width)):
            if value <= 0 or value % m:
                near = max(m, round(value / m) * m)
                problems.append(f"--{name} {value}: {self.pipeline} needs a positive multiple of {m} (VAE spatial "
                                f"factor x transformer patch size, from the configs); e.g. --{name} {near}")
        if self.fixed_frames and frames != self.fixed_frames:
            problems.append(f"--frames {frames}: {self.pipeline}'s transformer was built for {self.fixed_frames} frames "
                            f"(video_length in its config: the temporal position embedding has that length); use "
                            f"--frames {self.fixed_frames}")
        elif frames < 1:
            problems.append(f"--frames {frames}: must be at least 1")
        elif self.frame_step > 1 and (frames - 1) % self.frame_step:
            k = max(0, round((frames - 1) / self.frame_step))
            problems.append(f"--frames {frames}: {self.pipeline}'s VAE compresses time by {self.frame_step} and keeps "
                            f"the first frame, so frames must be {self.frame_step}*k+1; e.g. --frames "
                            f"{self.frame_step * k + 1} or {self.frame_step * (k + 1) + 1}")
        return problems or self._position_problems(height, width, frames)

    def _position_problems(self, height: int, width: int, frames: int) -> list[str]:
        """Sizes beyond the transformer's rotary table: torch would fail with "shape [...] is invalid" mid-run."""
        if not self.max_positions:
            return []
        n, m = self.max_positions, self.size_multiple
        problems = [f"--{name} {value}: {self.pipeline}'s transformer has rotary positions for {n} patches per side "
                    f"(rope_max_seq_len in its config), so --{name} can be at most {n * m}; e.g. --{name} "
                    f"{min(n * m, value)}" for name, value in (("height", height), ("width", width)) if value // m > n]
        latent = (frames - 1) // max(self.frame_step, 1) + 1
        if latent // self.frame_factor > n:
            most = (n * self.frame_factor - 1) * max(self.frame_step, 1) + 1
            problems.append(f"--frames {frames}: {self.pipeline}'s transformer has rotary positions for {n} latent "
                            f"frames (rope_max_seq_len), so --frames can be at most {most}; e.g. --frames {most}")
        return problems


def _family(pipeline: str) -> str:
    for prefix, family in (("Wan", "wan"), ("LTX", "ltx"), ("CogVideoX", "cogvideox"), ("HunyuanVideo", "hunyuan"),
                           ("StableVideoDiffusion", "svd")):
        if pipeline.startswith(prefix):
            return family
    return "other"


def _pair(value: Any, index: int = -1) -> int:
    if isinstance(value, (list, tuple)):
        return int(value[index])
    return int(value or 1)


def _vae_factors(cls: str, config: Mapping[str, Any]) -> tuple[int, int]:
    """(spatial, temporal) compression of a video VAE, as the diffusers pipelines compute them."""
    if cls == "AutoencoderKLWan":
        # pipeline_wan.py: vae_scale_factor_temporal = 2 ** sum(temperal_downsample), spatial = 2 ** len(...)
        down = list(config.get("temperal_downsample", [False, True, True]))
        return 2 ** len(down), 2 ** sum(bool(d) for d in down)
    if cls == "AutoencoderKLLTXVideo":
        # autoencoder_kl_ltx.py: spatial = patch_size * 2**sum(spatio_temporal_scaling), temporal = patch_size_t * ...
        scaling = list(config.get("spatio_temporal_scaling", [True, True, True, False]))
        n = sum(bool(s) for s in scaling)
        return int(config.get("patch_size", 4)) * 2 ** n, int(config.get("patch_size_t", 1)) * 2 ** n
    if cls in ("AutoencoderKLCogVideoX", "AutoencoderKLHunyuanVideo"):
        blocks = config.get("block_out_channels", [0, 0, 0, 0])
        spatial = int(config.get("spatial_compression_ratio") or 2 ** (len(blocks) - 1))
        return spatial, int(config.get("temporal_compression_ratio", 4))
    if cls == "AutoencoderKLTemporalDecoder":  # SVD: 2D spatial, no temporal compression
        return 2 ** (len(config.get("block_out_channels", [0] * 4)) - 1), 1
    blocks = config.get("block_out_channels")
    return (2 ** (len(blocks) - 1) if blocks else 8), int(config.get("temporal_compression_ratio", 1) or 1)


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
    frames_arg = next((a for a in ("num_frames", "video_length") if a in params), None)  # Latte: video_length
    if frames_arg is None:
        raise RecipeError(f"model_index.json names {pipeline}, which is not a diffusers video pipeline (its __call__ "
                          f"takes no num_frames or video_length); pass a video model folder: Wan, LTX-Video, CogVideoX, HunyuanVideo "
                          f"or Stable Video Diffusion")
    family = _family(pipeline)
    denoiser = "unet" if "unet" in index else "transformer"
    vae_cls = str((index.get("vae") or [None, ""])[1])
    spatial, temporal = _vae_factors(vae_cls, configs.get("vae", {}))
    den = configs.get(denoiser, {})
    patch = _pair(den.get("patch_size", 1)) if denoiser == "transformer" else 1
    extra: dict[str, Any] = {}
    if family == "cogvideox" and den.get("max_text_seq_length"):
        extra["max_sequence_length"] = int(den["max_text_seq_length"])  # the pos-embedding length it was built for
    defaults = dict(FAMILY_DEFAULTS[family])
    if family == "svd":
        defaults["frames"] = int(den.get("num_frames", 14))
    fixed = int(den.get("video_length") or _init_default(index.get(denoiser), "video_length") or 0)  # Latte:
    # a temporal position embedding of that many frames (a config may leave it at the class default)
    if fixed:
        defaults["frames"] = fixed
    positions = int(den.get("rope_max_seq_len") or _init_default(index.get(denoiser), "rope_max_seq_len") or 0)
    if positions:  # a model card's size the transformer cannot place (a small test model): the largest it can
        t = max(temporal, 1) * _pair(den.get("patch_size", 1), 0)
        defaults["height"] = min(defaults["height"], positions * spatial * patch)
        defaults["width"] = min(defaults["width"], positions * spatial * patch)
        defaults["frames"] = min(defaults["frames"], (positions * t - 1) // max(temporal, 1) * max(temporal, 1) + 1)
    return VideoSpec(pipeline=pipeline, family=family, denoiser=denoiser, takes_prompt="prompt" in params,
                     takes_image="image" in params, frame_step=temporal if temporal > 1 else 1,
                     size_multiple=spatial * patch, defaults=defaults, extra=extra,
                     vae_tiling_required=vae_cls in TILED_ONLY_VAES, frames_arg=frames_arg, fixed_frames=fixed,
                     max_positions=positions, frame_factor=_pair(den.get("patch_size", 1), 0) if positions else 1)
