"""Operations over stored relations that miss blocks: an absent block is zeros, so a map whose value at
zero is not zero (exp, sigmoid, log, a negative power, ...), a join other than multiply (x + 0 is x, not
absent) and an aggregation other than sum (max over a row of negatives and an absent block is 0) must see
those zeros, not skip the block (which every consumer then reads as zeros). The plan fills the grid first
(``T.Densify``) only where it has to: multiply/sum contractions and maps that keep zero skip absent blocks
exactly."""

from __future__ import annotations

import numpy as np
import pytest
from test_result_sink import _sparse

import tensorsql as ts
from tensorsql.backends.duckdb import many
from tensorsql.backends.duckdb.executor import DuckDBExecutor
from tensorsql.ir import ops
from tensorsql.ir import tra as T

PARAMS = {"pow": [-1.0, 0.0, 2.0], "scale": [3.0], "rpow": [2.0, 0.5]}


def _cases():
    for fn in ops.MAPS:
        for p in PARAMS.get(fn, [None]) if ops.lookup("map", fn).param is not None else [None]:
            yield fn, p


def _plan_nodes(rel):
    return list(T.nodes(rel.plan().tra))


@pytest.fixture(scope="module")
def s():
    with ts.connect(threads=2) as session:
        yield session


@pytest.fixture(scope="module")
def sparse(s):
    rng = np.random.default_rng(40)
    x = np.abs(rng.standard_normal((9, 8))) + 0.5  # positive: log, sqrt and powers stay real
    return _sparse(s, x, (3, 4), [(0, 0), (1, 1), (2, 0)])  # three of six blocks absent


@pytest.mark.parametrize(("fn", "param"), list(_cases()))
def test_a_map_over_absent_blocks_is_the_map_of_zeros(s, sparse, fn, param):
    A, dense = sparse
    rel = ts.map(A, fn, param)
    with np.errstate(all="ignore"):
        want = np.asarray(ops.lookup("map", fn).numpy(dense, ops.map_param(param)))
    got = rel.numpy()
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=0)
    filled = any(isinstance(r, T.Densify) for r in _plan_nodes(rel))
    assert filled == (not ops.keeps_zero(fn, "float64", param))  # only where the map does not keep zeros
    total = rel.sum().numpy()  # a consumer after the map sees the same values
    np.testing.assert_allclose(total, want.sum(), rtol=1e-12)


def test_integer_relations_and_negative_powers(s):
    """An integer relation to a negative power is float64 (numpy refuses it): 1/0 at an absent block."""
    x = np.arange(1, 13, dtype=np.int64).reshape(3, 4)
    A, dense = _sparse(s, x, (1, 4), [(0, 0), (2, 0)])
    assert not ops.keeps_zero("pow", "int64", -1.0) and ops.keeps_zero("pow", "int64", 2.0)
    with np.errstate(divide="ignore"):
        np.testing.assert_array_equal(ts.pow(A, -1).numpy(), 1.0 / dense.astype(np.float64))
    np.testing.assert_array_equal(ts.pow(A, 2).numpy(), dense**2)
    np.testing.assert_array_equal(ts.exp(A).numpy(), np.exp(dense))


def test_maps_of_arrays_are_never_filled(s):
    """Arrays (and what is computed from them alone) have every block: no grid to fill."""
    x = np.arange(12.0).reshape(3, 4)
    rel = ts.exp(s.einsum("ij->ij", x))
    assert not any(isinstance(r, T.Densify) for r in _plan_nodes(rel))
    np.testing.assert_allclose(rel.numpy(), np.exp(x), rtol=1e-14)


