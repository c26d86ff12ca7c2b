"""Row checks as SQL: a coordinate or value a tensor cannot take stops the statement with ``error(...)``
naming the row, inside DuckDB, so rows never pass through Python to be checked. ``from_sql`` (the rows of a
query) and ``from_table`` (a wide table's features) check their rows with these; ``ROW`` starts every message
so the engine can type the error it raises."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from sqlglot import exp

from tensorsql.sqlexpr import call, lit

#: the start of every row check's message (``row_error`` maps it to a typed error)
ROW = "tensorsql: from_sql:"
#: DuckDB column types a coordinate may have (fractional ones must hold integral values)
INTEGRAL = frozenset(
    {"TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT"}
    | {"UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT"}
)
FRACTIONAL = frozenset(["FLOAT", "DOUBLE"])

#: in a row check's message: the value does not fit the dtype (RangeError) / is not an integer (CastingError)
OUT_OF_RANGE = "lies outside the range of"
NOT_INTEGRAL = "is not an integer: the tensor's dtype is"


def _concat(*parts: str | exp.Expression) -> exp.Expression:
    """``concat(...)`` of message parts: Python strings are text (adjacent ones merged), expressions are cast
    to text (NULL prints nothing: see ``shown``)."""
    args: list[exp.Expression] = []
    text = ""
    for part in parts:
        if isinstance(part, str):
            text += part
            continue
        if text:
            args.append(lit(text))
            text = ""
        args.append(exp.Cast(this=part, to=exp.DataType.build("VARCHAR")))
    if text:
        args.append(lit(text))
    return call("concat", *args)


def shown(value: exp.Expression) -> exp.Expression:
    """A value as message text, 'NULL' for NULL."""
    return call("coalesce", exp.Cast(this=value.copy(), to=exp.DataType.build("VARCHAR")), lit("NULL"))


def integer_checked(
    v: exp.Expression, sql_type: str, dtype: str, fail: Callable[..., exp.Expression]
) -> exp.Expression:
    """``v`` where an integer ``dtype`` holds it; a fraction (of a type not in ``INTEGRAL``) or a value
    outside the dtype's range stops the statement: ``fail(*message parts)`` names the row. NaN equals
    itself in DuckDB and sorts above every number: it is outside the range."""
    info = np.iinfo(dtype)
    value = exp.case()
    if sql_type not in INTEGRAL:
        fractional = exp.NEQ(this=v.copy(), expression=call("trunc", v.copy()))
        value = value.when(fractional, fail(" has value ", shown(v), f" which {NOT_INTEGRAL} {dtype}"))
    outside = exp.or_(
        exp.LT(this=v.copy(), expression=lit(int(info.min))),
        exp.GTE(this=v.copy(), expression=lit(int(info.max) + 1)),
    )
    span = f"{dtype} [{info.min}, {info.max}]"
    value = value.when(outside, fail(" has value ", shown(v), f" which {OUT_OF_RANGE} {span}"))
    return value.else_(v.copy())


def row_failure(*parts: str | exp.Expression) -> exp.Expression:
    """``error(...)`` of a row check's message (``ROW`` first: ``row_error`` types it)."""
    return call("error", _concat(f"{ROW} ", *parts))
