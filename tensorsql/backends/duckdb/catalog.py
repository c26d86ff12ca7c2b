"""The catalog table that lets a stored tensor relation reopen without guessing its metadata.

Names follow DuckDB's rule for identifiers: ASCII letters compare without case ("A" and "a" are one table),
every other character exactly. The catalog keeps the spelling of the last save, for display. Every value
reaches DuckDB as a bound parameter (``?``), never as SQL text.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
from collections.abc import Iterator, Sequence

import duckdb
from sqlglot import exp

from tensorsql import metadata
from tensorsql.backends.base import CatalogEntry
from tensorsql.backends.duckdb import macros
from tensorsql.backends.duckdb.errors import wrap
from tensorsql.backends.duckdb.sqlgen import ident, sql_text
from tensorsql.errors import CatalogError, TableNotFoundError
from tensorsql.frontend.rowcheck import INTEGRAL
from tensorsql.metadata import CATALOG, fold

FORMAT_VERSION = 1
#: the catalog's columns and their types
_COLUMNS = {
    "name": "VARCHAR",
    "dtype": "VARCHAR",
    "shape": "VARCHAR",
    "block_shape": "VARCHAR",
    "format_version": "INTEGER",
}

log = logging.getLogger("tensorsql")
Entry = CatalogEntry


def _param() -> exp.Placeholder:
    return exp.Placeholder()


def _eq(column: str, value: exp.Expression) -> exp.EQ:
    return exp.EQ(this=exp.column(column), expression=value)


def _lower_eq(column: str) -> exp.EQ:
    """``lower(column) = lower(?)``: every DuckDB-equal name passes (then ``fold`` keeps the equal ones)."""
    return exp.EQ(this=exp.Lower(this=exp.column(column)), expression=exp.Lower(this=_param()))


def _lower_in(column: str, n: int) -> exp.In:
    """``lower(column) IN (lower(?), ...)`` for ``n`` names."""
    values = [exp.Lower(this=_param()) for _ in range(n)]
    return exp.In(this=exp.Lower(this=exp.column(column)), expressions=values)


def _here() -> exp.Expression:
    """The current database and schema (an attached database's, a temporary or another schema's tables are
    not ours). DuckDB's own metadata functions: several times cheaper than ``information_schema``."""
    return exp.and_(
        _eq("database_name", exp.Anonymous(this="current_database", expressions=[])),
        _eq("schema_name", exp.Anonymous(this="current_schema", expressions=[])),
    )


def _rows(
    con: duckdb.DuckDBPyConnection,
    query: exp.Expression | str,
    params: Sequence[object] = (),
    what: str = "catalog",
) -> list[tuple]:
    """Run with bound parameters and fetch fully (DuckDB 2 refuses new work on a connection with an unfinished
    result); a DuckDB error becomes tensorsql's (a closed connection, a conflicting transaction, ...).
    ``query``: a tree, or the text of one (the lookups every call makes keep theirs: ``_text``)."""
    try:
        return con.execute(query if isinstance(query, str) else sql_text(query), list(params)).fetchall()
    except duckdb.Error as exc:
        raise wrap(exc, what) from exc


@functools.lru_cache(maxsize=128)
def _text(kind: str, n: int = 0) -> str:
    """The SQL text of a lookup every call may make (``n``: how many names it binds), generated once: a
    scoring query or a plan's table check looks up the catalog several times, and each tree cost sqlglot
    ~0.3 ms to build and print."""
    if kind == "columns":
        return sql_text(
            exp.select("table_name", "column_name", "data_type")
            .from_(exp.Table(this=exp.Anonymous(this="duckdb_columns", expressions=[])))
            .where(_here())
            .where(_lower_in("table_name", n))
            .order_by("table_name", "column_index")
        )
    if kind == "matches":
        return sql_text(exp.select(*_COLUMNS).from_(_table()).where(_lower_eq("name")))
    if kind == "entries":
        return sql_text(exp.select(*_COLUMNS).from_(_table()).where(_lower_in("name", n)))
    if kind == "exists":
        def named(function: str, column: str) -> exp.Select:
            source = exp.Table(this=exp.Anonymous(this=function, expressions=[]))
            return exp.select(exp.alias_(column, "n")).from_(source).where(_here()).where(_lower_eq(column))

        tables, views = named("duckdb_tables", "table_name"), named("duckdb_views", "view_name")
        return sql_text(exp.union(tables, views, distinct=False))
    raise ValueError(f"unknown catalog lookup {kind!r}")


