"""planner: the EinDecomp optimum equals brute force (trees exactly; small DAGs when planned jointly)."""

from __future__ import annotations

import itertools
import math

from hypothesis import given, settings
from hypothesis import strategies as st

import planner
from planner import EinGraph
from planner.models import matrix_chain


def brute_force(g: EinGraph, p: int) -> float:
    """Minimum total cost over every assignment of viable partitionings, from the public cost functions."""
    verts = [v for v in g.vertices if v.einsum is not None]
    choices = [planner.viable(v.einsum, planner.effective_p(v.einsum, p)) for v in verts]
    pos = {v: i for i, v in enumerate(verts)}
    local = [
        [planner.join_cost(v.einsum, d) + planner.agg_cost(v.einsum, d) for d in ch]
        for v, ch in zip(verts, choices, strict=False)
    ]
    for i, v in enumerate(verts):  # inputs stored in a layout of their own: their reader pays the re-split
        for k, u in enumerate(v.inputs):
            if u.einsum is None and u.layout is not None:
                for x, d in enumerate(choices[i]):
                    want = tuple(d[lab] for lab in v.einsum.inputs[k])
                    local[i][x] += planner.repart_cost(u.shape, u.layout, want)
    edges = []
    for v in verts:
        for k, u in enumerate(v.inputs):
            if u.einsum is None:
                continue
            iu, iv = pos[u], pos[v]
            tab = [
                [
                    planner.repart_cost(
                        u.shape,
                        tuple(du[lab] for lab in u.einsum.output),
                        tuple(dv[lab] for lab in v.einsum.inputs[k]),
                    )
                    for dv in choices[iv]
                ]
                for du in choices[iu]
            ]
            edges.append((iu, iv, tab))
    best = math.inf
    for combo in itertools.product(*(range(len(ch)) for ch in choices)):
        c = sum(local[i][x] for i, x in enumerate(combo))
        c += sum(tab[combo[iu]][combo[iv]] for iu, iv, tab in edges)
        best = min(best, c)
    return best


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-9)


# ---- trees ---------------------------------------------------------------------------------------------
@st.composite
def matmul_trees(draw):
    """A random parenthesization of a chain of 2..4 matrices with sizes 1..9, maybe with a unary on top."""
    k = draw(st.integers(2, 4))
    dims = draw(st.lists(st.integers(1, 9), min_size=k + 1, max_size=k + 1))
    g = EinGraph()
    nodes = [g.input(f"M{i}", (dims[i], dims[i + 1])) for i in range(k)]
    while len(nodes) > 1:
        i = draw(st.integers(0, len(nodes) - 2))
        nodes[i : i + 2] = [g.einsum("ij,jk->ik", nodes[i], nodes[i + 1])]
    top = draw(st.sampled_from(["", "ij->ji", "ij->i", "ij->ij"]))
    if top:
        g.einsum(top, nodes[0], join="exp" if top == "ij->ij" else "identity")
    return g


@settings(max_examples=40, deadline=None)
@given(matmul_trees(), st.sampled_from([1, 2, 3, 4, 6, 8]))
def test_dp_equals_brute_force_on_trees(g, p):
    plan = planner.decompose(g, p)
    assert close(plan.cost, brute_force(g, p))


def test_dp_equals_brute_force_on_small_chains():
    for kind, s, p in [("square", 12, 4), ("skewed", 20, 4), ("skewed", 30, 8), ("square", 10, 6)]:
        g = matrix_chain(kind, s)
        assert close(planner.decompose(g, p).cost, brute_force(g, p)), (kind, s, p)


@st.composite
def stored_trees(draw):
    """``matmul_trees`` whose inputs are stored in random layouts (or left free to split)."""
    g = draw(matmul_trees())
    out = EinGraph()
    made = {}
    for v in g.vertices:
        if v.einsum is None:
            parts = draw(st.one_of(st.none(), st.tuples(*(st.integers(1, n) for n in v.shape))))
            made[v] = out.input(v.name, v.shape, parts)
        else:
            made[v] = out.einsum(v.einsum.subscripts, *(made[u] for u in v.inputs), join=v.einsum.join)
    return out


