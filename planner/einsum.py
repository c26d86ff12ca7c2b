"""The EinSum model: one unary or binary (extended) einsum with its label bounds.

Kept independent of tensorsql so the planner can be tested and reasoned about on its own; tensorsql maps
``PlanningError`` onto its own error tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

from . import ops

__all__ = ["AGG_FUNCTIONS", "EinSum", "JOIN_FUNCTIONS", "PlanningError"]

#: Binary join functions (⊗) the extended EinSum knows (``planner.ops.JOINS``). The planner only carries them
#: through: its cost model does not depend on them, but a typo should fail at planning time, not deep in SQL
#: generation.
JOIN_FUNCTIONS = frozenset(ops.JOINS)
#: Aggregations (⊕, ``planner.ops.AGGS``): associative and commutative, so partial aggregates can be combined
#: in any order.
AGG_FUNCTIONS = frozenset(ops.AGGS)


class PlanningError(ValueError):
    """A malformed einsum, graph or planning request (own class: the planner imports nothing else)."""


def _shape(shape: object, what: str) -> tuple[int, ...]:
    try:
        dims = tuple(shape)  # type: ignore[arg-type]
    except TypeError:
        raise PlanningError(f"{what}: shape must be a sequence of ints, got {shape!r}") from None
    for n in dims:
        if isinstance(n, bool) or (not isinstance(n, int) and not hasattr(n, "__index__")):
            raise PlanningError(f"{what}: shape {dims!r} has a non-integer size {n!r}")
        if int(n) < 1:
            raise PlanningError(f"{what}: shape {dims!r} has a size < 1 ({n!r})")
    return tuple(int(n) for n in dims)


@dataclass(frozen=True)
class EinSum:
    """Z[output] <- agg over (input labels not in output) of join(X[inputs[0]], Y[inputs[1]]).

    Frozen and hashable (sizes are a tuple of pairs) so identical einsums, e.g. the same step in every
    transformer layer, share the planner's caches. ``bounds`` is exposed as a dict for convenience.
    For a unary einsum ``join`` names the mapped scalar function (identity, exp, relu, scale, ...).
    """

    inputs: tuple[tuple[str, ...], ...]
    output: tuple[str, ...]
    sizes: tuple[tuple[str, int], ...]
    join: str = "multiply"
    agg: str = "sum"

    def __post_init__(self) -> None:
        if len(self.inputs) not in (1, 2):
            raise PlanningError(f"an EinSum has 1 or 2 operands, got {len(self.inputs)}")
        known = dict(self.sizes)
        for k, labels in enumerate(self.inputs):
            for lab in labels:
                if lab not in known:
                    raise PlanningError(f"operand {k}: label {lab!r} has no size")
        in_labels = {lab for labels in self.inputs for lab in labels}
        for lab in self.output:
            if lab not in in_labels:
                raise PlanningError(f"output label {lab!r} does not appear in any operand")
        if len(set(self.output)) != len(self.output):
            raise PlanningError(f"output labels repeat: {''.join(self.output)!r}")
        if not isinstance(self.join, str) or not self.join:
            raise PlanningError(f"join must be a non-empty string, got {self.join!r}")
        if len(self.inputs) == 2 and self.join not in JOIN_FUNCTIONS:
            raise PlanningError(f"unknown join {self.join!r}; known: {sorted(JOIN_FUNCTIONS)}")
        if self.agg not in AGG_FUNCTIONS:
            raise PlanningError(f"unknown aggregation {self.agg!r}; known: {sorted(AGG_FUNCTIONS)}")

    @classmethod
    def parse(cls, subscripts: str, *shapes: object, join: str | None = None, agg: str = "sum") -> EinSum:
        """Build from numpy-style subscripts ('ij,jk->ik') and one shape per operand.

        ``join`` defaults to "multiply" for binary and "identity" for unary einsums. Implicit output (no
        '->') follows numpy: the labels that appear exactly once, sorted.
        """
        if not isinstance(subscripts, str):
            raise PlanningError(f"subscripts must be a string, got {subscripts!r}")
        spec = subscripts.replace(" ", "")
        if "." in spec:
            raise PlanningError(f"{subscripts!r}: ellipsis is not supported; name every label")
        lhs, arrow, rhs = spec.partition("->")
        terms = lhs.split(",")
        if len(terms) not in (1, 2):
            raise PlanningError(f"{subscripts!r}: an EinSum has 1 or 2 operands, got {len(terms)}")
        if len(shapes) != len(terms):
            raise PlanningError(
                f"{subscripts!r} names {len(terms)} operand(s) but {len(shapes)} shape(s) given"
            )
        for term in terms + ([rhs] if arrow else []):
            for ch in term:
                if not ch.isalpha():
                    raise PlanningError(f"{subscripts!r}: label {ch!r} is not a letter")
        sizes: dict[str, int] = {}
        for k, (term, shape) in enumerate(zip(terms, shapes, strict=False)):
            dims = _shape(shape, f"operand {k} of {subscripts!r}")
            if len(dims) != len(term):
                raise PlanningError(
                    f"operand {k} of {subscripts!r}: {len(term)} label(s) {term!r} "
                    f"but shape {dims} has rank {len(dims)}"
                )
            for lab, n in zip(term, dims, strict=False):
                if sizes.setdefault(lab, n) != n:
                    raise PlanningError(
                        f"label {lab!r} of {subscripts!r}: operand {k} gives size {n}, "
                        f"earlier size {sizes[lab]}"
                    )
        if arrow:
            output = tuple(rhs)
        else:
            counts: dict[str, int] = {}
            for term in terms:
                for lab in term:
                    counts[lab] = counts.get(lab, 0) + 1
            output = tuple(sorted(lab for lab, c in counts.items() if c == 1))
        if join is None:
            join = "multiply" if len(terms) == 2 else "identity"
        return cls(tuple(tuple(t) for t in terms), output, tuple(sizes.items()), join, agg)

    # ---- derived views -------------------------------------------------------------------------------
    @cached_property
    def bounds(self) -> dict[str, int]:
        """Label -> size (b[l] in the paper)."""
        return dict(self.sizes)

    @cached_property
    def labels(self) -> tuple[str, ...]:
        """Distinct labels in order of first appearance: the axis order of partitioning tuples."""
        return tuple(lab for lab, _ in self.sizes)

    @property
    def is_unary(self) -> bool:
        return len(self.inputs) == 1

    @cached_property
    def agg_labels(self) -> tuple[str, ...]:
        """Labels aggregated away (in an input, not in the output)."""
        out = set(self.output)
        return tuple(lab for lab in self.labels if lab not in out)

    @cached_property
    def input_shapes(self) -> tuple[tuple[int, ...], ...]:
        b = self.bounds
        return tuple(tuple(b[lab] for lab in labels) for labels in self.inputs)

    @cached_property
    def output_shape(self) -> tuple[int, ...]:
        b = self.bounds
        return tuple(b[lab] for lab in self.output)

    @property
    def subscripts(self) -> str:
        return ",".join("".join(t) for t in self.inputs) + "->" + "".join(self.output)

    def __repr__(self) -> str:
        shapes = ", ".join(str(s) for s in self.input_shapes)
        return f"EinSum({self.subscripts!r}, {shapes}, join={self.join!r}, agg={self.agg!r})"
