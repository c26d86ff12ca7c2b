"""Expression graph + partitioning -> TRA plan.

Every expression node's output is a positional tensor relation (keys k0..); an EinSum relabels its
inputs to its own labels, repartitions them to the node's label blocks when they differ, joins,
aggregates, and renames back to positional keys.
"""

from __future__ import annotations

import dataclasses

from tensorsql.compile import waves
from tensorsql.compile.fuse import consumers, fuse
from tensorsql.frontend.subscripts import label_name
from tensorsql.ir import expr as E
from tensorsql.ir import ops
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import Partitioning, numel, slice_blocks


def default_partitioning(root: E.Node) -> Partitioning:
    """Keep the operands' blocking; where two operands disagree on a label, the bigger one wins."""
    label_blocks: dict[E.EinSum, dict[int, int]] = {}
    shapes: dict[E.Node, tuple[int, ...]] = {}
    for node in E.topological(root):
        if isinstance(node, E.Source | E.Reblock):
            shapes[node] = node.block_shape
        elif isinstance(node, E.Operand):  # an array is free to split: one block unless a plan says otherwise
            shapes[node] = tuple(max(1, n) for n in node.shape)
        elif isinstance(node, E.Map | E.Cast):
            shapes[node] = shapes[node.input]
        elif isinstance(node, E.Slice):
            shapes[node] = slice_blocks(node.count, node.keep, shapes[node.input])
        elif isinstance(node, E.EinSum):
            blocks: dict[int, int] = {}
            by_size = sorted(zip(node.inputs, node.in_labels, strict=True), key=lambda p: -numel(p[0].shape))
            for child, labels in by_size:
                mine: dict[int, int] = {}
                for lab, b in zip(labels, shapes[child], strict=True):
                    mine[lab] = min(mine.get(lab, b), b)  # a diagonal needs equal blocks on both dims
                for lab, b in mine.items():
                    blocks.setdefault(lab, b)
            label_blocks[node] = blocks
            shapes[node] = tuple(blocks[lab] for lab in node.out_labels)
        else:
            raise TypeError(f"unhandled expression node {type(node).__name__}")
    return Partitioning(label_blocks, shapes)


