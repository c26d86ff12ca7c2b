"""Physical rewrite passes over a TRA plan, run in order before SQL generation, and the GEMM-order rewrite of
a plan's root. Each pass is a function from plan to plan; choices become fields of TRA nodes, so
``explain()`` shows them and every executor reads the same decisions."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from tensorsql.compile.profile import EngineProfile
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import Partitioning


def _rebuild(rel: T.Rel, fn: Callable[[T.Rel, tuple[T.Rel, ...]], T.Rel]) -> T.Rel:
    """Bottom-up map over the DAG, each node once (shared inputs stay shared)."""
    memo: dict[T.Rel, T.Rel] = {}
    stack: list[tuple[T.Rel, bool]] = [(rel, False)]  # iterative: a deep graph (a deep network's gradient)
    while stack:  # would pass Python's recursion limit
        r, ready = stack.pop()
        if r in memo:
            continue
        kids = T.inputs(r)
        if ready:
            memo[r] = fn(r, tuple(memo[c] for c in kids))
            continue
        stack.append((r, True))
        stack.extend((c, False) for c in reversed(kids) if c not in memo)
    return memo[rel]


def _filtered(rel: T.Rel) -> bool:
    """A side read with a filter (a repeated label keeps only its diagonal blocks)."""
    return isinstance(rel, T.Relabel) and len(set(rel.labels)) < len(rel.labels)


def _single_block(schema: T.Schema) -> bool:
    return all(schema.blocks[k] >= schema.sizes[k] for k in schema.keys)


def choose_join(join: T.Join, profile: EngineProfile) -> T.Join:
    """How a join pairs its sides' blocks on this engine (``T.JOIN_METHODS``).

    Two one-block sides without filters sit side by side (at most one row each: a positional scan over stored
    tables, no block copied). A one-block side at most half the size of the other side's blocks is repeated
    beside every row of that side, which streams without a copy where a hash join copies its build side. A
    join of fewer than ``pin_pairs`` block pairs pins its left side's block shapes (DuckDB's join buffers
    copy small outputs unless a LIST column rides along). A side that may lack rows (a computed side, or a
    sparse stored input) leaves padding rows with NULL keys and blocks.
    """
    left, right = join.left, join.right
    if not profile.side_joins:
        return join
    lone = [(rel, math.prod(rel.schema.blocks.values())) for rel in (left, right)]
    lone = [item for item in lone if _single_block(item[0].schema)]
    if len(lone) == 2 and not _filtered(left) and not _filtered(right):
        return dataclasses.replace(join, method="side_by_side", pin=False, padded=True)
    if lone:
        small, small_elems = min(lone, key=lambda item: item[1])
        big = right if small is left else left
        if not _filtered(big) and 2 * small_elems <= math.prod(big.schema.blocks.values()):
            method = "repeat_left" if small is left else "repeat_right"
            return dataclasses.replace(join, method=method, pin=False, padded=not T.counted(big))
    grid = {k: rel.schema.nblocks(k) for rel in (left, right) for k in rel.schema.keys}
    pin = math.prod(grid.values()) < profile.pin_pairs
    return dataclasses.replace(join, method="hash", pin=pin, padded=False)


def choose_joins(rel: T.Rel, profile: EngineProfile) -> T.Rel:
    """The pass: every Join gets its method, pin and padding for this engine."""

    def step(r: T.Rel, new: tuple[T.Rel, ...]) -> T.Rel:
        r = T.with_inputs(r, new)
        return choose_join(r, profile) if isinstance(r, T.Join) else r

    return _rebuild(rel, step)


#: the physical passes, in order (fusion happens while lowering: it needs the expression graph's consumers)
PASSES: tuple[Callable[[T.Rel, EngineProfile], T.Rel], ...] = (choose_joins,)


def physical(rel: T.Rel, profile: EngineProfile) -> T.Rel:
    for p in PASSES:
        rel = p(rel, profile)
    return rel


def gemm_order(root: E.Node, part: Partitioning) -> tuple[E.EinSum, Partitioning, tuple[int, ...]] | None:
    """The root contraction with its output in the GEMM's own label order, its partitioning, and the axes
    permutation back to the requested order; None when that is the requested order already.

    For a multiply/sum einsum whose output labels interleave the operands' (``bdgf,aceg->abcdef``), the kernel
    otherwise forms each product in [batch, M, N] order and scatters it into place: one more pass over a
    result that is often bigger than both inputs. In [batch, M, N] order (or [batch, N, M], the GEMM with its
    operands swapped) the GEMM writes the block in place, and the caller returns a transposed view, as numpy
    and opt_einsum do. The orientation whose blocks are row slabs is preferred; when neither orientation's
    blocks are row slabs but the requested order's are, the requested order stays (a block that is not a row
    slab is copied into place once more: measured slower than the scatter). The blocking is the plan's, per
    label, so the inputs are read exactly as before.
    """
    node = root
    if not (isinstance(node, E.EinSum) and len(node.inputs) == 2):
        return None
    if node.join != "multiply" or node.agg != "sum":
        return None
    xl, yl = node.in_labels
    zl = node.out_labels
    xs, ys, zs = set(xl), set(yl), set(zl)
    batch = [lab for lab in dict.fromkeys(xl) if lab in ys and lab in zs]
    m = [lab for lab in dict.fromkeys(xl) if lab in zs and lab not in ys]
    n = [lab for lab in dict.fromkeys(yl) if lab in zs and lab not in xs]
    if sorted(batch + m + n) != sorted(zl):
        return None
    size = dict(zip(zl, node.shape, strict=True))
    lb = part.label_blocks[node]

    def slabs(order: tuple[int, ...]) -> bool:  # blocks are row slabs: only the first axis is split
        return all(lb[lab] >= size[lab] for lab in order[1:])

    orders = [tuple(batch + m + n), tuple(batch + n + m)]
    if tuple(zl) in orders:
        return None
    natural = next((o for o in orders if slabs(o)), orders[0])
    if slabs(tuple(zl)) and not slabs(natural):
        return None
    node2 = dataclasses.replace(node, shape=tuple(size[lab] for lab in natural), out_labels=natural)
    new = Partitioning(
        label_blocks={**part.label_blocks, node2: dict(lb)},
        block_shapes={**part.block_shapes, node2: tuple(lb[lab] for lab in natural)},
    )
    return node2, new, tuple(natural.index(lab) for lab in zl)


__all__ = ["PASSES", "choose_join", "choose_joins", "gemm_order", "physical"]
