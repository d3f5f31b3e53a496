"""`accelerate launch` as the multi-process tests run it: two CPU processes over gloo, on a port of their own; and
the environment every subprocess a test starts gets (``subprocess_env``)."""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def subprocess_env(*, cpu_only: bool = False, **extra: str) -> dict[str, str]:
    """This process's environment for a test's subprocess: offline, this checkout's package first on PYTHONPATH
    (prepended: packages found through the caller's PYTHONPATH, e.g. diffusers installed into a side folder, stay
    importable), and ``extra`` on top.

    ``cpu_only=True`` hides every GPU (``CUDA_VISIBLE_DEVICES=""``): the test means the CPU run (two processes over
    gloo, a CPU demo, a command's CPU refusal) on any machine; on a 1-GPU machine ``--multi_gpu`` would otherwise
    put rank 1 on a device ordinal that does not exist.

    >>> env = subprocess_env(cpu_only=True, OMP_NUM_THREADS="1")
    >>> env["PYTHONPATH"].split(os.pathsep)[0] == str(ROOT), env["CUDA_VISIBLE_DEVICES"], env["HF_HUB_OFFLINE"]
    (True, '', '1')
    """
    env = {**os.environ, "HF_HUB_OFFLINE": "1",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    if cpu_only:
        env["CUDA_VISIBLE_DEVICES"] = ""
    env.update(extra)
    return env


def share_cores(workers: int, environ: dict[str, str], cores: int | None = None) -> int:
    """Torch threads for each of ``workers`` pytest-xdist workers sharing ``cores`` (this machine's): an equal share,
    at least 1. Also sets ``OMP_NUM_THREADS`` in ``environ`` to it (unless it is set already), so that every
    subprocess a test starts (a script, the CLI, the benchmark; torch reads its thread count from it) runs on its
    worker's share too. Beside a busy core, with 2 threads instead of 1, the tiny SVD's generate_video.py took up to
    43 s instead of 6-13 s (17 s of CPU instead of 4: the per-op waits of conftest's ``one_thread``), and
    test_benchmark.py's quick run 55-72 s instead of 31 s (it took 2 threads where the load average at its start
    was under 1; now its cores are the 1 torch reports).

    >>> env = {}
    >>> share_cores(2, env, cores=2), env
    (1, {'OMP_NUM_THREADS': '1'})
    >>> env = {"OMP_NUM_THREADS": "3"}  # the user's own count stays
    >>> share_cores(4, env, cores=16), env
    (4, {'OMP_NUM_THREADS': '3'})
    """
    threads = max(1, (cores or os.cpu_count() or 1) // workers)
    environ.setdefault("OMP_NUM_THREADS", str(threads))
    return threads


def free_port() -> int:
    """A TCP port no one listens on now: two `accelerate launch` runs at once (pytest-xdist workers) need their own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_cpu(processes: int = 2) -> list[str]:
    """The `accelerate launch` prefix for ``processes`` CPU processes (no mixed precision, no dynamo, a free port);
    the venv's `accelerate` script where there is one, else its module. Run it with ``subprocess_env(cpu_only=True)``:
    `--multi_gpu` spreads the ranks over the visible GPUs when there are any."""
    exe = Path(sys.executable).parent / "accelerate"
    launch = [str(exe), "launch"] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*launch, "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
