"""SQL-level tests of the tensorsql_kernels DuckDB extension (udf_kernels), against numpy.

Every function is called directly from SQL in a fresh connection created with
``config={"allow_unsigned_extensions": "true"}``.
"""

from __future__ import annotations

import warnings

import duckdb
import numpy as np
import pytest
import tolerance
from kernel_paths import default_kernel_path, duckdb_connect, supported_kernel_paths
from tolerance import elementwise_tolerance, reduction_tolerance

import udf_kernels

DTYPES = ["float32", "float64", "int32", "int64", "complex64", "complex128"]
REAL = ["float32", "float64", "int32", "int64"]
COMPLEX = ["complex64", "complex128"]
JOINS = ["multiply", "add", "subtract", "divide", "sqdiff", "absdiff", "max", "min"]
AGGS = ["sum", "max", "min", "prod"]


# ---------------------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ext_path():
    return udf_kernels.extension_path()


def _fresh_connection():
    c = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(c)
    return c


@pytest.fixture
def con(ext_path):
    """A fresh connection per test (for tests that create tables or change settings)."""
    c = _fresh_connection()
    yield c
    c.close()


@pytest.fixture(scope="module")
def scon(ext_path):
    """One fresh connection shared by the stateless (SELECT-only) parametrized tests of this module."""
    c = _fresh_connection()
    yield c
    c.close()


@pytest.fixture(scope="module")
def gcon(ext_path, kernel_path):
    """scon for the GEMM tests: one connection per kernel path of the machine (TENSORSQL_KERNEL_PATH)."""
    c = duckdb_connect(kernel_path)
    yield c
    c.close()


def np_dtype(dtype: str) -> np.dtype:
    return np.dtype(dtype).newbyteorder("<")


def blob(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=np_dtype(a.dtype.name)).tobytes()


def unblob(b: bytes, dtype: str, shape) -> np.ndarray:
    return np.frombuffer(b, dtype=np_dtype(dtype)).reshape(shape)


def rand(shape, dtype: str, rng: np.random.Generator, positive: bool = False) -> np.ndarray:
    shape = tuple(shape)
    if dtype.startswith("int"):
        lo = 1 if positive else -5
        return rng.integers(lo, 6, size=shape).astype(dtype)
    lo = 0.5 if positive else -2.0
    re = rng.uniform(lo, 2.0, size=shape)
    if dtype.startswith("complex"):
        return (re + 1j * rng.uniform(lo, 2.0, size=shape)).astype(dtype)
    return re.astype(dtype)


def assert_close(got: np.ndarray, want: np.ndarray, dtype: str, tol=None) -> None:
    """Integers exactly; floats within ``tol``, a tolerance derived from the computation (tests/tolerance.py:
    einsum_tol below for einsums, elementwise_tolerance, reduction_tolerance)."""
    assert got.shape == want.shape
    if dtype.startswith("int"):
        np.testing.assert_array_equal(got, want)
        return
    assert tol is not None, "a float comparison needs a tolerance derived from the computation"
    tolerance.assert_close(got, want, tol)


def uniq(labels: str) -> str:
    return "".join(dict.fromkeys(labels))


def _diag(x: np.ndarray, labels: str) -> np.ndarray:
    """Collapse repeated labels (diagonal) of one operand; result axes follow uniq(labels)."""
    return np.einsum(f"{labels}->{uniq(labels)}", x) if labels != uniq(labels) else x


def _to_space(x: np.ndarray, labels: str, space: str, sizes: dict) -> np.ndarray:
    """Transpose/reshape an operand (distinct labels) so it broadcasts over the label space."""
    order = [labels.index(c) for c in space if c in labels]
    t = np.transpose(x, order) if order else x
    return t.reshape([sizes[c] if c in labels else 1 for c in space])


