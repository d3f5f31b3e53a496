"""Everything a training run needs before its first step: the checks that need no weights (settings, output folder,
model configs, data, family), then the model, the training plan, the optimizer and accelerate."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ...errors import RecipeError
from .cache import EncodingCache
from .checkpoint import Checkpoints, Resumed, check_resume
from .data import TrainData, model_geometry, read_data
from .settings import RESUME_KEYS, TrainSettings, check_out_folder, check_settings, configs_source

__all__ = ["Run", "prepare_run"]


@dataclasses.dataclass
class Run:
    """A prepared run: settings, data, the training plan and the objects the loop steps."""

    settings: TrainSettings
    out: Path
    data: TrainData
    pipe: Any
    tp: Any
    optimizer: Any
    scheduler: Any
    accelerator: Any
    cache: EncodingCache | None
    checkpoints: Checkpoints
    resumed: Resumed | None = None


# --------------------------------------------------------------------------------------------- preparation


def _train_parts(s: TrainSettings, index: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    """``train=`` and the extra keywords of prepare_training, as the method's handler sets them for a run."""
    from ...runtime.source import listed_components
    from ...training.methods import method_of

    denoiser = "transformer" if "transformer" in index else "unet"
    listed = listed_components(index)
    encoders = {n: str(listed[n][1]) for n in sorted(listed) if n.startswith("text_encoder")}
    from .experts import expert_train

    train, extra = method_of(s.method).program_train(s, denoiser, encoders)
    check_lora_saves(s.train_text_encoder, s.method, index)
    return expert_train(train, index, s.expert), extra


def check_lora_saves(train_text_encoder: bool, method: str, index: Mapping[str, Any]) -> None:
    """Refuse ``--train-text-encoder`` (``train`` and ``train --plan``, before loading) where diffusers' LoRA loader of
    the pipeline cannot write the text encoders' LoRA: the run would train every step, then fail in the save.

    Example:
        >>> check_lora_saves(True, "lora", {"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "U"],
        ...                                 "text_encoder": ["transformers", "CLIPTextModel"]})
    """
    from ...recipe.catalog import shipped_value
    from ...runtime.source import listed_components
    from ...training.io import lora_save_problem
    from ...training.methods import method_of

    if not train_text_encoder or not method_of(method).saves_adapter:
        return
    pipeline = str(index.get("_class_name"))
    parts = ["transformer" if "transformer" in index else "unet",
             *sorted(n for n in listed_components(index) if n.startswith("text_encoder"))]
    problem = lora_save_problem(pipeline, parts, shipped_value(pipeline, "pipelines")[1] or ())
    if problem:
        raise RecipeError(f"--train-text-encoder: {problem}; drop --train-text-encoder")


def check_trainable(index: dict[str, Any], configs: Mapping[str, Mapping[str, Any]] | None = None,
                    fed: bool = False) -> None:
    """Refuse, from the folder's model_index (and its components' ``configs`` where given), a model the program
    cannot train: no denoiser row, a conditioning it cannot make, latents that do not come from a ``vae``, or input
    channels beyond the latents that no condition builder makes for this pipeline. ``train`` and ``train --plan``
    both ask, before any weight loads. ``fed``: the data gives the inputs its recipe's ``unfed_inputs`` names (Wan
    Animate's reference, pose and face videos: :mod:`.animate`); without them that text is the refusal.

    Example:
        >>> check_trainable({"_class_name": "StableDiffusionPipeline", "unet": ["diffusers", "UNet2DConditionModel"],
        ...                  "vae": ["diffusers", "AutoencoderKL"]}, {"unet": {"in_channels": 4}})
    """
    _check_family(index)
    _check_conditioning(index)
    _check_latents(index)
    if configs is not None:
        _check_condition_builder(index, configs, fed)


def _models(index: dict[str, Any]) -> list[tuple[str, str, Any]]:
    """The diffusers models a model_index lists, schedulers aside: (component, class name, the training layer's
    denoiser row for it or a base class of it, else None). Every check here reads this one classification."""
    import diffusers

    from ...runtime.source import listed_components
    from ...training.denoiser_rows import ROWS

    models = []
    for name, (library, cls_name) in sorted(listed_components(index).items()):
        cls = getattr(diffusers, str(cls_name), None)
        if library != "diffusers" or (isinstance(cls, type) and not issubclass(cls, diffusers.ModelMixin)):
            continue
        mro = [c.__name__ for c in cls.__mro__] if isinstance(cls, type) else [str(cls_name)]
        models.append((name, str(cls_name), next((ROWS[n] for n in mro if n in ROWS), None)))
    return models


