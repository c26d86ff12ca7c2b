"""EinGraph: a DAG of input tensors and EinSum vertices (the planner's view of a computation)."""

from __future__ import annotations

import operator
from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

import opt_einsum

from .einsum import EinSum, PlanningError

__all__ = ["EinGraph", "Vertex"]


@dataclass(frozen=True, eq=False)
class Vertex:
    """A handle to one graph vertex. Identity-hashed: two vertices are equal only if they are the same one.

    ``inputs`` are the operand vertices in operand order (a vertex may appear twice, e.g. x*x).
    ``einsum`` is None for graph inputs. ``layout``: an input's fixed parts per dimension (a stored tensor's
    blocking), which every consumer reading it split otherwise pays a repartition for; None: the input is
    free to split (the paper's pre-partitioned inputs).
    """

    id: int
    name: str
    shape: tuple[int, ...]
    einsum: EinSum | None = None
    inputs: tuple[Vertex, ...] = ()
    layout: tuple[int, ...] | None = None

    @property
    def is_input(self) -> bool:
        return self.einsum is None

    def __repr__(self) -> str:
        kind = "input" if self.einsum is None else self.einsum.subscripts
        return f"Vertex({self.id}, {self.name!r}, {self.shape}, {kind})"


def _layout(name: str, shape: tuple[int, ...], parts: object) -> tuple[int, ...]:
    """``parts`` checked against ``shape``: an ordered sequence of one int in 1..n per dimension."""
    if isinstance(parts, str | bytes | bytearray | Mapping | Set) or not isinstance(parts, Iterable):
        raise PlanningError(f"input {name!r}: parts must be a sequence of ints, got {parts!r}")
    vals = tuple(parts)
    if len(vals) != len(shape):
        raise PlanningError(f"input {name!r}: parts {vals} has {len(vals)} entries for shape {shape}")
    out = []
    for d, (v, n) in enumerate(zip(vals, shape, strict=True)):
        try:
            k = None if isinstance(v, bool) else operator.index(v)
        except TypeError:
            k = None
        if k is None or not 1 <= k <= n:
            raise PlanningError(f"input {name!r}: parts[{d}]={v!r} must be an int in 1..{n}")
        out.append(k)
    return tuple(out)


class EinGraph:
    """Builder and container. Vertices are created in a valid topological order (operands must exist)."""

    def __init__(self) -> None:
        self._vertices: list[Vertex] = []
        self._consumers: dict[Vertex, list[Vertex]] = {}
        #: names the caller gave: unique among themselves
        self._names: set[str] = set()
        #: names made up for unnamed vertices: not part of the caller's namespace
        self._auto_names: set[str] = set()

    def _fresh_name(self, vid: int) -> str:
        """``v{vid}``, or the first free of ``v{vid}_1``, ``v{vid}_2``, ..."""
        name, k = f"v{vid}", 0
        while name in self._names or name in self._auto_names:
            k += 1
            name = f"v{vid}_{k}"
        return name

    def _add(
        self,
        name: str | None,
        shape: tuple[int, ...],
        einsum: EinSum | None,
        inputs: tuple,
        layout: tuple[int, ...] | None = None,
    ) -> Vertex:
        # Caller-given names must be unique among caller-given names. A made-up name never takes a name in use
        # when it is made, and never stops the caller from using a name later: it is a label for display, not
        # a reservation (vertices are identified by their handles, never looked up by name).
        vid = len(self._vertices)
        auto = name is None
        if name is None:
            name = self._fresh_name(vid)
        elif name in self._names:
            raise PlanningError(f"vertex name {name!r} is already used")
        v = Vertex(vid, name, shape, einsum, inputs, layout)
        (self._auto_names if auto else self._names).add(name)
        self._vertices.append(v)
        self._consumers[v] = []
        for u in inputs:
            if not self._consumers[u] or self._consumers[u][-1] is not v:
                self._consumers[u].append(v)
        return v

    def _check(self, v: object) -> Vertex:
        if not isinstance(v, Vertex) or v.id >= len(self._vertices) or self._vertices[v.id] is not v:
            raise PlanningError(f"{v!r} is not a vertex of this graph")
        return v

    def input(self, name: str, shape: tuple[int, ...], parts: tuple[int, ...] | None = None) -> Vertex:
        """Declare an input tensor. Without ``parts`` it is pre-partitioned offline in whatever layout its
        consumers read (the paper: the planner charges it nothing); with ``parts`` (per dimension) it is
        stored split so, and a consumer reading it split otherwise is charged the repartition."""
        from .einsum import _shape

        shape = _shape(shape, f"input {name!r}")
        layout = None
        if parts is not None:
            layout = _layout(name, shape, parts)
        return self._add(name, shape, None, (), layout)

    def einsum(
        self,
        subscripts: str,
        *vertices: Vertex,
        join: str | None = None,
        agg: str = "sum",
        name: str | None = None,
    ) -> Vertex:
        """Add a unary/binary EinSum vertex. More than two operands are split into binary steps along
        opt_einsum's greedy contraction path (multiply/sum only); the last step's vertex is returned."""
        vs = tuple(self._check(v) for v in vertices)
        if len(vs) > 2:
            if join not in (None, "multiply") or agg != "sum":
                raise PlanningError("an n-ary einsum (more than 2 operands) must use join=multiply, agg=sum")
            return self._nary(subscripts, vs, name)
        e = EinSum.parse(subscripts, *(v.shape for v in vs), join=join, agg=agg)
        return self._add(name, e.output_shape, e, vs)

    def _nary(self, subscripts: str, vs: tuple[Vertex, ...], name: str | None) -> Vertex:
        spec = subscripts.replace(" ", "")
        try:
            _, info = opt_einsum.contract_path(spec, *(v.shape for v in vs), shapes=True, optimize="greedy")
        except ValueError as exc:
            raise PlanningError(f"{subscripts!r}: {exc}") from None
        ops = list(vs)
        out: Vertex | None = None
        for step, (positions, _, step_spec, _, _) in enumerate(info.contraction_list):
            operands = [ops[i] for i in positions]
            for i in sorted(positions, reverse=True):
                del ops[i]
            last = step == len(info.contraction_list) - 1
            out = self.einsum(step_spec, *operands, name=name if last else None)
            ops.append(out)
        assert out is not None
        return out

    # ---- views ---------------------------------------------------------------------------------------
    @property
    def vertices(self) -> tuple[Vertex, ...]:
        """All vertices in topological order (creation order)."""
        return tuple(self._vertices)

    def topological_order(self) -> tuple[Vertex, ...]:
        return tuple(self._vertices)

    def consumers(self, v: Vertex) -> tuple[Vertex, ...]:
        """Distinct vertices that read ``v`` (in creation order)."""
        return tuple(self._consumers[self._check(v)])

    @property
    def inputs(self) -> tuple[Vertex, ...]:
        return tuple(v for v in self._vertices if v.einsum is None)

    @property
    def outputs(self) -> tuple[Vertex, ...]:
        """Vertices nobody consumes (the graph's results)."""
        return tuple(v for v in self._vertices if not self._consumers[v])

    def __len__(self) -> int:
        return len(self._vertices)

    def __contains__(self, v: object) -> bool:
        return isinstance(v, Vertex) and v.id < len(self._vertices) and self._vertices[v.id] is v

    def __repr__(self) -> str:
        n_in = sum(1 for v in self._vertices if v.einsum is None)
        return f"EinGraph({len(self._vertices) - n_in} einsums, {n_in} inputs)"
