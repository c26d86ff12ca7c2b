"""Numeric correctness: integer dtypes over their whole range, numpy's result dtypes of maps, one
rule for reductions over an empty axis, pairwise summation, UTF-8 in kernel errors, non-finite map params,
exact lists.

Integers compare exactly with numpy; float tolerances come from tests/tolerance.py or are derived in the test.
"""

from __future__ import annotations

import math

import duckdb
import numpy as np
import pytest
from numpy_ref import AGG_REF, JOIN_REF, MAP_REF
from tolerance import assert_close, elementwise_tolerance, eps

import tensorsql as ts
from tensorsql.ir import ops

INTS = ["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"]
FLOATS = ["float16", "float32", "float64", "complex64", "complex128"]
#: every dtype ts.einsum / ts.map accept
ALL = ["bool", *INTS, *FLOATS]
#: the dtypes the kernels (and relations) hold
KERNEL = [d for d in ALL if d not in ("bool", "float16")]



def _agg(agg: str, a: np.ndarray, axis=None) -> np.ndarray:
    """numpy's reduction in the dtype of its terms, as einsum computes (np.sum of int8 would give int64)."""
    kw = {"dtype": a.dtype} if agg in ("sum", "prod") else {}
    return AGG_REF[agg](a, axis=axis, **kw)
MAP_PARAMS = {"pow": 3, "scale": 3, "rpow": 2}


def extremes(dtype: str, n: int = 6, seed: int = 0) -> np.ndarray:
    """n values of an integer dtype that include its extremes (min, max, their neighbours, 0, 1; 2**63 + 10
    for uint64), shuffled by seed."""
    info = np.iinfo(dtype)
    vals = [info.min, info.max, info.min + 1, info.max - 1, 0, 1]
    if dtype == "uint64":
        vals += [2**63 + 10, 2**63 - 1]
    rng = np.random.default_rng(seed)
    vals += [int(v) for v in rng.integers(info.min, info.max, size=n, dtype=dtype, endpoint=True)]
    return rng.permutation(np.array(vals, dtype=dtype))[:n]


def _ext_ref(x: np.ndarray, y: np.ndarray, join: str, agg: str) -> np.ndarray:
    """'ij,jk->ik' extended: agg over j of join(x[i, j], y[j, k]) in numpy's dtype (integers wrap)."""
    with np.errstate(all="ignore"):
        return _agg(agg, JOIN_REF[join](x[:, :, None], y[None, :, :]), axis=1)


# ---- 1. integer dtypes over their whole range --------------------------------------------------------------
def test_uint64_above_2_63_reduces_exactly():
    x = np.array([1, 2**63 + 10, 5], np.uint64)
    for agg in ("max", "min", "sum", "prod"):
        got = ts.einsum("i->", x, agg=agg)
        assert got.dtype == np.uint64 and got == _agg(agg, x), agg
    assert ts.einsum("i->", x, agg="max") == 2**63 + 10
    np.testing.assert_array_equal(ts.relu(x), x)
    y = np.array([3, 2**64 - 1, 2**63], np.uint64)
    np.testing.assert_array_equal(ts.einsum("i,i->i", x, y, join="max"), np.maximum(x, y))
    np.testing.assert_array_equal(ts.einsum("i,i->i", x, y, join="min"), np.minimum(x, y))
    np.testing.assert_array_equal(ts.einsum("i,i->i", x, y, join="divide"), x / y)


@pytest.mark.parametrize("dtype", INTS)
@pytest.mark.parametrize("join", ops.JOINS)
def test_every_join_and_agg_exact_at_integer_extremes(dtype, join):
    x = extremes(dtype, 12, seed=1).reshape(3, 4)
    y = extremes(dtype, 8, seed=2).reshape(4, 2)
    for agg in ops.AGGS:
        got = ts.einsum("ij,jk->ik", x, y, join=join, agg=agg)
        want = _ext_ref(x, y, join, agg)
        assert got.dtype == want.dtype, (join, agg)
        np.testing.assert_array_equal(got, want, err_msg=f"{join}/{agg} on {dtype}")


