"""The executor seam, picklable node-keyed plans, the plan cache, contract_expression, Session.compile, and
connect's options, locks and error mapping."""

from __future__ import annotations

import ast
import pathlib
import pickle
import subprocess
import sys

import numpy as np
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql.backends.base import Executor
from tensorsql.compile import plan as plan_mod
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T

RNG = np.random.default_rng(12)
EQUATIONS = [
    ("ij,jk->ik", [(7, 5), (5, 3)]),
    ("ij->ji", [(4, 6)]),
    ("bij,bjk->bik", [(3, 4, 5), (3, 5, 2)]),
    ("ij,jk,kl->il", [(4, 6), (6, 3), (3, 5)]),
    ("ii->i", [(5, 5)]),
    ("i,i->", [(9,), (9,)]),
]




def test_the_session_module_imports_no_engine():
    src = pathlib.Path(ts.session.__file__).read_text()
    names = {
        alias.name.split(".")[0]
        for node in ast.walk(ast.parse(src))
        if isinstance(node, ast.Import | ast.ImportFrom)
        for alias in (node.names if isinstance(node, ast.Import) else [ast.alias(node.module or "")])
    }
    assert "duckdb" not in names


def test_the_duckdb_executor_implements_the_protocol(s):
    import udf_kernels

    assert isinstance(s.executor, Executor)
    assert set(s.executor.kernel_set.functions()) == set(udf_kernels.SQL_FUNCTIONS)
    assert s.p == s.executor.workers >= 1


def test_plans_are_keyed_by_nodes_and_pickle(s):
    a, b = RNG.standard_normal((40, 30)), RNG.standard_normal((30, 20))
    rel = s.einsum("ij,jk->ik", a, b)
    plan = rel.plan()
    assert all(isinstance(k, E.Node) for k in plan.partitioning.block_shapes)
    assert all(isinstance(k, E.EinSum) for k in plan.partitioning.label_blocks)
    again = pickle.loads(pickle.dumps(plan))
    assert plan_mod.explain(again).splitlines()[0] == "== Plan =="
    assert again.block_shape() == plan.block_shape()
    assert [op.shape for op in again.operands] == [(40, 30), (30, 20)]
    # the unpickled plan runs on the same executor with new arrays bound to its operands
    x, y = RNG.standard_normal((40, 30)), RNG.standard_normal((30, 20))
    got = s.value(again, dict(zip(again.operands, [x, y], strict=True)))
    assert_einsum_close(got, "ij,jk->ik", x, y)


def test_explain_shows_the_physical_choices(s):
    a, b = RNG.standard_normal((8, 6)), RNG.standard_normal((6, 4))
    text = s.einsum("ij,jk->ik", a, b).explain()
    assert "method=side_by_side" in text and "Operand operand0" in text and "== SQL ==" in text


@pytest.mark.parametrize(("eq", "shapes"), EQUATIONS)
def test_repeated_calls_hit_the_plan_cache(eq, shapes):
    s = ts.default_session()
    ops = [RNG.standard_normal(shp) for shp in shapes]
    first = ts.einsum(eq, *ops)
    hits = s.plans.hits
    new = [RNG.standard_normal(shp) for shp in shapes]
    again = ts.einsum(eq, *new)
    assert s.plans.hits == hits + 1
    assert_einsum_close(first, eq, *ops)
    assert_einsum_close(again, eq, *new)


def test_the_cache_tells_dtypes_and_shapes_apart():
    a = RNG.standard_normal((6, 6))
    np.testing.assert_array_equal(ts.einsum("ij->ji", a.astype(np.float32)), a.astype(np.float32).T)
    np.testing.assert_array_equal(ts.einsum("ij->ji", a), a.T)
    np.testing.assert_array_equal(ts.einsum("ij->ji", a[:5]), a[:5].T)
    ints = np.arange(12, dtype=np.int64).reshape(3, 4)
    np.testing.assert_array_equal(ts.einsum("ij->ji", ints), ints.T)


@pytest.mark.parametrize(("eq", "shapes"), EQUATIONS)
def test_contract_expression_matches_the_reference(eq, shapes):
    expr = ts.contract_expression(eq, *shapes)
    for _ in range(3):
        ops = [RNG.standard_normal(shp) for shp in shapes]
        assert_einsum_close(expr(*ops), eq, *ops)
    ints = [RNG.integers(-5, 5, size=shp) for shp in shapes]
    np.testing.assert_array_equal(expr(*ints), np.einsum(eq, *ints))


