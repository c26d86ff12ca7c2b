"""Sessions, tensor relations, persistence, from_sql, extended EinSum, maps, softmax, explain."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest
from tolerance import (
    assert_close,
    assert_einsum_close,
    einsum_tolerance,
    elementwise_tolerance,
    eps,
    reduction_tolerance,
)

import tensorsql as ts
from tensorsql.backends import arrow

RNG = np.random.default_rng(0)
DTYPES = ["float32", "float64", "int32", "int64", "complex64", "complex128"]


def rand(shape, dtype="float64"):
    dt = np.dtype(dtype)
    if dt.kind == "i":
        return RNG.integers(-4, 5, size=shape).astype(dt)
    if dt.kind == "c":
        return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dt)
    return RNG.standard_normal(shape).astype(dt)




@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("shape", "block_shape"),
    [((), ()), ((7,), (3,)), ((5, 6), (2, 4)), ((5, 6), (5, 6)), ((3, 4, 5), (2, 3, 2)), ((0, 4), (1, 2))],
)
def test_roundtrip(s, dtype, shape, block_shape):
    a = rand(shape, dtype)
    rel = s.from_numpy(a, block_shape=block_shape)
    assert rel.shape == shape and rel.dtype == np.dtype(dtype) and rel.block_shape == block_shape
    out = rel.numpy()
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out, a)


def test_blocks_parts_and_arrow(s):
    a = rand((10, 7))
    rel = s.from_numpy(a, blocks=(3, 2))
    assert rel.block_shape == (4, 4)
    t = rel.to_arrow()
    assert t.num_rows == 6 and t.column_names == ["k0", "k1", "tensor"]
    assert t.schema.metadata[b"tensorsql.dtype"] == b"float64"
    np.testing.assert_array_equal(s.from_arrow(t).numpy(), a)


def test_reblock_in_sql(s):
    a = rand((9, 10))
    rel = s.from_numpy(a, block_shape=(4, 3)).reblock((2, 5))
    assert rel.block_shape == (2, 5)
    assert "tensor_slice" in rel.sql() and "tensor_assemble" in rel.sql()
    np.testing.assert_array_equal(rel.numpy(), a)


@pytest.mark.parametrize(
    ("shape", "stored", "merged", "dtype"),
    [
        ((9, 10), (2, 5), (4, 10), "float64"),  # ragged rows, both dimensions merged
        ((9, 10), (3, 5), (9, 5), "float32"),  # one merged, one kept
        ((7, 6, 5), (1, 3, 2), (7, 6, 4), "complex128"),  # 3-d, the last dimension ragged both ways
        ((8,), (3,), (6,), "int64"),
    ],
)
def test_reblock_into_whole_source_blocks_and_back(s, shape, stored, merged, dtype):
    """A reblock whose blocks are each whole source blocks assembles them as they are (no slice), and one
    whose blocks each lie in one source block slices them (no assemble), also where the last block along a
    dimension is short."""
    a = (rand(shape) * 10).astype(dtype)
    rel = s.from_numpy(a, block_shape=stored).reblock(merged)
    assert "tensor_assemble" in rel.sql() and "tensor_slice" not in rel.sql()
    np.testing.assert_array_equal(rel.numpy(), a)
    assert rel.to_arrow().num_rows == math.prod(-(-n // b) for n, b in zip(shape, merged, strict=True))
    back = s.from_numpy(a, block_shape=merged).reblock(stored)
    assert "tensor_slice" in back.sql() and "tensor_assemble" not in back.sql()
    np.testing.assert_array_equal(back.numpy(), a)
    assert back.to_arrow().num_rows == math.prod(-(-n // b) for n, b in zip(shape, stored, strict=True))
    b = rand((*shape[-1:], 3)).astype(dtype)
    for r in (rel, back):
        assert_einsum_close(s.einsum("...j,jk->...k", r, b).numpy(), "...j,jk->...k", a, b)


def test_a_slice_of_an_array_relation_reads_it_whole_and_filters_after(s):
    """A filter DuckDB pushes into the scan of a registered Arrow table (``from_numpy``'s relations) copies
    every blob it passes: a slice reads such a relation behind ``OFFSET 0``; a DuckDB table keeps the
    filter in its scan (it skips the blocks the filter drops)."""
    a = rand((40, 30))
    A = s.from_numpy(a, block_shape=(8, 10))
    for rel, want in ((A[3:20, ::2], a[3:20, ::2]), (A[:16], a[:16]), (A[5, 7:29], a[5, 7:29])):
        assert "OFFSET 0" in rel.sql()
        np.testing.assert_array_equal(rel.numpy(), want)
    A.save("sliced_whole")
    stored = s.table("sliced_whole")[3:20]
    assert "OFFSET 0" not in stored.sql()
    np.testing.assert_array_equal(stored.numpy(), a[3:20])


def test_save_and_reopen_in_new_process(tmp_path):
    db = tmp_path / "t.duckdb"
    a = rand((6, 5), "float32")
    b = rand((5, 3), "complex128")
    with ts.connect(str(db)) as s1:
        s1.from_numpy(a, block_shape=(4, 2)).save("A")
        s1.einsum("ij,jk->ik", s1.table("A"), s1.from_numpy(b)).save("AB")
        assert s1.tables() == ["A", "AB"]
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "ab.npy", a @ b)
    np.save(tmp_path / "ab_tol.npy", einsum_tolerance("ij,jk->ik", a, b))
    code = textwrap.dedent(f"""
        import numpy as np, tensorsql as ts
        s = ts.connect({str(db)!r})
        A = s.table("A")
        assert A.shape == (6, 5) and A.dtype == np.float32 and A.block_shape == (4, 2), A
        np.testing.assert_array_equal(A.numpy(), np.load({str(tmp_path / "a.npy")!r}))
        err = np.abs(s.table("AB").numpy() - np.load({str(tmp_path / "ab.npy")!r}))
        assert (err <= np.load({str(tmp_path / "ab_tol.npy")!r})).all(), err
        print("reopened")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "reopened" in out.stdout


def test_save_refuses_overwrite_unless_replace(s):
    s.from_numpy(rand((2,))).save("dup")
    with pytest.raises(ts.TensorSQLError, match="dup"):
        s.from_numpy(rand((2,))).save("dup")
    b = rand((3,))
    np.testing.assert_array_equal(s.from_numpy(b).save("dup", replace=True).numpy(), b)


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64", "complex128"])
def test_from_sql(s, dtype):
    s.executor.con.execute("CREATE OR REPLACE TABLE coo (r INTEGER, c INTEGER, v DOUBLE)")
    s.executor.con.execute("INSERT INTO coo VALUES (0, 0, 1.5), (4, 6, -2), (2, 3, 7), (2, 3, 1), (1, 5, 3)")
    if dtype == "int64":  # 1.5 is no int64: refused, never rounded (docs "Tensor relations")
        with pytest.raises(ts.CastingError, match=r"\(0, 0\) has value 1\.5 which is not an integer"):
            s.from_sql("SELECT r, c, v FROM coo", shape=(5, 7), block_shape=(2, 3), dtype=dtype)
        s.executor.con.execute("UPDATE coo SET v = 1.0 WHERE r = 0")
    rel = s.from_sql("SELECT r, c, v FROM coo", shape=(5, 7), block_shape=(2, 3), dtype=dtype)
    want = np.zeros((5, 7), dtype=dtype)
    want[0, 0], want[4, 6], want[2, 3], want[1, 5] = 1.5, -2, 8, 3  # (2, 3) appears twice: summed
    if dtype == "int64":
        want[0, 0] = 1
    np.testing.assert_array_equal(rel.numpy(), want)


def test_from_sql_errors(s):
    s.executor.con.execute("CREATE OR REPLACE TABLE coo2 (r INTEGER, c INTEGER, v DOUBLE)")
    s.executor.con.execute("INSERT INTO coo2 VALUES (0, 9, 1.0)")
    with pytest.raises(ts.ShapeError, match=r"outside shape \(3, 3\)"):
        s.from_sql("SELECT * FROM coo2", shape=(3, 3))
    with pytest.raises(ts.ShapeError, match="returns 3 column"):
        s.from_sql("SELECT * FROM coo2", shape=(3,))
    with pytest.raises(ts.SQLExecutionError, match="no_such_table"):
        s.from_sql("SELECT * FROM no_such_table", shape=(3,))


def test_lazy_chain_and_explain(s):
    a, b, c = rand((6, 5)), rand((5, 4)), rand((4, 3))
    rel = s.einsum(
        "ij,jk,kl->il", s.from_numpy(a, block_shape=(4, 2)), s.from_numpy(b, block_shape=(2, 2)), c
    )
    text = rel.explain()
    assert "== EinGraph ==" in text and "== TRA plan ==" in text and "== SQL ==" in text
    assert "tensor_einsum" in rel.sql() and "GROUP BY" in rel.sql()
    assert_einsum_close(rel.numpy(), "ij,jk,kl->il", a, b, c)
    m = rel.materialize()
    assert_einsum_close(m.numpy(), "ij,jk,kl->il", a, b, c)


JOINS = {
    "multiply": lambda x, y: x * y,
    "add": lambda x, y: x + y,
    "subtract": lambda x, y: x - y,
    "divide": lambda x, y: x / y,
    "sqdiff": lambda x, y: (x - y) ** 2,
    "absdiff": lambda x, y: np.abs(x - y),
    "max": np.maximum,
    "min": np.minimum,
}
AGGS = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}
# rounded operations in one join value of exact inputs
JOIN_ROUNDINGS = {"multiply": 1, "add": 1, "subtract": 1, "divide": 1, "sqdiff": 2, "absdiff": 1, "max": 0,
                  "min": 0}


