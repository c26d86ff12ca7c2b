"""Warehouse rows -> tensor relation: the SQL that turns (i0, ..., i{r-1}, value) rows into blocks.

Everything runs inside DuckDB, in one statement that reads the user's query once (a volatile query, with
``random()`` or ``nextval``, is seen as it ran that one time): each row's coordinates are checked (not NULL,
integral, inside the shape; else the statement stops with an error naming the row), then rows get block keys
and a flat in-block index, ``tensor_pack`` builds one block per key (duplicates summed, COO style), and a LEFT
JOIN from the full key grid fills absent blocks with ``tensor_zeros`` so the relation is dense.
"""

from __future__ import annotations

import duckdb
import numpy as np
from sqlglot import exp

from tensorsql.backends.duckdb import sqlgen
from tensorsql.backends.duckdb.sqlgen import call, col, ident, lit
from tensorsql.errors import CastingError, DTypeError, RangeError, ShapeError
from tensorsql.frontend.rowcheck import (
    FRACTIONAL,
    INTEGRAL,
    NOT_INTEGRAL,
    OUT_OF_RANGE,
    ROW,
    integer_checked,
    row_failure,
    shown,
)
from tensorsql.ir import tra as T


def _numeric(sql_type: str) -> bool:
    return sql_type in INTEGRAL or sql_type in FRACTIONAL or sql_type.startswith("DECIMAL")


def check_columns(columns: list[tuple[str, str]], r: int) -> None:
    """The query's (name, DuckDB type) columns: r numeric coordinates and a numeric (or BOOLEAN) value. A
    column of NULLs (type "NULL") passes: its rows fail the row checks, if it has any."""
    if len(columns) != r + 1:
        names = ", ".join([*(f"i{d}" for d in range(r)), "value"])
        raise ShapeError(
            f"from_sql: the query returns {len(columns)} column(s) but a {r}-d tensor needs {r + 1} ({names})"
        )
    for d, (name, sql_type) in enumerate(columns):
        role = f"coordinate i{d}" if d < r else "the value"
        ok = _numeric(sql_type) or (d == r and sql_type == "BOOLEAN")
        if not ok and sql_type.strip('"') != "NULL":
            want = "an integer or numeric type" if d < r else "a numeric or BOOLEAN type"
            raise DTypeError(f"from_sql: column {name!r} ({role}) has type {sql_type}; it needs {want}")


def row_error(exc: duckdb.Error) -> ShapeError | RangeError | CastingError | None:
    """The typed error for a row check that stopped the statement (None for any other error): ShapeError
    for a coordinate, RangeError or CastingError for a value its dtype cannot hold."""
    text = str(exc)
    if isinstance(exc, duckdb.InvalidInputException) and ROW in text:
        message = text[text.index(ROW) + len("tensorsql: ") :]
        if OUT_OF_RANGE in message:
            return RangeError(message)
        if NOT_INTEGRAL in message:
            return CastingError(message)
        return ShapeError(message)
    return None


def _rows(parsed: exp.Query, r: int) -> exp.Select:
    """The user's query with its columns renamed positionally to i0..i{r-1}, v."""
    names = [*(f"i{d}" for d in range(r)), "v"]
    alias = exp.TableAlias(this=ident("q"), columns=[ident(c) for c in names])
    return exp.select(exp.Star()).from_(exp.Subquery(this=parsed.copy(), alias=alias))


def _checked(parsed: exp.Query, shape: tuple[int, ...], types: list[str], dtype: str) -> exp.Select:
    """The rows with each coordinate checked and made a BIGINT: NULL, non-integral or outside ``shape``
    stops the statement with an error naming the row (its coordinates as the query gave them). So does a
    value an integer ``dtype`` cannot hold (a fraction, or outside its range: never rounded or wrapped)."""
    r = len(shape)
    raw = [col("s", f"i{d}") for d in range(r)]
    row: list[str | exp.Expression] = ["("]
    for d, c in enumerate(raw):
        row += [", " if d else "", shown(c)]
    row.append(")")

    def fail(*what: str | exp.Expression) -> exp.Expression:
        return row_failure("the row with coordinates ", *row, *what)

    cells: list[exp.Expression] = []
    for d, (c, n) in enumerate(zip(raw, shape, strict=True)):
        case = exp.case().when(
            exp.Is(this=c.copy(), expression=exp.Null()), fail(f" has a NULL coordinate i{d}")
        )
        if types[d] not in INTEGRAL:
            fractional = exp.NEQ(this=c.copy(), expression=call("trunc", c.copy()))
            case = case.when(fractional, fail(f" has a non-integral coordinate i{d} = ", c.copy()))
        outside = exp.or_(exp.LT(this=c.copy(), expression=lit(0)), exp.GTE(this=c.copy(), expression=lit(n)))
        case = case.when(outside, fail(f" lies outside shape {shape}"))
        case = case.else_(exp.Cast(this=c.copy(), to=exp.DataType.build("BIGINT")))
        cells.append(exp.alias_(case, ident(f"i{d}")))
    value: exp.Expression = col("s", "v")
    if np.dtype(dtype).kind in "iu" and types[r] != "BOOLEAN":
        value = integer_checked(value, types[r], dtype, fail)
    return exp.select(*cells, exp.alias_(value, ident("v"))).from_(_rows(parsed, r).subquery("s"))