def _check_family(index: dict[str, Any]) -> None:
    """Refuse, before loading, a denoiser class the training layer has no family row for (it cannot build its call)."""
    from ...training.denoiser_rows import ROWS

    models = _models(index)
    if any(row is not None for *_, row in models):
        return  # the denoiser (unet, transformer, Cascade's prior or decoder) has a row
    shown = ", ".join(f"{name}: {cls}" for name, cls, _ in models) or "no diffusers model listed"
    raise RecipeError(f"--model: {index.get('_class_name')} has no denoiser with a training row ({shown}), so no "
                      f"training step can build its call; add a row for its class in a denoisers YAML file shaped like "
                      f"recipes/denoisers.yaml (plus at most one registered input builder), read it with "
                      f"hf_precision.training.add_rows(path) and train with hf_precision.prepare_training(...) "
                      f"(docs/training.md, \"A new family\"); rows exist for {', '.join(sorted(ROWS))}")


def _check_condition_builder(index: dict[str, Any], configs: Mapping[str, Mapping[str, Any]], fed: bool) -> None:
    """Refuse, from the denoiser's config, a pipeline whose denoiser takes channels beyond the latents (inpainting's
    mask, an image-to-video model's first frame) that no condition builder of its row makes, or an image embedding
    its row names no pipeline method for: the training step would refuse it only after the weights had loaded.
    A pipeline whose recipe names ``unfed_inputs`` is refused with that text unless the data is ``fed``."""
    import diffusers

    from ...recipe.catalog import shipped_video
    from ...training.denoiser_rows import condition_channels, condition_of
    from ...training.image_embeds import image_encode_of

    pipeline = getattr(diffusers, str(index.get("_class_name")), None)
    unfed = shipped_video(pipeline).get("unfed_inputs") if isinstance(pipeline, type) else None
    if unfed and not fed:  # data the program reads only where the data folder gives it (Wan Animate: .animate)
        raise RecipeError(f"--model: {pipeline.__name__}: {unfed}")
    for name, cls_name, row in _models(index):
        if row is None or not isinstance(pipeline, type):
            continue
        # the denoiser as the training layer reads it, its config alone: named as its class in the message
        stand_in = type(cls_name, (), {"config": dict(configs.get(name) or {})})()
        try:
            if condition_channels(row, stand_in):
                condition_of(row, stand_in, pipeline)
            image_encode_of(row, stand_in, pipeline)  # an image embedding no listed method makes for this pipeline
        except RecipeError as err:  # the training layer's TrainingError, said as the program's
            raise RecipeError(f"--model: {err}") from None


def _check_conditioning(index: dict[str, Any]) -> None:
    """Refuse, before loading, a pipeline without ``encode_prompt`` (the program conditions on captions through it)
    or whose ``encode_prompt`` needs an input besides the caption and the image (a sample's first frame).

    Example:
        >>> _check_conditioning({"_class_name": "StableDiffusionPipeline"})
        >>> _check_conditioning({"_class_name": "HunyuanVideoImageToVideoPipeline"})  # the first frame: its image
        >>> _check_conditioning({"_class_name": "DiTPipeline", "transformer": ["diffusers", "DiTTransformer2DModel"]})
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --model: DiTPipeline has no encode_prompt...
        >>> _check_conditioning({"_class_name": "StableVideoDiffusionPipeline",  # the first frame's image embedding
        ...                      "unet": ["diffusers", "UNetSpatioTemporalConditionModel"]})
    """
    import diffusers

    from ...training.encode import encode_prompt_needs

    name = str(index.get("_class_name"))
    cls = getattr(diffusers, name, None)
    if cls is not None and hasattr(cls, "encode_prompt"):
        # HunyuanVideo I2V encodes its input image into the prompt's tokens: the clip's first frame, as its __call__
        # is given (apps/train/loop.py _prompt_image); anything else the data cannot give
        needs = [n for n in encode_prompt_needs(cls) if n != "image"]
        if needs:
            raise RecipeError(f"--model: {name}.encode_prompt needs {', '.join(needs)} besides the caption (it "
                              f"conditions on the input with the prompt), and the training program encodes captions "
                              f"alone (the data gives no such input); write your own loop with "
                              f"hf_precision.prepare_training(...) and give the conditioning in the batch "
                              f"(tp.loss(batch))")
        return
    if cls is None or _image_conditioned(index, cls):
        return
    raise RecipeError(f"--model: {name} has no encode_prompt: the training program conditions the denoiser on each "
                      f"caption through it, and {name} is conditioned otherwise (an input image or class labels); "
                      f"write your own loop with hf_precision.prepare_training(...) and give its conditioning in the "
                      f"batch (tp.loss(batch))")