@pytest.mark.parametrize("join", list(JOINS))
@pytest.mark.parametrize("agg", list(AGGS))
def test_extended_einsum(s, join, agg):
    x = rand((5, 4)) + (3 if join == "divide" else 0)
    y = rand((4, 3)) + (3 if join == "divide" else 0)
    terms = JOINS[join](x[:, :, None], y[None, :, :])
    want = AGGS[agg](terms, axis=1)
    tol = reduction_tolerance(terms, agg, 1, np.float64, roundings=JOIN_ROUNDINGS[join])
    rel = s.einsum(
        "ij,jk->ik",
        s.from_numpy(x, block_shape=(2, 3)),
        s.from_numpy(y, block_shape=(3, 2)),
        join=join,
        agg=agg,
    )
    assert_close(rel.numpy(), want, tol)
    assert_close(ts.einsum("ij,jk->ik", x, y, join=join, agg=agg), want, tol)


def test_l_inf_distance_and_unary_agg(s):
    x, y = rand((4, 6)), rand((6, 5))
    got = ts.einsum("ij,jk->ik", x, y, join="absdiff", agg="max")
    terms = np.abs(x[:, :, None] - y[None])
    assert_close(got, terms.max(axis=1), reduction_tolerance(terms, "max", 1, np.float64, roundings=1))
    np.testing.assert_array_equal(ts.einsum("ij->i", x, agg="min"), x.min(axis=1))  # one of the elements
    want = x.prod(axis=0)
    assert_close(ts.einsum("ij->j", x, agg="prod"), want, reduction_tolerance(x, "prod", 0, np.float64, 0))


