"""A compiled graph of several outputs as one statement (``Executor.many``, ``backends/duckdb/many.py``):
the shared steps as MATERIALIZED CTEs, every output into a result sink of its own; the same results as the
plans run one by one, and the one-by-one path wherever one statement cannot hold the graph."""

from __future__ import annotations

import numpy as np
import pytest
from test_result_sink import _sparse

import tensorsql as ts
from tensorsql.backends.duckdb import executor as duck_executor
from tensorsql.backends.duckdb import many, sqlgen
from tensorsql.ir import tra as T
from tensorsql.ml.train import Stepper


@pytest.fixture(scope="module")
def s():
    with ts.connect(threads=2) as session:
        yield session


class _Counting:
    """The executor's connection, counting the statements executed through it."""

    def __init__(self, con):
        self.con, self.texts = con, []

    def execute(self, text, *args):
        self.texts.append(text)
        return self.con.execute(text, *args)

    def __getattr__(self, name):
        return getattr(self.con, name)


def _graph(s, shapes, dtype="float64"):
    """A loss over placeholders and its gradients: tanh(X @ W) feeds the loss and both gradients."""
    (m, k), (_, n) = shapes
    X = s.placeholder((m, k), dtype, name="x")
    W = s.placeholder((k, n), dtype, name="w")
    Y = s.placeholder((m, n), dtype, name="y")
    h = ts.tanh(X @ W)
    loss = ((h - Y) ** 2).sum() + (h * 0.5).sum()
    return [loss, *ts.grad(loss, [W, X])], [X, W, Y]


def _arrays(shapes, seed, dtype="float64"):
    rng = np.random.default_rng(seed)
    (m, k), (_, n) = shapes
    return [rng.standard_normal(sh).astype(dtype) for sh in ((m, k), (k, n), (m, n))]


def _assert_same(got, want, dtype="float64"):
    eps = np.finfo(dtype).eps
    for g, w in zip(got, want, strict=True):
        scale = max(1.0, float(np.abs(w).max()))
        np.testing.assert_allclose(g, w, rtol=0, atol=1e3 * eps * scale)


@pytest.mark.parametrize("shapes", [((6, 4), (4, 3)), ((400, 300), (300, 200)), ((1, 1), (1, 1))])
def test_one_statement_equals_the_plans_one_by_one(s, shapes):
    """Small (one block each) and big enough to be split over the 2 threads: the same values either way."""
    outputs, inputs = _graph(s, shapes)
    together = s.compile(outputs, inputs, share=True)
    apart = s.compile(outputs, inputs)
    assert together._many is not None and apart._many is None
    for seed in range(2):  # planned once, run on new arrays each call
        arrays = _arrays(shapes, seed)
        _assert_same(together(*arrays), apart(*arrays))


def test_a_one_block_graph_is_one_program_call(s):
    """Every tensor one block, every leaf an array: the whole graph (shared steps once) is one
    ``tensor_program_into`` call that writes every output; the same values as the CTE statement."""
    outputs, inputs = _graph(s, ((8, 5), (5, 3)))
    f = s.compile(outputs, inputs, share=True)
    run, _ = f._many
    text = many.text(run)
    assert text.count("tensor_program_into(") == 1 and "MATERIALIZED" not in text
    s.executor.programs = False
    try:
        g = s.compile(outputs, inputs, share=True)
        assert "tensor_program_into" not in many.text(g._many[0])
    finally:
        s.executor.programs = True
    for seed in range(3):
        arrays = _arrays(((8, 5), (5, 3)), seed)
        _assert_same(f(*arrays), g(*arrays))


def test_the_call_is_one_statement_and_each_shared_step_one_cte(s, monkeypatch):
    """Without programs (``TENSORSQL_PROGRAMS=0``), or for a graph a program cannot run: one statement, each
    shared step a MATERIALIZED CTE."""
    monkeypatch.setattr(s.executor, "programs", False)
    outputs, inputs = _graph(s, ((8, 5), (5, 3)))
    counting = _Counting(s.executor.con)
    monkeypatch.setattr(s.executor, "con", counting)
    lane = s.executor._lane_con()  # a small graph that reads no table runs on the single-threaded lane
    monkeypatch.setattr(s.executor, "_lane", _Counting(lane))
    lane_texts = s.executor._lane.texts
    f = s.compile(outputs, inputs, share=True)
    run, _ = f._many
    text = many.text(run)
    shared = text.count("AS MATERIALIZED")
    assert shared >= 1 and text.count("tensor_") > 0
    assert "IS NULL" not in text  # lent arrays only: every block present, no padding rows to drop
    arrays = _arrays(((8, 5), (5, 3)), 3)
    want = s.compile(outputs, inputs)(*arrays)
    for call in range(3):
        counting.texts.clear()
        lane_texts.clear()
        _assert_same(f(*arrays), want)
        # the text, then PREPARE and EXECUTE, then EXECUTE alone
        assert not counting.texts
        assert len(lane_texts) == (1 if call == 0 else 2 if call == 1 else 1), lane_texts