def test_contract_expression_constants_out_and_errors():
    w = RNG.standard_normal((5, 3))
    expr = ts.contract_expression("ij,jk->ik", (4, 5), w, constants=[1])
    x = RNG.standard_normal((4, 5))
    out = np.empty((4, 3))
    assert expr(x, out=out) is out
    assert_einsum_close(out, "ij,jk->ik", x, w)
    with pytest.raises(ts.EinsumError, match="takes 1 arrays, got 2"):
        expr(x, x)
    with pytest.raises(ts.ShapeError, match=r"shape \(3, 5\), but the expression was built for \(4, 5\)"):
        expr(x[:3])
    with pytest.raises(ts.EinsumError, match="label 'j'"):
        ts.contract_expression("ij,jk->ik", (4, 5), (6, 3))
    with pytest.raises(ts.ShapeError, match="shape 1 = 'ab' is not a sequence of ints"):
        ts.contract_expression("ij,jk->ik", (4, 5), "ab")
    with pytest.raises(ts.ShapeError, match=r"shape 0 = \(4.5, 5\) is not a sequence of ints"):
        ts.contract_expression("ij,jk->ik", (4.5, 5), (5, 3))
    with pytest.raises(ts.ShapeError, match=r"shape 0 = \(3, -4\) has a negative size"):  # at build time
        ts.contract_expression("ij,jk->ik", (3, -4), (-4, 5))


def test_compile_runs_a_lazy_graph_on_new_inputs(s):
    x = s.placeholder((6, 4), "float64", name="x")
    w = s.placeholder((4, 3), "float64", name="w")
    h = s.map(s.einsum("ij,jk->ik", x, w), "relu")
    y = s.einsum("ik->i", h)
    step = s.compile([h, y], inputs=[x, w])
    for _ in range(3):
        xa, wa = RNG.standard_normal((6, 4)), RNG.standard_normal((4, 3))
        got_h, got_y = step(xa, wa)
        want_h = np.maximum(xa @ wa, 0)
        # relu is 1-Lipschitz, and the row sums add k such errors: the contractions' bounds hold
        assert_einsum_close(got_h, "ij,jk->ik", xa, wa, want=want_h)
        assert_einsum_close(got_y, "ij,jk->i", xa, wa, want=want_h.sum(axis=1))
    with pytest.raises(ts.EinsumError, match="expected 2 input arrays"):
        step(xa)
    with pytest.raises(ts.ShapeError, match="has shape"):
        step(xa[:2], wa)
    with pytest.raises(ts.DTypeError, match=r"input 0 \('x'\) has dtype complex128, expected float64"):
        step(xa.astype(complex), wa)
    with pytest.raises(ts.ShapeError, match="must be a placeholder"):
        s.compile(y, inputs=[h])


def test_connect_takes_the_documented_options(tmp_path):
    with ts.connect(strategy="operands") as s:
        assert s.strategy == "operands"
        a = RNG.standard_normal((5, 5))
        assert_einsum_close(s.einsum("ij,jk->ik", a, a).numpy(), "ij,jk->ik", a, a)
    with pytest.raises(ts.PlanError, match="unknown strategy"):
        ts.connect(strategy="fastest")
    db = tmp_path / "ro.duckdb"
    with ts.connect(str(db)) as s:
        s.from_numpy(np.arange(6.0).reshape(2, 3)).save("t")
    with ts.connect(str(db), read_only=True) as r:
        np.testing.assert_array_equal(r.table("t").numpy(), np.arange(6.0).reshape(2, 3))
        with pytest.raises(ts.SQLExecutionError):
            r.from_numpy(np.ones(3)).save("u")
    with pytest.raises(ts.ConfigError, match="read_only"):
        ts.connect(read_only=True)


def test_a_locked_database_says_so(tmp_path):
    db = tmp_path / "locked.duckdb"
    with ts.connect(str(db)) as s:
        s.from_numpy(np.ones(3)).save("t")
        code = (
            "import tensorsql as ts, sys\n"
            "try:\n    ts.connect(sys.argv[1])\n"
            "except ts.DatabaseLockedError as e:\n    print('LOCKED', isinstance(e, OSError))\n"
        )
        cmd = [sys.executable, "-c", code, str(db)]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        assert "LOCKED True" in out.stdout, out.stderr


