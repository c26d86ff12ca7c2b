"""Expression graph + partitioning -> TRA plan.

Every expression node's output is a positional tensor relation (keys k0..); an EinSum relabels its
inputs to its own labels, repartitions them to the node's label blocks when they differ, joins,
aggregates, and renames back to positional keys.
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorsql import expr as E
from tensorsql import tra as T
from tensorsql.subscripts import label_name


@dataclass(frozen=True)
class Partitioning:
    """Block size per label for each EinSum node, and the output block shape of every node."""

    label_blocks: dict[int, dict[int, int]]  # id(EinSum node) -> label -> block size
    block_shapes: dict[int, tuple[int, ...]]  # id(node) -> output block shape


def default_partitioning(root: E.Node) -> Partitioning:
    """Keep the operands' blocking; where two operands disagree on a label, the bigger one wins."""
    label_blocks: dict[int, dict[int, int]] = {}
    shapes: dict[int, tuple[int, ...]] = {}
    for node in E.topological(root):
        if isinstance(node, E.Source | E.Reblock):
            shapes[id(node)] = node.block_shape
        elif isinstance(node, E.Map | E.Cast):
            shapes[id(node)] = shapes[id(node.input)]
        elif isinstance(node, E.EinSum):
            blocks: dict[int, int] = {}
            by_size = sorted(zip(node.inputs, node.in_labels, strict=True), key=lambda p: -_numel(p[0].shape))
            for child, labels in by_size:
                mine: dict[int, int] = {}
                for lab, b in zip(labels, shapes[id(child)], strict=True):
                    mine[lab] = min(mine.get(lab, b), b)  # a diagonal needs equal blocks on both dims
                for lab, b in mine.items():
                    blocks.setdefault(lab, b)
            label_blocks[id(node)] = blocks
            shapes[id(node)] = tuple(blocks[lab] for lab in node.out_labels)
        else:
            raise TypeError(f"unhandled expression node {type(node).__name__}")
    return Partitioning(label_blocks, shapes)


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def lower(root: E.Node, part: Partitioning) -> T.Rel:
    memo: dict[int, T.Rel] = {}
    reblocked: dict[tuple[int, tuple[int, ...]], T.Rel] = {}
    consumers = _consumers(root)

    def go(node: E.Node) -> T.Rel:
        if id(node) not in memo:
            fused = _fuse(node, part, consumers, go, reblock)
            memo[id(node)] = fused if fused is not None else _lower(node, part, go, reblock)
        return memo[id(node)]

    def reblock(rel: T.Rel, block_shape: tuple[int, ...]) -> T.Rel:
        # one repartition per (relation, target blocking), however many consumers want it
        key = (id(rel), tuple(block_shape))
        if key not in reblocked:
            reblocked[key] = _reblock(rel, block_shape)
        return reblocked[key]

    return go(root)


def _one_block_contraction(node: E.Node, part: Partitioning) -> bool:
    """A multiply/sum contraction of two operands whose every label is one block."""
    if not (isinstance(node, E.EinSum) and len(node.inputs) == 2):
        return False
    if node.join != "multiply" or node.agg != "sum":
        return False
    blocks = part.label_blocks[id(node)]
    return all(
        blocks[lab] >= n > 0
        for child, labels in zip(node.inputs, node.in_labels, strict=True)
        for lab, n in zip(labels, child.shape, strict=True)
    )


def _consumers(root: E.Node) -> dict[int, list[E.Node]]:
    out: dict[int, list[E.Node]] = {}
    for node in E.topological(root):
        for child in E.children(node):
            out.setdefault(id(child), []).append(node)
    return out


def _absorbed(node: E.Node, part: Partitioning, consumers: dict[int, list[E.Node]]) -> bool:
    """Whether a contraction runs inside its one consumer's fused kernel call."""
    users = consumers.get(id(node), [])
    return len(users) == 1 and _one_block_contraction(node, part) and _one_block_contraction(users[0], part)


