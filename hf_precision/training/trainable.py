"""What trains: LoRA adapters, whole components or new token rows, always as fp32 master weights.

peft upcasts adapters to fp32 only through ``get_peft_model``/``PeftModel`` (``autocast_adapter_dtype``); diffusers'
``add_adapter`` goes through ``inject_adapter_in_model``, which gives the adapter the base layer's half dtype, so
GradScaler then raises "Attempting to unscale FP16 gradients" (huggingface/diffusers#6363, #9628; peft
src/peft/tuners/tuners_utils.py ``_move_adapter_to_device_of_base_layer``). Here every trainable parameter is made
fp32 after injection, whatever the path, and :func:`masters_problems` re-checks it before every optimizer step.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from ..runtime.patches import processor_calling
from .rules import TrainingError

__all__ = ["inject_lora", "existing_rank", "default_targets", "accept_input_keyword", "trainable_parameters", "masters_problems",
           "TokenRows", "add_tokens", "AutocastGuard", "guard", "keep_explicit_fp32"]

# Attention projections by naming scheme: diffusers' Attention, CLIP/Llama/Gemma, T5, BERT (HunyuanDiT), Kandinsky 5
# (transformer_kandinsky.py:355-361; its `out_layer` shares its name with the feed-forward's, so it is left out).
_TARGET_SETS = (("to_q", "to_k", "to_v", "to_out.0"), ("q_proj", "k_proj", "v_proj", "out_proj"),
                ("q_proj", "k_proj", "v_proj", "o_proj"), ("q", "k", "v", "o"), ("query", "key", "value"),
                ("to_query", "to_key", "to_value"))


def default_targets(module: torch.nn.Module) -> list[str]:
    """The attention projections of ``module`` that LoRA targets by default (the first naming scheme it uses).

    Example:
        >>> from diffusers.models.attention_processor import Attention
        >>> default_targets(Attention(query_dim=8, heads=1, dim_head=8))
        ['to_q', 'to_k', 'to_v', 'to_out.0']
    """
    names = [n for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)]
    for targets in _TARGET_SETS:
        if sum(any(n == t or n.endswith("." + t) for n in names) for t in targets) >= 3:
            return list(targets)
    raise TrainingError(f"{type(module).__name__}: found none of the usual attention projections "
                        f"({'; '.join(', '.join(t) for t in _TARGET_SETS)}); pass lora=LoraConfig(target_modules=[...])")


def inject_lora(name: str, module: torch.nn.Module, config: Any) -> None:
    """Add a LoRA adapter ``default`` as diffusers' training examples do: ``add_adapter`` on diffusers models (the
    layout ``pipe.load_lora_weights`` reads), peft's ``inject_adapter_in_model`` on the rest (text encoders)."""
    from diffusers import ModelMixin
    from peft import inject_adapter_in_model

    try:
        if isinstance(module, ModelMixin) and hasattr(module, "add_adapter"):  # PixArt and SVD models have no loader
            module.add_adapter(config)
        else:  # transformers' add_adapter wants a newer peft than diffusers does; peft's own path works for both
            inject_adapter_in_model(config, module)
    except ValueError as err:  # peft: no module matched, or one that LoRA cannot wrap (a Sequential, a FeedForward)
        first = str(err).splitlines()[0][:300]
        raise TrainingError(f"train: {name}: lora target_modules={getattr(config, 'target_modules', None)!r} does not fit "
                            f"{type(module).__name__} ({first}); name its nn.Linear / nn.Conv layers (e.g. "
                            f"{_targets_hint(module)}) or 'all-linear'") from err


