"""Kernels split over the database's threads (``loop_steps`` in loop_impl.hpp, ``apply_all`` in map.cpp,
``scaled_vectors``, tiny batches, packing and permutes in gemm.cpp) keep the promise the docs state under
"Numerics: results across thread counts":

- a result computed without a floating-point sum (maps, casts, joins that keep every label, max/min
  reductions, moves) and every integer result has the same bits on any number of threads;
- a float or complex sum (a contraction, a sum aggregation) is within its computation's rounding bound
  of the exact value on any number of threads, kernel path and CPU; its last bits may differ between
  thread counts (BLAS picks its kernels by the shape of each call, and a split changes those shapes).

Every test compares 1 and 4 threads and asserts exactly that, for every dtype it runs."""

from __future__ import annotations

import numpy as np
import pytest
import tolerance
from kernel_paths import duckdb_connect

import tensorsql as ts


def assert_thread_promise(got: list[np.ndarray], want: np.ndarray, tol: object, *, sums: bool) -> None:
    """``got``: one result per thread count. Integers and results with no float sum (``sums=False``): the
    same bits on every thread count, and ``want`` within ``tol`` (exactly, for integers). Float and complex
    sums: each result within ``tol`` of ``want`` (the computation's bound)."""
    exact_kind = np.asarray(got[0]).dtype.kind not in "fc"
    if exact_kind or not sums:
        for g in got[1:]:
            np.testing.assert_array_equal(g, got[0])
    if exact_kind:
        np.testing.assert_array_equal(got[0], want)
        return
    for threads, g in enumerate(got):
        tolerance.assert_close(g, want, tol, what=f"result {threads} of {len(got)}: ")


CASES = [
    # (equation, shapes, join, agg)
    ("abc,abc->abc", [(6, 300, 350), (6, 300, 350)], "add", "sum"),
    ("abc,ab->abc", [(6, 300, 350), (6, 300)], "subtract", "sum"),
    ("abc,c->abc", [(6, 300, 350), (350,)], "max", "sum"),
    ("abc,abc->abc", [(6, 300, 350), (6, 300, 350)], "multiply", "sum"),  # Hadamard: tiny batches
    ("abc,->abc", [(6, 300, 350), ()], "multiply", "sum"),  # a vector scaled: scaled_vectors
    (",ab->ab", [(), (700, 900)], "multiply", "sum"),
    ("ab,b->ab", [(900, 700), (700,)], "divide", "sum"),
    ("abc,abc->ab", [(6, 300, 350), (6, 300, 350)], "sqdiff", "sum"),
    ("abc->ab", [(6, 300, 350)], None, "max"),
    ("abc->ac", [(6, 300, 350)], None, "sum"),
    ("abc->cab", [(6, 300, 350)], None, "sum"),  # a transpose
    ("abc,abc->ab", [(6, 300, 350), (6, 300, 350)], "multiply", "sum"),  # dots along contiguous k
    ("ab,ab->b", [(700, 900), (700, 900)], "multiply", "sum"),  # dots along strided k: rows added
]


@pytest.fixture(scope="module")
def sessions():
    with ts.connect(threads=1) as one, ts.connect(threads=4) as four:
        yield one, four


def _joined(eq, arrays, join):
    """The join's values over every label (the sum's terms), in float64, and the labels' order."""
    ins, _ = eq.split("->")
    a, b = ins.split(",")
    labels = "".join(dict.fromkeys(a + b))

    def spread(arr, have):
        return arr.reshape([arr.shape[have.index(c)] if c in have else 1 for c in labels])

    x, y = spread(arrays[0], a), spread(arrays[1], b)
    joined = {
        "add": np.add,
        "subtract": np.subtract,
        "multiply": np.multiply,
        "divide": np.divide,
        "max": np.maximum,
        "sqdiff": lambda u, v: (u - v) ** 2,
    }[join](x, y)
    return np.broadcast_to(joined, [max(x.shape[i], y.shape[i]) for i in range(len(labels))]), labels


