"""Fusion: multiply/sum contractions whose every tensor is one block and that feed only each other run as one
kernel call (``tra.Fused``, ``tensor_einsum_path``): one query step instead of a join and a group-by each."""

from __future__ import annotations

from collections.abc import Callable

from tensorsql.frontend.subscripts import label_name
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import Partitioning


def one_block_contraction(node: E.Node, part: Partitioning) -> bool:
    """A multiply/sum contraction of two operands whose every label is one block."""
    if not (isinstance(node, E.EinSum) and len(node.inputs) == 2):
        return False
    if node.join != "multiply" or node.agg != "sum":
        return False
    blocks = part.label_blocks[node]
    return all(
        blocks[lab] >= n > 0
        for child, labels in zip(node.inputs, node.in_labels, strict=True)
        for lab, n in zip(labels, child.shape, strict=True)
    )


def consumers(root: E.Node) -> dict[E.Node, list[E.Node]]:
    out: dict[E.Node, list[E.Node]] = {}
    for node in E.topological(root):
        for child in E.children(node):
            out.setdefault(child, []).append(node)
    return out


def absorbed(node: E.Node, part: Partitioning, users: dict[E.Node, list[E.Node]]) -> bool:
    """Whether a contraction runs inside its one consumer's fused kernel call."""
    mine = users.get(node, [])
    return len(mine) == 1 and one_block_contraction(node, part) and one_block_contraction(mine[0], part)


def fused_steps(root: E.Node, part: Partitioning) -> int:
    """How many contractions ``fuse`` runs inside another's fused kernel call: each is a query step (join,
    group-by, result blob) the plan does not pay for."""
    users = consumers(root)
    return sum(1 for node in E.topological(root) if absorbed(node, part, users))


#: an operand of a fused step: ("leaf", index into the children) or ("step", index into the steps)
_Ref = tuple[str, int]


def fuse(
    node: E.Node,
    part: Partitioning,
    users: dict[E.Node, list[E.Node]],
    go: Callable[[E.Node], T.Rel],
    reblock: Callable[[T.Rel, tuple[int, ...]], T.Rel],
) -> T.Fused | None:
    """The one-block contractions under ``node`` that feed only each other, as one ``Fused`` relation; None
    when fewer than two contractions would fuse. Any other operand (a stored input, a split tensor, a map,
    an intermediate with other consumers) is lowered on its own (``go``) and read as one block."""
    if not isinstance(node, E.EinSum) or not one_block_contraction(node, part):
        return None
    if not any(absorbed(c, part, users) for c in node.inputs):
        return None
    leaves: list[T.Rel] = []
    leaf_of: dict[E.Node, int] = {}
    steps: list[tuple[_Ref, _Ref, tuple[str, ...], tuple[str, ...], tuple[str, ...]]] = []
    share = True  # an input read twice is one leaf, unless it is the only one (the kernel takes two or more)

    def operand(child: E.Node) -> _Ref:
        if isinstance(child, E.EinSum) and absorbed(child, part, users):
            return step(child)
        if child not in leaf_of or not share:
            leaf_of[child] = len(leaves)
            leaves.append(reblock(go(child), child.shape))
        return ("leaf", leaf_of[child])

    def step(n: E.EinSum) -> _Ref:
        x, y = operand(n.inputs[0]), operand(n.inputs[1])
        xl, yl, zl = (tuple(label_name(lab) for lab in t) for t in (*n.in_labels, n.out_labels))
        steps.append((x, y, xl, yl, zl))
        return ("step", len(steps) - 1)

    step(node)
    if len(leaves) < 2:  # A·Aᵀ·A: every step reads one tensor; read it once per use
        share = False
        leaves.clear()
        steps.clear()
        step(node)

    def index(ref: _Ref) -> int:
        return ref[1] if ref[0] == "leaf" else len(leaves) + ref[1]

    program = tuple((index(x), index(y), xl, yl, zl) for x, y, xl, yl, zl in steps)
    return T.Fused(T.positional(node.shape, node.shape, node.dtype), tuple(leaves), program)
