"""EinDecomp inside tensorsql: default planning, strategy/blocks overrides, explain, numpy operands."""

from __future__ import annotations

import numpy as np
import pytest
from tolerance import assert_einsum_close

import planner as P
import tensorsql as ts
from tensorsql.backends.duckdb import costs
from tensorsql.compile import planning

RNG = np.random.default_rng(3)




def test_session_p_follows_threads(s):
    assert s.p == 2
    with ts.connect(threads=3) as s3:
        assert s3.p == 3


@pytest.mark.parametrize("strategy", ["eindecomp", "sqrt", "data", "model", "none", "operands"])
def test_every_strategy_gives_numpy_results(s, strategy):
    a, b, c = RNG.standard_normal((300, 200)), RNG.standard_normal((200, 250)), RNG.standard_normal((250, 40))
    ra, rb = s.from_numpy(a, block_shape=(64, 64)), s.from_numpy(b, block_shape=(100, 50))
    rel = s.einsum("ij,jk,kl->il", ra, rb, c, strategy=strategy)
    assert_einsum_close(rel.numpy(), "ij,jk,kl->il", a, b, c)
    assert f"strategy={strategy}" in rel.explain() or "strategy=operands" in rel.explain()


def test_explain_shows_parts_costs_and_baselines(s):
    a, b = RNG.standard_normal((512, 300)), RNG.standard_normal((300, 400))
    rel = s.einsum("ij,jk->ik", a, b)
    text = rel.explain()
    assert "== Plan ==" in text and "baselines:" in text
    for base in ("sqrt=", "data=", "model="):
        assert base in text
    assert "parts[" in text and "cost[join=" in text
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)


def test_explicit_blocks_override(s):
    a, b = RNG.standard_normal((12, 10)), RNG.standard_normal((10, 8))
    rel = s.einsum("ij,jk->ik", a, b, blocks={"i": 3, "k": 2, "j": 5})
    assert rel.block_shape == (4, 4)
    assert "explicit blocks" in rel.explain()
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    with pytest.raises(ts.EinsumError, match="label 'z'"):
        s.einsum("ij,jk->ik", a, b, blocks={"z": 2})
    with pytest.raises(ts.ShapeError, match=r"blocks\['i'\]=99"):
        s.einsum("ij,jk->ik", a, b, blocks={"i": 99})
    with pytest.raises(ts.PlanError, match="unknown strategy 'fast'"):
        s.einsum("ij,jk->ik", a, b, strategy="fast")


def test_dropin_uploads_in_the_planned_blocking():
    a, b = RNG.standard_normal((400, 300)), RNG.standard_normal((300, 500))
    assert_einsum_close(ts.einsum("ij,jk->ik", a, b), "ij,jk->ik", a, b)
    x = RNG.standard_normal((64, 40, 30))
    assert_einsum_close(ts.einsum("bij,jk->bik", x, b[:30, :50]), "bij,jk->bik", x, b[:30, :50])


def test_planned_graph_matches_planner_partitions(s):
    """The block sizes tensorsql uses are the planner's parts, converted with ceil(size/parts)."""
    a, b = RNG.standard_normal((256, 256)), RNG.standard_normal((256, 256))
    ra, rb = s.from_numpy(a, blocks=(2, 1)), s.from_numpy(b, blocks=(1, 2))
    rel = s.einsum("ij,jk->ik", ra, rb, strategy="eindecomp")
    plan = rel.plan()
    parts = plan.info.node_parts[rel.node]
    assert np.prod(list(parts.values())) >= 1
    assert rel.block_shape == tuple(-(-256 // parts.get(ch, 1)) for ch in "ik")
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)


def test_stored_inputs_keep_their_blocking_when_cheaper(s):
    """Re-splitting stored inputs is charged: a layout the plan can use as is is not moved."""
    a, b = RNG.standard_normal((300, 300)), RNG.standard_normal((300, 300))
    ra, rb = s.from_numpy(a, block_shape=(150, 300)), s.from_numpy(b, block_shape=(300, 300))
    rel = s.einsum("ij,jk->ik", ra, rb)
    assert "operands" in rel.plan().info.baselines
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)