def _reference(eq, arrays, join, agg, dtype):
    """(numpy's value in float64, its tolerance, whether the result sums floats) of a join + aggregation
    (``join=None``: a unary reduction)."""
    wide = [a.astype(np.float64) for a in arrays]
    if join is None:
        terms, labels = wide[0], eq.split("->")[0]
    else:
        terms, labels = _joined(eq, wide, join)
    out = eq.split("->")[1]
    axes = tuple(i for i, c in enumerate(labels) if c not in out)
    reduced = {"sum": np.sum, "max": np.max}[agg](terms, axis=axes) if axes else terms
    kept = [c for c in labels if c in out]
    want = np.transpose(reduced, [kept.index(c) for c in out])
    sums = agg == "sum" and bool(axes)
    roundings = 0 if join is None else 2  # a join rounds once (sqdiff twice)
    if axes:
        tol = tolerance.reduction_tolerance(terms, agg, axes, dtype, roundings=roundings)
        tol = np.transpose(tol, [kept.index(c) for c in out])
    else:
        tol = tolerance.elementwise_tolerance(want, dtype, roundings=roundings)
    return want, tol, sums


@pytest.mark.parametrize(("eq", "shapes", "join", "agg"), CASES, ids=[c[0] + f":{c[2]}" for c in CASES])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_joins_and_reductions_over_threads(sessions, eq, shapes, join, agg, dtype):
    rng = np.random.default_rng(len(eq))
    arrays = [np.asarray(rng.standard_normal(shape) + 2.0, dtype=dtype) for shape in shapes]
    one, four = sessions
    kw = {"join": join, "agg": agg} if join is not None else {"agg": agg}
    got = [s.einsum(eq, *arrays, **kw, strategy="none").numpy() for s in (one, four)]
    want, tol, sums = _reference(eq, arrays, join, agg, dtype)
    assert_thread_promise(got, want, tol, sums=sums)


_MAPS = {
    "exp": np.exp,
    "neg": np.negative,
    "tanh": np.tanh,
    "sigmoid": lambda v: 1 / (1 + np.exp(-v)),
    "relu": lambda v: np.maximum(v, 0),
    "abs": np.abs,
    "square": np.square,
}
#: the maps each dtype takes (integers: the maps defined on integers)
_MAP_CASES = [
    *((fn, "float32") for fn in ("exp", "neg", "tanh", "sigmoid", "relu")),
    *((fn, "float64") for fn in ("exp", "tanh", "square")),
    *((fn, "complex128") for fn in ("exp", "neg", "abs")),
    *((fn, "int64") for fn in ("neg", "relu", "abs", "square")),
]