@pytest.mark.parametrize("dtype", INTS)
def test_reductions_and_blocked_aggregates_exact_at_integer_extremes(s, dtype):
    x = extremes(dtype, 24, seed=3).reshape(4, 6)
    y = extremes(dtype, 12, seed=4).reshape(6, 2)
    for agg in ops.AGGS:
        np.testing.assert_array_equal(ts.einsum("ij->i", x, agg=agg), _agg(agg, x, axis=1))
        np.testing.assert_array_equal(ts.einsum("ij->", x, agg=agg), _agg(agg, x))
        # split over the reduced label: partial blocks meet in the fused aggregate and the block aggregates
        xs = s.from_numpy(x, block_shape=(2, 2))
        ys = s.from_numpy(y, block_shape=(2, 1))
        for join in ("multiply", "max", "subtract"):
            got = s.einsum("ij,jk->ik", xs, ys, join=join, agg=agg).numpy()
            np.testing.assert_array_equal(got, _ext_ref(x, y, join, agg), err_msg=f"{join}/{agg} blocked")
        np.testing.assert_array_equal(s.einsum("ij->j", xs, agg=agg).numpy(), _agg(agg, x, axis=0))


@pytest.mark.parametrize("dtype", INTS)
def test_relations_hold_every_integer_dtype(s, dtype):
    x = extremes(dtype, 12, seed=5).reshape(3, 4)
    rel = s.from_numpy(x, block_shape=(2, 3))
    assert rel.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(rel.numpy(), x)
    np.testing.assert_array_equal(s.einsum("ij->ji", rel).numpy(), x.T)
    np.testing.assert_array_equal(s.einsum("ij,kj->ik", rel, x).numpy(), np.einsum("ij,kj->ik", x, x))


@pytest.mark.parametrize("dtype", INTS)
def test_from_sql_builds_integer_relations_exactly(s, dtype):
    x = extremes(dtype, 6, seed=13)
    rows = ", ".join(f"({i}, {int(v)})" for i, v in enumerate(x))
    rel = s.from_sql(f"SELECT * FROM (VALUES {rows}) t(i, v)", shape=(6,), block_shape=(4,), dtype=dtype)
    got = rel.numpy()
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, x)


@pytest.mark.parametrize("dtype", INTS)
def test_sql_kernels_compute_in_the_integer_dtype(con, dtype):
    x = extremes(dtype, 6, seed=6)
    y = extremes(dtype, 6, seed=7)
    for join in ("max", "min", "absdiff", "subtract", "multiply"):
        b = con.execute(
            "SELECT tensor_einsum('i,i->i', ?, 'sum', ?, ?::BLOB, [6], ?::BLOB, [6])",
            [join, dtype, x.tobytes(), y.tobytes()],
        ).fetchone()[0]
        with np.errstate(all="ignore"):
            want = JOIN_REF[join](x, y)
        np.testing.assert_array_equal(np.frombuffer(b, dtype), want, err_msg=join)
    for agg in ops.AGGS:
        b = con.execute(
            f"SELECT {ops.AGG_FUNCS[agg]}(b, ?) FROM (VALUES (?::BLOB), (?::BLOB)) t(b)",
            [dtype, x.tobytes(), y.tobytes()],
        ).fetchone()[0]
        np.testing.assert_array_equal(np.frombuffer(b, dtype), _agg(agg, np.stack([x, y]), axis=0))


@pytest.mark.parametrize("to", [*INTS, "float32", "float64"])
@pytest.mark.parametrize("frm", [*INTS, "float64"])
def test_cast_between_integer_dtypes_is_numpys_astype(con, frm, to):
    x = extremes(frm, 8, seed=8) if frm in INTS else np.array([0.0, 1.5, -1.0, -2.75, 100.25, 3e5, 7.0, -0.5])
    b = con.execute("SELECT tensor_cast(?::BLOB, ?, ?)", [x.tobytes(), frm, to]).fetchone()[0]
    with np.errstate(all="ignore"):
        want = x.astype(to)
    if frm == "float64" and to in INTS:  # out of range values: the kernels clamp, numpy's C cast is undefined
        ok = (x >= np.iinfo(to).min) & (x <= np.iinfo(to).max)
        np.testing.assert_array_equal(np.frombuffer(b, to)[ok], want[ok])
    else:
        np.testing.assert_array_equal(np.frombuffer(b, to), want)


