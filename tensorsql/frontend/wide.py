"""Wide tables -> a matrix (``Session.from_table``): one row per table row, one column per feature, the shape
ML pipelines start from. The rows become ``(row, feature, value)`` cells inside DuckDB (one SELECT per
feature, UNION ALL), which ``from_sql`` packs into blocks; nothing passes through Python row by row.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

import numpy as np
import sqlglot
from sqlglot import exp
from sqlglot.errors import SqlglotError

from tensorsql.errors import ConfigError, DTypeError
from tensorsql.frontend import rowcheck

#: DuckDB column types a feature may have (numbers and booleans)
NUMERIC = (
    "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT",
    "UHUGEINT", "FLOAT", "DOUBLE", "DECIMAL", "BOOLEAN", "REAL",
)  # fmt: skip
ROW = "_ts_row"
SRC = "_ts_src"


def _ident(name: object, what: str) -> exp.Identifier:
    if not isinstance(name, str) or not name:
        raise ConfigError(f"from_table: {what} must be a non-empty str, got {name!r}")
    return exp.to_identifier(name, quoted=True)


def unused(name: str, columns: Sequence[str]) -> str:
    """``name``, or ``name_1``, ``name_2``, ...: the first that is none of the source's ``columns`` (DuckDB
    matches names case-insensitively), so a helper column never hides or duplicates one of the user's."""
    taken = {c.lower() for c in columns}
    out, i = name, 0
    while out.lower() in taken:
        i += 1
        out = f"{name}_{i}"
    return out


def source(
    table: object, columns: Sequence[str] | None, caller: str = "from_table"
) -> tuple[exp.Expression, list[str] | None]:
    """The rows to read: a table name (its ``columns``), or a SELECT (its own columns, or ``columns``).
    ``caller``: the function errors name (``from_table``, ``fit``)."""
    if not isinstance(table, str) or not table.strip():
        raise ConfigError(f"{caller}: table must be a table name or a SELECT (a str), got {table!r}")
    if columns is not None:
        given = columns
        try:
            columns = [] if isinstance(columns, str) else list(columns)  # a generator, a numpy array of names
        except TypeError:
            columns = []
        if not columns or not all(isinstance(c, str) and c for c in columns):
            raise ConfigError(f"{caller}: columns must be a non-empty list of column names, got {given!r}")
        columns = [str(c) for c in columns]
        if len({c.lower() for c in columns}) != len(columns):  # DuckDB's names fold case: "a" is "A"
            raise ConfigError(f"{caller}: columns {list(columns)} repeat a name")
    if _head(table) in ("SELECT", "WITH", "VALUES", "FROM"):
        try:
            statements = [q for q in sqlglot.parse(table, dialect="duckdb") if q is not None]
        except SqlglotError as exc:  # ParseError, TokenError (an unterminated string), ...
            raise ConfigError(f"{caller}: the query does not parse: {exc}") from exc
        query = statements[0] if len(statements) == 1 else None
        while isinstance(query, exp.Subquery) and not query.alias:  # "(SELECT ...)"
            query = query.this
        if isinstance(query, exp.Values):  # its rows, columns col0, col1, ...
            query = exp.select(exp.Star()).from_(exp.Subquery(this=query))
        # one query and nothing else: "SELECT ...; DROP TABLE t" ran the DROP too (DuckDB got the text whole)
        if not isinstance(query, exp.Query):
            raise ConfigError(f"{caller}: the source must be one query (a SELECT), got {table!r}")
        return exp.Subquery(this=query), list(columns) if columns is not None else None
    if columns is None:
        raise ConfigError(f"{caller}: a table name needs columns=[...] (the features, in order)")
    return table_ref(table), list(columns)


def _head(text: str) -> str:
    """The first word of ``text`` past its comments and opening parentheses, upper case: whether it is a
    query ("-- note\nSELECT ...", "(SELECT ...)") or a table name."""
    rest = text
    while True:
        rest = rest.lstrip()
        if rest.startswith("--"):
            rest = rest.partition("\n")[2]
        elif rest.startswith("/*"):
            rest = rest.partition("*/")[2]
        elif rest.startswith("("):
            rest = rest[1:]
        else:
            word = re.match(r"\w+", rest)  # a whole word: a table named "values2" is a table
            return word.group(0).upper() if word else ""


def table_ref(name: str) -> exp.Table:
    """A table name as SQL writes it: ``t``, ``schema.t`` or ``catalog.schema.t``, a quoted part kept as
    written (``"My Schema"."T"``, ``"a.b"`` for a table whose name has a dot); a name that does not read as
    one (a space, a stray quote) is one identifier. Every part is quoted: a name is data."""
    try:
        ref = exp.to_table(name, dialect="duckdb")
    except SqlglotError:
        ref = None
    if (
        not isinstance(ref, exp.Table)
        or ref.alias
        or len(ref.parts) > 3
        or not all(isinstance(p, exp.Identifier) and p.name for p in ref.parts)
    ):
        return exp.Table(this=_ident(name, "table"))
    for part in ref.parts:
        part.set("quoted", True)
    return ref


