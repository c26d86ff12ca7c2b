"""Python operators on relations against numpy: element-wise with broadcasting and scalars, matmul in every
rank combination, reductions, transpose, casts, numpy arrays on either side; a chain of them is one plan."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import tensorsql as ts
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T


@pytest.fixture(scope="module")
def s():
    with ts.connect() as session:
        yield session


def close(got: object, want: np.ndarray) -> None:
    arr = got.numpy() if isinstance(got, ts.TensorRelation) else np.asarray(got)
    want = np.asarray(want)
    assert arr.shape == want.shape and arr.dtype == want.dtype, (arr.shape, arr.dtype, want.shape, want.dtype)
    scale = max(1.0, float(np.abs(want).max(initial=0)))
    np.testing.assert_allclose(arr, want, rtol=1e-6, atol=1e-6 * scale)


RNG = np.random.default_rng(16)
X = RNG.standard_normal((4, 3))
Y = RNG.standard_normal((3,))
Z = RNG.uniform(0.5, 2.0, (2, 4, 3))

CASES = [
    ("x + y", lambda x, y, z: x + y),
    ("y + x", lambda x, y, z: y + x),
    ("x - z", lambda x, y, z: x - z),
    ("z * x", lambda x, y, z: z * x),
    ("x / z", lambda x, y, z: x / z),
    ("2 + x", lambda x, y, z: 2 + x),
    ("x - 0.5", lambda x, y, z: x - 0.5),
    ("3 * x", lambda x, y, z: 3 * x),
    ("1 / z", lambda x, y, z: 1 / z),
    ("x @ y", lambda x, y, z: x @ y),
    ("y @ x.T", lambda x, y, z: y @ x.T),
    ("x.T @ x", lambda x, y, z: x.T @ x),
    ("z @ y", lambda x, y, z: z @ y),
    ("z @ x.T", lambda x, y, z: z @ x.T),
    ("y @ y", lambda x, y, z: y @ y),
    ("-x", lambda x, y, z: -x),
    ("abs(x)", lambda x, y, z: abs(x)),
    ("z ** 2", lambda x, y, z: z**2),
    ("z ** 0.5", lambda x, y, z: z**0.5),
    ("x.sum()", lambda x, y, z: x.sum()),
    ("z.sum(axis=(0, 2))", lambda x, y, z: z.sum(axis=(0, 2))),
    ("z.max(1)", lambda x, y, z: z.max(1)),
    ("z.min(-1)", lambda x, y, z: z.min(-1)),
    ("z.prod(0)", lambda x, y, z: z.prod(0)),
    ("z.mean(axis=2)", lambda x, y, z: z.mean(axis=2)),
    ("z.T", lambda x, y, z: z.T),
    ("(x @ x.T + 1) * 2 - x.sum(1)", lambda x, y, z: (x @ x.T + 1) * 2 - x.sum(1)),
]


@pytest.mark.parametrize(("text", "fn"), CASES, ids=[c[0] for c in CASES])
def test_operators_match_numpy(s, text, fn):
    rels = [s.from_numpy(a, block_shape=tuple(max(1, n // 2) for n in a.shape)) for a in (X, Y, Z)]
    got = fn(*rels)
    assert isinstance(got, ts.TensorRelation), text
    close(got, fn(X, Y, Z))


def test_numpy_arrays_on_either_side_give_relations(s):
    x = s.from_numpy(X)
    for got, want in [
        (np.ones(3) + x, np.ones(3) + X),
        (Z - x, Z - X),
        (np.ones((2, 4)) @ x, np.ones((2, 4)) @ X),
        (x * np.float32(2), X * 2),
    ]:
        assert isinstance(got, ts.TensorRelation)
        close(got, want)
    # the ufuncs that are maps stay lazy relations (ts.grad sees them), in numpy's result dtype; others, and
    # those whose numpy dtype the map does not give (integer reciprocal), compute the relation
    pos = s.from_numpy(np.abs(X))
    for f in (np.exp, np.log, np.sqrt, np.absolute, np.negative, np.square, np.reciprocal, np.tanh):
        got = f(pos)
        assert isinstance(got, ts.TensorRelation) and got.dtype == f(np.abs(X)).dtype
        close(got, f(np.abs(X)))
    assert isinstance(np.power(x, 3), ts.TensorRelation)
    close(np.power(x, 3), X**3)
    z = (X + 1j * X[::-1]).astype(np.complex64)
    got = np.float_power(s.from_numpy(z), 2)
    assert got.dtype == np.float_power(z, 2).dtype == np.complex128
    close(got, np.float_power(z, 2))
    assert isinstance(np.sin(x), np.ndarray)
    np.testing.assert_allclose(np.sin(x), np.sin(X))
    ints = s.from_numpy(np.arange(1, 5))
    assert isinstance(np.reciprocal(ints), np.ndarray) and np.reciprocal(ints).dtype == np.int64
    assert isinstance(np.exp(ints), ts.TensorRelation) and np.exp(ints).dtype == np.float64


def test_result_dtypes_follow_numpy(s):
    f32 = s.from_numpy(X.astype(np.float32))
    i32 = s.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert (f32 + 2).dtype == np.float32  # a Python scalar is weak
    assert (f32 + 2.5).dtype == np.float32
    assert (i32 + 1).dtype == np.int32
    assert (i32 / 2).dtype == np.float64
    assert (f32 + np.ones(3, dtype=np.float64)).dtype == np.float64
    assert i32.astype("float32").dtype == np.float32
    close(i32.mean(0), np.arange(6, dtype=np.int32).reshape(2, 3).mean(0))
    close(i32.astype(np.int64) * 2**40, np.arange(6, dtype=np.int64).reshape(2, 3) * 2**40)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "int32", "int64"])
def test_squares_and_first_powers_take_numpys_fast_paths(s, dtype):
    """``x ** 2`` is numpy's ``np.square`` (x * x, not libm's pow), ``x ** 1`` is ``x``, and on floats and
    complex ``x ** 0.5`` and ``x ** -1`` are ``sqrt`` and ``reciprocal``: real and integer results are numpy's
    bit for bit (integers wrap as numpy's do), complex ones within their rounding; other exponents, and
    integers' fractional or negative ones, stay ``pow``."""
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((5, 4)) * 1e5).astype(dtype)
    if dtype.startswith("complex"):
        x = x + 1j * x[::-1]
    if dtype.startswith("int"):
        x = x * (2**20 if dtype == "int64" else 1)  # squares past the type's range wrap
    X_ = s.from_numpy(x)
    sq = X_**2
    assert isinstance(sq.node, E.Map) and sq.node.fn == "square"
    if dtype.startswith("complex"):  # z * z: each part a difference or sum of two rounded products
        bound = 4 * np.finfo(np.float32).eps * np.abs(x) ** 2
        assert np.all(np.abs(sq.numpy() - x**2) <= bound)
    else:
        np.testing.assert_array_equal(sq.numpy(), x**2)
    assert X_**1 is X_
    if dtype.startswith("int"):  # numpy: an integer array to a float power is float64 (int8 ** 2.0 no wrap)
        assert (X_**1.0).dtype == np.float64 and (X_**2.0).dtype == np.float64
        np.testing.assert_array_equal((X_**2.0).numpy(), x**2.0)
    else:
        assert X_**1.0 is X_
    if not dtype.startswith("int"):
        cube = X_**3
        assert isinstance(cube.node, E.Map) and (cube.node.fn, cube.node.param) == ("pow", 3.0)
        for e, fn in ((0.5, "sqrt"), (-1, "reciprocal")):  # numpy's own np.sqrt and np.reciprocal
            got = X_**e
            assert isinstance(got.node, E.Map) and got.node.fn == fn
            with np.errstate(invalid="ignore", divide="ignore"):  # roots of negatives: NaN, as numpy
                want = x**e
            if dtype.startswith("complex"):  # complex sqrt and division: within a few roundings of |result|
                assert np.all(np.abs(got.numpy() - want) <= 4 * np.finfo(np.float32).eps * np.abs(want))
            else:
                np.testing.assert_array_equal(got.numpy(), want)
        edges = np.array([-0.0, 4.0, np.inf], dtype=x.real.dtype)
        roots = (s.from_numpy(edges) ** 0.5).numpy()
        np.testing.assert_array_equal(roots, edges**0.5)  # [-0.0, 2, inf], as numpy
        assert np.signbit(roots[0])
    else:  # ** 0.5 promotes to float64 as numpy does, and is the square root of its values
        half = X_**0.5
        assert half.node.fn == "sqrt" and half.dtype == np.float64
        with np.errstate(invalid="ignore"):
            np.testing.assert_array_equal(half.numpy(), x**0.5)


