"""How each way of training a component is set up: one registered handler per method, one file each.

``train={"unet": "lora"}`` names a method; the training layer and the program (``train --method NAME``) ask its
handler (:func:`method_of`) instead of comparing names. A new method is one file that subclasses :class:`Method` and
calls :func:`register_method` (the shape of peft's ``register_peft_method``, ``peft/tuners/lora/__init__.py``).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

__all__ = ["Method", "ComponentSetup", "register_method", "method_of", "method_names", "program_methods", "make_masters"]

_BUILT_IN = ("lora", "full", "embedding", "frozen")
_REGISTRY: dict[str, "Method"] = {}


@dataclasses.dataclass
class ComponentSetup:
    """What a handler's :meth:`Method.setup` reads and fills for one component."""

    name: str
    module: Any
    holder: Any
    recipe: Any
    rank: int
    lora: Any
    tokens: list[str] | None
    init_tokens: list[str] | None
    master_dtype: Any
    lora_rank: int | None = None  # filled by the LoRA handler
    token_rows: Any = None  # filled by the embedding handler


class Method:
    """A way of training a component. Subclasses set the flags and override the hooks they need."""

    name = ""
    trains_weights = False  # gradients reach the component's weights: masters, a compute choice, a shard unit
    # its masters are the component's own weights (a full fine-tune), not added ones: they meet under autocast
    every_weight = False
    saves_adapter = False  # its result is a LoRA adapter (tp.save_lora)
    takes_tokens = False  # it trains new tokens, given with tokens= (textual inversion)
    program = True  # `hf-precision train --method NAME` offers it
    selected_by: str | None = None  # the program setting whose value picks this method when --method is not given

    def owns(self, parameter: str) -> bool:
        """Whether the parameter of this name trains (becomes a master)."""
        return False

    def setup(self, s: ComponentSetup) -> None:
        """Make the component trainable this way: what it owns becomes ``master_dtype`` masters, the rest frozen."""
        make_masters(s.module, self.name, s.master_dtype)

    def label(self, tp: Any, component: str) -> str:
        """The plan table's ``train`` cell."""
        return self.name

    def storage_text(self, plan: Any) -> str:
        """The plan table's ``storage`` cell."""
        return plan.storage

    def storage_problem(self, component: str, storage: str, compute: str) -> str | None:
        """Why this method cannot train weights kept in ``storage`` (None: it can)."""
        return None

    def shard_problem(self, component: str, storage: str | None) -> str | None:
        """Why FSDP2 cannot shard this component under this method (None: it can, or there is nothing to shard)."""
        return None

    # The training program's hooks: ``s`` is its TrainSettings (apps.train.settings), read by field name.

    def program_train(self, s: Any, denoiser: str, encoders: dict[str, str]) -> tuple[dict[str, str], dict[str, Any]]:
        """``train=`` and prepare_training's other keywords for a run; ``encoders``: text encoder -> class name."""
        return {denoiser: self.name}, {}

    def settings_problems(self, s: Any) -> list[str]:
        """What is wrong with the run's settings for this method (one line each, flag and fix)."""
        return []

    def data_problem(self, s: Any, samples: list[Any]) -> str | None:
        """Why this method cannot learn from these samples (``.path``, ``.caption``); None: it can."""
        return None

    def plan_problem(self) -> str | None:
        """Why ``train --plan`` has no memory prediction for this method (None: it has)."""
        return None

    def plan_label(self, rank: int) -> str:
        """How ``train --plan`` names the method in its first line."""
        return self.name

    def save(self, tp: Any, folder: Any, dtype: Any, save_module: Any) -> None:
        """Write each component trained this way into ``folder`` by ``save_module(module, subfolder)``."""
        for comp, kind in tp.kinds.items():
            if kind == self.name:
                save_module(tp.components[comp], folder / comp)

    def reader(self, saved: Any) -> str:
        """What reads the saved result back, for the program's last line."""
        return "from_pretrained on the denoiser's subfolder"


def register_method(method: Method) -> Method:
    """Register a handler under its ``name`` (a method registered twice is an error).

    Example:
        >>> class MyLora(Method):
        ...     name = "lora"
        >>> _ = method_of("lora")  # the built-in handlers register on first use
        >>> register_method(MyLora())  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        ValueError: training method 'lora' is registered already (Lora)
    """
    if method.name in _REGISTRY and type(_REGISTRY[method.name]) is not type(method):
        raise ValueError(f"training method {method.name!r} is registered already ({type(_REGISTRY[method.name]).__name__})")
    _REGISTRY[method.name] = method
    return method


def _load_built_in() -> None:
    for name in _BUILT_IN:
        if name not in _REGISTRY:
            importlib.import_module(f"{__name__}.{name}")


def method_names() -> tuple[str, ...]:
    """The methods ``train=`` takes.

    Example:
        >>> method_names()[:4]
        ('lora', 'full', 'embedding', 'frozen')
    """
    _load_built_in()
    return tuple(sorted(_REGISTRY, key=lambda n: (_BUILT_IN.index(n) if n in _BUILT_IN else len(_BUILT_IN), n)))


def program_methods() -> tuple[str, ...]:
    """The methods ``hf-precision train --method`` offers.

    Example:
        >>> program_methods()[:3]
        ('lora', 'full', 'embedding')
    """
    return tuple(n for n in method_names() if _REGISTRY[n].program)


def method_of(kind: str) -> Method:
    """The handler of a method name (``"lora"``, ``"full"``, ``"embedding"``, ``"frozen"``).

    Example:
        >>> method_of("full").trains_weights, method_of("embedding").trains_weights
        (True, False)
    """
    _load_built_in()
    try:
        return _REGISTRY[kind]
    except KeyError:
        from ..rules import TrainingError

        raise TrainingError(f"train: {kind!r} is not one of {', '.join(_REGISTRY)}") from None


def make_masters(module: Any, kind: str, master_dtype: Any) -> int:
    """Freeze what method ``kind`` does not own and store what it owns in ``master_dtype``; the trainable count.

    Example:
        >>> import torch
        >>> make_masters(torch.nn.Linear(2, 3), "full", torch.float32), make_masters(torch.nn.Linear(2, 3), "lora", torch.float32)
        (9, 0)
    """
    import torch

    from ..trainable import accept_input_keyword

    method = method_of(kind)
    accept_input_keyword(module)  # LoRA layers, whoever injected them (this layer, add_adapter, inject_adapter_in_model)
    count = 0
    with torch.no_grad():
        for pname, param in module.named_parameters():
            param.requires_grad_(method.owns(pname) and param.is_floating_point())
            if param.requires_grad:
                if param.dtype != master_dtype:
                    param.data = param.data.to(master_dtype)
                count += param.numel()
    return count