def test_integer_divide_promotes(s):
    x = np.arange(1, 7).reshape(2, 3)
    got = ts.einsum("ij,ij->ij", x, x + 1, join="divide")
    assert got.dtype == np.float64
    want = x / (x + 1)
    assert_close(got, want, elementwise_tolerance(want, np.float64, roundings=1))


@pytest.mark.parametrize(
    ("fn", "param", "ref"),
    [
        ("exp", None, np.exp),
        ("log", None, np.log),
        ("sqrt", None, np.sqrt),
        ("relu", None, lambda a: np.maximum(a, 0)),
        ("neg", None, np.negative),
        ("abs", None, np.abs),
        ("pow", 3.0, lambda a: a**3),
        ("scale", 0.5, lambda a: a * 0.5),
        ("square", None, np.square),
        ("reciprocal", None, np.reciprocal),
    ],
)
def test_maps(s, fn, param, ref):
    a = np.abs(rand((5, 3))) + 0.5
    if fn in ("relu", "neg", "abs", "pow", "scale", "square"):
        a = a - 1.0
    got = ts.map(a, fn, param)
    want = ref(a)
    tol = elementwise_tolerance(want, np.float64)  # one libm result per element: no cancellation
    assert_close(got, want, tol)
    rel = s.map(s.from_numpy(a, block_shape=(2, 2)), fn, param)
    assert_close(rel.numpy(), want, tol)


