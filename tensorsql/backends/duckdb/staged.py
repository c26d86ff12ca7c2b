"""A plan too big for the session's memory, run as waves of queries (``compile.waves``).

Each aggregation below the plan's last step is stored in a temporary table by its own waves (a cut along a
label it sums away stores partial blocks, combined by one more aggregation); the last step then runs in
waves over ranges of the result's keys, each wave writing its blocks into the result sink, returning an
Arrow table, or inserting into the saved table. Stage tables are the executor's own (never checked as user
tables) and dropped when the run ends, whatever happens.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterator

import duckdb
import pyarrow as pa
from sqlglot import exp

from tensorsql.backends.duckdb import sqlgen
from tensorsql.compile import waves as W
from tensorsql.ir import tra as T

log = logging.getLogger("tensorsql")

_ids = itertools.count()


class StagedRun:
    """One run of a plan in waves on ``con``; a context manager that drops its stage tables on exit."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        bind: sqlgen.Bind,
        checks: Callable[[T.Scan], bool],
        budget: int,
        own: set[str],
    ) -> None:
        self.con = con
        self.bind = bind
        self.budget = budget
        #: the executor's set of stage tables (its ``_must_check`` skips them); ours are added and removed
        self.own = own
        self.checks = checks
        self.tables: list[str] = []
        self._memo: dict[int, T.Rel] = {}
        #: queries run, for explain-like reports and tests
        self.queries = 0

    def __enter__(self) -> StagedRun:
        return self

    def __exit__(self, *exc: object) -> None:
        for name in self.tables:
            drop = exp.Drop(tables=[exp.Table(this=sqlgen.ident(name))], kind="TABLE", exists=True)
            try:
                self.con.execute(sqlgen.sql_text(drop)).fetchall()
            except duckdb.Error as err:
                log.warning("tensorsql: could not drop stage table %s: %s", name, err)
            self.own.discard(name)

    # -- stages -------------------------------------------------------------------------------------------
    def _sql(self, rel: T.Rel) -> exp.Query:
        return sqlgen.to_ast(rel, bind=self.bind, checks=self.checks)

    def execute(self, query: exp.Expression) -> list[tuple]:
        self.queries += 1
        return self.con.execute(sqlgen.sql_text(query)).fetchall()

    def below(self, rel: T.Rel) -> T.Rel:
        """``rel`` with every aggregation in it stored (each by its own waves)."""
        if isinstance(rel, T.Aggregate):
            return self.materialize(rel)
        return T.with_inputs(rel, tuple(self.below(c) for c in T.inputs(rel)))

    def materialize(self, agg: T.Aggregate) -> T.Scan:
        """The aggregation stored in a stage table (once per node: a shared input is stored once)."""
        done = self._memo.get(id(agg))
        if done is not None:
            return done  # type: ignore[return-value]
        rel = T.with_inputs(agg, (self.below(agg.child),))
        inner = rel.child.schema  # type: ignore[attr-defined]
        space = {k: inner.nblocks(k) for k in inner.keys}
        cuts = W.choose_cuts(rel, space, self.budget, set(agg.schema.keys))
        name = f"_ts_stage_{next(_ids)}"
        self.own.add(name)
        self.tables.append(name)
        for i, ranges in enumerate(W.waves(cuts, space)):
            query = self._sql(W.restrict(rel, ranges))
            self.execute(_create(name, query) if i == 0 else _insert(name, query))
        stored = T.Scan(agg.schema, name)
        if any(c > 1 for k, c in cuts.items() if k not in agg.schema.keys):
            # partial blocks (a cut along a summed label): one more aggregation combines them
            stored = self.materialize(T.Aggregate(agg.schema, stored, agg.agg))
        self._memo[id(agg)] = stored
        return stored

    def last(self, root: T.Rel) -> Iterator[T.Rel]:
        """The plan's last step, one restricted plan per wave (its result keys cut into ranges). Aggregations
        below it are stored first; those of the last step itself too when cutting only the result's keys
        does not make a wave fit (a big contraction to a small result)."""
        rel = _tops(root, self.below)
        space = {k: root.schema.nblocks(k) for k in root.schema.keys}
        cuts = W.choose_cuts(rel, space, self.budget, set(space))
        if W.footprint(rel, W._largest(cuts, space)) > self.budget and _has_aggregate(rel):
            rel = self.below(rel)
            cuts = W.choose_cuts(rel, space, self.budget, set(space))
        for ranges in W.waves(cuts, space):
            yield W.restrict(rel, ranges)

    # -- results --------------------------------------------------------------------------------------------
    def sink(self, root: T.Rel, key: int) -> tuple[int, int]:
        """Every wave's blocks written into result sink ``key``: (blocks, elements) written in all."""
        blocks = elements = 0
        for rel in self.last(root):
            ((b, e),) = self.execute(sqlgen.to_sink_ast(rel, key=key, bind=self.bind, checks=self.checks))
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


def _tops(rel: T.Rel, below: Callable[[T.Rel], T.Rel]) -> T.Rel:
    """``rel`` with the aggregations under its last step's own aggregations stored (``below``)."""
    if isinstance(rel, T.Aggregate):
        return T.with_inputs(rel, (below(rel.child),))
    return T.with_inputs(rel, tuple(_tops(c, below) for c in T.inputs(rel)))


def _has_aggregate(rel: T.Rel) -> bool:
    return isinstance(rel, T.Aggregate) or any(_has_aggregate(c) for c in T.inputs(rel))


def _create(name: str, query: exp.Query) -> exp.Create:
    return exp.Create(
        this=exp.Table(this=sqlgen.ident(name)),
        kind="TABLE",
        expression=query,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )


def _insert(name: str, query: exp.Query) -> exp.Insert:
    return exp.Insert(this=exp.Table(this=sqlgen.ident(name)), expression=query)