def int_div(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    safe = np.where(b == 0, 1, b)
    q = np.abs(a) // np.abs(safe)
    q = np.where((a < 0) != (safe < 0), -q, q).astype(a.dtype)
    return np.where(b == 0, 0, q).astype(a.dtype)


def join_ref(join: str, x: np.ndarray, y: np.ndarray, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        if join == "multiply":
            return x * y
        if join == "add":
            return x + y
        if join == "subtract":
            return x - y
        if join == "divide":
            return int_div(*np.broadcast_arrays(x, y)) if dtype.startswith("int") else x / y
        if join == "sqdiff":
            return (x - y) * (x - y)
        if join == "absdiff":
            return np.abs(x - y)
        if join == "max":
            return np.maximum(x, y)
        return np.minimum(x, y)


def agg_ref(agg: str, z: np.ndarray, axes: tuple, dtype: str) -> np.ndarray:
    dt = np_dtype(dtype)
    if agg == "sum":
        return np.sum(z, axis=axes, dtype=dt)
    if agg == "prod":
        return np.prod(z, axis=axes, dtype=dt)
    if dtype.startswith("int"):
        info = np.iinfo(dt)
        lo, hi = info.min, info.max
    else:
        lo, hi = -np.inf, np.inf
    if agg == "max":
        return np.max(z, axis=axes, initial=lo)
    return np.min(z, axis=axes, initial=hi)


def einsum_space(spec: str, join: str, dtype: str, x: np.ndarray, y=None) -> tuple[np.ndarray, str, str]:
    """(the join's values over the whole label space, the space's labels, the output's labels)."""
    lhs, out = spec.split("->")
    ins = lhs.split(",")
    ops = [x] if y is None else [x, y]
    sizes: dict = {}
    for labels, op in zip(ins, ops, strict=True):
        sizes.update(zip(labels, op.shape, strict=True))
    space = uniq("".join(ins))
    b = [
        _to_space(_diag(op, labels), uniq(labels), space, sizes) for labels, op in zip(ins, ops, strict=True)
    ]
    z = b[0] if y is None else join_ref(join, b[0], b[1], dtype)
    return np.broadcast_to(z, [sizes[c] for c in space]), space, out


def einsum_ref(spec: str, join: str, agg: str, dtype: str, x: np.ndarray, y=None) -> np.ndarray:
    z, space, out = einsum_space(spec, join, dtype, x, y)
    agg_axes = tuple(i for i, c in enumerate(space) if c not in out)
    kept = [c for c in space if c in out]
    if agg_axes:
        z = agg_ref(agg, z, agg_axes, dtype)
    z = np.transpose(z, [kept.index(c) for c in out]) if out else z
    return np.asarray(z, dtype=np_dtype(dtype))


# Rounded operations in one join value computed from exact inputs (complex ones take two more).
JOIN_ROUNDINGS = {"multiply": 1, "add": 1, "subtract": 1, "divide": 1, "sqdiff": 2, "absdiff": 1, "max": 0,
                  "min": 0, "": 0}


def join_terms(spec: str, join: str, dtype: str, x: np.ndarray, y=None) -> np.ndarray:
    """The join's values at reference precision as (output shape..., K): the K values the agg reduces into
    each output element."""
    wide = "complex128" if dtype in COMPLEX else "float64"
    z, space, out = einsum_space(spec, join, wide, x.astype(wide), None if y is None else y.astype(wide))
    order = [space.index(c) for c in out] + [i for i, c in enumerate(space) if c not in out]
    z = np.transpose(z, order)
    k = int(np.prod(z.shape[len(out) :]))
    return z.reshape(*z.shape[: len(out)], k)


def einsum_tol(agg: str, dtype: str, *contributions) -> np.ndarray | float:
    """Tolerance of a block einsum, or of several whose values one aggregate combines into one block:
    ``contributions`` are (spec, join, x, y) with the same output; tolerance.reduction_tolerance over all
    their join values (an einsum's K products, times the rows of a fused aggregate)."""
    if dtype.startswith("int"):
        return 0.0
    r = max(JOIN_ROUNDINGS[join] for _, join, _, _ in contributions) + (2 if dtype in COMPLEX else 0)
    if agg != "sum":
        terms = [join_terms(spec, join, dtype, x, y) for spec, join, x, y in contributions]
        return reduction_tolerance(np.concatenate(terms, axis=-1), agg, -1, dtype, roundings=r)
    # sums: the einsum rule over all contributions, (K + r + 2)·eps·Σ|terms|; for products without forming
    # every term (tolerance.magnitude: the einsum of the absolute values)
    k, mag = 0, 0.0
    for spec, join, x, y in contributions:
        ops = [x] if y is None else [x, y]
        if join in ("multiply", ""):
            k += tolerance.summed_terms(spec, *ops)
            mag = mag + tolerance.magnitude(spec, *ops)
        else:
            t = join_terms(spec, join, dtype, x, y)
            k += t.shape[-1]
            mag = mag + np.abs(t).sum(axis=-1)
    return (k + r + 2) * tolerance.eps(dtype) * mag + np.finfo(np_dtype(dtype)).tiny


def sql_einsum(con, spec, join, agg, dtype, x, y):
    row = con.execute(
        "SELECT tensor_einsum(?, ?, ?, ?, ?::BLOB, ?::BIGINT[], ?::BLOB, ?::BIGINT[])",
        [spec, join, agg, dtype, blob(x), list(x.shape), blob(y), list(y.shape)],
    ).fetchone()
    return row[0]


def sql_einsum1(con, spec, agg, dtype, x):
    return con.execute(
        "SELECT tensor_einsum1(?, ?, ?, ?::BLOB, ?::BIGINT[])", [spec, agg, dtype, blob(x), list(x.shape)]
    ).fetchone()[0]


def out_shape(spec: str, *ops: np.ndarray) -> tuple:
    lhs, out = spec.split("->")
    sizes: dict = {}
    for labels, op in zip(lhs.split(","), ops, strict=True):
        sizes.update(zip(labels, op.shape, strict=True))
    return tuple(sizes[c] for c in out)


def shape_for(labels: str, sizes: dict) -> tuple:
    return tuple(sizes[c] for c in labels)


# ---------------------------------------------------------------------------------------------------------
# loading and small functions
# ---------------------------------------------------------------------------------------------------------


def test_load_and_version(con, ext_path):
    assert ext_path.name == "tensorsql_kernels.duckdb_extension"
    assert ext_path.read_bytes()[-256:] == b"\0" * 256  # unsigned: zero signature
    assert con.execute("SELECT tensorsql_kernels_version()").fetchone()[0] == "0.1.0"
    udf_kernels.load(con)  # loading twice is harmless
    assert set(udf_kernels.SQL_FUNCTIONS) >= {"tensor_einsum", "tensor_pack", "tensor_assemble"}
    names = {r[0] for r in con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()}
    assert set(udf_kernels.SQL_FUNCTIONS) <= names


def test_load_requires_unsigned_config(ext_path):
    c = duckdb.connect()
    with pytest.raises(udf_kernels.KernelLoadError, match="allow_unsigned_extensions"):
        udf_kernels.load(c)


def test_footer_layout(ext_path):
    from udf_kernels import build

    meta = ext_path.read_bytes()[-512:-256]
    fields = [meta[i * 32 : (i + 1) * 32].rstrip(b"\0").decode() for i in range(8)][::-1]
    assert fields[0] == "4"
    assert fields[1] == duckdb.connect().execute("PRAGMA platform").fetchone()[0]
    assert fields[2] == build.c_api_version_string()
    assert fields[3] == "0.1.0"
    assert fields[4] == "C_STRUCT"
    assert fields[5:] == ["", "", ""]
    assert build.is_current()


@pytest.mark.parametrize("dtype", DTYPES)
def test_itemsize_numel_check(scon, dtype):
    x = rand((2, 3), dtype, np.random.default_rng(0))
    size = np.dtype(dtype).itemsize
    assert scon.execute("SELECT tensor_itemsize(?)", [dtype]).fetchone()[0] == size
    assert scon.execute("SELECT tensor_numel(?::BLOB, ?)", [blob(x), dtype]).fetchone()[0] == 6
    q = "SELECT tensor_check(?::BLOB, ?, ?::BIGINT[])"
    assert scon.execute(q, [blob(x), dtype, [2, 3]]).fetchone()[0] is True
    assert scon.execute(q, [blob(x), dtype, [3, 2]]).fetchone()[0] is True
    assert scon.execute(q, [blob(x), dtype, [2, 4]]).fetchone()[0] is False
    assert scon.execute(q, [blob(x)[:-1], dtype, [2, 3]]).fetchone()[0] is False
    assert scon.execute(q, [blob(x), dtype, [-2, -3]]).fetchone()[0] is False
    assert scon.execute(q, [blob(x), dtype, [2**62, 2**62]]).fetchone()[0] is False
    assert scon.execute(q, [blob(x), dtype, [6]]).fetchone()[0] is True


def test_numel_errors(con):
    with pytest.raises(
        duckdb.Error, match=r"tensor_numel: operand x has 7 bytes, not a multiple of the 4-byte"
    ):
        con.execute("SELECT tensor_numel(?::BLOB, 'float32')", [b"\0" * 7]).fetchall()
    with pytest.raises(duckdb.Error, match=r"unknown dtype 'float16' \(valid: float32, float64, int32"):
        con.execute("SELECT tensor_itemsize('float16')").fetchall()


@pytest.mark.parametrize("dtype", DTYPES)
def test_zeros(scon, dtype):
    for shape in ([2, 3], [], [0, 4], [5]):
        b = scon.execute("SELECT tensor_zeros(?, ?::BIGINT[])", [dtype, shape]).fetchone()[0]
        np.testing.assert_array_equal(unblob(b, dtype, shape), np.zeros(shape, dtype=dtype))


def test_shape_literals_and_integer_lists(con):
    # [2,3] literal (INTEGER[]), the empty list, and INTEGER-column expressions all cast to BIGINT[]
    assert len(con.execute("SELECT tensor_zeros('float64', [2,3])").fetchone()[0]) == 48
    assert len(con.execute("SELECT tensor_zeros('float64', [])").fetchone()[0]) == 8
    rows = con.execute(
        "SELECT k0, octet_length(tensor_zeros('float32', [least(2, 5 - 2*k0)])) "
        "FROM (SELECT range::INTEGER AS k0 FROM range(3)) ORDER BY k0"
    ).fetchall()
    assert rows == [(0, 8), (1, 8), (2, 4)]
    x = np.arange(6, dtype=np.float64)
    b = con.execute(
        "SELECT tensor_einsum1('ij->ji', 'sum', 'float64', ?::BLOB, [2, 3])", [blob(x)]
    ).fetchone()[0]
    np.testing.assert_array_equal(unblob(b, "float64", (3, 2)), x.reshape(2, 3).T)
    b = con.execute(
        "SELECT tensor_einsum1('ij->ji', 'sum', 'float64', ?::BLOB, [k::INTEGER, 3::INTEGER]) "
        "FROM (SELECT 2 AS k)",
        [blob(x)],
    ).fetchone()[0]
    np.testing.assert_array_equal(unblob(b, "float64", (3, 2)), x.reshape(2, 3).T)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_list_roundtrip_and_get(scon, dtype):
    # dtypes whose values are all exactly DOUBLEs (int64: tensor_to_bigint_list, tests/api/test_numerics.py)
    x = rand((2, 3), dtype, np.random.default_rng(1))
    got = scon.execute("SELECT tensor_to_list(?::BLOB, ?)", [blob(x), dtype]).fetchone()[0]
    np.testing.assert_array_equal(got, x.ravel().astype(np.float64))
    b = scon.execute(
        "SELECT tensor_from_list(?::DOUBLE[], ?)", [[float(v) for v in x.ravel()], dtype]
    ).fetchone()[0]
    np.testing.assert_array_equal(unblob(b, dtype, (2, 3)), x)
    for idx in ([0, 0], [1, 2], [0, 1]):
        v = scon.execute(
            "SELECT tensor_get(?::BLOB, ?, [2, 3], ?::BIGINT[])", [blob(x), dtype, idx]
        ).fetchone()[0]
        assert v == float(x[tuple(idx)])
    with pytest.raises(duckdb.Error, match=r"tensor_get: index \[2,0\] is out of bounds for shape \[2,3\]"):
        scon.execute("SELECT tensor_get(?::BLOB, ?, [2, 3], [2, 0])", [blob(x), dtype]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_get: index \[1\] does not have the rank"):
        scon.execute("SELECT tensor_get(?::BLOB, ?, [2, 3], [1])", [blob(x), dtype]).fetchall()


def test_list_functions_reject_complex(con):
    x = np.ones(2, dtype=np.complex64)
    with pytest.raises(duckdb.Error, match="tensor_to_list: dtype complex64 is complex"):
        con.execute("SELECT tensor_to_list(?::BLOB, 'complex64')", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match="tensor_from_list: dtype complex128 is complex"):
        con.execute("SELECT tensor_from_list([1.0], 'complex128')").fetchall()
    with pytest.raises(duckdb.Error, match="tensor_get: dtype complex64 is complex"):
        con.execute("SELECT tensor_get(?::BLOB, 'complex64', [2], [0])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match="tensor_from_list: values contains NULL"):
        con.execute("SELECT tensor_from_list([1.0, NULL], 'float64')").fetchall()


def test_to_list_many_rows(con):
    con.execute(
        "CREATE TABLE t AS SELECT i, tensor_from_list([i::DOUBLE, i + 0.5], 'float64') AS b "
        "FROM range(5000) r(i)"
    )
    rows = con.execute("SELECT i, tensor_to_list(b, 'float64') FROM t ORDER BY i").fetchall()
    assert all(v == [float(i), i + 0.5] for i, v in rows)


# ---------------------------------------------------------------------------------------------------------
# tensor_slice
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice(scon, dtype):
    rng = np.random.default_rng(2)
    x = rand((4, 5, 3), dtype, rng)
    cases = [([0, 0, 0], [4, 5, 3]), ([1, 2, 0], [3, 5, 2]), ([3, 0, 1], [4, 1, 2]), ([2, 2, 2], [2, 4, 3])]
    for start, stop in cases:
        b = scon.execute(
            "SELECT tensor_slice(?, ?::BLOB, [4, 5, 3], ?::BIGINT[], ?::BIGINT[])",
            [dtype, blob(x), start, stop],
        ).fetchone()[0]
        want = x[tuple(slice(a, c) for a, c in zip(start, stop, strict=True))]
        np.testing.assert_array_equal(unblob(b, dtype, want.shape), want)
    s = np.array(7, dtype=dtype)
    b = scon.execute("SELECT tensor_slice(?, ?::BLOB, [], [], [])", [dtype, blob(s)]).fetchone()[0]
    assert unblob(b, dtype, ()) == s


def test_slice_errors(con):
    x = np.zeros((4, 5))
    with pytest.raises(duckdb.Error, match=r"tensor_slice: slice \[0,0\]:\[5,5\] is out of bounds .*dim 0"):
        con.execute("SELECT tensor_slice('float64', ?::BLOB, [4,5], [0,0], [5,5])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match="out of bounds"):
        con.execute("SELECT tensor_slice('float64', ?::BLOB, [4,5], [-1,0], [2,2])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match="out of bounds"):
        con.execute("SELECT tensor_slice('float64', ?::BLOB, [4,5], [3,0], [2,2])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match="must both have the rank of x_shape"):
        con.execute("SELECT tensor_slice('float64', ?::BLOB, [4,5], [0], [2])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_slice: operand x has 160 bytes but shape \[4,6\]"):
        con.execute("SELECT tensor_slice('float64', ?::BLOB, [4,6], [0,0], [1,1])", [blob(x)]).fetchall()


@pytest.mark.parametrize("dtype", DTYPES)
def test_slice_strided_matches_numpy(scon, dtype):
    """Every (start, count, step) per dimension that stays inside x, against numpy's basic slicing."""
    rng = np.random.default_rng(3)
    x = rand((4, 5, 3), dtype, rng)
    for _ in range(40):
        start, count, step = [], [], []
        for n in x.shape:
            st = int(rng.choice([-3, -2, -1, 1, 2, 3]))
            a = int(rng.integers(0, n))
            room = (n - 1 - a) // st if st > 0 else a // -st
            start.append(a)
            step.append(st)
            count.append(int(rng.integers(0, room + 2)))
        b = scon.execute(
            "SELECT tensor_slice_strided(?, ?::BLOB, [4, 5, 3], ?::BIGINT[], ?::BIGINT[], ?::BIGINT[])",
            [dtype, blob(x), start, count, step],
        ).fetchone()[0]
        want = x[np.ix_(*[a + st * np.arange(c) for a, c, st in zip(start, count, step, strict=True)])]
        np.testing.assert_array_equal(unblob(b, dtype, want.shape), want)
    s = np.array(7, dtype=dtype)
    query = "SELECT tensor_slice_strided(?, ?::BLOB, [], [], [], [])"
    b = scon.execute(query, [dtype, blob(s)]).fetchone()[0]
    assert unblob(b, dtype, ()) == s


@pytest.mark.parametrize(
    ("start", "count", "step", "match"),
    [
        ([0, 0], [5, 1], [1, 1], r"start 0, count 5, step 1 reads outside x_shape \[4,5\] \(dim 0\)"),
        ([3, 0], [3, 1], [-2, 1], r"reads outside x_shape \[4,5\] \(dim 0\)"),
        ([-1, 0], [1, 1], [1, 1], r"start -1, count 1, step 1 reads outside"),
        ([4, 0], [1, 1], [1, 1], "reads outside"),
        ([0, 0], [2, 1], [1, 0], r"count 1 and step 0 \(dim 1\) need count >= 0 and step != 0"),
        ([0, 0], [-1, 1], [1, 1], "need count >= 0"),
        ([1, 0], [2, 1], [-(2**63), 1], "reads outside"),
        ([0, 0], [2, 1], [2**62, 1], "reads outside"),
        ([0], [1], [1], "must all have the rank of x_shape"),
    ],
)
def test_slice_strided_errors(con, start, count, step, match):
    x = np.zeros((4, 5))
    with pytest.raises(duckdb.Error, match=match):
        con.execute(
            "SELECT tensor_slice_strided('float64', ?::BLOB, [4,5], ?::BIGINT[], ?::BIGINT[], ?::BIGINT[])",
            [blob(x), start, count, step],
        ).fetchall()


def test_slice_strided_checks_the_blob(con):
    x = np.zeros((4, 5))
    match = r"tensor_slice_strided: operand x has 160 bytes but shape \[4,6\]"
    with pytest.raises(duckdb.Error, match=match):
        con.execute(
            "SELECT tensor_slice_strided('float64', ?::BLOB, [4,6], [0,0], [1,1], [1,1])", [blob(x)]
        ).fetchall()


# ---------------------------------------------------------------------------------------------------------
# tensor_einsum / tensor_einsum1
# ---------------------------------------------------------------------------------------------------------

MULT_SPECS = [
    "ij,jk->ik",
    "ij,jk->ki",
    "i,i->",
    "ij,ij->ij",
    "ij,ij->ji",
    "ii,i->i",
    "ii,jj->",
    ",ij->ij",
    ",->",
    "bij,bjk->bik",
    "ij,kl->ijkl",
    "ijk,kj->i",
    "i,j->",
    "aB,Bc->ca",
    "ij,jk->",
]
SIZES = {"i": 3, "j": 4, "k": 2, "l": 3, "b": 2, "a": 3, "B": 5, "c": 2}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", MULT_SPECS)
def test_einsum_multiply_sum_matches_np_einsum(gcon, spec, dtype):
    rng = np.random.default_rng(abs(hash((spec, dtype))) % 2**32)
    lx, ly = spec.split("->")[0].split(",")
    x = rand(shape_for(lx, SIZES), dtype, rng)
    y = rand(shape_for(ly, SIZES), dtype, rng)
    got = unblob(sql_einsum(gcon, spec, "multiply", "sum", dtype, x, y), dtype, out_shape(spec, x, y))
    want = np.einsum(spec, x, y).astype(dtype)
    assert_close(got, want, dtype, einsum_tol("sum", dtype, (spec, "multiply", x, y)))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("agg", AGGS)
@pytest.mark.parametrize("join", JOINS)
def test_einsum_join_agg(scon, join, agg, dtype):
    rng = np.random.default_rng(abs(hash((join, agg, dtype))) % 2**32)
    x = rand((3, 4), dtype, rng, positive=(join == "divide" and not dtype.startswith("int")))
    y = rand((4, 2), dtype, rng, positive=(join == "divide" and not dtype.startswith("int")))
    spec = "ij,jk->ik"
    if dtype in COMPLEX and (join in ("max", "min", "absdiff") or agg in ("max", "min")):
        bad = join if join in ("max", "min", "absdiff") else agg
        with pytest.raises(
            duckdb.Error, match=f"tensor_einsum: (join|agg) '{bad}' is not defined for complex"
        ):
            sql_einsum(scon, spec, join, agg, dtype, x, y)
        return
    got = unblob(sql_einsum(scon, spec, join, agg, dtype, x, y), dtype, (3, 2))
    tol = einsum_tol(agg, dtype, (spec, join, x, y))
    assert_close(got, einsum_ref(spec, join, agg, dtype, x, y), dtype, tol)
    # every label kept: the result is just the join, whatever the agg
    spec2 = "ij,jk->ijk"
    got = unblob(sql_einsum(scon, spec2, join, agg, dtype, x, y), dtype, (3, 4, 2))
    tol = einsum_tol(agg, dtype, (spec2, join, x, y))
    assert_close(got, einsum_ref(spec2, join, "sum", dtype, x, y), dtype, tol)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
@pytest.mark.parametrize("join", ["add", "sqdiff", "max"])
@pytest.mark.parametrize("spec", ["ii,i->i", "ij,j->", "i,->i", "iij,jk->ki"])
def test_einsum_other_specs_extended(scon, spec, join, dtype):
    rng = np.random.default_rng(5)
    sizes = {"i": 3, "j": 4, "k": 2}
    lx, ly = spec.split("->")[0].split(",")
    x = rand(shape_for(lx, sizes), dtype, rng)
    y = rand(shape_for(ly, sizes), dtype, rng)
    for agg in AGGS:
        got = unblob(sql_einsum(scon, spec, join, agg, dtype, x, y), dtype, out_shape(spec, x, y))
        tol = einsum_tol(agg, dtype, (spec, join, x, y))
        assert_close(got, einsum_ref(spec, join, agg, dtype, x, y), dtype, tol)


def test_einsum_empty_dims_give_identity(con):
    x = np.zeros((3, 0))
    y = np.zeros((0, 2))
    for agg, v in {"sum": 0.0, "prod": 1.0}.items():
        got = unblob(sql_einsum(con, "ij,jk->ik", "multiply", agg, "float64", x, y), "float64", (3, 2))
        np.testing.assert_array_equal(got, np.full((3, 2), v))
    # max and min have no identity: numpy's error (tests/api/test_numerics.py has the whole rule)
    xi = np.zeros((3, 0), dtype=np.int32)
    yi = np.zeros((0, 2), dtype=np.int32)
    for agg in ("max", "min"):
        with pytest.raises(duckdb.Error, match=f"agg '{agg}' reduces over label 'j' of size 0"):
            sql_einsum(con, "ij,jk->ik", "multiply", agg, "int32", xi, yi)
    got = sql_einsum(con, "ij,jk->ki", "multiply", "sum", "float64", np.zeros((0, 4)), np.zeros((4, 2)))
    assert got == b""


def test_einsum_integer_wraps_and_divides_safely(con):
    big = np.array([2**31 - 1, -(2**31), 7, -7, 5], dtype=np.int32)
    other = np.array([2, -1, 0, 2, -2], dtype=np.int32)
    got = unblob(sql_einsum(con, "i,i->i", "multiply", "sum", "int32", big, other), "int32", (5,))
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(got, big * other)
    got = unblob(sql_einsum(con, "i,i->i", "divide", "sum", "int32", big, other), "int32", (5,))
    np.testing.assert_array_equal(got, np.array([2**30 - 1, -(2**31), 0, -3, -2], dtype=np.int32))
    got = unblob(sql_einsum(con, "i,i->", "add", "sum", "int32", big, other), "int32", ())
    with np.errstate(all="ignore"):
        assert got == np.sum(big + other, dtype=np.int32)
    i64 = np.array([2**62, 2**62], dtype=np.int64)
    got = unblob(sql_einsum(con, "i,i->", "add", "sum", "int64", i64, i64), "int64", ())
    assert got == np.sum(i64 + i64, dtype=np.int64)


def test_einsum_nan_propagates_in_max(con):
    x = np.array([[1.0, np.nan], [3.0, 2.0]])
    y = np.ones(2)
    got = unblob(sql_einsum(con, "ij,j->i", "multiply", "max", "float64", x, y), "float64", (2,))
    assert np.isnan(got[0]) and got[1] == 3.0


UNARY_SPECS = ["ij->ji", "ii->i", "ij->", "iij->j", "i->i", "ij->i", "->", "ijk->kji", "ijk->j"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("spec", UNARY_SPECS)
def test_einsum1(scon, spec, dtype):
    rng = np.random.default_rng(7)
    lx = spec.split("->")[0]
    x = rand(shape_for(lx, {"i": 3, "j": 4, "k": 2}), dtype, rng)
    for agg in AGGS:
        if dtype in COMPLEX and agg in ("max", "min"):
            with pytest.raises(duckdb.Error, match=f"tensor_einsum1: agg '{agg}' is not defined for complex"):
                sql_einsum1(scon, spec, agg, dtype, x)
            continue
        got = unblob(sql_einsum1(scon, spec, agg, dtype, x), dtype, out_shape(spec, x))
        tol = einsum_tol(agg, dtype, (spec, "", x, None))
        assert_close(got, einsum_ref(spec, "", agg, dtype, x), dtype, tol)
    if dtype in REAL:
        got = unblob(sql_einsum1(scon, spec, "sum", dtype, x), dtype, out_shape(spec, x))
        tol = einsum_tol("sum", dtype, (spec, "", x, None))
        assert_close(got, np.einsum(spec, x).astype(dtype), dtype, tol)


def test_einsum_errors(con):
    x = np.zeros((2, 3))
    y = np.zeros((3, 4))

    def run(spec="ij,jk->ik", join="multiply", agg="sum", dtype="float64", xb=None, xs=(2, 3), ys=(3, 4)):
        return con.execute(
            "SELECT tensor_einsum(?, ?, ?, ?, ?::BLOB, ?::BIGINT[], ?::BLOB, ?::BIGINT[])",
            [spec, join, agg, dtype, blob(x) if xb is None else xb, list(xs), blob(y), list(ys)],
        ).fetchall()

    with pytest.raises(
        duckdb.Error, match=r"tensor_einsum: operand x has 40 bytes but shape \[2,3\] of float64 "
    ):
        run(xb=blob(x)[:-8])
    with pytest.raises(duckdb.Error, match=r"operand x has 48 bytes but shape \[2,3\] of float32 needs 24"):
        run(dtype="float32")
    with pytest.raises(duckdb.Error, match=r"operand x has 48 bytes but shape \[3,3\] of float64 needs 72"):
        run(xs=(3, 3))
    with pytest.raises(
        duckdb.Error, match=r"operand x has rank 1 \(shape \[6\]\) but spec 'ij,jk->ik' gives it 2"
    ):
        run(xs=(6,))
    with pytest.raises(duckdb.Error, match=r"label 'j' has size 3 in operand x \(dim 1\) but 4 in operand y"):
        run(ys=(4, 3))
    with pytest.raises(duckdb.Error, match=r"x_shape \[-2,-3\] has a negative dimension"):
        run(xs=(-2, -3))
    with pytest.raises(
        duckdb.Error, match=r"unknown dtype 'float16' \(valid: float32, float64, int32, int64, "
    ):
        run(dtype="float16")
    with pytest.raises(duckdb.Error, match=r"unknown join 'mul' \(valid: multiply, add, subtract, divide"):
        run(join="mul")
    with pytest.raises(duckdb.Error, match=r"unknown agg 'mean' \(valid: sum, max, min, prod\)"):
        run(agg="mean")
    with pytest.raises(duckdb.Error, match=r"bad spec 'ij,jk': expected exactly one '->'"):
        run(spec="ij,jk")
    with pytest.raises(duckdb.Error, match=r"bad spec 'ij->ik': expected 2 operand\(s\) before '->', got 1"):
        run(spec="ij->ik")
    with pytest.raises(duckdb.Error, match=r"invalid label '1'"):
        run(spec="i1,jk->ik")
    with pytest.raises(duckdb.Error, match=r"output label 'i' appears twice"):
        run(spec="ij,jk->ii")
    with pytest.raises(duckdb.Error, match=r"output label 'z' does not appear in any input"):
        run(spec="ij,jk->iz")
    with pytest.raises(duckdb.Error, match=r"is too large"):
        run(xs=(2**40, 2**40))
    with pytest.raises(duckdb.Error, match=r"x_shape contains NULL"):
        con.execute(
            "SELECT tensor_einsum('ij,jk->ik', 'multiply', 'sum', 'float64', "
            "?::BLOB, [2, NULL], ?::BLOB, [3, 4])",
            [blob(x), blob(y)],
        ).fetchall()
    with pytest.raises(duckdb.Error, match=r"label 'i' has size 2 in operand x \(dim 0\) but 3 in operand x"):
        con.execute("SELECT tensor_einsum1('ii->i', 'sum', 'float64', ?::BLOB, [2, 3])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_einsum1: bad spec 'ij,jk->ik': expected 1 operand"):
        con.execute(
            "SELECT tensor_einsum1('ij,jk->ik', 'sum', 'float64', ?::BLOB, [2, 3])", [blob(x)]
        ).fetchall()


def test_einsum_null_inputs_give_null(con):
    x = np.ones((2, 2))
    q = "SELECT tensor_einsum('ij,jk->ik','multiply','sum','float64', {}, {}, {}, {})"
    args = ["?::BLOB", "[2,2]", "?::BLOB", "[2,2]"]
    for i in range(4):
        a = list(args)
        a[i] = "NULL"
        params = [blob(x)] * sum(1 for s in a if s == "?::BLOB")
        assert con.execute(q.format(*a), params).fetchone()[0] is None
    assert (
        con.execute(
            "SELECT tensor_einsum(NULL, 'multiply', 'sum', 'float64', ?::BLOB, [2,2], ?::BLOB, [2,2])",
            [blob(x), blob(x)],
        ).fetchone()[0]
        is None
    )
    assert con.execute("SELECT tensor_einsum1('ij->ji', 'sum', 'float64', NULL, [2,2])").fetchone()[0] is None
    assert con.execute("SELECT tensor_map('exp', 'float64', NULL)").fetchone()[0] is None
    assert (
        con.execute("SELECT tensor_map('scale', 'float64', ?::BLOB, NULL)", [blob(x)]).fetchone()[0] is None
    )
    assert con.execute("SELECT tensor_cast(NULL, 'float64', 'int32')").fetchone()[0] is None
    assert con.execute("SELECT tensor_zeros('float64', NULL)").fetchone()[0] is None
    assert con.execute("SELECT tensor_numel(NULL, 'float64')").fetchone()[0] is None
    assert con.execute("SELECT tensor_check(NULL, 'float64', [1])").fetchone()[0] is None
    assert con.execute("SELECT tensor_to_list(NULL, 'float64')").fetchone()[0] is None


def test_einsum_per_row_arguments(con):
    """Non-constant spec/join/agg/dtype columns: the parse cache must follow the row's strings."""
    rng = np.random.default_rng(11)
    rows = []
    cases = [
        ("ij,jk->ik", "multiply", "sum", "float64"),
        ("ij,jk->ki", "add", "max", "float64"),
        ("ij,jk->ik", "multiply", "sum", "int32"),
        ("ij,jk->ik", "sqdiff", "min", "float32"),
    ]
    for r in range(200):
        spec, join, agg, dtype = cases[(r // 3) % len(cases)]
        x = rand((2, 3), dtype, rng)
        y = rand((3, 2), dtype, rng)
        rows.append((r, spec, join, agg, dtype, blob(x), blob(y), x, y))
    con.execute(
        "CREATE TABLE args (r INTEGER, spec VARCHAR, j VARCHAR, a VARCHAR, dt VARCHAR, x BLOB, y BLOB)"
    )
    con.executemany("INSERT INTO args VALUES (?, ?, ?, ?, ?, ?, ?)", [row[:7] for row in rows])
    got = con.execute(
        "SELECT r, tensor_einsum(spec, j, a, dt, x, [2, 3], y, [3, 2]) FROM args ORDER BY r"
    ).fetchall()
    for (_r, out), row in zip(got, rows, strict=True):
        _, spec, join, agg, dtype, _, _, x, y = row
        want = einsum_ref(spec, join, agg, dtype, x, y)
        assert_close(unblob(out, dtype, want.shape), want, dtype, einsum_tol(agg, dtype, (spec, join, x, y)))


# ---------------------------------------------------------------------------------------------------------
# tensor_map / tensor_cast
# ---------------------------------------------------------------------------------------------------------

MAP_FNS = ["exp", "log", "sqrt", "relu", "neg", "abs", "pow", "scale", "square", "reciprocal"]


def map_ref(fn: str, x: np.ndarray, param: float | None, dtype: str) -> np.ndarray:
    with np.errstate(all="ignore"):
        if fn == "exp":
            r = np.exp(x)
        elif fn == "log":
            r = np.log(x)
        elif fn == "sqrt":
            r = np.sqrt(x)
        elif fn == "relu":
            r = np.maximum(x, 0)
        elif fn == "neg":
            r = -x
        elif fn == "abs":
            r = np.abs(x)
        elif fn == "pow":
            r = x ** (int(param) if dtype.startswith("int") else param)
        elif fn == "scale":
            r = x * (int(param) if dtype.startswith("int") else param)
        elif fn == "square":
            r = x * x
        else:
            r = 1 / x
    return np.asarray(r).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", MAP_FNS)
def test_map(scon, fn, dtype):
    rng = np.random.default_rng(3)
    positive = fn in ("log", "sqrt", "pow", "reciprocal")
    x = rand((3, 4), dtype, rng, positive=positive)
    param = {
        "pow": 3.0 if dtype.startswith("int") else 2.5,
        "scale": 3.0 if dtype.startswith("int") else 1.5,
    }.get(fn)
    if param is None:
        sql, params = "SELECT tensor_map(?, ?, ?::BLOB)", [fn, dtype, blob(x)]
    else:
        sql, params = "SELECT tensor_map(?, ?, ?::BLOB, ?)", [fn, dtype, blob(x), param]
    if dtype.startswith("int") and fn in ("exp", "log", "sqrt", "reciprocal"):
        with pytest.raises(duckdb.Error, match=f"tensor_map: fn '{fn}' is not defined for {dtype}; promote"):
            scon.execute(sql, params).fetchall()
        return
    if dtype in COMPLEX and fn == "relu":
        with pytest.raises(duckdb.Error, match="tensor_map: fn 'relu' is not defined for complex"):
            scon.execute(sql, params).fetchall()
        return
    got = unblob(scon.execute(sql, params).fetchone()[0], dtype, (3, 4))
    want = map_ref(fn, x, param, dtype)
    # one library function per element (numpy's SIMD float32 exp/log/pow err by a few ulps)
    assert_close(got, want, dtype, elementwise_tolerance(want, dtype, roundings=4))


def test_map_param_rules(con):
    xi = np.array([1, -2, 3], dtype=np.int32)
    with pytest.raises(duckdb.Error, match=r"fn 'pow' on int32 needs an integer exponent >= 0"):
        con.execute("SELECT tensor_map('pow', 'int32', ?::BLOB, 0.5)", [blob(xi)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"fn 'pow' on int32 needs an integer exponent >= 0"):
        con.execute("SELECT tensor_map('pow', 'int32', ?::BLOB, -1)", [blob(xi)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"fn 'scale' needs a param"):
        con.execute("SELECT tensor_map('scale', 'int32', ?::BLOB)", [blob(xi)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"unknown fn 'cosh' \(valid: exp, log, sqrt, relu"):
        con.execute("SELECT tensor_map('cosh', 'float64', ?::BLOB)", [blob(xi)]).fetchall()
    with pytest.raises(
        duckdb.Error, match=r"tensor_map: operand x has 10 bytes, not a multiple of the 8-byte"
    ):
        con.execute("SELECT tensor_map('exp', 'float64', ?::BLOB)", [b"\0" * 10]).fetchall()
    got = con.execute("SELECT tensor_map('abs', 'int32', ?::BLOB)", [blob(np.array([-(2**31)], np.int32))])
    assert unblob(got.fetchone()[0], "int32", (1,))[0] == -(2**31)  # wraps like numpy
    z = np.array([3 + 4j], dtype=np.complex128)
    got = con.execute("SELECT tensor_map('abs', 'complex128', ?::BLOB)", [blob(z)]).fetchone()[0]
    assert unblob(got, "complex128", (1,))[0] == 5 + 0j


@pytest.mark.parametrize("to", DTYPES)
@pytest.mark.parametrize("frm", DTYPES)
def test_cast(scon, frm, to):
    rng = np.random.default_rng(4)
    x = rand((2, 5), frm, rng) * (3 if frm.startswith("int") else 1)
    if not frm.startswith("int"):
        x = (x * 10).astype(frm)  # fractional values in a range every dtype holds
    got = scon.execute("SELECT tensor_cast(?::BLOB, ?, ?)", [blob(x), frm, to]).fetchone()[0]
    src = x.real if (frm in COMPLEX and to not in COMPLEX) else x
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = src.astype(to)
    assert_close(unblob(got, to, (2, 5)), want, to, elementwise_tolerance(want, to, roundings=1))


def test_cast_out_of_range_is_defined(con):
    x = np.array([1e30, -1e30, np.nan, np.inf, -np.inf, 2.9, -2.9, 2**31 - 0.5], dtype=np.float64)
    got = unblob(
        con.execute("SELECT tensor_cast(?::BLOB, 'float64', 'int32')", [blob(x)]).fetchone()[0], "int32", (8,)
    )
    i32 = np.iinfo(np.int32)
    np.testing.assert_array_equal(got, [i32.max, i32.min, 0, i32.max, i32.min, 2, -2, i32.max])
    big = np.array([2**40 + 3, -(2**40) - 3], dtype=np.int64)
    got = unblob(
        con.execute("SELECT tensor_cast(?::BLOB, 'int64', 'int32')", [blob(big)]).fetchone()[0], "int32", (2,)
    )
    np.testing.assert_array_equal(got, big.astype(np.int32))  # wraps like numpy astype
    with pytest.raises(duckdb.Error, match=r"tensor_cast: unknown to_dtype 'bool'"):
        con.execute("SELECT tensor_cast(?::BLOB, 'int64', 'bool')", [blob(big)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_cast: unknown from_dtype 'f8'"):
        con.execute("SELECT tensor_cast(?::BLOB, 'f8', 'int64')", [blob(big)]).fetchall()


# ---------------------------------------------------------------------------------------------------------
# aggregates
# ---------------------------------------------------------------------------------------------------------

REDUCE = {"tensor_sum": np.sum, "tensor_max": np.max, "tensor_min": np.min, "tensor_prod": np.prod}


def make_blocks(con, dtype, n_rows, n_groups, shape, seed=0, name="blocks"):
    rng = np.random.default_rng(seed)
    arrays = [rand(shape, dtype, rng) for _ in range(n_rows)]
    groups = [int(g) for g in rng.integers(0, n_groups, size=n_rows)]
    con.execute(f"CREATE OR REPLACE TABLE {name} (g INTEGER, b BLOB)")
    con.executemany(
        f"INSERT INTO {name} VALUES (?, ?)", [(g, blob(a)) for g, a in zip(groups, arrays, strict=True)]
    )
    return arrays, groups


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", list(REDUCE))
def test_reduce_aggregates(con, fn, dtype):
    arrays, groups = make_blocks(con, dtype, 40, 5, (2, 3), seed=hash((fn, dtype)) % 1000)
    sql = f"SELECT g, {fn}(b, '{dtype}') FROM blocks GROUP BY g ORDER BY g"
    if dtype in COMPLEX and fn in ("tensor_max", "tensor_min"):
        with pytest.raises(duckdb.Error, match=f"{fn}: not defined for complex"):
            con.execute(sql).fetchall()
        return
    for g, out in con.execute(sql).fetchall():
        stack = np.stack([a for a, gg in zip(arrays, groups, strict=True) if gg == g])
        if fn in ("tensor_sum", "tensor_prod"):
            want = REDUCE[fn](stack, axis=0, dtype=np_dtype(dtype))
        else:
            want = REDUCE[fn](stack, axis=0)
        agg = fn[len("tensor_") :]
        tol = 0.0 if dtype.startswith("int") else reduction_tolerance(stack, agg, 0, dtype, roundings=0)
        assert_close(unblob(out, dtype, (2, 3)), want, dtype, tol)


def test_reduce_nulls_and_empty_groups(con):
    con.execute("CREATE TABLE t (g INTEGER, b BLOB)")
    one = blob(np.ones(3))
    con.executemany("INSERT INTO t VALUES (?, ?)", [(1, one), (1, None), (1, one), (2, None)])
    rows = con.execute("SELECT g, tensor_sum(b, 'float64') FROM t GROUP BY g ORDER BY g").fetchall()
    np.testing.assert_array_equal(unblob(rows[0][1], "float64", (3,)), [2, 2, 2])
    assert rows[1] == (2, None)
    assert con.execute("SELECT tensor_max(b, 'float64') FROM t WHERE false").fetchall() == [(None,)]


def test_reduce_errors(con):
    con.execute("CREATE TABLE t (b BLOB)")
    con.executemany("INSERT INTO t VALUES (?)", [(blob(np.ones(3)),), (blob(np.ones(4)),)])
    with pytest.raises(
        duckdb.Error, match=r"tensor_sum: blocks in a group differ in size \(24 bytes, then 32"
    ):
        con.execute("SELECT tensor_sum(b, 'float64') FROM t").fetchall()
    with pytest.raises(
        duckdb.Error, match=r"tensor_prod: operand x has 24 bytes, not a multiple of the 16-byte"
    ):
        con.execute("SELECT tensor_prod(b, 'complex128') FROM t").fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_min: unknown dtype 'double'"):
        con.execute("SELECT tensor_min(b, 'double') FROM t").fetchall()


def test_reduce_as_window_function(con):
    con.execute(
        "CREATE TABLE t AS SELECT i, tensor_from_list([i::DOUBLE, 1.0], 'float64') b FROM range(20) r(i)"
    )
    rows = con.execute(
        "SELECT i, tensor_sum(b, 'float64') OVER (ORDER BY i ROWS BETWEEN 2 PRECEDING AND CURRENT ROW) "
        "FROM t ORDER BY i"
    ).fetchall()
    for i, out in rows:
        lo = max(0, i - 2)
        np.testing.assert_array_equal(unblob(out, "float64", (2,)), [sum(range(lo, i + 1)), i + 1 - lo])


@pytest.mark.parametrize("frame", ["UNBOUNDED PRECEDING", "3 PRECEDING"])
def test_einsum_agg_as_window_function_shares_states_safely(con, frame):
    """Window segment trees combine the same source states into many targets: block buffers are shared
    copy-on-write, so a later update or combine into one target must never change another."""
    rng = np.random.default_rng(7)
    n = 24
    xs = [rand((3, 4), "float64", rng) for _ in range(n)]
    ys = [rand((4, 2), "float64", rng) for _ in range(n)]
    con.execute("CREATE TABLE w (i INTEGER, x BLOB, y BLOB)")
    con.executemany("INSERT INTO w VALUES (?, ?, ?)", [(i, blob(xs[i]), blob(ys[i])) for i in range(n)])
    for agg_sql, ref, tol in [
        (
            "tensor_einsum_agg('ij,jk->ik', 'multiply', 'sum', 'float64', x, [3, 4], y, [4, 2])",
            lambda lo, hi: sum(xs[i] @ ys[i] for i in range(lo, hi + 1)),
            lambda lo, hi: einsum_tol(
                "sum", "float64", *[("ij,jk->ik", "multiply", xs[i], ys[i]) for i in range(lo, hi + 1)]
            ),
        ),
        (
            "tensor_sum(x, 'float64')",
            lambda lo, hi: sum(xs[i] for i in range(lo, hi + 1)),
            lambda lo, hi: reduction_tolerance(np.stack(xs[lo : hi + 1]), "sum", 0, "float64", 0),
        ),
    ]:
        rows = con.execute(
            f"SELECT i, {agg_sql} OVER (ORDER BY i ROWS BETWEEN {frame} AND CURRENT ROW) FROM w ORDER BY i"
        ).fetchall()
        for i, out in rows:
            lo = 0 if frame.startswith("UNBOUNDED") else max(0, i - 3)
            want = ref(lo, i)
            assert_close(unblob(out, "float64", want.shape), want, "float64", tol(lo, i))


def test_aggregates_multithreaded_many_groups(con):
    """Enough rows for several row groups so DuckDB aggregates on 2 threads and combines their states."""
    con.execute("SET threads = 2")
    n_rows, n_groups = 300_000, 997
    con.execute(
        f"""CREATE TABLE big AS
        SELECT i, (i * 7919) % {n_groups} AS g,
               tensor_from_list([(i % 13)::DOUBLE, 1.0, (i % 5)::DOUBLE - 2.0], 'float64') AS b,
               tensor_from_list([(i % 7)::DOUBLE, -(i % 3)::DOUBLE], 'int64') AS bi
        FROM range({n_rows}) r(i)"""
    )
    i = np.arange(n_rows)
    g = (i * 7919) % n_groups
    vals = np.stack([i % 13, np.ones(n_rows), i % 5 - 2.0], axis=1)
    ivals = np.stack([i % 7, -(i % 3)], axis=1).astype(np.int64)
    want_sum = np.zeros((n_groups, 3))
    np.add.at(want_sum, g, vals)
    want_max = np.full((n_groups, 3), -np.inf)
    np.maximum.at(want_max, g, vals)
    want_isum = np.zeros((n_groups, 2), dtype=np.int64)
    np.add.at(want_isum, g, ivals)
    rows = con.execute(
        "SELECT g, tensor_sum(b, 'float64'), tensor_max(b, 'float64'), tensor_min(bi, 'int64'), "
        "tensor_sum(bi, 'int64'), count(*) FROM big GROUP BY g ORDER BY g"
    ).fetchall()
    assert len(rows) == n_groups
    want_imin = np.full((n_groups, 2), np.iinfo(np.int64).max)
    np.minimum.at(want_imin, g, ivals)
    for gg, s, m, mi, si, _cnt in rows:
        np.testing.assert_array_equal(unblob(s, "float64", (3,)), want_sum[gg])  # sums of small integers
        np.testing.assert_array_equal(unblob(m, "float64", (3,)), want_max[gg])
        np.testing.assert_array_equal(unblob(mi, "int64", (2,)), want_imin[gg])
        np.testing.assert_array_equal(unblob(si, "int64", (2,)), want_isum[gg])
    # pack and assemble through the same parallel path
    rows = con.execute(
        f"SELECT g, tensor_pack('float64', i // {n_groups}, 1.0, 400), "
        f"tensor_assemble('int64', bi, [1, 2], [(i // {n_groups}) % 400, 0], [400, 2]) "
        "FROM big GROUP BY g ORDER BY g"
    ).fetchall()
    for gg, packed, assembled in rows:
        idx = i[g == gg] // n_groups
        want = np.bincount(idx, minlength=400).astype(np.float64)
        np.testing.assert_array_equal(unblob(packed, "float64", (400,)), want)
        a = unblob(assembled, "int64", (400, 2))
        assert a.shape == (400, 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_assemble(con, dtype):
    rng = np.random.default_rng(9)
    full = rand((5, 7), dtype, rng)
    pieces = []
    for r0, r1 in ((0, 2), (2, 4), (4, 5)):
        for c0, c1 in ((0, 3), (3, 6), (6, 7)):
            pieces.append((full[r0:r1, c0:c1], [r0, c0]))
    con.execute("CREATE TABLE p (x BLOB, xs BIGINT[], off BIGINT[])")
    con.executemany("INSERT INTO p VALUES (?, ?, ?)", [(blob(a), list(a.shape), o) for a, o in pieces])
    got = con.execute("SELECT tensor_assemble(?, x, xs, off, [5, 7]) FROM p", [dtype]).fetchone()[0]
    np.testing.assert_array_equal(unblob(got, dtype, (5, 7)), full)
    # leave one piece out: its area stays zero; a larger out_shape pads with zeros
    got = con.execute(
        "SELECT tensor_assemble(?, x, xs, off, [6, 8]) FROM p WHERE off <> [2, 3]", [dtype]
    ).fetchone()[0]
    want = np.zeros((6, 8), dtype=dtype)
    want[:5, :7] = full
    want[2:4, 3:6] = 0
    np.testing.assert_array_equal(unblob(got, dtype, (6, 8)), want)


def test_assemble_scalar_and_errors(con):
    got = con.execute(
        "SELECT tensor_assemble('float64', ?::BLOB, [], [], [])", [blob(np.array(2.5))]
    ).fetchone()
    assert unblob(got[0], "float64", ()) == 2.5
    x = np.ones((2, 3))
    with pytest.raises(
        duckdb.Error, match=r"tensor_assemble: piece of shape \[2,3\] at offset \[3,0\] does not fit"
    ):
        con.execute("SELECT tensor_assemble('float64', ?::BLOB, [2,3], [3,0], [4,3])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_assemble: x_shape \[2,3\], offset \[0\] and out_shape"):
        con.execute("SELECT tensor_assemble('float64', ?::BLOB, [2,3], [0], [4,3])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_assemble: operand x has 48 bytes but shape \[2,2\]"):
        con.execute("SELECT tensor_assemble('float64', ?::BLOB, [2,2], [0,0], [4,3])", [blob(x)]).fetchall()
    with pytest.raises(duckdb.Error, match=r"out_shape changes within a group"):
        con.execute(
            "SELECT tensor_assemble('float64', ?::BLOB, [2,3], [0,0], [4 + i, 3]) FROM range(2) r(i)",
            [blob(x)],
        ).fetchall()
    assert con.execute("SELECT tensor_assemble('float64', NULL, [1], [0], [1])").fetchone()[0] is None


@pytest.mark.parametrize("dtype", DTYPES)
def test_pack(con, dtype):
    rows = [(0, 1.5), (3, 2.0), (3, 4.0), (1, None), (5, -1.0)]
    con.execute("CREATE TABLE coo (idx BIGINT, v DOUBLE)")
    con.executemany("INSERT INTO coo VALUES (?, ?)", rows)
    got = con.execute("SELECT tensor_pack(?, idx, v, 6) FROM coo", [dtype]).fetchone()[0]
    want = np.zeros(6, dtype=dtype)
    for i, v in rows:
        if v is not None:
            want[i] += np.array(v).astype(dtype)
    np.testing.assert_array_equal(unblob(got, dtype, (6,)), want)


def test_pack_bigint_exact_and_errors(con):
    big = 2**60 + 1
    got = con.execute(
        "SELECT tensor_pack('int64', i, ?::BIGINT + i, 3) FROM range(3) r(i)", [big]
    ).fetchone()[0]
    np.testing.assert_array_equal(unblob(got, "int64", (3,)), [big, big + 1, big + 2])
    with pytest.raises(duckdb.Error, match=r"tensor_pack: idx 3 is out of range \[0, 3\)"):
        con.execute("SELECT tensor_pack('float64', i, 1.0, 3) FROM range(4) r(i)").fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_pack: idx -1 is out of range"):
        con.execute("SELECT tensor_pack('float64', -1, 1.0, 3)").fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_pack: numel changes within a group \(3 then 4\)"):
        con.execute("SELECT tensor_pack('float64', 0, 1.0, 3 + i) FROM range(2) r(i)").fetchall()
    with pytest.raises(duckdb.Error, match=r"tensor_pack: unknown dtype 'float16'"):
        con.execute("SELECT tensor_pack('float16', 0, 1.0, 3)").fetchall()
    assert con.execute("SELECT tensor_pack('float64', 0, NULL::DOUBLE, 3)").fetchone()[0] is None
    rows = con.execute(
        "SELECT i % 3 AS g, tensor_pack('int32', i % 2, i, 2) FROM range(6) r(i) GROUP BY g ORDER BY g"
    ).fetchall()
    assert [list(unblob(b, "int32", (2,))) for _, b in rows] == [[0, 3], [4, 1], [2, 5]]


# ---------------------------------------------------------------------------------------------------------
# alignment and bulk use
# ---------------------------------------------------------------------------------------------------------


def test_unaligned_and_inlined_blobs(con):
    """Blobs of <= 12 bytes are inlined in DuckDB's string_t (unaligned data); results must not change."""
    x = np.array([1.5], dtype=np.float64)  # 8 bytes: inlined
    y = np.array([2.0, 3.0], dtype=np.float32)  # 8 bytes: inlined
    got = unblob(sql_einsum(con, "i,i->i", "multiply", "sum", "float64", x, x), "float64", (1,))
    assert got[0] == 2.25
    got = unblob(sql_einsum(con, "i,j->ij", "multiply", "sum", "float32", y, y), "float32", (2, 2))
    np.testing.assert_array_equal(got, np.outer(y, y))
    c = np.array([1 + 2j], dtype=np.complex64)
    got = unblob(sql_einsum(con, "i,i->", "multiply", "sum", "complex64", c, c), "complex64", ())
    assert got == (1 + 2j) ** 2


def test_einsum_block_matmul_in_sql(con):
    """A blocked matmul written as SQL join + tensor_sum over einsum results matches numpy."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((6, 8))
    b = rng.standard_normal((8, 4))
    bs = 2
    con.execute("CREATE TABLE A (i INTEGER, j INTEGER, t BLOB)")
    con.execute("CREATE TABLE B (j INTEGER, k INTEGER, t BLOB)")
    con.executemany(
        "INSERT INTO A VALUES (?, ?, ?)",
        [(i, j, blob(a[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs])) for i in range(3) for j in range(4)],
    )
    con.executemany(
        "INSERT INTO B VALUES (?, ?, ?)",
        [(j, k, blob(b[j * bs : (j + 1) * bs, k * bs : (k + 1) * bs])) for j in range(4) for k in range(2)],
    )
    rows = con.execute(
        "SELECT A.i, B.k, tensor_sum(tensor_einsum('ij,jk->ik', 'multiply', 'sum', 'float64', "
        "A.t, [2, 2], B.t, [2, 2]), 'float64') FROM A JOIN B USING (j) GROUP BY A.i, B.k"
    ).fetchall()
    c = np.zeros((6, 4))
    for i, k, t in rows:
        c[i * bs : (i + 1) * bs, k * bs : (k + 1) * bs] = unblob(t, "float64", (2, 2))
    tolerance.assert_einsum_close(c, "ij,jk->ik", a, b)


# ---------------------------------------------------------------------------------------------------------
# GEMM mapping of tensor_einsum (multiply/sum) and the fused aggregate tensor_einsum_agg
# ---------------------------------------------------------------------------------------------------------

# (spec, label sizes): every combination of batch / M / N / K groups, transposed and split layouts,
# private (summed-away) labels, repeated labels, 0-d operands and size-0 dimensions.
GEMM_CASES = [
    ("ab,bc->ac", {"a": 4, "b": 5, "c": 3}),
    ("ab,cb->ac", {"a": 4, "b": 5, "c": 3}),
    ("ba,bc->ac", {"a": 4, "b": 5, "c": 3}),
    ("ba,cb->ac", {"a": 4, "b": 5, "c": 3}),
    ("ab,bc->ca", {"a": 4, "b": 5, "c": 3}),
    ("ba,cb->ca", {"a": 4, "b": 5, "c": 3}),
    ("bij,bjk->bik", {"b": 3, "i": 4, "j": 2, "k": 5}),
    ("ibj,bjk->bik", {"b": 3, "i": 4, "j": 2, "k": 5}),
    ("bij,bjk->ikb", {"b": 3, "i": 4, "j": 2, "k": 5}),
    ("bij,bjk->ibk", {"b": 3, "i": 4, "j": 2, "k": 5}),
    ("bij,kjb->kib", {"b": 3, "i": 4, "j": 2, "k": 5}),
    ("abcd,cdef->abef", {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2, "f": 4}),
    ("abcd,dcef->abef", {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2, "f": 4}),
    ("acbd,cdef->abef", {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2, "f": 4}),
    ("abcd,cdef->aebf", {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2, "f": 4}),
    ("abdfe,cf->abcde", {"a": 2, "b": 3, "c": 2, "d": 3, "e": 2, "f": 4}),
    ("gikljh,eiklfj->efgh", {"e": 2, "f": 2, "g": 2, "h": 3, "i": 2, "j": 2, "k": 3, "l": 2}),
    ("i,j->ij", {"i": 4, "j": 3}),
    ("i,i->", {"i": 7}),
    ("i,i->i", {"i": 7}),
    (",->", {}),
    ("ij,->ji", {"i": 2, "j": 3}),
    ("ij,j->i", {"i": 4, "j": 3}),
    ("j,ij->i", {"i": 4, "j": 3}),
    ("ij,kl->il", {"i": 3, "j": 2, "k": 4, "l": 2}),
    ("ijk,jl->il", {"i": 3, "j": 2, "k": 4, "l": 2}),
    ("iij,jk->ik", {"i": 3, "j": 2, "k": 4}),
    ("ii,i->i", {"i": 4}),
    ("ab,bc->ac", {"a": 1, "b": 5, "c": 1}),
    ("ab,bc->ac", {"a": 4, "b": 1, "c": 3}),
    ("ab,bc->ac", {"a": 4, "b": 0, "c": 3}),
    ("ab,bc->ac", {"a": 0, "b": 2, "c": 3}),
    ("bij,bjk->bik", {"b": 0, "i": 2, "j": 2, "k": 2}),
    ("ijk,jl->il", {"i": 3, "j": 2, "k": 0, "l": 2}),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("spec", "sizes"), GEMM_CASES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(GEMM_CASES)]
)
def test_einsum_gemm_paths(gcon, spec, sizes, dtype):
    rng = np.random.default_rng(abs(hash((spec, dtype, tuple(sizes.items())))) % 2**32)
    lhs, _ = spec.split("->")
    lx, ly = lhs.split(",")
    x = rand(shape_for(lx, sizes), dtype, rng)
    y = rand(shape_for(ly, sizes), dtype, rng)
    want = einsum_ref(spec, "multiply", "sum", dtype, x, y)
    got = unblob(sql_einsum(gcon, spec, "multiply", "sum", dtype, x, y), dtype, want.shape)
    assert_close(got, want, dtype, einsum_tol("sum", dtype, (spec, "multiply", x, y)))
    # fused over three rows of one group: the sum of three products
    xs = [x, rand(x.shape, dtype, rng), rand(x.shape, dtype, rng)]
    ys = [y, rand(y.shape, dtype, rng), rand(y.shape, dtype, rng)]
    rows = [(blob(a), list(a.shape), blob(b), list(b.shape)) for a, b in zip(xs, ys, strict=True)]
    got2 = gcon.execute(
        "SELECT tensor_einsum_agg(?, 'multiply', 'sum', ?, x, xs, y, ys) FROM "
        "(SELECT unnest(?::STRUCT(x BLOB, xs BIGINT[], y BLOB, ys BIGINT[])[], recursive := true))",
        [spec, dtype, [dict(zip(["x", "xs", "y", "ys"], r, strict=True)) for r in rows]],
    ).fetchone()[0]
    want2 = sum(einsum_ref(spec, "multiply", "sum", dtype, a, b) for a, b in zip(xs, ys, strict=True))
    tol2 = einsum_tol("sum", dtype, *[(spec, "multiply", a, b) for a, b in zip(xs, ys, strict=True)])
    assert_close(unblob(got2, dtype, want.shape), np.asarray(want2, dtype=np_dtype(dtype)), dtype, tol2)


def _agg_table(con, dtype: str, rng: np.random.Generator) -> dict[int, list[tuple[np.ndarray, np.ndarray]]]:
    """Table g (group), x, xs, y, ys: 'ab,bc->ac' rows with ragged b extents; group 2 only has NULL x.
    Returns each non-empty group's (x, y) pairs."""
    con.execute("CREATE OR REPLACE TABLE t (g INTEGER, x BLOB, xs BIGINT[], y BLOB, ys BIGINT[])")
    rows, pairs = [], {}
    for g, ks in [(0, [3, 1, 2]), (1, [4]), (3, [2, 2, 2, 2, 5])]:
        for k in ks:
            x = rand((2, k), dtype, rng, positive=True)
            y = rand((k, 3), dtype, rng, positive=True)
            rows.append((g, blob(x), [2, k], blob(y), [k, 3]))
            pairs.setdefault(g, []).append((x, y))
    rows.append((2, None, [2, 2], blob(rand((2, 3), dtype, rng)), [2, 3]))
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    return pairs


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("join", JOINS)
@pytest.mark.parametrize("agg", AGGS)
def test_einsum_agg_matches_unfused(con, dtype, join, agg):
    _check_agg_matches_unfused(con, dtype, join, agg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_einsum_agg_multiply_sum_matches_unfused_on_every_kernel_path(kernel_path, dtype):
    con = duckdb_connect(kernel_path)
    _check_agg_matches_unfused(con, dtype, "multiply", "sum")
    con.close()


def _check_agg_matches_unfused(con, dtype, join, agg):
    rng = np.random.default_rng(7)
    pairs = _agg_table(con, dtype, rng)
    args = f"'ab,bc->ac', '{join}', '{agg}', '{dtype}', x, xs, y, ys"
    fused_q = f"SELECT g, tensor_einsum_agg({args}) FROM t GROUP BY g ORDER BY g"
    unfused_q = f"SELECT g, tensor_{agg}(tensor_einsum({args}), '{dtype}') FROM t GROUP BY g ORDER BY g"
    complex_bad = dtype.startswith("complex") and (agg in ("max", "min") or join in ("absdiff", "max", "min"))
    if complex_bad:
        with pytest.raises(duckdb.Error, match="not defined for complex"):
            con.execute(fused_q).fetchall()
        return
    fused = con.execute(fused_q).fetchall()
    unfused = con.execute(unfused_q).fetchall()
    assert [g for g, _ in fused] == [g for g, _ in unfused] == [0, 1, 2, 3]
    for (g, a), (_, b) in zip(fused, unfused, strict=True):
        if g == 2:
            assert a is None and b is None  # empty group (only NULL rows) -> NULL
            continue
        got, want = unblob(a, dtype, (2, 3)), unblob(b, dtype, (2, 3))
        if dtype.startswith("int") or (join in ("max", "min") and agg in ("max", "min")):
            np.testing.assert_array_equal(got, want)
        else:  # both sides computed in dtype: the tolerance covers each one's rounding
            tol = einsum_tol(agg, dtype, *[("ab,bc->ac", join, x, y) for x, y in pairs[g]])
            assert_close(got, want, dtype, tol)


def test_einsum_agg_empty_input_is_null(scon):
    row = scon.execute(
        "SELECT tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', x, [1, 1], x, [1, 1]) "
        "FROM (SELECT NULL::BLOB AS x) WHERE false"
    ).fetchone()
    assert row[0] is None


def test_einsum_agg_errors(con):
    con.execute("CREATE TABLE e (g INTEGER, x BLOB, xs BIGINT[])")
    con.execute(
        "INSERT INTO e VALUES (0, ?, [2, 2]), (0, ?, [2, 3])", [blob(np.ones((2, 2))), blob(np.ones((2, 3)))]
    )
    with pytest.raises(duckdb.Error, match="differ in shape"):
        con.execute(
            "SELECT tensor_einsum_agg('ab,ab->b', 'multiply', 'sum', 'float64', x, xs, x, xs) "
            "FROM e GROUP BY g"
        ).fetchall()
    with pytest.raises(duckdb.Error, match="bytes but shape"):
        con.execute(
            "SELECT tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', x, [3, 3], x, [3, 3]) FROM e"
        ).fetchall()
    with pytest.raises(duckdb.Error, match="label 'b' has size"):
        con.execute(
            "SELECT tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', x, xs, x, xs) "
            "FROM e WHERE xs = [2, 3]"
        ).fetchall()


def _path_cases(dtypes: list[str], threads: list[int]) -> list:
    """(kernel path, threads, dtype) of the big GEMM tests: every combination on the machine's default
    path; on the others two threads and the float dtypes (integers use one native loop on every path)."""
    default = default_kernel_path()
    return [
        pytest.param(p, t, d, id=f"{p}-{d}-{t}")
        for p in supported_kernel_paths()
        for d in dtypes
        for t in threads
        if p == default or (t == 2 and not d.startswith("int"))
    ]


@pytest.mark.parametrize(
    ("kernel_path", "threads", "dtype"), _path_cases(["float32", "float64", "int64", "complex64"], [1, 2, 3])
)
def test_gemm_threaded_split(ext_path, kernel_path, threads, dtype):
    """Blocks big enough that a call splits its GEMM over several threads: by rows, by columns when C is
    wider than tall (also with B transposed, and in the swapped orientation C^T = Y^T X^T), by batches."""
    c = duckdb_connect(kernel_path, threads=threads)
    rng = np.random.default_rng(threads)
    cases = [
        ("ab,bc->ac", (300, 200), (200, 250)),
        ("ab,bc->ac", (90, 300), (300, 500)),
        ("ab,cb->ac", (90, 300), (500, 300)),
        ("ab,bc->ca", (500, 300), (300, 90)),
        ("bij,bjk->bik", (4, 150, 160), (4, 160, 170)),
    ]
    for spec, sx, sy in cases:
        x, y = rand(sx, dtype, rng), rand(sy, dtype, rng)
        want = einsum_ref(spec, "multiply", "sum", dtype, x, y)
        got = unblob(sql_einsum(c, spec, "multiply", "sum", dtype, x, y), dtype, want.shape)
        assert_close(got, want, dtype, einsum_tol("sum", dtype, (spec, "multiply", x, y)))
    c.close()


TILED_CASES = [
    # Z interleaves labels of x and y (C formed in tiles and scattered), with and without a batch label
    ("abk,kcd->acbd", {"a": 30, "b": 40, "k": 7, "c": 25, "d": 20}),
    ("zak,zkc->azc", {"z": 3, "a": 300, "k": 5, "c": 500}),
    ("bdgf,aceg->abcdef", {"a": 9, "b": 8, "c": 8, "d": 9, "e": 8, "f": 8, "g": 9}),
    # one label transposed against Z's order (a 2-D blocked transpose in the scatter)
    ("kab,kc->cba", {"k": 3, "a": 150, "b": 130, "c": 40}),
]


@pytest.mark.parametrize(
    ("kernel_path", "threads", "dtype"), _path_cases(["float32", "float64", "int32", "complex128"], [1, 2])
)
def test_gemm_tiled_scatter(ext_path, kernel_path, threads, dtype):
    """Outputs large enough that C is formed tile by tile and scattered into Z (scalar and fused agg)."""
    c = duckdb_connect(kernel_path, threads=threads)
    rng = np.random.default_rng(11)
    for spec, sizes in TILED_CASES:
        lhs, _ = spec.split("->")
        lx, ly = lhs.split(",")
        xs = [rand(shape_for(lx, sizes), dtype, rng) for _ in range(2)]
        ys = [rand(shape_for(ly, sizes), dtype, rng) for _ in range(2)]
        want = einsum_ref(spec, "multiply", "sum", dtype, xs[0], ys[0])
        got = unblob(sql_einsum(c, spec, "multiply", "sum", dtype, xs[0], ys[0]), dtype, want.shape)
        assert_close(got, want, dtype, einsum_tol("sum", dtype, (spec, "multiply", xs[0], ys[0])))
        want2 = want + einsum_ref(spec, "multiply", "sum", dtype, xs[1], ys[1])
        tol2 = einsum_tol("sum", dtype, *[(spec, "multiply", x, y) for x, y in zip(xs, ys, strict=True)])
        c.execute("CREATE OR REPLACE TABLE t (x BLOB, y BLOB)")
        pairs = [(blob(x), blob(y)) for x, y in zip(xs, ys, strict=True)]
        c.executemany("INSERT INTO t VALUES (?, ?)", pairs)
        row = c.execute(
            "SELECT tensor_einsum_agg(?, 'multiply', 'sum', ?, x, ?::BIGINT[], y, ?::BIGINT[]) FROM t",
            [spec, dtype, list(xs[0].shape), list(ys[0].shape)],
        ).fetchone()
        assert_close(unblob(row[0], dtype, want.shape), want2, dtype, tol2)
    c.close()


@pytest.mark.parametrize(("kernel_path", "threads", "dtype"), _path_cases(["float32", "int64"], [2]))
def test_einsum_agg_parallel_groups(ext_path, kernel_path, threads, dtype):
    """Many groups of large GEMM rows in one chunk: groups spread over the pool, a group's rows in order."""
    c = duckdb_connect(kernel_path, threads=threads)
    rng = np.random.default_rng(5)
    n, groups, per = 160, 6, 3
    data = [[(rand((n, n), dtype, rng), rand((n, n), dtype, rng)) for _ in range(per)] for _ in range(groups)]
    rows = [(g, blob(x), blob(y)) for j in range(per) for g in range(groups) for x, y in [data[g][j]]]
    c.execute("CREATE TABLE t (g INTEGER, x BLOB, y BLOB)")
    c.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    got = c.execute(
        f"SELECT g, tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', '{dtype}', x, [{n}, {n}], y, "
        f"[{n}, {n}]) FROM t GROUP BY g ORDER BY g"
    ).fetchall()
    assert [g for g, _ in got] == list(range(groups))
    for g, z in got:
        want = sum(einsum_ref("ab,bc->ac", "multiply", "sum", dtype, x, y) for x, y in data[g])
        tol = einsum_tol("sum", dtype, *[("ab,bc->ac", "multiply", x, y) for x, y in data[g]])
        assert_close(unblob(z, dtype, (n, n)), want, dtype, tol)
    c.close()


@pytest.mark.parametrize(("kernel_path", "threads", "dtype"), _path_cases(["float64"], [1, 2]))
def test_einsum_agg_mixed_layouts_in_group(ext_path, kernel_path, threads, dtype):
    """A group mixing an interleaved-output GEMM (accumulated in its GEMM layout), a direct GEMM and a
    non-GEMM join with the same output shape; also over row groups so that states are combined."""
    c = duckdb_connect(kernel_path, threads=threads)
    rng = np.random.default_rng(8)
    sz = {"a": 30, "b": 40, "k": 7, "c": 25, "d": 20}
    specs = [("abk,kcd->acbd", "multiply"), ("acbk,kd->acbd", "multiply"), ("acbd,acbd->acbd", "add")]
    rows, want, terms = [], {}, {}
    for rep in range(3):
        for g in range(2):
            for spec, join in specs[rep:] + specs[:rep]:
                lx, ly = spec.split("->")[0].split(",")
                x, y = rand(shape_for(lx, sz), dtype, rng), rand(shape_for(ly, sz), dtype, rng)
                ref = einsum_ref(spec, join, "sum", dtype, x, y)
                want[g] = want.get(g, 0) + ref
                terms.setdefault(g, []).append((spec, join, x, y))
                rows.append((g, spec, join, blob(x), list(x.shape), blob(y), list(y.shape)))
    c.execute("CREATE TABLE t (g INTEGER, spec VARCHAR, j VARCHAR, x BLOB, xs BIGINT[], y BLOB, ys BIGINT[])")
    c.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?, ?, ?)", rows)
    got = c.execute(
        "SELECT g, tensor_einsum_agg(spec, j, 'sum', 'float64', x, xs, y, ys) FROM t GROUP BY g ORDER BY g"
    ).fetchall()
    for g, z in got:
        tol = einsum_tol("sum", "float64", *terms[g])
        assert_close(unblob(z, "float64", want[g].shape), want[g], "float64", tol)
    c.close()


@pytest.mark.parametrize("dtype", ["float32", "int64", "complex128"])
@pytest.mark.parametrize(
    "spec, sizes",
    [
        ("ij->ji", {"i": 70, "j": 90}),
        ("ijkl->ljik", {"i": 37, "j": 5, "k": 41, "l": 33}),
        ("abc->cab", {"a": 3, "b": 50, "c": 66}),
        ("abcd->bacd", {"a": 9, "b": 7, "c": 13, "d": 11}),
        ("iij->ji", {"i": 40, "j": 45}),
        ("aib->ba", {"a": 35, "i": 1, "b": 50}),
    ],
)
def test_einsum1_permutations(scon, spec, sizes, dtype):
    """Larger permutations (contiguous runs, blocked 2-D transposes, diagonals) against numpy."""
    rng = np.random.default_rng(4)
    lx = spec.split("->")[0]
    x = rand(shape_for(lx, sizes), dtype, rng)
    want = np.einsum(spec, x)
    got = unblob(sql_einsum1(scon, spec, "sum", dtype, x), dtype, want.shape)
    np.testing.assert_array_equal(got, want)


def test_einsum_agg_tokens_returned(ext_path):
    """Smoke test: repeated single-group chunks (the aggregate takes thread tokens, finds nothing to spread,
    gives them back and lets each GEMM take its own). A lost token is not visible from SQL (it only
    serializes later calls), so this checks results across repeated queries on one connection."""
    c = duckdb.connect(config={"allow_unsigned_extensions": "true", "threads": "2"})
    udf_kernels.load(c)
    rng = np.random.default_rng(2)
    n = 200
    xs = [rand((n, n), "float64", rng) for _ in range(3)]
    c.execute("CREATE TABLE t (g INTEGER, x BLOB)")
    c.executemany("INSERT INTO t VALUES (?, ?)", [(0, blob(x)) for x in xs])
    want = sum(x @ x for x in xs)
    tol = einsum_tol("sum", "float64", *[("ab,bc->ac", "multiply", x, x) for x in xs])
    shape = f"[{n}, {n}]"
    q = f"SELECT tensor_einsum_agg('ab,bc->ac', 'multiply', 'sum', 'float64', x, {shape}, x, {shape}) FROM t"
    for _ in range(4):
        (z,) = c.execute(q).fetchone()
        assert_close(unblob(z, "float64", (n, n)), want, "float64", tol)
    c.close()
