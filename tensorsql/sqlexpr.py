"""sqlglot expression builders that every layer writing SQL shares: names quoted, literals checked, types
parsed once. SQL is built as expressions and printed by sqlglot, never pasted together as text."""

from __future__ import annotations

import functools
import math

import numpy as np
from sqlglot import exp


@functools.lru_cache(maxsize=64)
def _type_proto(text: str) -> exp.DataType:
    return exp.DataType.build(text)


def sql_type(text: str) -> exp.DataType:
    """A SQL type node (``INTEGER``, ``BIGINT[]``, ...), parsed once per spelling: a plan's statement casts
    hundreds of keys, and sqlglot parses the type's text on every ``DataType.build``."""
    return _type_proto(text).copy()


def ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def col(alias: str, name: str) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(alias))


def lit(value: int | float | str) -> exp.Expression:
    """A SQL literal of a str, int or float (numpy scalars included); anything else is refused, never written
    out raw (sqlglot would print any object's ``str()`` as a number)."""
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        raise TypeError(f"a SQL literal must be a str, int or float, got {type(value).__name__}")
    value = int(value) if isinstance(value, int | np.integer) else float(value)
    if isinstance(value, float) and not math.isfinite(value):  # 'nan', 'inf', '-inf': DuckDB's spelling
        return exp.Cast(this=exp.Literal.string(str(value)), to=sql_type("DOUBLE"))
    if isinstance(value, float) and value == 0 and math.copysign(1.0, value) < 0:
        # DuckDB reads the number -0.0 as a DECIMAL, which has no negative zero: the text keeps the sign
        return exp.Cast(this=exp.Literal.string("-0.0"), to=sql_type("DOUBLE"))
    if isinstance(value, int) and value < 0:
        return exp.Neg(this=exp.Literal.number(-value))
    return exp.Literal.number(value)


def call(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))
