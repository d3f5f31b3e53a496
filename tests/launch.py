"""`accelerate launch` as the multi-process tests run it: two CPU processes over gloo, on a port of their own."""

from __future__ import annotations

import socket
import sys
from pathlib import Path


def free_port() -> int:
    """A TCP port no one listens on now: two `accelerate launch` runs at once (pytest-xdist workers) need their own."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_cpu(processes: int = 2) -> list[str]:
    """The `accelerate launch` prefix for ``processes`` CPU processes (no mixed precision, no dynamo, a free port);
    the venv's `accelerate` script where there is one, else its module."""
    exe = Path(sys.executable).parent / "accelerate"
    launch = [str(exe), "launch"] if exe.exists() else [sys.executable, "-m", "accelerate.commands.launch"]
    return [*launch, "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1", "--mixed_precision",
            "no", "--dynamo_backend", "no", "--main_process_port", str(free_port())]