def test_a_chain_of_operators_is_one_plan(s):
    x = s.from_numpy(X)
    rel = (x @ x.T + 1).sum(0)
    text = rel.explain()
    assert text.count("EinSum") >= 3
    assert "lazy (not computed)" in repr(rel) and "not planned yet" not in repr(rel)  # explain planned it


@pytest.mark.parametrize(
    ("fn", "error", "match"),
    [
        (lambda x: x + "a", ts.OperatorError, "dtype <U1"),
        (lambda x: x + object(), ts.OperatorError, "dtype object"),
        (lambda x: x + np.ones(4), ts.ShapeError, r"broadcast together with shapes \(4, 3\) \(4,\)"),
        (lambda x: x @ np.ones(5), ts.EinsumError, "size"),
        (lambda x: x @ 2.0, ts.ShapeError, "0-d"),
        # a size 1 against another: einsum broadcasts it, numpy's matmul refuses (it gave a * b.sum(0))
        (lambda x: x[:, :1] @ np.ones((3, 2)), ts.EinsumError, r"core dimensions differ in size \(1 against"),
        (lambda x: x[:, :1] @ x[:3], ts.EinsumError, r"\(1 against 3\)"),
        (lambda x: np.ones((2, 1)) @ x, ts.EinsumError, r"\(1 against 4\)"),
        (lambda x: x[0, :1] @ np.ones((3, 2)), ts.EinsumError, r"\(1 against 3\)"),
        (lambda x: np.ones(3) @ x[:1], ts.EinsumError, r"\(3 against 1\)"),
        (lambda x: x.sum(2), ts.ShapeError, "out of range"),
        (lambda x: x.sum((0, 0)), ts.ShapeError, "repeats"),
        (lambda x: x ** "2", ts.OperatorError, "exponent"),
        (lambda x: x.astype("float16"), ts.TensorSQLError, "float16"),
    ],
)
def test_bad_operands_give_typed_errors(s, fn, error, match):
    with pytest.raises(error, match=match):
        fn(s.from_numpy(X))


