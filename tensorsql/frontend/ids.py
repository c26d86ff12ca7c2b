"""Rows with arbitrary ids (``from_sql(..., index=...)``): the ids of a dimension (any type: strings, dates,
sparse integers) are mapped to positions 0..n-1 in sorted order inside DuckDB, and the mapping is kept as a
table next to the tensor, so results map back to the ids (``rel.ids(d)``, ``to_rows(ids=...)``).
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence

from sqlglot import exp

from tensorsql.errors import ConfigError

_ids = itertools.count()
POSITION = "position"
ID = "id"


def dims(index: object, rank: int) -> list[int]:
    """``index``: True (every dimension), or the dimensions (ints) whose coordinates are ids."""
    if index is True:
        return list(range(rank))
    if isinstance(index, bool) or index is None:
        return []
    if isinstance(index, int):
        index = [index]
    if not isinstance(index, Sequence) or isinstance(index, str):
        raise ConfigError(f"from_sql: index= must be True or a list of dimensions, got {index!r}")
    out = []
    for d in index:
        if isinstance(d, bool) or not isinstance(d, int) or not -rank <= d < rank:
            raise ConfigError(f"from_sql: index= names dimension {d!r}; the rows have {rank} coordinates")
        out.append(d % rank)
    if len(set(out)) != len(out):
        raise ConfigError(f"from_sql: index={index!r} repeats a dimension")
    return sorted(out)


def source(query: exp.Query, columns: int) -> exp.Subquery:
    """The user's query with its columns named ``c0..`` by position (names are free, and may repeat)."""
    names = [exp.to_identifier(f"c{j}") for j in range(columns)]
    return exp.Subquery(this=query, alias=exp.TableAlias(this=exp.to_identifier("_ts_q"), columns=names))


def mapping(query: exp.Query, columns: int, d: int) -> tuple[str, exp.Create]:
    """A temporary table of (position, id) for coordinate ``d``: its distinct non-NULL ids in sorted order."""
    name = f"_ts_ids_{next(_ids)}"
    col = exp.column(f"c{d}", quoted=True)
    distinct = (
        exp.select(exp.alias_(col, ID, quoted=True))
        .distinct()
        .from_(source(query, columns))
        .where(exp.Not(this=exp.Is(this=col.copy(), expression=exp.Null())))
    )
    order = exp.Order(expressions=[exp.Ordered(this=exp.column(ID, quoted=True))])
    numbered = exp.select(
        exp.alias_(
            exp.Sub(this=exp.Window(this=exp.RowNumber(), order=order), expression=exp.Literal.number(1)),
            POSITION,
            quoted=True,
        ),
        exp.column(ID, quoted=True),
    ).from_(exp.Subquery(this=distinct, alias=exp.TableAlias(this=exp.to_identifier("_ts_d"))))
    create = exp.Create(
        this=exp.Table(this=exp.to_identifier(name, quoted=True)),
        kind="TABLE",
        expression=numbered,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )
    return name, create


def positions(query: exp.Query, columns: int, maps: Mapping[int, str]) -> exp.Query:
    """The rows with each id coordinate replaced by its position (a NULL id stays NULL: ``from_sql`` then
    names the row)."""
    q = exp.select(
        *[
            exp.column(POSITION, table=f"_ts_m{d}", quoted=True)
            if d in maps
            else exp.column(f"c{d}", quoted=True)
            for d in range(columns)
        ]
    ).from_(source(query, columns))
    for d, name in maps.items():
        q = q.join(
            exp.Table(
                this=exp.to_identifier(name, quoted=True),
                alias=exp.TableAlias(this=exp.to_identifier(f"_ts_m{d}")),
            ),
            on=exp.EQ(
                this=exp.column(f"c{d}", quoted=True),
                expression=exp.column(ID, table=f"_ts_m{d}", quoted=True),
            ),
            join_type="left",
        )
    return q


def rows_with_ids(cells: exp.Query, rank: int, maps: Mapping[int, exp.Expression]) -> exp.Query:
    """``tensor_cells`` rows with position ``i<d>`` replaced by the id a mapping gives it."""
    out: list[exp.Expression] = []
    q = exp.select().from_(exp.Subquery(this=cells, alias=exp.TableAlias(this=exp.to_identifier("_ts_c"))))
    for d in range(rank):
        if d in maps:
            out.append(exp.alias_(exp.column(ID, table=f"_ts_m{d}", quoted=True), f"i{d}", quoted=True))
            q = q.join(
                exp.alias_(maps[d], f"_ts_m{d}", table=True),
                on=exp.EQ(
                    this=exp.column(f"i{d}", table="_ts_c", quoted=True),
                    expression=exp.column(POSITION, table=f"_ts_m{d}", quoted=True),
                ),
                join_type="left",
            )
        else:
            out.append(exp.column(f"i{d}", table="_ts_c", quoted=True))
    return q.select(*out, exp.column("value", table="_ts_c", quoted=True))


__all__ = ["dims", "mapping", "positions", "rows_with_ids"]
