"""TENSORSQL_KERNEL_PATH: the float32 GEMM path each database chooses when the extension is loaded into it,
and tensorsql_kernel_path(), which reports it. The kernel tests themselves run on every supported path
through the ``kernel_path`` fixture (test_packed_gemm.py, test_kernels_sql.py, test_einsum_numpy.py)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_paths import ENV, connect, cpu_has_avx512, duckdb_connect, kernel_path_env, supported_kernel_paths
from tolerance import assert_einsum_close

import tensorsql as ts
import udf_kernels

AUTO = "avx512" if cpu_has_avx512() else "openblas"


def _path(con) -> str:
    return con.execute("SELECT tensorsql_kernel_path()").fetchone()[0]


@pytest.mark.parametrize("value", [None, "", "auto", "AUTO"])
def test_auto_is_the_default(value):
    con = duckdb_connect(value)
    assert _path(con) == AUTO
    con.close()


def test_every_supported_path_is_reported(kernel_path):
    con = duckdb_connect(kernel_path)
    assert _path(con) == kernel_path
    con.close()
    with connect(kernel_path) as s:
        assert s.execute("SELECT tensorsql_kernel_path()")[0][0] == kernel_path


@pytest.mark.parametrize("value", ["bogus", "avx2", "open blas", "1"])
def test_an_invalid_value_fails_loading(value):
    pattern = rf"{ENV}='{value}'.*valid values: auto \(the default\), avx512, openblas, generic"
    with pytest.raises(udf_kernels.KernelLoadError, match=pattern):
        duckdb_connect(value)
    with pytest.raises(ts.ExtensionError, match=pattern):
        connect(value)


def test_avx512_needs_the_cpu():
    """Explicit avx512 never falls back silently: without AVX-512 the load fails, naming the variable."""
    if cpu_has_avx512():
        con = duckdb_connect("avx512")
        assert _path(con) == "avx512"
        con.close()
    else:
        with pytest.raises(udf_kernels.KernelLoadError, match=rf"{ENV}=avx512, but this CPU lacks AVX-512"):
            duckdb_connect("avx512")


def test_the_path_is_read_at_load_only():
    """Per database: changing the variable later changes neither an open database nor a second LOAD into
    it; a new database reads it again."""
    con = duckdb_connect("generic")
    with kernel_path_env("openblas"):
        assert _path(con) == "generic"
        udf_kernels.load(con)  # already loaded: no re-initialisation
        assert _path(con) == "generic"
    assert _path(duckdb_connect("openblas")) == "openblas"
    con.close()


def test_two_databases_in_one_process_use_their_own_paths():
    """Sessions side by side on different paths, used alternately (and from two threads at once)."""
    import concurrent.futures

    paths = supported_kernel_paths()
    sessions = {p: connect(p, threads=2) for p in paths}
    rng = np.random.default_rng(0)
    a = rng.standard_normal((200, 64)).astype(np.float32)
    b = rng.standard_normal((64, 150)).astype(np.float32)

    def run(p):
        s = sessions[p]
        return s.execute("SELECT tensorsql_kernel_path()")[0][0], s.einsum("ij,jk->ik", a, b).numpy()

    with concurrent.futures.ThreadPoolExecutor(len(paths)) as pool:
        for p, (reported, got) in zip(paths, pool.map(run, paths), strict=True):
            assert reported == p
            assert_einsum_close(got, "ij,jk->ik", a, b)
    for s in sessions.values():
        s.close()


def test_the_sql_function_is_documented():
    assert "tensorsql_kernel_path" in udf_kernels.SQL_FUNCTIONS
    assert udf_kernels.KERNEL_PATHS == ("auto", "avx512", "openblas", "generic")
