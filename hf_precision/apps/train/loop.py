"""The training loop of ``hf-precision train``: data -> cached encodings -> the training layer's loss and step.

Precision is not decided here: :func:`hf_precision.training.prepare_training` gives the dtypes, the loss (noise
objective from the scheduler), the GradScaler and the sampling context. This module orders the work: checks before
loading, caches, one progress bar, checkpoints, validation, faults (NaN, Ctrl-C) and the outputs.

Several processes (``accelerate launch``): every process computes the same global batch order and takes its share
of each batch and of the noise drawn for it (:func:`_draws`: the run trains as one process of the global batch does);
gradients of the trainable parameters are averaged over processes before each step (what DDP does,
without wrapping the denoiser, so the training layer's hooks and loss stay as they are); only the main process
writes. ``--shard`` (or accelerate's FSDP2 config) shards what trains with FSDP2 under the recipe (see
:mod:`hf_precision.training.shard`): FSDP reduces the gradients itself, checkpoints are sharded
(:mod:`.sharded`), and every rank takes part in validation and in gathering the outputs. FSDP1 and DeepSpeed are
refused: they flatten or cast the parameters the layer keeps in per-module dtypes and fp32 masters.
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
from .cache import join_padded, offload_encoders, sample_parts, tp_device
from .checkpoint import check_resume, data_list, load_trainable, rng_state, set_rng_state, trainable_state
from .data import epoch_batches
from .prepare import Run, prepare_run
from .settings import RESUME_KEYS, TrainSettings

__all__ = ["TrainResult", "train", "train_steps", "NonFiniteLoss", "evaluate", "expected_time", "fill_cache"]

@dataclasses.dataclass
class TrainResult:
    """What a run did: steps done (all processes), the loss of each step of this run, skipped steps, where it wrote,
    the exit code the command returns (0 done, 130 interrupted and checkpointed), and whether this process is the
    main one (the one that reports, under ``accelerate launch``)."""

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


# --------------------------------------------------------------------------------------------- encodings


def _text_trained(tp: Any) -> bool:
    import torch

    return any(p.requires_grad for n, m in tp.components.items() if n.startswith("text_encoder")
               and isinstance(m, torch.nn.Module) for p in m.parameters())


def _encode(run: Run, indices: list[int], step: int | None = None) -> dict[str, Any]:
    """The batch the layer's loss takes at ``step``: latents and conditioning, read from the cache where
    :func:`fill_cache` wrote them, else encoded now (``--no-cache``, or a text encoder that trains); a condition
    drawn per step (an inpainting mask) is the step's pick among the sample's draws (:mod:`.draws`)."""
    import torch

    from . import draws

    tp = run.tp
    found = [run.cache.get("latents", _latent_key(run, i)) for i in indices] if run.cache is not None else [None]
    if not all(f is not None for f in found):
        # a draw per step (.draws): the sample's draws up to the step's pick, the ones the cache would hold first
        found = [_sample_latents(run, i, draws.choice(run.settings.seed, step, i) + 1) for i in indices]
    latents = torch.cat([f["latents"] for f in found])
    # an edit dataset's reference images (the layer appends their latents to the token sequence); the channels a
    # denoiser takes beyond the latents (inpainting's mask and masked image, an I2V model's first frame)
    refs = {k: torch.cat([f[k] for f in found]).to(tp_device(tp)) for k in ("reference_latents", "condition_latents",
            "image_embeds", "image_latents", "first_frame_latents") if all(k in f for f in found)}  # and an I2V
    # model's encodings of the first frame: its image embedding, I2VGen-XL's image latents, HunyuanVideo I2V's
    if all(draws.KEY in f for f in found):
        refs["condition_latents"] = draws.pick(found, indices, run.settings.seed, step).to(tp_device(tp))
    cond = None
    if run.cache is not None and not _text_trained(tp):
        texts = [run.cache.get("text", _text_key(run, i)) for i in indices]
        if all(f is not None for f in texts):
            cond = _from_cache(texts, _masks(run))
    if cond is None:
        with (torch.no_grad() if not _text_trained(tp) else contextlib.nullcontext()):
            cond = _encode_text(run, indices)
    device = tp_device(tp)
    return {"latents": latents.to(device), **refs,
            **{k: v.to(device) if torch.is_tensor(v) else v for k, v in cond.items()}}


def _latent_key(run: Run, i: int) -> tuple[Any, ...]:
    """What a sample's cached latents depend on: its file (:func:`~.cache.sample_parts`) and, where the denoiser takes
    conditioning channels or an image embedding, the builder or pipeline method that made them and the seed its mask
    or noise was drawn with: another builder, method or seed is another conditioning, encoded again."""
    from ...training.encode import condition_key
    from .draws import DRAWS, drawn

    made = (*condition_key(run.tp), *(("draws", DRAWS) if drawn(run.tp) else ()))
    return (*sample_parts(run.data.samples[i]), *made, run.settings.seed) if made else sample_parts(run.data.samples[i])


def _prompt_image(run: Run, i: int) -> Any:
    """The picture the pipeline encodes sample ``i``'s prompt with, else None: its reference image (Qwen-Image Edit:
    its __call__ passes the reference to encode_prompt) or, where encode_prompt needs an image and the data gives no
    reference, the clip's first frame, the picture an image-to-video __call__ is given and encodes the prompt with
    (HunyuanVideo I2V, pipeline_hunyuan_video_image2video.py:831-839): the denoiser then sees the conditioning it
    gets at inference."""
    if not _prompt_image_used(run, i):
        return None
    if run.data.samples[i].reference is not None:
        return run.data.reference_image(i)
    from ...training.image_embeds import pil_frames

    return pil_frames(run.data.pixels([i]))[0]


def _text_key(run: Run, i: int) -> tuple[Any, ...]:
    """What a sample's cached conditioning depends on: its caption, and the picture the prompt is encoded with where
    it is (a reference's file and bucket; else the sample's own file and bucket, its first frame): one caption over
    two such pictures is two conditionings."""
    sample = run.data.samples[i]
    if not _prompt_image_used(run, i):
        return (sample.caption,)
    if sample.reference is None:
        return (sample.caption, "first frame", *sample_parts(sample))
    return (sample.caption, *sample_parts(sample)[-4:], sample.bucket)


def _prompt_image_used(run: Run, i: int) -> bool:
    from ...training.encode import encode_prompt_needs
    from .references import prompt_reads_image

    if run.data.samples[i].reference is not None:
        return prompt_reads_image(run.tp.pipe)
    return "image" in encode_prompt_needs(type(run.tp.pipe))


def _encode_text(run: Run, indices: list[int]) -> dict[str, Any]:
    """The conditioning of samples ``indices``: their captions in one call, or, where the prompt is encoded with
    each sample's reference, one call per sample (QwenImageEditPlusPipeline reads a list of images as pictures of
    every prompt, not one per prompt), joined as the cache joins them; none where the pipeline has no encode_prompt
    (SVD: its denoiser's conditioning is the first frame's image embedding, made with the latents)."""
    if not hasattr(run.tp.pipe, "encode_prompt"):
        return {}
    if not any(_prompt_image_used(run, i) for i in indices):
        return dict(run.tp.encode_prompt(run.data.captions(indices)))
    return _from_cache([_cacheable(run.tp.encode_prompt([run.data.samples[i].caption], image=_prompt_image(run, i)))
                        for i in indices], _masks(run))


def _masks(run: Run) -> tuple[str, ...]:
    """The batch keys of the family's text attention masks (Qwen-Image: prompt_attention_mask)."""
    from ...training.denoiser_rows import row_of

    row = row_of(run.tp._denoiser())
    return tuple(n for names in (row.encode, *(m for _, m in row.encode_more)) for n in names if n and "mask" in n)


