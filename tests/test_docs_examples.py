"""docs/*.md and the ``--help`` examples as tests: every code block of the docs and every example line of an epilog
runs here, or is listed with the reason it does not (issue 34).

The machinery is tests/test_readme.py's (tests/readme_commands.py): the same folder of tiny random-weight stand-ins
under the names the docs use, the commands run in this process, GPU commands checked as their CPU refusal and then
the fix it names, video and training commands at the stand-in's size, output compared loosely (whitespace collapsed,
``...`` for what the docs leave out, numbers free) except figures a command computes from configs alone (bytes,
parameter counts), which must be the command's. A command the README already runs is not run twice (``readme``).
What cannot run in a few seconds here (benchmarks, the plans of real model configs, multi-process launches) has a
cheap twin in the suite (its arguments parse with its program's own parser; the plan of a smaller run) and a
``heavy`` test (``make test-heavy``). A docs block or epilog example that none of this covers fails
``test_every_docs_block_is_covered`` / ``test_every_epilog_example_is_covered``.
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import io
import re
import shlex
import sys
from pathlib import Path
from typing import Any

import pytest

import hf_precision as hp

from readme_commands import (BYTES, DOCS, README, ROOT, Block, Command, assert_clean, blocks,  # noqa: E402
                             ensure_stand_ins, inside, missing_lines, run_as_written, run_in_process, run_subprocess,
                             shell_commands, stand_in_folder)
from docs_commands import (COMMANDS, SCRIPTS, _launched, _offline, _works, doc_commands, epilog_examples,  # noqa: E402
                           how, parse_only, _parsers, run_statements)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """The README test's folder of stand-ins (built once per process), the working directory while the module runs."""
    with inside(stand_in_folder(tmp_path_factory, eager=False)) as work:
        yield work


def _id(c: Command) -> str:
    return f"{c.where} {c.text[:60]}"


def _runs(c: Command) -> bool:
    plan = how(c.text)
    return plan is None or plan[0] == "refusal"


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if _runs(c)], ids=_id)
def test_doc_command(cmd, workdir, no_gpu):
    """Each command exits as the docs show, prints no traceback, and prints the lines the docs show (figures from
    configs alone, e.g. bytes, exactly). A GPU command: its one-line CPU refusal; the fix it names parses here and
    runs in test_doc_command_heavy."""
    plan = how(cmd.text)
    if plan is not None:
        _, fix, says = plan
        result = run_as_written(cmd.text)
        assert_clean(result, cmd.text, 2)
        assert says in result.err and len(result.err.strip().splitlines()) == 1, result.err
        if fix is not None:
            with contextlib.redirect_stderr(io.StringIO()):
                parse_only(shlex.split(fix))
        return
    run_and_compare(cmd)


def run_and_compare(cmd: Command) -> None:
    """Run a command of the docs as written here and compare what it prints (and writes) with what the docs show."""
    result = run_as_written(_offline(cmd.text))
    assert_clean(result, cmd.text, cmd.exit or 0)
    missing = missing_lines(cmd.expected, result.text, exact=BYTES)
    assert not missing, f"{cmd.where}: `{cmd.text}` no longer prints:\n" + "\n".join(missing) + \
        f"\n--- it printed:\n{result.text[-4000:]}"
    _check_output_blocks(cmd.text, result.text)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if (how(c.text) or ("",))[0] == "refusal" and how(c.text)[1]
                                 or (how(c.text) or ("",))[0] == "heavy"], ids=_id)
def test_doc_command_heavy(cmd, workdir, no_gpu):
    """The commands that do a model's work, as written at the stand-in's size (a GPU command: the fix its refusal
    names), their output compared as test_doc_command compares it."""
    plan = how(cmd.text)
    if plan[0] == "refusal":
        assert_clean(run_as_written(plan[1]), plan[1], 0)
        return
    run_and_compare(cmd)


@pytest.mark.parametrize("cmd", [c for c in COMMANDS if (how(c.text) or ("",))[0] in ("parse", "heavy", "heavy-test")],
                         ids=_id)