def test_map_dtypes(s):
    i = np.arange(-3, 3).reshape(2, 3)
    assert ts.exp(i).dtype == np.float64
    assert_close(ts.exp(i), np.exp(i), elementwise_tolerance(np.exp(i), np.float64))
    np.testing.assert_array_equal(ts.relu(i), np.maximum(i, 0))
    assert ts.relu(i).dtype == i.dtype
    z = rand((3, 2), "complex128")
    got = ts.abs(z)
    assert got.dtype == np.float64
    assert_close(got, np.abs(z), elementwise_tolerance(np.abs(z), np.float64))
    assert_close(ts.exp(z), np.exp(z), elementwise_tolerance(np.exp(z), np.complex128, roundings=4))


def softmax_rel_tol(x: np.ndarray, axes: tuple) -> np.ndarray:
    """Relative tolerance of a softmax over ``axes``, whose every value is positive (no cancellation):
    exp(x - max) carries its argument's rounding times |x - max| plus its own, the sum of K positive terms K
    roundings, the division one; doubled (eps = 2u) for a reference computed the same way."""
    k = math.prod(x.shape[a] for a in axes)
    spread = x.max(axis=axes, keepdims=True) - x
    return (spread + k + 4) * eps(x.dtype)


@pytest.mark.parametrize("over", [-1, 0, (0, 1)])
def test_softmax(s, over):
    x = rand((7, 9)) * 5
    axes = over if isinstance(over, tuple) else (over,)
    e = np.exp(x - x.max(axis=axes, keepdims=True))
    want = e / e.sum(axis=axes, keepdims=True)
    tol = softmax_rel_tol(x, tuple(a % x.ndim for a in axes)) * want
    assert_close(ts.softmax(x, over=over), want, tol)
    rel = ts.softmax(s.from_numpy(x, block_shape=(3, 4)), over=over)
    assert isinstance(rel, ts.TensorRelation)
    assert_close(rel.numpy(), want, tol)


def test_attention_block(s):
    """Multi-head attention as EinSum steps (docs "Einsum and numpy compatibility"), against numpy."""
    seq, dm, h, d = 6, 8, 2, 4
    Q, K, V = rand((seq, dm)), rand((seq, dm)), rand((seq, dm))
    WQ, WK, WV, WO = rand((dm, h, d)), rand((dm, h, d)), rand((dm, h, d)), rand((dm, h, d))
    qh = s.einsum("sa,ahd->shd", Q, WQ)
    kh = s.einsum("sa,ahd->shd", K, WK)
    vh = s.einsum("sa,ahd->shd", V, WV)
    t = s.map(s.einsum("shd,thd->hst", qh, kh), "scale", 1 / np.sqrt(d))
    p = ts.softmax(t, over=2)
    o = s.einsum("hst,thd->shd", p, vh)
    y = s.einsum("shd,ahd->sa", o, WO)
    qn, kn, vn = (np.einsum("sa,ahd->shd", A, W) for A, W in ((Q, WQ), (K, WK), (V, WV)))
    tn = np.einsum("shd,thd->hst", qn, kn) / np.sqrt(d)
    pn = np.exp(tn - tn.max(axis=2, keepdims=True))
    pn /= pn.sum(axis=2, keepdims=True)
    want = np.einsum("shd,ahd->sa", np.einsum("hst,thd->shd", pn, vn), WO)
    # tolerance: each step's error as a multiple c of eps times its magnitude (the same steps over absolute
    # values), carried forward: a contraction adds its K + 4; the softmax its spread + T + 4 plus twice the
    # largest error of its input row (p's relative error)
    e = eps(np.float64)
    mq, mk, mv = (np.einsum("sa,ahd->shd", np.abs(A), np.abs(W)) for A, W in ((Q, WQ), (K, WK), (V, WV)))
    c_qkv = dm + 4
    mt = np.einsum("shd,thd->hst", mq, mk) / np.sqrt(d)
    c_t = d + 4 + 2 * c_qkv
    c_p = 2 * c_t * mt.max(axis=2, keepdims=True) + softmax_rel_tol(tn, (2,)) / e
    mo = np.einsum("hst,thd->shd", pn, mv)
    c_o = seq + 4 + c_p.max() + c_qkv
    my = np.einsum("shd,ahd->sa", mo, np.abs(WO))
    assert_close(y.numpy(), want, (h * d + 4 + c_o) * e * my)


