"""Reverse-mode differentiation of the expression graph: ``grad(loss, wrt)``.

Each backward rule is itself built from the graph's own steps (EinSums, maps, slices), so a gradient is a
lazy relation like any other: planned by EinDecomp and run as SQL, over the same forward nodes the loss
uses (the forward intermediates a rule reads are those nodes, not copies).

The rules, for a node ``Z`` whose adjoint is ``G`` (the gradient of the loss with respect to ``Z``):

- EinSum ``Z[lz] = agg over the other labels of f(X[lx], Y[ly])``: the adjoint of the joined tensor ``J``
  (every label, before aggregation) is ``G`` for sum, ``G`` where ``J`` equals ``Z`` for max and min (the
  arg-max mask; ``k`` tied elements each get ``G / k``, as torch's ``amax``), and ``G * Z / J`` for prod.
  Then ``dX`` sums ``dJ * df/dx`` over the labels ``X`` lacks (numpy's einsum rule for multiply/sum: keep
  the other operand, swap in the output).
  A label ``X`` repeats (a diagonal) gets its gradient on the diagonal only, through an identity matrix; a
  size-1 dimension ``X`` broadcast gets the sum over it.
- Maps: the derivative of each map (``exp``: ``G * Z``, ``relu``: ``G`` where ``X > 0``, ...); casts pass
  ``G`` back in the input's dtype; a slice scatters ``G`` into its input's shape through 0/1 selection
  matrices (one per sliced dimension).
- Comparisons (masks) have zero gradient; integer tensors get none.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from tensorsql import operators
from tensorsql.errors import GradError
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_REAL = ("float32", "float64")
_COMPLEX = ("complex64", "complex128")
_COMPARISONS = ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")

Terms = list[tuple[object, tuple[int, ...]]]

#: nodes the result does not depend on although the graph reads them: the max a softmax subtracts before
#: ``exp`` (softmax and log-softmax are the same for any shift, so the gradient through it is exactly 0;
#: computed, it was ~0 plus rounding, at the cost of a mask and two passes over the scores)
_SHIFTS: weakref.WeakSet[E.Node] = weakref.WeakSet()


def shift(rel: TensorRelation) -> TensorRelation:
    """Marks ``rel`` as a shift its consumers' results do not depend on: no gradient flows into it."""
    _SHIFTS.add(rel.node)
    return rel


@dataclass(frozen=True)
class _Bcast:
    """An adjoint that is constant along some dimensions of its node (the gradient of a sum over them, say):
    ``rel`` holds it over the node's dimensions ``dims`` (in order). Rules that read it as a term of an
    einsum broadcast it for free ('abc,ab->abc'); a full tensor is made only where one is needed (a map's
    rule, a result), where a ones vector broadcast it in every case before (a softmax's backward pass wrote
    its (heads, seq, seq) row sums out in full and then subtracted them)."""

    rel: TensorRelation
    dims: tuple[int, ...]



def grad(loss: TensorRelation, wrt: Sequence[TensorRelation]) -> list[TensorRelation]:
    """The gradients of the scalar ``loss`` with respect to each relation of ``wrt`` (in that order), as
    lazy relations of the shapes of ``wrt``. ``wrt`` are relations the loss was built from (stored
    relations, array operands, or intermediate results of its graph)."""
    from tensorsql.relation import TensorRelation

    if not isinstance(loss, TensorRelation):
        raise GradError(f"grad: the loss must be a relation, got {type(loss).__name__}")
    if loss.ndim != 0:
        raise GradError(f"grad: the loss must be a scalar (0-d) relation, got shape {loss.shape}")
    if loss.node.dtype not in _REAL:
        raise GradError(f"grad: the loss must be float32 or float64, got {loss.node.dtype}")
    if isinstance(wrt, TensorRelation) or not isinstance(wrt, Sequence):
        raise GradError("grad: wrt must be a list of relations")
    order = E.topological(loss.node)
    in_graph = set(order)
    targets: list[E.Node] = []
    for i, w in enumerate(wrt):
        if not isinstance(w, TensorRelation):
            raise GradError(f"grad: wrt[{i}] must be a relation, got {type(w).__name__}")
        if w.session is not loss.session:
            raise GradError(f"grad: wrt[{i}] belongs to another session than the loss")
        if w.node not in in_graph:
            raise GradError(
                f"grad: wrt[{i}] (shape {w.shape}) is not in the loss's graph: the loss was not computed "
                "from it (a relation opened again with table() is another node; pass the one the loss used)"
            )
        if w.node.dtype not in _REAL:
            raise GradError(f"grad: wrt[{i}] is {w.node.dtype}; gradients are taken for float32/float64")
        targets.append(w.node)
    back = _Backward(loss)
    adjoints = back.run(order, set(targets))
    return [adjoints[t] if t in adjoints else back.zeros(t) for t in targets]