def test_doc_command_parses(cmd, workdir):
    """The cheap twin of what runs elsewhere or in a heavy test: the arguments parse with the program's parser."""
    with contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            parse_only(_launched(cmd.text))
        except SystemExit as exit_:
            raise AssertionError(f"{cmd.where}: `{cmd.text}`: {err.getvalue()}") from None


def test_every_command_has_a_runner():
    kinds = {(how(c.text) or ("as written",))[0] for c in COMMANDS}
    assert kinds <= {"as written", "refusal", "readme", "parse", "heavy", "heavy-test", "skip-why"}, kinds
    assert len(doc_commands()) > 40 and len(epilog_examples()) > 20  # the extraction still finds them


def test_every_epilog_example_is_covered():
    """Every subcommand's ``--help`` is read, and the epilogs' examples are the commands above."""
    parsers = _parsers()
    assert {"hf-precision --help", "hf-precision train --help", "hf-precision video --help"} <= set(parsers)
    examples = epilog_examples()
    for where in ("hf-precision --help", "hf-precision train --help", "hf-precision video --help"):
        assert any(c.where == where for c in examples), where
    for c in examples:
        assert shlex.split(c.text)[0] in ("hf-precision", "accelerate", "torchrun"), c.text


# ------------------------------------------------------------------------------------------------ coverage


def _first(block: Block) -> str:
    return block.text.splitlines()[0] if block.text else ""


def test_every_docs_block_is_covered():
    """Every fenced block of docs/*.md runs here or is listed with the reason it does not."""
    tables = set(NOT_COMMANDS) | set(PYTHON_BLOCKS) | set(YAML_BLOCKS) | \
        {f"{doc}:{first}" for (doc, first) in OUTPUT_BLOCKS}
    uncovered = []
    for path in DOCS:
        for b in blocks(path):
            if b.lang in ("bash", "", "text") and shell_commands(b):
                continue
            if f"{path.name}:{_first(b)}" not in tables:
                uncovered.append(f"{b.where} ({b.lang or 'text'}): {_first(b)}")
    assert not uncovered, "docs blocks that no test runs: add them to a table of tests/test_docs_examples.py:\n" + \
        "\n".join(uncovered)
    stale = [key for key in tables if not any(f"{p.name}:{_first(b)}" == key for p in DOCS for b in blocks(p))]
    assert not stale, f"table entries whose block is gone: {stale}"


# Blocks that are not commands, by file:first line, and why (each is still checked where it can be).
NOT_COMMANDS = {
    "DESIGN.md:errors, dtypes, lazy, units  <-  recipe/  <-  runtime/  <-  diagnose/  <-  training/  <-  memory/  <-  "
    "apps/  <-  cli/  <-  scripts/, benchmarks/": "the layer diagram; tests/test_layers.py checks the imports go one way",
    "train-program.md:OUT/pytorch_lora_weights.safetensors   the LoRA (diffusers/peft format, --save-dtype, default "
    "float16): pipe.load_lora_weights(OUT)": "the files a run writes; tests/test_train_run.py checks them",
}
# Python blocks, by file:first line -> the test below that runs them.
PYTHON_BLOCKS = {
    "DESIGN.md:import hf_precision as hp": "test_design_api_listing",
    "calibrate.md:import hf_precision as hp": "test_python_block_heavy",
    'quantization.md:pipe = hp.load_pipeline("./FLUX.1-dev", "cuda", quantize={"transformer": "int8", '
    '"text_encoder_2": "nf4"})': "test_quantization_block_is_the_readmes",
    'quantization.md:pipe = hp.load_pipeline("./stable-diffusion-v1-5", "cpu", quantize={"unet": "int8"})':
        "test_python_block",
    "training.md:import torch, hf_precision as hp": "test_training_loop_block",
    'training.md:tr = hp.resolve_training("./my-sdxl", "cuda", train={"unet": "lora"})   # refuses what cannot '
    'train, before loading': "test_python_block_heavy",
    "training.md:with tp.autocast():": "test_autocast_block",
}
# Override files, by file:first line -> the recipe they are written for (test_override_yaml_block loads them).
YAML_BLOCKS = {"DESIGN.md:schema: 1": "sdxl", "quantization.md:schema: 1": "flux"}
# Output blocks without a `$` command, by (file, first line) -> the command that prints or writes them, and where:
# "out" = its printed output, or a file it writes (test_doc_command compares them after the command runs).
OUTPUT_BLOCKS = {
    ("calibrate.md", "calibrate planted_sdxl: layout t4, target float16, reference float32"):
        ("hf-precision calibrate planted_sdxl", "out"),
    ("calibrate.md", "  vae:"): ("hf-precision calibrate planted_sdxl", "islands.yaml"),
}