def test_errors_are_mapped_by_type(s):
    con = s.executor.con
    import duckdb

    from tensorsql.backends.duckdb.errors import wrap

    try:
        con.execute("SELECT tensor_pack(1)").fetchall()
    except duckdb.Error as exc:  # a binder error that names a kernel is not a kernel's check
        assert isinstance(wrap(exc, "q"), ts.SQLExecutionError)
    try:
        con.execute("SELECT tensor_numel('abc'::BLOB, 'float64')").fetchall()
    except duckdb.Error as exc:
        assert isinstance(wrap(exc, "q"), ts.KernelError)
    assert isinstance(wrap(duckdb.InterruptException("x"), "q"), KeyboardInterrupt)


def test_a_closed_default_session_is_replaced():
    ts.default_session().close()
    a = RNG.standard_normal((3, 3))
    assert_einsum_close(ts.einsum("ij,jk->ik", a, a), "ij,jk->ik", a, a)


def test_generated_sql_takes_a_name_generator(s):
    from tensorsql.backends.duckdb import sqlgen

    a = s.from_numpy(RNG.standard_normal((8, 6)), block_shape=(4, 3))
    b = s.from_numpy(RNG.standard_normal((6, 10)), block_shape=(3, 5))
    rel = s.einsum("ij,jk->ik", a, b, strategy="operands")
    names = sqlgen.Names("t", reserved={"t0", "T1"})
    text = sqlgen.sql_text(sqlgen.to_ast(rel.plan().tra, names=names))
    assert '"t0"' not in text and '"t2"' in text
    assert isinstance(rel.plan().tra, T.Rel)


def test_temporary_tables_are_dropped_with_their_relation(s):
    import gc

    def temps() -> int:
        return s.executor.con.execute("SELECT COUNT(*) FROM duckdb_tables() WHERE temporary").fetchall()[0][0]

    before = temps()
    rels = [s.from_sql("SELECT 0, 1, 2.5", shape=(3, 3)) for _ in range(5)]
    rels += [s.einsum("ij->ji", r).materialize() for r in rels[:2]]
    assert temps() == before + 7
    del rels
    gc.collect()
    assert temps() == before


def test_a_relation_keeps_its_uploads_between_runs(s):
    import gc

    a, b = RNG.standard_normal((1500, 1400)), RNG.standard_normal((1400, 40))  # a: over 16 MiB, an Arrow view
    rel = s.einsum("ij,jk->ik", a, b)
    plan = rel.plan()
    first = rel.numpy()
    st = s.executor._statements[plan]
    names = [v for v in st.views if v is not None]
    assert names and all(x is not None for x in st.bound)
    for _ in range(2):
        np.testing.assert_array_equal(rel.numpy(), first)
    assert st.prepared is not None  # prepared from the second run: its views stayed registered
    assert_einsum_close(first, "ij,jk->ik", a, b)
    # the same plan on other arrays (what a cache hit does): registered anew, the prepared statement dropped
    x, y = RNG.standard_normal((1500, 1400)), RNG.standard_normal((1400, 40))
    assert_einsum_close(s.value(plan, dict(zip(plan.operands, [x, y], strict=True))), "ij,jk->ik", x, y)
    assert st.prepared is None
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)

    def registered() -> set[str]:
        rows = s.executor.con.execute("SELECT view_name FROM duckdb_views()").fetchall()
        return {r[0] for r in rows}

    del rel, plan, st
    gc.collect()
    assert not set(names) & registered()


def test_a_small_call_runs_one_prepared_statement_over_slots(s):
    """The small-call path: operands lent through slots, the result through the sink slot, one prepared
    statement with no parameter and no FROM."""
    a, b = RNG.standard_normal((8, 6)), RNG.standard_normal((6, 4))
    rel = s.einsum("ij,jk->ik", a, b)
    for _ in range(3):
        assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    st = s.executor._statements[rel.plan()]
    assert st.views == [None, None] and all(slot is not None for slot in st.slots)
    assert st.sink_slot is not None and st.prepared is not None
    text = s.executor.sink_text(rel.plan())
    assert "tensor_source(" in text and " FROM " not in text and "?" not in text