@pytest.mark.parametrize("strategy", ["eindecomp", "data", "sqrt"])
def test_a_label_split_as_a_stored_operand_reads_its_own_ragged_blocks(s, strategy):
    """10 rows stored in blocks of 6 are 2 parts; a step that splits them in 2 reads the stored blocks (6
    and 4), not ceil(10 / 2) = 5 (a re-split the planner had charged nothing for)."""
    a, b = RNG.standard_normal((10, 3000)), RNG.standard_normal((3000, 10))
    A, B = s.from_numpy(a, block_shape=(6, 3000)), s.from_numpy(b, block_shape=(3000, 10))
    rel = s.einsum("ij,jk->ik", A, B, strategy=strategy)
    assert rel.plan().info.node_parts[rel.node]["i"] == 2 and rel.block_shape == (6, 10)
    assert "Repartition" not in rel.explain()
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    ex = s.map(A, "exp")
    assert ex.block_shape == (6, 3000)
    np.testing.assert_allclose(ex.numpy(), np.exp(a), rtol=1e-15)


def test_cost_model_file_is_used(tmp_path, monkeypatch):
    path = tmp_path / "cm.json"
    monkeypatch.setenv("TENSORSQL_COST_MODEL", str(path))
    a, b = RNG.standard_normal((400, 400)), RNG.standard_normal((400, 400))
    P.CostModel(per_call=1e-9, per_byte=1e-15, per_flop=1.0).save(path)
    cm = planning.load_cost_model(workers=4)
    assert cm.per_flop == 1.0 and cm.workers == 4  # workers follow the session, not the file
    with ts.connect(threads=4) as s4:  # flops dominating: all four workers get a share
        rel = s4.einsum("ij,jk->ik", a, b)
        assert rel.plan().info.p == 4
        assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    # a model whose big calls split themselves over the threads: one block loses no parallelism
    P.CostModel(per_call=1e-9, per_byte=1e-15, per_flop=1.0, join_byte=1e-15, split_flops=1e6).save(path)
    with ts.connect(threads=4) as s4:
        rel = s4.einsum("ij,jk->ik", a, b)
        assert rel.plan().info.p == 1
        assert rel.plan().info.cost == pytest.approx(2 * 400**3 / 4, rel=1e-3)
    with ts.connect(threads=4) as s4:  # tiny inputs: one block each, splitting cannot pay off
        assert s4.einsum("ij,jk->ik", a[:8, :8], b[:8, :8]).plan().info.p == 1


def test_choose_p_prefers_fewer_blocks_when_calls_are_expensive():
    g = P.EinGraph()
    x, w = g.input("x", (512, 512)), g.input("w", (512, 512))
    g.einsum("ij,jk->ik", x, w)
    assert P.choose_p(g, 16, P.CostModel(per_call=10.0, per_byte=1e-12, per_flop=1e-15, workers=2)) <= 2
    assert P.choose_p(g, 16, P.CostModel(per_call=1e-12, per_byte=1e-15, per_flop=1.0, workers=16)) == 16


def test_big_calls_run_as_one_threaded_gemm(s, monkeypatch):
    """The engine's model lets a call of SPLIT_FLOPS per worker or more split itself (the kernels' threaded
    GEMM): a 1024^2 float32 matmul (2 GFLOP) is one block per operand, a 384^2 one keeps its row panels; a
    256^2 one (34 MFLOP) is one block again: splitting it saves less than a query step costs."""
    monkeypatch.delenv("TENSORSQL_COST_MODEL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-tensorsql-test")
    assert planning.load_cost_model(2, costs.PROFILE).split_flops == costs.SPLIT_FLOPS
    big = np.zeros((1024, 1024), dtype=np.float32)
    rel = s.einsum("ij,jk->ik", big, big)
    assert rel.plan().info.p == 1
    assert [rel.plan().block_shape(x) for x in rel.node.inputs] == [(1024, 1024), (1024, 1024)]
    small = s.einsum("ij,jk->ik", big[:384, :384], big[:384, :384])  # 113 MFLOP: split over the workers
    assert small.plan().info.p == 2
    assert [small.plan().block_shape(x) for x in small.node.inputs] == [(192, 384), (384, 384)]
    tiny = s.einsum("ij,jk->ik", big[:256, :256], big[:256, :256])
    assert tiny.plan().info.p == 1 and "must save a query step" in tiny.plan().info.notes[-1]
