"""The settings of one training run, and every check on them that needs no model weights (before a model loads:
a bad setting fails in a second and writes nothing)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from ...errors import RecipeError
from ...training.methods import method_of, program_methods
from ..outputs import check_output

__all__ = ["TrainSettings", "ON_NAN", "SAVE_DTYPES", "check_settings", "check_out_folder", "chosen_method"]

DEFAULT_METHOD = "lora"
ON_NAN = ("stop", "skip")
SAVE_DTYPES = ("float16", "bfloat16", "float32")
# Settings a resumed run must keep: they fix the data order, the trained weights' shapes and the precision plan.
RESUME_KEYS = ("model", "data", "method", "lora_rank", "train_text_encoder", "embedding", "batch_size", "seed",
               "resolution", "frames", "layout", "master", "learning_rate", "lr_scheduler", "expert", "base")


@dataclasses.dataclass
class TrainSettings:
    """One run of ``hf-precision train``; field names follow the command-line flags (``--lora-rank`` = lora_rank)."""

    model: str
    data: str
    out: str
    method: str = DEFAULT_METHOD
    lora_rank: int = 16
    train_text_encoder: bool = False
    embedding: str | None = None
    init_token: str | None = None
    steps: int = 1000
    batch_size: int = 1
    learning_rate: float = 1e-4
    lr_scheduler: str = "constant"
    warmup_steps: int = 0
    resolution: int | None = None
    frames: int | None = None
    device: str | None = None
    layout: str | None = None
    overrides: list[Any] = dataclasses.field(default_factory=list)
    master: str = "fp32"
    seed: int = 0
    checkpoint_every: int = 500
    keep_checkpoints: int = 3
    resume: str | None = None
    validation_prompt: str | None = None
    validation_every: int | None = None
    validation_inference_steps: int = 20
    cache: bool = True
    on_nan: str = "stop"
    save_dtype: str = "float16"
    gradient_checkpointing: bool = False
    shard: bool = False  # FSDP2 over the launcher's processes (not a resume key: a run may resume at another size)
    caption_ext: str = ".txt"
    caption_column: str = "text"
    caption: str | None = None
    reference_column: str = "reference"
    reference_dir: str | None = None
    base: str | None = None  # with a single-file --model: the diffusers folder or Hub id for the rest (--base)
    expert: str | None = None  # two-expert models (Wan 2.2 A14B): "high" (default there) or "low"
    quiet: bool = False
    stop_after: int | None = None  # simulate Ctrl-C after this many steps of this process (tests, --demo)

    def record(self) -> dict[str, Any]:
        """The settings as plain data, for ``training.json`` and the checkpoint."""
        return {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(self).items()
                if k not in ("quiet", "stop_after")}


def configs_source(model: str, base: str | None) -> str:
    """What ``model_index.json`` and the configs of a run come from: ``base`` for a single-file ``model`` (checked:
    a ``.safetensors`` file; pickles, GGUF files and a base without a file refused), else ``model``.

    Example:
        >>> configs_source("./my-sdxl", None)
        './my-sdxl'
        >>> configs_source("./my-sdxl", "sdxl")  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        hf_precision.errors.RecipeError: train --model: base= is for a single-file checkpoint ...
    """
    from ...runtime.single_file import split_single_file

    single = split_single_file(model, base, "train --model")
    if single is None:
        return model
    if single[0].suffix.lower() == ".gguf":
        raise RecipeError(f"train --model {model}: training from a GGUF file is not supported (its weights are "
                          f"dequantized on every call); train from the model's .safetensors (a diffusers folder, or a single file with --base)")
    return single[1]


def chosen_method(method: str | None, options: Any) -> str:
    """``--method`` as given, else the method whose own option is set (``--embedding``: textual inversion), else LoRA.

    Example:
        >>> import argparse
        >>> chosen_method(None, argparse.Namespace(embedding="<cat>")), chosen_method("full", argparse.Namespace())
        ('embedding', 'full')
    """
    if method:
        return method
    picked = [n for n in program_methods()
              if method_of(n).selected_by and getattr(options, method_of(n).selected_by, None)]
    return picked[0] if picked else DEFAULT_METHOD


def check_settings(s: TrainSettings) -> None:
    """Every problem of the numbers and choices, in one RecipeError (no file is read)."""
    problems = []
    if s.method not in program_methods():
        problems.append(f"--method {s.method}: use one of {', '.join(program_methods())}")
    else:
        problems += method_of(s.method).settings_problems(s)
    for name, low in (("steps", 1), ("batch_size", 1), ("checkpoint_every", 1), ("validation_inference_steps", 1),
                      ("warmup_steps", 0), ("keep_checkpoints", 1)):
        value = getattr(s, name)
        if value < low:
            problems.append(f"--{name.replace('_', '-')} {value}: must be at least {low}")
    if s.validation_every is not None and s.validation_every < 1:
        problems.append(f"--validation-every {s.validation_every}: must be at least 1")
    if not s.learning_rate > 0:
        problems.append(f"--learning-rate {s.learning_rate}: must be > 0 (e.g. 1e-4 for LoRA, 5e-4 for an embedding)")
    if s.on_nan not in ON_NAN:
        problems.append(f"--on-nan {s.on_nan}: use stop or skip")
    if s.save_dtype not in SAVE_DTYPES:
        problems.append(f"--save-dtype {s.save_dtype}: use one of {', '.join(SAVE_DTYPES)}")
    if s.master not in ("fp32", "bf16-sr"):
        problems.append(f"--master {s.master}: use fp32 (default) or bf16-sr (pure bf16 with stochastic rounding)")
    if s.resolution is not None and s.resolution <= 0:
        problems.append(f"--resolution {s.resolution}: must be positive")
    if problems:
        raise RecipeError(problems)


def check_out_folder(out: str, resume: str | None) -> Path:
    """The output folder: new (or empty), or, with ``--resume``, the folder of the run being continued."""
    target = check_output(out, folder=True)
    if resume is None and target.is_dir() and any(target.iterdir()):
        raise RecipeError(f"--out {out}: the folder exists and is not empty (a previous run?); choose a new --out, "
                          f"remove it, or continue that run with --resume latest")
    if resume is not None and not target.is_dir():
        raise RecipeError(f"--resume {resume}: --out {out} does not exist, so there is no run to continue; drop "
                          f"--resume to start one")
    return target
