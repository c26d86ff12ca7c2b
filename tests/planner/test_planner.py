"""planner: the worked examples of docs "EinDecomp", enumeration, costs, strategies, graphs."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math

import numpy as np
import pytest

import planner
from planner import CostModel, EinGraph, EinSum, PlanningError
from planner.models import llama_graph, matrix_chain


def mm(n: int = 8) -> EinSum:
    return EinSum.parse("ij,jk->ik", (n, n), (n, n))


# ---- worked examples (exact) ---------------------------------------------------------------------------
def test_viable_8x8_matmul_p8_has_ten_vectors():
    vs = planner.viable(mm(), 8)
    tuples = {(d["i"], d["j"], d["k"]) for d in vs}
    assert len(vs) == 10 == len(tuples)
    assert (2, 4, 1) in tuples and (1, 4, 2) in tuples
    paper = {(2, 1, 4), (4, 1, 2), (8, 1, 1), (1, 1, 8), (2, 2, 2), (4, 2, 1), (1, 2, 4), (1, 8, 1)}
    assert paper < tuples
    assert all(planner.kernel_calls(mm(), d) == 8 for d in vs)


@pytest.mark.parametrize("n,D", [(0, 3), (1, 1), (3, 2), (4, 3), (5, 4), (10, 6)])
def test_viable_count_is_balls_in_buckets(n, D):
    labels = "abcdefgh"[:D]
    half = labels[: (D + 1) // 2]
    other = labels[(D + 1) // 2 :]
    big = 2**n
    if other:
        e = EinSum.parse(f"{half},{other}->{labels}", (big,) * len(half), (big,) * len(other))
    else:
        e = EinSum.parse(f"{half}->{half}", (big,) * len(half))
    assert len(planner.viable(e, 2**n)) == math.comb(n + D - 1, D - 1)


def test_viable_n10_d6_is_3003():
    e = EinSum.parse("abc,def->abcdef", (1024,) * 3, (1024,) * 3)
    assert len(planner.viable(e, 1024)) == 3003


def test_join_and_agg_cost_examples():
    e = mm()
    assert planner.join_cost(e, {"i": 4, "j": 1, "k": 4}) == 512
    assert planner.join_cost(e, (4, 1, 4)) == 512
    assert planner.agg_cost(e, (4, 1, 4)) == 0
    assert planner.agg_cost(e, {"i": 2, "j": 2, "k": 4}) == 64
    assert planner.kernel_calls(e, (4, 1, 4)) == 16


@pytest.mark.parametrize(
    "d_from,d_to,cost",
    [((2, 4), (4, 1), 320), ((4, 4), (2, 2), 240), ((2, 2), (4, 4), 256), ((2, 4), (2, 4), 0)],
)
def test_repart_cost_examples(d_from, d_to, cost):
    assert planner.repart_cost((8, 8), d_from, d_to) == cost


def test_unary_costs():
    e = EinSum.parse("ij->ij", (8, 8), join="exp")
    assert e.join == "exp" and e.is_unary
    assert planner.kernel_calls(e, (2, 4)) == 8
    assert planner.join_cost(e, (2, 4)) == 8 * 8  # N * nX
    assert planner.agg_cost(e, (2, 4)) == 0
    red = EinSum.parse("ij->i", (8, 8), agg="max")
    assert red.join == "identity" and red.agg_labels == ("j",)
    assert planner.agg_cost(red, (2, 4)) == (8 / 4) * 3 * 4  # (N/nagg)(nagg-1)nZ


# ---- beyond powers of two, ragged ------------------------------------------------------------------------
@pytest.mark.parametrize("p", [3, 6, 12])
def test_viable_non_power_of_two(p):
    e = EinSum.parse("ij,jk->ik", (12, 12), (12, 12))
    vs = {(d["i"], d["j"], d["k"]) for d in planner.viable(e, p)}
    brute = {t for t in itertools.product(range(1, p + 1), repeat=3) if math.prod(t) == p}
    assert vs == brute


def test_viable_respects_bounds():
    e = EinSum.parse("ij,jk->ik", (3, 2), (2, 12))
    vs = planner.viable(e, 6)
    assert vs and all(d["i"] <= 3 and d["j"] <= 2 and d["k"] <= 12 for d in vs)
    assert {(d["i"], d["j"], d["k"]) for d in vs} == {(1, 1, 6), (1, 2, 3), (2, 1, 3), (3, 1, 2), (3, 2, 1)}
    assert planner.viable(EinSum.parse("ij,jk->ik", (2, 2), (2, 2)), 16) == []


def test_ragged_costs_use_ceiling_tiles():
    e = EinSum.parse("ij,jk->ik", (10, 10), (10, 10))
    # d = (3,1,3): tile extents ceil(10/3) = 4 -> N=9, nX = nY = 4*10
    assert planner.join_cost(e, (3, 1, 3)) == 9 * 80
    assert planner.agg_cost(e, (3, 2, 1)) == 3 * 1 * (4 * 10)
    assert planner.repart_cost((10,), (3,), (3,)) == 0
    # 5-element producer tiles -> 4-element consumer tiles: one extraction of each of 3 consumer tiles
    assert planner.repart_cost((10,), (2,), (3,)) == 5 * 3
    # divisible sizes give the paper's numbers through the same code
    assert planner.repart_cost((8, 8), (2, 4), (4, 1)) == 320


def test_ragged_plan_is_valid():
    g = EinGraph()
    a, b = g.input("A", (10, 7)), g.input("B", (7, 9))
    z = g.einsum("ij,jk->ik", a, b)
    plan = planner.decompose(g, 6)
    assert plan.calls(z) == 6
    assert all(1 <= x <= n for x, n in zip(plan.layouts[z], (10, 9), strict=False))


# ---- parsing and validation ------------------------------------------------------------------------------
def test_parse_fields_and_implicit_output():
    e = EinSum.parse("ij,jk->ik", (2, 3), (3, 4))
    assert e.inputs == (("i", "j"), ("j", "k")) and e.output == ("i", "k")
    assert e.bounds == {"i": 2, "j": 3, "k": 4} and e.join == "multiply" and e.agg == "sum"
    assert EinSum.parse("ij,jk", (2, 3), (3, 4)).output == ("i", "k")
    assert EinSum.parse("ba", (2, 3)).output == ("a", "b")
    assert EinSum.parse("ii", (3, 3)).output == ()
    assert hash(e) == hash(EinSum.parse("ij,jk->ik", (2, 3), (3, 4)))


@pytest.mark.parametrize(
    "args,kw,match",
    [
        (("ij,jk->ik", (2, 3), (4, 5)), {}, "label 'j'"),
        (("ij,jk->ik", (2, 3)), {}, "2 operand"),
        (("ij,jk->ik", (2, 3, 1), (3, 4)), {}, "operand 0"),
        (("ij,jk,kl->il", (2, 2), (2, 2), (2, 2)), {}, "1 or 2"),
        (("ij,jk->iq", (2, 3), (3, 4)), {}, "'q'"),
        (("ij,jk->ik", (2, 3), (3, 4)), {"join": "frobnicate"}, "join"),
        (("ij,jk->ik", (2, 3), (3, 4)), {"agg": "mean"}, "aggregation"),
        (("ij,jk->ik", (2, 0), (0, 4)), {}, "size"),
        (("i...->i", (2, 3)), {}, "ellipsis"),
    ],
)
def test_parse_errors(args, kw, match):
    with pytest.raises(PlanningError, match=match):
        EinSum.parse(*args, **kw)
    assert issubclass(PlanningError, ValueError)


def test_cost_argument_errors():
    with pytest.raises(PlanningError):
        planner.join_cost(mm(), (9, 1, 1))
    with pytest.raises(PlanningError):
        planner.join_cost(mm(), {"q": 2})
    with pytest.raises(PlanningError):
        planner.repart_cost((8, 8), (2,), (2, 2))
    with pytest.raises(PlanningError):
        planner.viable(mm(), 0)
    with pytest.raises(PlanningError):
        planner.decompose(EinGraph(), 4, strategy="magic")


def test_extended_join_and_agg_names_carry_through():
    for j in sorted(planner.JOIN_FUNCTIONS):
        for a in sorted(planner.AGG_FUNCTIONS):
            e = EinSum.parse("ij,jk->ik", (4, 4), (4, 4), join=j, agg=a)
            assert (e.join, e.agg) == (j, a)
            assert planner.join_cost(e, (2, 1, 2)) == planner.join_cost(mm(4), (2, 1, 2))


# ---- graph ---------------------------------------------------------------------------------------------
def test_graph_handles_order_and_consumers():
    g = EinGraph()
    a = g.input("A", (4, 5))
    b = g.input("B", (5, 6))
    ab = g.einsum("ij,jk->ik", a, b, name="AB")
    sq = g.einsum("ik,ik->ik", ab, ab, name="SQ")  # same operand twice: one consumer
    t = g.einsum("ik->ki", ab, name="T")
    assert ab.shape == (4, 6) and t.shape == (6, 4)
    assert g.vertices == (a, b, ab, sq, t) == g.topological_order()
    assert g.consumers(ab) == (sq, t) and g.consumers(a) == (ab,)
    assert g.outputs == (sq, t) and g.inputs == (a, b)
    assert len({a, b, ab}) == 3 and ab.name == "AB" and isinstance(ab.id, int)
    with pytest.raises(PlanningError):
        g.einsum("ij,jk->ik", a, a)
    with pytest.raises(PlanningError):
        g.input("A", (1,))
    with pytest.raises(PlanningError):
        EinGraph().einsum("ij->ji", a)


def test_made_up_names_never_collide_with_given_names():
    # regression: unnamed vertices were named v{id} in the caller's namespace, so an input named "v8" given
    # after vertex 8 failed with "vertex name 'v8' is already used"
    g = EinGraph()
    x = g.input("x", (4, 4))
    y = x
    for _ in range(8):
        y = g.einsum("ij,jk->ik", y, x)
    assert [v.name for v in g.vertices[1:]] == [f"v{i}" for i in range(1, 9)]
    v8 = g.input("v8", (4, 4))  # the name an unnamed vertex was given: still the caller's to use
    z = g.einsum("ij,jk->ik", y, v8, name="v1")
    assert v8.name == "v8" and z.name == "v1" and g.outputs == (z,)
    # and the other way: a made-up name skips the names in use
    g2 = EinGraph()
    a, b = g2.input("v2", (3, 3)), g2.input("v2_1", (3, 3))
    c = g2.einsum("ij,jk->ik", a, b)
    d = g2.einsum("ij,jk->ik", c, a)
    assert (c.name, d.name) == ("v2_2", "v3")
    assert len({v.name for v in g2.vertices}) == 4
    # caller-given names stay unique among themselves
    with pytest.raises(PlanningError, match="'v2' is already used"):
        g2.input("v2", (3, 3))
    with pytest.raises(PlanningError, match="'v8' is already used"):
        g.einsum("ij->ji", x, name="v8")
    # n-ary steps: the intermediate steps are unnamed, only the last takes the given name
    g3 = EinGraph()
    p, q, r = g3.input("v3", (2, 3)), g3.input("v4", (3, 4)), g3.input("v5", (4, 5))
    out = g3.einsum("ij,jk,kl->il", p, q, r, name="v6")
    assert out.name == "v6" and len({v.name for v in g3.vertices}) == len(g3)
    assert planner.decompose(g3, 2).cost >= 0


def test_nary_einsum_is_split_into_binary_steps():
    g = EinGraph()
    a, b, c = g.input("A", (10, 20)), g.input("B", (20, 30)), g.input("C", (30, 5))
    z = g.einsum("ij,jk,kl->il", a, b, c, name="Z")
    assert z.shape == (10, 5) and z.name == "Z"
    assert sum(1 for v in g.vertices if v.einsum is not None) == 2
    assert all(len(v.inputs) == 2 for v in g.vertices if v.einsum is not None)


# ---- strategies ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["square", "skewed"])
@pytest.mark.parametrize("p", [4, 12, 16])
def test_all_strategies_valid_and_eindecomp_best(kind, p):
    g = matrix_chain(kind, 1000)
    costs = {}
    for strategy in planner.PLANNER_STRATEGIES:
        plan = planner.decompose(g, p, strategy)
        for v in g.vertices:
            if v.einsum is not None:
                want = 1 if strategy == "none" else p
                assert plan.calls(v) == want
                assert planner.kernel_calls(v.einsum, plan.partitions[v]) == want
        assert plan.cost == pytest.approx(sum(b["total"] for b in plan.breakdown.values()))
        assert set(plan.breakdown[g.vertices[-1]]) >= {"join", "agg", "repart", "total"}
        again = planner.evaluate(g, {v: plan.partitions[v] for v in plan.breakdown})
        assert again.cost == pytest.approx(plan.cost)
        costs[strategy] = plan.cost
    for strategy in ("sqrt", "data", "model"):
        assert costs["eindecomp"] <= costs[strategy] * (1 + 1e-12)


def test_skewed_chain_eindecomp_at_most_half_of_sqrt():
    g = matrix_chain("skewed", 1000)
    assert planner.decompose(g, 16).cost <= 0.5 * planner.decompose(g, 16, "sqrt").cost


def test_baseline_shapes():
    g = EinGraph()
    x, w = g.input("X", (64, 32)), g.input("W", (32, 48))
    y = g.einsum("bi,io->bo", x, w)
    assert planner.decompose(g, 16, "data").partitions[y] == {"b": 16, "i": 1, "o": 1}
    assert planner.decompose(g, 16, "model").partitions[y] == {"b": 1, "i": 1, "o": 16}
    assert planner.decompose(g, 16, "sqrt").partitions[y] == {"b": 4, "i": 1, "o": 4}
    assert planner.decompose(g, 8, "sqrt").partitions[y] == {"b": 4, "i": 1, "o": 2}
    assert planner.decompose(g, 16, "none").partitions[y] == {"b": 1, "i": 1, "o": 1}
    # batch too small for p: the remainder spills to the next output label, still N(d) = p
    g2 = EinGraph()
    x2, w2 = g2.input("X", (4, 32)), g2.input("W", (32, 48))
    y2 = g2.einsum("bi,io->bo", x2, w2)
    assert planner.decompose(g2, 16, "data").partitions[y2] == {"b": 4, "i": 1, "o": 4}


def test_too_small_for_p_takes_fewer_calls():
    g = EinGraph()
    a, b = g.input("A", (3, 3)), g.input("B", (3, 1))
    z = g.einsum("ij,jk->ik", a, b)
    assert planner.effective_p(z.einsum, 16) == 4
    for strategy in planner.PLANNER_STRATEGIES:
        plan = planner.decompose(g, 16, strategy)
        assert plan.calls(z) == (1 if strategy == "none" else 4)
    assert "too small" in " ".join(planner.decompose(g, 16).notes)


def test_inputs_get_their_consumers_partitioning():
    g = matrix_chain("skewed", 100)
    plan = planner.decompose(g, 8)
    for v in g.inputs:
        (c,) = g.consumers(v)
        k = c.inputs.index(v)
        assert plan.layouts[v] == plan.operand_layouts[(c, k)]
        assert plan.partitions[v] == dict(zip(c.einsum.inputs[k], plan.layouts[v], strict=False))


def test_plan_reports_repartitions():
    g = matrix_chain("skewed", 1000)
    plan = planner.decompose(g, 16, "data")
    for u, v, k, src, dst in plan.repartitions:
        assert src == plan.layouts[u] and dst == plan.operand_layouts[(v, k)] and src != dst
    moved = sum(planner.repart_cost(u.shape, s, d) for u, _, _, s, d in plan.repartitions)
    assert moved == pytest.approx(sum(b["repart"] for b in plan.breakdown.values()))


# ---- inputs stored in a layout of their own --------------------------------------------------------------
@pytest.mark.parametrize(
    ("shape", "parts", "match"),
    [
        ((8, 8), (2,), "has 1 entries for shape"),
        ((8, 8), (0, 1), r"parts\[0\]=0 must be an int in 1..8"),
        ((8, 4), (1, 5), r"parts\[1\]=5 must be an int in 1..4"),
        ((8, 8), (True, 1), r"parts\[0\]=True"),
        ((8, 8), (2.0, 1), r"parts\[0\]=2.0"),
        ((8, 8), 2, "must be a sequence of ints"),
        ((8, 8), {2: 1, 1: 1}, "must be a sequence of ints"),  # a mapping or a set: no order to trust
        ((8, 8), {2, 1}, "must be a sequence of ints"),
        ((8, 8), "21", "must be a sequence of ints"),
        ((8, 8), (np.array([2]), 1), r"parts\[0\]=array\(\[2\]\)"),
    ],
)
def test_stored_input_layout_errors(shape, parts, match):
    with pytest.raises(PlanningError, match=match):
        EinGraph().input("A", shape, parts)


def test_a_stored_inputs_re_split_is_charged_to_its_reader():
    """A stored (4, 1) and read as (1, 4) by a model-parallel matmul: the plan's repart term is the
    paper's cost of that re-split, the input keeps its own layout, and the edge is a repartition."""
    g = EinGraph()
    a, b = g.input("A", (8, 8), parts=(4, 1)), g.input("B", (8, 8))
    z = g.einsum("ij,jk->ik", a, b)
    plan = planner.evaluate(g, {z: {"i": 1, "j": 4, "k": 1}})
    assert plan.layouts[a] == (4, 1) and plan.operand_layouts[(z, 0)] == (1, 4)
    assert plan.breakdown[z]["repart"] == planner.repart_cost((8, 8), (4, 1), (1, 4))
    assert [(u, src, dst) for u, _, _, src, dst in plan.repartitions] == [(a, (4, 1), (1, 4))]
    # read as stored: nothing to re-split, and EinDecomp finds a plan that reads it so
    same = planner.evaluate(g, {z: {"i": 4, "j": 1, "k": 1}})
    assert same.breakdown[z]["repart"] == 0 and not same.repartitions
    best = planner.decompose(g, 4)
    assert best.operand_layouts[(z, 0)] == (4, 1) and best.cost == pytest.approx(same.cost)
    # a free input (no layout) costs nothing in any split, as in the paper
    free = EinGraph()
    fa, fb = free.input("A", (8, 8)), free.input("B", (8, 8))
    fz = free.einsum("ij,jk->ik", fa, fb)
    assert planner.evaluate(free, {fz: {"i": 1, "j": 4, "k": 1}}).breakdown[fz]["repart"] == 0


