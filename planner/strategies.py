"""The one registry of blocking strategies, shared by the planner and tensorsql.

Every strategy a user can name (``s.einsum(..., strategy=...)``, ``tensorsql.connect(strategy=...)``,
``planner.decompose(g, p, strategy)``) is listed here once, with a one-line description.

Two kinds:

- **planner strategies** (``PLANNER_STRATEGIES``): ``planner.decompose`` computes a partitioning for them;
- **"operands"** (``OPERANDS``): tensorsql's keep-the-operands'-blocking strategy. Every tensor keeps the
  blocking its operands already have, so there is nothing to search, and every step's blocking follows
  from tensorsql's own propagation of its operands' (the planner knows a stored input's layout, when it is
  given one, only to charge its re-splits). ``planner.decompose`` rejects it with a ``PlanningError`` that
  says so; to cost a given blocking use ``planner.evaluate``, which is what tensorsql does with the
  operands' blocking.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType

__all__ = [
    "OPERANDS",
    "PLANNER_STRATEGIES",
    "STRATEGIES",
    "STRATEGY_TABLE",
    "Strategy",
    "is_planner_strategy",
]


@dataclass(frozen=True)
class Strategy:
    """One blocking strategy: its name, a one-line description, and whether ``planner.decompose`` runs it."""

    name: str
    description: str
    planner: bool = True


#: Every strategy, in the order they are listed to users (errors, docs).
STRATEGY_TABLE: tuple[Strategy, ...] = (
    Strategy("eindecomp", "EinDecomp: the dynamic program minimizing the modelled cost of the whole graph"),
    Strategy("sqrt", "baseline: the first two output labels split about sqrt(p) ways each"),
    Strategy("data", "baseline: data parallel, the first output label split p ways"),
    Strategy("model", "baseline: model parallel, the last output label split p ways"),
    Strategy("none", "one block per tensor (p is ignored)"),
    Strategy(
        "operands",
        "keep the operands' own blocking (tensorsql; not a planner strategy: planner.decompose rejects it)",
        planner=False,
    ),
)

#: name -> one-line description, for every strategy (planner strategies and "operands"). Read-only.
STRATEGIES: Mapping[str, str] = MappingProxyType({s.name: s.description for s in STRATEGY_TABLE})

#: The strategies ``planner.decompose`` computes, in table order.
PLANNER_STRATEGIES: tuple[str, ...] = tuple(s.name for s in STRATEGY_TABLE if s.planner)

#: tensorsql's keep-the-operands'-blocking strategy.
OPERANDS = "operands"


def is_planner_strategy(name: object) -> bool:
    """Whether ``planner.decompose`` computes a partitioning for strategy ``name``."""
    return isinstance(name, str) and name in PLANNER_STRATEGIES
