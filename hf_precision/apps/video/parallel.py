"""Context parallelism for the video script: one clip's tokens split across GPUs with diffusers' own hooks.

diffusers 0.42.1 splits the sequence of a transformer that declares a ``_cp_plan``
(``enable_parallelism(config=ContextParallelConfig(ring_degree=N))``, models/modeling_utils.py:1742); the recipe is
applied first on every rank and the hooks only split and gather activations. Not on a CPU: rank ``r`` goes to
``torch.device(accelerator, r % torch.accelerator.device_count())`` (:1718-1719), a division by zero without an
accelerator; :func:`check_context_parallel` says so up front.
"""

from __future__ import annotations

from typing import Any

from ...errors import RecipeError

GPU_COMMAND = ("torchrun --nproc_per_node {n} scripts/generate_video.py --model ./Wan2.1-T2V-14B-Diffusers "
               "--prompt \"a cat\" --out cat.mp4 --context-parallel {n}")


def check_context_parallel(degree: int, *, transformer_class: Any, device_type: str, world_size: int) -> None:
    """Refuse a ``--context-parallel`` run that diffusers cannot do, with the reason and the command that works.

    Example:
        >>> from diffusers import WanTransformer3DModel
        >>> check_context_parallel(2, transformer_class=WanTransformer3DModel, device_type="cpu", world_size=2)
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --context-parallel 2 needs GPUs: ...
    """
    if degree < 2:
        raise RecipeError(f"--context-parallel {degree}: give the number of GPUs to split one clip over (2 or more)")
    name = getattr(transformer_class, "__name__", str(transformer_class))
    if getattr(transformer_class, "_cp_plan", None) is None:
        raise RecipeError(f"--context-parallel {degree}: {name} declares no _cp_plan in diffusers, so its sequence "
                          "cannot be split (WanTransformer3DModel and LTXVideoTransformer3DModel can); run one "
                          "model copy per GPU instead (accelerate launch splits the prompts)")
    if device_type == "cpu":
        raise RecipeError(
            f"--context-parallel {degree} needs GPUs: diffusers puts rank r on accelerator r % "
            "torch.accelerator.device_count() (diffusers v0.42.1 models/modeling_utils.py:1718-1719) and this torch "
            f"has no accelerator, so it cannot run over gloo on CPUs. On {degree} GPUs: "
            + GPU_COMMAND.format(n=degree))
    if world_size != degree:
        raise RecipeError(f"--context-parallel {degree}: the run has {world_size} process(es); start one per GPU: "
                          + GPU_COMMAND.format(n=degree))


def enable_context_parallel(pipe: Any, degree: int) -> list[str]:
    """Split the denoiser's sequence over ``degree`` ranks (diffusers' ring attention); returns the components done.

    Call it after the pipeline is loaded with its recipe and ``torch.distributed`` is initialised (``torchrun`` or
    ``accelerate launch``), on every rank, with the same prompt and seed on every rank.
    """
    import torch.distributed as dist
    from diffusers import ContextParallelConfig

    from .load import components_by_role

    world_size = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    done = []
    for name, module in components_by_role(pipe, "denoiser"):
        check_context_parallel(degree, transformer_class=type(module), device_type=module.device.type,
                               world_size=world_size)
        module.enable_parallelism(config=ContextParallelConfig(ring_degree=degree))
        done.append(name)
    return done


def denoiser_class(model: str, spec: Any) -> Any:
    """The class of a video model's denoiser, from ``model_index.json`` (its name where diffusers has no such class).

    Example:
        >>> from hf_precision.apps.video.spec import model_spec
        >>> denoiser_class(*model_spec("wan", configs_only=True)).__name__
        'WanTransformer3DModel'
    """
    import diffusers

    from ...runtime.source import configs_of

    entry = configs_of(model)[1].get(spec.denoiser) or [None, "?"]
    return getattr(diffusers, str(entry[1]), entry[1])