# ---- maps: numpy's result dtypes, from Python and from SQL -------------------------------------------------
def _map_input(dtype: str) -> np.ndarray:
    if dtype == "bool":
        return np.array([True, False, True, True])
    if dtype in INTS:
        return extremes(dtype, 8, seed=9)
    x = np.array([0.5, -1.25, 3.0, 0.0, 2.0, -7.5, 1e3, 1e-3])
    if dtype.startswith("complex"):
        x = x + 1j * x[::-1]
    return x.astype(dtype)


def _numpy_map(fn: str, x: np.ndarray):
    """numpy's result of map fn, or the exception class numpy raises."""
    with np.errstate(all="ignore"):
        try:
            return MAP_REF[fn](x, MAP_PARAMS.get(fn))
        except (TypeError, ValueError, OverflowError) as exc:
            return type(exc)


def _check_values(got: np.ndarray, want: np.ndarray) -> None:
    if want.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want)
    else:  # one libm call per element, or a cast of an exact integer: a few ulps of the result
        assert_close(got, want, elementwise_tolerance(want, want.dtype))


@pytest.mark.parametrize("dtype", ALL)
@pytest.mark.parametrize("fn", ops.MAPS)
def test_map_result_dtype_and_values_follow_numpy(fn, dtype):
    x = _map_input(dtype)
    want = _numpy_map(fn, x)
    p = MAP_PARAMS.get(fn)
    if dtype.startswith("complex") and not ops.lookup("map", fn).complex:  # relu: tensorsql's choice
        with pytest.raises(ts.DTypeError, match=f"map '{fn}' is not defined for complex dtype {dtype}"):
            ts.map(x, fn, p)
        return
    if isinstance(want, type):  # numpy has no result (neg of bool)
        with pytest.raises(ts.DTypeError, match=f"map '{fn}' is not defined for .*{dtype}"):
            ts.map(x, fn, p)
        return
    assert ops.map_dtype(fn, dtype, p) == want.dtype.name
    got = np.asarray(ts.map(x, fn, p))
    assert got.dtype == want.dtype, f"{fn} on {dtype}: {got.dtype}, numpy {want.dtype}"
    _check_values(got, want)


@pytest.mark.parametrize("dtype", [d for d in KERNEL if d in INTS or d.startswith("float")])
def test_relation_maps_have_numpys_dtype_or_its_carrier(s, dtype):
    x = _map_input(dtype)
    rel = s.from_numpy(x)
    for fn in ops.MAPS:
        want = _numpy_map(fn, x)
        if isinstance(want, type):
            continue
        got = s.map(rel, fn, MAP_PARAMS.get(fn)).numpy()
        carrier = {"float16": "float32"}.get(want.dtype.name, want.dtype.name)  # relations hold no float16
        assert got.dtype == np.dtype(carrier), fn
        with np.errstate(over="ignore"):  # float32 values rounded to numpy's float16 (overflowing to inf)
            _check_values(got.astype(want.dtype), want)


@pytest.mark.parametrize("dtype", KERNEL)
@pytest.mark.parametrize("fn", ops.MAPS)
def test_sql_tensor_map_computes_in_its_dtype(con, fn, dtype):
    """tensor_map returns its input's dtype: a map numpy defines there with that result dtype gives numpy's
    values (neg of uint8 wraps in uint8); any other is refused (a float-valued function of an integer
    dtype)."""
    x = _map_input(dtype)
    op = ops.lookup("map", fn)
    p = MAP_PARAMS.get(fn)
    sql = "SELECT tensor_map(?, ?, ?::BLOB" + (", ?)" if op.takes_param else ")")
    args = [fn, dtype, x.tobytes()] + ([float(p)] if op.takes_param else [])
    want = _numpy_map(fn, x)
    if isinstance(want, type) or want.dtype != x.dtype or (dtype.startswith("complex") and not op.complex):
        if fn == "abs" and dtype.startswith("complex"):  # |z| + 0j in the complex dtype
            b = con.execute(sql, args).fetchone()[0]
            _check_values(np.frombuffer(b, dtype).real, want)
            return
        with pytest.raises(duckdb.Error, match=f"tensor_map: fn '{fn}' is not defined for"):
            con.execute(sql, args).fetchall()
        return
    b = con.execute(sql, args).fetchone()[0]
    _check_values(np.frombuffer(b, dtype), want)