def _check_output_blocks(text: str, printed: str) -> None:
    for (doc, first), (cmd, where) in OUTPUT_BLOCKS.items():
        if not text.startswith(cmd):
            continue
        block = next(b for b in blocks(ROOT / "docs" / doc) if _first(b) == first)
        have = printed if where == "out" else Path(where).read_text(encoding="utf-8")
        missing = missing_lines(block.text.splitlines(), have, exact=BYTES)
        assert not missing, f"{block.where}: `{text}` no longer {'prints' if where == 'out' else 'writes'}:\n" + \
            "\n".join(missing) + f"\n--- it {'printed' if where == 'out' else 'wrote'}:\n{have[-4000:]}"


def test_output_blocks_are_compared():
    """Each output block's command is one of the docs' commands test_doc_command(_heavy) runs, so it is compared."""
    for cmd, _ in OUTPUT_BLOCKS.values():
        assert any(c.text.startswith(cmd) and (_runs(c) or _works(c.text)) for c in doc_commands()), cmd


# ------------------------------------------------------------------------------------------------ python blocks


def _python(doc: str, start: str) -> Block:
    return next(b for b in blocks(ROOT / "docs" / doc) if b.lang == "python" and b.text.startswith(start))


def _run_python_block(key: str) -> None:
    import torch

    doc, first = key.split(":", 1)
    block = _python(doc, first)
    ensure_stand_ins(block.text)
    namespace: dict[str, Any] = {"hp": hp}
    printed = run_statements(block, namespace)
    if "hp.calibrate(" in block.text:
        assert "islands:" in printed and Path("islands.yaml").is_file()
    if "tp" in namespace:
        assert all(p.dtype == torch.float32 for p in namespace["tp"].parameters())  # the trainable fp32 masters


@pytest.mark.parametrize("key", [k for k, test in PYTHON_BLOCKS.items() if test == "test_python_block"])
def test_python_block(key, workdir, no_gpu):
    """The block statement by statement, on the stand-ins, with the fixes the errors name on this CPU."""
    _run_python_block(key)


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("key", [k for k, test in PYTHON_BLOCKS.items() if test == "test_python_block_heavy"])
def test_python_block_heavy(key, workdir, no_gpu):
    """A block that calibrates or trains SDXL (tens of seconds of CPU), run as test_python_block runs one."""
    _run_python_block(key)


@pytest.mark.parametrize("key", [k for k in PYTHON_BLOCKS if not k.startswith("DESIGN.md:") and "hp." in k])
def test_python_block_calls_bind(key):
    """Every Python block (the cheap twin of the heavy ones): each ``hp.f(...)`` call it makes binds to f's signature
    (a keyword f does not take fails here as it would for the reader)."""
    doc, first = key.split(":", 1)
    block = _python(doc, first)
    calls = [n for n in ast.walk(ast.parse(block.text)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) and n.func.value.id == "hp"]
    assert calls, block.where
    for call in calls:
        func = getattr(hp, call.func.attr)
        args = [None] * len(call.args)
        kwargs = {k.arg: None for k in call.keywords if k.arg}
        inspect.signature(func).bind(*args, **kwargs)  # TypeError names the argument


