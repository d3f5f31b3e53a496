"""Load every pipeline of diffusers' own test suite through hf_precision under a mixed per-component dtype layout.

diffusers' fast tests (``tests/pipelines/**/test_*.py`` in a diffusers checkout) build each pipeline class from tiny
random components (``get_dummy_components``) and call it with ``get_dummy_inputs``. This script saves each of those
pipelines with ``save_pretrained``, loads it back with ``hf_precision.load_pipeline(folder, "cpu", dtype={...})``
(denoiser bfloat16, VAE float16, the rest float32 by default: a layout plain diffusers refuses for most families),
calls it, and prints one JSON line per pipeline class: whether the asked dtypes were honoured, whether the output
is finite, and the error if any. With ``--plain`` the same layout goes through plain ``from_pretrained`` first.

The dummy components load a few tiny tokenizers and encoders from the Hub (``hf-internal-testing/tiny-random-t5``
...). Offline, ``--hub DIR`` makes local stand-ins under DIR (tokenizers built by ``hf_precision.testing``, random
tiny encoders) and runs from there, so the relative Hub ids resolve to those folders. Classes whose dummies need
something else from the Hub, OpenCV, ``ftfy`` or a chat template are reported as setup errors, not counted.

Usage (the numbers are in docs/pipelines.md, "diffusers' own test pipelines"):
    python benchmarks/diffusers_tests_sweep.py --diffusers /path/to/diffusers --hub /tmp/hub [module ...] > out.jsonl
    (diffusers' tests import ``parameterized`` and ``requests_mock``: pip install them, or pass --extra DIR)
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from pathlib import Path

LAYOUT = {"denoiser": "bfloat16", "vae": "float16", "default": "float32"}
DENOISERS = ("transformer", "unet", "prior", "decoder", "transformer_2")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{% if m['content'] is string %}{{ m['content'] }}"
                 "{% else %}{% for c in m['content'] %}{% if c['type'] == 'text' %}{{ c['text'] }}{% endif %}{% endfor %}"
                 "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def make_hub(root: Path) -> None:
    """Offline stand-ins for the Hub ids diffusers' dummy components load (tokenizers and tiny text encoders)."""
    import torch
    from transformers import BertConfig, BertModel, T5Config, T5EncoderModel, UMT5Config, UMT5EncoderModel

    from hf_precision.testing import make_t5_tokenizer, make_tokenizer
    from hf_precision.testing.tokenizers import make_bert_tokenizer, make_gemma_tokenizer, make_qwen2_tokenizer

    hub = root / "hf-internal-testing"
    t5_tok = make_t5_tokenizer()
    torch.manual_seed(0)
    small = {"d_model": 32, "d_ff": 37, "d_kv": 8, "num_heads": 4, "num_layers": 2, "relative_attention_num_buckets": 8}
    t5 = T5EncoderModel(T5Config(vocab_size=1103, **small, decoder_start_token_id=0, pad_token_id=0, eos_token_id=1))
    t5.save_pretrained(hub / "tiny-random-t5")
    t5.config.save_pretrained(hub / "tiny-random-t5")
    t5_tok.save_pretrained(hub / "tiny-random-t5")
    UMT5EncoderModel(UMT5Config(vocab_size=256, is_encoder_decoder=False, **small)).save_pretrained(hub / "tiny-random-umt5")
    t5_tok.save_pretrained(hub / "tiny-random-umt5")
    make_tokenizer().save_pretrained(hub / "tiny-random-clip")
    make_gemma_tokenizer().save_pretrained(hub / "dummy-gemma")
    qwen = make_qwen2_tokenizer()
    qwen.chat_template = CHAT_TEMPLATE  # Flux 2 Klein, Z-Image, Ovis ... call apply_chat_template
    qwen.save_pretrained(hub / "tiny-random-Qwen2VLForConditionalGeneration")
    # Wan I2V/VACE, SkyReels, Helios call ftfy.fix_text without checking for it: an identity stand-in
    (root / "ftfy.py").write_text("def fix_text(text, *args, **kwargs):\n    return text\n")
    from hf_precision.testing.tokenizers import make_llama_tokenizer

    make_llama_tokenizer().save_pretrained(root / "finetrainers" / "dummy-hunyaunvideo" / "tokenizer")  # HunyuanVideo
    bert_tok = make_bert_tokenizer()
    BertModel(BertConfig(vocab_size=1124, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                         intermediate_size=37)).save_pretrained(hub / "tiny-random-BertModel")
    bert_tok.save_pretrained(hub / "tiny-random-BertModel")


def testers(module: str):
    """(name, class) of each test class in ``module`` that builds a pipeline from dummy components."""
    mod = importlib.import_module(module)
    for name, obj in vars(mod).items():
        if (inspect.isclass(obj) and obj.__module__ == mod.__name__ and hasattr(obj, "get_dummy_components")
                and getattr(obj, "pipeline_class", None)):
            yield name, obj


def dummy_inputs(tester):
    try:
        return tester.get_dummy_inputs("cpu")
    except TypeError:  # the newer pytest-style testers take no device
        return tester.get_dummy_inputs()


def finite(out) -> bool:
    import numpy as np
    import torch

    value = next((getattr(out, k) for k in ("images", "frames", "audios", "image_embeddings", "image_embeds")
                  if getattr(out, k, None) is not None), None)
    if value is None:
        value = out.to_tuple()[0] if hasattr(out, "to_tuple") else out[0]
    if isinstance(value, list) and value and hasattr(value[0], "size") and not torch.is_tensor(value[0]):
        value = [np.asarray(v) for v in value]  # PIL images
    if isinstance(value, list):
        value = np.stack([v.float().numpy() if torch.is_tensor(v) else np.asarray(v) for v in value])
    if torch.is_tensor(value):
        value = value.float().numpy()
    return bool(np.isfinite(np.asarray(value, dtype=np.float64)).all())