# ---- 5. non-finite and out-of-range map params -------------------------------------------------------------
def test_non_finite_params_on_integers_follow_numpy():
    x = np.arange(-2, 3, dtype=np.int64)
    with np.errstate(all="ignore"):
        for fn, p in [
            ("pow", math.nan),
            ("pow", math.inf),
            ("scale", math.inf),
            ("scale", -math.inf),
            ("scale", math.nan),
            ("pow", 0.5),
            ("scale", 2.5),
        ]:
            want = MAP_REF[fn](x, p)
            got = ts.map(x, fn, p)
            assert got.dtype == want.dtype == np.float64, (fn, p)
            np.testing.assert_array_equal(got, want)  # IEEE results of exact inputs: the same bits


def test_integer_params_out_of_the_dtypes_range_raise_range_error():
    with pytest.raises(
        ts.RangeError, match=r"map 'scale': factor 300 is out of range for dtype int8"
    ) as info:
        ts.scale(np.arange(3, dtype=np.int8), 300)
    assert isinstance(info.value, OverflowError) and isinstance(info.value, ts.TensorSQLError)
    with pytest.raises(ts.RangeError, match=r"factor -1 is out of range for dtype uint8"):
        ts.scale(np.arange(3, dtype=np.uint8), -1)
    with pytest.raises(OverflowError, match=r"exponent 70000 is out of range for dtype int16"):
        ts.pow(np.arange(3, dtype=np.int16), 70000)
    np.testing.assert_array_equal(
        ts.scale(np.arange(3, dtype=np.int8), 127), np.arange(3, dtype=np.int8) * 127
    )


def test_integer_params_without_an_exact_float64_raise_range_error():
    """A map's param travels as a DOUBLE: 2**53 + 1 used to arrive as 2**53, silently."""
    x = np.arange(3, dtype=np.int64)
    for p in (2**53 + 1, -(2**61) - 3, np.int64(2**62 + 1)):
        with pytest.raises(ts.RangeError, match=r"integer param -?\d+ has no exact float64 value"):
            ts.scale(x, p)
    np.testing.assert_array_equal(ts.scale(x, 2**53), x * 2**53)  # exact: kept
    np.testing.assert_array_equal(ts.scale(x, np.int64(3)), x * 3)


def test_sql_tensor_map_refuses_non_integer_params_on_integers(con):
    x = np.arange(3, dtype=np.int64).tobytes()
    for fn, p, what in [
        ("scale", "inf", "factor"),
        ("scale", "nan", "factor"),
        ("scale", "0.5", "factor"),
        ("pow", "nan", "exponent"),
    ]:
        with pytest.raises(
            duckdb.Error, match=f"tensor_map: fn '{fn}' on int64 needs an integer {what}.*got {p}"
        ):
            con.execute(f"SELECT tensor_map('{fn}', 'int64', ?::BLOB, '{p}'::DOUBLE)", [x]).fetchall()
    with pytest.raises(duckdb.Error, match=r"needs an integer factor in \[-128, 127\], got 300"):
        con.execute("SELECT tensor_map('scale', 'int8', ?::BLOB, 300)", [b"\x01\x02"]).fetchall()


# ---- 2. reductions over an empty axis: one rule from Python and SQL ----------------------------------------
EMPTY_CASES = [
    ("ij->i", [(3, 0)]),
    ("ij->", [(0, 4)]),
    ("ii->", [(0, 0)]),
    ("ij,jk->ik", [(3, 0), (0, 2)]),
    ("ij,k->ik", [(2, 0), (3,)]),
]


@pytest.mark.parametrize("eq,shapes", EMPTY_CASES, ids=[c[0] for c in EMPTY_CASES])
@pytest.mark.parametrize("dtype", ["float64", "int32", "uint64", "complex128"])
def test_empty_reductions_follow_numpy_from_python(s, eq, shapes, dtype):
    arrays = [np.ones(sh, dtype=dtype) for sh in shapes]
    for agg in ops.AGGS:
        if dtype.startswith("complex") and agg in ("max", "min"):
            continue
        join = "multiply" if len(arrays) == 2 else None
        if agg in ("max", "min"):
            with pytest.raises(
                ts.EinsumError, match=rf"agg='{agg}' reduces over label '.' of size 0"
            ) as info:
                ts.einsum(eq, *arrays, agg=agg)
            assert isinstance(info.value, ValueError) and "which has no identity" in str(info.value)
            with pytest.raises(ValueError, match="zero-size array"):  # numpy's own
                AGG_REF[agg](np.ones((2, 0)), axis=1)
            continue
        identity = AGG_REF[agg](np.zeros(0, dtype))  # sum: 0, prod: 1
        want = np.full(np.einsum(eq, *arrays).shape, identity, dtype=dtype)
        got = ts.einsum(eq, *arrays, agg=agg, join=join)
        np.testing.assert_array_equal(got, want, err_msg=f"{eq} agg={agg}")
        assert np.asarray(got).dtype == want.dtype
        rels = [s.from_numpy(a) for a in arrays]
        np.testing.assert_array_equal(s.einsum(eq, *rels, agg=agg).numpy(), want)