def fused_steps(root: E.Node, part: Partitioning) -> int:
    """How many contractions ``lower`` runs inside another's fused kernel call (``_fuse``): each is a query
    step (join, group-by, result blob) the plan does not pay for."""
    consumers = _consumers(root)
    return sum(1 for node in E.topological(root) if _absorbed(node, part, consumers))


#: an operand of a fused step: ("leaf", index into the children) or ("step", index into the steps)
_Ref = tuple[str, int]


def _fuse(
    node: E.Node, part: Partitioning, consumers: dict[int, list[E.Node]], go, reblock
) -> T.Fused | None:
    """The one-block contractions under ``node`` that feed only each other, as one ``Fused`` relation; None
    when fewer than two contractions would fuse. Any other operand (a stored input, a split tensor, a map,
    an intermediate with other consumers) is lowered on its own and read as one block."""
    if not isinstance(node, E.EinSum) or not _one_block_contraction(node, part):
        return None
    if not any(_absorbed(c, part, consumers) for c in node.inputs):
        return None
    leaves: list[T.Rel] = []
    leaf_of: dict[int, int] = {}
    steps: list[tuple[_Ref, _Ref, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []

    def operand(child: E.Node) -> _Ref:
        if isinstance(child, E.EinSum) and _absorbed(child, part, consumers):
            return step(child)
        if id(child) not in leaf_of:
            leaf_of[id(child)] = len(leaves)
            leaves.append(reblock(go(child), child.shape))
        return ("leaf", leaf_of[id(child)])

    def step(n: E.EinSum) -> _Ref:
        x, y = operand(n.inputs[0]), operand(n.inputs[1])
        xl, yl, zl = (tuple(label_name(lab) for lab in t) for t in (*n.in_labels, n.out_labels))
        steps.append((x, y, xl, yl, zl))
        return ("step", len(steps) - 1)

    step(node)

    def index(ref: _Ref) -> int:
        return ref[1] if ref[0] == "leaf" else len(leaves) + ref[1]

    program = tuple((index(x), index(y), xl, yl, zl) for x, y, xl, yl, zl in steps)
    return T.Fused(T.positional(node.shape, node.shape, node.dtype), tuple(leaves), program)


def _clip(block: int, size: int) -> int:
    return max(1, min(block, size))


def _reblock(rel: T.Rel, block_shape: tuple[int, ...]) -> T.Rel:
    s = rel.schema
    want = {k: _clip(b, s.sizes[k]) for k, b in zip(s.keys, block_shape, strict=True)}
    have = {k: _clip(s.blocks[k], s.sizes[k]) for k in s.keys}
    if want == have:
        return rel
    return T.Repartition(T.Schema(s.keys, s.blob, s.sizes, want, s.dtype), rel)


def _lower(node: E.Node, part: Partitioning, go, reblock) -> T.Rel:
    if isinstance(node, E.Source):
        return T.Scan(T.positional(node.shape, node.block_shape, node.dtype), node.table)
    if isinstance(node, E.Reblock):
        return reblock(go(node.input), node.block_shape)
    if isinstance(node, E.Map):
        child = reblock(go(node.input), part.block_shapes[id(node)])
        s = child.schema
        return T.MapBlocks(
            T.Schema(s.keys, s.blob, s.sizes, s.blocks, node.dtype), child, node.fn, node.param
        )
    if isinstance(node, E.Cast):
        child = reblock(go(node.input), part.block_shapes[id(node)])
        s = child.schema
        return T.CastBlocks(T.Schema(s.keys, s.blob, s.sizes, s.blocks, node.dtype), child)
    if not isinstance(node, E.EinSum):
        raise TypeError(f"unhandled expression node {type(node).__name__}")

    blocks = part.label_blocks[id(node)]
    sizes: dict[int, int] = {}
    rels: list[T.Rel] = []
    for child, labels in zip(node.inputs, node.in_labels, strict=True):
        sizes.update(zip(labels, child.shape, strict=True))
        rel = reblock(go(child), tuple(blocks[lab] for lab in labels))
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