def test_operands_of_two_sessions(s):
    with ts.connect() as other, pytest.raises(ts.ShapeError, match="different sessions"):
        s.from_numpy(X) + other.from_numpy(X)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    shapes=st.lists(st.integers(1, 4), min_size=0, max_size=3).flatmap(
        lambda sh: st.tuples(st.just(tuple(sh)), st.lists(st.booleans(), min_size=len(sh), max_size=len(sh)))
    ),
    op=st.sampled_from(["+", "-", "*", "/"]),
    data=st.data(),
)
def test_broadcasting_matches_numpy(s, shapes, op, data):
    """Two operands whose shapes broadcast (some axes 1, some dropped from the front), any blocking."""
    shape, ones = shapes
    other = tuple(1 if one else n for n, one in zip(shape, ones, strict=True))
    other = other[data.draw(st.integers(0, len(other))) :]
    rng = np.random.default_rng(len(shape) + 10 * len(other))
    a, b = rng.uniform(0.5, 2.0, shape), rng.uniform(0.5, 2.0, other)
    ra = s.from_numpy(a, block_shape=tuple(data.draw(st.integers(1, n)) for n in shape))
    rb = s.from_numpy(b)
    got = {"+": ra + rb, "-": ra - rb, "*": ra * rb, "/": ra / rb}[op]
    want = {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[op]
    close(got, want)


def test_tables_with_details(s):
    s.save(s.from_numpy(X, block_shape=(2, 3)), "ops_x", replace=True)
    info = s.tables(details=True)
    row = info.filter(info.column("name").to_numpy(zero_copy_only=False) == "ops_x").to_pylist()[0]
    assert row == {"name": "ops_x", "shape": [4, 3], "dtype": "float64", "block_shape": [2, 3]}
    with pytest.raises(ts.ConfigError, match="details= must be a bool"):
        s.tables(details="yes")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_basic_indexing_matches_numpy(s, data):
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=1, max_size=3)))
    x = np.arange(float(np.prod(shape))).reshape(shape) - 3
    rel = s.from_numpy(x, block_shape=tuple(data.draw(st.integers(1, n)) for n in shape))
    # an index for the first `head` dimensions and the last `tail` ones, with '...' between them (or none)
    head = data.draw(st.integers(0, len(shape)))
    tail = data.draw(st.integers(0, len(shape) - head))
    ellipsis = tail > 0 or data.draw(st.booleans())

    def item(n: int) -> object:
        if data.draw(st.booleans()):
            return data.draw(st.integers(-n, n - 1))
        step = data.draw(st.sampled_from([None, 1, 2, -1, -2]))
        bounds = st.none() | st.integers(-n - 1, n + 1)
        return slice(data.draw(bounds), data.draw(bounds), step)

    key = [item(n) for n in shape[:head]]
    if ellipsis:
        key += [Ellipsis, *[item(n) for n in shape[len(shape) - tail :]]]
    want = x[tuple(key)]
    got = (rel * 1)[tuple(key)]  # a lazy relation: its restricted plan
    assert isinstance(got, ts.TensorRelation)
    np.testing.assert_array_equal(got.numpy(), want)
    np.testing.assert_array_equal(rel.head(2), x[:2])


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_slices_of_computed_relations_are_lazy_and_feed_later_steps(s, data):
    """A slice of an einsum result, sliced again, cut to other blocks and contracted: one plan, as numpy."""
    m, n = data.draw(st.integers(1, 9)), data.draw(st.integers(1, 9))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16)))
    a, b = rng.integers(-4, 5, (m, 5)).astype(float), rng.integers(-4, 5, (5, n)).astype(float)
    strategy = data.draw(st.sampled_from(["eindecomp", "sqrt", "data", "operands"]))
    A = s.from_numpy(a, block_shape=(data.draw(st.integers(1, m)), data.draw(st.integers(1, 5))))
    prod = s.einsum("ij,jk->ik", A, b, strategy=strategy)  # b: an array operand
    want = a @ b

    def key(shape):
        out = []
        for size in shape:
            if data.draw(st.booleans()) and size > 1:
                out.append(data.draw(st.integers(-size, size - 1)))
            else:
                bounds = st.none() | st.integers(-size - 1, size + 1)
                step = data.draw(st.sampled_from([None, 1, 2, 3, -1, -2]))
                out.append(slice(data.draw(bounds), data.draw(bounds), step))
        return tuple(out)

    k1 = key(want.shape)
    got, ref = prod[k1], want[k1]
    assert isinstance(got, ts.TensorRelation)
    if ref.size:
        assert isinstance(got.node, E.Slice) or (got is prod and ref.shape == want.shape)
        np.testing.assert_array_equal(got.numpy(), ref)
        k2 = key(ref.shape)
        again, ref2 = got[k2], ref[k2]
        if ref2.size:
            np.testing.assert_array_equal(again.numpy(), ref2)
            np.testing.assert_array_equal((again * 2).sum().numpy(), 2 * ref2.sum())
            if ref2.ndim:
                blocks = tuple(data.draw(st.integers(1, d)) for d in ref2.shape)
                np.testing.assert_array_equal(again.reblock(blocks).numpy(), ref2)
    else:
        np.testing.assert_array_equal(got.numpy(), ref)


