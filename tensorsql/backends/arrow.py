"""numpy <-> blocked Arrow tables (the tensor-relation format in Arrow): split an array into blocks, assemble
blocks back. Shared by every executor: Arrow is how blocks enter and leave an engine."""

from __future__ import annotations

import json
import math
import weakref

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from tensorsql.dtypes import DTYPES
from tensorsql.errors import CorruptTableError, KernelError, OutOfMemoryError, ShapeError
from tensorsql.ir.blocking import grid


def metadata(shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str) -> dict[bytes, bytes]:
    return {
        b"tensorsql.dtype": dtype.encode(),
        b"tensorsql.shape": json.dumps(list(shape)).encode(),
        b"tensorsql.block_shape": json.dumps(list(block_shape)).encode(),
    }


def _binary_array(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """A binary Arrow array over one contiguous byte buffer and its offsets, without copying either."""
    n = len(offsets) - 1
    if int(offsets[-1]) < 2**31 - 1:
        return pa.Array.from_buffers(
            pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(data)]
        )
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets.astype(np.int64)), pa.py_buffer(data)]
    )


#: arrays a relation made for itself (``own``), by id: nobody else holds them, so nobody changes them
_OWN: weakref.WeakValueDictionary[int, np.ndarray] = weakref.WeakValueDictionary()


def own(arr: np.ndarray) -> np.ndarray:
    """Marks ``arr``, a copy a relation made for itself, as one nobody changes (read-only): reads may view
    it in place, and a cluster may keep it on its workers."""
    arr.flags.writeable = False
    _OWN[id(arr)] = arr
    return arr


def immutable(arr: np.ndarray) -> bool:
    """Whether nobody can change ``arr``'s memory: a relation's own copy (``own``), or memory a ``bytes``
    object holds, and their views. A read-only array of the caller's is not: numpy lets its owner be made
    writable again, and a view made before it was frozen still writes into it."""
    base: object = arr
    while isinstance(base, np.ndarray):
        if _OWN.get(id(base)) is base:
            return True
        base = base.base
    return isinstance(base, bytes)


def split(array: np.ndarray, block_shape: tuple[int, ...], dtype: str, *, copy: bool = True) -> pa.Table:
    """One row per block: key columns k0..k{r-1} (INTEGER) and the block's C-order bytes.

    Copies each element at most once: the blocks are written back to back into one buffer that becomes the
    Arrow binary column's data buffer (offsets beside it). When the blocks are already contiguous in a
    C-order array (only the first dimension is split), that is one memcpy, or none for a read-only array or
    with ``copy=False`` (the caller then promises not to change the array while the relation is used).
    """
    try:
        return _split(array, block_shape, dtype, copy=copy)
    except MemoryError as exc:  # numpy's: the copy of an operand (a broadcast view of 8 bytes may be 512 GiB)
        shape = np.shape(array)
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        raise OutOfMemoryError(
            f"cannot copy an operand of shape {shape} ({dtype}, {nbytes / 2**30:.3g} GiB) into blocks: {exc}"
        ) from exc


