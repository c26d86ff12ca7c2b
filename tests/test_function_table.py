"""udf_kernels.SQL_FUNCTIONS against the functions the loaded extension registers in DuckDB, both ways.

The expected names come from SQL_FUNCTIONS itself, never from a list here: a new function is added to the
extension and to SQL_FUNCTIONS, and this test keeps passing.
"""

from __future__ import annotations

import duckdb
import pytest

import udf_kernels

PREFIXES = ("tensor_", "tensorsql_")


def _registered(con: duckdb.DuckDBPyConnection) -> set[str]:
    rows = con.execute("SELECT DISTINCT function_name FROM duckdb_functions()").fetchall()
    return {name for (name,) in rows if name.startswith(PREFIXES)}


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(c)
    yield c
    c.close()


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