def test_engine_re_split_terms():
    """``repart_byte``: a re-split costs the tensor's bytes once (spread over the reader's calls), not the
    paper's count; ``exchange``: each re-split between EinSums, and each aggregation whose partials come
    from different calls, costs that much more (a cluster's stage boundary); a stored input's re-split
    happens inside the tasks that read it and pays none."""
    g = EinGraph()
    a, b = g.input("A", (8, 8), parts=(4, 1)), g.input("B", (8, 8))
    u = g.einsum("ij,jk->ik", a, b)
    z = g.einsum("ij,jk->ik", u, b)
    cm = CostModel(per_call=0.0, per_byte=1.0, per_flop=0.0, itemsize=4, workers=2, join_byte=0.0)
    fine = dataclasses.replace(cm, repart_byte=0.5, exchange=7.0)
    parts = {u: {"i": 1, "j": 4, "k": 1}, z: {"i": 4, "j": 1, "k": 1}}
    paper = planner.evaluate(g, parts, cm)
    engine = planner.evaluate(g, parts, fine)
    # A (4,1) -> (1,4): paper elements at per_byte, over min(4 calls, 2 workers)
    assert paper.breakdown[u]["repart"] == pytest.approx(planner.repart_cost((8, 8), (4, 1), (1, 4)) * 4 / 2)
    assert engine.breakdown[u]["repart"] == pytest.approx(64 * 4 * 0.5 / 2)
    # u is made as (1, 1) blocks and read as (4, 1): a re-split between EinSums, plus the exchange
    assert engine.breakdown[z]["repart"] == pytest.approx(64 * 4 * 0.5 / 2 + 7.0)
    # u sums j over 4 calls: partial blocks from different calls, one exchange more
    assert engine.breakdown[u]["agg"] == pytest.approx(paper.breakdown[u]["agg"] + 7.0)
    with pytest.raises(PlanningError, match="repart_byte"):
        CostModel(repart_byte=-1.0)
    with pytest.raises(PlanningError, match="exchange"):
        CostModel(exchange=math.inf)