def _table() -> exp.Table:
    return exp.Table(this=ident(CATALOG))


#: a table's (DuckDB's spelling, {folded column name: type}), by folded table name
Columns = dict[str, tuple[str, dict[str, str]]]


def _columns(con: duckdb.DuckDBPyConnection, *names: str) -> Columns:
    """The columns of the tables and views here that ``names`` denote, in one query."""
    out: Columns = {}
    wanted = {fold(n) for n in names}
    for table, column, dtype in _rows(con, _text("columns", len(names)), names):
        key = fold(table)
        if key in wanted:
            out.setdefault(key, (table, {}))[1][fold(column)] = dtype
    return out


def _catalog_exists(con: duckdb.DuckDBPyConnection, cols: Columns | None = None) -> bool:
    """Whether this database has a catalog table; a table of that name that is not tensorsql's is an error."""
    found = (_columns(con, CATALOG) if cols is None else cols).get(CATALOG)
    if found is None:
        return False
    spelling, cols = found
    ok = set(cols) == set(_COLUMNS) and all(
        cols[c] == t or (t == "INTEGER" and cols[c] in INTEGRAL) for c, t in _COLUMNS.items()
    )
    if not ok:
        have = ", ".join(f"{c} {t}" for c, t in cols.items())
        want = ", ".join(f"{c} {t}" for c, t in _COLUMNS.items())
        raise CatalogError(
            f"table {spelling!r} exists but is not a tensorsql catalog: it has columns ({have}), tensorsql's "
            f"has ({want}); this database is not tensorsql's, or its catalog table was replaced"
        )
    return True


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    if _catalog_exists(con):
        return
    ddl = exp.Create(
        this=exp.Schema(
            this=_table(),
            expressions=[
                exp.ColumnDef(this=ident(c), kind=exp.DataType.build(t)) for c, t in _COLUMNS.items()
            ],
        ),
        kind="TABLE",
    )
    _rows(con, ddl)


def _matches(con: duckdb.DuckDBPyConnection, name: str) -> list[tuple]:
    """The catalog rows (name, dtype, shape, block_shape, format_version) DuckDB would take for ``name``."""
    rows = _rows(con, _text("matches"), [name])
    return [r for r in rows if isinstance(r[0], str) and fold(r[0]) == fold(name)]


def put(con: duckdb.DuckDBPyConnection, e: Entry) -> None:
    """Records ``e``, replacing every entry DuckDB would take for the same table (any case of its name)."""
    ensure(con)
    macros.ensure(con)  # tensor_cells for plain DuckDB clients
    for row in _matches(con, e.name):
        _rows(con, exp.delete(_table(), where=_eq("name", _param())), [row[0]])
    values = [e.name, e.dtype, json.dumps(list(e.shape)), json.dumps(list(e.block_shape)), FORMAT_VERSION]
    _rows(con, exp.insert(exp.select(*[_param() for _ in values]), _table()), values)