class _Backward:
    def __init__(self, loss: TensorRelation) -> None:
        self.s: Session = loss.session
        self.bindings = dict(loss.bindings)
        self.root = loss.node
        self.fresh = itertools.count(-1, -1)  # labels of our own: negative, never an einsum's

    def rel(self, node: E.Node) -> TensorRelation:
        from tensorsql.relation import TensorRelation

        return TensorRelation(self.s, node, self.bindings)

    def zeros(self, node: E.Node) -> TensorRelation:
        labels = tuple(range(len(node.shape)))
        return self.s.einsum(_spec([labels], labels), np.zeros(node.shape, dtype=node.dtype))

    def run(self, order: list[E.Node], targets: set[E.Node]) -> dict[E.Node, TensorRelation]:
        # only the nodes a target flows into need an adjoint
        needed: set[E.Node] = set()
        for node in order:
            if node in targets or (
                node not in _SHIFTS
                and node.dtype in (*_REAL, *_COMPLEX)  # an integer is piecewise constant: no gradient flows
                and any(c in needed for c in E.children(node))
            ):
                needed.add(node)
                if node.dtype in _COMPLEX:  # its rules would drop it: a zero gradient, silently
                    raise GradError(
                        f"grad: the loss depends on wrt through a {node.dtype} intermediate (shape "
                        f"{node.shape}); gradients through complex values are not supported"
                    )
        adj: dict[E.Node, TensorRelation | _Bcast] = {
            self.root: self.s.einsum("->", np.ones((), dtype=self.root.dtype))
        }
        for node in reversed(order):
            g = adj.get(node)
            if g is None or not E.children(node):
                continue
            for child, part in self.backward(node, g):
                if child not in needed or child.dtype not in _REAL:
                    continue
                adj[child] = self.add(child, adj[child], part) if child in adj else part
        return {t: self.full(t, adj[t]) for t in targets if t in adj}

    def full(self, node: E.Node, g: TensorRelation | _Bcast) -> TensorRelation:
        """The adjoint as a tensor of the node's shape (a broadcast one times a ones tensor)."""
        if not isinstance(g, _Bcast):
            return g
        labels = tuple(range(len(node.shape)))
        rest = tuple(d for d in labels if d not in g.dims)
        ones = np.ones(tuple(node.shape[d] for d in rest), dtype=node.dtype)
        got = self.call([(g.rel, g.dims), (ones, rest)], labels)
        return got if got.node.dtype == node.dtype else got.astype(node.dtype)

    def add(
        self, node: E.Node, a: TensorRelation | _Bcast, b: TensorRelation | _Bcast
    ) -> TensorRelation | _Bcast:
        """Two parts of an adjoint summed; broadcast parts are added with broadcasting ('abc,ab->abc')."""
        if not isinstance(a, _Bcast) and not isinstance(b, _Bcast):
            return a + b
        everything = tuple(range(len(node.shape)))
        la = a.dims if isinstance(a, _Bcast) else everything
        lb = b.dims if isinstance(b, _Bcast) else everything
        dims = tuple(d for d in everything if d in la or d in lb)
        ra = a.rel if isinstance(a, _Bcast) else a
        rb = b.rel if isinstance(b, _Bcast) else b
        got = self.call([(ra, la), (rb, lb)], dims, join="add")
        return got if dims == everything else _Bcast(got, dims)

    # -- rules -------------------------------------------------------------------------------------------
    def backward(
        self, node: E.Node, g: TensorRelation | _Bcast
    ) -> list[tuple[E.Node, TensorRelation | _Bcast]]:
        if isinstance(node, E.Source | E.Operand):
            return []
        if isinstance(node, E.EinSum):
            return self.einsum(node, g)
        g = self.full(node, g)
        if isinstance(node, E.Map):
            return [(node.input, self.map(node, g))]
        if isinstance(node, E.Cast):
            return [(node.input, g.astype(node.input.dtype))] if node.input.dtype in _REAL else []
        if isinstance(node, E.Reblock):
            return [(node.input, g)]
        if isinstance(node, E.Slice):
            return [(node.input, self.slice(node, g))]
        raise TypeError(f"unhandled expression node {type(node).__name__}")

    def einsum(
        self, node: E.EinSum, g: TensorRelation | _Bcast
    ) -> list[tuple[E.Node, TensorRelation | _Bcast]]:
        if node.join in _COMPARISONS and len(node.inputs) == 2:
            return []  # a mask: zero almost everywhere
        sizes: dict[int, int] = {}
        for child, labels in zip(node.inputs, node.in_labels, strict=True):
            for lab, n in zip(labels, child.shape, strict=True):
                sizes[lab] = max(sizes.get(lab, 1), n)
        space = tuple(dict.fromkeys(lab for labels in node.in_labels for lab in labels))
        operands = list(zip((self.rel(c) for c in node.inputs), node.in_labels, strict=True))

        def joined(join: str) -> TensorRelation:
            return self.call(operands, space, join=join)

        # the adjoint of the joined tensor J (before aggregation), as a product of terms
        if isinstance(g, _Bcast):
            dj: Terms = [(g.rel, tuple(node.out_labels[d] for d in g.dims))]
        else:
            dj = [(g, node.out_labels)]
        if node.agg in ("max", "min"):
            joint = joined(node.join) if len(operands) == 2 else self.call(operands, space)
            mask = self.call([(joint, space), (self.rel(node), node.out_labels)], space, join="equal")
            # tied elements share G evenly (torch's amax): each getting all of it counted G once per tie, as
            # in max_j max(a, b_j) where a exceeds every b_j (da = 1, not the number of j)
            ties = self.call([(mask, space)], node.out_labels)
            dj += [(mask, space), (self.s.map(ties, "reciprocal"), node.out_labels)]
        elif node.agg == "prod":
            joint = joined(node.join) if len(operands) == 2 else self.call(operands, space)
            dj.append((self._others(joint, space, node.out_labels), space))
        out: list[tuple[E.Node, TensorRelation | _Bcast]] = []
        if len(operands) == 1:
            (x, lx), = operands  # fmt: skip
            out.append((node.inputs[0], self.contract(node.inputs[0], lx, dj, space, sizes)))
            return out
        (x, lx), (y, ly) = operands
        j = node.join
        partials: list[tuple[Terms, float]]  # per input: the terms of df/d(input), and a factor
        if j == "multiply":
            partials = [([(y, ly)], 1.0), ([(x, lx)], 1.0)]
        elif j in ("add", "subtract"):
            partials = [([], 1.0), ([], 1.0 if j == "add" else -1.0)]
        elif j == "divide":
            inv = self.s.map(y, "reciprocal")
            partials = [([(inv, ly)], 1.0), ([(x, lx), (self.s.map(inv, "square"), ly)], -1.0)]
        elif j == "sqdiff":
            diff = joined("subtract")
            partials = [([(diff, space)], 2.0), ([(diff, space)], -2.0)]
        elif j == "absdiff":
            sign = joined("greater") - joined("less")
            partials = [([(sign, space)], 1.0), ([(sign, space)], -1.0)]
        elif j == "max":  # ties go to the first operand
            partials = [([(joined("greater_equal"), space)], 1.0), ([(joined("less"), space)], 1.0)]
        elif j == "min":
            partials = [([(joined("less_equal"), space)], 1.0), ([(joined("greater"), space)], 1.0)]
        else:
            raise GradError(f"grad: no derivative for join {j!r}")
        for child, labels, (terms, factor) in zip(node.inputs, (lx, ly), partials, strict=True):
            if child.dtype not in _REAL:
                continue
            part = self.contract(child, labels, dj + terms, space, sizes)
            if factor != 1.0:
                part = _Bcast(part.rel * factor, part.dims) if isinstance(part, _Bcast) else part * factor
            out.append((child, part))
        return out

    def map(self, node: E.Map, g: TensorRelation) -> TensorRelation:
        x, z = self.rel(node.input), self.rel(node)
        fn, p = node.fn, node.param
        if fn == "exp":
            return g * z
        if fn == "log":
            return g * self.s.map(x, "reciprocal")
        if fn == "sqrt":
            return g * self.s.map(z, "reciprocal") * 0.5
        if fn == "relu":
            return g * (x > 0)
        if fn == "neg":
            return -g
        if fn == "abs":
            return g * ((x > 0) - (x < 0))
        if fn == "pow":
            if float(p) == 0.0:  # x ** 0 is 1 everywhere: no gradient (0 * x ** -1 would be NaN at 0)
                return g * 0.0
            return g * operators.power(x, float(p) - 1.0) * float(p)  # type: ignore[arg-type]
        if fn == "scale":
            return g * float(p)  # type: ignore[arg-type]
        if fn == "square":
            return g * x * 2.0
        if fn == "reciprocal":
            return -(g * self.s.map(z, "square"))
        if fn == "sigmoid":
            return g * z * (1.0 - z)
        if fn == "tanh":
            return g * (1.0 - self.s.map(z, "square"))
        if fn == "softplus":
            return g * self.s.map(x, "sigmoid")
        if fn == "rpow":  # d/dx b ** x = b ** x * ln b; torch's 0 for a zero base (0 * -inf would be NaN)
            b = float(p)  # type: ignore[arg-type]
            return g * 0.0 if b == 0.0 else g * z * (math.log(b) if b > 0 else math.nan)
        raise GradError(f"grad: no derivative for map {fn!r}")

    def slice(self, node: E.Slice, g: TensorRelation) -> TensorRelation:
        """``G`` scattered back: the input's element ``i`` along a sliced dimension gets ``G[t]`` where
        ``i = start + step * t`` (a 0/1 matrix per dimension; a dropped dimension is a one-hot vector)."""
        dtype = node.dtype
        out = tuple(next(self.fresh) for _ in node.input.shape)
        glabels: list[int] = []
        terms: Terms = []
        for d, n in enumerate(node.input.shape):
            start, count, step = node.start[d], node.count[d], node.step[d]
            picks = start + step * np.arange(count)
            if node.keep[d]:
                t = next(self.fresh)
                glabels.append(t)
                sel = np.zeros((count, n), dtype=dtype)
                sel[np.arange(count), picks] = 1
                terms.append((sel, (t, out[d])))
            else:
                onehot = np.zeros(n, dtype=dtype)
                onehot[picks[0]] = 1
                terms.append((onehot, (out[d],)))
        return self.call([(g, tuple(glabels)), *terms], out)

    # -- einsum over integer labels ------------------------------------------------------------------
    def _others(self, joint: TensorRelation, space: tuple[int, ...], out: tuple[int, ...]) -> TensorRelation:
        """d prod / d J_k = the product of the group's other elements, over ``space``, without dividing by
        J_k (Z / J_k is 0/0 at a zero): with P the product of the group's nonzero elements, it is P / J_k
        in a group with no zero, P at the zero of a group with one, and 0 elsewhere."""
        zero = joint.equal(0.0)  # 1 where an element is 0
        safe = joint + zero  # the elements, a 1 for each 0
        nonzero = self.s.einsum(_spec([space], out), safe, agg="prod", strategy=None)
        zeros = self.call([(zero, space)], out)  # per group
        no_zero = self.call([(zeros.equal(0.0), out), (nonzero, out)], out)
        one_zero = self.call([(zeros.equal(1.0), out), (nonzero, out)], out)
        inv = self.s.map(safe, "reciprocal")
        first = self.call([(no_zero, out), (inv, space)], space)
        return first + self.call([(one_zero, out), (zero, space)], space)

    def call(self, terms: Terms, out: tuple[int, ...], join: str = "multiply") -> TensorRelation:
        spec = _spec([labels for _, labels in terms], out)
        return self.s.einsum(spec, *[t for t, _ in terms], join=join, strategy=None)

    def contract(
        self,
        child: E.Node,
        labels: tuple[int, ...],
        terms: Terms,
        space: tuple[int, ...],
        sizes: dict[int, int],
    ) -> TensorRelation | _Bcast:
        """The sum over every label of ``space`` that ``labels`` lacks of the product of ``terms``, in the
        shape of ``child`` (read with ``labels``). A label of ``space`` no term has counts its size (a ones
        vector) where it is summed, and is broadcast (``_Bcast``) where it is one of the child's; a label
        ``labels`` repeats gets the sum on its diagonal (an identity matrix); a size-1 dimension of ``child``
        that broadcast against a larger size gets the sum over it."""
        dtype = child.dtype
        terms = list(terms)
        have = {lab for _, ls in terms for lab in ls}
        missing = tuple(lab for lab in space if lab not in have)
        plain = len(set(labels)) == len(labels) and all(
            not (n == 1 and sizes[lab] > 1) for lab, n in zip(labels, child.shape, strict=True)
        )
        if plain and any(lab in labels for lab in missing):
            summed = tuple(lab for lab in missing if lab not in labels)
            if summed:
                terms.append((np.ones(tuple(sizes[lab] for lab in summed), dtype=dtype), summed))
            dims = tuple(d for d, lab in enumerate(labels) if lab not in missing)
            got = self.call(terms, tuple(labels[d] for d in dims))
            got = got if got.node.dtype == dtype else got.astype(dtype)
            return _Bcast(got, dims)
        if missing:
            terms.append((np.ones(tuple(sizes[lab] for lab in missing), dtype=dtype), missing))
        out: list[int] = []
        seen: set[int] = set()
        for lab, n in zip(labels, child.shape, strict=True):
            if lab in seen:  # a diagonal: the gradient lives on it
                mine = next(self.fresh)
                terms.append((np.eye(n, dtype=dtype), (lab, mine)))
                out.append(mine)
            elif n == 1 and sizes[lab] > 1:  # broadcast: summed over, kept as size 1
                mine = next(self.fresh)
                terms.append((np.ones(1, dtype=dtype), (mine,)))
                out.append(mine)
            else:
                out.append(lab)
            seen.add(lab)
        got = self.call(terms, tuple(out))
        return got if got.node.dtype == dtype else got.astype(dtype)


def _spec(inputs: Sequence[tuple[int, ...]], out: tuple[int, ...]) -> str:
    """An einsum string for integer labels (our own negative ones included)."""
    letters: dict[int, str] = {}
    for lab in itertools.chain(*inputs, out):
        if lab not in letters:
            if len(letters) == len(_LETTERS):
                raise GradError("grad: a backward step would need more than 52 labels")
            letters[lab] = _LETTERS[len(letters)]
    return ",".join("".join(letters[lab] for lab in t) for t in inputs) + "->" + "".join(
        letters[lab] for lab in out
    )


__all__ = ["grad", "shift"]