@pytest.mark.parametrize(("fn", "dtype"), _MAP_CASES)
def test_maps_split_over_threads(sessions, fn, dtype):
    """A map sums nothing: the same bits on 1 and 4 threads (560,000 elements: split over the threads)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((700, 800))
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(x.shape)
    x = (x * 1000).astype(dtype) if dtype == "int64" else x.astype(dtype)
    one, four = sessions
    got = [s.map(s.from_numpy(x), fn).numpy() for s in (one, four)]
    if dtype == "int64":
        with np.errstate(over="ignore"):
            want = _MAPS[fn](x)
    else:
        want = _MAPS[fn](x.astype(np.complex128 if dtype.startswith("complex") else np.float64))
    assert_thread_promise(got, want, tolerance.elementwise_tolerance(want, dtype), sums=False)


@pytest.mark.parametrize(
    ("eq", "shape"),
    [
        ("ab->b", (1000, 1030)),  # rows longer than a tile (512), a partial last tile
        ("ab->b", (37, 8)),  # the shortest rows summed as rows
        ("abc->bc", (5, 300, 70)),
        ("abc->c", (9, 40, 600)),
        ("abc->ac", (6, 300, 350)),  # a middle label summed: rows of c per a
        ("abcd->bd", (3, 20, 7, 64)),
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "int64"])
def test_sums_over_leading_labels_add_whole_rows(sessions, eq, shape, dtype):
    """A sum over labels before the output's last one adds whole rows of x (``sum_rows`` in loop_impl.hpp):
    within the pairwise bound (log2 n + 20)·eps·Σ|x| on 1 and 4 threads; integers exact."""
    rng = np.random.default_rng(sum(shape))
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    x = (x * 100).astype(dtype) if dtype == "int64" else x.astype(dtype)
    one, four = sessions
    got = [s.einsum(eq, x, strategy="none").numpy() for s in (one, four)]
    want = tolerance.einsum_reference(eq, x)
    terms = tolerance.summed_terms(eq, x)
    tol = (np.log2(max(2, terms)) + 20) * tolerance.eps(dtype) * tolerance.magnitude(eq, x)
    assert_thread_promise(got, want, tol, sums=True)


def test_a_long_column_sum_stays_pairwise_accurate(sessions):
    """2**20 rows of 0.1 in float32: added in order the error would be ~1e-2 relative; pairwise ~1e-6."""
    x = np.full((1 << 20, 8), 0.1, dtype=np.float32)
    one, _ = sessions
    got = one.einsum("ab->b", x, strategy="none").numpy()
    exact = float(np.float32(0.1)) * (1 << 20)
    assert np.abs(got.astype(np.float64) - exact).max() / exact < 1e-5


@pytest.mark.parametrize("eq", ["abc,abc->ab", "ab,ab->b", "ab,ab->a"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex128", "int64"])
def test_batched_dots_in_split_blocks(sessions, eq, dtype):
    """Batched dot products (``batched_dots`` in gemm.cpp) whose summed label is split into blocks: each
    block's dots accumulate into the group's output (the aggregate's accumulate path), numpy's values."""
    rng = np.random.default_rng(11)
    shape = (4, 90, 260) if eq.startswith("abc") else (260, 300)
    x, y = (rng.standard_normal(shape) for _ in range(2))
    if dtype.startswith("complex"):
        x, y = x + 1j * rng.standard_normal(shape), y - 1j * rng.standard_normal(shape)
    scale = 10 if dtype == "int64" else 1
    x, y = (x * scale).astype(dtype), (y * scale).astype(dtype)
    summed = next(c for c in eq.split("->")[0].split(",")[0] if c not in eq.split("->")[1])
    one, four = sessions
    got = [s.einsum(eq, x, y, blocks={summed: 3}).numpy() for s in (one, four)]
    got.append(one.einsum(eq, x, y, strategy="none").numpy())
    want = tolerance.einsum_reference(eq, x, y)
    assert_thread_promise(got, want, tolerance.einsum_tolerance(eq, x, y), sums=True)


_PACKING_REFERENCES: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}


@pytest.mark.parametrize(
    ("eq", "shapes"),
    [
        # batch b, x packed to [b, a, k] (576,000 elements: 2 threads), the [b, a, c] product unpacked to acb
        ("kab,cbk->acb", [(30, 96, 200), (60, 200, 30)]),
        ("zkab,cbk->zacb", [(1, 30, 96, 200), (60, 200, 30)]),  # a loop of size 1 outermost
        ("kab,cbk->acb", [(30, 3, 2000), (100, 2000, 30)]),  # the unpack's outermost loop has 3 pieces
        ("akb,kc->cba", [(64, 40, 256), (40, 64)]),  # x packed (a and b apart); the product is tiled
    ],
)
@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "int64", "int32"])
def test_packing_and_unpacking_split_over_threads(kernel_path, eq, shapes, dtype):
    """A contraction's operand packing and its product's permute into the output order (``permute_on`` in
    gemm.cpp) go over the call's threads when big (over 262,144 elements a thread), on every kernel path.
    A contraction is a sum: within the einsum bound on 1 and 4 threads (the tiled GEMM's last bits differed
    between thread counts on one AMD EPYC VM's OpenBLAS), integers exact. Called from SQL: a session hands
    the kernel its GEMM's own output order (result sinks)."""
    rng = np.random.default_rng(sum(map(sum, shapes)))
    arrays = [rng.standard_normal(s) for s in shapes]
    if dtype.startswith("complex"):
        arrays = [a + 1j * rng.standard_normal(a.shape) for a in arrays]
    if dtype.startswith("int"):
        arrays = [a * 30 for a in arrays]
    arrays = [a.astype(dtype) for a in arrays]
    out_shape = np.einsum(eq, *[np.zeros(a.shape, np.float32) for a in arrays]).shape
    got = []
    for threads in (1, 4):
        con = duckdb_connect(kernel_path, threads=threads)
        try:
            row = con.execute(
                "SELECT tensor_einsum(?, 'multiply', 'sum', ?, ?::BLOB, ?::BIGINT[], ?::BLOB, ?::BIGINT[])",
                [eq, dtype, *[v for a in arrays for v in (a.tobytes(), list(a.shape))]],
            ).fetchone()
        finally:
            con.close()
        got.append(np.frombuffer(row[0], dtype=dtype).reshape(out_shape))
    key = (eq, dtype, tuple(map(tuple, shapes)))
    if key not in _PACKING_REFERENCES:  # the same operands on every kernel path: computed once
        _PACKING_REFERENCES[key] = (
            tolerance.einsum_reference(eq, *arrays),
            tolerance.einsum_tolerance(eq, *arrays),
        )
    want, tol = _PACKING_REFERENCES[key]
    assert_thread_promise(got, want, tol, sums=True)