def _split(array: np.ndarray, block_shape: tuple[int, ...], dtype: str, *, copy: bool) -> pa.Table:
    arr = np.asarray(array, dtype=DTYPES[dtype])
    shape = arr.shape
    g = grid(shape, block_shape)
    r = arr.ndim
    nblocks = int(np.prod(g)) if r else 1
    if r >= 63:  # np.indices makes an array of r + 1 dimensions: numpy has at most 64
        keys = np.array(np.unravel_index(np.arange(nblocks), g), dtype=np.int32).reshape(r, -1)
    else:
        keys = np.indices(g, dtype=np.int32).reshape(r, -1) if r else np.zeros((0, 1), np.int32)
    # per-block extents (ragged upper edges) and byte sizes
    exts = np.empty((r, nblocks), dtype=np.int64)
    for d in range(r):
        exts[d] = np.minimum(block_shape[d], shape[d] - keys[d].astype(np.int64) * block_shape[d])
    sizes = (np.prod(exts, axis=0) if r else np.ones(1, np.int64)) * arr.itemsize
    offsets = np.zeros(nblocks + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    contiguous = arr.flags.c_contiguous and all(block_shape[d] >= shape[d] for d in range(1, r))
    if contiguous:
        # blocks are consecutive slabs of the array: one memcpy, or none for memory nobody can change (the
        # relation then views it) or that is the relation's alone (a conversion made it)
        flat = arr.reshape(-1).view(np.uint8)
        own = arr is not array and arr.base is None
        data = flat if not copy or own or immutable(arr) else flat.copy()
    else:
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        for b in range(nblocks):
            sl = tuple(slice(int(keys[d, b]) * block_shape[d], None) for d in range(r))
            ext = tuple(int(exts[d, b]) for d in range(r))
            src = arr[tuple(slice(s.start, s.start + e) for s, e in zip(sl, ext, strict=True))]
            dst = data[offsets[b] : offsets[b + 1]].view(arr.dtype).reshape(ext)
            np.copyto(dst, src)
    cols = {f"k{d}": pa.array(keys[d], pa.int32()) for d in range(r)}
    cols["tensor"] = _binary_array(data, offsets)
    return pa.table(cols).replace_schema_metadata(metadata(shape, block_shape, dtype))


def _key_problem(
    table: pa.Table, rows: np.ndarray, shape: tuple[int, ...], block_shape: tuple[int, ...]
) -> tuple[str, tuple[int | None, ...], int] | None:
    """The first bad key among the rows ``rows`` (a mask) of a blocked table: ("null", key, column),
    ("outside", key, 0) or ("repeated", key, times); None when each is inside the grid, once."""
    r = len(shape)
    n = int(rows.sum())
    if not r:
        return ("repeated", (), n) if n > 1 else None
    for d in range(r):
        nulls = np.flatnonzero(table.column(f"k{d}").is_null().to_numpy(zero_copy_only=False) & rows)
        if nulls.size:
            key = tuple(table.column(f"k{j}")[int(nulls[0])].as_py() for j in range(r))
            return "null", key, d
    if not n:
        return None
    cols = [table.column(f"k{d}").to_numpy(zero_copy_only=False)[rows] for d in range(r)]
    for col in cols:  # a uint64 key past int64's range: outside any grid (cast, it would read as negative)
        huge = np.flatnonzero(col > np.iinfo(np.int64).max) if col.dtype == np.uint64 else ()
        if len(huge):
            return "outside", tuple(int(c[huge[0]]) for c in cols), 0
    idx = np.stack([c.astype(np.int64) for c in cols])
    g = grid(shape, block_shape)
    outside = np.flatnonzero(np.any((idx < 0) | (idx >= np.array(g, np.int64)[:, None]), axis=0))
    if outside.size:
        return "outside", tuple(int(k) for k in idx[:, outside[0]]), 0
    flat, counts = np.unique(np.ravel_multi_index(tuple(idx), g), return_counts=True)
    if counts.max() > 1:
        key = tuple(int(k) for k in np.unravel_index(flat[np.argmax(counts)], g))
        return "repeated", key, int(counts.max())
    return None


def check_blocks(
    table: pa.Table, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str, what: str | None = None
) -> None:
    """An Arrow table as a tensor relation, checked whole (for one an engine will read as it is, immutable):
    its key columns, every key non-NULL, inside the grid and once, every blob (unless NULL: absent) as long as
    its block shape and dtype need. Raises CorruptTableError naming the key (and ``what`` the table is)."""
    r = len(shape)
    what = what or f"an Arrow tensor relation of shape {list(shape)} in blocks of {list(block_shape)}"
    missing = [c for c in [*(f"k{d}" for d in range(r)), "tensor"] if c not in table.column_names]
    if missing:
        raise CorruptTableError(f"{what} has no column {missing[0]!r}")
    for d in range(r):
        kind = table.column(f"k{d}").type
        if not pa.types.is_integer(kind):
            raise CorruptTableError(f"{what}: its key column 'k{d}' has type {kind}, not an integer type")
    problem = _key_problem(table, np.ones(table.num_rows, dtype=bool), shape, block_shape)
    if problem is not None:
        kind, key, extra = problem
        text = {
            "null": "has a NULL key column",
            "outside": f"lies outside its block grid {list(grid(shape, block_shape))}",
            "repeated": f"appears {extra} times",
        }[kind]
        raise CorruptTableError(f"{what}: block{' key ' + _shown(key) if r else ''} {text}")
    blobs = table.column("tensor")
    if not (pa.types.is_binary(blobs.type) or pa.types.is_large_binary(blobs.type)):
        raise CorruptTableError(f"{what}: its tensor column has type {blobs.type}, not binary")
    if not table.num_rows:
        return
    cols = [table.column(f"k{d}").to_numpy(zero_copy_only=False).astype(np.int64) for d in range(r)]
    keys = np.stack(cols) if r else np.zeros((0, table.num_rows), np.int64)
    need = np.full(table.num_rows, DTYPES[dtype].itemsize, dtype=np.int64)
    for d in range(r):
        need *= np.minimum(block_shape[d], shape[d] - keys[d] * block_shape[d])
    sizes = pc.binary_length(blobs).to_numpy(zero_copy_only=False)
    bad = np.flatnonzero(blobs.is_valid().to_numpy(zero_copy_only=False) & (sizes != need))
    if bad.size:
        i = int(bad[0])
        key = tuple(int(k) for k in keys[:, i]) if r else ()
        raise CorruptTableError(
            f"{what}: block key {_shown(key)} has {int(sizes[i])} bytes but its block needs {int(need[i])}"
        )


def _shown(key: tuple[int | None, ...]) -> str:
    return "[" + ", ".join("NULL" if k is None else str(k) for k in key) + "]"


def _present(table: pa.Table, shape: tuple[int, ...], block_shape: tuple[int, ...]) -> int:
    """How many blocks of the grid the table holds, after checking the keys of its rows with a block (a NULL
    block, absent or padding, has no say): none NULL, each inside the grid, none twice. Whether every element
    of the result is written follows from it."""
    blocks = table.column("tensor").is_valid().to_numpy(zero_copy_only=False)
    problem = _key_problem(table, blocks, shape, block_shape)
    if problem is not None:
        kind, key, extra = problem
        if kind == "null":
            raise ShapeError(f"a block of a tensor of shape {shape} has a NULL key k{extra}")
        if kind == "outside":
            raise ShapeError(f"block key {key} lies outside a tensor of shape {shape}")
        raise ShapeError(f"block key {key} appears {extra} times in a tensor of shape {shape}")
    return int(blocks.sum())


def assemble(table: pa.Table, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Blocks back into one array; absent keys (and NULL blocks) are zero blocks.

    Reads the blobs as numpy views of the Arrow buffers (no per-block bytes objects): each element is
    copied once, into the result. Unless the blobs are the array's bytes already (``_slab_view``), the keys
    are checked first (``_present``): the result starts uninitialised only when every block of the grid is
    there, once.
    """
    dt = DTYPES[dtype]
    r = len(shape)
    keys = [table.column(f"k{d}").to_numpy(zero_copy_only=False) for d in range(r)]
    view = _slab_view(table, keys, shape, block_shape, dt)  # its conditions prove the keys whole, once each
    if view is not None:
        return view
    present = _present(table, shape, block_shape)
    nblocks = math.prod(grid(shape, block_shape))
    out = np.empty(shape, dtype=dt) if present == nblocks else np.zeros(shape, dtype=dt)
    row0 = 0
    for chunk in table.column("tensor").chunks:
        n = len(chunk)
        if n == 0:
            continue
        large = pa.types.is_large_binary(chunk.type)
        _, obuf, dbuf = chunk.buffers()
        offs = np.frombuffer(obuf, dtype=np.int64 if large else np.int32)[chunk.offset : chunk.offset + n + 1]
        data = np.frombuffer(dbuf, dtype=np.uint8) if dbuf is not None else np.zeros(0, np.uint8)
        nulls = chunk.is_null().to_numpy(zero_copy_only=False) if chunk.null_count else None
        for i in range(n):
            if nulls is not None and nulls[i]:
                continue
            row = row0 + i
            idx = [int(k[row]) for k in keys]
            sl = tuple(
                slice(j * b, min((j + 1) * b, m)) for j, b, m in zip(idx, block_shape, shape, strict=True)
            )
            ext = tuple(s.stop - s.start for s in sl)
            need = int(np.prod(ext)) * dt.itemsize
            lo, hi = int(offs[i]), int(offs[i + 1])
            if hi - lo != need:
                raise KernelError(
                    f"block {tuple(idx)} has {hi - lo} bytes but its shape {ext} of {dtype} needs {need}"
                )
            out[sl] = data[lo:hi].view(dt).reshape(ext)
        row0 += n
    return out


class _BufferOwner:
    """Keeps an Arrow buffer alive under a numpy array that views it.

    The Arrow table of a query result belongs to the caller alone (DuckDB keeps no reference after the
    export), so the view may be writable, like the array numpy's own einsum returns.
    """

    __slots__ = ("__array_interface__", "_buffer")

    def __init__(self, buffer: pa.Buffer, offset: int, shape: tuple[int, ...], dt: np.dtype) -> None:
        self._buffer = buffer
        self.__array_interface__ = {
            "version": 3,
            "shape": shape,
            "typestr": dt.str,
            "data": (buffer.address + offset, False),
        }


def _slab_view(
    table: pa.Table,
    keys: list[np.ndarray],
    shape: tuple[int, ...],
    block_shape: tuple[int, ...],
    dt: np.dtype,
) -> np.ndarray | None:
    """The result without a copy when its blobs already lie in the array's C order in one Arrow buffer.

    That is the case when every block is a slab along the first axis (one block, or row panels), all are
    present and the rows come in key order: the concatenated blobs are then the array's bytes.
    """
    column = table.column("tensor")
    if (
        column.num_chunks != 1
        or column.null_count
        or 0 in shape
        or tuple(block_shape[1:]) != tuple(shape[1:])
    ):
        return None
    chunk = column.chunks[0]
    n = len(chunk)
    panels = -(-shape[0] // block_shape[0]) if shape else 1
    if n != panels or any(np.any(k != 0) for k in keys[1:]):
        return None
    if shape and not np.array_equal(keys[0], np.arange(n)):
        return None
    _, obuf, dbuf = chunk.buffers()
    if dbuf is None:
        return None
    large = pa.types.is_large_binary(chunk.type)
    offs = np.frombuffer(obuf, dtype=np.int64 if large else np.int32)[chunk.offset : chunk.offset + n + 1]
    row_bytes = math.prod(shape[1:]) * dt.itemsize
    want = (
        [min(block_shape[0], shape[0] - i * block_shape[0]) * row_bytes for i in range(n)]
        if shape
        else [dt.itemsize]
    )
    lo = int(offs[0])
    if not np.array_equal(np.diff(offs), want) or (dbuf.address + lo) % dt.alignment:
        return None
    return np.asarray(_BufferOwner(dbuf, lo, tuple(shape), dt))
