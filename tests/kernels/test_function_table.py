"""udf_kernels.SQL_FUNCTIONS against the functions the loaded extension registers in DuckDB, both ways.

The expected names come from SQL_FUNCTIONS itself, never from a list here: a new function is added to the
extension and to SQL_FUNCTIONS, and this test keeps passing.
"""

from __future__ import annotations

import duckdb
import numpy as np
import pytest

import udf_kernels
import udf_kernels.sink

PREFIXES = ("tensor_", "tensorsql_")


def _registered(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()
    return {name for (name,) in rows if name.startswith(PREFIXES)}




def test_no_such_functions_without_the_extension():
    c = duckdb.connect()
    try:
        assert _registered(c) == set()  # so every name below is the extension's
    finally:
        c.close()


def test_every_registered_function_is_documented(con):
    missing = _registered(con) - set(udf_kernels.SQL_FUNCTIONS)
    assert not missing, f"registered by the extension but not in udf_kernels.SQL_FUNCTIONS: {sorted(missing)}"


def test_every_documented_function_is_registered(con):
    absent = set(udf_kernels.SQL_FUNCTIONS) - _registered(con)
    assert not absent, f"in udf_kernels.SQL_FUNCTIONS but not registered by the extension: {sorted(absent)}"


@pytest.mark.parametrize("name", sorted(udf_kernels.SQL_FUNCTIONS))
def test_entry_is_a_signature_and_description(name):
    text = udf_kernels.SQL_FUNCTIONS[name]
    assert name.startswith(PREFIXES)
    assert text.startswith(name + "(") and ") -> " in text and ": " in text, text


# ---- NULL handling, argument by argument (the kernels' shared per-row preamble, rows.hpp) -----------------
X = "tensor_from_list([1.0, 2.0, 3.0, 4.0], 'float64')"  # a 2x2 float64 block
EINSUM = ["'ij,jk->ik'", "'multiply'", "'sum'", "'float64'", X, "[2, 2]", X, "[2, 2]"]
PATH = ["'0,1:ab,bc->ac'", "'float64'", "[2, 2, 2, 2]", X, X]
SINK = ["{key}", "[0, 0]"]  # a 2x2 float64 result sink

#: a valid call of each scalar function with arguments (functions of no argument have no NULL to test)
SCALAR_CALLS = {
    "tensor_einsum": EINSUM,
    "tensor_einsum_into": SINK + EINSUM,
    "tensor_einsum_path": PATH,
    "tensor_einsum_path_into": SINK + PATH,
    "tensor_einsum1": ["'ij->ji'", "'sum'", "'float64'", X, "[2, 2]"],
    "tensor_map": ["'exp'", "'float64'", X],
    "tensor_map/param": ["'scale'", "'float64'", X, "2.0"],
    "tensor_cast": [X, "'float64'", "'int32'"],
    "tensor_zeros": ["'float64'", "[2, 2]"],
    "tensor_slice": ["'float64'", X, "[2, 2]", "[0, 1]", "[2, 2]"],
    "tensor_slice_strided": ["'float64'", X, "[2, 2]", "[1, 1]", "[2, 1]", "[-1, 1]"],
    "tensor_numel": [X, "'float64'"],
    "tensor_itemsize": ["'float64'"],
    "tensor_check": [X, "'float64'", "[2, 2]"],
    "tensor_to_list": [X, "'float64'"],
    "tensor_from_list": ["[1.0, 2.0]", "'float64'"],
    "tensor_get": [X, "'float64'", "[2, 2]", "[1, 0]"],
    "tensor_pin": ["[2, 2]"],
    "tensor_sink_write": [*SINK, "'float64'", X, "[2, 2]"],
}
AGGREGATE_CALLS = {
    "tensor_einsum_agg": EINSUM,
    "tensor_einsum_agg_into": SINK + EINSUM,
    "tensor_sum": [X, "'float64'"],
    "tensor_max": [X, "'float64'"],
    "tensor_min": [X, "'float64'"],
    "tensor_prod": [X, "'float64'"],
    "tensor_assemble": ["'float64'", X, "[2, 2]", "[0, 0]", "[2, 2]"],
    "tensor_pack": ["'float64'", "1", "2.5", "4"],
    "tensor_pack/bigint": ["'float64'", "1", "2", "4"],
}


def _call(name: str, args: list[str], null_at: int | None, key: int) -> str:
    """``name(args)`` over rows i = 0, 1, 2 of range(3); argument null_at is NULL in row 1 only."""
    cols = [
        f"CASE WHEN i = 1 THEN NULL ELSE {a} END" if k == null_at else a for k, a in enumerate(args)
    ]
    return f"{name.split('/')[0]}({', '.join(cols).format(key=key)})"


def test_every_listed_call_is_a_function():
    assert {n.split("/")[0] for n in (*SCALAR_CALLS, *AGGREGATE_CALLS)} <= set(udf_kernels.SQL_FUNCTIONS)


@pytest.mark.parametrize("name", sorted(SCALAR_CALLS))
def test_scalar_null_argument_gives_a_null_row(con, name):
    args = SCALAR_CALLS[name]
    out = np.zeros((2, 2))
    with udf_kernels.sink.Sink(udf_kernels.extension_path(), out) as key:
        for k in range(len(args)):
            sql = f"SELECT {_call(name, args, k, key)} IS NULL FROM range(3) t(i) ORDER BY i"
            assert [r[0] for r in con.execute(sql).fetchall()] == [False, True, False], (name, k)


@pytest.mark.parametrize("name", sorted(AGGREGATE_CALLS))
def test_aggregate_skips_rows_with_a_null_argument(con, name):
    args = AGGREGATE_CALLS[name]
    out = np.zeros((2, 2))
    with udf_kernels.sink.Sink(udf_kernels.extension_path(), out) as key:
        rows = "FROM range(3) t(i)"
        want = con.execute(f"SELECT {_call(name, args, None, key)} {rows} WHERE i <> 1").fetchone()
        assert want[0] is not None
        for k in range(len(args)):
            got = con.execute(f"SELECT {_call(name, args, k, key)} {rows}").fetchone()
            assert got == want, (name, k)
            # a group whose every row has a NULL argument is empty: NULL
            none = con.execute(f"SELECT {_call(name, args, k, key)} {rows} WHERE i = 1").fetchone()
            assert none == (None,), (name, k)
