"""One training step's work, counted in what no machine's load changes, and the loops it is compared across.

``LayerLoop`` steps a plan of ``hp.prepare_training``; ``ExampleLoop`` is diffusers' example training loop
(train_text_to_image_lora.py) written out, the reference the layer is held to (tests/test_training_loop.py;
``benchmarks/bench_training.py`` prints the counts beside its times).
"""

from __future__ import annotations

import collections
import cProfile
import pstats
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["ExampleLoop", "LayerLoop", "step_work"]


class LayerLoop:
    """The loop through the layer on a plan (``hp.prepare_training``) and its optimizer (default AdamW); ``step(batch)``
    is loss, backward, optimizer step and zero_grad, and returns the loss.
    """

    def __init__(self, tp: Any, opt: torch.optim.Optimizer | None = None):
        self.tp = tp
        self.opt = opt if opt is not None else torch.optim.AdamW(self.tp.parameters(), lr=1e-4)
        self.dtype = self.tp.compute_dtype

    def step(self, batch: dict) -> float:
        loss = self.tp.loss(batch, generator=torch.Generator(self.tp.device).manual_seed(0))
        self.tp.backward(loss)
        self.tp.step(self.opt)
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def modules(self) -> list[torch.nn.Module]:
        return [self.tp.components[n] for n in ("unet", "text_encoder", "vae")]


class ExampleLoop:
    """diffusers' example LoRA loop on an SD 1.5 pipeline: frozen parts ``.to(weight_dtype)``, ``unet.add_adapter``,
    ``cast_training_params(unet, torch.float32)``, autocast to ``weight_dtype``, a GradScaler under fp16.
    """

    def __init__(self, pipe: Any, device: str, weight_dtype: torch.dtype):
        from diffusers import DDPMScheduler
        from diffusers.training_utils import cast_training_params
        from peft import LoraConfig

        self.unet, self.vae, self.te = pipe.unet, pipe.vae, pipe.text_encoder
        for m in (self.unet, self.vae, self.te):
            m.requires_grad_(False)
        self.unet.add_adapter(LoraConfig(r=4, lora_alpha=4, init_lora_weights="gaussian",
                                         target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
        for m in (self.unet, self.vae, self.te):
            m.to(device, dtype=weight_dtype)
        # The examples upcast under fp16; here always, so that both loops keep the same fp32 masters.
        cast_training_params(self.unet, dtype=torch.float32)
        self.unet.train()
        self.params = [p for p in self.unet.parameters() if p.requires_grad]
        self.opt = torch.optim.AdamW(self.params, lr=1e-4)
        self.dtype, self.device = weight_dtype, torch.device(device)
        self.scaler = torch.amp.GradScaler(self.device.type) if weight_dtype == torch.float16 else None
        self.alphas = DDPMScheduler.from_config(pipe.scheduler.config).alphas_cumprod.to(device)

    def step(self, batch: dict) -> float:
        latents = batch["latents"].to(self.device, self.dtype)
        gen = torch.Generator(self.device).manual_seed(0)
        noise = torch.randn(latents.shape, generator=gen, device=self.device, dtype=latents.dtype)
        t = torch.randint(0, len(self.alphas), (latents.shape[0],), generator=gen, device=self.device)
        a = self.alphas[t].view(-1, 1, 1, 1).to(latents.dtype)
        noisy = a.sqrt() * latents + (1 - a).sqrt() * noise
        with torch.autocast(self.device.type, dtype=self.dtype, enabled=self.dtype != torch.float32):
            pred = self.unet(noisy, t, batch["prompt_embeds"].to(self.device, self.dtype)).sample
        loss = torch.nn.functional.mse_loss(pred.float(), noise.float())
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            self.scaler.step(self.opt)
            self.scaler.update()
        else:
            loss.backward()
            self.opt.step()
        self.opt.zero_grad(set_to_none=True)
        return loss.item()

    def modules(self) -> list[torch.nn.Module]:
        return [self.unet, self.te, self.vae]


class _Aten(TorchDispatchMode):
    """Counts the aten ops one step dispatches (backward included), host syncs and casts among them."""

    def __init__(self, ignore: set[int]):
        super().__init__()
        self.ignore, self.counts = ignore, collections.Counter()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        self.counts["ops"] += 1
        if name == "_local_scalar_dense" and id(args[0]) not in self.ignore:
            self.counts["syncs"] += 1
        elif name in ("_to_copy", "copy_"):
            self.counts["casts"] += 1
        return func(*args, **(kwargs or {}))


def step_work(loop: Any, batch: dict) -> dict[str, int]:
    """What one step of ``loop`` (``.step(batch)``, ``.opt``) does: host syncs, casts, aten ops, hook and Python calls.

    Host syncs are ``_local_scalar_dense`` calls except on the optimizer's state (AdamW keeps step counters on the
    CPU, every loop alike). The loop steps twice: under the op counter, then under the profiler.

    Example:
        >>> import torch
        >>> class Loop:
        ...     def __init__(self):
        ...         self.model = torch.nn.Linear(2, 1)
        ...         self.opt = torch.optim.SGD(self.model.parameters(), lr=0.1)
        ...     def step(self, batch):
        ...         loss = self.model(batch["x"]).pow(2).mean()
        ...         loss.backward(); self.opt.step(); self.opt.zero_grad()
        ...         return loss.item()
        >>> work = step_work(Loop(), {"x": torch.ones(1, 2)})
        >>> work["syncs"], work["hooks"], work["ops"] > 0
        (1, 0, True)
    """
    hooks = [0]

    def count_hooks(module: torch.nn.Module, args: Any) -> None:
        hooks[0] += len(module._forward_pre_hooks) + len(module._forward_hooks)

    ignore = {id(t) for state in loop.opt.state.values() for t in state.values() if isinstance(t, torch.Tensor)}
    handle = torch.nn.modules.module.register_module_forward_pre_hook(count_hooks)
    try:
        with _Aten(ignore) as aten:
            loop.step(batch)
    finally:
        handle.remove()
    profile = cProfile.Profile()
    profile.enable()
    loop.step(batch)
    profile.disable()
    calls = pstats.Stats(profile).total_calls  # type: ignore[attr-defined]
    return {"syncs": aten.counts["syncs"], "casts": aten.counts["casts"], "ops": aten.counts["ops"],
            "hooks": hooks[0], "calls": int(calls)}
