"""Cancellation, progress and the memory budget of a database's kernels, through the extension's C ABI
(``control.hpp``).

Each database that loaded the extension has one kernel state with a cancellation flag and two progress
counters. SQL function ``tensorsql_db_token()`` returns its random 63-bit token; with it, :func:`cancel`,
:func:`reset` and :func:`progress` reach the flag and counters through ctypes, from any thread and also while
a query runs (the kernels check the flag between units of work: GEMM K panels, tiles, batches, rows, steps of
a fused tree). A cancelled kernel fails with a DuckDB error whose message contains :data:`MARKER`.

As with result sinks (``udf_kernels.sink``), the library must be the same one DuckDB loaded: ``dlopen`` of the
same path returns the same instance. The flag is per database: it stops every query running on it.

The memory budget (:func:`set_memory_limit`, :func:`memory`) bounds the bytes the kernels themselves hold
(block buffers, aggregate states, packing scratch, a call's result blobs); a kernel that would pass it fails
with an error containing :data:`OOM_MARKER`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import Any

from udf_kernels import cabi

#: in the message of every error of a cancelled kernel
MARKER = "tensorsql: interrupted"
#: in the message of every error of a kernel that ran out of memory (its budget, or the system's)
OOM_MARKER = "tensorsql: out of memory"

_I64, _U64, _INT = ctypes.c_int64, ctypes.c_uint64, ctypes.c_int
_SIGNATURES: dict[str, cabi.Signature] = {
    "tensorsql_cancel": (_INT, [_I64]),
    "tensorsql_reset": (_INT, [_I64]),
    "tensorsql_progress": (_INT, [_I64, ctypes.POINTER(ctypes.c_double), ctypes.POINTER(ctypes.c_double)]),
    "tensorsql_memory_limit": (_INT, [_I64, _U64]),
    "tensorsql_memory": (_INT, [_I64, ctypes.POINTER(_U64), ctypes.POINTER(_U64)]),
}


def _lib(path: Path | str) -> ctypes.CDLL:
    return cabi.library(path, _SIGNATURES)


def db_token(con: Any) -> int:
    """The token of the kernel state of the database behind DuckDB connection ``con`` (extension loaded)."""
    return int(con.execute("SELECT tensorsql_db_token()").fetchall()[0][0])  # fetched whole: no open result


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


def set_memory_limit(path: Path | str, token: int, limit: int) -> bool:
    """Sets the byte limit of the database's kernel memory (0: none). False for an unknown token."""
    if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit < 1 << 64:
        raise ValueError(f"limit must be an int of bytes in [0, 2**64), got {limit!r}")
    return _lib(path).tensorsql_memory_limit(token, limit) == 0


def memory(path: Path | str, token: int) -> tuple[int, int] | None:
    """(used, limit): the bytes the database's kernels hold now and their limit (0: none); None for an
    unknown token."""
    used, limit = ctypes.c_uint64(), ctypes.c_uint64()
    if _lib(path).tensorsql_memory(token, ctypes.byref(used), ctypes.byref(limit)) != 0:
        return None
    return used.value, limit.value


def is_out_of_memory(exc: BaseException | str) -> bool:
    """Whether an error (or its message) is a kernel's out-of-memory error."""
    return OOM_MARKER in str(exc)


def is_interrupted(exc: BaseException | str) -> bool:
    """Whether an error (or its message) is a cancelled kernel's."""
    return MARKER in str(exc)