def test_a_slice_is_a_step_of_the_plan_not_a_read(s):
    x = np.arange(60.0).reshape(6, 10)
    A = s.from_numpy(x, block_shape=(2, 5))
    before = set(s.tables())
    part = (A * 3)[1:5:2, ::-3]
    assert isinstance(part.node, E.Slice) and part.shape == (2, 4)
    sql = part.sql()
    assert "tensor_slice_strided" in sql and "BETWEEN 0 AND 1" in sql  # rows 1 and 3: row blocks 0..1 only
    assert set(s.tables()) == before  # nothing stored on the way
    np.testing.assert_array_equal(part.numpy(), 3 * x[1:5:2, ::-3])
    # sliced twice from one result: the blocks both need are computed once, for both
    prod = A * 2
    np.testing.assert_array_equal((prod[1:3] + prod[3:5]).numpy(), 2 * x[1:3] + 2 * x[3:5])
    # a slice read in the blocks its consumer wants: cut to them directly, no repartition step
    plan = s.einsum("ij,jk->ik", A[:, 1:9], s.from_numpy(np.ones((8, 3)), block_shape=(4, 3))).plan()
    rels, stack = [], [plan.tra]
    while stack:
        rels.append(stack.pop())
        stack.extend(T.inputs(rels[-1]))
    assert any(isinstance(r, T.Slice) for r in rels)
    assert not any(isinstance(r, T.Repartition) and isinstance(r.child, T.Slice) for r in rels)
    assert A[2:4].head(1).shape == (1, 10) and A[...] is A
    assert "Slice start:step:count [1:2:2, 9:-3:4]" in part.explain()


def test_a_slice_reads_only_the_blocks_that_hold_it(tmp_path):
    """The block outside the slice is corrupt: a full read fails on it, the slice and head never touch it."""
    with ts.connect(str(tmp_path / "slices.duckdb")) as s:
        x = np.arange(40.0).reshape(8, 5)
        s.save(s.from_numpy(x, block_shape=(4, 5)), "sliced")
        s.execute("UPDATE \"sliced\" SET tensor = tensor_from_list([1.0], 'float64') WHERE k0 = 1")
        with pytest.raises(ts.CorruptTableError):
            s.table("sliced").numpy()
        np.testing.assert_array_equal(s.table("sliced")[1:3, ::2].numpy(), x[1:3, ::2])
        np.testing.assert_array_equal((s.table("sliced") * 2)[:4].numpy(), 2 * x[:4])
        np.testing.assert_array_equal(s.table("sliced").head(3), x[:3])
        # several slices of one lazy result: the blocks between their first and last rows, once
        twice = s.table("sliced") * 2
        np.testing.assert_array_equal((twice[0:1] + twice[3:4]).numpy(), 2 * (x[0:1] + x[3:4]))
        # a step of any size reads its one element; numpy accepts steps beyond int64
        one = s.table("sliced")
        np.testing.assert_array_equal(one[::2**63, 1].numpy(), x[::2**63, 1])
        np.testing.assert_array_equal(one[3::-(10**20)].numpy(), x[3::-(10**20)])


