"""Shared fixtures: tiny random-weight pipelines (built once per session) and saved pipeline folders.

Running the suite as another CPU: ``HF_PRECISION_CPU_FLAGS=amx pytest`` (or ``pytest --cpu-flags amx``) makes the
device probe report those flags, in this process and in every subprocess the tests start (see
``hf_precision/recipe/devices.py``). Tests whose expectation depends on what the probe reads are marked ``probe``;
each runs as this CPU and once more as each CPU of ``PROBE_CPUS`` (an AMX CPU, an AVX512 CPU without AMX or
AVX512-BF16/FP16, an AVX2-only CPU), in the same session, so a machine of any kind checks every form.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

# Everything is built from configs: never touch the network.
os.environ.setdefault("HF_HUB_OFFLINE", "1")

# The CPUs (HF_PRECISION_CPU_FLAGS) a test marked ``probe`` runs as, besides this one: a Sapphire Rapids Xeon, an
# AVX512 CPU without AMX or the bf16/fp16 extensions, an AVX2-only CPU.
PROBE_CPUS = {"amx": "avx2,avx512f,avx512_bf16,amx_tile,amx_bf16", "avx512": "avx2,avx512f", "avx2": "avx2"}


@pytest.fixture(scope="session")
def tiny_pipes() -> dict:
    """Session cache of tiny pipelines keyed by registry name (``hf_precision.testing.PIPELINES``: "sdxl", ...).

    Filled on demand by ``tiny_pipe``; treat the cached pipelines as read-only.
    """
    return {}


@pytest.fixture
def tiny_pipe(tiny_pipes):
    """Factory: ``tiny_pipe(kind)`` returns a fresh deep copy of the session's tiny pipeline of ``kind``."""
    from hf_precision.testing.registry import make_pipeline

    def get(kind: str):
        if kind not in tiny_pipes:
            tiny_pipes[kind] = make_pipeline(kind, size="tiny", seed=0)
        return copy.deepcopy(tiny_pipes[kind])

    return get


@pytest.fixture(scope="session")
def saved_pipeline(tmp_path_factory, tiny_pipes):
    """Factory: ``saved_pipeline(kind, fp16_variant=False)`` returns a folder saved once per session.

    With ``fp16_variant=True`` the folder holds both ``*.safetensors`` and ``*.fp16.safetensors`` (and, as
    on the Hub, transformers ``config.json`` files that say ``"dtype": "float16"``).
    """
    from hf_precision.testing.pipelines import save_pipeline
    from hf_precision.testing.registry import make_pipeline

    folders: dict[tuple[str, bool], Path] = {}

    def get(kind: str, fp16_variant: bool = False) -> Path:
        key = (kind, bool(fp16_variant))
        if key not in folders:
            if kind not in tiny_pipes:
                tiny_pipes[kind] = make_pipeline(kind, size="tiny", seed=0)
            folder = tmp_path_factory.mktemp(f"{kind}-fp16" if fp16_variant else kind)
            folders[key] = save_pipeline(tiny_pipes[kind], folder, fp16_variant=fp16_variant)
        return folders[key]

    return get


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one thread for a module (``pytestmark = pytest.mark.usefixtures("one_thread")``), restored after.

    The tiny models are dominated by per-op overhead; with several threads on a shared, busy CPU each op waits on
    the others (10-50x slower there), so one thread is several times faster than two on a 2-core machine."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def train_demo(tmp_path_factory) -> tuple[Path, Path]:
    """``(model folder, data folder)`` of ``hf-precision train --demo`` (a tiny SD 1.x and captioned images), made
    once per session; the tests read them and write their outputs elsewhere."""
    from hf_precision.apps.train.demo import make_demo

    return make_demo(tmp_path_factory.mktemp("train-demo"))


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory):
    """One ``hf-precision demo --out DIR --json --device cpu`` in this process, shared by tests/test_main_job.py and
    README's `make demo` check (tests/test_readme.py): ``(result, printed text, measurements, DIR)``, ``result`` a
    ``readme_commands.Result`` (exit code, stdout, stderr). The demo is the suite's longest single command; run twice
    it cost ~30 s more, and each xdist worker ran it once: now once per run (:func:`once_per_run`). ``--json`` only
    appends the measurements to what the demo prints: ``text`` is what it printed before them. Read-only for the
    tests."""
    import json

    from readme_commands import Result, run_in_process

    def run() -> tuple[Result, Path]:
        out = tmp_path_factory.mktemp("demo") / "demo_output"
        return run_in_process(["hf-precision", "demo", "--out", str(out), "--json", "--device", "cpu"]), out

    found = once_per_run(tmp_path_factory, "demo_run", lambda: _saved_run(run()))
    result, out = Result(found["code"], found["out"], found["err"]), Path(found["folder"])
    assert result.code == 0 and "Traceback" not in result.err, result.out[-3000:] + result.err[-3000:]
    split = result.out.rindex("\n{")  # what the demo printed, then the --json dump
    return result, result.out[:split], json.loads(result.out[split + 1:]), out