def _image_conditioned(index: dict[str, Any], pipeline: type) -> bool:
    """Whether the pipeline's denoiser is conditioned on its input image's embedding alone (SVD): its row reads
    nothing from ``encode_prompt`` and names the pipeline's image-encoding method, which the encode phase runs on each
    sample's first frame; the captions are then unused."""
    for *_, row in _models(index):
        if row is not None:
            return not row.encode and any(c.__name__ in row.image_encode for c in pipeline.__mro__)
    return False


def _check_latents(index: dict[str, Any]) -> None:
    """Refuse, before loading, a pipeline without a ``vae``: the program makes each image's latents with it.

    Kandinsky 3's latents come from a MoVQ (``movq``), Stable Cascade's decoder's from its ``vqgan``, and its prior's
    are image embeddings that no listed model encodes: the denoiser of a prior/decoder pair.

    Example:
        >>> _check_latents({"_class_name": "StableDiffusionPipeline", "vae": ["diffusers", "AutoencoderKL"]})
        >>> _check_latents({"_class_name": "Kandinsky3Pipeline", "movq": ["diffusers", "VQModel"],
        ...                 "unet": ["diffusers", "Kandinsky3UNet"]})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --model: Kandinsky3Pipeline has no 'vae': its latents come from movq...
    """
    from ...runtime.source import listed_components

    if "vae" in listed_components(index):
        return
    models = _models(index)
    encoders = [f"{name} ({cls})" for name, cls, row in models if row is None]
    denoisers = [f"{name} ({cls})" for name, cls, row in models if row is not None]
    name = index.get("_class_name")
    where = (f"its latents come from {', '.join(encoders)}" if encoders else
             f"no model it lists encodes images into its latents (its denoiser {', '.join(denoisers) or '?'} works in "
             f"another model's latent space, as the prior of a prior/decoder pair does)")
    raise RecipeError(f"--model: {name} has no 'vae': {where}, and the training program encodes each image into "
                      f"latents with the pipeline's vae; train a pipeline with a vae, or "
                      f"write your own loop with hf_precision.prepare_training(...) and give the latents in the batch "
                      f"(tp.loss(batch))")


def _accelerator(out: Path, device: str | None, s: TrainSettings) -> Any:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import is_tensorboard_available

    log_with = "tensorboard" if is_tensorboard_available() else None  # what accelerate's tracker needs
    # cpu=True makes several processes without a GPU (or with --device cpu) a MULTI_CPU run over gloo
    has_gpu = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    cpu = (device or "").split(":")[0] == "cpu" or not has_gpu
    from .sharded import accelerate_shard

    # accelerate's FSDP2 config: the layer shards, in the recipe's dtypes (never acc.prepare); a config the layer
    # cannot honour is refused before accelerate acts on it
    if accelerate_shard():
        s.shard = True
    return Accelerator(log_with=log_with, project_dir=str(out / "logs"), cpu=cpu)


def _device(s: TrainSettings, acc: Any) -> str:
    if acc.num_processes > 1 and (s.device is None or s.device.split(":")[0] != "cpu"):
        return str(acc.device)  # each process its own GPU
    if s.device is None:
        from ...recipe.devices import device_profile

        return str(device_profile(None).torch_device())
    return s.device


def _cache_key(tp: Any, s: TrainSettings) -> str:
    """The encoding cache's key: the training plan's fingerprint, and for a single file its identity too (a
    fine-tune of the same base has the base's configs and names, but its own VAE and text encoders)."""
    if not s.base:
        return tp.fingerprint()
    import hashlib

    stat = Path(s.model).stat()
    ident = f"{tp.fingerprint()}|{Path(s.model).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def _validation_problem(s: TrainSettings, index: Mapping[str, Any]) -> str | None:
    """Why the validation call cannot run its ``--validation-inference-steps`` (an image-to-image call at its default
    strength denoising none of them: SDXL img2img at 0.3 and 2 steps), said before loading, not after training."""
    import diffusers

    from ...diagnose.steps import steps_problem

    cls = getattr(diffusers, str(index.get("_class_name")), None)
    problem = steps_problem(cls, s.validation_inference_steps) if s.validation_prompt and cls is not None else None
    # train has no --strength: the validation call runs at the pipeline's default
    return problem and problem.replace("--steps", "--validation-inference-steps").split(" or a larger ")[0]