def unchanged(entries: Sequence[Entry], what: str) -> exp.Expression:
    """A condition a view's query keeps (``Session.sql``'s ``CREATE VIEW``): true while every entry's
    catalog row is as it was, else DuckDB's ``error()`` naming the tensor. The view's SQL is fixed for the
    dtype, shape and blocks its tensors had: after a replace of the same blob width (float64 by int64) it
    read the new blobs as the old dtype, garbage."""
    checks: list[exp.Expression] = []
    for e in entries:
        same = exp.and_(
            _eq("name", exp.Literal.string(e.name)),
            _eq("dtype", exp.Literal.string(e.dtype)),
            _eq("shape", exp.Literal.string(json.dumps(list(e.shape)))),
            _eq("block_shape", exp.Literal.string(json.dumps(list(e.block_shape)))),
        )
        count = exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(_table()).where(same))
        message = (
            f"tensorsql: {what} reads tensor {e.name!r} as {e.dtype} {list(e.shape)} in blocks of "
            f"{list(e.block_shape)}, and it was replaced or dropped since: create the view again"
        )
        checks.append(
            exp.Case(
                ifs=[exp.If(this=exp.EQ(this=count, expression=exp.Literal.number(1)), true=exp.true())],
                default=exp.Anonymous(this="error", expressions=[exp.Literal.string(message)]),
            )
        )
    return exp.and_(*checks) if checks else exp.true()


def _known(con: duckdb.DuckDBPyConnection) -> list[str]:
    return [r[0] for r in _rows(con, exp.select("name").from_(_table()).order_by("name")) if r[0] is not None]


def entry(row: tuple) -> Entry:
    """A catalog row checked field by field: a corrupted one is a CatalogError naming the table and field."""
    name, dtype, shape, block_shape, version = row
    where = f"catalog entry {name!r}"
    if version != FORMAT_VERSION:
        raise CatalogError(
            f"{where} has format_version {version!r}; this tensorsql reads format {FORMAT_VERSION}"
        )
    dt, shp, bs = metadata.parse(where, dtype, shape, block_shape)
    return Entry(name, dt, shp, bs)


def _check_table(e: Entry, found: tuple[str, dict[str, str]] | None) -> None:
    """The entry's table exists, with one INTEGER key column per dimension and the BLOB column ``tensor``."""
    if found is None:
        raise CatalogError(
            f"catalog entry {e.name!r} has no table: it was dropped or renamed with SQL (save it again, or "
            "delete the entry)"
        )
    spelling, cols = found
    keys = sorted(c for c in cols if c[:1] == "k" and c[1:].isdigit())
    want = [f"k{d}" for d in range(len(e.shape))]
    if sorted(keys) != sorted(want) or cols.get("tensor") != "BLOB":
        have = ", ".join(f"{c} {t}" for c, t in cols.items())
        raise CatalogError(
            f"catalog entry {e.name!r} does not match table {spelling!r}: a {len(e.shape)}-d tensor (shape "
            f"{list(e.shape)}) needs columns {', '.join(want) or '(no keys)'} and tensor BLOB; the table has "
            f"({have})"
        )
    bad = [k for k in want if cols[k] not in INTEGRAL]
    if bad:
        raise CatalogError(f"table {spelling!r}: key column {bad[0]} is {cols[bad[0]]}, not an integer")


def get(con: duckdb.DuckDBPyConnection, name: str) -> Entry:
    cols = _columns(con, CATALOG, name)
    if not _catalog_exists(con, cols):
        raise TableNotFoundError(f"no tensor relation {name!r}: this database has no tensorsql catalog")
    rows = _matches(con, name)
    if not rows:
        raise TableNotFoundError(f"no tensor relation {name!r} in the catalog (known: {_known(con)})")
    if len(rows) > 1:
        spellings = sorted(r[0] for r in rows)
        raise CatalogError(
            f"the catalog has {len(rows)} entries {spellings} for one table {name!r} (DuckDB's names ignore "
            "the case of ASCII letters); save the right tensor again with replace=True to repair it"
        )
    e = entry(rows[0])
    _check_table(e, cols.get(fold(name)))
    return e