def test_design_api_listing():
    """DESIGN.md's API list: every name is hp's, and every parameter it shows is the function's."""
    block = _python("DESIGN.md", "import hf_precision as hp")
    for line in block.text.splitlines()[1:]:
        name = re.match(r"hp\.(\w+)", line)[1]
        assert hasattr(hp, name), line
        params = re.match(r"hp\.\w+\(([^)]*)\)", line)
        if params is None or params[1] in ("...", "") or inspect.isclass(getattr(hp, name)):
            continue
        have = inspect.signature(getattr(hp, name)).parameters
        for param in params[1].split(","):
            param = param.strip().split("=")[0]
            if param.startswith("**"):  # named for what it is passed on to
                assert any(p.kind is p.VAR_KEYWORD for p in have.values()), f"DESIGN.md: {line}: hp.{name} takes no **"
                continue
            param = param.strip("* ")
            assert not param or param in have, f"DESIGN.md: {line}: hp.{name} has no parameter {param}"


def test_override_yaml_block(tmp_path):
    for key, recipe in YAML_BLOCKS.items():
        doc, first = key.split(":", 1)
        block = next(b for b in blocks(ROOT / "docs" / doc) if b.lang == "yaml" and b.text.startswith(first))
        (tmp_path / "o.yaml").write_text(block.text)
        loaded = hp.get_recipe(recipe, device="t4", overrides=str(tmp_path / "o.yaml"))
        assert loaded is not None, block.where


def test_quantization_block_is_the_readmes():
    """docs/quantization.md opens with the README's quantized-weights statement: test_readme::test_quantize_block runs
    it (torchao int8 + bitsandbytes nf4 loads on the CPU)."""
    docs = _python("quantization.md", 'pipe = hp.load_pipeline("./FLUX.1-dev"')
    readme = next(b for b in blocks(README) if b.lang == "python" and b.text.startswith(docs.text))
    assert readme.text.splitlines()[0] == docs.text


@pytest.mark.heavy
@pytest.mark.slow
def test_training_loop_block(workdir, no_gpu):
    """docs/training.md's loop on the SD 1.5 stand-in ("or any DiffusionPipeline"; the Hub id is offline here), a
    one-batch loader, the T4 layout run on this CPU, 2 sampling steps."""
    import torch

    block = _python("training.md", "import torch, hf_precision as hp")
    ensure_stand_ins("./sd15")
    source = (block.text.replace('"stabilityai/stable-diffusion-xl-base-1.0"', '"./sd15"')
              .replace('device="cuda"', 'device="cpu", layout="t4"').replace("num_inference_steps=20",
                                                                            "num_inference_steps=2, height=32, width=32"))
    namespace = {"loader": [(torch.rand(1, 3, 32, 32) * 2 - 1, ["a cat"])]}
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        exec(compile(source, block.where, "exec"), namespace)
    assert "lora" in printed.getvalue() and (Path("out") / "pytorch_lora_weights.safetensors").is_file()
    assert Path("state.pt").is_file() and namespace["images"]


def test_autocast_block(workdir, no_gpu):
    """docs/training.md's own-loop fragment, with the names it uses made from the sd15 stand-in."""
    import torch

    block = _python("training.md", "with tp.autocast():")
    ensure_stand_ins("./sd15")
    pipe = hp.load_pipeline("./sd15", "cpu", layout="t4")
    tp = hp.prepare_training(pipe, "cpu", layout="t4", train={"unet": "lora"})
    latents = tp.encode_images(torch.rand(1, 3, 32, 32) * 2 - 1)
    noise = torch.randn_like(latents)
    namespace = {"tp": tp, "torch": torch, "noisy_latents": latents + noise, "timestep": torch.tensor([10]),
                 "prompt_embeds": next(iter(tp.encode_prompt(["a cat"]).values())), "noise": noise,
                 "optimizer": torch.optim.AdamW(tp.parameters(), lr=1e-4)}
    exec(compile(block.text, block.where, "exec"), namespace)
    # the loss reached the trainable fp32 masters (the step itself may be skipped: fp16's scaler starts high)
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in tp.parameters())


# ------------------------------------------------------------------------------------------------ heavy ones


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("cmd", [c for c in COMMANDS if any(s in c.text for s in SCRIPTS) and how(c.text)[0] != "readme"],
                         ids=_id)