@pytest.mark.parametrize(
    ("key", "error", "match"),
    [
        ((0, 0, 0), ts.ShapeError, "too many indices"),
        ((9,), ts.ShapeError, "out of bounds"),
        ((Ellipsis, Ellipsis), ts.ShapeError, "single ellipsis"),
        (([0, 1],), ts.OperatorError, "basic indexing"),
        ((None,), ts.OperatorError, "basic indexing"),
        ((1.5,), IndexError, "basic indexing"),  # numpy's IndexError for what it never takes
        (("a",), ts.IndexingError, "basic indexing"),
        ((slice(0.5, 2),), TypeError, "must be integers"),  # numpy: slice indices must be integers
    ],
)
def test_bad_indices_give_typed_errors(s, key, error, match):
    with pytest.raises(error, match=match):
        s.from_numpy(X)[key]
    with pytest.raises(ts.ConfigError, match="non-negative int"):
        s.from_numpy(X).head(-1)


def test_iteration_len_and_overflow(s):
    rel = s.from_numpy(X)
    rows = list(rel)
    assert len(rel) == 4 and len(rows) == 4
    np.testing.assert_array_equal(rows[2].numpy(), X[2])
    with pytest.raises(TypeError, match="0-d"):
        len(s.from_numpy(np.array(1.0)))
    with pytest.raises(ts.OperatorError, match="basic indexing"):
        rel[np.array([True, False, True, False])]
    with pytest.raises(ts.RangeError, match="does not fit"):
        s.from_numpy(np.arange(3, dtype=np.int32)) + 2**70


def test_comparisons_are_masks_in_the_operands_dtype(s):
    x = np.array([[1.0, np.nan, 3.0], [4.0, 0.0, -1.0]])
    y = np.array([2.0, 0.0, 3.0])
    rel = s.from_numpy(x, block_shape=(1, 2))
    for got, want in [
        (rel > y, x > y),
        (rel >= 0, x >= 0),
        (operator.lt(2, rel), operator.lt(2, x)),  # Python turns 2 < rel into rel > 2
        (operator.le(y, rel), operator.le(y, x)),  # numpy asks the relation: np.less_equal
        (rel.equal(y), x == y),
        (rel.not_equal(y), x != y),
        (np.less(y, rel), y < x),
    ]:
        assert isinstance(got, ts.TensorRelation) and got.dtype == np.float64
        np.testing.assert_array_equal(got.numpy(), want.astype(np.float64))
    i = s.from_numpy(np.arange(6, dtype=np.int32).reshape(2, 3))
    assert (i > 2).dtype == np.int32
    np.testing.assert_array_equal(((i > 2) * i).sum(1).numpy(), [0, 12])  # a mask selects
    assert rel == rel and hash(rel) is not None  # == stays identity: relations are dict keys


@pytest.mark.parametrize("fn", [np.sum, np.max, np.min, np.prod, np.mean])
def test_numpys_reductions_on_relations(s, fn):
    """numpy calls a relation's own sum/max/... with out=, dtype= and keepdims=: they raised TypeError."""
    x = np.arange(1.0, 25.0).reshape(2, 3, 4) / 7
    X = s.from_numpy(x)
    for axis in (None, 0, (0, 2), -1):
        for keepdims in (False, True):
            got = fn(X, axis=axis, keepdims=keepdims)
            assert isinstance(got, ts.TensorRelation)
            want = fn(x, axis=axis, keepdims=keepdims)
            np.testing.assert_allclose(got.numpy(), want, rtol=1e-12)
            assert got.shape == want.shape
    with pytest.raises(ts.OperatorError, match="out= is not supported"):
        fn(X, out=np.zeros(()))
    with pytest.raises(ts.OperatorError, match="keepdims must be True or False"):
        fn(X, keepdims="yes")
    if fn in (np.sum, np.prod, np.mean):
        assert fn(X, dtype=np.float32).dtype == "float32"
        ints = s.from_numpy(np.arange(6).reshape(2, 3))
        np.testing.assert_allclose(fn(ints, axis=1).numpy(), fn(np.arange(6).reshape(2, 3), axis=1))


