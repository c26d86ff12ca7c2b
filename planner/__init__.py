"""planner: pure EinDecomp planning — EinSum/EinGraph model, partition enumeration, cost model, decomposition.

Imports nothing from tensorsql or DuckDB; tensorsql builds an EinGraph, calls ``decompose`` and turns the
chosen partitionings into TRA plans.
"""

from __future__ import annotations

from . import ops
from .costs import (
    CostModel,
    agg_cost,
    effective_p,
    join_cost,
    kernel_calls,
    repart_cost,
    split_to_fit,
    viable,
)
from .decompose import Plan, best_of, choose_p, decompose, evaluate, plans_by_p
from .einsum import AGG_FUNCTIONS, JOIN_FUNCTIONS, EinSum, PlanningError
from .graph import EinGraph, Vertex
from .strategies import (
    OPERANDS,
    PLANNER_STRATEGIES,
    STRATEGIES,
    STRATEGY_TABLE,
    Strategy,
    is_planner_strategy,
)

__all__ = [
    "AGG_FUNCTIONS",
    "JOIN_FUNCTIONS",
    "OPERANDS",
    "PLANNER_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_TABLE",
    "CostModel",
    "EinGraph",
    "EinSum",
    "Plan",
    "PlanningError",
    "Strategy",
    "Vertex",
    "agg_cost",
    "best_of",
    "choose_p",
    "decompose",
    "effective_p",
    "evaluate",
    "ops",
    "is_planner_strategy",
    "join_cost",
    "kernel_calls",
    "plans_by_p",
    "repart_cost",
    "split_to_fit",
    "viable",
]