def test_relations_made_from_arrays_are_never_filled(s, sparse):
    """``from_numpy`` stores every block, and so does ``materialize()`` of a result computed from such
    relations alone: their steps fill nothing. A materialized result over a sparse table may lack blocks."""
    x = np.arange(1.0, 25.0).reshape(4, 6)
    X = s.from_numpy(x, block_shape=(2, 3))
    kept = (X + X).materialize()
    for rel, want in ((ts.exp(X), np.exp(x)), (X + 1, x + 1), (ts.exp(kept), np.exp(2 * x))):
        assert not any(isinstance(r, T.Densify) for r in _plan_nodes(rel))
        np.testing.assert_allclose(rel.numpy(), want, rtol=1e-14)
    A, dense = sparse
    lacking = (A * 2.0).materialize()  # a map that keeps zero: the absent blocks stay absent
    assert lacking.to_arrow().num_rows < A.to_arrow().num_rows + 3
    assert any(isinstance(r, T.Densify) for r in _plan_nodes(ts.exp(lacking)))
    np.testing.assert_allclose(ts.exp(lacking).numpy(), np.exp(2.0 * dense), rtol=1e-14)


def test_filled_blocks_feed_joins_sinks_and_compiled_graphs(s, sparse):
    A, dense = sparse
    w = np.random.default_rng(41).standard_normal((8, 5))
    got = (ts.exp(A) @ w).numpy()
    np.testing.assert_allclose(got, np.exp(dense) @ w, rtol=1e-12)
    W = s.placeholder((8, 5), "float64", name="w")
    f = s.compile([ts.sigmoid(A) @ W, (ts.exp(A) * 2.0).sum()], [W], share=True)
    y, total = f(w)
    np.testing.assert_allclose(y, (1 / (1 + np.exp(-dense))) @ w, rtol=1e-12)
    np.testing.assert_allclose(total, 2.0 * np.exp(dense).sum(), rtol=1e-12)
    table = ts.exp(A).to_arrow()  # every block of the grid comes back, filled ones too
    assert table.num_rows == 6


def test_filled_blocks_in_waves(s, sparse, monkeypatch):
    """A plan run in waves fills only each wave's blocks: every block once, none missing."""
    A, dense = sparse
    monkeypatch.setattr(DuckDBExecutor, "wave_budget", property(lambda self: 1 << 8))
    rel = ts.exp(A) + 1.0
    assert "runs in waves" in rel.explain()
    np.testing.assert_allclose(rel.numpy(), np.exp(dense) + 1.0, rtol=1e-12)
    np.testing.assert_allclose(s.from_arrow(rel.to_arrow()).numpy(), np.exp(dense) + 1.0, rtol=1e-12)
    mapped = ts.exp(A)  # in A's blocks: six, each once
    assert "runs in waves" in mapped.explain() and mapped.to_arrow().num_rows == 6


@pytest.fixture(scope="module")
def two_sparse(s):
    rng = np.random.default_rng(42)
    x = -np.abs(rng.standard_normal((6, 8))) - 0.5  # negative: an absent block holds the row's maximum
    y = rng.standard_normal((6, 8))
    A, da = _sparse(s, x, (3, 4), [(0, 0), (1, 1), (0, 1)])
    B, db = _sparse(s, y, (3, 4), [(1, 0), (1, 1)])
    return A, da, B, db, y