def test_task_join_counts_the_blocks_each_merged_task_reads():
    """``task_join``: 8 calls of an 8 x 8 matmul on 2 workers merge into 2 tasks (the summed j first, then
    k), each reading its rows of A and all of B once: 2 x (4 x 8 + 8 x 8) elements, not 8 x (16 + 16); its
    sum stays inside each task, so no exchange. Split over 2 calls by j, the partials come from 2 tasks and
    one more stage combines them."""
    g = EinGraph()
    a, b = g.input("A", (8, 8)), g.input("B", (8, 8))
    z = g.einsum("ij,jk->ik", a, b)
    cm = CostModel(per_call=0, per_byte=1, per_flop=0, itemsize=1, workers=2, join_byte=1, serial_join=True)
    merged = dataclasses.replace(cm, task_join=True, exchange=100.0)
    eight = {z: {"i": 2, "j": 2, "k": 2}}
    assert planner.evaluate(g, eight, cm).breakdown[z]["join"] == pytest.approx(8 * (16 + 16))
    tasks = planner.evaluate(g, eight, merged).breakdown[z]
    assert tasks["join"] == pytest.approx(2 * (4 * 8 + 8 * 8))
    assert tasks["agg"] == planner.evaluate(g, eight, cm).breakdown[z]["agg"]  # no exchange
    by_j = planner.evaluate(g, {z: {"i": 1, "j": 2, "k": 1}}, merged).breakdown[z]
    assert by_j["agg"] == pytest.approx(planner.evaluate(g, {z: (1, 2, 1)}, cm).breakdown[z]["agg"] + 100.0)
    with pytest.raises(PlanningError, match="task_join"):
        CostModel(task_join=1)


