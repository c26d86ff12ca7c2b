"""The benchmark runner still runs (at its smallest sizes): its timing targets are judged in
benchmarks/RESULTS.md, never here, but a refactor must not leave it broken."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_benchmark_section_runs_at_quick_sizes():
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--repeat", "1", "--only", "a,b,c,d,e,f,chain"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert "total " in out.stdout, out.stdout[-3000:]


def test_the_ml_benchmark_runs_at_quick_sizes():
    cmd = [sys.executable, "-m", "benchmarks.ml", "--quick", "--repeat", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert "FFNN training step" in out.stdout, out.stdout[-3000:]