def _saved_run(run: tuple[Any, Path]) -> dict[str, Any]:
    result, folder = run
    return {"code": result.code, "out": result.out, "err": result.err, "folder": str(folder)}


def once_per_run(tmp_path_factory, name: str, make: Callable[[], Any]) -> Any:
    """``make()`` (JSON-able) once per pytest run, shared by its xdist workers: the first worker to ask makes it
    under a file lock in the run's own base folder, the others read what it saved (pytest-xdist's documented way to
    run a session fixture once). Without xdist, each call makes it (the base folder's parent outlives the run)."""
    import json

    from filelock import FileLock

    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return make()
    root = tmp_path_factory.getbasetemp().parent  # this run's folder, above every worker's own
    saved = root / f"{name}.json"
    with FileLock(str(saved) + ".lock"):
        if not saved.is_file():
            saved.write_text(json.dumps(make()))
        return json.loads(saved.read_text())


def pytest_addoption(parser):
    group = parser.getgroup("hf_precision")
    group.addoption("--cpu-flags", default=None, metavar="FLAGS",
                    help="run as a CPU with these flags: sets HF_PRECISION_CPU_FLAGS (e.g. amx, avx2, none, "
                         "'avx2,avx512f,avx512_bf16') for the tests and their subprocesses")
    group.addoption("--cpu-name", default=None, metavar="NAME", help="sets HF_PRECISION_CPU_NAME likewise")


def pytest_configure(config):
    config.addinivalue_line("markers", "probe: the expectation depends on what the device probe reads about this "
                                       "machine (CPU flags, the dtypes the cpu rules pick); each runs as this "
                                       "CPU and as every CPU of tests/conftest.py PROBE_CPUS")
    from hf_precision.recipe.devices import CPU_FLAGS_ENV, CPU_NAME_ENV, cpu_flags_from_env, cpu_name_from_env, set_probe
    from hf_precision.errors import RecipeError

    for option, variable in (("--cpu-flags", CPU_FLAGS_ENV), ("--cpu-name", CPU_NAME_ENV)):
        if config.getoption(option) is not None:
            os.environ[variable] = config.getoption(option)
    try:
        cpu_flags_from_env(), cpu_name_from_env()
    except RecipeError as e:
        raise pytest.UsageError(str(e)) from None
    set_probe(None)  # profiles read before the options were applied are dropped
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT") or 0)
    if workers > 1:  # `make test` runs pytest-xdist workers
        import torch

        from launch import share_cores

        # torch's default of one thread per core in every worker, and in every subprocess a test starts, would
        # oversubscribe the cores the workers share
        torch.set_num_threads(share_cores(workers, os.environ))


def pytest_report_header(config):
    from hf_precision.recipe.devices import CPU_FLAGS_ENV, device_caps

    caps = device_caps("cpu")
    flags = sorted(f for f in caps.profile.cpu_flags if f.startswith(("avx512_bf16", "avx512_fp16", "amx")))
    source = f"{CPU_FLAGS_ENV}={os.environ[CPU_FLAGS_ENV]!r}" if os.environ.get(CPU_FLAGS_ENV, "").strip() else "this CPU"
    return (f"hf_precision cpu ({source}): {caps.profile.label()}; bf16/fp16 flags: {', '.join(flags) or 'none'}; "
            f"cpu rules: {', '.join(caps.tags)}; picks unasked: {', '.join(caps.auto)}")


