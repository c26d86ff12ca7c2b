"""The expression graph: immutable nodes, one per tensor-valued step (the EinGraph).

Nodes compare and hash by identity (``eq=False``), so a node used twice is one vertex of a DAG and side
tables key on the nodes themselves (which keeps them alive; ``id()`` would not).
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True, eq=False)
class Node:
    shape: tuple[int, ...]
    dtype: str


@dataclass(frozen=True, eq=False)
class Source(Node):
    """A stored relation: a DuckDB table or view with columns k0..k{r-1}, tensor."""

    table: str
    block_shape: tuple[int, ...]
    #: every block of the grid is there (a stand-in for a step computed in the same run from data that
    #: has every block, ``Compiled``'s shared steps): nothing to fill before a step that needs zeros
    complete: bool = False


@dataclass(frozen=True, eq=False)
class Operand(Node):
    """An array operand of a call, bound to data only when the plan runs (``bindings``).

    Free to split: the executor uploads (or lends) it in whatever blocking the plan reads it with, so a call
    plans once and uploads after, and a cached plan runs again on new arrays of the same shape and dtype.
    """

    name: str


@dataclass(frozen=True, eq=False)
class EinSum(Node):
    """Z[out] <- agg over labels not in out of join(inputs); one input (unary) or two (binary)."""

    inputs: tuple[Node, ...]
    in_labels: tuple[tuple[int, ...], ...]
    out_labels: tuple[int, ...]
    join: str
    agg: str


@dataclass(frozen=True, eq=False)
class Map(Node):
    """An element-wise scalar function; ``param`` for pow and scale."""

    input: Node
    fn: str
    param: float | None


@dataclass(frozen=True, eq=False)
class Cast(Node):
    input: Node


@dataclass(frozen=True, eq=False)
class Reblock(Node):
    """An explicit change of block shape (a repartition the user asked for)."""

    input: Node
    block_shape: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Slice(Node):
    """numpy basic indexing: input dimension d read at ``start[d] + step[d] * t`` for ``t < count[d]``;
    a dimension not in ``keep`` (an integer index: count 1) is dropped from the result."""

    input: Node
    start: tuple[int, ...]
    count: tuple[int, ...]
    step: tuple[int, ...]
    keep: tuple[bool, ...]


def children(node: Node) -> tuple[Node, ...]:
    if isinstance(node, Source | Operand):
        return ()
    if isinstance(node, EinSum):
        return node.inputs
    if isinstance(node, Map | Cast | Reblock | Slice):
        return (node.input,)
    raise TypeError(f"unhandled expression node {type(node).__name__}")


def topological(root: Node) -> list[Node]:
    """Nodes reachable from root, inputs before consumers, each once."""
    order: list[Node] = []
    seen: set[Node] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if done:
            order.append(node)
            continue
        if node in seen:
            continue
        seen.add(node)
        stack.append((node, True))
        stack.extend((c, False) for c in reversed(children(node)) if c not in seen)
    return order


def with_children(node: Node, new: tuple[Node, ...]) -> Node:
    """``node`` over ``new`` children (in ``children`` order); ``node`` itself when they are the same."""
    old = children(node)
    if len(new) != len(old):
        raise TypeError(f"{type(node).__name__} takes {len(old)} children, got {len(new)}")
    if all(a is b for a, b in zip(old, new, strict=True)):
        return node
    if isinstance(node, EinSum):
        return replace(node, inputs=tuple(new))
    return replace(node, input=new[0])  # Map, Cast, Reblock, Slice: one input


def substitute(root: Node, done: dict[Node, Node]) -> Node:
    """``root`` with every node of ``done`` replaced by its value there (the graph above rebuilt)."""
    memo: dict[Node, Node] = dict(done)
    for node in topological(root):
        if node not in memo:
            memo[node] = with_children(node, tuple(memo[c] for c in children(node)))
    return memo[root]