def rereads(src: exp.Expression, describe: Callable[[exp.Expression, str], tuple[list, list]]) -> bool:
    """Whether reading ``src`` again may give other rows: a query (``USING SAMPLE``, ``random()``, a table
    written in between) or a view, which runs its query at every read. Such a source is read once into a
    snapshot by a caller that reads it more than once (its columns, its count, its cells)."""
    if not isinstance(src, exp.Table):
        return True
    match = exp.func("lower", exp.column("view_name")).eq(exp.Literal.string(src.name.lower()))
    query = exp.select(exp.Count(this=exp.Star())).from_(exp.func("duckdb_views")).where(
        exp.and_(exp.Not(this=exp.column("internal")), match)
    )
    ((views,),) = describe(query, "a view's rows")[0]
    return bool(views)


def _exact(value: exp.Expression, sql_type: str, dtype: str, row: str, j: int) -> exp.Expression:
    """A feature as the one type every feature is cast to before the UNION ALL (left to DuckDB, the union's
    common type rounded: INTEGER beside REAL became FLOAT, BIGINT beside DOUBLE became DOUBLE, DECIMAL(10,2)
    beside DECIMAL(38,1) lost a digit): DOUBLE for a float tensor; HUGEINT for an integer one, which holds
    every integer and boolean exactly, a fractional value checked first (an error naming the row, as
    ``from_sql``'s own check words it)."""
    if np.dtype(dtype).kind not in "iu":
        return exp.cast(value, exp.DataType.build("DOUBLE"))
    base = sql_type.split("(")[0].strip()
    if sql_type == "BOOLEAN" or (base in rowcheck.INTEGRAL and base != "UHUGEINT"):
        return exp.cast(value, exp.DataType.build("HUGEINT"))  # exact; from_sql checks the dtype's range

    def fail(*what: str | exp.Expression) -> exp.Expression:
        where = exp.column(row, quoted=True)
        return rowcheck.row_failure("the row with coordinates (", where, f", {j})", *what)

    # checked before the cast: a fraction would be rounded, a UHUGEINT past 2**127 fail to cast
    checked = rowcheck.integer_checked(value, base, dtype, fail)
    return exp.cast(checked, exp.DataType.build("HUGEINT"))


def cells_query(
    src: exp.Expression,
    columns: list[str],
    rows_by: Sequence[str],
    fill: float | None,
    dtype: str,
    types: Sequence[str],
) -> exp.Query:
    """``(row, feature, value)`` of every row and feature: rows numbered in ``rows_by`` order (the source's
    order without it), a NULL feature replaced by ``fill`` or stopping the statement with an error naming
    the column and the row; each feature cast to one type first (``_exact``; ``types``: the features' DuckDB
    types)."""
    if fill is not None and np.dtype(dtype).kind in "iu":
        info = np.iinfo(dtype)
        if not float(fill).is_integer() or not info.min <= fill <= info.max:
            raise ConfigError(
                f"from_table: fill={fill!r} is not an integer {dtype} holds ([{info.min}, {info.max}])"
            )
    row = unused(ROW, columns)
    order = [exp.Ordered(this=exp.column(_ident(c, "rows_by"))) for c in rows_by]
    window = exp.Window(this=exp.RowNumber(), order=exp.Order(expressions=order) if order else None)
    numbered = exp.select(
        *[exp.column(_ident(c, "a column")) for c in columns],
        exp.alias_(exp.Sub(this=window, expression=exp.Literal.number(1)), row, quoted=True),
    ).from_(src.as_(SRC) if isinstance(src, exp.Table) else exp.Subquery(this=src.this, alias=SRC))
    parts: list[exp.Query] = []
    for j, name in enumerate(columns):
        value: exp.Expression = exp.column(_ident(name, "a column"))
        value = _exact(value, types[j].upper(), dtype, row, j)
        if fill is not None:  # as a DOUBLE cast from text: NaN and infinities have no numeric literal
            if np.dtype(dtype).kind in "iu":
                given = exp.cast(exp.Literal.number(int(fill)), exp.DataType.build("HUGEINT"))
            else:
                given = exp.cast(exp.Literal.string(repr(float(fill))), exp.DataType.build("DOUBLE"))
            value = exp.Coalesce(this=value, expressions=[given])
        else:
            message = exp.func(
                "concat",
                exp.Literal.string(f"from_table: column {name!r} is NULL in row "),
                exp.column(row, quoted=True),
                exp.Literal.string(" (give fill= to replace NULLs)"),
            )
            value = exp.Case(
                ifs=[
                    exp.If(
                        this=exp.Is(this=value.copy(), expression=exp.Null()), true=exp.func("error", message)
                    )
                ],
                default=value,
            )
        parts.append(
            exp.select(exp.column(row, quoted=True), exp.Literal.number(j), value).from_("_ts_numbered")
        )
    body: exp.Query = parts[0]
    for p in parts[1:]:
        body = exp.union(body, p, distinct=False)
    return (
        exp.select(exp.Star())
        .from_(exp.Subquery(this=body, alias="_ts_cells"))
        .with_("_ts_numbered", numbered)
    )


def check_types(
    description: list[tuple], columns: list[str], caller: str = "from_table", role: str = "a feature"
) -> None:
    """Every feature (or the label: ``role``) numeric or boolean (DTypeError naming the column otherwise)."""
    for name, typ in zip(columns, [str(d[1]).upper() for d in description], strict=True):
        base = typ.split("(")[0].strip()
        if base not in NUMERIC:
            raise DTypeError(f"{caller}: column {name!r} has type {typ}; {role} must be numeric or BOOLEAN")


__all__ = ["cells_query", "check_types", "rereads", "source", "table_ref", "unused"]
