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

A :class:`Slot` is the same registry entry kept across queries: its key is reserved once
(``tensorsql_slot_new``), written into a statement that is prepared once, and before each ``EXECUTE`` the
slot is pointed at that call's array (``tensorsql_slot_set``, a few microseconds): ``tensor_source(key)``
reads an input array from it, and the writers above write into an output array set writable. No SQL is
generated, parsed or bound per call, and no Arrow table is registered.
"""

from __future__ import annotations

import ctypes
import weakref
from pathlib import Path
from typing import Any

import numpy as np

from udf_kernels import cabi

#: dtypes a sink can hold (the kernels' dtypes)
DTYPES = (
    "float32",
    "float64",
    "int32",
    "int64",
    "complex64",
    "complex128",
    "int8",
    "int16",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
)

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES: dict[str, cabi.Signature] = {
    "tensorsql_sink_open": (_I64, [_PTR, ctypes.c_char_p, _I64, ctypes.POINTER(_I64)]),
    "tensorsql_sink_close": (ctypes.c_int, [_I64]),
    "tensorsql_slot_new": (_I64, []),
    "tensorsql_slot_set": (
        ctypes.c_int,
        [_I64, _PTR, ctypes.c_char_p, _I64, ctypes.POINTER(_I64), ctypes.c_int],
    ),
    "tensorsql_slot_clear": (ctypes.c_int, [_I64]),
    "tensorsql_slot_free": (ctypes.c_int, [_I64]),
}


def _lib(path: Path | str, hold_gil: bool = False) -> ctypes.CDLL:
    """The sinks' and slots' entry points (``cabi.library``; ``hold_gil`` for the slots' short calls)."""
    return cabi.library(path, _SIGNATURES, hold_gil)


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


#: the dtype argument of tensorsql_slot_set, by numpy dtype
_DTYPE_ARG = {np.dtype(name): name.encode() for name in DTYPES}
_MAX_NDIM = 64
_addressof = ctypes.addressof
_c_char = ctypes.c_char


def _free_quietly(free: Any, key: int) -> None:
    """A slot's finalizer: releases the key, and never raises (it may run at interpreter exit)."""
    try:
        free(key)
    except Exception:
        return  # a finalizer must not raise


class Slot:
    """A reserved slot: ``Slot(path)`` takes a key (``.key``) that stays valid until :meth:`free`, and
    :meth:`set` points it at one array after another (e.g. before each ``EXECUTE`` of a statement prepared
    once with the key in its text). ``tensor_source(key)`` reads the array; ``tensor_einsum_into(key, ...)``
    and the other writers write into it when it was set ``writable=True``.

    The slot keeps a reference to the array it is set to, so the array outlives its use by the kernels:
    ``tensor_source`` hands DuckDB a blob that points at the array itself (no copy). The caller re-points
    or clears a slot, and changes the array, only while no query reads or writes it. A Slot is not meant to
    be set from several threads at once (:meth:`set` reuses one shape buffer). Freed on :meth:`free`, on
    leaving a ``with`` block, or when garbage collected.
    """

    __slots__ = ("__weakref__", "_array", "_clear", "_finalizer", "_set", "_shape", "key")

    def __init__(self, path: Path | str) -> None:
        lib = _lib(path, hold_gil=True)  # the entry points only take the registry's mutex, briefly
        key = lib.tensorsql_slot_new()
        if key <= 0:
            raise RuntimeError("the kernels could not reserve a slot")
        self.key = int(key)
        self._array: np.ndarray | None = None
        self._set = lib.tensorsql_slot_set
        self._clear = lib.tensorsql_slot_clear
        self._shape = (ctypes.c_int64 * _MAX_NDIM)()  # reused by every set()
        self._finalizer = weakref.finalize(self, _free_quietly, lib.tensorsql_slot_free, self.key)
        self._finalizer.atexit = False  # the process is going away: nothing left to release

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.free()

    def set(self, array: np.ndarray, writable: bool = False) -> None:
        """Points the slot at ``array`` (C-contiguous, a kernel dtype; writable when ``writable``, which
        lets the writers write there). Raises ValueError for an array the kernels cannot take, and when
        the slot was freed; TypeError for anything but a numpy array."""
        if not isinstance(array, np.ndarray):
            raise TypeError(f"a slot is set to a numpy array, not {type(array).__name__}")
        dt = _DTYPE_ARG.get(array.dtype)
        flags = array.flags
        ndim = array.ndim
        if dt is None or not flags.c_contiguous or (writable and not flags.writeable) or ndim > _MAX_NDIM:
            raise ValueError(self._refusal(array, writable))
        if flags.writeable and array.nbytes:
            ptr = _addressof(_c_char.from_buffer(array))  # half the cost of array.ctypes.data
        else:
            ptr = array.ctypes.data
        shape = self._shape
        shape[:ndim] = array.shape
        if self._set(self.key, ptr, dt, ndim, shape, writable) != 0:
            raise ValueError(self._refusal(array, writable))
        self._array = array

    def _refusal(self, array: np.ndarray, writable: bool) -> str:
        if not self._finalizer.alive:
            return "the slot was freed"
        if array.dtype not in _DTYPE_ARG:
            return f"a slot holds one of {', '.join(DTYPES)}, not {array.dtype}"
        if not array.flags.c_contiguous:
            return "a slot holds a C-contiguous array"
        if writable and not array.flags.writeable:
            return "a slot set writable needs a writable array"
        return f"the kernels refused an array of shape {array.shape} and dtype {array.dtype}"

    def clear(self) -> None:
        """Empties the slot (its key stays reserved) and drops the reference to the array."""
        if self._finalizer.alive:
            self._clear(self.key)
        self._array = None

    def free(self) -> None:
        """Releases the key (idempotent); the slot can no longer be set, and ``key`` becomes 0."""
        self._finalizer()
        self._array = None
        self.key = 0

    @property
    def array(self) -> np.ndarray | None:
        """The array the slot is set to (None when empty)."""
        return self._array


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
