"""Plans bigger than the memory limit run in waves (docs "Memory and limits"): stored inputs that together
pass ``memory_limit`` are joined in pieces instead of failing, and every result path (the sink, Arrow, save,
materialize) gives numpy's answer. A small forced wave budget runs the shared equation lists in waves too."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from equations import BLOCKING_CASES, EQUATIONS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_einsum_hypothesis import _assert_matches_numpy, einsum_problems
from test_einsum_numpy import BLOCKINGS, make_operands
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql.backends.duckdb.executor import DuckDBExecutor
from tensorsql.compile import waves as W
from tensorsql.errors import OutOfMemoryError
from tensorsql.ir import tra as T

N, BS = 1536, 128  # two 18.9 MB float64 tables of 144 blocks


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    """A database file holding X and Y, which together pass the 32 MiB limit the tests open it with."""
    path = str(tmp_path_factory.mktemp("waves") / "xy.duckdb")
    rng = np.random.default_rng(13)
    x, y = rng.standard_normal((N, N)), rng.standard_normal((N, N))
    with ts.connect(path) as s:
        s.from_numpy(x, block_shape=(BS, BS)).save("X")
        s.from_numpy(y, block_shape=(BS, BS)).save("Y")
    return path, x, y


def _open(path: str, tmp_path, **kw) -> ts.Session:
    return ts.connect(path, threads=2, memory_limit="32MiB", temp_directory=str(tmp_path / "spill"), **kw)


def _stages_left(s: ts.Session) -> list[tuple]:
    names = s.execute("SELECT table_name FROM duckdb_tables()")
    return [n for n in names if n[0].lower().startswith("_ts_stage_")]


@pytest.mark.parametrize("eq", ["ij,jk->ik", "ij,ij->", "ij,kj->ik", "ij,jk->j", "ij,jk,kl->il"])
def test_stored_inputs_over_the_limit_are_joined_in_waves(stored, tmp_path, eq):
    """The case, scaled: two stored tables that together pass memory_limit (20000^2 float32 under
    2 GB failed in 0.4 s). Each wave holds a quarter of the limit's worth of blocks."""
    path, x, y = stored
    arrays = [x, y, x][: eq.count(",") + 1]
    with _open(path, tmp_path, read_only=True) as s:
        rels = [s.table(n) for n in "XYX"[: len(arrays)]]
        lazy = s.einsum(eq, *rels)
        assert "runs in waves" in lazy.explain()
        assert_einsum_close(lazy.numpy(), eq, *arrays, optimize=True)
        assert _stages_left(s) == [] and s.executor._stages == set()


@pytest.mark.parametrize("eq", ["ij,jk->ik", "ij,jk,kl->il", "ij,ij->i"])
def test_a_table_joined_with_itself_runs_in_waves(stored, tmp_path, eq):
    """X @ X reads the table twice, two scans each holding its blocks: counted once, cutting one side raised
    the estimate, no halving lowered it, and the plan ran as one query (OutOfMemoryError)."""
    path, x, _ = stored
    n = eq.count(",") + 1
    with _open(path, tmp_path, read_only=True) as s:
        lazy = s.einsum(eq, *[s.table("X")] * n)
        assert "runs in waves" in lazy.explain()
        assert_einsum_close(lazy.numpy(), eq, *[x] * n, optimize=True)
        assert _stages_left(s) == []


def test_without_waves_the_same_join_runs_out_of_memory(stored, tmp_path, monkeypatch):
    """What the waves fix: the same join in one query fails under the same limit (with the typed error)."""
    path, _, _ = stored
    monkeypatch.setattr(DuckDBExecutor, "wave_budget", property(lambda self: 1 << 62))
    with _open(path, tmp_path, read_only=True) as s, pytest.raises(OutOfMemoryError, match="memory_limit="):
        s.einsum("ij,jk->ik", s.table("X"), s.table("Y")).numpy()