def test_a_number_to_the_power_of_a_relation(s):
    """``base ** rel`` is libm's pow (the ``rpow`` map), as numpy's: it was exp(rel * ln base), NaN for
    ``1 ** inf`` and ``inf ** 0`` and up to 72 ulps off for ``10 ** float32``."""
    x = np.linspace(-2.0, 2.0, 7)
    X = s.from_numpy(x)
    np.testing.assert_allclose((2**X).numpy(), 2**x, rtol=1e-14)
    x32 = x.astype(np.float32)
    np.testing.assert_allclose((0.5 ** s.from_numpy(x32)).numpy(), 0.5**x32, rtol=1e-6)
    (g,) = ts.grad((3**X).sum(), [X])
    np.testing.assert_allclose(g.numpy(), np.log(3) * 3**x, rtol=1e-13)
    special = np.array([0.0, -0.0, 0.5, 2.0, -3.0, np.inf, -np.inf, np.nan])
    with np.errstate(all="ignore"):
        for base in (1.0, np.inf, -np.inf, 0.0, -2.0, 10.0, 2.0, np.nan):
            np.testing.assert_array_equal((base ** s.from_numpy(special)).numpy(), base**special)
    e32 = np.arange(-38, 39, dtype=np.float32)
    got, want = (10 ** s.from_numpy(e32)).numpy(), 10**e32  # libm's powf; numpy's own SIMD pow may differ
    assert got.dtype == np.float32 and np.all(np.abs(got - want) <= np.spacing(want))  # by an ulp, not 72
    np.testing.assert_array_equal((2.0 ** s.from_numpy(np.arange(60.0))).numpy(), 2.0 ** np.arange(60.0))
    wide = np.float64(2.0) ** s.from_numpy(x32)  # a numpy scalar promotes as numpy 2's does
    assert wide.dtype == np.float64 and (True ** s.from_numpy(x32)).dtype == np.float32
    want = np.float64(2.0) ** x32
    assert np.all(np.abs(np.asarray(wide) - want) <= np.spacing(want))
    want = np.float_power(3, x32)
    assert np.all(np.abs(np.asarray(np.float_power(3, s.from_numpy(x32))) - want) <= np.spacing(want))
    (g,) = ts.grad((0.0 ** X).sum(), [X])  # torch's: no gradient through a zero base
    np.testing.assert_array_equal(g.numpy(), np.zeros(7))
    with pytest.raises(ts.OperatorError, match="needs a real base, got"):
        (1 + 2j) ** X
    with pytest.raises(ts.OperatorError, match="cast it to float"):
        2 ** s.from_numpy(np.arange(3))
    with pytest.raises(ts.OperatorError, match="param '2' is not a number"):
        ts.pow(X, "2")
    with pytest.raises(ts.ShapeTypeError, match="axis True is not an integer"):
        ts.softmax(X, over=True)


def test_bool_and_float16_arrays_promote_against_a_relation(s):
    """No tensor is bool or float16: a mask or a float16 array beside a relation takes numpy's promotion
    (it was a DTypeError)."""
    a = np.arange(1.0, 7.0).reshape(2, 3)
    R = s.from_numpy(a)
    np.testing.assert_array_equal((R * (a > 2)).numpy(), a * (a > 2))
    np.testing.assert_array_equal((R * np.bool_(True)).numpy(), a)
    np.testing.assert_array_equal((R + np.ones(3, np.float16)).numpy(), a + 1)
    i = s.from_numpy(np.arange(6).reshape(2, 3))
    got = i * (a > 2)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got.numpy(), np.arange(6).reshape(2, 3) * (a > 2))


def test_integer_relations_divided_by_any_int_are_float64(s):
    """numpy's true division of integers is float64 whatever the int: uint8 / -1 was a RangeError."""
    a = np.array([1, 2, 250], np.uint8)
    R = s.from_numpy(a)
    for got, want in ((R / -1, a / -1), (R / 300, a / 300), (1000 / R, 1000 / a), (R / 2, a / 2)):
        assert got.dtype == want.dtype == np.float64
        np.testing.assert_allclose(got.numpy(), want, rtol=1e-15)


def test_integer_relations_compared_with_ints_beyond_their_dtype(s):
    """numpy answers uint8 > 300 with all False (it was a RangeError): a mask of the relation's dtype."""
    import operator

    a = np.array([0, 7, 255], np.uint8)
    R = s.from_numpy(a)
    for op in (operator.gt, operator.ge, operator.lt, operator.le):
        for v in (300, -1, 2**70):
            got = op(R, v)
            assert got.dtype == np.uint8
            np.testing.assert_array_equal(got.numpy(), op(a, v))
            np.testing.assert_array_equal(op(v, R).numpy(), op(v, a))
    np.testing.assert_array_equal(R.equal(300).numpy(), [0, 0, 0])
    np.testing.assert_array_equal(R.not_equal(-1).numpy(), [1, 1, 1])
    with pytest.raises(ts.RangeError):
        R + 300  # numpy raises OverflowError for arithmetic



# ---- numeric semantics against numpy -----------------------------------------------------------------------
def test_softmax_of_an_integer_relation_is_the_arrays(s):
    """X - max(X) ran in the relation's integer dtype (a scale by 1.0 kept int8): uint8 [3, 5] gave
    [nan, 0]."""
    for x in (np.array([[3, 5]], np.uint8), np.array([[-100, 100], [1, 2]], np.int8), np.array([[7, 9]])):
        for f in (ts.softmax, ts.log_softmax):
            got, want = f(s.from_numpy(x)).numpy(), f(x)
            assert got.dtype == want.dtype == np.result_type(x.dtype, np.float32)
            np.testing.assert_allclose(got, want, rtol=1e-6)
    z = np.array([[3.0, 5.0]])
    np.testing.assert_allclose(ts.softmax(s.from_numpy(np.array([[3, 5]], np.uint8))).numpy(),
                               np.exp(z) / np.exp(z).sum(), rtol=1e-6)  # fmt: skip