def prepare_run(s: TrainSettings) -> Run:
    """Check everything that can be checked without weights, then load the model and prepare the training plan."""
    import torch

    from ...runtime.source import component_configs, locate

    check_settings(s)
    out = check_out_folder(s.out, s.resume)
    where, index, folder = locate(configs_source(s.model, s.base))
    from ...recipe.requires import check_packages

    configs = component_configs(where, index, folder)
    # what the pipeline cannot be built or run without (recipe `requires:`, less what its configs make unneeded) comes
    # first; `train --plan` needs none
    check_packages(None, str(index.get("_class_name")), configs)
    geometry = model_geometry(str(index.get("_class_name")), index, configs)
    s.resolution = resolution = s.resolution or geometry.configured_resolution(configs)
    if geometry.video and s.frames is None and geometry.fixed_frames:
        s.frames = geometry.fixed_frames  # the one count the model takes (ChronoEdit's 5), as `train --plan` takes it
    if geometry.video and s.frames is None:
        raise RecipeError(f"--frames: {geometry.pipeline} trains on clips; give --frames N "
                          f"({geometry.frame_step}*k+1, e.g. {geometry.frame_step * 4 + 1})")
    data = read_data(s.data, geometry, resolution, frames=s.frames, caption_ext=s.caption_ext,
                     caption_column=s.caption_column, caption=s.caption, reference_column=s.reference_column,
                     reference_dir=s.reference_dir)
    train, extra = _train_parts(s, index)
    check_trainable(index, configs, fed=any(x.pose is not None for x in data.samples))
    from .animate import animates
    from .references import check_reference_family

    # a first-frame edit model's references are its pairs (check_pairs), Wan Animate's its character images (.animate),
    # not inputs its call lacks
    check_reference_family(index, not geometry.first_frame_edit and not animates(geometry.pipeline)
                           and any(x.reference is not None for x in data.samples))
    from ...training.methods import method_of

    problem = method_of(s.method).data_problem(s, data.samples) or _validation_problem(s, index)
    if problem:
        raise RecipeError(problem)
    checkpoints = Checkpoints(out, s.keep_checkpoints)
    resumed = check_resume(s, data, checkpoints, RESUME_KEYS)  # other settings or data: refused before loading

    from ...runtime.load import load_pipeline
    from ...training import prepare_training

    acc = _accelerator(out, s.device, s)
    device = _device(s, acc)
    from .experts import expert_line

    line = expert_line(index, "low" if "transformer_2" in train else "high")
    if line and acc.is_main_process:
        print(line)
    torch.manual_seed(s.seed)  # LoRA initialisation
    from ...training.resolve import resolve_training

    # One resolution, from the configs, before any weight loads: what cannot train (or shard) in the asked storage
    # is refused here, and the model loads straight into the training recipe (a quantized trainable part's backend
    # makes its scales in the dtype training computes in).
    tr = resolve_training(where, device=device, layout=s.layout, train=train, overrides=list(s.overrides) or None,
                          shard=s.shard)
    from ...runtime.progress import quiet_loading

    with quiet_loading(s.quiet):
        pipe = load_pipeline(s.model if s.base else where, device, recipe=tr.recipe, base=s.base)
    pipe.set_progress_bar_config(disable=True)
    # Text encoders get their LoRA through peft's own injection (training.trainable.inject_lora), not transformers'
    # add_adapter, whose peft version check refused the installed peft.
    # with the cache on, the frozen encoders run in the cache pass only: replicated, as the per-rank plan counts them
    shard = ("cached" if s.cache else True) if s.shard else False
    tp = prepare_training(pipe, device=device, train=train, master=s.master, recipe=tr, shard=shard, **extra)
    if s.gradient_checkpointing:
        denoiser = tp.components[tp.denoiser_name]
        if not getattr(denoiser, "_supports_gradient_checkpointing", False):
            raise RecipeError(f"--gradient-checkpointing: {type(denoiser).__name__} does not support it")
        denoiser.enable_gradient_checkpointing()
    params = list(tp.parameters())
    optimizer = torch.optim.AdamW(params, lr=s.learning_rate)
    from diffusers.optimization import get_scheduler

    scheduler = get_scheduler(s.lr_scheduler, optimizer, num_warmup_steps=s.warmup_steps,
                              num_training_steps=s.steps)
    cache = EncodingCache(out / "cache", _cache_key(tp, s)) if s.cache else None
    out.mkdir(parents=True, exist_ok=True)  # the log is written from step 1 (the cache, when on, made it already)
    return Run(s, out, data, pipe, tp, optimizer, scheduler, acc, cache, checkpoints, resumed)


