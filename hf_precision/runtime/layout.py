"""Which tensor holds which dtype: the one model of a component's planned dtypes, used by apply, load, plan and check.

Islands are the outermost modules the recipe's ``keep_fp32`` globs match (one matching rule: full match); they
hold float32. With storage == compute every other floating parameter holds that dtype; with storage != compute
(diffusers layerwise casting) the layers diffusers casts per call hold the storage dtype and the rest the compute
dtype. :func:`drift` compares a built component with that model.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import re
from typing import Any

import torch

from .. import dtypes as dt
from ..errors import RecipeError, override_line
from ..recipe.patterns import inside, resolve_islands, suggest
from ..recipe.model import ComponentPolicy
from ..recipe.quantize import is_quantized, stored_bytes
from .patches import layerwise_hook
from .quantize import is_quantized_tensor, quantized_layers

__all__ = ["layerwise_skip_regexes", "dtype_anchors", "component_islands", "check_user_names", "planned_dtypes", "has_layerwise_casting",
           "drift", "Drifted", "planned_bytes", "planned_sizes"]


def layerwise_skip_regexes(islands: list[str], skip: tuple[str, ...]) -> list[str]:
    """The skip patterns for diffusers' layerwise casting (which ``re.search``es names), anchored at both ends to mean
    what the recipe's glob means: island ``time_embedding`` skips it and its children, never
    ``down_blocks.0.time_embedding`` or ``xtime_embedding``.

    Example:
        >>> import re
        >>> rx = layerwise_skip_regexes(["time_embedding"], ("*norm*",))
        >>> [any(re.search(p, n) for p in rx) for n in ["time_embedding", "time_embedding.linear_1",
        ...                                             "down_blocks.0.time_embedding", "xtime_embedding", "mid.norm1"]]
        [True, True, False, False, True]
    """
    return [rf"^{re.escape(i)}(\..*)?$" for i in islands] + ["^" + fnmatch.translate(g) for g in skip]


def dtype_anchors(module: torch.nn.Module) -> list[str]:
    """Modules fp8 storage must leave in the compute dtype because the model's ``dtype`` is read from them.

    transformers' ``PreTrainedModel.dtype`` is the first floating parameter's (modeling_utils.py) and pipelines cast
    prompt embeddings to ``text_encoder.dtype`` (pipeline_flux.py ``_get_clip_prompt_embeds``): fp8 there gives fp8
    latents. So in a non-diffusers model: every ``nn.Embedding`` under each name (tied T5 ``shared`` and
    ``encoder.embed_tokens``), the first floating parameter's owner, and ``_keep_in_fp32_modules`` (T5 reads their
    weight dtype). diffusers' ``ModelMixin.dtype`` reports the compute dtype, but pipelines cast latents to a VAE's
    ``post_quant_conv`` dtype, so that layer stays too.

    Example:
        >>> from transformers import CLIPTextConfig, CLIPTextModel
        >>> te = CLIPTextModel(CLIPTextConfig(vocab_size=50, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
        ...                                   num_attention_heads=2, max_position_embeddings=8))
        >>> [name.rsplit(".", 1)[-1] for name in dtype_anchors(te)]   # the prefix differs by transformers version
        ['token_embedding', 'position_embedding']
    """
    first = next((n for n, p in module.named_parameters() if p.is_floating_point()), None)
    owner = first.rpartition(".")[0] if first else ""
    if type(module).__module__.startswith("diffusers"):
        # pipelines read some dtypes from parameters, not from `.dtype`: latents are cast to
        # `next(self.vae.post_quant_conv.parameters()).dtype` before decoding (pipeline_stable_diffusion_upscale.py
        # and the SDXL pipelines); recipes name other such layers in `layerwise_skip` (cascade.yaml)
        return [n for n, _ in module.named_children() if n == "post_quant_conv"]
    # T5/UMT5 read `wo.weight.dtype` outside the layer and cast their input into it (modeling_t5.py
    # T5DenseGatedActDense): the model's `_keep_in_fp32_modules` stay in the compute dtype even where they are no
    # island (fp32 compute), or the input is cast to fp8 before the hook upcasts the weight
    fp32 = list(getattr(module, "_keep_in_fp32_modules", None) or ())
    names = [n for n, m in module.named_modules(remove_duplicate=False) if n and (
        isinstance(m, torch.nn.Embedding) or (isinstance(m, torch.nn.Linear) and any(k in n.split(".") for k in fp32)))]
    if owner and not inside(owner, names):
        names.append(owner)
    return list(dict.fromkeys(names))


def component_islands(plan: ComponentPolicy, module: torch.nn.Module, *, strict: bool = True) -> list[str]:
    """The float32 islands of a built component under a plan (outermost matched modules; none in fp32)."""
    names = [n for n, _ in module.named_modules() if n]
    keep = list(plan.keep_fp32)
    if not plan.recipe:
        # No component recipe lists this class (composed, or written inline): start from the class's own
        # `_keep_in_fp32_modules`, which diffusers and transformers keep in fp32 whatever the load dtype
        # (diffusers v0.42.1 models/model_loading_utils.py:238) and which the model's code may rely on (Kandinsky 5
        # feeds fp32 sinusoids to `time_embeddings`, transformer_kandinsky.py:169-171).
        for part in getattr(type(module), "_keep_in_fp32_modules", None) or ():
            keep += [n for n in names if n == part or n.endswith("." + part)]
    return resolve_islands(plan.name, tuple(dict.fromkeys(keep)), names, owner=type(module).__name__,
                           active=plan.compute != "float32", strict=strict)


def check_user_names(plan: ComponentPolicy, module: torch.nn.Module) -> None:
    """Refuse ``entry`` names and ``layerwise_skip`` globs the user set that name no module of the component: a
    misspelled entry leaves inputs uncast, a misspelled skip stores norms or embeddings in the storage dtype, silently.

    Example:
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("sdxl", device="t4", overrides={"vae": {"entry": ["decoderr"]}})["vae"]
        >>> check_user_names(plan, torch.nn.ModuleDict({"decoder": torch.nn.Linear(1, 1)}))
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: vae.entry: ['decoderr'] name no module of ModuleDict (overrides dict; \
'decoderr': did you mean ['decoder']?); fix: --set vae.entry=[decoder] (YAML: components: {vae: {entry: [decoder]}})
    """
    names = [n for n, _ in module.named_modules() if n]
    known = set(names)
    problems = []
    for d in plan.decisions:
        if d.field == "entry":
            values, found = list(plan.entry), lambda e: e == "" or e in known
        elif d.field == "layerwise_skip":
            values, found = list(plan.layerwise_skip), lambda p: any(fnmatch.fnmatchcase(n, p) for n in names)
        else:
            continue
        missing = [v for v in values if not found(v)]
        if not missing:
            continue
        close = {m: suggest(m, names) for m in missing}
        hints = "; ".join(f"{m!r}: did you mean {close[m] or 'nothing close'}?" for m in missing)
        fixed = list(dict.fromkeys(close[v][0] if close.get(v) else v for v in values if v not in close or close[v]))
        problems.append(f"{plan.name}.{d.field}: {missing} name no module of {type(module).__name__} ({d.source}; "
                        f"{hints}); fix: {override_line(plan.name, d.field, fixed)}")
    if problems:
        raise RecipeError(problems)


def _layerwise_layers(module: torch.nn.Module, plan: ComponentPolicy, islands: list[str]) -> set[str]:
    """Modules diffusers' ``apply_layerwise_casting`` stores in the storage dtype (its traversal, with our skips);
    none where the plan stores no layer per layer (storage == compute, or a backend's quantized layout)."""
    if plan.storage == plan.compute or is_quantized(plan.storage):
        return set()
    try:
        from diffusers.hooks._common import _GO_LC_SUPPORTED_PYTORCH_LAYERS as supported
    except ImportError:  # older diffusers: the same list
        nn = torch.nn
        supported = (nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.ConvTranspose1d, nn.ConvTranspose2d, nn.ConvTranspose3d, nn.Linear)
    patterns = layerwise_skip_regexes([*islands, *dtype_anchors(module)], plan.layerwise_skip)
    found: set[str] = set()

    def walk(mod: torch.nn.Module, prefix: str) -> None:
        if any(re.search(p, prefix) for p in patterns):
            return
        if isinstance(mod, supported):
            found.add(prefix)
            return
        for child_name, child in mod.named_children():
            walk(child, f"{prefix}.{child_name}" if prefix else child_name)

    walk(module, "")
    return found


def _held_in(owner: str, plan: ComponentPolicy, islands: frozenset[str], layerwise: set[str]) -> str:
    """The floating dtype the tensors of module ``owner`` are held in: float32 in an island, the storage dtype in a
    layer layerwise casting stores (its hook casts the whole layer), else the compute dtype."""
    if inside(owner, islands):
        return "float32"
    return plan.storage if inside(owner, layerwise) else plan.compute


def planned_dtypes(module: torch.nn.Module, plan: ComponentPolicy, islands: list[str]) -> dict[str, str]:
    """Floating parameter name -> the dtype :func:`apply_recipe` keeps it in between forward passes, by the module's rule
    above (meta is enough; tied parameters are listed once).
    """
    layerwise = _layerwise_layers(module, plan, islands)
    converted = frozenset(quantized_layers(module, plan, islands)) if is_quantized(plan.storage) else frozenset()
    held = frozenset(islands)
    out: dict[str, str] = {}
    for pname, param in module.named_parameters():
        owner, _, leaf = pname.rpartition(".")
        if owner in converted and leaf == "weight":
            out[pname] = plan.storage  # a quantized layout (int8, nf4 ...): the backend's tensor, not a dtype
        elif param.is_floating_point():
            out[pname] = _held_in(owner, plan, held, layerwise)
    return out


def has_layerwise_casting(module: torch.nn.Module) -> bool:
    # diffusers refuses to add the hook twice and cannot remove it (its deinitalize_hook raises).
    return any(layerwise_hook(m) is not None for m in module.modules())


@dataclasses.dataclass(frozen=True)
class Drifted:
    """Parameters of one component whose dtype is not the planned one, grouped.

    ``island`` is the float32 island they belong to (``None`` outside islands); ``count`` how many tensors.
    """

    component: str
    island: str | None
    have: str
    want: str
    count: int


def drift(name: str, module: torch.nn.Module, plan: ComponentPolicy, islands: list[str]) -> list[Drifted]:
    """Where a component's parameters left the plan (a ``pipe.to(dtype)`` after loading, a hand cast).

    Example:
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("unet.sdxl", device="t4")["unet"]
        >>> m = torch.nn.Sequential(torch.nn.Linear(2, 2)).to(torch.float16)
        >>> drift("unet", m, plan, []), drift("unet", m.float(), plan, [])
        ([], [Drifted(component='unet', island=None, have='float32', want='float16', count=2)])
    """
    planned = planned_dtypes(module, plan, islands)
    roots = frozenset(islands)
    found: dict[tuple[str | None, str, str], int] = {}
    for pname, param in module.named_parameters():
        want = planned.get(pname)
        have = dt.from_torch(param.dtype) if param.is_floating_point() else None
        if is_quantized_tensor(param):
            # A backend's tensor (the plan's layout, or the caller's own quantization_config, reported at load):
            # what drifts is a planned quantized weight that holds plain values, caught below.
            have = want
        if want is None or have is None or have == want:
            continue
        owner = pname.rpartition(".")[0]
        island = next((i for i in islands if inside(owner, [i])), None) if inside(owner, roots) else None
        found[(island, have, want)] = found.get((island, have, want), 0) + 1
    return [Drifted(name, island, have, want, n) for (island, have, want), n in found.items()]


def planned_sizes(module: torch.nn.Module, plan: ComponentPolicy, islands: list[str]) -> dict[str, tuple[str, int]]:
    """Parameter or buffer name -> (what it is held in, its bytes) under ``plan``: the one byte count ``plan()`` and the
    memory plans share (meta is enough; a tensor held twice is listed once).

    A parameter takes its planned dtype or quantized layout (the backend's exact bytes). Floating buffers, persistent
    or not (PixArt's ``pos_embed``), follow the casts that place the parameters: float32 in an island, else the compute
    dtype, or the storage dtype in a layer layerwise casting stores. Integer and complex tensors keep their dtype.

    Example:
        >>> from hf_precision import get_recipe
        >>> m = torch.nn.Module()
        >>> m.register_buffer("table", torch.zeros(4), persistent=False)
        >>> m.register_buffer("ids", torch.zeros(4, dtype=torch.int64))
        >>> planned_sizes(m, get_recipe("unet.sdxl", device="t4")["unet"], [])
        {'table': ('float16', 8), 'ids': ('int64', 32)}
        >>> plan = get_recipe("unet.sdxl", device="t4", overrides={"unet": {"storage": "int8"}})["unet"]
        >>> planned_sizes(torch.nn.ModuleDict({"blocks": torch.nn.Linear(32, 128)}), plan, [])
        {'blocks.weight': ('int8', 4736), 'blocks.bias': ('float16', 256)}
    """
    planned = planned_dtypes(module, plan, islands)
    layerwise = _layerwise_layers(module, plan, islands)
    held = frozenset(islands)
    out: dict[str, tuple[str, int]] = {}
    for name, param in module.named_parameters():
        want = planned.get(name)
        out[name] = ((want, stored_bytes(want, tuple(param.shape), plan.compute)) if want else
                     (dt.from_torch(param.dtype), param.numel() * param.element_size()))
    for name, buf in module.named_buffers():
        if buf.is_floating_point():
            want = _held_in(name.rpartition(".")[0], plan, held, layerwise)
            out[name] = (want, buf.numel() * dt.to_torch(want).itemsize)
        else:
            out[name] = (dt.from_torch(buf.dtype), buf.numel() * buf.element_size())
    return out


def planned_bytes(module: torch.nn.Module, plan: ComponentPolicy) -> int:
    """The bytes a component's parameters and buffers take under ``plan`` (what ``plan()`` counts), from a
    meta-device model.

    Example:
        >>> from hf_precision import get_recipe
        >>> plan = get_recipe("unet.sdxl", device="t4", overrides={"unet": {"storage": "int8"}})["unet"]
        >>> planned_bytes(torch.nn.ModuleDict({"blocks": torch.nn.Linear(32, 128)}), plan)  # 4736 + fp16 bias
        4992
    """
    islands = component_islands(plan, module, strict=False)
    return sum(size for _, size in planned_sizes(module, plan, islands).values())