def test_threads_and_arrow_types(s):
    with ts.connect(threads=1) as one:
        assert one.executor.con.execute("SELECT current_setting('threads')").fetchone()[0] == 1
        assert ts.einsum("ij,jk", rand((3, 2)), rand((2, 3))).shape == (3, 3)
    assert isinstance(s.from_numpy(rand((2, 2))).to_arrow(), pa.Table)


def test_einsum_path_like_numpy():
    a, b, c = rand((3, 4)), rand((4, 5)), rand((5, 2))
    path, desc = ts.einsum_path("ij,jk,kl->il", a, b, c, optimize="optimal")
    assert path[0] == "einsum_path" and len(path) == 3
    assert "Complete contraction" in desc
    assert_einsum_close(ts.einsum("ij,jk,kl->il", a, b, c, optimize=path), "ij,jk,kl->il", a, b, c)


def test_opt_einsum_unicode_symbols_beyond_52_labels():
    """Einsum benchmark collections write big networks with opt_einsum's non-ASCII symbols."""
    import opt_einsum as oe
    import opt_einsum.testing

    eq, shapes = opt_einsum.testing.rand_equation(40, 3, seed=0, d_min=2, d_max=2, n_out=2)
    assert any(ord(c) > 127 for c in eq)
    ops = [rand(sh) for sh in shapes]
    # both along opt_einsum's "auto" path: K counts that path's sums, not the 2**58 terms of the whole sum
    assert_einsum_close(ts.einsum(eq, *ops), eq, *ops, want=oe.contract(eq, *ops), optimize="auto")


def test_numpy_keywords_out_order_casting():
    a, b = rand((3, 4)), rand((4, 5))
    out = np.empty((3, 5))
    assert ts.einsum("ij,jk->ik", a, b, out=out) is out
    assert_einsum_close(out, "ij,jk->ik", a, b)
    f = ts.einsum("ij,jk->ik", a, b, order="F")
    assert f.flags.f_contiguous
    got = ts.einsum("i,i", np.ones(3), np.ones(3), dtype=np.float32, casting="same_kind")
    assert got.dtype == np.float32 and got == 3
    with pytest.raises(ts.ShapeError, match=r"out= must be an ndarray of shape \(3, 5\)"):
        ts.einsum("ij,jk->ik", a, b, out=np.empty((2, 2)))
    with pytest.raises(ts.DTypeError, match="cannot be cast to out dtype"):
        ts.einsum("ij,jk->ik", a, b, out=np.empty((3, 5), dtype=np.int64))
    with pytest.raises(ts.DTypeError, match="casting='bogus'"):
        ts.einsum("ij,jk->ik", a, b, casting="bogus")


