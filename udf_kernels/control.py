"""Cancellation and progress of a database's kernels, through the extension's C ABI (``control.hpp``).

Each database that loaded the extension has one kernel state with a cancellation flag and two progress
counters. SQL function ``tensorsql_db_token()`` returns its random 63-bit token; with it, :func:`cancel`,
:func:`reset` and :func:`progress` reach the flag and counters through ctypes, from any thread and also while
a query runs (the kernels check the flag between units of work: GEMM K panels, tiles, batches, rows, steps of
a fused tree). A cancelled kernel fails with a DuckDB error whose message contains :data:`MARKER`.

As with result sinks (``udf_kernels.sink``), the library must be the same one DuckDB loaded: ``dlopen`` of the
same path returns the same instance. The flag is per database: it stops every query running on it.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

#: in the message of every error of a cancelled kernel
MARKER = "tensorsql: interrupted"

_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def _lib(path: Path | str) -> ctypes.CDLL:
    key = str(path)
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            for name in ("tensorsql_cancel", "tensorsql_reset"):
                fn = getattr(lib, name)
                fn.restype = ctypes.c_int
                fn.argtypes = [ctypes.c_int64]
            lib.tensorsql_progress.restype = ctypes.c_int
            lib.tensorsql_progress.argtypes = [
                ctypes.c_int64,
                ctypes.POINTER(ctypes.c_double),
                ctypes.POINTER(ctypes.c_double),
            ]
            _libs[key] = lib
    return lib


def db_token(con: Any) -> int:
    """The token of the kernel state of the database behind DuckDB connection ``con`` (extension loaded)."""
    return int(con.execute("SELECT tensorsql_db_token()").fetchone()[0])


def cancel(path: Path | str, token: int) -> bool:
    """Sets the database's cancellation flag: its kernels stop at their next check. False: unknown token."""
    return _lib(path).tensorsql_cancel(token) == 0


def reset(path: Path | str, token: int) -> bool:
    """Clears the flag and zeroes both progress counters. False for an unknown token."""
    return _lib(path).tensorsql_reset(token) == 0


def progress(path: Path | str, token: int) -> tuple[float, float] | None:
    """(done, announced): the flops the database's kernels finished, and those that kernel calls announced
    when they started, since the last :func:`reset`; None for an unknown token."""
    done, total = ctypes.c_double(), ctypes.c_double()
    if _lib(path).tensorsql_progress(token, ctypes.byref(done), ctypes.byref(total)) != 0:
        return None
    return done.value, total.value


def is_interrupted(exc: BaseException | str) -> bool:
    """Whether an error (or its message) is a cancelled kernel's."""
    return MARKER in str(exc)
