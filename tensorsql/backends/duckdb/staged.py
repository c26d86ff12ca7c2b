"""A plan too big for the session's memory, run as waves of queries (``compile.waves``).

Each aggregation below the plan's last step is stored in a temporary table by its own waves (a cut along a
label it sums away stores partial blocks, combined by one more aggregation); the last step then runs in
waves over ranges of the result's keys, each wave writing its blocks into the result sink, returning an
Arrow table, or inserting into the saved table. Stage tables are the executor's own (never checked as user
tables) and dropped when the run ends, whatever happens.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping

import duckdb
import pyarrow as pa
from sqlglot import exp

from tensorsql.backends.duckdb import sqlgen
from tensorsql.compile import waves as W
from tensorsql.ir import tra as T

_ids = itertools.count()


class StagedRun(W.Stager):
    """One run of a plan in waves on ``con``; a context manager that drops its stage tables on exit."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        bind: sqlgen.Bind,
        checks: Callable[[T.Scan], bool],
        budget: int,
        own: set[str],
        drop: Callable[[str], None],
        lowering: sqlgen.Lowering = sqlgen.FUSED,
        in_place: Callable[[T.Scan], bool] | None = None,
    ) -> None:
        super().__init__()
        self.lowering = lowering
        #: the stored tables that are registered Arrow tables (``sqlgen.to_ast``'s ``in_place``)
        self.in_place = in_place
        self.con = con
        self.bind = bind
        self.budget = budget
        #: the executor's set of stage tables (its ``_must_check`` skips them); ours are added and removed
        self.own = own
        self.checks = checks
        #: drops a table, logging a failure (``DuckDBExecutor.drop``)
        self.drop = drop
        self.tables: list[str] = []
        #: queries run, for explain-like reports and tests
        self.queries = 0

    def __enter__(self) -> StagedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.tables:
            self.drop(name)
            self.own.discard(name)

    # -- stages -------------------------------------------------------------------------------------------
    def _sql(self, rel: T.Rel) -> exp.Query:
        return sqlgen.to_ast(
            rel, bind=self.bind, checks=self.checks, lowering=self.lowering, in_place=self.in_place
        )

    def execute(self, query: exp.Expression) -> list[tuple]:
        self.queries += 1
        return self.con.execute(sqlgen.sql_text(query)).fetchall()

    def cuts(self, rel: T.Rel, space: Mapping[str, int], free: set[str]) -> dict[str, int]:
        return W.choose_cuts(rel, space, self.budget, free)

    def store(
        self, rel: T.Rel, space: Mapping[str, int], cuts: Mapping[str, int], schema: T.Schema, what: str
    ) -> str:
        """A stage table filled by one query per wave."""
        name = f"_ts_stage_{next(_ids)}"
        self.own.add(name)
        self.tables.append(name)
        for i, ranges in enumerate(W.waves(cuts, space)):
            query = self._sql(W.restrict(rel, ranges))
            self.execute(_create(name, query) if i == 0 else _insert(name, query))
        return name

    def last(self, root: T.Rel) -> Iterator[T.Rel]:
        """The plan's last step, one restricted plan per wave (its result keys cut into ranges). Aggregations
        below it are stored first; those of the last step itself too when cutting only the result's keys
        does not make a wave fit (a big contraction to a small result)."""
        rel = self.top(root)
        space = {k: root.schema.nblocks(k) for k in root.schema.keys}
        cuts = W.choose_cuts(rel, space, self.budget, set(space))
        if W.footprint(rel, W.largest(cuts, space)) > self.budget and W.has_aggregate(rel):
            rel = self.below(rel)
            cuts = W.choose_cuts(rel, space, self.budget, set(space))
        for ranges in W.waves(cuts, space):
            yield W.restrict(rel, ranges)

    # -- results --------------------------------------------------------------------------------------------
    def sink(self, root: T.Rel, key: int) -> tuple[int, int]:
        """Every wave's blocks written into result sink ``key``: (blocks, elements) written in all."""
        blocks = elements = 0
        for rel in self.last(root):
            ((b, e),) = self.execute(
                sqlgen.to_sink_ast(rel, key=key, bind=self.bind, checks=self.checks, in_place=self.in_place)
            )
            blocks += int(b or 0)
            elements += int(e or 0)
        return blocks, elements

    def arrow(self, root: T.Rel, batch_rows: int) -> pa.Table:
        parts = []
        for rel in self.last(root):
            self.queries += 1
            parts.append(self.con.sql(sqlgen.sql_text(self._sql(rel))).to_arrow_table(batch_size=batch_rows))
        return pa.concat_tables(parts)

    def create(self, root: T.Rel, make: Callable[[exp.Query], exp.Expression], name: str) -> None:
        """The result stored as table ``name``: ``make(query)`` (CREATE ... AS) for the first wave, INSERT for
        the others."""
        for i, rel in enumerate(self.last(root)):
            query = self._sql(rel)
            self.execute(make(query) if i == 0 else _insert(name, query))


def _create(name: str, query: exp.Query) -> exp.Create:
    return exp.Create(
        this=exp.Table(this=sqlgen.ident(name)),
        kind="TABLE",
        expression=query,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )


def _insert(name: str, query: exp.Query) -> exp.Insert:
    return exp.Insert(this=exp.Table(this=sqlgen.ident(name)), expression=query)