def test_benchmark_script_commands(cmd, workdir, tmp_path):
    """The docs' benchmark commands as separate programs, at their smallest (the real runs take minutes to hours)."""
    tokens = _launched(re.sub(r"--device cuda\b", "", cmd.text))  # no GPU here: the same code on the CPU
    script = next(t for t in tokens if t.endswith(".py"))
    smallest = {"benchmark.py": ["--size", "tiny", "--quick", "--out", str(tmp_path)]
                + ([] if "--only" in tokens else ["--only", "apply"]),
                "bench_training.py": ["--sizes", "tiny", "--steps", "1", "--warmup", "0"],
                "video_memory.py": ["--size", "tiny", "--frames", "2", "--height", "32", "--width", "32", "--chunks", "1",
                                    "--workdir", str(tmp_path)]}[Path(script).name]
    args = [sys.executable, str(ROOT / script), *tokens[tokens.index(script) + 1:], *smallest]
    result = run_subprocess(args, workdir, timeout=600)
    assert_clean(result, cmd.text, 0)


@pytest.mark.heavy
@pytest.mark.slow
def test_real_wan_plan_block(workdir):
    """docs/video.md's plan of the real Wan 1.3B configs for 8 GB, as the docs show it, every byte figure included."""
    cmd = next(c for c in doc_commands() if "wan2.1-t2v-1.3b-configs" in c.text)
    result = run_in_process(["python", *shlex.split(cmd.text.replace("tests/", str(ROOT / "tests") + "/"))[1:]])
    assert_clean(result, cmd.text, 0)
    assert not missing_lines(cmd.expected, result.text, exact=BYTES), (missing_lines(cmd.expected, result.text,
                                                                                     exact=BYTES), result.out)


def test_real_wan_plan_block_twin(workdir):
    """The cheap twin: the same command on the tiny Wan stand-in at its size (the real configs at 832x480 take minutes
    of CPU): the plan's lines, figures free, are the ones the docs show."""
    cmd = next(c for c in doc_commands() if "wan2.1-t2v-1.3b-configs" in c.text)
    tokens = shlex.split(cmd.text)
    tokens[tokens.index("--model") + 1] = "./Wan2.1-T2V-1.3B-Diffusers"
    result = run_as_written(shlex.join([*tokens, "--height", "16", "--width", "16", "--frames", "5"]))
    assert_clean(result, cmd.text, 0)
    shown = [line for line in cmd.expected if line.startswith(("plan:", "settings ", "chosen for"))]
    shown = [re.sub(r": offload .*", "", line) for line in shown]  # what fits 8 GB differs for a tiny model
    assert len(shown) == 3 and not missing_lines(shown, result.text), (missing_lines(shown, result.text), result.out)


# ------------------------------------------------------------------------------------------------ what the docs found


def test_a_missing_gpu_is_one_error_with_a_layout_or_a_resolved_recipe(workdir, no_gpu):
    """docs/training.md's ``hp.load_pipeline("./my-sdxl", "cuda", recipe=tr.recipe)`` on a machine without CUDA
    crashed in torch ("Torch not compiled with CUDA enabled", at the first weight moved): with ``layout=`` or a
    resolved recipe the device's presence was never checked. Now: one RecipeError naming the fix that applies."""
    from hf_precision.testing import make_pipeline

    ensure_stand_ins("./sd15")
    with pytest.raises(hp.RecipeError, match="layout='t4'") as info:
        hp.load_pipeline("./sd15", "cuda", layout="t4")
    assert len(str(info.value).splitlines()) == 1
    tr = hp.resolve_training("./sd15", "cpu", layout="t4", train={"unet": "lora"})
    with pytest.raises(hp.RecipeError, match="device='cpu'"):
        hp.load_pipeline("./sd15", "cuda", recipe=tr.recipe)
    pipe = make_pipeline("sd15")
    with pytest.raises(hp.RecipeError, match="layout='t4'"):
        hp.apply_recipe(pipe, device="cuda", layout="t4")
    with pytest.raises(hp.RecipeError, match="device='cpu'"):
        hp.prepare_training(pipe, "cuda", recipe=tr)