@pytest.fixture
def cpu_as(monkeypatch):
    """Factory: ``cpu_as("amx")`` makes the device probe report those CPU flags (``HF_PRECISION_CPU_FLAGS``)
    for the rest of the test and its subprocesses; returns ``device_caps("cpu")``. Undone after the test."""
    from hf_precision.recipe.devices import CPU_FLAGS_ENV, CPU_NAME_ENV, device_caps, set_probe

    def install(flags: str, name: str | None = None):
        monkeypatch.setenv(CPU_FLAGS_ENV, flags)
        if name is None:
            monkeypatch.delenv(CPU_NAME_ENV, raising=False)
        else:
            monkeypatch.setenv(CPU_NAME_ENV, name)
        set_probe(None)
        return device_caps("cpu")

    yield install
    monkeypatch.undo()
    set_probe(None)


@pytest.fixture
def no_gpu(monkeypatch):
    """This machine as a CPU-only one for one test: torch reports no CUDA, XPU or MPS device in this process (the
    device probe reads it afresh) and its subprocesses see none (``CUDA_VISIBLE_DEVICES=""``). For tests that mean
    the CPU run on any machine, such as a GPU command's CPU refusal. Undone after the test."""
    import torch

    from hf_precision.recipe.devices import set_probe

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    if hasattr(torch, "xpu"):
        monkeypatch.setattr(torch.xpu, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    set_probe(None)
    yield
    monkeypatch.undo()
    set_probe(None)


def pytest_generate_tests(metafunc):
    """Each ``probe`` test runs as this CPU (``this-cpu``) and as each CPU of ``PROBE_CPUS``."""
    if metafunc.definition.get_closest_marker("probe") and "probe_cpu" in metafunc.fixturenames:
        metafunc.parametrize("probe_cpu", [None, *PROBE_CPUS.values()], indirect=True, ids=["this-cpu", *PROBE_CPUS])


@pytest.fixture(autouse=True)
def probe_cpu(request, monkeypatch):
    """The CPU flags a ``probe`` test runs with (its parameter; None is this CPU), in this process and in its
    subprocesses; the probe reads them afresh before and after the test."""
    flags = getattr(request, "param", None)
    if flags is None:
        yield None
        return
    from hf_precision.recipe.devices import CPU_FLAGS_ENV, CPU_NAME_ENV, set_probe

    monkeypatch.setenv(CPU_FLAGS_ENV, flags)
    monkeypatch.delenv(CPU_NAME_ENV, raising=False)
    set_probe(None)
    yield flags
    monkeypatch.undo()
    set_probe(None)


# The modules whose tests take the longest each (two-process training runs, a benchmark run, subprocess sweeps of
# the CLI), first: under `make test`'s worksteal a worker runs its share from the front and the other steals from its
# end, so these start early and the run ends on short tests that balance the workers; at the end of the collection
# one of them left a worker idle for its whole length. Whole modules move, in file order, so module fixtures are still
# built once.
SLOW_MODULES = ("test_train_shard.py", "test_train_parallel.py", "test_video.py", "test_benchmark.py",
                "test_command_sweep.py", "test_stderr_ours.py", "test_packaging.py", "test_kernel_guards.py")


def pytest_collection_modifyitems(config, items):
    """The modules of ``SLOW_MODULES`` run first (the rest in collection order). Tests marked ``gpu`` need CUDA:
    they are skipped (reported as skipped, never as passed) without it."""
    import torch

    first = {name: i for i, name in enumerate(SLOW_MODULES)}
    items.sort(key=lambda item: first.get(item.path.name, len(first)))  # stable: file order kept otherwise
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device: run `pytest -m gpu` on a GPU machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
