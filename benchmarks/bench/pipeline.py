"""The pipeline under test: a random-weight SDXL saved once as fp32 safetensors, reused by later runs."""

from __future__ import annotations

import gc
import hashlib
import json
import time
from pathlib import Path
from typing import Any

REAL_SDXL = Path(__file__).resolve().parents[2] / "hf_precision" / "model_configs" / "stable-diffusion-xl-base-1.0"


class Refused(SystemExit):
    """The run cannot be done on this machine; the message says what it needs."""


def real_size() -> dict[str, Any]:
    """``make_sdxl`` overrides that give the real SDXL-base architecture (configs shipped with the package)."""
    size: dict[str, Any] = {"base": "mid"}
    for comp in ("unet", "vae", "text_encoder", "text_encoder_2"):
        config = json.loads((REAL_SDXL / comp / "config.json").read_text())
        size[comp] = {k: v for k, v in config.items()
                      if not k.startswith("_") and k not in ("architectures", "torch_dtype", "transformers_version")}
    return size


def resolve_size(text: str) -> tuple[str | dict[str, Any], str]:
    """``mid`` / ``tiny`` / ``real`` / a JSON object (inline or a file) -> (size for make_sdxl, a cache key)."""
    if text in ("mid", "tiny"):
        return text, text
    if text == "real":
        return real_size(), "real"
    raw = Path(text).read_text() if Path(text).is_file() else text
    try:
        size = json.loads(raw)
    except json.JSONDecodeError as err:
        raise SystemExit(f"--size: expected mid, tiny, real, a JSON object or a JSON file, got {text!r} ({err})") from None
    if not isinstance(size, dict):
        raise SystemExit("--size: the JSON must be an object of per-component config overrides")
    return size, "custom-" + hashlib.sha1(json.dumps(size, sort_keys=True).encode()).hexdigest()[:10]


def available_memory() -> int | None:
    """Bytes the kernel says a new allocation can get (MemAvailable), or None where /proc/meminfo is absent."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_real_fits(layout: str) -> dict[str, Any]:
    """Refuse ``--size real`` up front when this machine lacks the memory, naming what it needs.

    Needed: the fp32 reference pipeline (what autocast keeps and what is built and saved) plus the recipe
    pipeline, with 15% headroom; the byte counts come from ``hf_precision.plan`` on the shipped configs.
    """
    import hf_precision as hp

    fp32 = hp.plan("sdxl", device=layout).fp32_bytes
    recipe = hp.plan("sdxl", device=layout).total_bytes
    need = int((fp32 + recipe) * 1.15)
    have = available_memory()
    out = {"fp32_bytes": fp32, "recipe_bytes": recipe, "need_bytes": need, "available_bytes": have}
    if have is not None and have < need:
        gib = 1024 ** 3
        raise Refused(f"--size real needs about {need / gib:.1f} GiB of free memory (the fp32 reference "
                      f"{fp32 / gib:.1f} GiB + the {layout} recipe pipeline {recipe / gib:.1f} GiB + 15% headroom); "
                      f"this machine has {have / gib:.1f} GiB available. Use --size mid, or a machine with more memory.")
    return out


def prepare(size: str | dict[str, Any], key: str, cache: Path, say: Any) -> dict[str, Any]:
    """Build the random-weight SDXL pipeline once and save it (fp32 safetensors) under ``cache``; reuse it later."""
    from hf_precision.testing.pipelines import count_parameters, make_sdxl, save_pipeline

    folder = cache / f"sdxl-{key}"
    marker = folder / "bench_size.json"
    stamp = json.dumps({"size": size, "seed": 0}, sort_keys=True)
    if marker.is_file() and marker.read_text() == stamp and (folder / "model_index.json").is_file():
        return {"folder": str(folder), "params": json.loads((folder / "bench_params.json").read_text()),
                "built_s": None, "reused": True}
    say(f"building the {key} pipeline with random weights and saving it to {folder} (once; later runs reuse it) ...")
    t0 = time.perf_counter()
    pipe = make_sdxl(size=size, seed=0)
    counts = count_parameters(pipe)
    save_pipeline(pipe, folder)
    (folder / "bench_params.json").write_text(json.dumps(counts))
    marker.write_text(stamp)
    del pipe
    gc.collect()
    say(f"built and saved the {key} pipeline ({counts['total']:,} parameters) in {time.perf_counter() - t0:.1f} s")
    return {"folder": str(folder), "params": counts, "built_s": time.perf_counter() - t0, "reused": False}


def layout_text(recipe: Any) -> str:
    """One line per recipe: each component's storage/compute dtype and its float32 islands."""
    parts = []
    for p in recipe.policies:
        text = f"{p.name} {p.storage}" + (f"/{p.compute}" if p.compute != p.storage else "")
        if p.keep_fp32 and p.compute != "float32":
            islands = list(p.keep_fp32)
            text += f" (fp32: {', '.join(islands[:4])}{f' +{len(islands) - 4} more' if len(islands) > 4 else ''})"
        parts.append(text)
    return ", ".join(parts)
