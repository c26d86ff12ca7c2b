"""The catalog table that lets a stored tensor relation reopen without guessing its metadata."""

from __future__ import annotations

import json
import threading

import duckdb
from sqlglot import exp

from tensorsql.backends.base import CatalogEntry
from tensorsql.backends.duckdb.sqlgen import ident, lit, sql_text
from tensorsql.dtypes import DTYPES
from tensorsql.errors import CatalogError, TableNotFoundError

CATALOG = "tensorsql_catalog"
FORMAT_VERSION = 1
_COLUMNS = ("name", "dtype", "shape", "block_shape", "format_version")


Entry = CatalogEntry


def _rows(con: duckdb.DuckDBPyConnection, query: exp.Expression) -> list[tuple]:
    """Run and fetch fully: DuckDB 2 refuses new work on a connection with an unfinished result."""
    return con.execute(sql_text(query)).fetchall()


def _catalog_columns(con: duckdb.DuckDBPyConnection) -> list[str] | None:
    q = (
        exp.select("column_name")
        .from_("information_schema.columns")
        .where(exp.EQ(this=exp.column("table_name"), expression=lit(CATALOG)))
    )
    rows = _rows(con, q)
    return [r[0] for r in rows] or None


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    cols = _catalog_columns(con)
    if cols is None:
        ddl = exp.Create(
            this=exp.Schema(
                this=exp.Table(this=ident(CATALOG)),
                expressions=[
                    exp.ColumnDef(this=ident(c), kind=exp.DataType.build("VARCHAR")) for c in _COLUMNS[:4]
                ]
                + [exp.ColumnDef(this=ident("format_version"), kind=exp.DataType.build("INTEGER"))],
            ),
            kind="TABLE",
        )
        _rows(con, ddl)
    elif sorted(cols) != sorted(_COLUMNS):
        raise CatalogError(f"table {CATALOG!r} exists but is not a tensorsql catalog (columns {cols})")


def put(con: duckdb.DuckDBPyConnection, e: Entry) -> None:
    ensure(con)
    delete = exp.delete(
        exp.Table(this=ident(CATALOG)), where=exp.EQ(this=exp.column("name"), expression=lit(e.name))
    )
    _rows(con, delete)
    values = [
        lit(e.name),
        lit(e.dtype),
        lit(json.dumps(list(e.shape))),
        lit(json.dumps(list(e.block_shape))),
        lit(FORMAT_VERSION),
    ]
    insert = exp.insert(exp.select(*values), exp.Table(this=ident(CATALOG)))
    _rows(con, insert)


def get(con: duckdb.DuckDBPyConnection, name: str) -> Entry:
    cols = _catalog_columns(con)
    if cols is None:
        raise TableNotFoundError(f"no tensor relation {name!r}: this database has no tensorsql catalog")
    if sorted(cols) != sorted(_COLUMNS):
        raise CatalogError(f"table {CATALOG!r} exists but is not a tensorsql catalog (columns {cols})")
    q = (
        exp.select("dtype", "shape", "block_shape", "format_version")
        .from_(exp.Table(this=ident(CATALOG)))
        .where(exp.EQ(this=exp.column("name"), expression=lit(name)))
    )
    row = next(iter(_rows(con, q)), None)
    if row is None:
        known = [
            r[0]
            for r in con.execute(
                sql_text(exp.select("name").from_(exp.Table(this=ident(CATALOG))))
            ).fetchall()
        ]
        raise TableNotFoundError(f"no tensor relation {name!r} in the catalog (known: {sorted(known)})")
    dtype, shape, block_shape, version = row
    try:
        entry = Entry(name, dtype, tuple(json.loads(shape)), tuple(json.loads(block_shape)))
    except (TypeError, ValueError) as exc:
        raise CatalogError(f"catalog entry {name!r} is corrupted: {exc}") from exc
    if version != FORMAT_VERSION or dtype not in DTYPES or len(entry.shape) != len(entry.block_shape):
        raise CatalogError(f"catalog entry {name!r} is not readable by this tensorsql (format {version})")
    return entry


def names(con: duckdb.DuckDBPyConnection) -> list[str]:
    if _catalog_columns(con) is None:
        return []
    q = exp.select("name").from_(exp.Table(this=ident(CATALOG))).order_by("name")
    return [r[0] for r in _rows(con, q)]


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    q = (
        exp.select(exp.Count(this=exp.Star()))
        .from_("information_schema.tables")
        .where(exp.EQ(this=exp.column("table_name"), expression=lit(name)))
    )
    return bool(_rows(con, q)[0][0])


class DuckDBCatalog:
    """The ``Catalog`` of one DuckDB connection (the executor's lock serializes it with queries)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, lock: threading.RLock) -> None:
        self._con = con
        self._lock = lock

    def get(self, name: str) -> Entry:
        with self._lock:
            return get(self._con, name)

    def names(self) -> list[str]:
        with self._lock:
            return names(self._con)

    def exists(self, name: str) -> bool:
        with self._lock:
            return table_exists(self._con, name)

    def put(self, entry: Entry) -> None:
        with self._lock:
            put(self._con, entry)