def test_every_result_path_runs_in_waves(stored, tmp_path):
    """The sink, Arrow and a temporary table (save() is covered by the forced-wave cases below: DuckDB keeps
    the blobs a transaction writes to the database file in memory, so a saved table must fit the limit)."""
    path, x, y = stored
    want = x @ y
    with _open(path, tmp_path, read_only=True) as s:
        lazy = s.einsum("ij,jk->ik", s.table("X"), s.table("Y"))
        assert_einsum_close(s.from_arrow(lazy.to_arrow()).numpy(), "ij,jk->ik", x, y, want=want)
        assert_einsum_close(lazy.materialize().numpy(), "ij,jk->ik", x, y, want=want)
        assert _stages_left(s) == []


def test_arrow_results_of_waves_hold_every_block_once(stored, tmp_path):
    path, _, _ = stored
    with _open(path, tmp_path, read_only=True) as s:
        table = s.einsum("ij,jk->ik", s.table("X"), s.table("Y")).to_arrow()
    keys = sorted(zip(table.column("k0").to_pylist(), table.column("k1").to_pylist(), strict=True))
    assert keys == [(i, k) for i in range(N // BS) for k in range(N // BS)]


def test_a_failing_wave_leaves_no_stage_table(stored, tmp_path, monkeypatch):
    path, _, _ = stored
    calls = {"n": 0}
    real = duckdb.DuckDBPyConnection.execute

    def failing(con, query, *args):
        if "_ts_stage" in str(query) and "INSERT" in str(query).upper():
            calls["n"] += 1
            raise duckdb.InvalidInputException("tensorsql test: a wave failed")
        return real(con, query, *args)

    with _open(path, tmp_path, read_only=True) as s:
        lazy = s.einsum("ij,jk,kl->il", s.table("X"), s.table("Y"), s.table("X"))
        monkeypatch.setattr(duckdb.DuckDBPyConnection, "execute", failing)
        with pytest.raises(Exception, match="a wave failed"):
            lazy.numpy()
        monkeypatch.undo()
        assert calls["n"] == 1
        assert _stages_left(s) == [] and s.executor._stages == set()


# ---- the wave planner (compile.waves) ---------------------------------------------------------------------
def _matmul(s: ts.Session, n: int, j: int, bs: int) -> T.Rel:
    x = s.from_numpy(np.ones((n, j)), block_shape=(bs, bs))
    y = s.from_numpy(np.ones((j, n)), block_shape=(bs, bs))
    return s.einsum("ij,jk->ik", x, y, strategy="operands").plan().tra


def test_split_makes_near_equal_contiguous_ranges():
    assert W.split(5, 2) == [(0, 2), (3, 4)]
    assert W.split(16, 4) == [(0, 3), (4, 7), (8, 11), (12, 15)]
    assert W.split(3, 3) == [(0, 0), (1, 1), (2, 2)]
    assert sum(hi - lo + 1 for lo, hi in W.split(1000, 7)) == 1000


def test_cuts_keep_to_the_result_labels_when_those_suffice(s):
    tra = _matmul(s, 64, 64, 8)  # 8 x 8 blocks of 512 B per operand and result
    agg = tra.child
    space = {k: agg.child.schema.nblocks(k) for k in agg.child.schema.keys}
    total = W.footprint(agg)
    assert total == 3 * 64 * 64 * 8
    cuts = W.choose_cuts(agg, space, total // 3, set(agg.schema.keys))
    assert cuts["j"] == 1 and cuts["i"] * cuts["k"] > 1
    assert W.footprint(agg, W.largest(cuts, space)) <= total // 3


def test_a_small_result_of_big_inputs_is_cut_along_the_summed_label(s):
    tra = _matmul(s, 8, 512, 8)  # 'ij,jk->ik' with i, k one block: only j can be cut
    agg = tra.child
    space = {k: agg.child.schema.nblocks(k) for k in agg.child.schema.keys}
    cuts = W.choose_cuts(agg, space, W.footprint(agg) // 8, set(agg.schema.keys))
    assert cuts["j"] >= 8 and cuts["i"] == cuts["k"] == 1


def test_restrict_filters_the_leaves_and_keeps_the_schema(s):
    tra = _matmul(s, 64, 64, 8)
    cut = W.restrict(tra, {"k0": (0, 3)})
    assert cut.schema == tra.schema
    leaves = [r for r in _nodes(cut) if isinstance(r, T.Restrict)]
    assert [r.ranges for r in leaves] == [(("k0", 0, 3),)]  # X's rows i (k0 of X); Y has no i
    assert W.footprint(cut) < W.footprint(tra)


def test_restrict_through_a_repartition_drops_partly_assembled_blocks(s):
    x = s.from_numpy(np.arange(60.0).reshape(6, 10), block_shape=(4, 4))
    tra = x.reblock(block_shape=(3, 3)).plan().tra
    assert any(isinstance(r, T.Repartition) for r in _nodes(tra))
    cut = W.restrict(tra, {"k1": (1, 1)})  # target columns 3..5 need source column blocks 0 and 1
    tops = [r for r in _nodes(cut) if isinstance(r, T.Restrict) and isinstance(r.child, T.Repartition)]
    leaves = [r for r in _nodes(cut) if isinstance(r, T.Restrict) and isinstance(r.child, T.Scan | T.Input)]
    assert [r.ranges for r in tops] == [(("k1", 1, 1),)]
    assert [r.ranges for r in leaves] == [(("k1", 0, 1),)]


def _nodes(rel: T.Rel) -> list[T.Rel]:
    out, stack = [], [rel]
    while stack:
        r = stack.pop()
        out.append(r)
        stack.extend(T.inputs(r))
    return out


# ---- the shared equation lists, every plan forced into the finest waves ----------------------------------
@pytest.fixture(scope="module")
def waved():
    """A session whose wave budget is 256 bytes: every plan of more than one block runs in waves."""
    mp = pytest.MonkeyPatch()
    mp.setattr(DuckDBExecutor, "wave_budget", property(lambda self: 256))
    sess = ts.connect(threads=2)
    yield sess
    sess.close()
    mp.undo()


@pytest.mark.parametrize("blocking", ["block2_ragged", "blocks3"])
@pytest.mark.parametrize("case", BLOCKING_CASES[::2], ids=lambda c: c.id)
def test_blocked_cases_in_waves_match_numpy(waved, case, blocking):
    ops = make_operands(case.shapes, np.float64, case.id, blocking)
    rels = [waved.from_numpy(o, **BLOCKINGS[blocking](o.shape)) for o in ops]
    lazy = waved.einsum(case.subscripts, *rels)
    assert_einsum_close(lazy.numpy(), case.subscripts, *ops)
    assert_einsum_close(waved.from_arrow(lazy.to_arrow()).numpy(), case.subscripts, *ops)  # run_arrow
    assert_einsum_close(lazy.materialize().numpy(), case.subscripts, *ops)  # store, temporary
    saved = lazy.save("saved", replace=True)  # store, in a transaction
    assert_einsum_close(saved.numpy(), case.subscripts, *ops)


def check_mixed_einsum(session: ts.Session, case, seed: str) -> None:
    """``case`` (a shared equation) with every other operand a relation in blocks of 2, against numpy."""
    ops = make_operands(case.shapes, np.float64, case.id, seed)
    args = [
        session.from_numpy(o, block_shape=tuple(min(2, max(d, 1)) for d in o.shape))
        if i % 2 == 0 and o.ndim
        else o
        for i, o in enumerate(ops)
    ]
    got = session.einsum(case.subscripts, *args)
    assert_einsum_close(got if isinstance(got, np.ndarray) else got.numpy(), case.subscripts, *ops)


@pytest.mark.parametrize("case", EQUATIONS[::3], ids=lambda c: c.id)
def test_equations_in_waves_match_numpy(waved, case):
    check_mixed_einsum(waved, case, "mixed")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(problem=einsum_problems(max_ops=3), data=st.data())
def test_random_einsums_in_waves_match_numpy(waved, problem, data):
    """Random einsums over stored relations in random blockings, every one run in the finest waves."""
    ops = problem.operands()
    args = [
        waved.from_numpy(o, block_shape=tuple(data.draw(st.integers(1, max(d, 1))) for d in o.shape))
        if o.ndim and o.size
        else o
        for o in ops
    ]
    got = waved.einsum(problem.subscripts, *args)
    _assert_matches_numpy(got if isinstance(got, np.ndarray) else got.numpy(), problem, ops)
