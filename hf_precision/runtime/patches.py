"""What ``apply_recipe`` changes inside diffusers' own modules, one function per technique (as diffusers keeps one
file per hook in ``diffusers/hooks/``): ``force_upcast``, fp32 attention scores, layerwise weight storage (for
training :func:`upcast_on_use`), and stand-ins where a pipeline needs what is missing (ftfy, tiling, CLIP's
``text_model``). Each changes the module in place and returns what it did, for
:class:`~hf_precision.runtime.apply.Applied`.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["upstream_source", "disable_force_upcast", "upcast_attention", "store_layerwise", "layerwise_hook", "retarget_layerwise",
           "upcast_on_use", "upcasts_on_use", "processor_calling", "ftfy_stand_in",
           "tile_where_required", "text_model_alias"]


# set on a module whose shipped force_upcast=True was patched off, so that recipes re-applied later still see it
FORCE_UPCAST_WAS = "_hf_precision_force_upcast_was"


def disable_force_upcast(module: torch.nn.Module) -> bool:
    """Set ``config.force_upcast`` to False where it is True; returns whether it was.

    SDXL/SVD pipelines read the flag and flip the whole VAE to fp32 and back on every call (erasing islands and
    doubling memory); when a recipe owns the VAE dtype, the NaN guard covers overflow instead.

    Example:
        >>> from diffusers import AutoencoderKL
        >>> vae = AutoencoderKL(block_out_channels=(8,), norm_num_groups=8, force_upcast=True)
        >>> disable_force_upcast(vae), vae.config.force_upcast, disable_force_upcast(vae)
        (True, False, False)
    """
    config = getattr(module, "config", None)
    flag = config.get("force_upcast") if isinstance(config, Mapping) else getattr(config, "force_upcast", None)
    if not flag or not hasattr(module, "register_to_config"):
        return False
    module.register_to_config(force_upcast=False)
    setattr(module, FORCE_UPCAST_WAS, True)
    return True


def upcast_attention(module: torch.nn.Module) -> int:
    """Compute attention scores and softmax in fp32 in every diffusers ``Attention`` of ``module``; returns how many.
    SDPA processors ignore ``upcast_attention``, so each gets its SDPA computed in fp32; the classic processor honours
    the flag. Softmax in fp32 fixes half-precision attention on MPS >= 14.5.

    Example:
        >>> from diffusers.models.attention_processor import Attention
        >>> block = torch.nn.Sequential(Attention(query_dim=8, heads=1, dim_head=8))
        >>> upcast_attention(block), block[0].upcast_softmax, type(block[0].processor).__name__
        (1, True, 'AttnProcessor2_0')
    """
    from diffusers.models.attention_processor import Attention, AttnProcessor

    class UpcastAttnProcessor(AttnProcessor):
        """The classic processor with fp32 scores; the mask is made fp32 too (diffusers mixes them in baddbmm)."""

        def __call__(self, attn: Any, hidden_states: Any, encoder_hidden_states: Any = None, attention_mask: Any = None,
                     *args: Any, **kwargs: Any) -> Any:
            if attention_mask is not None and attention_mask.is_floating_point():
                attention_mask = attention_mask.float()
            return super().__call__(attn, hidden_states, encoder_hidden_states, attention_mask, *args, **kwargs)

    count = 0
    for sub in module.modules():
        if isinstance(sub, Attention):
            sub.upcast_attention = sub.upcast_softmax = True
            processor = getattr(sub, "processor", None)
            if processor is None or type(processor) is AttnProcessor:
                sub.set_processor(UpcastAttnProcessor())
            elif not getattr(type(processor), "_fp32_sdpa", False):
                # SDPA processors keep their own call (joint attention in SD3, AuraFlow, CogVideoX; rotary embeddings
                # in Lumina2; 4D masks in HunyuanVideo's token refiner, which the classic processor cannot take),
                # with the SDPA computed in fp32
                processor.__class__ = processor_calling(type(processor), "_fp32_sdpa", torch.nn.functional,
                                                        ("scaled_dot_product_attention",), _sdpa_wrap)
            count += 1
    return count


# (id(owner), name) -> [the function the patch replaced, the dispatcher set in its place, how many calls are inside]
_swapped: dict[tuple[int, str], list[Any]] = {}
_swap_lock = threading.Lock()
_swap_local = threading.local()  # .stacks: (id(owner), name) -> this thread's wrapped functions, innermost last


def _enter(owner: Any, name: str, wrap: Any) -> None:
    """Make ``owner.<name>`` call ``wrap(...)`` in this thread until :func:`_leave`; other threads keep the original.
    Meanwhile ``owner.<name>`` is a dispatcher on the calling thread's stack; the last thread out puts the original
    back, so outside patched calls torch is untouched (nothing for ``torch.compile`` to trace through).
    """
    key = (id(owner), name)
    with _swap_lock:
        entry = _swapped.get(key)
        if entry is None:
            original = getattr(owner, name)

            @functools.wraps(original)
            def dispatch(*args: Any, **kwargs: Any) -> Any:
                stack = getattr(_swap_local, "stacks", {}).get(key)
                return (stack[-1] if stack else original)(*args, **kwargs)

            entry = _swapped[key] = [original, dispatch, 0]
            setattr(owner, name, dispatch)
        entry[2] += 1
    stacks = _swap_local.__dict__.setdefault("stacks", {})
    stack = stacks.setdefault(key, [])
    stack.append(wrap(stack[-1] if stack else entry[0]))


def _leave(owner: Any, name: str) -> None:
    key = (id(owner), name)
    _swap_local.stacks[key].pop()
    with _swap_lock:
        entry = _swapped[key]
        entry[2] -= 1
        if entry[2] == 0:
            if getattr(owner, name) is entry[1]:  # put back only what we set (someone may have replaced it since)
                setattr(owner, name, entry[0])
            del _swapped[key]


@functools.lru_cache(maxsize=None)
def processor_calling(cls: type, marker: str, owner: Any, names: tuple[str, ...], wrap: Any,
                      when: Any = None) -> type:
    """``cls`` (an attention processor class) whose call runs with each ``owner.<name>`` replaced by ``wrap(original)``
    in the calling thread only (``when()``, if given, says whether), and put back after; ``marker`` is set on it.

    diffusers' processors call torch functions directly, so changing one op inside them (SDPA in fp32 on MPS, fp32
    matmuls out of a training autocast) means replacing it for the call; other threads see torch's function, nested
    calls stack, and the processor's signature is kept (``Attention.forward`` passes only the kwargs it names).

    Example:
        >>> from diffusers.models.attention_processor import AttnProcessor2_0
        >>> patched = processor_calling(AttnProcessor2_0, "_doc", torch, ("matmul",), lambda fn: fn)
        >>> patched.__name__, patched._doc, issubclass(patched, AttnProcessor2_0)
        ('AttnProcessor2_0', True, True)
    """
    @functools.wraps(cls.__call__)
    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        if when is not None and not when():
            return cls.__call__(self, *args, **kwargs)
        entered = []
        try:
            for name in names:
                _enter(owner, name, wrap)
                entered.append(name)
            return cls.__call__(self, *args, **kwargs)
        finally:
            for name in reversed(entered):
                _leave(owner, name)

    return type(cls.__name__, (cls,), {"__call__": __call__, marker: True, "__module__": cls.__module__})


def _sdpa_in_fp32(sdpa: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, *args: Any,
                  attn_mask: Any = None, **kwargs: Any) -> torch.Tensor:
    if query.dtype not in (torch.float16, torch.bfloat16):
        return sdpa(query, key, value, *args, attn_mask=attn_mask, **kwargs)
    if isinstance(attn_mask, torch.Tensor) and attn_mask.is_floating_point():
        attn_mask = attn_mask.float()
    return sdpa(query.float(), key.float(), value.float(), *args, attn_mask=attn_mask, **kwargs).to(query.dtype)


_sdpa_wrap = functools.partial(functools.partial, _sdpa_in_fp32)  # one object: processor_calling caches on it


def store_layerwise(module: torch.nn.Module, storage: torch.dtype, compute: torch.dtype, skip: list[str]) -> None:
    """Keep weights in ``storage`` and cast each layer to ``compute`` on use (diffusers' layerwise casting).

    ``skip`` are regular expressions of modules that stay in ``compute`` (the islands and the recipe's
    ``layerwise_skip``; :func:`hf_precision.runtime.layout.layerwise_skip_regexes`).

    Example:
        >>> layer = torch.nn.Sequential(torch.nn.Linear(4, 4))
        >>> store_layerwise(layer, torch.float8_e4m3fn, torch.float32, [])
        >>> layer[0].weight.dtype, layer(torch.ones(1, 4)).dtype
        (torch.float8_e4m3fn, torch.float32)
    """
    from diffusers.hooks import apply_layerwise_casting

    apply_layerwise_casting(module, storage_dtype=storage, compute_dtype=compute, skip_modules_pattern=skip)


def layerwise_hook(layer: torch.nn.Module) -> Any:
    """The layerwise-casting hook diffusers keeps on ``layer`` itself (None when there is none).

    Example:
        >>> layer = torch.nn.Sequential(torch.nn.Linear(4, 4))
        >>> store_layerwise(layer, torch.float8_e4m3fn, torch.float32, [])
        >>> layerwise_hook(layer) is None, layerwise_hook(layer[0]).storage_dtype
        (True, torch.float8_e4m3fn)
    """
    # diffusers' HookRegistry is a plain attribute: reading __dict__ skips ModelMixin.__getattr__ on every module
    return getattr(layer.__dict__.get("_diffusers_hook"), "hooks", {}).get("layerwise_casting")


def retarget_layerwise(module: torch.nn.Module, compute: torch.dtype) -> int:
    """Make the layerwise casting already on ``module`` compute in ``compute``; returns how many layers changed.

    diffusers cannot remove its hook, so a recipe applied again (``prepare_training`` after ``load_pipeline``, a
    training rule picking bf16 where inference picked fp16) changes the dtype the hooks compute in instead.

    Example:
        >>> layer = torch.nn.Sequential(torch.nn.Linear(4, 4))
        >>> store_layerwise(layer, torch.float8_e4m3fn, torch.float16, [])
        >>> retarget_layerwise(layer, torch.float32), layer(torch.ones(1, 4)).dtype
        (1, torch.float32)
    """
    count = 0
    for layer in module.modules():
        hook = layerwise_hook(layer)
        if hook is not None and hook.compute_dtype != compute:
            hook.compute_dtype = compute
            count += 1
    return count


def upcast_on_use(module: torch.nn.Module, compute: torch.dtype) -> int:
    """Let gradients pass through the layers of ``module`` that layerwise casting stores in another dtype (fp8): each
    computes with a fresh ``compute`` copy of its weights; returns how many layers it changed.

    diffusers' hook casts ``.data`` in place and back after the forward, so the weight autograd saved is fp8 by then
    ("expected scalar type Float but found Float8_e4m3fn"). Here the forward reads ``weight.to(compute)``, which
    autograd saves instead; the base stays fp8 with no gradient, as kohya's ``--fp8_base`` and OneTrainer's
    ``LinearFp8`` (modules/module/quantized/LinearFp8.py). The hook keeps diffusers' name and dtype attributes.

    Example:
        >>> layer = torch.nn.Sequential(torch.nn.Linear(4, 4)).requires_grad_(False)  # a frozen base
        >>> store_layerwise(layer, torch.float8_e4m3fn, torch.float32, [])
        >>> upcast_on_use(layer, torch.float32), layer[0].weight.dtype
        (1, torch.float8_e4m3fn)
        >>> x = torch.ones(1, 4, requires_grad=True)
        >>> layer(x).sum().backward(); x.grad.dtype, layer[0].weight.grad
        (torch.float32, None)
    """
    count = 0
    for layer in module.modules():
        hook = layerwise_hook(layer)
        if hook is None or getattr(hook, "upcast_on_use", False):
            continue
        hook.deinitalize_hook = lambda m: m  # diffusers' raises (it would cast back); nothing is cast back here
        registry = layer.__dict__["_diffusers_hook"]
        registry.remove_hook("layerwise_casting", recurse=False)
        registry.register_hook(_upcast_hook_class()(hook.storage_dtype, compute, hook.non_blocking), "layerwise_casting")
        count += 1
    return count


@functools.cache
def _upcast_hook_class() -> type:
    """diffusers' ``LayerwiseCastingHook`` computing from copies (made once: diffusers is imported on first use)."""
    from diffusers.hooks.layerwise_casting import LayerwiseCastingHook

    class UpcastOnUseHook(LayerwiseCastingHook):
        """Computes with ``param.to(compute_dtype)`` copies; the layer's own parameters stay in ``storage_dtype``."""

        upcast_on_use = True

        def pre_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            return args, kwargs

        def post_forward(self, module: torch.nn.Module, output: Any) -> Any:
            return output

        def deinitalize_hook(self, module: torch.nn.Module) -> torch.nn.Module:
            return module  # nothing was cast: the storage is as it was

        def new_forward(self, module: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
            # An instance attribute shadows the parameter of that name (nn.Module looks in _parameters only when
            # normal lookup fails): the layer's own forward reads the copy, module.to() and state_dict the fp8 one.
            shadowed = [n for n, p in module._parameters.items()
                        if p is not None and p.is_floating_point() and p.dtype != self.compute_dtype]
            for name in shadowed:
                module.__dict__[name] = module._parameters[name].to(self.compute_dtype)
            try:
                return self.fn_ref.original_forward(*args, **kwargs)
            finally:
                for name in shadowed:
                    module.__dict__.pop(name, None)

    return UpcastOnUseHook


def upcasts_on_use(layer: torch.nn.Module) -> bool:
    """Whether ``layer`` computes with upcast copies of its stored weights (:func:`upcast_on_use`).

    Example:
        >>> upcasts_on_use(torch.nn.Linear(2, 2))
        False
    """
    return bool(getattr(layerwise_hook(layer), "upcast_on_use", False))


class _PlainText:
    """What ftfy's ``fix_text`` does to a prompt where ftfy is missing, as WanPipeline does it: nothing."""

    @staticmethod
    def fix_text(text: str, *args: Any, **kwargs: Any) -> str:
        return text


def upstream_source(obj: Any) -> str | None:
    """``inspect.getsource(obj)``, without leaving the file's lines in ``linecache``; ``None`` where it cannot be read.

    ``linecache`` keeps every file ``getsource`` reads for the life of the process: reading one pipeline module to
    look for a name cost about 1.6 MB of memory that loading never gave back (measured with tracemalloc on the
    benchmark's SDXL load), more than the whole difference between load_pipeline's and plain diffusers' memory.

    Example:
        >>> "def upstream_source" in upstream_source(upstream_source)
        True
    """
    import inspect
    import linecache

    cached = set(linecache.cache)
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None
    finally:
        for name in set(linecache.cache) - cached:
            linecache.cache.pop(name, None)


def ftfy_stand_in(pipe: Any) -> list[str]:
    """Give the modules of ``pipe``'s class that call ``ftfy.fix_text`` unchecked a stand-in that leaves the text as it is;
    returns those modules. diffusers imports ftfy only where installed and WanPipeline then skips the fix
    (pipeline_wan.py:79), but Wan I2V, VACE, Animate, SkyReels-V2, Allegro and others call it anyway (diffusers 0.42.1
    pipeline_wan_vace.py:111): NameError on every prompt.

    Example:
        >>> class Pipe:  # a module of ours names no ftfy: nothing to stand in for
        ...     pass
        >>> ftfy_stand_in(Pipe())
        []
    """
    import sys

    from diffusers.utils import is_ftfy_available

    if is_ftfy_available():
        return []
    given = []
    for cls in type(pipe).__mro__:
        module = sys.modules.get(cls.__module__)
        if module is None or "ftfy" in vars(module) or not cls.__module__.startswith("diffusers."):
            continue
        if "ftfy.fix_text" in (upstream_source(module) or ""):
            module.ftfy = _PlainText  # type: ignore[attr-defined]
            given.append(cls.__module__)
    return given


def tile_where_required(module: Any) -> bool:
    """Turn tiling on in a VAE that refuses to encode or decode without it (AutoencoderKLAllegro: "Decoding without tiling
    has not been implemented yet", diffusers 0.42.1 autoencoder_kl_allegro.py:804, :841), read from the class's source;
    returns whether it did.

    Example:
        >>> from diffusers import AutoencoderKL, AutoencoderKLAllegro
        >>> tile_where_required(AutoencoderKL(block_out_channels=(8,), norm_num_groups=8))
        False
        >>> vae = AutoencoderKLAllegro(block_out_channels=(8,), norm_num_groups=8, down_block_types=(
        ...     "AllegroDownBlock3D",), up_block_types=("AllegroUpBlock3D",), temporal_downsample_blocks=(False,),
        ...     temporal_upsample_blocks=(False,))
        >>> tile_where_required(vae), vae.use_tiling, tile_where_required(vae)
        (True, True, False)
    """
    if not hasattr(module, "enable_tiling") or getattr(module, "use_tiling", True) or not _runs_only_tiled(type(module)):
        return False
    module.enable_tiling()
    return True


@functools.lru_cache(maxsize=None)
def _runs_only_tiled(cls: type) -> bool:
    for name in ("_encode", "encode", "_decode", "decode"):
        source = upstream_source(getattr(cls, name, None)) or ""
        if "NotImplementedError" in source and "without tiling" in source:
            return True
    return False


# the children of the text transformer that CLIP text encoders used to wrap as ``.text_model``
_TEXT_TRANSFORMER = ("embeddings", "encoder", "final_layer_norm")


def text_model_alias(module: Any) -> bool:
    """Let ``module.text_model`` name ``module`` itself where a CLIP text encoder holds its layers directly; returns
    whether it did.

    transformers 5 flattened CLIPTextModel (no ``text_model`` wrapper), but diffusers still reads
    ``text_encoder.text_model.final_layer_norm`` for ``clip_skip`` (diffusers 0.42.1 pipeline_i2vgen_xl.py:248, on
    every prompt with its default ``clip_skip=1``). The alias is set outside ``_modules`` (no child, no state-dict key,
    no cycle).

    Example:
        >>> from transformers import CLIPTextConfig, CLIPTextModel
        >>> encoder = CLIPTextModel(CLIPTextConfig(hidden_size=8, intermediate_size=8, num_hidden_layers=1,
        ...                                        num_attention_heads=2, vocab_size=50, eos_token_id=2))
        >>> text_model_alias(encoder), encoder.text_model.final_layer_norm is encoder.final_layer_norm
        (True, True)
        >>> text_model_alias(encoder), "text_model" in dict(encoder.named_children())
        (False, False)
    """
    if not isinstance(module, torch.nn.Module) or hasattr(module, "text_model"):
        return False
    children = dict(module.named_children())
    if not all(name in children for name in _TEXT_TRANSFORMER):
        return False
    object.__setattr__(module, "text_model", module)  # not nn.Module.__setattr__: no child module, no cycle
    return True