# ---- cost model and choose_p ----------------------------------------------------------------------------
def test_cost_model_round_trip(tmp_path):
    cm = CostModel(per_call=2e-3, per_byte=3e-9, per_flop=1e-11, itemsize=8, workers=4)
    path = tmp_path / "cm.json"
    cm.save(path)
    assert CostModel.load(path) == cm
    assert json.loads(path.read_text())["per_call"] == 2e-3
    (tmp_path / "partial.json").write_text('{"per_call": 1.0}')
    assert CostModel.load(tmp_path / "partial.json") == CostModel(per_call=1.0)
    (tmp_path / "bad.json").write_text('{"per_cal": 1.0}')
    with pytest.raises(PlanningError):
        CostModel.load(tmp_path / "bad.json")
    with pytest.raises(PlanningError):
        CostModel(per_call=-1)


def test_cost_model_seconds_formula():
    g = EinGraph()
    a, b = g.input("A", (8, 8)), g.input("B", (8, 8))
    z = g.einsum("ij,jk->ik", a, b)
    cm = CostModel(per_call=1.0, per_byte=0.5, per_flop=0.25, itemsize=2, workers=1)
    plan = planner.evaluate(g, {z: (4, 1, 4)}, cm)
    calls, elements, flops = 16, 512 + 0, 2 * 8 * 8 * 8
    assert plan.cost == pytest.approx(1.0 * calls + 0.5 * 2 * elements + 0.25 * flops)
    assert plan.breakdown[z]["join"] == pytest.approx(0.5 * 2 * 512)