CASES = {
    "add two sparse": (lambda A, B, Y: A + B, lambda a, b, y: a + b),
    "add a scalar": (lambda A, B, Y: A + 1.0, lambda a, b, y: a + 1.0),
    "subtract an array": (lambda A, B, Y: A - Y, lambda a, b, y: a - y),
    "divide": (lambda A, B, Y: Y / (A - 1.0), lambda a, b, y: y / (a - 1.0)),
    "max over a row": (lambda A, B, Y: A.max(axis=1), lambda a, b, y: a.max(1)),
    "min over a column": (lambda A, B, Y: (-A).min(axis=0), lambda a, b, y: (-a).min(0)),
    "prod over a row": (lambda A, B, Y: (A - 1.0).prod(axis=1), lambda a, b, y: (a - 1.0).prod(1)),
    "max of products": (
        lambda A, B, Y: ts.einsum("ij,kj->ik", A, B, join="multiply", agg="max"),
        lambda a, b, y: (a[:, None, :] * b[None, :, :]).max(-1),
    ),
    "softmax": (lambda A, B, Y: ts.softmax(A), lambda a, b, y: np.exp(a) / np.exp(a).sum(-1, keepdims=True)),
    "mean": (lambda A, B, Y: A.mean(), lambda a, b, y: a.mean()),
    "product (sparse-safe)": (lambda A, B, Y: A @ B.T, lambda a, b, y: a @ b.T),
    "exp of a sum": (lambda A, B, Y: ts.exp(A + B), lambda a, b, y: np.exp(a + b)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_joins_and_aggregations_see_the_zeros_of_absent_blocks(s, two_sparse, case):
    A, da, B, db, y = two_sparse
    make, want = CASES[case]
    rel = make(A, B, s.from_numpy(y))
    np.testing.assert_allclose(rel.numpy(), want(da, db, y), rtol=1e-12, atol=1e-14)


def test_multiply_sum_skips_absent_blocks(s, two_sparse):
    """A product over sparse inputs fills nothing: its absent pairs are exact zeros."""
    A, _, B, _, _ = two_sparse
    rel = A @ B.T
    assert not any(isinstance(r, T.Densify) for r in _plan_nodes(rel))
    assert any(isinstance(r, T.Densify) for r in _plan_nodes(A + B))
    # a step over filled inputs has every block: exp after the add fills nothing more
    assert sum(isinstance(r, T.Densify) for r in _plan_nodes(ts.exp(A + B))) == 2


def test_shared_steps_over_arrays_fill_nothing(s, sparse):
    """A compiled graph's shared steps are read as stand-in tables: computed from arrays alone they hold
    every block, so the steps after them fill nothing; from a sparse stored input, they are filled."""

    rng = np.random.default_rng(43)
    X = s.placeholder((9, 8), "float64", name="x")
    W = s.placeholder((8, 5), "float64", name="w")
    h = X @ W  # shared by both outputs
    f = s.compile([ts.exp(h).sum(), (h + 1.0).max()], [X, W], share=True)
    assert "tensor_zeros" not in many.text(f._many[0])
    x, w = rng.standard_normal((9, 8)), rng.standard_normal((8, 5))
    got = f(x, w)
    np.testing.assert_allclose(got[0], np.exp(x @ w).sum(), rtol=1e-12)
    np.testing.assert_allclose(got[1], (x @ w + 1.0).max(), rtol=1e-12)
    A, dense = sparse
    hs = A @ W
    g = s.compile([ts.exp(hs).sum(), (hs + 1.0).max()], [W], share=True)
    assert "tensor_zeros" in many.text(g._many[0])
    got = g(w)
    np.testing.assert_allclose(got[0], np.exp(dense @ w).sum(), rtol=1e-12)
    np.testing.assert_allclose(got[1], (dense @ w + 1.0).max(), rtol=1e-12)


def test_the_sql_surface_fills_too(s):
    """The SQL front end builds the same graph: a table that lost a block (deleted with SQL) gives numpy's
    answer through tensor_map, an add join, a max and softmax."""
    x = -np.abs(np.random.default_rng(44).standard_normal((6, 8))) - 0.5
    s.from_numpy(x, block_shape=(3, 4)).save("SPARSE_SQL", replace=True)
    s.execute('DELETE FROM "SPARSE_SQL" WHERE k0 = 1 AND k1 = 0')
    dense = x.copy()
    dense[3:6, 0:4] = 0.0

    def cells(query, shape):
        out = np.zeros(shape)
        for *idx, v in s.sql(f"SELECT * FROM tensor_cells({query})").fetchall():
            out[tuple(idx)] = v
        return out

    np.testing.assert_allclose(cells("tensor_map(SPARSE_SQL, 'exp')", (6, 8)), np.exp(dense), rtol=1e-14)
    add = cells("einsum('ij,ij->ij', SPARSE_SQL, SPARSE_SQL, join => 'add')", (6, 8))
    np.testing.assert_allclose(add, 2 * dense, rtol=1e-14)
    row_max = cells("einsum('ij->i', SPARSE_SQL, agg => 'max')", (6,))
    np.testing.assert_allclose(row_max, dense.max(1), rtol=1e-14)
    soft = np.exp(dense) / np.exp(dense).sum(1, keepdims=True)
    np.testing.assert_allclose(cells("softmax(SPARSE_SQL)", (6, 8)), soft, rtol=1e-13)
    s.drop("SPARSE_SQL")