def accept_input_keyword(module: torch.nn.Module) -> None:
    """Let the LoRA-wrapped projections of AnimateDiff's motion transformers take ``input=`` (idempotent). Example:
        >>> accept_input_keyword(torch.nn.Linear(2, 2))  # no motion transformer: nothing to do
    """
    # AnimateDiff's motion transformer calls its projections as self.proj_in(input=x) (unet_motion_model.py), and
    # peft's LoRA Linear takes forward(x): "Linear.forward() missing 1 required positional argument: 'x'"
    def positional(layer: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        if not args and "input" in kwargs:
            return (kwargs.pop("input"),), kwargs
        return None

    for parent in module.modules():
        if type(parent).__name__ != "AnimateDiffTransformer3D":
            continue
        for child in (getattr(parent, "proj_in", None), getattr(parent, "proj_out", None)):
            if child is not None and hasattr(child, "base_layer") and not getattr(child, "_hp_input_keyword", False):
                child.register_forward_pre_hook(positional, with_kwargs=True)
                child._hp_input_keyword = True


def _targets_hint(module: torch.nn.Module) -> list[str] | None:
    try:
        return default_targets(module)
    except TrainingError:
        return None


def existing_rank(module: torch.nn.Module) -> int | None:
    """The rank of a LoRA adapter already in ``module`` (None when there is none)."""
    for name, param in module.named_parameters():
        if ".lora_A." in name and param.dim() >= 2:
            return int(param.shape[0])
    return None


def trainable_parameters(modules: Iterable[tuple[str, torch.nn.Module]]) -> list[tuple[str, torch.nn.Parameter]]:
    """(component.parameter name, parameter) of every parameter that requires grad."""
    return [(f"{c}.{n}", p) for c, m in modules for n, p in m.named_parameters() if p.requires_grad]


def masters_problems(named: Sequence[tuple[str, torch.Tensor]], allowed: torch.dtype) -> list[str]:
    """The trainable parameters that are not in the master dtype (what a validation or resume cast leaves behind)."""
    return [f"{n} is {str(p.dtype).removeprefix('torch.')}" for n, p in named if p.dtype != allowed]


class TokenRows(torch.nn.Embedding):
    """An input-embedding table whose new rows train in their own fp32 parameter, the old rows frozen; the output is
    in the table's dtype, so half layer norms behind it never see fp32 (Nerogar/OneTrainer#752)."""

    def __init__(self, base: torch.nn.Embedding, ids: Sequence[int], init: torch.Tensor, master_dtype: torch.dtype):
        super().__init__(base.num_embeddings, base.embedding_dim, padding_idx=base.padding_idx, device="meta")
        self.weight = base.weight
        self.weight.requires_grad_(False)
        self.ids = list(ids)
        slot = torch.full((base.num_embeddings,), -1, dtype=torch.long, device=base.weight.device)
        slot[torch.tensor(self.ids, device=slot.device)] = torch.arange(len(self.ids), device=slot.device)
        self.register_buffer("slot", slot, persistent=False)
        self.rows = torch.nn.Parameter(init.detach().to(device=base.weight.device, dtype=master_dtype).clone())

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        out = torch.nn.functional.embedding(ids, self.weight, self.padding_idx)
        slot = self.slot[ids]
        new = slot >= 0
        if not bool(new.any()):
            return out
        picked = torch.nn.functional.embedding(slot.clamp(min=0), self.rows).to(out.dtype)
        return torch.where(new.unsqueeze(-1), picked, out)

    def merged(self) -> torch.Tensor:
        """The full table with the trained rows written in (what a plain text encoder would hold)."""
        table = self.weight.detach().clone()
        table[self.ids] = self.rows.detach().to(table.dtype)
        return table


def add_tokens(tokenizer: Any, encoder: torch.nn.Module, tokens: Sequence[str], init: Sequence[str] | None,
               master_dtype: torch.dtype) -> TokenRows:
    """Add ``tokens`` to a tokenizer and its text encoder; their rows (initialised from ``init`` words) train."""
    if tokenizer is None:
        raise TrainingError("textual inversion: the pipeline has no tokenizer for this text encoder; pass a pipeline")
    if isinstance(encoder.get_input_embeddings(), TokenRows):
        raise TrainingError("textual inversion: this text encoder already trains new rows; add all tokens at once")
    known = len(tokenizer)
    added = tokenizer.add_tokens(list(tokens))
    if added != len(tokens):
        raise TrainingError(f"textual inversion: some of {list(tokens)} are already in the tokenizer; choose new "
                            f"placeholder strings such as '<my-cat>'")
    ids = tokenizer.convert_tokens_to_ids(list(tokens))
    table = encoder.get_input_embeddings()
    if max(ids) >= table.num_embeddings:  # a table smaller than the tokenizer grows; a larger one has free rows
        encoder.resize_token_embeddings(max(ids) + 1)
        table = encoder.get_input_embeddings()
    with torch.no_grad():
        if init:
            if len(init) != len(tokens):
                raise TrainingError(f"textual inversion: init_tokens {list(init)} must give one word per new token {list(tokens)}")
            start_ids = [tokenizer.convert_tokens_to_ids(tokenizer.tokenize(w))[0] for w in init]
            start = table.weight[start_ids].float()
        else:
            start = table.weight[:known].float().mean(0, keepdim=True).expand(len(tokens), -1)
        table.weight[ids] = start.to(table.weight.dtype)
    rows = TokenRows(table, ids, start, master_dtype)
    encoder.set_input_embeddings(rows)
    return rows


class AutocastGuard:
    """Forward hooks that set autocast inside one module and restore the caller's state after it, so an outer
    ``torch.autocast`` never forces fp16 kernels onto an fp32 VAE or island (kohya-ss/sd-scripts PR #2322)."""

    def __init__(self, device_type: str, dtype: torch.dtype | None):
        self.device_type, self.dtype = device_type, dtype
        self.saved: list[tuple[bool, torch.dtype]] = []

    def pre(self, module: torch.nn.Module, args: Any) -> None:
        dt = self.device_type
        self.saved.append((torch.is_autocast_enabled(dt), torch.get_autocast_dtype(dt)))
        torch.set_autocast_enabled(dt, self.dtype is not None)
        if self.dtype is not None:
            torch.set_autocast_dtype(dt, self.dtype)

    def post(self, module: torch.nn.Module, args: Any, out: Any) -> None:
        if self.saved:
            enabled, dtype = self.saved.pop()
            torch.set_autocast_enabled(self.device_type, enabled)
            torch.set_autocast_dtype(self.device_type, dtype)
            if not enabled and self.dtype is not None:
                # as leaving `with torch.autocast` does: its half copies of the masters predate the optimizer step
                torch.clear_autocast_cache()


def guard(module: torch.nn.Module, device_type: str, dtype: torch.dtype | None, inside: bool = False) -> list[Any]:
    """Attach an :class:`AutocastGuard` to ``module``; returns the removable handles.

    ``inside=True`` (a whole component) sets the state inside ``forward`` itself: accelerate's ``prepare`` wraps the
    forward in its own ``torch.autocast``, which runs after forward hooks (fp16 weights under its bf16 fail: "mixed
    dtype (CPU): expect parameter to have scalar type of Float").
    """
    g = AutocastGuard(device_type, dtype)
    if inside:
        return [_GuardedForward(module, g)]
    return [module.register_forward_pre_hook(g.pre), module.register_forward_hook(g.post, always_call=True)]


class _GuardedForward:
    """``module.forward`` replaced by one that runs the class's forward under ``guard`` (removable)."""

    def __init__(self, module: torch.nn.Module, g: AutocastGuard):
        self.module, self.previous = module, module.__dict__.get("forward")
        inner = module.forward

        # wraps the class's function: inspect.signature(module.forward) stays the model's (pipelines read it)
        @functools.wraps(type(module).forward)
        def forward(this: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            g.pre(this, args)
            try:
                return inner(*args, **kwargs)
            finally:
                g.post(this, args, None)

        self.forward = types.MethodType(forward, module)
        module.forward = self.forward

    def remove(self) -> None:
        if self.module.__dict__.get("forward") is self.forward:  # not when something wrapped it since
            if self.previous is None:
                del self.module.forward
            else:
                self.module.forward = self.previous


def keep_explicit_fp32(module: torch.nn.Module) -> int:
    """Let the attention processors of a fully fine-tuned ``module`` keep the fp32 math they ask for under autocast;
    returns how many. Autocast recasts the matmuls a processor runs on ``.float()`` tensors: Sana's linear attention
    (attention_processor.py ``SanaLinearAttnProcessor2_0``, a division by sum + 1e-15) gives NaN in fp16. Inside each
    processor an all-fp32 matmul runs with autocast off; the projections still autocast.

    Example:
        >>> from diffusers.models.attention_processor import Attention
        >>> keep_explicit_fp32(torch.nn.Sequential(Attention(query_dim=8, heads=1, dim_head=8)))
        1
    """
    from diffusers.models.attention_processor import Attention

    count = 0
    for sub in module.modules():
        processor = getattr(sub, "processor", None) if isinstance(sub, Attention) else None
        if processor is not None and not getattr(type(processor), "_explicit_fp32", False):
            stays = functools.partial(functools.partial, _fp32_stays_fp32)  # wraps each matmul torch has
            processor.__class__ = processor_calling(type(processor), "_explicit_fp32", torch, _MATMULS, stays,
                                                    lambda: any(map(torch.is_autocast_enabled, ("cpu", "cuda", "mps"))))
            count += 1
    return count


def norms_in_weight_dtype(module: torch.nn.Module) -> list[Any]:
    """Hand each ``torch.nn.RMSNorm`` of a fully fine-tuned ``module`` its input in its weight's dtype; the handles.

    CPU autocast leaves ``rms_norm`` out of its cast lists: an fp16 activation meets the fp32 master and torch leaves
    its fused kernel warning "Mismatch dtype between input and weight" (Wan's ``norm_q``/``norm_k``); the fallback
    returns fp32 anyway, so casting first is the same math, as autocast's fp32 list does for ``layer_norm``.

    Example:
        >>> norm = torch.nn.RMSNorm(4)
        >>> handles = norms_in_weight_dtype(torch.nn.Sequential(norm))
        >>> norm(torch.ones(1, 4, dtype=torch.float16)).dtype
        torch.float32
    """
    def cast(norm: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        weight, x = norm.weight, args[0] if args else None
        if weight is None or not isinstance(x, torch.Tensor) or x.dtype == weight.dtype or not x.is_floating_point():
            return None
        return (x.to(weight.dtype), *args[1:])

    return [sub.register_forward_pre_hook(cast) for sub in module.modules() if isinstance(sub, torch.nn.RMSNorm)]


_MATMULS = ("matmul", "bmm", "baddbmm")


def _fp32_stays_fp32(fn: Any, *args: Any, **kwargs: Any) -> Any:
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    if tensors and all(t.dtype == torch.float32 for t in tensors):
        with torch.autocast(tensors[0].device.type, enabled=False):
            return fn(*args, **kwargs)
    return fn(*args, **kwargs)
