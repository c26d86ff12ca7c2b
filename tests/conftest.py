"""Shared fixtures: one session per test module, parametrized over the executors that can run here.

The tests sit in one folder per component (api, planner, sql, kernels, execution, cluster, ml, gpu,
project; compat holds numpy's and opt_einsum's own suites). Shared helpers (``equations``, ``numpy_ref``,
``tolerance``, ``kernel_paths``) live beside this file, and a test module may reuse another's cases by
name (``from test_einsum_numpy import make_operands``): every component folder is put on ``sys.path``.

Each executor is a factory that returns a ``tensorsql.Session``, or raises ``pytest.skip`` with the reason it
cannot run on this machine (the cluster and GPU executors will add theirs here).
"""

from __future__ import annotations

import logging
import pathlib
import sys
from collections.abc import Callable, Iterator

_HERE = pathlib.Path(__file__).resolve().parent
for _folder in sorted(p for p in _HERE.iterdir() if p.is_dir() and any(p.glob("test_*.py"))):
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))

import duckdb  # noqa: E402
import pytest  # noqa: E402
from kernel_paths import supported_kernel_paths  # noqa: E402

import tensorsql as ts  # noqa: E402
import udf_kernels  # noqa: E402


def _duckdb() -> ts.Session:
    return ts.connect(threads=2)


#: executor name -> a factory of sessions on it (skips with a reason where it cannot run)
EXECUTORS: dict[str, Callable[[], ts.Session]] = {"duckdb": _duckdb}


@pytest.fixture(scope="module", params=sorted(EXECUTORS))
def s(request: pytest.FixtureRequest) -> Iterator[ts.Session]:
    sess = EXECUTORS[request.param]()
    try:
        yield sess
    finally:
        sess.close()


@pytest.fixture(scope="module")
def session(s: ts.Session) -> ts.Session:
    return s


@pytest.fixture(autouse=True)
def _no_silent_cleanup_failures(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """A clean-up that fails (a view not unregistered, a temp table not dropped) logs a warning on the
    ``tensorsql`` logger; no test may pass with one."""
    caplog.set_level(logging.WARNING, logger="tensorsql")
    yield
    failures = [r.getMessage() for r in caplog.get_records("call") if r.name == "tensorsql"]
    assert not failures, f"clean-up failures: {failures}"


@pytest.fixture(scope="module", params=supported_kernel_paths())
def kernel_path(request: pytest.FixtureRequest) -> str:
    """A test (and the module-scoped fixtures it uses) runs once per float32 GEMM kernel path this machine
    supports; make sessions and connections on it with kernel_paths.connect / kernel_paths.duckdb_connect."""
    return request.param


@pytest.fixture(scope="module")
def con() -> Iterator[duckdb.DuckDBPyConnection]:
    """A bare DuckDB connection with the kernel extension loaded (SQL-level kernel tests)."""
    c = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(c)
    yield c
    c.close()
