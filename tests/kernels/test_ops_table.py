"""The operator table (tensorsql/ir/ops.py) agrees with the planner's names, the C++ kernels and the docs.

The C++ side is checked by calling the kernels with every operator name from the table on tiny blocks and
comparing with numpy, and by reading the list of valid names from the error an unknown name raises.
"""

from __future__ import annotations

import pathlib
import re

import duckdb
import numpy as np
import pytest
from numpy_ref import MAP_REF

import planner
import tensorsql as ts
import udf_kernels
from tensorsql.errors import DTypeError, OperatorError
from tensorsql.ir import ops
from udf_kernels import sink as udf_sink

ROOT = pathlib.Path(__file__).resolve().parents[2]

#: numpy references, one per operator of the table (test_every_op_has_a_reference checks there is one each)
JOIN_REF = {
    "multiply": np.multiply,
    "add": np.add,
    "subtract": np.subtract,
    "divide": lambda x, y: x / y,
    "sqdiff": lambda x, y: (x - y) * (x - y),
    "absdiff": lambda x, y: np.abs(x - y),
    "max": np.maximum,
    "min": np.minimum,
    **{  # comparisons: 1/0 masks in the operands' dtype
        name: (lambda f: lambda x, y: f(x, y).astype(np.result_type(x, y)))(getattr(np, name))
        for name in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
    },
}
AGG_REF = {"sum": np.sum, "max": np.max, "min": np.min, "prod": np.prod}
PARAMS = {"exponent": 3.0, "factor": 2.0, "base": 1.5}

DTYPES = list(udf_sink.DTYPES)  # the kernels' dtypes


def _is_int(dtype: str) -> bool:
    return np.dtype(dtype).kind in "iu"


# ---- the table itself ----------------------------------------------------------------------------------
def test_table_is_well_formed():
    keys = [(op.kind, op.name) for op in ops.OPS]
    assert len(keys) == len(set(keys))
    for op in ops.OPS:
        assert op.kind in ops.KINDS and op.name and op.doc and "\n" not in op.doc
        assert op.arity == (1 if op.kind == "map" else 2)
        assert (op.identity is not None) == (op.kind == "agg")
        assert op.param is None or op.kind == "map"
        assert op.promotes in (ops.NEVER, ops.ALWAYS, ops.FRACTIONAL_PARAM, ops.NEGATIVE_OR_FRACTIONAL_PARAM)
        assert op.promotes in (ops.NEVER, ops.ALWAYS) or op.takes_param
        assert ops.lookup(op.kind, op.name) is op


def test_derived_lists():
    # the lists tensorsql had before the table, unchanged
    assert ops.JOINS == (
        "multiply", "add", "subtract", "divide", "sqdiff", "absdiff", "max", "min",
        "greater", "greater_equal", "less", "less_equal", "equal", "not_equal",
    )  # fmt: skip
    assert ops.AGGS == ("sum", "max", "min", "prod")
    assert ops.MAPS == (
        "exp", "log", "sqrt", "relu", "neg", "abs", "pow", "scale", "square", "reciprocal", "sigmoid", "tanh",
        "softplus", "rpow",
    )  # fmt: skip
    assert ops.FLOAT_MAPS == ("exp", "log", "sqrt", "reciprocal", "sigmoid", "tanh", "softplus", "rpow")
    assert dict(ops.AGG_FUNCS) == {
        "sum": "tensor_sum",
        "max": "tensor_max",
        "min": "tensor_min",
        "prod": "tensor_prod",
    }
    assert set(ops.AGG_FUNCS.values()) <= set(udf_kernels.SQL_FUNCTIONS)
    assert {op.sql_function for op in ops.OPS} <= set(udf_kernels.SQL_FUNCTIONS)


def test_every_op_has_a_reference():
    assert set(JOIN_REF) == set(ops.JOINS) and set(AGG_REF) == set(ops.AGGS) and set(MAP_REF) == set(ops.MAPS)


