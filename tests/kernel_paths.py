"""The float32 GEMM kernel paths (``TENSORSQL_KERNEL_PATH``) this machine supports, and connections on one.

The path is read when the extension is loaded into a database, so a session or DuckDB connection is made on
a chosen path by setting the variable only while it is created (:func:`connect`, :func:`duckdb_connect`).
The ``kernel_path`` fixture (conftest.py) runs a test once per path of :func:`supported_kernel_paths`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import duckdb

import tensorsql
import udf_kernels

ENV = udf_kernels.KERNEL_PATH_ENV
#: what the packed AVX-512 kernel needs (pgemm::supported())
AVX512_FLAGS = frozenset({"avx512f", "avx512dq", "avx512vl", "fma"})


def cpu_flags() -> frozenset[str]:
    """The CPU flags of /proc/cpuinfo (empty where there is none)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


def cpu_has_avx512() -> bool:
    return cpu_flags() >= AVX512_FLAGS


def default_kernel_path() -> str:
    """What ``auto`` resolves to on this machine."""
    return "avx512" if cpu_has_avx512() else "openblas"


def supported_kernel_paths() -> list[str]:
    """``generic`` and ``openblas`` everywhere, ``avx512`` where the CPU has it."""
    return ["generic", "openblas", *(["avx512"] if cpu_has_avx512() else [])]


@contextlib.contextmanager
def kernel_path_env(path: str | None) -> Iterator[None]:
    """TENSORSQL_KERNEL_PATH set to ``path`` (unset for None) inside the block, restored after it."""
    old = os.environ.get(ENV)
    if path is None:
        os.environ.pop(ENV, None)
    else:
        os.environ[ENV] = path
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(ENV, None)
        else:
            os.environ[ENV] = old


def connect(path: str | None, **kwargs) -> tensorsql.Session:
    """``tensorsql.connect(**kwargs)`` with its kernels on ``path``."""
    with kernel_path_env(path):
        return tensorsql.connect(**kwargs)


def duckdb_connect(path: str | None, threads: int | None = None) -> duckdb.DuckDBPyConnection:
    """A fresh in-memory DuckDB connection with the extension loaded on ``path``."""
    config = {"allow_unsigned_extensions": "true"}
    if threads is not None:
        config["threads"] = str(threads)
    con = duckdb.connect(config=config)
    with kernel_path_env(path):
        udf_kernels.load(con)
    return con
