"""Running a plan in waves that fit a memory budget: how much a query holds, and how to cut it.

DuckDB runs a query 2048 rows at a time, and a row is a block: a table of fewer than 2048 blocks is held
whole by the scan that reads it, and a hash join holds its whole build side, blobs included (its external
mode does not bring tensor-sized rows under the limit). Measured on a file database under a 48 MB limit:
joining two 36 MB tables fails, and so does joining all of one with a quarter of the other; joining half
of each works. So a plan whose tensors together pass the budget runs in *waves*: each wave keeps only the
blocks whose keys lie in one range per cut label (``T.Restrict``, a filter DuckDB pushes into the scan),
and the waves' results together are the plan's result.

- A cut along a label the step keeps (an output label) splits its result into disjoint pieces.
- A cut along a label an aggregation sums away gives partial results: they are stored, then combined by
  an aggregation of their own (every ``agg`` is associative and commutative), itself run in waves.
- A plan of several steps is run step by step (``Aggregate`` nodes become stored relations) so each query
  holds one step's inputs.

This module only rewrites TRA (node -> node) and estimates bytes; the executor runs the waves.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping

from tensorsql.dtypes import DTYPES
from tensorsql.ir import tra as T

#: block-key ranges per label: (first, last), inclusive
Ranges = Mapping[str, tuple[int, int]]


def _block_bytes(schema: T.Schema) -> int:
    dims = [min(schema.blocks[lab], schema.sizes[lab]) for lab in schema.blob]
    return math.prod(dims) * DTYPES[schema.dtype].itemsize


def _rows(schema: T.Schema, ranges: Ranges) -> int:
    n = 1
    for k in schema.keys:
        lo, hi = ranges.get(k, (0, schema.nblocks(k) - 1))
        n *= max(0, hi - lo + 1)
    return n


def box_bytes(schema: T.Schema, ranges: Ranges) -> int:
    """Bytes of ``schema``'s blocks within ``ranges`` (dense: edge blocks whole, as the planner counts)."""
    return _rows(schema, ranges) * _block_bytes(schema)


def _relevant(schema: T.Schema, ranges: Ranges) -> dict[str, tuple[int, int]]:
    """The ranges that keep fewer than all of ``schema``'s blocks along a key it has."""
    return {k: r for k, r in ranges.items() if k in schema.keys and r != (0, schema.nblocks(k) - 1)}