def test_empty_reductions_follow_numpy_from_sql(s):
    # the same rule in the kernels, called from SQL
    for agg, want in (("sum", [0.0, 0.0]), ("prod", [1.0, 1.0])):
        b = s.execute(f"SELECT tensor_einsum1('ij->i', '{agg}', 'float64', ''::BLOB, [2, 0])")[0][0]
        np.testing.assert_array_equal(np.frombuffer(b, np.float64), want)
        b = s.execute(
            f"SELECT tensor_einsum('ij,jk->ik', 'add', '{agg}', 'int64', ''::BLOB, [2, 0], ''::BLOB, [0, 1])"
        )[0][0]
        np.testing.assert_array_equal(np.frombuffer(b, np.int64), np.array(want, np.int64))
    for agg, name in (("max", "maximum"), ("min", "minimum")):
        e = "''::BLOB"
        for sql in (
            f"SELECT tensor_einsum1('ij->i', '{agg}', 'float64', {e}, [2, 0])",
            f"SELECT tensor_einsum('ij,jk->ik', 'add', '{agg}', 'uint64', {e}, [2, 0], {e}, [0, 1])",
            f"SELECT tensor_einsum_agg('ij,jk->ik', 'multiply', '{agg}', 'float32', {e}, [2, 0], {e}, [0,1])",
        ):
            with pytest.raises(
                ts.KernelError, match=rf"agg '{agg}' reduces over label 'j' of size 0.*{name}"
            ):
                s.execute(sql)


# ---- 3. summation accuracy ---------------------------------------------------------------------------------
def _sum_bound(x: np.ndarray, n: int) -> float:
    """The error bound of a pairwise sum of n terms: every term passes through at most log2(n) additions of
    the tree, plus the ~128/8 + 3 of its run (8 interleaved accumulators) and a few more where partial sums of
    blocks meet; each rounds by eps, so |err| <= (log2(n) + 24)·eps·Σ|x| (a sequential sum's: n·eps·Σ|x|)."""
    return (math.log2(n) + 24) * eps(x.dtype) * float(np.abs(x.astype(np.float64)).sum())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_large_sums_are_pairwise(s, dtype):
    n = 10**6
    x = np.random.default_rng(11).random(n).astype(dtype)
    exact = math.fsum(x.astype(np.float64))
    bound = _sum_bound(x, n)
    numpy_err = abs(float(np.sum(x)) - exact)
    assert numpy_err <= bound  # the bound holds for numpy's own pairwise sum
    for got in (
        ts.einsum("i->", x),
        s.einsum("i->", s.from_numpy(x, blocks=(4,))).numpy(),  # blocks' partial sums meet in tensor_sum
        ts.einsum("ij->", x.reshape(1000, 1000)),
        ts.einsum("i,i->", x, np.zeros(n, dtype), join="add"),  # the generic binary loop
        ts.einsum(
            "ij,k->k", x.reshape(1000, 1000), np.ones(1, dtype)
        ),  # a private label summed while packing
    ):
        assert abs(float(np.asarray(got).ravel()[0]) - exact) <= bound
    rows = x.reshape(100, 10**4)
    got = ts.einsum("ij->i", rows)
    exact_rows = np.array([math.fsum(r) for r in rows.astype(np.float64)])
    bounds = np.array([_sum_bound(r, r.size) for r in rows])
    assert np.all(np.abs(got.astype(np.float64) - exact_rows) <= bounds)