def test_without_many_each_plan_runs_by_itself(s, monkeypatch):
    """An executor that cannot (the cluster's ``many`` returns None): the shared steps run first, as
    before."""
    outputs, inputs = _graph(s, ((7, 3), (3, 2)))
    monkeypatch.setattr(s.executor, "many", lambda stages, outs: None)
    f = s.compile(outputs, inputs, share=True)
    assert f._many is None and f._stages
    arrays = _arrays(((7, 3), (3, 2)), 4)
    monkeypatch.undo()
    _assert_same(f(*arrays), s.compile(outputs, inputs, share=True)(*arrays))


def test_an_operand_too_big_to_lend_runs_plan_by_plan(s, monkeypatch):
    monkeypatch.setattr(duck_executor, "BLOCK_SLOT_BYTES", 64)
    outputs, inputs = _graph(s, ((9, 4), (4, 3)))
    f = s.compile(outputs, inputs, share=True)
    assert f._many is None
    monkeypatch.undo()
    arrays = _arrays(((9, 4), (4, 3)), 5)
    _assert_same(f(*arrays), s.compile(outputs, inputs)(*arrays))


def test_absent_blocks_of_a_stored_input_are_zeros(s):
    """An output that misses blocks (a sparse stored input) is not complete in the one statement: that call
    runs the plans one by one, which fill them with zeros."""
    rng = np.random.default_rng(6)
    A, dense = _sparse(s, rng.standard_normal((8, 6)), (4, 6), [(0, 0)])  # the second row panel is absent
    W = s.placeholder((6, 3), "float64", name="w")
    h = A @ W
    outputs = [h.sum(), h * 2.0, ts.exp(h)]
    f = s.compile(outputs, [W], share=True)
    w = rng.standard_normal((6, 3))
    got = f(w)
    want = dense @ w
    _assert_same(got, [want.sum(), want * 2.0, np.exp(want)])


def test_padding_rows_of_an_absent_block_count_nothing(s):
    """A computed side paired by position with a sparse stored input pads the missing block's row: its sink
    writes nothing (NULL), which the completeness count skips; the call then runs the plans one by one."""
    rng = np.random.default_rng(22)
    A, dense = _sparse(s, rng.standard_normal((4000, 600)), (2000, 600), [(0, 0)])
    W = s.placeholder((600, 300), "float64", name="w")
    f = s.compile([ts.tanh(A) @ W, W * 2.0], [W], share=True)  # tanh keeps zeros: the block stays absent
    w = rng.standard_normal((600, 300))
    got = f(w)
    _assert_same(got, [np.tanh(dense) @ w, w * 2.0])


def test_a_shape_error_names_the_input(s):
    outputs, inputs = _graph(s, ((4, 3), (3, 2)))
    f = s.compile(outputs, inputs, share=True)
    x, w, y = _arrays(((4, 3), (3, 2)), 7)
    with pytest.raises(ts.ShapeError, match=r"input 1 \('w'\) has shape \(2, 3\)"):
        f(x, w.T.copy(), y)
    with pytest.raises(ts.SessionClosedError):
        closed = ts.connect()
        outs, ins = _graph(closed, ((2, 2), (2, 2)))
        g = closed.compile(outs, ins, share=True)
        closed.close()
        g(*_arrays(((2, 2), (2, 2)), 8))