def _cacheable(cond: Any) -> dict[str, Any]:
    """The tensors of one caption's conditioning, as the cache stores them: a list of tensors (Z-Image's unpadded
    prompt, one per caption) as its items ``KEY.0``, ``KEY.1``, ...; other values are not stored."""
    import torch

    out = {k: v for k, v in cond.items() if torch.is_tensor(v)}
    for k, v in cond.items():
        if isinstance(v, (list, tuple)) and v and all(torch.is_tensor(t) for t in v):
            out.update({f"{k}.{i}": t for i, t in enumerate(v)})
    return out


def _from_cache(texts: list[dict[str, Any]], masks: tuple[str, ...] = ()) -> dict[str, Any]:
    """A batch's conditioning from its captions' cache entries (:func:`_cacheable`): tensors joined on the batch axis,
    ``KEY.i`` items back into one list per key, in caption order; captions of other lengths padded under ``masks``
    (:func:`~.cache.join_padded`)."""
    import re

    items: dict[str, list[Any]] = {}
    for entry in texts:
        for k in sorted((k for k in entry if re.fullmatch(r".+\.\d+", k)), key=lambda k: int(k.rsplit(".", 1)[1])):
            items.setdefault(k.rsplit(".", 1)[0], []).append(entry[k])
    plain = [k for k in texts[0] if not re.fullmatch(r".+\.\d+", k)]
    return {**join_padded(texts, plain, list(masks)), **items}


