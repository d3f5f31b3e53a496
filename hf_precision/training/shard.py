"""Sharded training (FSDP2) under the recipe: each shard unit gets the dtypes the plan gives its modules.

``prepare_training(..., shard=True)`` under ``torchrun`` or ``accelerate launch`` (one process per device; gloo on
the CPU) puts ``torch.distributed.fsdp.fully_shard`` on every component that trains:

- one unit per block (items of the outermost ``ModuleList``s, and a ``mid_block``), and the component for the rest;
- each fp32 island a unit of its own with ``param_dtype=float32`` (output in the compute dtype, as the recipe's island
  hook hands it over), so no block policy casts it to half;
- ``param_dtype``: a full fine-tune's compute dtype (the fp32 masters are all-gathered in it); a LoRA's ``None``
  (each parameter gathered in its planned dtype, so it computes as in the one-process plan);
- ``reduce_dtype=float32`` (gradients averaged in fp32); ``output_dtype`` the recipe's hand-over dtype.

Each rank holds 1/N of the fp32 masters, their gradients and optimizer state; a frozen component is sharded or
replicated as :func:`frozen_choice` decides (``train --plan --processes N --shard`` prints the same decision).

fp16 keeps the GradScaler: torch's DTensor dispatch reduces the found-inf flag with max over the mesh
(torch/distributed/tensor/_dispatch.py, ``found_inf_reduce_handler``), so a step is skipped on every rank or on none
(tests/test_train_shard.py). FSDP2 shards plain tensors only: quantized and fp8 storage in a trainable component is
refused before loading (:func:`refuse_unshardable`).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import torch

from .. import dtypes as dt
from ..recipe.quantize import is_quantized
from ..units import format_bytes
from .methods import method_of
from .rules import TrainingError

__all__ = ["ShardUnit", "ShardPlan", "FrozenChoice", "block_paths", "frozen_choice", "rank_share", "plan_units", "refuse_unshardable", "shard_training",
           "shard_problems", "sharded_bytes", "full_state", "init_group"]


@dataclasses.dataclass(frozen=True)
class ShardUnit:
    """One ``fully_shard`` call: module path (``component`` or ``component.sub``) and its MixedPrecisionPolicy."""

    path: str
    role: str  # "island", "block" or "root"
    param_dtype: str | None
    reduce_dtype: str
    output_dtype: str | None

    def policy(self) -> Any:
        from torch.distributed.fsdp import MixedPrecisionPolicy

        return MixedPrecisionPolicy(param_dtype=_torch(self.param_dtype), reduce_dtype=_torch(self.reduce_dtype),
                                    output_dtype=_torch(self.output_dtype))


@dataclasses.dataclass(frozen=True)
class FrozenChoice:
    """How one frozen component is held over the ranks (:func:`frozen_choice`), the bytes of either way, and why."""

    component: str
    sharded: bool
    whole: int  # its weights in their storage dtype: what a rank holds replicated
    share: int  # one rank's shard of them
    running: int  # gathered on top of the shard while it runs: its own parameters and its two largest blocks
    why: str

    @property
    def held(self) -> int:
        """Bytes one rank holds of it between its calls, as chosen."""
        return self.share if self.sharded else self.whole

    def __str__(self) -> str:
        return f"{self.component}: {'sharded in its storage dtype' if self.sharded else 'replicated'} ({self.why})"


@dataclasses.dataclass
class ShardPlan:
    """What :func:`shard_training` sharded (units, world size), and each frozen component's choice with the reason."""

    world: int
    units: list[ShardUnit]
    frozen: dict[str, FrozenChoice]

    def __str__(self) -> str:
        lines = [f"sharded over {self.world} process(es) (FSDP2):"]
        for comp in dict.fromkeys(u.path.split(".")[0] for u in self.units):
            own = [u for u in self.units if u.path.split(".")[0] == comp]
            blocks = sum(u.role == "block" for u in own)
            root = next(u for u in own if u.role == "root")
            islands = [u.path.split(".", 1)[1] for u in own if u.role == "island"]
            lines.append(f"  {comp}: {blocks} block units + the component, params in "
                         f"{root.param_dtype or 'their planned dtypes'}, reduce {root.reduce_dtype}, out "
                         f"{root.output_dtype}" + (f"; fp32 island units: {', '.join(islands)}" if islands else ""))
        lines += [f"  {choice}" for choice in self.frozen.values()]
        return "\n".join(lines)


def _torch(name: str | None) -> torch.dtype | None:
    return None if name is None else dt.to_torch(name)


