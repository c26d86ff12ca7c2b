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


def test_a_results_run_replaces_its_rows_and_keeps_the_others(tmp_path):
    """``--write-results`` of some sections: the rows it measured are replaced (matched by case), each with
    this run's machine, date and command; the rows it did not measure keep their figures; new cases append."""
    from benchmarks.__main__ import RESULTS_HEADER, Row, write_results

    old_a = "| case a | 1.0 ms | peer | 2.0 ms | 0.500x | <= 1.5x | pass | m0 | 2000-01-01 | `old` |"
    old_b = "| case b | 3.0 ms | peer | 1.0 ms | 3.000x | <= 1.5x | FAIL | m0 | 2000-01-01 | `old` |"
    path = tmp_path / "RESULTS.md"
    path.write_text("\n".join(["# R", "<!-- results:x:start -->", *RESULTS_HEADER, old_a, old_b,
                                "<!-- results:x:end -->", "tail"]))  # fmt: skip
    run = [
        Row("x", "case b", 1e-3, "peer", 1e-3, 1.5, ""),
        Row("x", "case c", 2e-3, "peer", 1e-3, 1.5, ""),
        Row("x", "case c", 2e-3, "other", 1e-3, None, ""),
    ]
    write_results("x", "python -m new", run, path)
    lines = path.read_text().splitlines()
    rows = [ln for ln in lines if ln.startswith("| case ") and ln not in RESULTS_HEADER]
    assert [r.split("|")[1].strip() for r in rows] == ["case a", "case b", "case c", "case c"]
    assert rows[0] == old_a
    assert "`python -m new`" in rows[1] and "2000-01-01" not in rows[1] and "1.000x" in rows[1]
    assert "2.000x" in rows[2] and lines[0] == "# R" and lines[-1] == "tail"
