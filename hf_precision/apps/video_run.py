"""One clip from any video pipeline, with the peak memory of each phase and one progress bar for the whole batch.

Phases are told apart by forward pre-hooks on the components (text encoders, the VAE encoder for an input image,
the denoiser, the VAE decoder): when a component of a new phase starts, the peak of the previous phase is read and
the peak counter is reset. CUDA/XPU: ``reset_peak_memory_stats`` and ``max_memory_allocated``. CPU on Linux: the
process's ``VmHWM`` reset through ``/proc/self/clear_refs`` (``5``, see proc(5)) above the RSS at the phase's start,
plus the loaded weight bytes; elsewhere the RSS sampled at every hook.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Any, Iterator

from ..errors import RecipeError
from ..runtime.memory import proc_bytes

__all__ = ["PhaseMemory", "ClipResult", "generate_clip", "rss", "weight_bytes"]

PHASES = ("text encoding", "image encoding", "denoising", "VAE decode")


def rss() -> int:
    """The process's resident set size in bytes now (Linux ``VmRSS``; elsewhere psutil or ``ru_maxrss``)."""
    now = proc_bytes("/proc/self/status", "VmRSS")
    if now is not None:
        return now
    from .video import peak_rss

    return peak_rss()


def weight_bytes(pipe: Any) -> int:
    """Bytes of the parameters and buffers of a pipeline's model components, as loaded."""
    total = 0
    for component in pipe.components.values():
        if hasattr(component, "parameters"):
            total += sum(t.numel() * t.element_size() for t in component.parameters())
            total += sum(t.numel() * t.element_size() for t in component.buffers())
    return total


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # proc(5): "5" resets the peak resident set size (VmHWM) to the current RSS
        return True
    except OSError:
        return False


class PhaseMemory:
    """Peak memory per phase on one device.

    CPU: the RSS high-water mark above the RSS when the phase started, plus ``weights`` (the bytes of the loaded
    parameters and buffers): what the phase adds on top of the model, without the process's own overhead (the
    interpreter, libraries, thread pools), as ``max_memory_allocated`` leaves out the CUDA context.

    Example:
        >>> m = PhaseMemory("cpu", weights=1000); m.enter("denoising"); m.finish()
        >>> list(m.peaks) == ["denoising"] and m.peaks["denoising"] >= 1000
        True
    """

    def __init__(self, device: Any, weights: int = 0):
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.weights = weights if self.device.type == "cpu" else 0
        self.start = 0
        self.peaks: dict[str, int] = {}
        self.phase: str | None = None
        self.sampled = 0
        self.kind = {"cuda": "torch.cuda.max_memory_allocated", "xpu": "torch.xpu.max_memory_allocated",
                     "mps": "torch.mps.driver_allocated_memory (sampled)"}.get(
                         self.device.type, "CPU: RSS peak above the phase's start + loaded weight bytes")

    def _read(self) -> int:
        torch, dev = self.torch, self.device
        if dev.type == "cuda":
            return int(torch.cuda.max_memory_allocated(dev))
        if dev.type == "xpu":
            return int(torch.xpu.max_memory_allocated(dev))
        if dev.type == "mps":
            return max(self.sampled, int(torch.mps.driver_allocated_memory()))
        from .video import peak_rss

        return max(0, max(self.sampled, peak_rss()) - self.start) + self.weights

    def _reset(self) -> None:
        torch, dev = self.torch, self.device
        self.sampled = 0
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
            torch.cuda.reset_peak_memory_stats(dev)
        elif dev.type == "xpu":
            torch.xpu.reset_peak_memory_stats(dev)
        elif dev.type == "cpu":
            self.start = rss()
            if not _reset_hwm():
                self.sampled = self.start

    def sample(self) -> None:
        if self.device.type == "mps":
            self.sampled = max(self.sampled, int(self.torch.mps.driver_allocated_memory()))
        elif self.device.type == "cpu":
            self.sampled = max(self.sampled, rss())

    def enter(self, phase: str) -> None:
        if phase == self.phase:
            return
        self.finish()
        self.phase = phase
        self._reset()

    def finish(self) -> None:
        if self.phase is not None:
            if self.device.type == "cuda":
                self.torch.cuda.synchronize(self.device)
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), self._read())
            self.phase = None

    def summary(self) -> str:
        return ", ".join(f"{p} {b / 2**20:.1f} MiB" for p, b in self.peaks.items()) + f" ({self.kind})"


