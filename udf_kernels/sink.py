"""Result sinks: lend a numpy array to one query, so the kernels write each result block straight into it.

Without a sink a result block is copied from the kernel's buffer into a DuckDB blob, from there into an
Arrow buffer, and (unless its blocks are row slabs) into the numpy array: up to three passes over the
whole result after it was computed. With one, the SQL functions ``tensor_einsum_into``,
``tensor_einsum_agg_into`` and ``tensor_sink_write`` write each block into the lent array, bounds-checked
against its registered shape.

The array is registered through the extension's C ABI (``tensorsql_sink_open``), reached here with
ctypes, never from SQL: a query can only write into an array whose random key the caller put into it, and
only while the sink is open. The extension must be the same loaded library DuckDB uses (``dlopen`` of the
same path returns the same instance); :func:`available` checks that once per path.
"""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path
from typing import Any

import numpy as np

#: dtypes a sink can hold (the kernels' dtypes)
DTYPES = ("float32", "float64", "int32", "int64", "complex64", "complex128")

_libs: dict[str, ctypes.CDLL] = {}
_lock = threading.Lock()


def _lib(path: Path | str) -> ctypes.CDLL:
    key = str(path)
    with _lock:
        lib = _libs.get(key)
        if lib is None:
            lib = ctypes.CDLL(key)
            lib.tensorsql_sink_open.restype = ctypes.c_int64
            lib.tensorsql_sink_open.argtypes = [
                ctypes.c_void_p,
                ctypes.c_char_p,
                ctypes.c_int64,
                ctypes.POINTER(ctypes.c_int64),
            ]
            lib.tensorsql_sink_close.restype = ctypes.c_int
            lib.tensorsql_sink_close.argtypes = [ctypes.c_int64]
            _libs[key] = lib
    return lib


class Sink:
    """``with Sink(path, array) as key:`` registers ``array`` (C-contiguous, writable, a kernel dtype) for
    the queries run inside the block; the key goes into their SQL."""

    def __init__(self, path: Path | str, array: np.ndarray) -> None:
        if array.dtype.name not in DTYPES:
            raise ValueError(f"a result sink holds one of {', '.join(DTYPES)}, not {array.dtype}")
        if not (array.flags.c_contiguous and array.flags.writeable):
            raise ValueError("a result sink must be a writable C-contiguous array")
        self._lib = _lib(path)
        self._array = array
        self.key = 0

    def __enter__(self) -> int:
        return self.open()

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> int:
        """Registers the array; returns its key (ValueError when the kernels refuse it)."""
        a = self._array
        shape = (ctypes.c_int64 * max(a.ndim, 1))(*a.shape)
        key = self._lib.tensorsql_sink_open(a.ctypes.data, a.dtype.name.encode(), a.ndim, shape)
        if key <= 0:
            raise ValueError(f"the kernels refused a result sink of shape {a.shape} and dtype {a.dtype}")
        self.key = int(key)
        return self.key

    def close(self) -> None:
        """Unregisters the array (a no-op when it is not registered)."""
        if self.key:
            self._lib.tensorsql_sink_close(self.key)
            self.key = 0


def available(path: Path | str, con: Any) -> bool:
    """Whether sinks opened through ``path`` are seen by the kernels loaded into DuckDB connection ``con``:
    one block is written and read back (callers check once per connection)."""
    import duckdb

    try:
        out = np.zeros((2, 3), np.float32)
        block = np.arange(3, dtype=np.float32).reshape(1, 3)
        with Sink(path, out) as key:
            con.execute(
                "SELECT tensor_sink_write(?, [1, 0], 'float32', ?, [1, 3])", [key, block.tobytes()]
            ).fetchall()
        return bool(np.array_equal(out[1], block[0]) and not out[0].any())
    except (OSError, AttributeError, ValueError, duckdb.Error):
        return False
