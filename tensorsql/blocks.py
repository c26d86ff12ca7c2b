"""numpy <-> blocked Arrow tables: splitting an array into blocks and assembling blocks back."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from tensorsql.dtypes import DTYPES
from tensorsql.errors import KernelError, ShapeError

#: default block size target in elements (4 MiB of float32): big enough that per-block overhead is
#: small, small enough that a 2-core machine gets several blocks to work on.
DEFAULT_BLOCK_ELEMENTS = 1 << 20


def default_block_shape(shape: tuple[int, ...], target: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[int, ...]:
    block = [max(1, n) for n in shape]
    while int(np.prod(block)) > target:
        i = int(np.argmax(block))
        block[i] = -(-block[i] // 2)
    return tuple(block)


def resolve_block_shape(
    shape: tuple[int, ...], block_shape: Sequence[int] | None, blocks: Sequence[int] | None, what: str
) -> tuple[int, ...]:
    """The block shape from exactly one of ``block_shape`` / ``blocks`` (parts per dim), or the default."""
    if block_shape is not None and blocks is not None:
        raise ShapeError(f"{what}: give block_shape or blocks, not both")
    if block_shape is None and blocks is None:
        return default_block_shape(shape)
    given = block_shape if block_shape is not None else blocks
    kind = "block_shape" if block_shape is not None else "blocks"
    try:
        vals = tuple(int(v) for v in given)  # type: ignore[union-attr]
    except (TypeError, ValueError) as exc:
        raise ShapeError(f"{what}: {kind}={given!r} is not a sequence of ints") from exc
    if len(vals) != len(shape):
        raise ShapeError(f"{what}: {kind}={vals} has {len(vals)} entries but the tensor has shape {shape}")
    for d, (v, n) in enumerate(zip(vals, shape, strict=True)):
        if v < 1:
            raise ShapeError(f"{what}: {kind}[{d}]={v} must be >= 1 (dimension {d} has size {n})")
        if kind == "blocks" and v > max(n, 1):
            raise ShapeError(f"{what}: blocks[{d}]={v} parts exceed dimension {d}'s size {n}")
    if kind == "blocks":
        return tuple(max(1, -(-n // v)) for n, v in zip(shape, vals, strict=True))
    return tuple(min(v, max(n, 1)) for v, n in zip(vals, shape, strict=True))


def grid(shape: tuple[int, ...], block_shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(-(-n // b) for n, b in zip(shape, block_shape, strict=True))


def metadata(shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str) -> dict[bytes, bytes]:
    return {
        b"tensorsql.dtype": dtype.encode(),
        b"tensorsql.shape": json.dumps(list(shape)).encode(),
        b"tensorsql.block_shape": json.dumps(list(block_shape)).encode(),
    }


def split(array: np.ndarray, block_shape: tuple[int, ...], dtype: str) -> pa.Table:
    """One row per block: key columns k0..k{r-1} (INTEGER) and the block's C-order bytes."""
    arr = np.asarray(array, dtype=DTYPES[dtype])
    g = grid(arr.shape, block_shape)
    keys: list[list[int]] = [[] for _ in arr.shape]
    blobs: list[bytes] = []
    for idx in itertools.product(*(range(n) for n in g)):
        sl = tuple(slice(k * b, (k + 1) * b) for k, b in zip(idx, block_shape, strict=True))
        blobs.append(np.ascontiguousarray(arr[sl]).tobytes())
        for d, k in enumerate(idx):
            keys[d].append(k)
    cols = {f"k{d}": pa.array(keys[d], pa.int32()) for d in range(arr.ndim)}
    cols["tensor"] = pa.array(blobs, pa.binary())
    return pa.table(cols).replace_schema_metadata(metadata(arr.shape, block_shape, dtype))


def assemble(table: pa.Table, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Blocks back into one array; absent keys (and NULL blocks) are zero blocks."""
    dt = DTYPES[dtype]
    out = np.zeros(shape, dtype=dt)
    keys = [table.column(f"k{d}").to_numpy(zero_copy_only=False) for d in range(len(shape))]
    blobs = table.column("tensor").to_pylist()
    for row, blob in enumerate(blobs):
        if blob is None:
            continue
        idx = [int(k[row]) for k in keys]
        sl = tuple(slice(i * b, min((i + 1) * b, n)) for i, b, n in zip(idx, block_shape, shape, strict=True))
        ext = tuple(s.stop - s.start for s in sl)
        if any(e <= 0 for e in ext) and ext:
            raise ShapeError(f"block key {tuple(idx)} lies outside a tensor of shape {shape}")
        need = int(np.prod(ext)) * dt.itemsize
        if len(blob) != need:
            raise KernelError(
                f"block {tuple(idx)} has {len(blob)} bytes but its shape {ext} of {dtype} needs {need}"
            )
        out[sl] = np.frombuffer(blob, dtype=dt).reshape(ext)
    return out