def _repartitioned(rel: T.Repartition, ranges: Ranges) -> dict[str, tuple[int, int]]:
    """Target-block ranges of a repartition -> the source blocks that overlap them."""
    src, dst = rel.child.schema, rel.schema
    out: dict[str, tuple[int, int]] = {}
    for k, (lo, hi) in ranges.items():
        if src.blocks[k] == dst.blocks[k]:
            out[k] = (lo, hi)
            continue
        first = lo * dst.blocks[k]
        end = min((hi + 1) * dst.blocks[k], dst.sizes[k])
        out[k] = (first // src.blocks[k], (end - 1) // src.blocks[k])
    return out


def _sliced(rel: T.Slice, ranges: Ranges) -> dict[str, tuple[int, int]]:
    """Output-block ranges of a slice -> the child blocks holding their elements."""
    out: dict[str, tuple[int, int]] = {}
    for d, k in enumerate(rel.child.schema.keys):
        want = ranges.get(rel.schema.keys[rel.out_dim(d)]) if rel.keep[d] else None
        if want is None:
            continue
        blocks = [c for c, t, *_ in rel.pieces(d) if want[0] <= t <= want[1]]
        out[k] = (min(blocks), max(blocks)) if blocks else (0, -1)
    return out


class _Walk:
    """One push of key ranges down a plan: the restricted plan and the bytes its nodes make."""

    def __init__(self) -> None:
        self.memo: dict[tuple[int, frozenset], T.Rel] = {}
        self.bytes = 0
        #: the ranges each aggregation was reached with (``ranges_at``)
        self.at: dict[T.Rel, list[dict[str, tuple[int, int]]]] = {}

    def count(self, rel: T.Rel, ranges: Ranges) -> None:
        self.bytes += _rows(rel.schema, ranges) * _block_bytes(rel.schema)

    def push(self, rel: T.Rel, ranges: Ranges, fused: bool = False) -> T.Rel:
        here = _relevant(rel.schema, ranges) if not isinstance(rel, T.Aggregate) else dict(ranges)
        key = (id(rel), frozenset(here.items()))
        if key in self.memo:  # a shared input (the plan is a DAG): computed once, counted once
            if isinstance(rel, T.Scan):
                # but a stored table read twice (X @ X) is two scans, each holding its blocks; counted once,
                # cutting one side of X @ X raised the estimate (half of X and all of it again), so no
                # halving lowered it and the plan ran as one query over the limit
                self.count(rel, here)
            return self.memo[key]
        out = self._push(rel, here, fused)
        self.memo[key] = out
        return out

    def _push(self, rel: T.Rel, ranges: dict[str, tuple[int, int]], fused: bool) -> T.Rel:
        s = rel.schema
        if isinstance(rel, T.Scan | T.Input | T.Fused):
            self.count(rel, ranges)
            if not ranges or isinstance(rel, T.Fused):
                return rel
            kept = tuple((k, *ranges[k]) for k in s.keys if k in ranges)
            return T.Restrict(s, rel, kept)
        if isinstance(rel, T.Restrict):
            mine = {k: (lo, hi) for k, lo, hi in rel.ranges}
            for k, (lo, hi) in ranges.items():
                a, b = mine.get(k, (lo, hi))
                mine[k] = (max(a, lo), min(b, hi))
            return self.push(rel.child, mine)
        if isinstance(rel, T.Relabel):
            pairs = zip(rel.child.schema.keys, rel.labels, strict=True)
            child = {pos: ranges[lab] for pos, lab in pairs if lab in ranges}
            return T.with_inputs(rel, (self.push(rel.child, child),))
        if isinstance(rel, T.Positional):
            c = rel.child.schema
            child = {lab: ranges[k] for k, lab in zip(s.keys, c.blob, strict=True) if k in ranges}
            return T.with_inputs(rel, (self.push(rel.child, child),))
        if isinstance(rel, T.Repartition):
            self.count(rel, ranges)
            new = T.with_inputs(rel, (self.push(rel.child, _repartitioned(rel, ranges)),))
            if not ranges:
                return new
            # a source block also overlaps target blocks outside the ranges: those come out partly
            # assembled, and are dropped here
            return T.Restrict(s, new, tuple((k, *ranges[k]) for k in s.keys if k in ranges))
        if isinstance(rel, T.Densify):
            self.count(rel, ranges)
            new = T.with_inputs(rel, (self.push(rel.child, ranges),))
            if not ranges:
                return new
            # the grid is the whole relation's: only the wave's blocks are kept
            return T.Restrict(s, new, tuple((k, *ranges[k]) for k in s.keys if k in ranges))
        if isinstance(rel, T.Slice):
            self.count(rel, ranges)
            new = T.with_inputs(rel, (self.push(rel.child, _sliced(rel, ranges)),))
            if not ranges:
                return new
            # as for a repartition: pieces of output blocks outside the ranges are dropped
            return T.Restrict(s, new, tuple((k, *ranges[k]) for k in s.keys if k in ranges))
        if isinstance(rel, T.Join):
            if not fused:  # under an aggregate that fuses with it, no product block is ever made
                self.count(rel, ranges)
            left = self.push(rel.left, ranges)
            right = self.push(rel.right, ranges)
            return T.with_inputs(rel, (left, right))
        if isinstance(rel, T.Aggregate):
            self.at.setdefault(rel, []).append(dict(ranges))
            self.count(rel, {k: r for k, r in ranges.items() if k in s.keys})
            fuse = isinstance(rel.child, T.Join) and rel.child.agg == rel.agg
            return T.with_inputs(rel, (self.push(rel.child, ranges, fused=fuse),))
        if isinstance(rel, T.Unary | T.MapBlocks | T.CastBlocks):
            self.count(rel, ranges)
            return T.with_inputs(rel, (self.push(rel.child, ranges),))
        raise TypeError(f"unhandled TRA node {type(rel).__name__}")


def restrict(rel: T.Rel, ranges: Ranges) -> T.Rel:
    """``rel`` computed from only the blocks its key ranges need (``T.Restrict`` over the leaves, and over a
    repartition's partly assembled target blocks). Ranges are in ``rel``'s key labels; for an ``Aggregate``
    they may also cut the labels it sums away (its result is then partial)."""
    return _Walk().push(rel, ranges)


def ranges_at(rel: T.Rel, ranges: Ranges) -> dict[T.Rel, list[dict[str, tuple[int, int]]]]:
    """The key ranges each aggregation in ``rel`` is computed over (one entry per way it is reached) when
    ``rel`` is restricted to ``ranges``: a range the push loses on the way (a label the aggregation does not
    keep) means every piece of ``rel`` computes all of it."""
    walk = _Walk()
    walk.push(rel, ranges)
    return walk.at


def footprint(rel: T.Rel, ranges: Ranges | None = None) -> int:
    """Bytes of the blocks one query of ``rel`` (restricted to ``ranges``) reads and makes: every stored or
    array input, every computed relation (a dense estimate: absent blocks counted, edges counted whole)."""
    walk = _Walk()
    walk.push(rel, ranges or {})
    return walk.bytes


def split(nblocks: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous, near-equal ranges of block keys 0..nblocks-1."""
    bounds = [-(-i * nblocks // parts) for i in range(parts + 1)]  # ceilings: the first ranges the longer
    return [(bounds[i], bounds[i + 1] - 1) for i in range(parts) if bounds[i + 1] > bounds[i]]


def largest(cuts: Mapping[str, int], space: Mapping[str, int]) -> dict[str, tuple[int, int]]:
    """The first wave of ``cuts``: as large as any (ranges are near-equal, the first rounds up)."""
    return {k: max(split(space[k], c), key=lambda r: r[1] - r[0]) for k, c in cuts.items() if c > 1}


def choose_cuts(
    rel: T.Rel, space: Mapping[str, int], budget: int, free: frozenset[str] | set[str]
) -> dict[str, int]:
    """How many ranges to cut each label of ``space`` (label -> its number of blocks) into so that one wave
    of ``rel`` fits ``budget`` bytes: the label whose halving helps most, each time, until it fits or
    nothing can be cut further (the plan then runs with the finest cut: its blocks themselves do not fit).
    Labels in ``free`` (the result keeps them: disjoint pieces) are cut first; the others (partial results,
    stored and combined) only when cutting those alone cannot make a wave fit."""
    cuts = {k: 1 for k in space}
    now = footprint(rel)
    for allowed in ([k for k in space if k in free], list(space)):
        while now > budget:
            best: tuple[int, str] | None = None
            for k in allowed:
                if cuts[k] < space[k]:
                    got = footprint(rel, largest({**cuts, k: min(space[k], cuts[k] * 2)}, space))
                    best = min(best or (got, k), (got, k))
            if best is None or best[0] >= now:
                break
            cuts[best[1]] = min(space[best[1]], cuts[best[1]] * 2)
            now = best[0]
    return cuts


def waves(cuts: Mapping[str, int], space: Mapping[str, int]) -> Iterator[dict[str, tuple[int, int]]]:
    """Every wave of ``cuts``: one range per cut label, all combinations."""
    labels = [k for k, c in cuts.items() if c > 1]
    for combo in itertools.product(*(split(space[k], cuts[k]) for k in labels)):
        yield dict(zip(labels, combo, strict=True))


def count(cuts: Mapping[str, int], space: Mapping[str, int]) -> int:
    return math.prod(len(split(space[k], c)) for k, c in cuts.items() if c > 1)


class Stager:
    """Cuts a plan into stages, whatever runs them: every aggregation below the plan's last step is stored
    (``store``, in the parts ``cuts`` chooses) and read back as a Scan of what was stored, once per node (a
    shared input is stored once). A cut along a label the aggregation sums away stores partial blocks, which
    one more aggregation (a stage of its own) combines. Subclasses say how to cut and how to store."""

    def __init__(self) -> None:
        #: by node (TRA nodes hash by identity): an id would be reused once a combine step's temporary
        #: aggregation is freed, and a later one would read the earlier one's result
        self._memo: dict[T.Rel, T.Scan] = {}

    def cuts(self, rel: T.Rel, space: Mapping[str, int], free: set[str]) -> dict[str, int]:
        raise NotImplementedError

    def store(
        self, rel: T.Rel, space: Mapping[str, int], cuts: Mapping[str, int], schema: T.Schema, what: str
    ) -> str:
        """Runs ``rel`` in the parts of ``cuts`` and keeps the result under the name it returns."""
        raise NotImplementedError

    def below(self, rel: T.Rel) -> T.Rel:
        """``rel`` with every aggregation in it stored."""
        if isinstance(rel, T.Aggregate):
            return self.materialize(rel)
        return T.with_inputs(rel, tuple(self.below(c) for c in T.inputs(rel)))

    def is_stored(self, agg: T.Aggregate) -> bool:
        """Whether ``agg`` has been stored already (a step below another one reads it too)."""
        return agg in self._memo

    def materialize(self, agg: T.Aggregate) -> T.Scan:
        done = self._memo.get(agg)
        if done is not None:
            return done
        rel = T.with_inputs(agg, (self.below(agg.child),))
        inner = rel.child.schema  # type: ignore[attr-defined]
        space = {k: inner.nblocks(k) for k in inner.keys}
        cuts = self.cuts(rel, space, set(agg.schema.keys))
        name = self.store(rel, space, cuts, agg.schema, f"Aggregate {agg.agg} -> {agg.schema.keys}")
        stored = T.Scan(agg.schema, name)
        if any(c > 1 for k, c in cuts.items() if k not in agg.schema.keys):  # partial blocks: combine
            stored = self.materialize(T.Aggregate(agg.schema, stored, agg.agg))
        self._memo[agg] = stored
        return stored

    def top(self, rel: T.Rel) -> T.Rel:
        """The last step: ``rel`` with the aggregations under its own aggregations stored."""
        if isinstance(rel, T.Aggregate):
            return T.with_inputs(rel, (self.below(rel.child),))
        return T.with_inputs(rel, tuple(self.top(c) for c in T.inputs(rel)))


def has_aggregate(rel: T.Rel) -> bool:
    return isinstance(rel, T.Aggregate) or any(has_aggregate(c) for c in T.inputs(rel))