def test_choose_p_prefers_few_blocks_when_calls_are_expensive():
    g = matrix_chain("square", 400)
    assert planner.choose_p(g, 16, CostModel(per_call=10.0)) == 1
    fast = CostModel(per_call=1e-9, per_byte=1e-15, per_flop=1e-9, workers=16)
    assert planner.choose_p(g, 16, fast) == 16
    # 4 workers: more than 4 blocks only adds per-call overhead
    assert planner.choose_p(g, 16, CostModel(per_call=0.05, per_byte=1e-12, per_flop=1e-9, workers=4)) == 4
    plan = planner.decompose(g, 8, cost_model=fast)
    assert plan.cost_model == fast and plan.cost > 0


def test_choose_p_candidates():
    from planner.decompose import _candidates

    assert _candidates(16) == [1, 2, 4, 6, 8, 10, 12, 14, 16]
    assert _candidates(12) == [1, 2, 3, 4, 6, 8, 9, 10, 12]
    assert _candidates(1) == [1]


# ---- the LLaMA-shaped graph -----------------------------------------------------------------------------
def test_llama_graph_plans_fast():
    import time

    g = llama_graph()
    n_einsum = sum(1 for v in g.vertices if v.einsum is not None)
    assert n_einsum == 32 * 19 and len(g) > 600
    t0 = time.perf_counter()
    plan = planner.decompose(g, 16)
    elapsed = time.perf_counter() - t0
    assert elapsed < 2.0, elapsed
    assert all(plan.calls(v) == 16 for v in plan.breakdown)
    for strategy in ("sqrt", "data", "model"):
        assert plan.cost <= planner.decompose(g, 16, strategy).cost


def test_llama_small_and_relu_variant():
    g = llama_graph(layers=2, seq=64, model=64, heads=4, ffn=96, gated=False)
    plan = planner.decompose(g, 8)
    assert all(plan.calls(v) == 8 for v in plan.breakdown)
    with pytest.raises(PlanningError):
        llama_graph(layers=1, model=100, heads=3)