def _phase_modules(pipe: Any) -> list[tuple[Any, str]]:
    found = []
    for name, component in pipe.components.items():
        if not hasattr(component, "register_forward_pre_hook"):
            continue
        if name.startswith("text_encoder") or name == "image_encoder":
            found.append((component, "text encoding" if name.startswith("text") else "image encoding"))
        elif name in ("transformer", "transformer_2", "unet"):
            found.append((component, "denoising"))
        elif name == "vae":
            if hasattr(component, "encoder"):
                found.append((component.encoder, "image encoding"))
            if hasattr(component, "decoder"):
                found.append((component.decoder, "VAE decode"))
    return found


@contextlib.contextmanager
def phase_hooks(pipe: Any, memory: PhaseMemory, bar: Any = None) -> Iterator[PhaseMemory]:
    """Record ``memory``'s phase from forward pre-hooks on ``pipe``'s components while the block runs.

    ``bar`` (a tqdm bar) gets one more step per VAE decoder call; pass None where the caller counts them itself (SVD's
    chunked decode). The last phase is closed on exit.

    Example:
        >>> from hf_precision.testing.pipelines import make_svd
        >>> pipe = make_svd()
        >>> with phase_hooks(pipe, PhaseMemory("cpu")) as memory:
        ...     memory.enter("denoising")
        >>> sorted(memory.peaks)
        ['denoising']
    """
    handles = []
    for module, phase in _phase_modules(pipe):
        def pre(mod: Any, args: Any, phase: str = phase) -> None:
            memory.sample()
            memory.enter(phase)
            if phase == "VAE decode" and bar is not None:
                bar.total += 1
                bar.set_postfix_str("decoding")
                bar.update(1)
        handles.append(module.register_forward_pre_hook(pre))
    try:
        yield memory
        memory.finish()
    finally:
        for h in handles:
            h.remove()


@dataclasses.dataclass
class ClipResult:
    """Float32 frames ``(frames, height, width, 3)`` in [0, 1], seconds, and the peak memory of each phase."""

    frames: Any
    seconds: float
    peaks: dict[str, int]
    memory_kind: str


def generate_clip(pipe: Any, spec: Any, *, prompt: str | None = None, image: Any = None, height: int, width: int,
                  frames: int, steps: int, seed: int = 0, guidance_scale: float | None = None, bar: Any = None,
                  memory: PhaseMemory | None = None, **extra: Any) -> ClipResult:
    """One clip from a text-to-video or image-to-video pipeline (Wan, LTX-Video, CogVideoX, HunyuanVideo, ...).

    The noise comes from a CPU generator seeded with ``seed`` (the same clip on every device); ``bar`` (a tqdm bar)
    advances per denoising step and per VAE decoder call; ``memory`` records the peak of each phase.

    Example:
        >>> import sys; sys.path.insert(0, "tests"); from video_tiny import make_wan  # doctest: +SKIP
        >>> from hf_precision.apps.video_families import video_spec  # doctest: +SKIP
        >>> r = generate_clip(make_wan(), spec, prompt="a cat", height=16, width=16, frames=5, steps=2)  # doctest: +SKIP
        >>> r.frames.shape  # doctest: +SKIP
        (5, 16, 16, 3)
    """
    import numpy as np
    import torch

    problems = spec.check(height=height, width=width, frames=frames)
    if problems:
        raise RecipeError(problems)
    kwargs: dict[str, Any] = {"height": height, "width": width, spec.frames_arg: frames, "num_inference_steps": steps,
                              "generator": torch.Generator("cpu").manual_seed(seed), "output_type": "np",
                              **{**spec.extra, **extra}}
    if spec.takes_prompt:
        kwargs["prompt"] = prompt or ""
    if spec.takes_image:
        if image is None:
            raise RecipeError(f"{spec.pipeline} is image-to-video: give --image")
        kwargs["image"] = image
    if guidance_scale is not None:
        kwargs["guidance_scale"] = guidance_scale
    memory = memory or PhaseMemory(pipe._execution_device, weights=weight_bytes(pipe))
    def on_step_end(p: Any, i: int, t: Any, kw: dict[str, Any]) -> dict[str, Any]:
        memory.sample()
        if bar is not None:
            bar.set_postfix_str("denoising")
            bar.update(1)
        return {}

    config = dict(getattr(pipe, "_progress_bar_config", {}))
    pipe.set_progress_bar_config(disable=True)
    start = time.perf_counter()
    try:
        with torch.no_grad(), phase_hooks(pipe, memory, bar):
            out = pipe(**kwargs, callback_on_step_end=on_step_end).frames
    finally:
        pipe._progress_bar_config = config
    video = np.asarray(out[0] if isinstance(out, (list, tuple)) or getattr(out, "ndim", 0) == 5 else out,
                       dtype=np.float32)
    return ClipResult(frames=video, seconds=time.perf_counter() - start, peaks=dict(memory.peaks),
                      memory_kind=memory.kind)