def block_paths(module: torch.nn.Module) -> list[str]:
    """The blocks of ``module`` a shard unit each: items of its outermost ``ModuleList``s, and any ``mid_block``.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> block_paths(make_pipeline("sd15").unet)
        ['down_blocks.0', 'down_blocks.1', 'up_blocks.0', 'up_blocks.1', 'mid_block']
    """
    mids = [name for name, sub in module.named_children()
            if name.endswith("mid_block") and sub is not None and any(True for _ in sub.parameters())]
    found: list[str] = []
    taken = list(mids)
    for name, sub in module.named_modules():
        if not name or any(name == t or name.startswith(t + ".") for t in taken):
            continue
        if isinstance(sub, torch.nn.ModuleList):
            items = [f"{name}.{i}" for i, item in enumerate(sub) if any(True for _ in item.parameters())]
            if items:
                found += items
                taken.append(name)
    return found + mids


def rank_share(params: Iterable[torch.Tensor], world: int, dtype_bytes: int | None = None, rank: int = 0) -> int:
    """Bytes rank ``rank`` holds of ``params`` sharded over ``world`` as FSDP2's ``torch.chunk`` along dim 0 does (rank
    0's share is the largest: the plan's figure); ``dtype_bytes`` overrides the element size (fp32 masters).

    Example:
        >>> [rank_share([torch.empty(5, 2)], 3, rank=r) for r in range(3)]  # rows 5 over 3: 2, 2 and 1 rows of 2 fp32
        [16, 16, 8]
    """
    total = 0
    for p in params:
        rows = p.shape[0] if p.dim() > 0 else 1
        rest = p.numel() // max(rows, 1) if p.dim() > 0 else 1
        chunk = -(-rows // world)
        total += max(0, min(chunk, rows - rank * chunk)) * rest * (dtype_bytes or p.element_size())
    return total


def frozen_choice(name: str, module: torch.nn.Module, world: int, *, weight_bytes: int | None = None,
                  cached: bool = False) -> FrozenChoice:
    """Shard frozen component ``name`` over ``world`` ranks, or replicate it: whichever one rank holds less of.

    Sharded, a rank holds its 1/N plus, while it runs, its own parameters and two blocks whole (FSDP2 gathers one and
    prefetches the next). ``weight_bytes``: the weights' storage bytes when ``module`` is built in another dtype (a
    meta module); ``cached``: it leaves the device after the cache pass, so it stays whole for that pass.

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> pipe = make_pipeline("sd15")
        >>> print(frozen_choice("text_encoder", pipe.text_encoder, 8, cached=True))  # doctest: +ELLIPSIS
        text_encoder: replicated (its outputs are cached: ...)
    """
    params = list(module.parameters())
    whole = sum(p.numel() * p.element_size() for p in params)
    scale = weight_bytes / whole if weight_bytes and whole else 1.0
    blocks = [sum(p.numel() * p.element_size() for p in module.get_submodule(b).parameters())
              for b in block_paths(module)]
    share = int(rank_share(params, max(world, 1)) * scale)
    running = int((whole - sum(blocks) + sum(sorted(blocks)[-2:])) * scale)
    sharded, replicated = share + running, int(whole * scale)
    if world <= 1:
        why = "one process: nothing to shard over"
    elif cached:
        why = "its outputs are cached: it runs in the cache pass only and leaves the device after it"
    elif sharded < replicated:
        why = (f"{_size(sharded)} per rank sharded (its 1/{world}, and its own parameters and two blocks whole while "
               f"it runs) against {_size(replicated)} whole")
    else:
        why = (f"sharded it would hold {_size(sharded)} per rank (its own parameters and two of its {len(blocks)} "
               f"blocks whole while it runs), not less than the {_size(replicated)} of all of it")
    return FrozenChoice(name, world > 1 and not cached and sharded < replicated, replicated, share, running, why)


def _size(n: int) -> str:
    return format_bytes(n, binary=True)


def plan_units(recipe: Any, kinds: Mapping[str, str], islands: Mapping[str, list[str]],
               modules: Mapping[str, torch.nn.Module]) -> list[ShardUnit]:
    """The shard units of every component that trains, innermost first (meta modules too: the memory plan's).

    Example:
        >>> from hf_precision.testing import make_pipeline
        >>> from hf_precision.recipe import get_recipe
        >>> pipe = make_pipeline("sdxl")
        >>> units = plan_units(get_recipe("sdxl", device="t4"), {"unet": "full"}, {"unet": ["time_embedding"]},
        ...                    {"unet": pipe.unet})
        >>> [(u.path, u.param_dtype) for u in units if u.role != "block"]
        [('unet.time_embedding', 'float32'), ('unet', 'float16')]
    """
    units: list[ShardUnit] = []
    for comp, kind in kinds.items():
        method = method_of(kind)
        if not method.trains_weights or comp not in modules:
            continue
        plan = recipe[comp] if comp in recipe else None
        compute = plan.compute if plan is not None else "float32"
        hand_over = plan.handed_over if plan is not None and plan.handed_over in dt.DTYPES else None
        param = compute if method.every_weight else None
        own = [i for i in islands.get(comp, []) if any(True for _ in modules[comp].get_submodule(i).parameters())]
        for island in own:
            units.append(ShardUnit(f"{comp}.{island}", "island", "float32", "float32", compute))
        for block in block_paths(modules[comp]):
            if any(block == i or block.startswith(i + ".") for i in own):
                continue  # inside an island: the island is the unit
            units.append(ShardUnit(f"{comp}.{block}", "block", param, "float32", None))
        units.append(ShardUnit(comp, "root", param, "float32", hand_over))
    return units


def refuse_unshardable(recipe: Any, train: Mapping[str, str]) -> None:
    """One TrainingError, before loading, for what FSDP2 cannot shard: quantized or fp8 storage, textual inversion.

    Example:
        >>> from hf_precision import get_recipe
        >>> r = get_recipe("sd15", device="cpu", overrides={"unet": {"storage": "float8_e4m3fn"}})
        >>> refuse_unshardable(r, {"unet": "lora"})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.training.rules.TrainingError: shard: unet is stored in float8_e4m3fn, which FSDP2 cannot shard ...
    """
    problems = []
    for comp, kind in train.items():
        method = method_of(kind)
        storage = recipe[comp].storage if comp in recipe else None
        if method.trains_weights and storage is not None and (is_quantized(storage) or storage in dt.FLOAT8):
            problems.append(f"shard: {comp} is stored in {storage}, which FSDP2 cannot shard (fully_shard splits plain "
                            f"tensors; the backend's quantized/fp8 tensor subclasses have no sharded form); train it "
                            f"without sharding (one process, or data parallel: accelerate launch --multi_gpu), or load "
                            f"{comp} in float16/bfloat16 to shard it")
        problem = method.shard_problem(comp, storage)
        if problem:
            problems.append(problem)
    if problems:
        raise TrainingError(problems)


def init_group(device_type: str = "cpu") -> Any:
    """The launcher's default process group, or a 1-process one without a launcher; nccl for CUDA, else gloo."""
    import torch.distributed as dist

    if not dist.is_available():
        raise TrainingError("shard=True: this torch build has no torch.distributed; install a build with it")
    if not dist.is_initialized():
        backend = "nccl" if device_type == "cuda" else "gloo"
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
            dist.init_process_group(backend)
        else:
            from socket import socket

            with socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    return dist.group.WORLD


def shard_training(tp: Any, cached: bool = False) -> ShardPlan:
    """Put ``fully_shard`` on a prepared plan's trainable components, unit by unit, and on the frozen ones
    :func:`frozen_choice` shards (none when ``cached``: they leave the device after the cache pass)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    refuse_unshardable(tp.recipe, tp.kinds)
    init_group(tp.device.type)
    world = dist.get_world_size()
    mesh = init_device_mesh(tp.device.type, (world,))
    comps = tp.components
    units = plan_units(tp.recipe, tp.kinds, tp.applied.islands, comps)
    if not units:
        raise TrainingError(f"shard=True: nothing trains as 'lora' or 'full' in this plan (train: {tp.kinds}); "
                            f"there is nothing to shard")
    for unit in units:
        comp, _, sub = unit.path.partition(".")
        module = comps[comp].get_submodule(sub) if sub else comps[comp]
        _own_outputs(module)
        fully_shard(module, mesh=mesh, mp_policy=unit.policy())
    frozen = {}
    trained = {u.path.split(".")[0] for u in units}
    for name, module in comps.items():
        if name in trained or not any(True for _ in module.parameters()):
            continue
        frozen[name] = choice = frozen_choice(name, module, world, cached=cached)
        if choice.sharded:
            _shard_frozen(module, mesh)
    tp._trainable = tp._names = None  # the parameters are now DTensor shards: the caches are rebuilt from them
    return ShardPlan(world, units, frozen)


def _shard_frozen(module: torch.nn.Module, mesh: Any) -> None:
    """Shard a frozen component per block, gathered as stored; its encode/decode gather it as its forward does."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

    policy = MixedPrecisionPolicy(param_dtype=None, reduce_dtype=None, output_dtype=None)
    for block in block_paths(module):
        _own_outputs(module.get_submodule(block))
        fully_shard(module.get_submodule(block), mesh=mesh, mp_policy=policy)
    _own_outputs(module)
    fully_shard(module, mesh=mesh, mp_policy=policy)
    for method in ("encode", "decode", "get_text_features"):
        if callable(getattr(module, method, None)):
            register_fsdp_forward_method(module, method)


def _view_free(module: torch.nn.Module, args: Any, output: Any) -> Any:
    if not torch.is_grad_enabled():
        return None  # FSDP2 registers no backward hook without grad: nothing to protect
    from torch.distributed.utils import _apply_to_tensors

    return _apply_to_tensors(lambda t: t.clone() if t._base is not None and t.requires_grad else t, output)


def _own_outputs(module: torch.nn.Module) -> None:
    """Make ``module``'s grad-carrying outputs tensors of their own, not views, before FSDP2 hooks them.

    FSDP2 registers its pre-backward hook on each output and warns when one is a view: an in-place op on it
    (``x += y`` downstream) drops the hook silently. Flux's single blocks return two slices of one tensor and Wan's
    transformer a reshaped view, so every step warned. Registered before ``fully_shard``, this hook runs just before
    FSDP2's and copies only the views (the base they were sliced from is then free).

    Example:
        >>> m = torch.nn.Linear(2, 4)
        >>> _ = m.register_forward_hook(lambda mod, args, out: out[:, :2])  # a block returning a slice
        >>> _own_outputs(m)
        >>> m(torch.ones(1, 2))._base is None
        True
    """
    module.register_forward_hook(_view_free)


def _units(tp: Any) -> Iterator[tuple[ShardUnit, torch.nn.Module]]:
    comps = tp.components
    for unit in tp.shard.units:
        comp, _, sub = unit.path.partition(".")
        if comp in comps:
            yield unit, comps[comp].get_submodule(sub) if sub else comps[comp]


def shard_problems(tp: Any) -> list[str]:
    """Shard units whose policy or shards differ from the plan (``tp.check()`` reports them), naming the module."""
    from torch.distributed.fsdp import FSDPModule

    problems: list[str] = []
    if getattr(tp, "shard", None) is None:
        return problems
    for unit, module in _units(tp):
        if not isinstance(module, FSDPModule):
            problems.append(f"{unit.path}: not sharded, the plan makes it a shard unit ({unit.role}); re-run "
                            f"prepare_training(..., shard=True) on a fresh pipeline")
            continue
        group = module._get_fsdp_state()._fsdp_param_group
        if group is None:
            continue
        got = group.mp_policy.param_dtype
        want = _torch(unit.param_dtype)
        if got != want:
            problems.append(f"{unit.path}: shard unit computes in {_name(got)} (MixedPrecisionPolicy.param_dtype), "
                            f"the plan says {_name(want)}" + (" (fp32 island)" if unit.role == "island" else "")
                            + "; re-shard with the plan's policy (prepare_training(..., shard=True))")
        for fsdp_param in group.fsdp_params:
            local = fsdp_param.sharded_param
            if unit.role == "island" and local.dtype != torch.float32:
                problems.append(f"{unit.path}.{fsdp_param._param_fqn or ''}: shard is {_name(local.dtype)} inside "
                                f"the fp32 island; re-run prepare_training".replace("..", "."))
    return problems


def _name(dtype: torch.dtype | None) -> str:
    return "each parameter's own dtype" if dtype is None else str(dtype).removeprefix("torch.")


def sharded_bytes(module: torch.nn.Module) -> tuple[int, int]:
    """(bytes this rank holds, bytes of the whole) of the sharded parameters of ``module``.

    Example:
        >>> sharded_bytes(torch.nn.Linear(2, 2))  # nothing sharded
        (0, 0)
    """
    from torch.distributed.tensor import DTensor

    local = whole = 0
    for p in module.parameters():
        if isinstance(p, DTensor):
            local += p.to_local().numel() * p.element_size()
            whole += p.numel() * p.element_size()
    return local, whole


def full_state(module: torch.nn.Module, only: str | None = None) -> dict[str, torch.Tensor]:
    """The whole state of a sharded ``module`` on the CPU of every rank (a collective), names containing ``only``."""
    from torch.distributed.tensor import DTensor

    out = {}
    for name, value in module.state_dict().items():
        if only is not None and only not in name:
            continue
        value = value.full_tensor() if isinstance(value, DTensor) else value
        out[name] = value.detach().cpu()
    return out