@pytest.mark.parametrize(
    "make", [lambda: ts.ml.SGD(0.1, momentum=0.9), lambda: ts.ml.Adam(0.01)], ids=["sgd", "adam"]
)
def test_a_training_step_is_one_statement(s, make, monkeypatch):
    """``fit``'s step (loss, gradients and every weight's and state's update) as one statement; the same
    weights as the update run plan by plan."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((64, 5))
    labels = (x @ rng.standard_normal(5) > 0).astype(np.int64)
    model = ts.ml.MLP(s, [5, 4, 2], dtype="float64", seed=0)
    one = Stepper(model, make())
    losses = [one.step(x, model.targets(labels)) for _ in range(3)]
    assert all(c._many is not None for c in one.steps.values())
    monkeypatch.setattr(s.executor, "many", lambda stages, outs: None)
    s.clear_cache()  # the session's compiled step (one statement) would be reused otherwise
    apart = Stepper(model, make())
    want = [apart.step(x, model.targets(labels)) for _ in range(3)]
    assert all(c._many is None for c in apart.steps.values())
    np.testing.assert_allclose(losses, want, rtol=1e-12, atol=1e-12)
    for p, q in zip(one.params, apart.params, strict=True):
        np.testing.assert_allclose(p, q, rtol=1e-12, atol=1e-12)


def test_a_corrupted_stored_table_is_named(s):
    """A stored table the statement reads with a truncated block: the same CorruptTableError as the plans
    one by one give (the diagnosis reads the stored tables, not the statement's shared steps)."""
    rng = np.random.default_rng(12)
    s.save(s.from_numpy(rng.standard_normal((5, 7)), block_shape=(2, 3)), "many_edited", replace=True)
    s.executor.con.execute('UPDATE "many_edited" SET tensor = tensor[1:8] WHERE k0 = 0 AND k1 = 1')
    E = s.table("many_edited")
    W = s.placeholder((7, 4), "float64", name="w")
    h = ts.tanh(W)
    for share in (False, True):
        f = s.compile([E @ h, h.sum()], [W], share=share)
        with pytest.raises(ts.CorruptTableError, match=r"'many_edited': block key \[0, 1\]"):
            f(rng.standard_normal((7, 4)))
    s.drop("many_edited")


def test_results_through_arrow_when_sinks_are_off(s, monkeypatch):
    """``result_sink = False`` (results through Arrow always): the plans run one by one, even those compiled
    into one statement before the flag changed."""
    outputs, inputs = _graph(s, ((6, 3), (3, 2)))
    before = s.compile(outputs, inputs, share=True)
    arrays = _arrays(((6, 3), (3, 2)), 13)
    want = s.compile(outputs, inputs)(*arrays)
    monkeypatch.setattr(s, "result_sink", False)
    assert s.compile(outputs, inputs, share=True)._many is None
    monkeypatch.setattr(before, "_many", (lambda bindings: pytest.fail("ran the one statement"), {}))
    _assert_same(before(*arrays), want)


def test_every_block_of_a_checked_statement_counts(s):
    """A statement that reads a stored table (its keys checked by a UNION ALL branch): two result blocks
    with the same element count are two rows, not one, so the one statement is complete."""
    rng = np.random.default_rng(14)
    a = rng.standard_normal((8, 6))
    s.save(s.from_numpy(a, block_shape=(4, 6)), "many_blocks", replace=True)
    A = s.table("many_blocks")
    W = s.placeholder((6, 3), "float64", name="w")
    h = A @ W
    f = s.compile([h * 2.0, h.sum()], [W], share=True)
    run, bound = f._many
    w = rng.standard_normal((6, 3))
    got = run({**bound, W.node: w})
    assert got is not None  # complete: no fallback
    _assert_same(got, [a @ w * 2.0, (a @ w).sum()])
    s.drop("many_blocks")


@pytest.mark.parametrize("dtype", ["float32", "float64", "int64", "complex128"])
def test_a_sum_within_one_block_is_no_aggregate(s, dtype):
    """A reduction whose summed labels are one block each sums within its block (the unary kernel) and needs
    no aggregate over rows: each group is one row. Summed labels of several blocks still aggregate."""
    rng = np.random.default_rng(21)
    a = (rng.standard_normal((6, 10)) * 4).astype(dtype)
    whole = s.einsum("ab->", a)
    assert "tensor_sum(" not in whole.sql() and "GROUP BY" not in whole.sql()
    np.testing.assert_allclose(whole.numpy(), a.sum(), rtol=1e-12, atol=1e-5 * np.abs(a).sum())
    rows = s.einsum("ab->a", s.from_numpy(a, block_shape=(2, 10)))  # b one block: a sum within each row block
    assert "tensor_sum(" not in rows.sql()
    np.testing.assert_allclose(rows.numpy(), a.sum(1), rtol=1e-12, atol=1e-5 * np.abs(a).sum())
    cols = s.einsum("ab->a", s.from_numpy(a, block_shape=(6, 4)))  # b in three blocks, as the planner likes
    np.testing.assert_allclose(cols.numpy(), a.sum(1), rtol=1e-12, atol=1e-5 * np.abs(a).sum())


def test_only_groups_of_one_row_skip_the_aggregate():
    """The rule itself (``sqlgen._single_rows``): an aggregate over a per-block kernel's rows is its child's
    block only when every label it sums over is one block and the dtype stays."""

    def agg(blocks, dtype="float64", keep=("a",)):
        src = T.Input(T.positional((6, 10), blocks, "float64"), 0, "x")
        sizes, split = {"a": 6, "b": 10}, {"a": blocks[0], "b": blocks[1]}
        child_schema = T.Schema(("a", "b"), ("a",), sizes, split, "float64")
        unary = T.Unary(child_schema, T.Relabel(src.schema, src, ("a", "b")), "sum")
        kept = {k: child_schema.sizes[k] for k in keep}
        schema = T.Schema(keep, ("a",), kept, {k: child_schema.blocks[k] for k in keep}, dtype)
        return T.Aggregate(schema, unary, "sum")

    assert sqlgen._single_rows(agg((2, 10)))  # b one block: a group is one row
    assert not sqlgen._single_rows(agg((2, 4)))  # b in three blocks: three rows a group
    assert not sqlgen._single_rows(agg((2, 10), dtype="complex128"))  # the aggregate casts
    assert sqlgen._single_rows(agg((6, 10), keep=()))  # nothing kept, everything one block
    assert not sqlgen._single_rows(agg((2, 10), keep=()))  # a in three blocks summed away