def lower(root: E.Node, part: Partitioning, operands: tuple[E.Operand, ...] = ()) -> T.Rel:
    """The TRA plan of ``root``; ``operands`` number the graph's Operand leaves (``T.Input.index``)."""
    memo: dict[E.Node, T.Rel] = {}
    reblocked: dict[tuple[T.Rel, tuple[int, ...]], T.Rel] = {}
    users = consumers(root)
    slot = {op: i for i, op in enumerate(operands)}

    def go(node: E.Node) -> T.Rel:
        if node not in memo:
            if isinstance(node, E.Operand):
                if node not in slot:
                    raise TypeError(f"operand {node.name!r} is not among the plan's operands")
                schema = T.positional(node.shape, part.block_shapes[node], node.dtype)
                memo[node] = T.Input(schema, slot[node], node.name)
            else:
                fused = fuse(node, part, users, go, reblock)
                if fused is not None:
                    memo[node] = fused
                elif isinstance(node, E.Slice):
                    memo[node] = _slice(node, part, sliced(node.input))
                else:
                    memo[node] = _lower(node, part, go, reblock)
        return memo[node]

    restricted: dict[E.Node, T.Rel] = {}

    def sliced(node: E.Node) -> T.Rel:
        """What slices read of ``node``: where slices are its only consumers, its plan restricted to the
        blocks between the first and the last any of them holds (computed once, for all of them)."""
        mine = users.get(node, [])
        if not all(isinstance(u, E.Slice) for u in mine):
            return go(node)
        if node not in restricted:
            child = go(node)
            ranges = {}
            for d, k in enumerate(child.schema.keys):
                bs = child.schema.blocks[k]
                spans = [_span(u, d) for u in mine]  # type: ignore[arg-type]
                ranges[k] = (min(lo for lo, _ in spans) // bs, max(hi for _, hi in spans) // bs)
            restricted[node] = waves.restrict(child, ranges)
        return restricted[node]

    def reblock(
        rel: T.Rel, block_shape: tuple[int, ...], diagonal: tuple[tuple[int, ...], ...] = ()
    ) -> T.Rel:
        # one repartition per (relation, target blocking, diagonal), however many consumers want it
        key = (rel, tuple(block_shape), diagonal)
        if key not in reblocked:
            reblocked[key] = _reblock(rel, block_shape, diagonal)
        return reblocked[key]

    return go(root)


def _clip(block: int, size: int) -> int:
    return max(1, min(block, size))


def _reblock(rel: T.Rel, block_shape: tuple[int, ...], diagonal: tuple[tuple[int, ...], ...] = ()) -> T.Rel:
    s = rel.schema
    want = {k: _clip(b, s.sizes[k]) for k, b in zip(s.keys, block_shape, strict=True)}
    have = {k: _clip(s.blocks[k], s.sizes[k]) for k in s.keys}
    if want == have:
        return rel
    if isinstance(rel, T.Slice) and not diagonal:  # the slice cuts its pieces to these blocks directly
        return dataclasses.replace(rel, schema=T.Schema(s.keys, s.blob, s.sizes, want, s.dtype))
    return T.Repartition(T.Schema(s.keys, s.blob, s.sizes, want, s.dtype), rel, diagonal)


def _diagonal(labels: tuple[int, ...]) -> tuple[tuple[int, ...], ...]:
    """Groups of the positions that a repeated label ties (``ii`` -> ((0, 1),)): their blocks agree."""
    at: dict[int, list[int]] = {}
    for pos, lab in enumerate(labels):
        at.setdefault(lab, []).append(pos)
    return tuple(tuple(p) for p in at.values() if len(p) > 1)


def _slice(node: E.Slice, part: Partitioning, child: T.Rel) -> T.Slice:
    schema = T.positional(node.shape, part.block_shapes[node], node.dtype)
    return T.Slice(schema, child, node.start, node.count, node.step, node.keep)


def _span(node: E.Slice, d: int) -> tuple[int, int]:
    """The first and last element a slice reads along input dimension ``d``."""
    first = node.start[d]
    last = first + node.step[d] * (node.count[d] - 1)
    return min(first, last), max(first, last)


def _lower(node: E.Node, part: Partitioning, go, reblock) -> T.Rel:
    if isinstance(node, E.Source):
        return T.Scan(T.positional(node.shape, node.block_shape, node.dtype), node.table, node.complete)
    if isinstance(node, E.Reblock):
        return reblock(go(node.input), node.block_shape)
    if isinstance(node, E.Map):
        child = reblock(go(node.input), part.block_shapes[node])
        s = child.schema
        if T.may_lack_blocks(child) and not ops.keeps_zero(node.fn, s.dtype, node.param):
            child = T.Densify(s, child)  # an absent block is zeros, and this map does not keep zeros
        return T.MapBlocks(
            T.Schema(s.keys, s.blob, s.sizes, s.blocks, node.dtype), child, node.fn, node.param
        )
    if isinstance(node, E.Cast):
        child = reblock(go(node.input), part.block_shapes[node])
        s = child.schema
        return T.CastBlocks(T.Schema(s.keys, s.blob, s.sizes, s.blocks, node.dtype), child)
    if not isinstance(node, E.EinSum):
        raise TypeError(f"unhandled expression node {type(node).__name__}")

    blocks = part.label_blocks[node]
    sizes: dict[int, int] = {}
    rels: list[T.Rel] = []
    # multiply/sum skips an absent block exactly (its products are zeros, which add nothing); any other
    # join or aggregation must see the zeros, so inputs that may miss blocks are filled first
    sparse_safe = node.join == "multiply" and node.agg == "sum"
    for child, labels in zip(node.inputs, node.in_labels, strict=True):
        sizes.update(zip(labels, child.shape, strict=True))
        # a repeated label reads only the diagonal blocks: a re-split makes no others
        rel = reblock(go(child), tuple(blocks[lab] for lab in labels), _diagonal(labels))
        if not sparse_safe and T.may_lack_blocks(rel):
            rel = T.Densify(rel.schema, rel)  # absent is zeros, and 0 + x or max(0, ..) is not absent
        names = tuple(label_name(lab) for lab in labels)
        keys = tuple(dict.fromkeys(names))
        schema = T.Schema(
            keys,
            names,
            {label_name(lab): n for lab, n in zip(labels, child.shape, strict=True)},
            {label_name(lab): _clip(blocks[lab], n) for lab, n in zip(labels, child.shape, strict=True)},
            node.dtype,
        )
        rels.append(T.Relabel(schema, rel, names))

    name_sizes = {label_name(k): v for k, v in sizes.items()}
    name_blocks = {label_name(k): _clip(blocks[k], v) for k, v in sizes.items()}
    out = tuple(label_name(lab) for lab in node.out_labels)
    all_keys = tuple(dict.fromkeys(k for r in rels for k in r.schema.keys))
    row_schema = T.Schema(all_keys, out, name_sizes, name_blocks, node.dtype)
    if len(rels) == 2:
        rel: T.Rel = T.Join(row_schema, rels[0], rels[1], node.join, node.agg)
    else:
        rel = T.Unary(row_schema, rels[0], node.agg)
    if set(all_keys) != set(out):
        rel = T.Aggregate(T.Schema(out, out, name_sizes, name_blocks, node.dtype), rel, node.agg)
    final = T.positional(node.shape, tuple(name_blocks[k] for k in out), node.dtype)
    return T.Positional(final, rel)