def test_lookup_and_checks():
    with pytest.raises(OperatorError, match="unknown join 'nope'; valid joins: multiply, add"):
        ops.lookup("join", "nope")
    with pytest.raises(OperatorError, match="unknown agg 'mean'; valid aggregations: sum, max, min, prod"):
        ops.check_ops("multiply", "mean", "float64")
    with pytest.raises(OperatorError, match="unknown map function 'cosh'; valid: exp, log"):
        ops.check_map("cosh")
    with pytest.raises(OperatorError):
        ops.lookup("agg", None)
    with pytest.raises(ValueError, match="unknown operator kind"):
        ops.lookup("reduce", "sum")
    for join in ops.JOINS:
        for agg in ops.AGGS:
            ops.check_ops(join, agg, "float64")
            ok = ops.lookup("join", join).complex and ops.lookup("agg", agg).complex
            if ok:
                ops.check_ops(join, agg, "complex64")
            else:
                with pytest.raises(DTypeError, match="not defined for complex dtype complex64"):
                    ops.check_ops(join, agg, "complex64")
    assert ops.check_map("exp") is None and ops.check_map("pow", 2) == 2.0
    with pytest.raises(OperatorError, match="needs a param"):
        ops.check_map("scale")
    with pytest.raises(OperatorError, match="takes no param"):
        ops.check_map("exp", 1.0)
    with pytest.raises(OperatorError, match="is not a number"):
        ops.check_map("pow", "two")
    assert ops.join_dtype("divide", "int32") == "float64" and ops.join_dtype("add", "int32") == "int32"
    assert ops.join_dtype("divide", "float32") == "float32"


def test_map_dtype_rules():
    for fn in ops.MAPS:
        p = PARAMS.get(ops.lookup("map", fn).param or "")
        want = "float64" if fn in ops.FLOAT_MAPS else "int64"
        assert ops.map_dtype(fn, "int64", p) == want
        assert ops.map_dtype(fn, "float32", p) == "float32"
    assert (
        ops.map_dtype("pow", "int32", -1.0) == "float64" and ops.map_dtype("pow", "int32", 0.5) == "float64"
    )
    assert (
        ops.map_dtype("scale", "int32", -3.0) == "int32" and ops.map_dtype("scale", "int32", 0.5) == "float64"
    )
    assert ops.map_dtype("scale", "int32", float("nan")) == "float64"
    with pytest.raises(DTypeError, match="map 'relu' is not defined for complex dtype complex128"):
        ops.map_dtype("relu", "complex128")


@pytest.mark.parametrize("dtype", DTYPES)
def test_agg_identity(dtype):
    for agg, ref in AGG_REF.items():
        op = ops.lookup("agg", agg)
        if dtype.startswith("complex") and not op.complex:
            continue
        got = ops.agg_identity(agg, dtype)
        assert got.dtype == np.dtype(dtype)
        if agg in ("sum", "prod"):
            assert got == ref(np.zeros(0, dtype=dtype))  # numpy's own empty reduction
        elif _is_int(dtype):
            info = np.iinfo(dtype)
            assert got == (info.min if agg == "max" else info.max)
        else:
            assert got == (-np.inf if agg == "max" else np.inf)


# ---- the planner's names -------------------------------------------------------------------------------
def test_planner_names_agree():
    assert planner.ops.JOINS == ops.JOINS
    assert planner.ops.AGGS == ops.AGGS
    assert planner.ops.MAPS == ops.MAPS
    assert frozenset(ops.JOINS) == planner.JOIN_FUNCTIONS and frozenset(ops.AGGS) == planner.AGG_FUNCTIONS
    for join in ops.JOINS:
        for agg in ops.AGGS:
            planner.EinSum.parse("ij,jk->ik", (2, 3), (3, 4), join=join, agg=agg)


# ---- the C++ kernels -----------------------------------------------------------------------------------


def _blob(a: np.ndarray) -> bytes:
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<")).tobytes()


def _unblob(b: bytes, dtype: str, shape) -> np.ndarray:
    return np.frombuffer(b, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)