def layout_for(models: list[str], layout: dict[str, str] = LAYOUT) -> dict[str, str] | None:
    denoiser = next((n for n in DENOISERS if n in models), None)
    if denoiser is None:
        return None
    return {n: layout["denoiser"] if n == denoiser else layout["vae"] if n in ("vae", "movq") else layout["default"]
            for n in models}


def _ftfy_stand_in() -> None:
    # Pipelines import ftfy only when it is installed (is_ftfy_available) and then call it anyway: hand the
    # stand-in to every pipeline module that has a basic_clean() and no ftfy.
    try:
        import ftfy
    except ImportError:
        return
    for name, mod in list(sys.modules.items()):
        if name.startswith("diffusers.pipelines") and hasattr(mod, "basic_clean") and not hasattr(mod, "ftfy"):
            mod.ftfy = ftfy


def run_one(tester_cls, plain: bool, scratch: Path, layout: dict[str, str] = LAYOUT) -> dict:
    import torch

    _ftfy_stand_in()

    import hf_precision as hp

    tester = tester_cls("run") if hasattr(tester_cls, "run") else tester_cls()
    row: dict = {"class": tester_cls.pipeline_class.__name__}
    torch.manual_seed(0)
    components = tester.get_dummy_components()
    folder = Path(tempfile.mkdtemp(dir=scratch))
    tester_cls.pipeline_class(**components).save_pretrained(folder, safe_serialization=True)
    models = [n for n, c in components.items() if isinstance(c, torch.nn.Module)]
    asked = layout_for(models, layout)
    if asked is None:
        row["skipped"] = "no denoiser component"
        return row
    row["asked"] = asked
    if plain:
        try:
            pipe = tester_cls.pipeline_class.from_pretrained(folder, torch_dtype={k: getattr(torch, v) for k, v in asked.items()})
            row["plain"] = "finite" if finite(pipe(**dummy_inputs(tester))) else "NOT finite"
        except Exception as err:  # noqa: BLE001 - recorded: plain diffusers refusing the layout is the point
            row["plain"] = f"{type(err).__name__}: {str(err)[:160]}"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            pipe = hp.load_pipeline(folder, "cpu", dtype=asked)
        got = {n: str(getattr(pipe, n).dtype).replace("torch.", "") for n in models if hasattr(getattr(pipe, n, None), "dtype")}
        row["dtypes_honoured"] = all(got[n] == asked[n] for n in got)
        row["hf_precision"] = "finite" if finite(pipe(**dummy_inputs(tester))) else "NOT finite"
    except Exception as err:  # noqa: BLE001 - a sweep records what broke and goes on
        row["hf_precision"] = f"{type(err).__name__}: {str(err)[:300]}"
        row["traceback"] = traceback.format_exc()[-1200:]
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", help="test modules (tests.pipelines.wan.test_wan); default: all")
    parser.add_argument("--diffusers", required=True, type=Path, help="a diffusers checkout (its tests/ folder is used)")
    parser.add_argument("--hub", type=Path, help="make offline Hub stand-ins here and run from there")
    parser.add_argument("--extra", type=Path, help="a folder with extra test dependencies (pip install --target)")
    parser.add_argument("--plain", action="store_true", help="also run plain diffusers with the same dtype dict")
    parser.add_argument("--dtypes", default="denoiser=bfloat16,vae=float16,default=float32",
                        help="the layout: denoiser=..., vae=..., default=... (default: %(default)s)")
    args = parser.parse_args(argv)
    try:
        layout = dict(item.split("=", 1) for item in args.dtypes.split(","))
        assert set(layout) == {"denoiser", "vae", "default"}
    except (ValueError, AssertionError):
        parser.error(f"--dtypes {args.dtypes!r}: give denoiser=DTYPE,vae=DTYPE,default=DTYPE")
    sys.path[:0] = [str(args.diffusers)] + ([str(args.extra)] if args.extra else [])
    modules = args.modules or sorted(
        ".".join(p.with_suffix("").relative_to(args.diffusers).parts)
        for p in (args.diffusers / "tests" / "pipelines").rglob("test_*.py")
        if not any(s in p.name for s in ("test_pipelines", "onnx", "test_pipeline_utils")))
    if args.hub:
        args.hub.mkdir(parents=True, exist_ok=True)
        if not (args.hub / "hf-internal-testing" / "tiny-random-t5").is_dir():
            make_hub(args.hub)
        os.chdir(args.hub)
        sys.path.insert(0, str(args.hub))  # the ftfy stand-in
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    scratch = Path(tempfile.mkdtemp(prefix="sweep-"))
    seen: set[type] = set()
    for module in modules:
        try:
            found = list(testers(module))
        except Exception as err:  # noqa: BLE001
            print(json.dumps({"module": module, "import": f"{type(err).__name__}: {str(err)[:200]}"}), flush=True)
            continue
        for name, tester_cls in found:
            if tester_cls.pipeline_class in seen:
                continue
            seen.add(tester_cls.pipeline_class)
            start = time.perf_counter()
            try:
                row = run_one(tester_cls, args.plain, scratch, layout)
            except Exception as err:  # noqa: BLE001
                row = {"class": getattr(tester_cls.pipeline_class, "__name__", name),
                       "setup": f"{type(err).__name__}: {str(err)[:200]}"}
            row.update(module=module, tester=name, seconds=round(time.perf_counter() - start, 1))
            print(json.dumps(row), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
