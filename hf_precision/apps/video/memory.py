"""Peak memory of each phase of a video run (text encoding, image encoding, denoising, VAE decode), and of the run.

Forward pre-hooks on the components (found by role) tell the phases apart: when a new phase starts, the last one's
peak is read and the counter reset. CUDA/XPU: ``reset_peak_memory_stats``/``max_memory_allocated``. CPU on Linux:
``VmHWM`` reset through ``/proc/self/clear_refs`` (``5``, proc(5)) above the phase's starting RSS, plus the weight
bytes; elsewhere the RSS sampled at every hook.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator

from ...runtime.memory import proc_bytes

__all__ = ["PhaseMemory", "peak_rss", "phase_hooks", "rss", "weight_bytes"]


def peak_rss() -> int:
    """The process's peak resident set size in bytes: Linux ``VmHWM`` of ``/proc/self/status`` (``ru_maxrss`` would count
    a forked child's pages from before ``exec``), macOS ``ru_maxrss``, Windows psutil's peak working set.

    Example:
        >>> peak_rss() >= rss() > 0
        True
    """
    peak = proc_bytes("/proc/self/status", "VmHWM")
    if peak is not None:
        return peak
    try:
        import resource
    except ImportError:  # Windows
        import psutil

        info = psutil.Process().memory_info()
        return int(getattr(info, "peak_wset", info.rss))
    rss_ = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(rss_ if sys.platform == "darwin" else rss_ * 1024)


def rss() -> int:
    """The process's resident set size in bytes now, on every platform (psutil)."""
    import psutil

    return int(psutil.Process().memory_info().rss)


def weight_bytes(pipe: Any) -> int:
    """Bytes of the parameters and buffers of a pipeline's model components, as loaded: quantized tensors by their
    inner data and scales (:func:`hf_precision.runtime.quantize.module_bytes`)."""
    import torch

    from ...runtime.quantize import module_bytes

    return sum(module_bytes(c) for c in pipe.components.values() if isinstance(c, torch.nn.Module))


def _reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as f:
            f.write("5")  # proc(5): "5" resets the peak resident set size (VmHWM) to the current RSS
        return True
    except OSError:
        return False


class PhaseMemory:
    """Peak memory per phase on one device, and the peak of the whole run.

    On the CPU a phase's figure is its RSS high-water mark above the RSS at its start, plus ``weights``: what it adds
    to the model without the process's own overhead, as ``max_memory_allocated`` leaves out the CUDA context.
    ``run_peak`` is the device's own reading (the largest peak RSS of any phase, since each resets the mark, or the
    allocator's peak); ``before_decode`` the run's peak when the decode started.

    Example:
        >>> m = PhaseMemory("cpu", weights=1000); m.enter("denoising"); m.finish()
        >>> list(m.peaks) == ["denoising"] and m.peaks["denoising"] >= 1000 and m.run_peak > 0
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
        self.run_peak = 0
        self.before_decode = 0
        # torch.cuda or torch.xpu: the allocator's own peak, read and reset alike
        self.allocator = getattr(torch, self.device.type) if self.device.type in ("cuda", "xpu") else None
        if self.allocator is not None:
            self.kind = f"torch.{self.device.type}.max_memory_allocated"
            self.run_kind = f"{self.kind} on {self.device}"
        elif self.device.type == "mps":
            self.kind = "torch.mps.driver_allocated_memory (sampled)"
            self.run_kind = "torch.mps.driver_allocated_memory, sampled per step and chunk"
        else:
            self.kind = "CPU: RSS peak above the phase's start + loaded weight bytes"
            self.run_kind = "peak RSS of the process"

    def _raw(self) -> int:
        """The device's peak since the last reset, as the device counts it."""
        if self.allocator is not None:
            return int(self.allocator.max_memory_allocated(self.device))
        if self.device.type == "mps":
            return max(self.sampled, int(self.torch.mps.driver_allocated_memory()))
        return max(self.sampled, peak_rss())

    def _reset(self) -> None:
        self.sampled = 0
        if self.allocator is not None:
            self.allocator.synchronize(self.device)
            self.allocator.reset_peak_memory_stats(self.device)
        elif self.device.type == "cpu":
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
        if phase == "VAE decode" and not self.before_decode:
            self.before_decode = self.run_peak
        self.phase = phase
        self._reset()

    def finish(self) -> None:
        if self.phase is not None:
            if self.allocator is not None:
                self.allocator.synchronize(self.device)
            raw = self._raw()
            self.run_peak = max(self.run_peak, raw)
            figure = max(0, raw - self.start) + self.weights if self.device.type == "cpu" else raw
            self.peaks[self.phase] = max(self.peaks.get(self.phase, 0), figure)
            self.phase = None


def _phase_modules(pipe: Any) -> list[tuple[Any, str]]:
    from .load import components_by_role

    found = [(module, "text encoding") for _, module in components_by_role(pipe, "text encoder")]
    found += [(module, "image encoding") for _, module in components_by_role(pipe, "image encoder")]
    found += [(module, "denoising") for _, module in components_by_role(pipe, "denoiser")]
    for _, vae in components_by_role(pipe, "vae"):
        if hasattr(vae, "encoder"):
            found.append((vae.encoder, "image encoding"))
        if hasattr(vae, "decoder"):
            found.append((vae.decoder, "VAE decode"))
    return found


@contextlib.contextmanager
def phase_hooks(pipe: Any, memory: PhaseMemory, bar: Any = None) -> Iterator[PhaseMemory]:
    """Record ``memory``'s phase from forward pre-hooks on ``pipe``'s components while the block runs; the last phase is
    closed on exit. ``bar`` (tqdm) steps per VAE decoder call; None where the caller counts (SVD's chunked decode).

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
