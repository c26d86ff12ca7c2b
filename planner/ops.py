"""The operator names the planner knows, and what they cost it.

The planner only carries operators through: its cost model charges every join, aggregation and map the same
(one flop per join, one per aggregation step, one per mapped element; an element moved per operand element),
so the choice of operator never changes a plan. The names are checked so that a typo fails at planning time,
not deep in SQL generation.

These are the names of tensorsql's operator table (``tensorsql/ir/ops.py``, which carries each operator's
dtype rules, identities and docs; the planner imports nothing from tensorsql).
``tests/kernels/test_ops_table.py`` checks that the two, and the C++ kernels, agree.
"""

from __future__ import annotations

__all__ = [
    "AGGS",
    "AGG_FLOPS",
    "JOINS",
    "JOIN_FLOPS",
    "MAPS",
    "MAP_FLOPS",
    "UNARY_JOINS",
]

#: Binary join functions (⊗) of the extended EinSum.
JOINS: tuple[str, ...] = (
    "multiply", "add", "subtract", "divide", "sqdiff", "absdiff", "max", "min",
    "greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
)  # fmt: skip
#: Aggregations (⊕): associative and commutative, so partial aggregates combine in any order.
AGGS: tuple[str, ...] = ("sum", "max", "min", "prod")
#: Element-wise maps (a unary EinSum whose ``join`` names the map).
MAPS: tuple[str, ...] = (
    "exp",
    "log",
    "sqrt",
    "relu",
    "neg",
    "abs",
    "pow",
    "scale",
    "square",
    "reciprocal",
    "sigmoid",
    "tanh",
    "softplus",
    "rpow",
)
#: Other ``join`` names of a unary EinSum tensorsql builds: a transpose/diagonal/reduction, a dtype cast.
#: (A unary EinSum's ``join`` is not checked: the planner models any element-wise function.)
UNARY_JOINS: tuple[str, ...] = ("identity", "cast")

#: Flops the cost model charges per iteration of a binary einsum's loop nest (join, then aggregation step)
#: and per element of a unary one: the same for every operator.
JOIN_FLOPS = 1.0
AGG_FLOPS = 1.0
MAP_FLOPS = 1.0