@pytest.mark.parametrize("optimize", [False, True])
def test_an_out_arrays_dtype_joins_the_operands(optimize):
    """numpy's einsum (its default optimize=False) computes in the result type of the operands and out=:
    int8 operands into an int64 out were summed in int8 and wrapped (80 for 50000)."""
    i8 = np.full(5, 100, dtype=np.int8)
    for spec, ops, out, want in (
        ("i,i->", (i8, i8), np.zeros((), np.int64), 50000),
        ("i->", (i8,), np.zeros((), np.float64), 500.0),
        ("i,i->", (i8 > 0, i8 > 0), np.zeros((), np.int64), 5),
        ("i->", (np.full(5, 99.9, np.float16),), np.zeros((), np.float32), np.float32(np.float16(99.9)) * 5),
    ):
        got = ts.einsum(spec, *ops, out=out, optimize=optimize)
        assert got is out and out.dtype == got.dtype
        np.testing.assert_allclose(out, want, rtol=1e-6)
        expr = ts.contract_expression(spec, *(o.shape for o in ops))
        again = np.zeros_like(out)
        expr(*ops, out=again)
        np.testing.assert_allclose(again, want, rtol=1e-6)
    with pytest.raises(ts.DTypeError, match="cannot be cast to out dtype"):
        ts.einsum("i->", np.full(3, 0.6), out=np.zeros((), np.int64))  # casting='safe' refuses float -> int
    got = ts.einsum("i->", np.full(3, 0.6), out=np.zeros((), np.int64), casting="unsafe")
    assert got == 1  # computed in float64, then cast as numpy casts


def test_casting_no_and_equiv_refuse_operands_of_other_dtypes():
    a32, a64 = np.ones((2, 2), np.float32), np.ones((2, 2))
    for casting in ("no", "equiv"):
        match = f"operand 0 of dtype float32 cannot be cast .* casting='{casting}'"
        with pytest.raises(ts.DTypeError, match=match):
            ts.einsum("ij,jk->ik", a32, a64, casting=casting)
        assert ts.einsum("ij,jk->ik", a64, a64, casting=casting).dtype == np.float64