@pytest.mark.parametrize(
    ("x", "e"),
    [
        (np.array([7, 100, -3], np.int8), np.int64(3)),
        (np.array([200, 3], np.uint8), np.int8(2)),
        (np.array([1.5, 2.0], np.float32), np.float64(3.0)),
        (np.array([2, 3], np.int16), np.float32(0.5)),
        (np.array([2, 3], np.int8), 3),
        (np.array([2, 3], np.int8), 2.0),
    ],
)
def test_power_by_a_numpy_scalar_promotes_as_numpy(s, x, e):
    """numpy 2: a numpy scalar's dtype counts in full (int8 ** np.int64(3) is int64; it wrapped in int8)."""
    want = x**e
    for got in ((s.from_numpy(x) ** e).numpy(), np.power(s.from_numpy(x), e).numpy()):
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got, want, rtol=1e-6)


def test_mean_divides_by_the_count(s):
    """Times 1/count was an ulp off (mean(ones(49)) 0.9999999999999999), and truncated to 0 in int dtypes."""
    assert float(s.from_numpy(np.ones(49)).mean()) == 1.0
    assert float(s.from_numpy(np.full(3, 0.3)).mean()) == np.full(3, 0.3).mean()
    x = np.ones((4, 49), np.int32)
    np.testing.assert_array_equal(np.mean(s.from_numpy(x), axis=1, dtype=np.int32).numpy(), [1, 1, 1, 1])
    e = np.zeros((0, 3))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(s.from_numpy(e).mean(axis=0).numpy(), [np.nan] * 3)  # numpy's NaN


def test_small_numeric_cases(s):
    # bool ** -1 is an integer to a negative power: float64, as int8's (it was an int64 of garbage)
    got = ts.pow(np.array([True, False, True]), -1)
    assert got.dtype == np.float64 and got.tolist() == [1.0, np.inf, 1.0]
    # a scale by -0.0 keeps its sign (DuckDB read the literal -0.0 as a DECIMAL: +0); cached apart from 0.0
    for factor, want in ((-0.0, [-0.0, 0.0, -0.0]), (0.0, [0.0, -0.0, 0.0]), (-0.0, [-0.0, 0.0, -0.0])):
        got = ts.scale(np.array([1.0, -2.0, 0.0]), factor)
        assert np.signbit(got).tolist() == np.signbit(want).tolist()
    # softplus of a bool is float16, as exp's (a Python 0 in its numpy form made it float64)
    assert ts.softplus(np.array([True, False])).dtype == np.float16


def test_truth_and_scalar_conversions_are_by_value(s):
    """Truth came from __len__: bool(rel [0.0]) was True and `if rel.max() > 100:` always taken."""
    assert not s.from_numpy(np.array([0.0]))
    assert bool(s.from_numpy(np.array(2.0)) > 1) and not bool(s.from_numpy(np.array(2.0)) > 3)
    assert float(s.from_numpy(np.array([[2.5]]))) == 2.5 and int(s.from_numpy(np.array(7))) == 7
    assert complex(s.from_numpy(np.array(1.5))) == 1.5
    for shape in ((2,), (0,)):
        with pytest.raises(ts.ShapeError, match="truth value of several elements is ambiguous"):
            bool(s.from_numpy(np.ones(shape)))
    for convert in (float, int, complex):  # numpy's TypeError (bool's is its ValueError)
        with pytest.raises(ts.ShapeTypeError, match="only a relation of one element converts"):
            convert(s.from_numpy(np.ones(3)))


def test_index_and_axis_errors_are_numpys_classes(s):
    """An index out of bounds was a ShapeError only (a ValueError): ``except IndexError`` missed it."""
    x = s.from_numpy(np.zeros((7, 3)))
    for key in (7, -8, (0, 5), (0, 0, 0)):
        with pytest.raises(IndexError, match=r"out of bounds|too many indices") as err:
            x[key]
        assert isinstance(err.value, ts.ShapeError)
    with pytest.raises(IndexError, match="single ellipsis"):
        x[..., ...]
    with pytest.raises(IndexError, match="axis 2 is out of range"):  # numpy's AxisError is an IndexError
        x.sum(axis=2)
    with pytest.raises(TypeError, match=r"axis 1\.0 is not an integer"):
        x.sum(axis=1.0)


def test_ufuncs_with_an_array_or_numpy_scalar_first(s):
    """``np.maximum(array, rel)`` compared the array with the relation (``inputs == (rel,)``) and failed
    with bool() of a relation; a numpy scalar base ** a relation too."""
    x = np.array([0.0, 1.0, 2.0])
    rel = s.from_numpy(x)
    np.testing.assert_array_equal(np.maximum(x, rel), np.maximum(x, x))
    np.testing.assert_array_equal(np.arctan2(np.float32(1), rel), np.arctan2(np.float32(1), x))
    np.testing.assert_array_equal(np.hypot(x, rel), np.hypot(x, x))
    got = np.float64(2.0) ** rel
    np.testing.assert_array_equal(np.asarray(got), np.float64(2.0) ** x)