def get_many(con: duckdb.DuckDBPyConnection, names: Sequence[str]) -> dict[str, Entry]:
    """The entries of those ``names`` that are stored tensor tables, by folded name, with the same checks as
    ``get``, in two queries however many names (a statement's operands). A name left out is not a tensor
    table (or is one ``get`` would refuse): ``get`` says why."""
    wanted = list(dict.fromkeys(fold(n) for n in names))
    if not wanted:
        return {}
    cols = _columns(con, CATALOG, *wanted)
    if not _catalog_exists(con, cols):
        return {}
    rows: dict[str, list[tuple]] = {}
    for r in _rows(con, _text("entries", len(wanted)), wanted):
        if isinstance(r[0], str) and fold(r[0]) in wanted:
            rows.setdefault(fold(r[0]), []).append(r)
    out: dict[str, Entry] = {}
    for key, found in rows.items():
        if len(found) != 1:
            continue
        try:
            e = entry(found[0])
            _check_table(e, cols.get(key))
        except CatalogError:
            continue
        out[key] = e
    return out


def names(con: duckdb.DuckDBPyConnection) -> list[str]:
    if not _catalog_exists(con):
        return []
    rows = _rows(con, exp.select("name").from_(_table()).order_by("name"))
    if any(not isinstance(r[0], str) for r in rows):
        raise CatalogError(f"{CATALOG!r} is corrupted: a row has no name (NULL)")
    return [r[0] for r in rows]


def table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether DuckDB has a table or view here that ``name`` denotes (any case of its ASCII letters)."""
    return any(fold(r[0]) == fold(name) for r in _rows(con, _text("exists"), [name, name]))


def names_here(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The folded names of every table and view here, in one lookup (a check of many names at once)."""
    def named(function: str, column: str) -> exp.Select:
        source = exp.Table(this=exp.Anonymous(this=function, expressions=[]))
        return exp.select(exp.alias_(column, "n")).from_(source).where(_here())

    q = exp.union(named("duckdb_tables", "table_name"), named("duckdb_views", "view_name"), distinct=False)
    return {fold(r[0]) for r in _rows(con, q, [])}


def temporary_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    """Whether a temporary table or view ``name`` (any case of its ASCII letters) is on the connection: it
    would hide a tensor table of that name from every read."""
    def named(function: str, column: str) -> exp.Select:
        source = exp.Table(this=exp.Anonymous(this=function, expressions=[]))
        return exp.select(exp.alias_(column, "n")).from_(source).where("temporary").where(_lower_eq(column))

    q = exp.union(named("duckdb_tables", "table_name"), named("duckdb_views", "view_name"), distinct=False)
    return any(fold(r[0]) == fold(name) for r in _rows(con, q, [name, name]))