@settings(max_examples=40, deadline=None)
@given(stored_trees(), st.sampled_from([1, 2, 3, 4, 6]))
def test_dp_equals_brute_force_over_stored_layouts(g, p):
    assert close(planner.decompose(g, p).cost, brute_force(g, p))


def brute_force_seconds(g: EinGraph, p: int, cm: planner.CostModel) -> float:
    """The least ``planner.evaluate`` cost over every assignment of viable partitionings."""
    verts = [v for v in g.vertices if v.einsum is not None]
    choices = [planner.viable(v.einsum, planner.effective_p(v.einsum, p)) for v in verts]
    return min(
        planner.evaluate(g, dict(zip(verts, combo, strict=True)), cm).cost
        for combo in itertools.product(*choices)
    )


@settings(max_examples=25, deadline=None)
@given(
    stored_trees(),
    st.sampled_from([2, 4]),
    st.sampled_from([None, 2e-9]),
    st.sampled_from([0.0, 1e-5]),
    st.booleans(),
)
def test_dp_equals_brute_force_in_seconds_with_engine_terms(g, p, repart_byte, exchange, task_join):
    cm = planner.CostModel(
        workers=2, join_byte=1e-9, repart_byte=repart_byte, exchange=exchange, task_join=task_join
    )
    assert close(planner.decompose(g, p, cost_model=cm).cost, brute_force_seconds(g, p, cm))


# ---- DAGs ----------------------------------------------------------------------------------------------
def diamond_graph() -> tuple[EinGraph, object]:
    """U = A@B read by three consumers (V1 = U@C, V2 = exp U, V3 = U^T), which meet again in Z."""
    g = EinGraph()
    a, b, c = g.input("A", (6, 4)), g.input("B", (4, 6)), g.input("C", (6, 6))
    u = g.einsum("ij,jk->ik", a, b, name="U")
    v1 = g.einsum("ij,jk->ik", u, c, name="V1")
    v2 = g.einsum("ij->ij", u, join="exp", name="V2")
    v3 = g.einsum("ij->ji", u, name="V3")
    s = g.einsum("ij,ij->ij", v1, v2, join="add", name="S")
    g.einsum("ij,ji->ij", s, v3, name="Z")
    return g, u


def test_shared_vertex_planned_jointly_is_exact():
    g, u = diamond_graph()
    assert len(g.consumers(u)) == 3
    for p in (2, 4):
        best = brute_force(g, p)
        joint = planner.decompose(g, p)
        assert close(joint.cost, best)
        assert not any("linearized" in n for n in joint.notes)
        # linearization (paper's fallback) and the size-cap fallback: valid plans, never below the optimum
        lin = planner.decompose(g, p, joint_consumers=1)
        capped = planner.decompose(g, p, joint_cap=4)
        for plan in (lin, capped):
            assert plan.cost >= best * (1 - 1e-9)
            assert all(plan.calls(v) == p for v in plan.breakdown)
        assert any("linearized" in n for n in lin.notes)
        assert any("every shared vertex" in n for n in capped.notes)


@st.composite
def random_dags(draw):
    """3-5 EinSums over nxn tensors, each reading any earlier vertex (so vertices get several consumers)."""
    n = draw(st.integers(2, 6))
    g = EinGraph()
    pool = [g.input("A", (n, n)), g.input("B", (n, n))]
    for _ in range(draw(st.integers(3, 5))):
        op = draw(st.sampled_from(["ij,jk->ik", "ij,ij->ij", "ij,ji->ij", "ij->ji", "ij->ij"]))
        arity = 2 if "," in op else 1
        operands = [draw(st.sampled_from(pool)) for _ in range(arity)]
        join = ("add" if op == "ij,ij->ij" else "multiply") if arity == 2 else "exp"
        pool.append(g.einsum(op, *operands, join=join))
    return g


@settings(max_examples=30, deadline=None)
@given(random_dags(), st.sampled_from([2, 3, 4]))
def test_joint_planning_equals_brute_force_on_small_dags(g, p):
    plan = planner.decompose(g, p, joint_consumers=8)
    best = brute_force(g, p)
    assert close(plan.cost, best)
    lin = planner.decompose(g, p, joint_consumers=1)
    assert lin.cost >= best * (1 - 1e-9)
