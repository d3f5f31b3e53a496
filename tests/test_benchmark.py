"""Smoke test of scripts/benchmark.py (issue #6): it runs end to end and writes every section.

Not a timed test: no timing value is asserted (the machine may be busy); only that the report is complete.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "benchmark.py"
SECTIONS = ("load", "runtime", "memory", "fidelity", "scale")
HEADINGS = ("## Targets", "## 1. Load", "## 2. Runtime overhead", "## 3. Memory", "## 4. Fidelity", "## 5. Scale")


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("bench")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--size", "tiny", "--out", str(out)],
                          capture_output=True, text=True, cwd=str(ROOT), env=env, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.slow
def test_writes_markdown_and_json(quick_run):
    assert (quick_run / "benchmark.md").is_file()
    assert (quick_run / "benchmark.json").is_file()


@pytest.mark.slow
def test_json_has_every_section_without_errors(quick_run):
    data = json.loads((quick_run / "benchmark.json").read_text())
    assert set(SECTIONS) <= set(data["sections"])
    for name in SECTIONS:
        assert "error" not in data["sections"][name], (name, data["sections"][name].get("traceback"))
    assert data["env"]["cpu"]["model"]
    assert isinstance(data["env"]["cpu"]["flags"], list)
    assert data["config"]["command"].startswith("python scripts/benchmark.py")
    # raw samples are kept next to the medians
    assert data["sections"]["load"]["raw"]["recipe"] and data["sections"]["load"]["raw"]["plain"]
    assert data["sections"]["runtime"]["seconds"]["hooks"]["samples"]
    # the floor computes exactly what the recipe computes
    assert data["sections"]["runtime"]["max_abs_diff_vs_hooks"]["floor"] == 0.0
    # exact byte counts on the real SDXL configs agree with hf_precision.diagnose.planner where it is available
    for row in data["sections"]["memory"]["real_sdxl"].values():
        assert row.get("plan_agrees", True) is True
    fid = data["sections"]["fidelity"]
    assert fid["recipe"]["nan"] == 0 and fid["recipe"]["inf"] == 0


@pytest.mark.slow
def test_markdown_has_every_section_and_machine_header(quick_run):
    md = (quick_run / "benchmark.md").read_text()
    for heading in HEADINGS:
        assert heading in md, heading
    assert "- CPU:" in md and "AMX:" in md and "torch threads:" in md
    assert "PASS" in md or "FAIL" in md
