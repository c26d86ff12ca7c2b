"""The one strategy registry (planner.strategies), shared by the planner and tensorsql."""

from __future__ import annotations

import pytest

import planner
from planner import EinGraph, PlanningError


def _chain() -> EinGraph:
    g = EinGraph()
    a, b = g.input("A", (64, 32)), g.input("B", (32, 48))
    g.einsum("ij,jk->ik", a, b)
    return g


def test_registry_names_and_descriptions():
    assert tuple(planner.STRATEGIES) == ("eindecomp", "sqrt", "data", "model", "none", "operands")
    assert planner.PLANNER_STRATEGIES == ("eindecomp", "sqrt", "data", "model", "none")
    assert planner.OPERANDS == "operands"
    for s in planner.STRATEGY_TABLE:
        desc = planner.STRATEGIES[s.name]
        assert desc == s.description and desc and "\n" not in desc
        assert planner.is_planner_strategy(s.name) == s.planner
    assert not planner.is_planner_strategy("magic") and not planner.is_planner_strategy(None)
    with pytest.raises(TypeError):
        planner.STRATEGIES["x"] = "read-only"  # type: ignore[index]


def test_tensorsql_accepts_exactly_the_registry():
    # through tensorsql's public API (its modules are being moved): every registered name runs, others fail
    import numpy as np

    import tensorsql as ts

    a, b = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    s = ts.connect(threads=1)
    try:
        for name in planner.STRATEGIES:
            np.testing.assert_allclose(s.einsum("ij,jk->ik", a, b, strategy=name).numpy(), a @ b)
        with pytest.raises(ts.PlanError, match="unknown strategy 'magic'"):
            s.einsum("ij,jk->ik", a, b, strategy="magic")
    finally:
        s.close()


@pytest.mark.parametrize("strategy", planner.PLANNER_STRATEGIES)
def test_every_planner_strategy_decomposes(strategy):
    plan = planner.decompose(_chain(), 4, strategy)
    assert plan.strategy == strategy


def test_operands_is_rejected_with_its_meaning():
    with pytest.raises(PlanningError, match="tensorsql's keep-the-operands'-blocking strategy"):
        planner.decompose(_chain(), 4, planner.OPERANDS)
    with pytest.raises(PlanningError, match="not a planner strategy"):
        planner.choose_p(_chain(), 4, strategy="operands")


def test_unknown_strategy_lists_the_planner_strategies():
    with pytest.raises(PlanningError, match="unknown strategy 'magic'; choose one of eindecomp, sqrt"):
        planner.decompose(_chain(), 4, "magic")
    with pytest.raises(PlanningError, match="unknown strategy"):
        planner.decompose(_chain(), 4, 3)  # type: ignore[arg-type]


def test_evaluate_labels_a_given_blocking_operands():
    g = _chain()
    (z,) = g.outputs
    plan = planner.evaluate(g, {z: {"i": 2, "j": 1, "k": 2}}, strategy=planner.OPERANDS)
    assert plan.strategy == "operands" and plan.calls(z) == 4