def test_a_prepared_small_call_takes_the_fast_path(s):
    expr = ts.contract_expression("ij,jk->ik", (5, 4), (4, 3), session=s)
    for _ in range(3):  # prepared from the second run on
        a, b = RNG.standard_normal((5, 4)), RNG.standard_normal((4, 3))
        assert_einsum_close(expr(a, b), "ij,jk->ik", a, b)
    (entry, *_) = next(iter(expr._entries.values()))
    fast = s.executor.fast(entry.plan)
    assert fast is not None
    a, b = RNG.standard_normal((5, 4)), RNG.standard_normal((4, 3))
    assert_einsum_close(fast(dict(zip(entry.plan.operands, [a, b], strict=True))), "ij,jk->ik", a, b)
    st = s.executor._statements[entry.plan]
    assert all(slot.array is None for slot in st.slots) and st.sink_slot.array is None  # released
    with pytest.raises(ts.DTypeError, match="'operand0' needs an array of dtype float64, got float32"):
        fast(dict(zip(entry.plan.operands, [a.astype(np.float32), b], strict=True)))
    with pytest.raises(ts.ShapeError, match=r"needs an array of shape \(5, 4\), got \(4, 4\)"):
        fast(dict(zip(entry.plan.operands, [a[:4], b], strict=True)))
    assert_einsum_close(expr(a.T.copy().T, b), "ij,jk->ik", a, b)  # non-contiguous input works too


def test_a_one_row_statement_runs_on_the_single_threaded_lane():
    """One-block calls run on the lane (a 1-thread DuckDB: no hand-off to a worker thread); statements with
    a FROM (several blocks, stored tables) stay on the session's DuckDB."""
    s = ts.connect(threads=2)
    try:
        a, b = RNG.standard_normal((8, 6)), RNG.standard_normal((6, 4))
        small = s.einsum("ij,jk->ik", a, b)
        for _ in range(3):
            assert_einsum_close(small.numpy(), "ij,jk->ik", a, b)
        st = s.executor._statements[small.plan()]
        assert st.lane and st.prepared is not None
        lane = s.executor._lane_con()
        assert lane is not None and lane.execute("SELECT current_setting('threads')").fetchall() == [(1,)]
        prepared = {r[0] for r in lane.execute("SELECT name FROM duckdb_prepared_statements()").fetchall()}
        assert st.prepared in prepared
        s.save(small, "t_lane")
        stored = s.einsum("ij,jk->ik", s.table("t_lane"), b[:4, :3])
        for _ in range(3):
            assert_einsum_close(stored.numpy(), "ij,jk->ik", a @ b, b[:4, :3])
        assert not s.executor._statements[stored.plan()].lane
        blocked = s.from_numpy(a, block_shape=(2, 3))  # several blocks: a FROM
        big = s.einsum("ij,jk->ik", blocked, b)
        for _ in range(3):
            assert_einsum_close(big.numpy(), "ij,jk->ik", a, b)
        assert not s.executor._statements[big.plan()].lane
    finally:
        s.close()
    with pytest.raises(Exception, match="closed"):  # the lane went with the session
        lane.execute("SELECT 1")


def test_without_a_lane_small_calls_run_on_the_session(monkeypatch, caplog):
    import udf_kernels

    s = ts.connect()
    try:
        monkeypatch.setattr(udf_kernels, "load", lambda con: (_ for _ in ()).throw(OSError("no extension")))
        expr = ts.contract_expression("ij,jk->ik", (5, 4), (4, 3), session=s)
        a, b = RNG.standard_normal((5, 4)), RNG.standard_normal((4, 3))
        for _ in range(3):
            assert_einsum_close(expr(a, b), "ij,jk->ik", a, b)
        (entry, *_) = next(iter(expr._entries.values()))
        st = s.executor._statements[entry.plan]
        assert not st.lane and st.prepared is not None and s.executor._lane is False
    finally:
        s.close()
    assert [r.getMessage() for r in caplog.records] == [
        "tensorsql: no single-threaded lane for small calls: no extension"
    ]
    caplog.clear()  # the one warning expected here


def test_statements_go_with_their_plans(s):
    """An executor's per-plan state (slots, prepared statements) is freed with the plan, also once the plan
    went through the small-call path."""
    import gc

    before = len(s.executor._statements)
    for n in range(2, 6):
        a = RNG.standard_normal((n, n))
        expr = ts.contract_expression("ij,jk->ik", a.shape, a.shape, session=s)
        for _ in range(3):
            assert_einsum_close(expr(a, a), "ij,jk->ik", a, a)
        del expr
    gc.collect()
    assert len(s.executor._statements) == before


def test_the_session_strategy_is_checked_when_set():
    s = ts.connect()
    try:
        with pytest.raises(ts.PlanError, match="unknown strategy 'bogus'"):
            s.strategy = "bogus"
        assert s.strategy == "eindecomp"
        s.strategy = "sqrt"
        a, b = RNG.standard_normal((40, 30)), RNG.standard_normal((30, 20))
        assert_einsum_close(s.einsum("ij,jk->ik", a, b).numpy(), "ij,jk->ik", a, b)
    finally:
        s.close()
