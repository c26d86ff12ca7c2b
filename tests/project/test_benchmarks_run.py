"""The benchmark runner still runs (at its smallest sizes): its timing targets are judged in
benchmarks/RESULTS.md, never here, but a refactor must not leave it broken."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_benchmark_section_runs_at_quick_sizes():
    cmd = [sys.executable, "-m", "benchmarks", "--quick", "--repeat", "1", "--only", "a,b,c,d,e,f,chain"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert "total " in out.stdout, out.stdout[-3000:]


def test_the_fixed_costs_benchmark_runs_at_quick_sizes():
    """benchmarks/fixed_costs.py: generated einsums (einsum_benchmark's generators), small calls, SQL
    scoring and fit epochs; sections whose optional peers are missing say so."""
    pytest.importorskip("einsum_benchmark")
    cmd = [sys.executable, "-m", "benchmarks.fixed_costs", "--quick", "--repeat", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    text = out.stdout
    assert "first calls: geometric mean" in text and "SQL predict" in text and "rows," in text, text[-3000:]


def test_the_ml_benchmark_runs_at_quick_sizes():
    cmd = [sys.executable, "-m", "benchmarks.ml", "--quick", "--repeat", "1"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    assert "FFNN training step" in out.stdout, out.stdout[-3000:]


def test_the_gpu_benchmark_runs_on_the_emulated_device():
    """benchmarks/gpu.py is for a GPU machine; its code paths are checked here on the emulated device."""
    cmd = [sys.executable, "-m", "benchmarks.gpu", "--quick", "--repeat", "1", "--device", "cuda-emulated"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    text = out.stdout
    assert "total " in text and "TCCG 24" in text and "REL-ERR" not in text, text[-3000:]


def test_the_cluster_benchmark_runs_at_small_sizes():
    """benchmarks/cluster.py: one LocalCluster of 2 workers, the chains at small sizes, every row."""
    pytest.importorskip("distributed")
    cmd = [sys.executable, "-m", "benchmarks.cluster", "--workers", "2", "--repeat", "1"]
    cmd += ["--s-square", "64", "--s-skewed", "96"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in out.stderr + out.stdout, out.stderr[-3000:]
    text = out.stdout
    assert text.count("over the arrays:") == 2 and "tensorsql eindecomp, arrays" in text, text[-3000:]
