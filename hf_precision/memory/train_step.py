"""The activations of one training step of a denoiser, counted on torch's ``meta`` device with autograd on.

What the forward saves stays alive until backward frees it, and backward's gradients add
(:func:`hf_precision.memory.counting.count_live_bytes` with ``grad=True``). The call comes from the training layer's
family row and the LoRA from its own functions, so the count follows the real step (checkpointing included); an
fp8-stored denoiser is stored on meta as the loader stores it, its autograd copies counted apart
(:func:`held_fp8_copies`).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from typing import Any

from ..errors import RecipeError
from .counting import count_live_bytes, with_values
from .stand_ins import standing_in

__all__ = ["cast_floats", "held_fp8_copies", "step_activations", "store_fp8", "make_trainable", "text_encoder_held"]


def cast_floats(value: Any, dtype: Any, key: str = "") -> Any:
    """A denoiser's keyword arguments with floating tensors in ``dtype``, as the boundary hooks cast them at its entry
    (the timesteps and guidance stay as they are); ``None`` keeps every dtype.

    Example:
        >>> import torch
        >>> out = cast_floats({"x": torch.ones(1), "timestep": torch.ones(1)}, torch.float16)
        >>> out["x"].dtype, out["timestep"].dtype
        (torch.float16, torch.float32)
    """
    import torch

    if isinstance(value, dict):
        return {k: cast_floats(v, dtype, k) for k, v in value.items()}
    if (dtype is not None and torch.is_tensor(value) and value.is_floating_point()
            and key not in ("timestep", "timesteps", "guidance")):
        return value.to(dtype)
    return value


@contextlib.contextmanager
def held_fp8_copies() -> Iterator[dict[int, int]]:
    """Count the compute-dtype copies of fp8 weights that autograd saves for backward: storage -> bytes.

    A layer gradients pass through computes from ``weight.to(compute)``
    (:func:`hf_precision.runtime.patches.upcast_on_use`), saved for the input's gradient until backward. Such copies
    are ``_to_copy`` outputs from float8 (activations never are); a saved tensor on their storage (the copy or its
    transpose) is held. Meta or real tensors.

    Example:
        >>> import torch
        >>> w = torch.ones(4, 4, dtype=torch.float8_e4m3fn)
        >>> x = torch.ones(2, 4, requires_grad=True)
        >>> with held_fp8_copies() as held:
        ...     y = torch.nn.functional.linear(x, w.to(torch.float32))
        >>> sum(held.values())  # the 4 x 4 fp32 copy: 64 bytes, until backward
        64
    """
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    fp8 = _float8_dtypes()
    copies: dict[int, Any] = {}
    held: dict[int, int] = {}

    class Copies(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            if func is torch.ops.aten._to_copy.default and args[0].dtype in fp8 and isinstance(out, torch.Tensor):
                copies[out.untyped_storage()._cdata] = weakref.ref(out)
            return out

    def pack(t: Any) -> Any:
        key = t.untyped_storage()._cdata
        ref = copies.get(key)
        if ref is not None and ref() is not None:  # alive: not a later tensor on a reused address
            held[key] = t.untyped_storage().nbytes()
        return t

    with Copies(), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        yield held


def step_activations(module: Any, batch: Mapping[str, Any], objective: str, checkpointing: bool,
                     dtype: Any) -> tuple[int, int]:
    """Activation peak (bytes) of one training forward + backward of ``module`` on meta, gradients excluded, and
    the bytes of the fp8 weight copies held for backward within it (:func:`held_fp8_copies`).

    Example:
        >>> import torch
        >>> from hf_precision.training.denoiser_rows import example_batch
        >>> unet = _tiny_unet()
        >>> trainable = make_trainable(unet, "lora", 2)
        >>> activations, copies = step_activations(unet, example_batch(unet, 2, side=8), "epsilon", False,
        ...                                        torch.float32)
        >>> activations > 0, copies
        (True, 0)
    """
    import torch

    from ..training.denoiser_rows import model_output, noisy_inputs, row_of

    if checkpointing:
        if not getattr(module, "_supports_gradient_checkpointing", False):
            raise RecipeError(f"--gradient-checkpointing: {type(module).__name__} does not support it")
        module.enable_gradient_checkpointing()
    module.train()
    row = row_of(module)
    meta = {k: with_values(v) if torch.is_tensor(v) else v for k, v in batch.items()}  # masks keep their values
    meta["timesteps"] = torch.zeros(next(iter(meta.values())).shape[0], dtype=torch.long, device="meta")
    # the fp8 copies' dispatch layer sees every op (~6% of a step on meta): only where a float8 tensor can be copied
    float8 = _float8_dtypes()
    fp8 = any(t.dtype in float8 for t in itertools.chain(module.parameters(), module.buffers()))
    # a submodule that sizes its tensors by values (HiDream's experts) runs its meta stand-in (memory.stand_ins)
    with count_live_bytes(grad=True) as live, (held_fp8_copies() if fp8 else contextlib.nullcontext({})) as held, \
            standing_in(module):
        kwargs, target = noisy_inputs(row, module, meta, objective, torch.ones(1000, device="meta"))
        kwargs = cast_floats(kwargs, dtype)  # what the layer's boundary hooks do at the denoiser's entry
        out = module(**kwargs, return_dict=False)
        loss = torch.nn.functional.mse_loss(model_output(out, target, row).float(), target.float())
        del out, kwargs, target
        copies = sum(held.values())
        loss.backward()
        del loss
    grads = sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)
    return max(live.peak - grads, 0), copies  # gradients are counted once, below, with the optimizer


def text_encoder_held(module: Any, batch: int, length: int) -> int:
    """Bytes a trained text encoder's forward on ``batch`` captions of ``length`` tokens (at most its position table)
    leaves alive: what it saved for backward and its output, held while the denoiser's step runs and until backward
    reaches the encoder. Every layer's output is asked for, as SDXL's ``encode_prompt`` reads ``hidden_states[-2]``
    (with autograd on, each is saved by the next layer's norm anyway).

    Example:
        >>> import torch
        >>> from transformers import CLIPTextConfig, CLIPTextModel
        >>> with torch.device("meta"):
        ...     clip = CLIPTextModel(CLIPTextConfig(hidden_size=8, intermediate_size=16, num_hidden_layers=2,
        ...                                         num_attention_heads=2, max_position_embeddings=77))
        >>> _ = make_trainable(clip, "lora", 2)
        >>> text_encoder_held(clip, 2, 1000) == text_encoder_held(clip, 2, 77) > text_encoder_held(clip, 1, 77) > 0
        True
    """
    import torch

    length = min(length, int(getattr(module.config, "max_position_embeddings", length) or length))
    ids = torch.zeros(batch, length, dtype=torch.long, device="meta")
    module.train()
    # a weight's view made in forward (linear's transpose, saved for backward) is counted with its storage's bytes:
    # weights are counted apart, so their storages are left out here
    weights = {t.untyped_storage()._cdata for t in itertools.chain(module.parameters(), module.buffers())}
    with count_live_bytes(grad=True) as live:
        out = module(input_ids=ids, output_hidden_states=True)
        held = live.live - sum(entry[0] for key, entry in live.refs.items() if key in weights)
        del out
    return held


# torch's own words when an op needs values a meta tensor does not have (.item(), .tolist(), nonzero, boolean
# indexing). Anything else raised on meta (a device mix-up, a shape error) is a defect to show, not a model to refuse.
# torch's words for a value read on meta; an op whose output size is its input's values (bincount, nonzero-like ops)
# has no meta kernel at all: "no fake impl or Meta kernel registered"
_NO_VALUES = ("cannot be called on meta tensors", "Cannot copy out of meta tensor", "data-independent implementation",
              "no fake impl or Meta kernel registered")


def reads_values(err: BaseException) -> bool:
    """Whether ``err`` is torch refusing a data-dependent op on the meta device, where nothing has a value.

    Example:
        >>> import torch
        >>> try:
        ...     torch.empty(2, device="meta").sum().item()
        ... except RuntimeError as err:
        ...     reads_values(err)
        True
        >>> try:
        ...     torch.bincount(torch.zeros(3, dtype=torch.long, device="meta"))
        ... except NotImplementedError as err:
        ...     reads_values(err)
        True
        >>> reads_values(RuntimeError("Expected all tensors to be on the same device, but found meta and cpu"))
        False
    """
    return isinstance(err, (RuntimeError, NotImplementedError)) and any(s in str(err) for s in _NO_VALUES)


def _float8_dtypes() -> tuple[Any, ...]:
    """The torch float8 dtypes this library stores weights in."""
    import torch

    from ..dtypes import FLOAT8

    return tuple(getattr(torch, d) for d in FLOAT8)


def store_fp8(module: Any, plan: Any) -> None:
    """Store ``module`` (meta) as the loader stores an fp8 ``plan`` (diffusers' layerwise casting, islands and the
    recipe's skips kept), so the training step on meta computes from upcast copies as the real one does.

    Example:
        >>> import dataclasses, torch
        >>> import hf_precision as hp
        >>> unet = _tiny_unet()
        >>> store_fp8(unet, dataclasses.replace(hp.get_recipe("sd15", device="cpu")["unet"], storage="float8_e4m3fn"))
        >>> torch.float8_e4m3fn in {p.dtype for p in unet.parameters()}
        True
    """
    from ..dtypes import to_torch
    from ..runtime import patches
    from ..runtime.layout import component_islands, layerwise_skip_regexes

    islands = component_islands(plan, module, strict=False)
    patches.store_layerwise(module, to_torch(plan.storage), to_torch(plan.compute),
                            layerwise_skip_regexes(islands, plan.layerwise_skip))


def make_trainable(module: Any, method: str, rank: int) -> int:
    """Make ``module`` trainable as prepare_training would (LoRA adapters, or every weight for ``"full"``, with fp32
    masters); returns the trainable parameter count.

    Example:
        >>> unet = _tiny_unet()
        >>> make_trainable(unet, "lora", 2) < make_trainable(_tiny_unet(), "full", 0)
        True
    """
    import torch

    from ..training.methods import ComponentSetup, method_of

    handler = method_of(method)
    # A full fine-tune computes under autocast from its fp32 masters; meta has no autocast, so the meta module keeps
    # the compute dtype its activations are made in (the masters are counted apart, at 4 bytes each).
    masters = next(module.parameters()).dtype if handler.every_weight else torch.float32
    handler.setup(ComponentSetup("denoiser", module, None, {}, rank, None, None, None, masters))
    return sum(p.numel() for p in module.parameters() if p.requires_grad)


def _tiny_unet() -> Any:
    """A two-block UNet on meta for the examples."""
    import torch
    from diffusers import UNet2DConditionModel

    with torch.device("meta"):
        return UNet2DConditionModel(
            block_out_channels=(8, 16), layers_per_block=1, norm_num_groups=8, cross_attention_dim=8,
            attention_head_dim=2, sample_size=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
            up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"))