def _sample_latents(run: Run, i: int, count: int | None = None) -> dict[str, Any]:
    """Sample ``i``'s latents (and its reference image's, in an edit dataset, by the same VAE path; and the
    conditioning channels its denoiser takes, built from the sample as the pipeline builds them), drawn from the
    VAE's distribution under the sample's own seed in a forked RNG: what the cache holds and what ``--no-cache``
    encodes are the same, whatever batch or process the sample is in. ``count``: how many of a per-step condition's
    draws to make (:mod:`.draws`; all by default)."""
    import torch

    from .draws import DRAWS, drawn, encode_draws

    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(run.settings.seed * 1_000_003 + i)
        pixels = run.data.pixels([i])
        out = {"latents": run.tp.encode_images(pixels)}
        if drawn(run.tp):  # an inpainting mask: several draws, one picked per step (.draws)
            out.update(encode_draws(run.tp, pixels, out["latents"], count or DRAWS))
        else:
            out.update(run.tp.encode_condition(pixels, out["latents"]))
        reference = run.data.reference_pixels([i])
        if reference is not None:
            out["reference_latents"] = run.tp.encode_images(reference)
        return out


def _draws(run: Run, batch: dict[str, Any]) -> dict[str, Any]:
    """This process's share of the noise and timesteps (or noise levels) drawn for the whole global batch, in the
    order one process draws them: N processes of --batch-size B train on what one process of N x B does (the
    layer's loss would draw only B, the same B on every process)."""
    from ...training.denoiser_rows import draw

    tp, acc, latents = run.tp, run.accelerator, batch["latents"]
    b = latents.shape[0]
    mine = slice(acc.process_index * b, (acc.process_index + 1) * b)
    drawn = draw(tp.objective, (b * acc.num_processes, *latents.shape[1:]), alphas_cumprod=tp.alphas_cumprod,
                 sigmas=tp.sigma_range, device=latents.device)
    return {k: v[mine] for k, v in drawn.items()}


def fill_cache(run: Run) -> None:
    """Encode every sample once before the first step (main process writes; the others wait and read).

    Each sample is encoded under its own seed in a forked RNG, so the latents do not depend on batch order or on
    whether the cache existed, and the training RNG is untouched: a resumed run reads what the first run wrote and
    draws the same noise. Frozen encoders then leave the accelerator until validation needs them.
    """
    import torch

    acc, tp, data = run.accelerator, run.tp, run.data
    text = not _text_trained(tp)
    if acc.is_main_process:
        for i in range(len(data.samples)):
            parts = _latent_key(run, i)
            if run.cache.get("latents", parts) is None:
                run.cache.put("latents", parts, _sample_latents(run, i))
            if text and run.cache.get("text", _text_key(run, i)) is None:
                with torch.no_grad():
                    cond = _encode_text(run, [i])
                run.cache.put("text", _text_key(run, i), _cacheable(cond))
    acc.wait_for_everyone()
    offload_encoders(run, "cpu", text)


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
        from .sharded import save_sharded

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
    from .results import trim_log
    from .sharded import is_sharded, load_sharded

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


def _reduce_gradients(run: Run) -> None:
    """Average the trainable gradients over processes (DDP's all-reduce; identical scale on every rank)."""
    for p in run.tp.parameters():
        if p.grad is not None:
            p.grad = run.accelerator.reduce(p.grad, "mean")


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

    batch = _encode(run, indices, step)
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
    if run.accelerator.num_processes > 1 and run.tp.shard is None:  # FSDP reduce-scatters the gradients itself
        _reduce_gradients(run)
    stepped = run.tp.step(run.optimizer)
    run.optimizer.zero_grad(set_to_none=True)
    run.scheduler.step()
    value = loss.detach().float()
    if run.accelerator.num_processes > 1:
        value = run.accelerator.reduce(value, "mean")
    return float(value), bool(stepped)


def _agreed(run: Run, stop: bool) -> bool:
    """True on every rank when it is true on any (Ctrl-C reaches the ranks at different moments; a non-finite loss
    may come on one rank's share of the batch only)."""
    import torch

    flag = torch.tensor([1.0 if stop else 0.0], device=run.accelerator.device)
    return float(run.accelerator.reduce(flag, "sum")) > 0.0


class NonFiniteLoss(RecipeError):
    """The loss was inf/NaN and ``--on-nan stop``: names the step and the component."""


def evaluate(run: Run) -> float:
    """Loss on a fixed batch (the largest bucket's first samples) with fixed noise and timesteps: a number that
    falls when the model learns, unlike the per-step loss, whose noise draw changes every step."""
    import torch

    groups: dict[Any, list[int]] = {}
    for i, sample in enumerate(run.data.samples):
        groups.setdefault(sample.bucket, []).append(i)
    indices = max(groups.values(), key=len)[:4]
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(run.settings.seed + 12345)
        batch = _encode(run, indices)
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

    from .results import log_line, save_outputs, validate

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
        fill_cache(run)
    if acc.num_processes > 1:
        how = "sharded, FSDP2" if tp.shard is not None else "gradients averaged over processes"
        print(f"[process {acc.process_index}/{acc.num_processes}] takes {s.batch_size} of each global batch of "
              f"{s.batch_size * acc.num_processes} ({how})", flush=True)
    if tp.shard is not None:
        from .sharded import holding

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
