"""quanto int8 x bfloat16 on the CPU: torch's `_weight_int8pack_mm` kernel crashes the process on rows that are not
whole, aligned vector steps (hf_precision/runtime/kernel_guards.py); the guard keeps the fast path where it is safe."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest
import torch

pytest.importorskip("optimum.quanto")

SCRIPT = textwrap.dedent("""
    import sys, torch
    from optimum.quanto import freeze, qint8, quantize
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 8)).to(torch.bfloat16)  # K = 12: not a whole AVX2/AVX512 step
    quantize(m, weights=qint8); freeze(m)
    print(float(m(torch.randn(3, 5, 12, dtype=torch.bfloat16)).float().abs().sum()))
""")


def _run_plain() -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)


def test_plain_quanto_bf16_matmul_with_k_12_kills_the_process_and_the_guard_runs_it():
    """torch's vectorised int8pack kernel with aligned loads is x86 AVX2/AVX512's: there the plain call dies (in a
    process of its own, so the crash is the child's). Other CPUs have other kernels (what arm64's does with K = 12 was
    not measured here); the guarded call runs on every one: here, in this process, the same module as the child's
    (a crash would take this worker down and fail the test), and test_guard_keeps_the_fast_path_where_safe[12-False]
    checks its values against the dequantized weights (a second process for it cost ~10 s of imports)."""
    if torch.backends.cpu.get_cpu_capability() in ("AVX2", "AVX512"):
        plain = _run_plain()
        assert plain.returncode < 0, (plain.returncode, plain.stderr[-500:])  # killed by a signal (SIGSEGV)
    from optimum.quanto import freeze, qint8, quantize

    from hf_precision.runtime.kernel_guards import guard_quanto_int8pack

    assert guard_quanto_int8pack()
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(12, 8)).to(torch.bfloat16)  # K = 12: not a whole AVX2/AVX512 step
    quantize(m, weights=qint8)
    freeze(m)
    assert float(m(torch.randn(3, 5, 12, dtype=torch.bfloat16)).float().abs().sum()) > 0


@pytest.mark.parametrize("k,fast", [(32, True), (12, False), (40, False)])
def test_guard_keeps_the_fast_path_where_safe_and_matches_the_dequantized_weights(monkeypatch, k, fast):
    from optimum.quanto import freeze, qint8, quantize

    from hf_precision.runtime.kernel_guards import guard_quanto_int8pack

    assert guard_quanto_int8pack() and guard_quanto_int8pack()  # idempotent
    calls = []
    real = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *a: calls.append(a[0].shape) or real(*a))
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(k, 8, bias=False)).to(torch.bfloat16)  # quantize() swaps children
    quantize(m, weights=qint8)
    freeze(m)
    x = torch.randn(3, 5, k, dtype=torch.bfloat16)
    out = m(x)
    assert bool(calls) is fast
    weight = m[0].weight.dequantize().float()
    reference = x.float() @ weight.t()
    assert torch.allclose(out.float(), reference, atol=0.05, rtol=0.02)