def test_reduction_arguments_a_relation_does_not_take(s):
    with pytest.raises(ts.OperatorError, match="initial= is not supported"):
        np.max(s.from_numpy(np.arange(4.0)), initial=5.0)
    with pytest.raises(ts.OperatorError, match="where= is not supported"):
        np.sum(s.from_numpy(np.arange(4.0)), where=np.arange(4) > 1)


def test_compile_refuses_an_input_twice_and_a_wrapping_integer(s):
    p = s.placeholder((2,), name="p")
    with pytest.raises(ts.ShapeError, match="input 1 is input 0 again"):
        s.compile(p + 1, inputs=[p, p])
    q = s.placeholder((2,), dtype="int8", name="q")
    f = s.compile(q.sum(), inputs=[q])
    assert f(np.array([100, 1], np.uint8)) == 101
    with pytest.raises(ts.DTypeError, match="int8 cannot hold"):  # uint8 200 is int8 -56: same width
        f(np.array([200, 1], np.uint8))
    r = s.placeholder((2,), dtype="int64", name="r")
    with pytest.raises(ts.DTypeError, match="int64 cannot hold"):  # 2**64 - 1 read as -1
        s.compile(r * 1, inputs=[r])(np.array([2**64 - 1, 5], np.uint64))


def _compare(a, b, op):
    """The relation's comparison ``op``: its operator, or its method (``==`` is Python's identity)."""
    if op in ("equal", "not_equal"):
        return getattr(a, op)(b)
    return {"gt": a.__gt__, "ge": a.__ge__, "lt": a.__lt__, "le": a.__le__}[op](b)


@pytest.mark.parametrize("op", ["gt", "ge", "lt", "le", "equal", "not_equal"])
def test_int64_against_uint64_compares_exactly(s, op):
    """numpy 2 compares them exactly; in their common float64, 2**62 + 1 > 2**62 was false."""
    i = np.array([2**62 + 1, 2**53 + 1, -5, 0, 2**63 - 1, -(2**63)], np.int64)
    u = np.array([2**62, 2**53, 3, 0, 2**63, 2**64 - 1], np.uint64)
    ref = getattr(np, {"gt": "greater", "ge": "greater_equal", "lt": "less", "le": "less_equal"}.get(op, op))
    for x, y in ((i, u), (u, i)):
        for got in (_compare(s.from_numpy(x), s.from_numpy(y), op), _compare(s.from_numpy(x), y, op)):
            assert got.dtype == np.float64
            np.testing.assert_array_equal(got.numpy(), ref(x, y).astype(np.float64))
    got = _compare(s.from_numpy(i[:, None]), s.from_numpy(u[None, :3]), op)
    np.testing.assert_array_equal(got.numpy(), ref(i[:, None], u[None, :3]).astype(np.float64))


def test_power_by_numpy_bool_and_float16_scalars_and_a_relation_as_a_param(s):
    """int8 ** np.float16(2) is float16 in numpy, float32 here (no relation holds float16); np.True_ is a
    weak 1; a relation as a map's param was computed while the graph was built (found by review)."""
    x = np.array([2, 3], np.int8)
    got = s.from_numpy(x) ** np.float16(2)
    assert got.dtype == np.float32 and got.numpy().tolist() == [4.0, 9.0]
    got = s.from_numpy(x) ** np.True_
    assert got.dtype == np.int8 and got.numpy().tolist() == [2, 3]
    with pytest.raises(ts.OperatorError, match="is not a number"):
        ts.scale(s.from_numpy(np.ones(2)), s.from_numpy(np.array(2.0)))


def test_operands_no_operator_takes_are_type_errors_like_numpys(s):
    """numpy raises TypeError for these; they were OperatorError (a ValueError) or a bare TypeError (a
    Fraction, len() of a 0-d tensor). OperatorTypeError is both a TypeError and an OperatorError."""
    from fractions import Fraction

    rel, scalar = s.from_numpy(X), s.from_numpy(np.array(3.0))
    for call, match in [
        (lambda: rel + None, "NoneType|dtype object"),
        (lambda: rel ** "a", "exponent must be a real number"),
        (lambda: rel + Fraction(1, 2), "Fraction"),
        (lambda: rel * np.array(["a"]), "dtype <U1"),
    ]:
        with pytest.raises(ts.OperatorTypeError, match=match) as info:
            call()
        assert isinstance(info.value, TypeError) and isinstance(info.value, ts.OperatorError)
    for call in (lambda: len(scalar), lambda: iter(scalar)):
        with pytest.raises(ts.ShapeTypeError, match="0-d tensor"):
            call()
