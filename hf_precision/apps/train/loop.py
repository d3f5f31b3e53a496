"""The training loop of ``hf-precision train``: data -> cached encodings -> the training layer's loss and step.

Precision is decided by :func:`hf_precision.training.prepare_training`; this module orders the work: caches,
progress, checkpoints, validation, faults (NaN, Ctrl-C) and the outputs.

Under ``accelerate launch`` each process takes its share of each global batch and of its noise (:func:`_draws`), and
gradients are averaged before each step (DDP's all-reduce, without wrapping the denoiser, so the layer's hooks
stay); only the main process writes. ``--shard`` uses FSDP2 under the recipe (:mod:`hf_precision.training.shard`,
checkpoints in :mod:`.sharded`). FSDP1 and DeepSpeed are refused: they flatten or cast the per-module dtypes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ...errors import RecipeError
from ...units import format_seconds
from . import batches as encoded
from .checkpoint import check_resume, data_list, load_trainable, rng_state, set_rng_state, trainable_state
from .data import epoch_batches
from .prepare import Run, prepare_run
from .results import log_line, save_outputs, trim_log, validate
from .settings import RESUME_KEYS, TrainSettings
from .sharded import holding, is_sharded, load_sharded, save_sharded

__all__ = ["TrainResult", "train", "train_steps", "NonFiniteLoss", "evaluate", "expected_time"]

@dataclasses.dataclass
class TrainResult:
    """What a run did: steps, losses, skipped steps, where it wrote, the exit code (0 done, 130 interrupted and
    checkpointed), and whether this process is the main one (the one that reports)."""

    out: Path
    step: int
    losses: dict[int, float]
    skipped: int
    exit_code: int = 0
    saved: Path | None = None
    eval_loss: tuple[float, float] | None = None
    method: str = "lora"
    main_process: bool = True
    low_noise: bool = False  # a two-expert model's transformer_2 trained (its LoRA loads with load_into_transformer_2)


# --------------------------------------------------------------------------------------------- noise


def _draws(run: Run, batch: dict[str, Any]) -> dict[str, Any]:
    """This process's share of the noise and timesteps drawn for the whole global batch, so N processes of B train
    on what one process of N x B does (the layer's loss would draw the same B on every process)."""
    from ...training.objectives import draw

    tp, acc, latents = run.tp, run.accelerator, batch["latents"]
    b = latents.shape[0]
    mine = slice(acc.process_index * b, (acc.process_index + 1) * b)
    drawn = draw(tp.objective, (b * acc.num_processes, *latents.shape[1:]), alphas_cumprod=tp.alphas_cumprod,
                 sigmas=tp.sigma_range, device=latents.device)
    return {k: v[mine] for k, v in drawn.items()}


# --------------------------------------------------------------------------------------------- faults


class _Interrupt:
    """Ctrl-C asks the loop to stop at the end of the step (checkpoint, exit 130); a second one stops at once."""

    def __init__(self) -> None:
        self.requested = False

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        try:
            previous = signal.signal(signal.SIGINT, self._handle)
        except ValueError:  # not the main thread: Ctrl-C keeps its default
            yield
            return
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def _handle(self, signum: int, frame: Any) -> None:
        if self.requested:
            raise KeyboardInterrupt
        self.requested = True


def _nonfinite_component(tp: Any, batch: dict[str, Any]) -> str:
    """Which component made the loss non-finite: the VAE (latents), a text encoder (conditioning) or the denoiser."""
    import torch

    if not torch.isfinite(batch["latents"]).all():
        return "vae (the latents are not finite: see --set vae.dtype=float32)"
    for key, value in batch.items():
        if key != "latents" and torch.is_tensor(value) and value.is_floating_point() and not torch.isfinite(value).all():
            return f"the text encoder(s) ({key} is not finite)"
    return f"{tp.denoiser_name} (its prediction or the loss overflowed {tp.compute_dtype})"


# --------------------------------------------------------------------------------------------- state


def _state(run: Run, step: int, rng: dict[str, Any], losses: dict[int, float]) -> dict[str, Any]:
    sharded = run.tp.shard is not None  # weights and optimizer state go to the sharded folder instead
    training = {**run.tp.stepper.state_dict(), "fingerprint": run.tp.fingerprint()} if sharded else run.tp.state_dict()
    return {"step": step, "rng": rng, **({} if sharded else {"optimizer": run.optimizer.state_dict()}),
            "scheduler": run.scheduler.state_dict(), "training": training,
            "losses": {str(k): v for k, v in losses.items()},
            "settings": {k: run.settings.record()[k] for k in RESUME_KEYS}, "data": data_list(run.data)}


def _save_checkpoint(run: Run, step: int, rng: dict[str, Any], losses: dict[int, float]) -> Path | None:
    path = None
    if run.tp.shard is not None:
        path = save_sharded(run.checkpoints.folder, step, run.tp, run.optimizer, _state(run, step, rng, losses),
                            run.checkpoints.keep)
        if run.accelerator.is_main_process:
            run.checkpoints.prune()
        run.accelerator.wait_for_everyone()
        return path
    if run.accelerator.is_main_process:
        path = run.checkpoints.save(step, trainable_state(run.tp.components), _state(run, step, rng, losses))
    run.accelerator.wait_for_everyone()
    return path


def _resume(run: Run) -> tuple[int, dict[int, float], dict[str, Any] | None]:
    """(step, losses so far, RNG state to restore) from ``--resume``; (0, {}, None) for a new run."""
    resumed = run.resumed or check_resume(run.settings, run.data, run.checkpoints, RESUME_KEYS)
    if resumed is None:
        return 0, {}, None
    path, weights, state = resumed
    run.resumed = None  # its tensors are loaded into the model below: not held twice
    sharded = is_sharded(path)
    if run.tp.shard is not None and not sharded:
        raise RecipeError(f"--resume {run.settings.resume}: {path} was written by a run without --shard; resume it "
                          f"without --shard (its weights are whole, not sharded)")
    trim_log(run, int(state["step"]))
    if sharded:  # any world size, sharded or not: the saved shards are re-sliced to this run's
        load_sharded(path, run.tp, run.optimizer)
    else:
        load_trainable(run.tp.components, weights, str(path))
        run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.tp.load_state_dict(state["training"])
    return int(state["step"]), {int(k): float(v) for k, v in state["losses"].items()}, state["rng"]


# --------------------------------------------------------------------------------------------- the loop


def _batches_from(run: Run, step: int) -> Iterator[tuple[int, list[int]]]:
    """(global step, this process's indices) from ``step`` on, epoch after epoch, in the (seed, epoch) order."""
    s, acc = run.settings, run.accelerator
    per_epoch = len(epoch_batches(run.data.samples, s.batch_size, s.seed, 0, acc.num_processes))
    epoch, pos = divmod(step, per_epoch)
    while True:
        batches = epoch_batches(run.data.samples, s.batch_size, s.seed, epoch, acc.num_processes)
        for b in batches[pos:]:
            r = acc.process_index
            yield step, b[r * s.batch_size:(r + 1) * s.batch_size]
            step += 1
        epoch, pos = epoch + 1, 0


def _one_step(run: Run, indices: list[int], step: int) -> tuple[float | None, bool]:
    """(loss, stepped) for one optimizer step; loss None when it was not finite and --on-nan skip."""
    import torch

    batch = encoded.encode_batch(run, indices, step)
    batch.update(_draws(run, batch))
    loss = run.tp.loss(batch)
    finite = bool(torch.isfinite(loss.detach()).all())
    if run.accelerator.num_processes > 1:  # every rank stops or skips together
        finite = not _agreed(run, not finite)
    if not finite:
        where = _nonfinite_component(run.tp, batch)
        if run.settings.on_nan == "stop":
            raise NonFiniteLoss(f"step {step + 1}: the loss is {loss.item()} (not finite); it came from {where}. The "
                                f"weights of step {step} are kept (nothing was trained on it). Resume with --resume "
                                f"latest --on-nan skip to skip such batches, or lower --learning-rate")
        run.optimizer.zero_grad(set_to_none=True)
        print(f"hf-precision train: step {step + 1}: loss not finite ({where}); batch skipped (--on-nan skip)")
        return None, False
    run.tp.backward(loss)
    if run.accelerator.num_processes > 1 and run.tp.shard is None:  # DDP's all-reduce; FSDP reduce-scatters itself
        for p in (p for p in run.tp.parameters() if p.grad is not None):
            p.grad = run.accelerator.reduce(p.grad, "mean")
    stepped = run.tp.step(run.optimizer)
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    value = loss.detach().float()
    if run.accelerator.num_processes > 1:
        value = run.accelerator.reduce(value, "mean")
    return float(value), bool(stepped)


def _agreed(run: Run, stop: bool) -> bool:
    """True on every rank when it is true on any (Ctrl-C or a non-finite loss may reach one rank only)."""
    import torch

    flag = torch.tensor([1.0 if stop else 0.0], device=run.accelerator.device)
    return float(run.accelerator.reduce(flag, "sum")) > 0.0


class NonFiniteLoss(RecipeError):
    """The loss was inf/NaN and ``--on-nan stop``: names the step and the component."""


def evaluate(run: Run) -> float:
    """Loss on a fixed batch with fixed noise and timesteps: it falls when the model learns, unlike the step loss."""
    import torch

    groups: dict[Any, list[int]] = {}
    for i, sample in enumerate(run.data.samples):
        groups.setdefault(sample.bucket, []).append(i)
    indices = max(groups.values(), key=len)[:4]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(run.settings.seed + 12345)
        batch = encoded.encode_batch(run, indices)
        return float(run.tp.loss(batch).float())


# The step whose time predicts the run: the first carries one-time costs (allocations, kernel choice, lazy inits).
_TIMED_STEP = 2


def expected_time(seconds_per_step: float, left: int, total: int) -> str:
    """The one line a run prints once its step time is measured: the time the remaining steps will take.

    Example:
        >>> expected_time(0.45, 998, 1000)
        'hf-precision train: 0.45 s a step: the 998 steps left take about 7 min 29 s (1000 in all)'
    """
    return (f"hf-precision train: {seconds_per_step:.2f} s a step: the {left} steps left take about "
            f"{format_seconds(seconds_per_step * left)} ({total} in all)")


def train_steps(run: Run) -> TrainResult:
    """Run the steps of a prepared run (after ``--resume``), with checkpoints, validation and the Ctrl-C save."""
    from tqdm.auto import tqdm

    s, acc, tp = run.settings, run.accelerator, run.tp
    start, losses, rng = _resume(run)
    if rng is not None:
        set_rng_state(rng)
    else:
        import torch

        torch.manual_seed(s.seed)
    if acc.is_main_process:
        acc.init_trackers("hf-precision-train", config={k: v for k, v in s.record().items()
                                                         if isinstance(v, (int, float, str, bool))})
    if run.cache is not None:
        encoded.fill_cache(run)
    if acc.num_processes > 1:
        how = "sharded, FSDP2" if tp.shard is not None else "gradients averaged over processes"
        print(f"[process {acc.process_index}/{acc.num_processes}] takes {s.batch_size} of each global batch of "
              f"{s.batch_size * acc.num_processes} ({how})", flush=True)
    if tp.shard is not None:
        print(f"[process {acc.process_index}/{acc.num_processes}] {holding(tp)}", flush=True)
    before_eval = evaluate(run) if start == 0 else None
    bar = tqdm(total=s.steps, initial=start, desc="train", unit="step", dynamic_ncols=True,
               disable=s.quiet or not acc.is_local_main_process)
    interrupt, step, exit_code = _Interrupt(), start, 0
    if start == 0 and s.validation_prompt:
        validate(run, 0)
    with interrupt.installed():
        batches = _batches_from(run, start)
        while step < s.steps:
            step_no, indices = next(batches)
            began = time.perf_counter()
            loss, _ = _one_step(run, indices, step_no)
            step += 1
            if step - start == _TIMED_STEP and step < s.steps and acc.is_main_process:
                bar.write(expected_time(time.perf_counter() - began, s.steps - step, s.steps))
            if loss is not None:
                losses[step] = loss
                acc.log({"loss": loss, "lr": run.scheduler.get_last_lr()[0], "skipped": tp.skipped_steps}, step=step)
                bar.set_postfix(loss=f"{loss:.4f}", skipped=tp.skipped_steps, refresh=False)
            bar.update(1)
            log_line(run, step, loss)
            stop = interrupt.requested or (s.stop_after is not None and step - start >= s.stop_after)
            if acc.num_processes > 1:  # every rank stops at the same step: the checkpoint save is a collective
                stop = _agreed(run, stop)
            if step % s.checkpoint_every == 0 or stop or step == s.steps:
                _save_checkpoint(run, step, rng_state(), losses)
            if s.validation_prompt and s.validation_every and step % s.validation_every == 0 and step < s.steps:
                validate(run, step)
            if stop and step < s.steps:
                exit_code = 130
                break
    bar.close()
    saved, evals = None, None
    if exit_code == 0:
        if before_eval is not None:
            evals = (before_eval, evaluate(run))
        if s.validation_prompt:
            validate(run, step)
        saved = save_outputs(run, step, losses)
    acc.end_training()
    return TrainResult(run.out, step, losses, tp.skipped_steps, exit_code, saved, evals, s.method, acc.is_main_process,
                       "transformer_2" in tp.kinds and tp.kinds["transformer_2"] != "frozen")


def train(settings: TrainSettings) -> TrainResult:
    """Train as ``hf-precision train`` does; a bad setting or data folder is a RecipeError before any model loads.

    Example:
        >>> import tempfile
        >>> train(TrainSettings(model="./none", data="./none", out=tempfile.mkdtemp() + "/o", lora_rank=0))
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: --lora-rank 0: a LoRA needs rank >= 1 (a rank-0 adapter trains nothing); typical: 4-64, e.g. --lora-rank 16
    """
    run = prepare_run(settings)
    return train_steps(run)
