"""Block arithmetic and the partitioning of an expression graph: how every tensor of a plan is cut.

``Partitioning`` maps expression nodes themselves (identity-hashed frozen nodes, never ``id()``), so a plan
keeps its nodes alive, pickles with them, and can be cached or shipped to another process.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tensorsql.errors import ShapeError
from tensorsql.ir import expr as E
from tensorsql.metadata import MAX_BLOCKS_PER_DIM


@dataclass(frozen=True, eq=False)
class Partitioning:
    """Block size per label for each EinSum node, and the output block shape of every node."""

    label_blocks: dict[E.EinSum, dict[int, int]]
    block_shapes: dict[E.Node, tuple[int, ...]]


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


#: default block size target in elements (4 MiB of float32): big enough that per-block overhead is
#: small, small enough that a 2-core machine gets several blocks to work on.
DEFAULT_BLOCK_ELEMENTS = 1 << 20

#: the default cap on the bytes of any block a plan makes (docs "Memory and limits"). A kernel call holds a
#: few blocks at once (two operands, the output, packing scratch, DuckDB's copy of its result), and every
#: DuckDB thread may be in one, so the cap bounds a query's working memory by a small multiple of
#: threads x cap; 256 MiB keeps that well under a machine's memory while a block stays big enough that
#: the per-call overhead (~3 us) is nothing against its kernel work (a 256 MiB float32 GEMM block is
#: 8192^2), and far under DuckDB's 4 GiB BLOB and Arrow's 2 GiB binary limits.
MAX_BLOCK_BYTES = 256 << 20
#: the least and the most a cap may be: a block must hold one complex128 element at least, and fit one
#: Arrow binary value (int32 offsets) at most
MIN_BLOCK_BYTES = 1 << 10
LIMIT_BLOCK_BYTES = (1 << 31) - 1


def default_block_shape(shape: tuple[int, ...], target: int = DEFAULT_BLOCK_ELEMENTS) -> tuple[int, ...]:
    block = [max(1, n) for n in shape]
    while math.prod(block) > target:
        i = max(range(len(block)), key=block.__getitem__)
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
        given = tuple(given)  # type: ignore[arg-type]  # once: a generator would be empty the next time
        if any(isinstance(v, bool | np.bool_) for v in given):
            raise TypeError("a bool is not a size")
        vals = tuple(operator.index(v) for v in given)
    except TypeError as exc:
        raise ShapeError(f"{what}: {kind}={given!r} is not a sequence of ints") from exc
    if len(vals) != len(shape):
        raise ShapeError(f"{what}: {kind}={vals} has {len(vals)} entries but the tensor has shape {shape}")
    for d, (v, n) in enumerate(zip(vals, shape, strict=True)):
        if v < 1:
            raise ShapeError(f"{what}: {kind}[{d}]={v} must be >= 1 (dimension {d} has size {n})")
        if kind == "blocks" and v > max(n, 1):
            raise ShapeError(f"{what}: blocks[{d}]={v} parts exceed dimension {d}'s size {n}")
    if kind == "blocks":
        out = tuple(max(1, -(-n // v)) for n, v in zip(shape, vals, strict=True))
    else:
        out = tuple(min(v, max(n, 1)) for v, n in zip(vals, shape, strict=True))
    for d, (n, b) in enumerate(zip(shape, out, strict=True)):
        if nblocks(n, b) > MAX_BLOCKS_PER_DIM:  # block keys are INTEGER columns
            raise ShapeError(
                f"{what}: dimension {d} of size {n} in blocks of {b} is {nblocks(n, b)} blocks, more than "
                f"the {MAX_BLOCKS_PER_DIM} a dimension may have; give it bigger blocks"
            )
    return out


def nblocks(n: int, b: int) -> int:
    """Blocks along a dimension of size ``n`` in blocks of ``b``. A dimension of size 0 has one block, of
    extent 0: a zero-size tensor is a set of empty blocks, so a kernel still sees (and reduces over) its empty
    labels: a product over an empty label is 1, not an absent (zero) block."""
    return max(1, -(-n // b))


def grid(shape: tuple[int, ...], block_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Blocks per dimension (``nblocks`` of each)."""
    return tuple(nblocks(n, b) for n, b in zip(shape, block_shape, strict=True))




def slice_blocks(
    count: Sequence[int], keep: Sequence[bool], input_blocks: Sequence[int]
) -> tuple[int, ...]:
    """A slice's block shape: its input's blocks along each kept dimension, clipped to the slice's length
    (a slice of one block's elements is one block)."""
    return tuple(max(1, min(n, b)) for n, k, b in zip(count, keep, input_blocks, strict=True) if k)
