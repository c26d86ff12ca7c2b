"""The SQL a session's user runs (``Session.sql``, ``Session.execute``): tensor functions rewritten into
their plans' queries by the SQL front end, ``CREATE TABLE ... AS`` and ``DROP`` of tensors turned into
``save`` and ``drop``, and every other statement policed (``sqlpolicy``) before DuckDB runs it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from sqlglot import exp

from tensorsql import metadata, sqlpolicy
from tensorsql.arguments import check_flag
from tensorsql.errors import CatalogError, ConfigError, SQLFrontendError
from tensorsql.frontend import sql as sqlfront
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session


def execute(session: Session, query: str | exp.Expression, what: str = "query") -> list[tuple]:
    """``Session.execute``: refused only where it would shadow a tensor table (``sqlpolicy``)."""
    session.require_open("execute")
    if not isinstance(query, (str, exp.Expression)):
        raise ConfigError(
            f"execute takes SQL text (a str) or a sqlglot expression, got {type(query).__name__}"
        )
    sqlpolicy.refuse_shadows(query, session.executor.catalog)

    def run() -> list[tuple]:
        return session.executor.query(query, str(what))  # type: ignore[attr-defined]

    try:
        return user_statement(session, query, run)
    finally:
        session._catalog_gen += 1  # any statement may have changed a tensor table (a ROLLBACK of a save)


def user_statement(session: Session, query: str | exp.Expression, run: Callable[[], Any]) -> Any:
    """``run()`` through the executor's ``user_statement`` where it has one: its clean-ups wait for the
    end of a transaction the statement begins."""
    guard = getattr(session.local_executor, "user_statement", None)
    return guard(query, run) if guard is not None else run()


def sql(session: Session, query: str, *, explain: bool = False) -> object:
    """``Session.sql``: the statement rewritten, a tensor's CREATE or DROP run as ``save`` or ``drop``,
    anything else policed, then handed to DuckDB."""
    session.require_open("sql")
    relation = getattr(session.executor, "relation", None)
    if relation is None:
        raise ConfigError(
            f"sql runs on the embedded DuckDB session; this one runs on {session.executor.name!r} "
            "(use execute() for its own database)"
        )
    check_flag(explain, "sql", "explain")
    session._catalog_gen += 1  # a statement may change tensor tables (a ROLLBACK of a save, a DROP)
    rw = sqlfront.rewrite(session, query, explain=explain)
    if rw.explain:
        return relation(_explain_rows(session, rw), "EXPLAIN")
    if rw.create is not None:
        name, rel, replace, if_not_exists, insert = rw.create
        if insert:
            _insert(session, name, rel)
            return None
        if if_not_exists and session.executor.catalog.exists(name):
            return None
        session.save(rel, name, replace=replace)
        return None
    statement = rw.statement
    catalog = session.executor.catalog
    sqlpolicy.refuse_wrapped(statement, catalog)
    dropped, others = sqlpolicy.dropped_tensors(statement, catalog)
    if dropped:
        if others:  # DuckDB drops the plain ones first: if it fails, no tensor is gone
            statement.set("tables", others)
            relation(statement, "sql").fetchall()
        for name in dropped:
            session.drop(name)
        return None
    sqlpolicy.refuse_writes(statement, catalog)
    if (
        rw.temps
        and isinstance(statement, exp.Create)
        and str(statement.args.get("kind", "")).upper() == "VIEW"
    ):
        raise SQLFrontendError(
            "CREATE VIEW over tensor_from_cells or a call computed first would read temporary tables "
            "that go with this statement; save the tensor first (CREATE TABLE t AS SELECT * FROM ...)"
        )
    if isinstance(statement, exp.Create) and str(statement.args.get("kind", "")).upper() == "VIEW":
        _guard_view(session, statement, rw.calls)  # type: ignore[attr-defined]
    own = rw.original  # the statement's own text when it had nothing to rewrite
    out = user_statement(session, query, lambda: relation(own if own is not None else statement, "sql"))
    if rw.made:  # their temporary tables go when DuckDB's relation does (it runs again when read again)
        session._sql_kept[out] = rw.made
    return out


def _guard_view(session: Session, statement: exp.Create, calls: Sequence[tuple[str, TensorRelation]]) -> None:
    """A view over tensor functions keeps SQL made for its tensors' dtype, shape and blocks: it
    checks at every read that their catalog rows are unchanged (a tensor replaced by one of another dtype
    of the same width would otherwise be read as garbage)."""
    # the engine's module, imported when used: importing tensorsql loads no engine
    from tensorsql.backends.duckdb import catalog as duck_catalog

    names: dict[str, None] = {}
    for _, rel in calls:
        for node in E.topological(rel.node):
            if isinstance(node, E.Source) and not metadata.is_reserved(node.table):
                names.setdefault(node.table)
    body = statement.expression
    if not names or not isinstance(body, exp.Query):
        return
    entries = [session.executor.catalog.get(n) for n in names]  # type: ignore[attr-defined]
    guard = duck_catalog.unchanged(entries, f"view {statement.this.sql(dialect='duckdb')}")
    # the guard as a materialized CTE joined first: DuckDB computes it before the body's kernels (as a
    # filter over the body, a replaced tensor's blobs reached a kernel first: its blob-size error)
    alias = exp.TableAlias(this=exp.to_identifier("_ts_view"))
    guarded = (
        exp.select(exp.Column(this=exp.Star(), table=exp.to_identifier("_ts_view")))
        .from_(exp.Table(this=exp.to_identifier("_ts_guard")))
        .join(exp.Subquery(this=body, alias=alias), join_type="cross")
        .where(exp.column("ok", "_ts_guard"))
        .with_("_ts_guard", exp.select(exp.alias_(guard, "ok")), materialized=True)
    )
    statement.set("expression", guarded)


def _insert(session: Session, name: str, rel: TensorRelation) -> None:
    """``INSERT INTO name SELECT * FROM <tensor>`` into an empty table (plain or tensor): the tensor's
    blocks, and the table is a tensor now; a table with rows is refused (a tensor is written whole)."""
    target = exp.Table(this=exp.to_identifier(name, quoted=True))
    ((rows,),) = session.executor.query(exp.select(exp.Count(this=exp.Star())).from_(target), "sql")
    if rows:
        raise CatalogError(
            f"table {name!r} has {rows} rows, and a tensor is written whole: insert into an empty table, "
            "or replace this one (CREATE OR REPLACE TABLE ... AS SELECT * FROM einsum(...))"
        )
    session.save(rel, name, replace=True)


def _explain_rows(session: Session, rw: object) -> object:
    """EXPLAIN: each tensor call's plan (EinGraph, partitioning, SQL), then DuckDB's own plan."""
    keys: list[str] = []
    values: list[str] = []
    for call, rel in rw.calls:  # type: ignore[attr-defined]
        keys.append(f"tensorsql: {call}")
        values.append(rel.explain())
    if rw.unbound:  # type: ignore[attr-defined]
        keys.append("duckdb")
        values.append(
            "not shown: the statement reads tensor_from_cells rows or a call computed first, which "
            "EXPLAIN does not compute"
        )
    else:
        inner = exp.Literal.string(rw.statement.sql(dialect="duckdb"))  # type: ignore[attr-defined]
        explain = exp.Command(this="EXPLAIN", expression=inner)
        for row in session.executor.relation(explain, "EXPLAIN").fetchall():  # type: ignore[attr-defined]
            keys.append(str(row[0]))
            values.append(str(row[1]))
    return pa.table({"explain_key": keys, "explain_value": values})