def _rand(shape, dtype: str, rng: np.random.Generator, positive: bool = False) -> np.ndarray:
    if _is_int(dtype):
        low = 1 if positive else (0 if np.dtype(dtype).kind == "u" else -4)
        return rng.integers(low, 5, size=shape).astype(dtype)
    x = rng.uniform(0.5 if positive else -2.0, 2.0, size=shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.uniform(0.5 if positive else -2.0, 2.0, size=shape)
    return x.astype(dtype)


def _close(got: np.ndarray, want: np.ndarray, dtype: str) -> None:
    want = np.asarray(want).astype(dtype)
    if _is_int(dtype):
        np.testing.assert_array_equal(got, want)
    else:
        tol = 1e-4 if dtype in ("float32", "complex64") else 1e-10
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


def _valid_names(con, sql: str, args: list) -> list[str]:
    with pytest.raises(duckdb.Error) as info:
        con.execute(sql, args).fetchall()
    m = re.search(r"\(valid: ([^)]*)\)", str(info.value))
    assert m, str(info.value)
    return m.group(1).split(", ")


def test_kernels_know_exactly_the_tables_names(con):
    x = _blob(np.ones(1))
    einsum = "SELECT tensor_einsum('i,i->i', ?, ?, 'float64', ?::BLOB, [1], ?::BLOB, [1])"
    assert tuple(_valid_names(con, einsum, ["nope", "sum", x, x])) == ops.JOINS
    assert tuple(_valid_names(con, einsum, ["multiply", "nope", x, x])) == ops.AGGS
    unary = "SELECT tensor_einsum1('i->', ?, 'float64', ?::BLOB, [1])"
    assert tuple(_valid_names(con, unary, ["nope", x])) == ops.AGGS
    assert tuple(_valid_names(con, "SELECT tensor_map(?, 'float64', ?::BLOB)", ["nope", x])) == ops.MAPS
    assert tuple(_valid_names(con, "SELECT tensor_map(?, 'float64', ?::BLOB, 1.0)", ["", x])) == ops.MAPS


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("join", ops.JOINS)
def test_every_join_in_the_kernel(con, join, dtype):
    op = ops.lookup("join", join)
    rng = np.random.default_rng(1)
    x, y = _rand((2, 3), dtype, rng), _rand((2, 3), dtype, rng, positive=True)  # y > 0: divide
    sql = "SELECT tensor_einsum('ij,ij->ij', ?, 'sum', ?, ?::BLOB, [2, 3], ?::BLOB, [2, 3])"
    args = [join, dtype, _blob(x), _blob(y)]
    if dtype.startswith("complex") and not op.complex:
        with pytest.raises(duckdb.Error, match=f"join '{join}' is not defined for complex"):
            con.execute(sql, args).fetchall()
        return
    got = _unblob(con.execute(sql, args).fetchone()[0], dtype, (2, 3))
    want = JOIN_REF[join](x, y)
    if join == "divide" and _is_int(dtype):
        want = np.trunc(x / y)  # the kernel's integer division truncates (tensorsql promotes first)
    _close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("agg", ops.AGGS)
def test_every_agg_in_the_kernel(con, agg, dtype):
    op = ops.lookup("agg", agg)
    rng = np.random.default_rng(2)
    x, y = _rand((2, 3), dtype, rng), _rand((3, 2), dtype, rng)
    calls = {
        # the join's aggregation over j, the unary reduction, the block aggregate, an empty reduction
        "einsum": (
            "SELECT tensor_einsum('ij,jk->ik', 'multiply', ?, ?, ?::BLOB, [2, 3], ?::BLOB, [3, 2])",
            [agg, dtype, _blob(x), _blob(y)],
            (2, 2),
            AGG_REF[agg](x[:, :, None] * y[None, :, :], axis=1),
        ),
        "einsum1": (
            "SELECT tensor_einsum1('ij->i', ?, ?, ?::BLOB, [2, 3])",
            [agg, dtype, _blob(x)],
            (2,),
            AGG_REF[agg](x, axis=1),
        ),
        "aggregate": (
            f"SELECT {ops.AGG_FUNCS[agg]}(b, ?) FROM (VALUES (?::BLOB), (?::BLOB)) t(b)",
            [dtype, _blob(x), _blob(y.reshape(2, 3))],
            (2, 3),
            AGG_REF[agg](np.stack([x, y.reshape(2, 3)]), axis=0),
        ),
        # numpy's rule: the identity where there is one (sum 0, prod 1), an error for max/min
        "empty": (
            "SELECT tensor_einsum1('ij->i', ?, ?, ?::BLOB, [2, 0])",
            [agg, dtype, b""],
            (2,),
            AGG_REF[agg](np.zeros((2, 0), dtype), axis=1) if op.empty is None else None,
        ),
    }
    for sql, args, shape, want in calls.values():
        if dtype.startswith("complex") and not op.complex:
            with pytest.raises(duckdb.Error, match="not defined for complex"):
                con.execute(sql, args).fetchall()
            continue
        if want is None:
            with pytest.raises(duckdb.Error, match=f"agg '{agg}' reduces over label 'j' of size 0"):
                con.execute(sql, args).fetchall()
            continue
        got = _unblob(con.execute(sql, args).fetchone()[0], dtype, shape)
        _close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", ops.MAPS)
def test_every_map_in_the_kernel(con, fn, dtype):
    op = ops.lookup("map", fn)
    x = _rand((5,), dtype, np.random.default_rng(3), positive=fn in ("log", "sqrt"))
    p = PARAMS[op.param] if op.param else None
    sql = "SELECT tensor_map(?, ?, ?::BLOB" + (", ?)" if op.takes_param else ")")
    args = [fn, dtype, _blob(x)] + ([p] if op.takes_param else [])
    if (dtype.startswith("complex") and not op.complex) or (
        _is_int(dtype) and op.promotes == ops.ALWAYS
    ):
        # not defined there: tensorsql promotes integer input first (ops.map_dtype), the kernel refuses it
        with pytest.raises(duckdb.Error, match=f"fn '{fn}' is not defined for"):
            con.execute(sql, args).fetchall()
        return
    got = _unblob(con.execute(sql, args).fetchone()[0], dtype, (5,))
    _close(got, MAP_REF[fn](x, p), dtype)
    if op.takes_param:  # without its param the kernel refuses it
        with pytest.raises(duckdb.Error, match="needs a param"):
            con.execute("SELECT tensor_map(?, ?, ?::BLOB)", args[:3]).fetchall()


# ---- tensorsql's behaviour follows the table -----------------------------------------------------------
def test_tensorsql_follows_the_table():
    s = ts.connect(threads=1)
    try:
        xi = np.arange(1, 7, dtype=np.int64).reshape(2, 3)
        for fn in ops.MAPS:
            op = ops.lookup("map", fn)
            p = PARAMS[op.param] if op.param else None
            got = np.asarray(ts.map(xi, fn, p))
            assert got.dtype.name == ops.map_dtype(fn, "int64", p), fn
            np.testing.assert_allclose(got, MAP_REF[fn](xi.astype(got.dtype), p), rtol=1e-12)
        xc = np.ones((2, 2), dtype=np.complex128)
        for join in ops.JOINS:
            for agg in ops.AGGS:
                if ops.lookup("join", join).complex and ops.lookup("agg", agg).complex:
                    continue
                with pytest.raises(DTypeError):
                    s.einsum("ij,jk->ik", xc, xc, join=join, agg=agg)
        with pytest.raises(DTypeError):
            ts.map(xc, "relu")
        with pytest.raises(OperatorError, match="valid joins: " + ", ".join(ops.JOINS)):
            s.einsum("ij,jk->ik", xi, xi.T, join="nope")
        with pytest.raises(OperatorError, match="valid aggregations: " + ", ".join(ops.AGGS)):
            s.einsum("ij,jk->ik", xi, xi.T, agg="nope")
        with pytest.raises(OperatorError, match="valid: " + ", ".join(ops.MAPS)):
            ts.map(xi, "nope")
        assert s.einsum("ij,jk->ik", xi, xi.T, join="divide").numpy().dtype == np.float64
    finally:
        s.close()


# ---- the docs -------------------------------------------------------------------------------------------
def test_docs_operator_table_is_generated():
    """The docs' operator table is the table of ``ops`` itself, rendered when the docs are built."""
    import importlib.util

    page = (ROOT / "docs" / "user-guide" / "operators.md").read_text(encoding="utf-8")
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)
    assert hooks.OPERATOR_TABLE in page
    assert ops.markdown_table() in hooks.on_page_markdown(page, None, None, None)