def test_numpys_sum_and_prod_widen_small_integers(s):
    """np.sum / rel.sum() / prod of int8, int16, int32 (uint8 ...) accumulate in (u)int64, as numpy's."""
    for dtype in (np.int8, np.int16, np.int32, np.uint8, np.uint16, np.uint32, np.int64, np.uint64):
        info = np.iinfo(dtype)
        x = np.array([[info.max, info.max, 3], [2, info.max // 2, 1]], dtype=dtype)
        X = s.from_numpy(x)
        for got, want in (
            (np.sum(X), np.sum(x)),
            (X.sum(axis=0), x.sum(axis=0)),
            (X.prod(axis=1), x.prod(axis=1)),
            (np.max(X, axis=1), np.max(x, axis=1)),
        ):
            assert got.dtype == want.dtype, (dtype, got.dtype, want.dtype)
            np.testing.assert_array_equal(got.numpy(), want)


def test_compiled_inputs_narrowed_only_where_the_values_fit(s):
    """A compiled function casts an input to its placeholder's dtype of the same kind only where every value
    survives: 300 into int8 was 44, 1e300 into float32 was inf."""
    x8 = s.placeholder((3,), "int8", name="x")
    f = s.compile(x8 * 2, [x8])
    np.testing.assert_array_equal(f(np.array([1, 2, -3])), [2, 4, -6])  # int64 values that fit
    with pytest.raises(ts.DTypeError, match=r"input 0 \('x'\) of dtype int64 has values that int8 cannot"):
        f(np.array([300, 1, 2]))
    x32 = s.placeholder((2,), "float32", name="y")
    g = s.compile(x32 + 1, [x32])
    np.testing.assert_allclose(g(np.array([0.1, 2.5])), np.array([0.1, 2.5], np.float32) + 1)
    with pytest.raises(ts.DTypeError, match="float32 cannot hold"):
        g(np.array([1e300, 0.0]))


def test_a_read_only_view_of_a_writable_array_is_copied():
    """A read-only array of the caller's is copied: a read-only view of a writable array changes with it,
    a writable view made before the array was frozen still writes into it, and numpy lets the owner be made
    writable again (all three changed the relation). Memory a ``bytes`` object holds is
    viewed in place: nothing can change it."""
    base = np.arange(6.0)
    view = base.view()
    view.flags.writeable = False
    frozen = np.arange(6.0)
    older = frozen[:]  # writable, made before the owner was frozen
    frozen.flags.writeable = False
    thawed = np.arange(6.0)
    thawed.flags.writeable = False
    data = np.arange(6.0).tobytes()
    with ts.connect() as s:
        rels = [s.from_numpy(a) for a in (view, frozen, thawed, np.frombuffer(data))]
        base[:] = -1
        older[:] = 99
        thawed.flags.writeable = True
        thawed[:] = -7
        for rel in rels:
            np.testing.assert_array_equal(rel.numpy(), np.arange(6.0))
    assert arrow.immutable(np.frombuffer(data)) and not arrow.immutable(frozen)


def test_ranks_past_the_stored_limit():
    """A 63- or 64-d array is a relation (np.indices cannot make its keys: numpy has 64 dimensions at
    most); a stored tensor has at most 52 (its catalog entry), refused before anything is written."""
    with ts.connect() as s:
        for r in (63, 64):
            x = np.arange(2.0).reshape((1,) * (r - 1) + (2,))
            np.testing.assert_array_equal(s.from_numpy(x).numpy(), x)
        with pytest.raises(ts.ShapeError, match="at most 52 dimensions, this one has 53"):
            s.from_numpy(np.ones((1,) * 53)).save("deep")
        assert s.tables() == []


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.from_numpy(np.ones((2, 3)), block_shape=(True, 3)),
        lambda s: s.from_numpy(np.ones((2, 3)), blocks=(np.True_, 1)),
        lambda s: s.from_sql("SELECT 0, 1.0", (True,)),
    ],
)
def test_a_bool_is_not_a_size(call):
    with ts.connect() as s, pytest.raises(ts.ShapeError, match="is not a sequence of ints"):
        call(s)


def test_more_blocks_along_a_dimension_than_an_integer_key_holds():
    match = "more than the 2147483647 a dimension may have"
    with ts.connect() as s, pytest.raises(ts.ShapeError, match=match):
        s.from_sql("SELECT 0, 1.0", (2**40,), block_shape=(1,))


def test_sizes_given_as_generators():
    """Read once: the bool check had consumed a generator, which then gave no sizes (found by review)."""
    with ts.connect() as s:
        assert s.from_numpy(np.ones((4, 6)), block_shape=(b for b in (2, 3))).block_shape == (2, 3)
        assert s.from_numpy(np.ones((4, 6)), blocks=iter((2, 1))).block_shape == (2, 6)
        assert s.from_sql("SELECT 0, 1.0", (n for n in (4,))).shape == (4,)


@pytest.mark.parametrize("args", [(), (4,), (-1,), (1, 2), ((1, 0),), (0, -1)])
def test_item_is_numpys(s, args):
    """``item`` as numpy's: the one element, or the element an index names, as a Python scalar."""
    a = np.arange(6.0).reshape(2, 3)
    rel = s.from_numpy(a) * 2
    if args:
        got = rel.item(*args)
        assert got == (a * 2).item(*args) and type(got) is float
    else:
        assert rel[1, 2].item() == 10.0 and type(rel[1, 2].item()) is float
        assert s.from_numpy(np.array([7], dtype=np.int32)).item() == 7


@pytest.mark.parametrize(
    ("args", "error", "numpy_error", "match"),
    [
        ((), ts.ShapeError, ValueError, r"item\(\) of a relation of shape \(2, 3\): only a relation of one"),
        ((9,), ts.IndexingError, IndexError, r"item\(9,\) of a relation of shape \(2, 3\): index 9 is out"),
        ((1, 5), ts.IndexingError, IndexError, "index 5 is out of bounds for axis 1"),
        (("x",), ts.ShapeTypeError, TypeError, "cannot be interpreted as an integer"),
        ((1, 2, 3), ts.ShapeError, ValueError, "incorrect number of indices"),
    ],
)
def test_item_refuses_what_numpy_refuses(s, args, error, numpy_error, match):
    a = np.arange(6.0).reshape(2, 3)
    with pytest.raises(numpy_error):
        a.item(*args)
    with pytest.raises(error, match=match) as caught:
        s.from_numpy(a).item(*args)
    assert isinstance(caught.value, numpy_error)


def test_a_session_prints_what_it_is_on():
    s = ts.connect(threads=2)
    assert repr(s) == "<tensorsql.Session database=':memory:' threads=2 strategy='eindecomp' open>"
    s.close()
    assert repr(s).endswith(" closed>") and str(s) == repr(s)