def remove(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Drops a stored tensor relation: its table and its catalog entries, in one transaction."""
    if not _catalog_exists(con) or not (rows := _matches(con, name)):
        raise TableNotFoundError(f"no tensor relation {name!r} to drop")
    database, schema = here(con)
    with transaction(con, f"drop {name!r}"):
        for row in rows:
            # qualified: an unqualified name would drop a temporary table of that name first
            table = exp.Table(this=ident(row[0]), db=ident(schema), catalog=ident(database))
            drop = exp.Drop(tables=[table], kind="TABLE", exists=True)
            _rows(con, drop, what=f"drop {name!r}")
            _rows(con, exp.delete(_table(), where=_eq("name", _param())), [row[0]], what=f"drop {name!r}")


def in_transaction(con: duckdb.DuckDBPyConnection) -> bool:
    """Whether the connection is inside a transaction its user began: two statements in a row then share
    one transaction id (each has its own in auto-commit). DuckDB has no other way to ask, and a BEGIN there
    would fail and abort the user's transaction."""
    query = sql_text(exp.select(exp.Anonymous(this="txid_current", expressions=[])))
    try:
        first, second = (con.execute(query).fetchall()[0][0] for _ in range(2))
    except duckdb.Error as exc:  # an aborted transaction answers nothing: it is one
        log.debug("tensorsql: txid_current: %s", exc)
        return True
    return bool(first == second)


@contextlib.contextmanager
def transaction(con: duckdb.DuckDBPyConnection, what: str) -> Iterator[None]:
    """BEGIN ... COMMIT around the block, ROLLBACK when it fails; inside a transaction the user began, the
    block is part of that one (it commits or rolls back with the user's), and a failure is left to the user
    to roll back: tensorsql never ends a transaction it did not begin."""
    if in_transaction(con):
        yield
        return
    _rows(con, exp.Transaction(), what=what)
    try:
        yield
        _rows(con, exp.Commit(), what=what)
    except BaseException:
        rollback(con)
        raise


def rollback(con: duckdb.DuckDBPyConnection) -> None:
    """Rolls back after a failed transaction, keeping the caller's error: a failed COMMIT has already ended
    the transaction, and ROLLBACK would then raise one of its own."""
    try:
        con.execute(sql_text(exp.Rollback())).fetchall()
    except duckdb.Error as exc:
        log.debug("tensorsql: rollback after a failed transaction: %s", exc)


def here(con: duckdb.DuckDBPyConnection) -> tuple[str, str]:
    """(current database, current schema): where this connection's catalog and tensor tables are."""
    q = exp.select(
        exp.Anonymous(this="current_database", expressions=[]),
        exp.Anonymous(this="current_schema", expressions=[]),
    )
    ((database, schema),) = _rows(con, q)
    return str(database), str(schema)


def listed_in(con: duckdb.DuckDBPyConnection, database: str, schema: str, name: str) -> bool:
    """Whether the tensor catalog of another database or schema lists ``name`` (looked up, never read on the
    chance: a failed read would abort the user's transaction)."""
    where = exp.and_(
        _eq("database_name", _param()), _eq("schema_name", _param()), _eq("table_name", _param())
    )
    q = exp.select(exp.Count(this=exp.Star())).from_(
        exp.Table(this=exp.Anonymous(this="duckdb_tables", expressions=[]))
    ).where(where)
    if not _rows(con, q, [database, schema, CATALOG])[0][0]:
        return False
    table = exp.Table(this=ident(CATALOG), db=ident(schema), catalog=ident(database))
    rows = _rows(con, exp.select("name").from_(table), what="catalog")
    return any(isinstance(r[0], str) and fold(r[0]) == fold(name) for r in rows)


class DuckDBCatalog:
    """The ``Catalog`` of one DuckDB connection (the executor's lock serializes it with queries)."""

    def __init__(self, con: duckdb.DuckDBPyConnection, lock: contextlib.AbstractContextManager) -> None:
        self._con = con
        self._lock = lock

    def get(self, name: str) -> Entry:
        name = metadata.check_name(name, "table")
        with self._lock:
            return get(self._con, name)

    def get_many(self, names: Sequence[str]) -> dict[str, Entry]:
        checked = [metadata.check_name(n, "table") for n in names]
        with self._lock:
            return get_many(self._con, checked)

    def names(self) -> list[str]:
        with self._lock:
            return names(self._con)

    def here(self) -> tuple[str, str]:
        with self._lock:
            return here(self._con)

    def listed_in(self, database: str, schema: str, name: str) -> bool:
        with self._lock:
            return listed_in(self._con, database, schema, name)

    def exists(self, name: str) -> bool:
        name = metadata.check_name(name, "save")
        with self._lock:
            return table_exists(self._con, name)

    def put(self, entry: Entry) -> None:
        with self._lock:
            put(self._con, entry)

    def drop(self, name: str) -> None:
        name = metadata.check_name(name, "drop")
        with self._lock:
            remove(self._con, name)


__all__ = ["CATALOG", "FORMAT_VERSION", "DuckDBCatalog", "entry"]