def parse_rows(query: str) -> exp.Query:
    """``from_sql``'s query parsed: a row-returning query; VALUES reads as a SELECT of its rows (columns
    col0, col1, ..., as ``from_table`` reads it)."""
    import sqlglot

    from tensorsql.errors import SQLExecutionError

    try:
        parsed = sqlglot.parse_one(query, read="duckdb")
    except sqlglot.errors.SqlglotError as exc:  # ParseError, TokenError (an unterminated comment), ...
        raise SQLExecutionError(f"from_sql: cannot parse the query: {exc}") from exc
    if isinstance(parsed, exp.Values):
        parsed = exp.select(exp.Star()).from_(exp.Subquery(this=parsed))
    if not isinstance(parsed, exp.Query):
        raise SQLExecutionError("from_sql: the query must be a SELECT (or another row-returning query)")
    return parsed


def blocks_from_rows(
    parsed: exp.Query, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str, types: list[str]
) -> exp.Select:
    """A SELECT of (k0..k{r-1}, tensor) with every block of the grid, built from the query's rows (read
    once, checked by ``_checked``; ``types``: the DuckDB types of the query's columns)."""
    r = len(shape)
    pos = T.positional(shape, block_shape, dtype)
    # per row: block keys and the flat C-order index inside the (possibly ragged) block
    keyed_cols: list[exp.Expression] = []
    flat: exp.Expression = lit(0)
    for d, b in enumerate(block_shape):
        k = exp.Cast(
            this=exp.IntDiv(this=col("s", f"i{d}"), expression=lit(b)), to=exp.DataType.build("INTEGER")
        )
        keyed_cols.append(exp.alias_(k, ident(f"k{d}")))
        ext = sqlgen.extent(pos, f"k{d}", exp.Paren(this=k.copy()))
        local = exp.Mod(this=col("s", f"i{d}"), expression=lit(b))
        flat = exp.Add(this=exp.Mul(this=exp.Paren(this=flat), expression=ext), expression=local)
    # integers exactly (a uint64 above 2**63 as UBIGINT), never through DOUBLE
    value_type = "UBIGINT" if dtype.startswith("uint") else "BIGINT" if dtype.startswith("int") else "DOUBLE"
    keyed = exp.select(
        *keyed_cols,
        exp.alias_(exp.Cast(this=flat, to=exp.DataType.build("BIGINT")), ident("idx")),
        exp.alias_(
            exp.Cast(this=col("s", "v"), to=exp.DataType.build(value_type, dialect="duckdb")), ident("v")
        ),
    ).from_(_checked(parsed, shape, types, dtype).subquery("s"))
    numel: exp.Expression = lit(1)
    for d in range(r):
        numel = exp.Mul(this=numel, expression=sqlgen.extent(pos, f"k{d}", col("p", f"k{d}")))
    pack = call(
        "tensor_pack",
        lit(dtype),
        col("p", "idx"),
        col("p", "v"),
        exp.Cast(this=numel, to=exp.DataType.build("BIGINT")),
    )
    packed = (
        exp.select(*[col("p", f"k{d}") for d in range(r)], exp.alias_(pack, ident("tensor")))
        .from_(keyed.subquery("p"))
        .group_by(*[col("p", f"k{d}") for d in range(r)])
    )
    # densify: every block key of the grid, a zero block where no row fell
    return sqlgen.dense_grid(pos, packed.subquery("b"))