# ---- 4. non-ASCII labels in a kernel's spec ----------------------------------------------------------------
@pytest.mark.parametrize("label", ["é", "ж", "中", "𝄞"])
def test_non_ascii_labels_give_a_valid_utf8_error(con, s, label):
    one = "tensor_from_list([1.0], 'float64')"
    for sql in (
        f"SELECT tensor_einsum1('i{label}->i', 'sum', 'float64', {one}, [1, 1])",
        f"SELECT tensor_einsum('i,i->{label}', 'multiply', 'sum', 'float64', {one}, [1], {one}, [1])",
        f"SELECT tensor_einsum_path('0,1:i{label},i->i', 'float64', [1, 1, 1], {one}, {one})",
    ):
        # the whole character is quoted: the message is valid UTF-8 (no UnicodeDecodeError in the client)
        with pytest.raises(duckdb.InvalidInputException, match=f"invalid (output )?label '{label}'"):
            con.execute(sql).fetchall()
        with pytest.raises(ts.KernelError, match=f"label '{label}'"):
            s.execute(sql)
    for sql in (
        f"SELECT tensor_map('ex{label}p', 'float64', {one})",
        f"SELECT tensor_numel({one}, 'f{label}')",
    ):
        with pytest.raises(duckdb.InvalidInputException, match=f"'(ex{label}p|f{label})'"):
            con.execute(sql).fetchall()


# ---- 6. exact lists ----------------------------------------------------------------------------------------
LIST_FUNCTIONS = {"tensor_to_list": float, "tensor_to_bigint_list": int, "tensor_to_ubigint_list": int}


def _exact_in(fn: str, dtype: str) -> bool:
    dt = np.dtype(dtype)
    if fn == "tensor_to_list":
        return dt.kind == "f" or (dt.kind in "iu" and dt.itemsize <= 4)
    if fn == "tensor_to_bigint_list":
        return dt.kind == "i" or (dt.kind == "u" and dt.itemsize <= 4)
    return dt.kind == "u"


@pytest.mark.parametrize("dtype", KERNEL)
def test_list_conversions_are_exact_or_refused(con, dtype):
    x = extremes(dtype, 8, seed=12) if dtype in INTS else _map_input(dtype)
    for fn in LIST_FUNCTIONS:
        sql = f"SELECT {fn}(?::BLOB, ?)"
        if dtype.startswith("complex"):
            with pytest.raises(duckdb.Error, match="is complex"):
                con.execute(sql, [x.tobytes(), dtype]).fetchall()
        elif _exact_in(fn, dtype):
            got = con.execute(sql, [x.tobytes(), dtype]).fetchone()[0]
            assert got == [LIST_FUNCTIONS[fn](v) for v in x.tolist()], fn
        else:
            right = next(f for f in LIST_FUNCTIONS if _exact_in(f, dtype))
            with pytest.raises(
                duckdb.Error, match=rf"{fn}: dtype {dtype} does not convert exactly.*use {right}"
            ):
                con.execute(sql, [x.tobytes(), dtype]).fetchall()
    if dtype.startswith("complex"):
        return
    if dtype in INTS:
        lists = (
            [("BIGINT[]", [int(v) for v in x])] if dtype != "uint64" else [("UBIGINT[]", [int(v) for v in x])]
        )
    else:
        lists = [("DOUBLE[]", [float(v) for v in x])]
    for sql_type, values in lists:
        b = con.execute(f"SELECT tensor_from_list(?::{sql_type}, ?)", [values, dtype]).fetchone()[0]
        np.testing.assert_array_equal(np.frombuffer(b, dtype), x)


def test_int64_beyond_2_53_roundtrips_exactly(con):
    big = [2**53 + 1, -(2**63), 2**63 - 1]
    got = con.execute(
        "SELECT tensor_to_bigint_list(tensor_from_list(?::BIGINT[], 'int64'), 'int64')", [big]
    ).fetchone()[0]
    assert got == big
    top = [2**64 - 1, 2**63 + 1, 0]
    got = con.execute(
        "SELECT tensor_to_ubigint_list(tensor_from_list(?::UBIGINT[], 'uint64'), 'uint64')", [top]
    ).fetchone()[0]
    assert got == top
    with pytest.raises(duckdb.Error, match="tensor_get: dtype int64 does not convert exactly to DOUBLE"):
        con.execute("SELECT tensor_get(tensor_from_list([1], 'int64'), 'int64', [1], [0])").fetchall()
