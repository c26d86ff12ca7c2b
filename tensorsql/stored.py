"""Stored tensors (``Session.table``, ``tables``, ``save``, ``drop``): tables of the executor's catalog read,
listed, written and dropped, and the count of catalog changes that lets a run notice, at the cost of one
lookup, that a table it reads was replaced or dropped after the relation read it."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from tensorsql import metadata
from tensorsql.arguments import check_flag
from tensorsql.errors import CatalogError, CorruptTableError, ShapeError, TensorSQLError
from tensorsql.ingest import stored_relation
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session

#: {database file: [generation]}: one count of the catalog's changes per file, for this process's sessions
#: (which share its DuckDB instance)
_GENERATIONS: dict[str, list[int]] = {}


def generation(executor: object) -> list[int]:
    """The catalog generation cell of ``executor``'s database: shared by file, its own for ``:memory:``."""
    database = str(getattr(executor, "database", "") or "")
    if database in ("", ":memory:") or database.startswith(":memory:"):
        return [0]
    return _GENERATIONS.setdefault(os.path.realpath(database), [0])


def table(session: Session, name: str) -> TensorRelation:
    """``Session.table``."""
    session.require_open("table")
    name = metadata.check_name(name, "table")
    return from_catalog(session, session.executor.catalog.get(name))


def from_catalog(session: Session, entry: Any) -> TensorRelation:
    """A relation over a catalog entry's table, noted as read at the current generation (``check_read``)."""
    rel = stored_relation(session, entry.name, entry.shape, entry.block_shape, entry.dtype, release=None)
    session._read_at[rel.node] = session._catalog_gen
    return rel


def check_read(session: Session, key: object, roots: Sequence[E.Node], gen: int) -> None:
    """``Session.check_read`` once the catalog changed since ``key`` was last checked: the stored tables the
    graphs under ``roots`` read are looked up (those read before the change) and compared with what the
    relations read."""
    read = session._read_at
    if all(v == gen for v in read.values()):  # no relation read from a table before the change: no walk
        session._checked_at[key] = gen
        return
    nodes = dict.fromkeys(n for root in roots for n in E.topological(root))
    stale = [n for n in nodes if isinstance(n, E.Source) and read.get(n, gen) != gen]
    if stale:
        found = session.executor.catalog.get_many([n.table for n in stale])
        for n in stale:
            entry = found.get(metadata.fold(n.table))
            now = None if entry is None else (entry.dtype, tuple(entry.shape), tuple(entry.block_shape))
            if now != (n.dtype, tuple(n.shape), tuple(n.block_shape)):
                what = (
                    "dropped"
                    if now is None
                    else f"replaced (now {now[0]}, shape {now[1]}, blocks {now[2]})"
                )
                raise CorruptTableError(
                    f"table {n.table!r} was {what} after this relation was read from it ({n.dtype}, "
                    f"shape {tuple(n.shape)}, blocks {tuple(n.block_shape)}): read it again with "
                    f"table({n.table!r})"
                )
            read[n] = gen
    session._checked_at[key] = gen


def tables_named(session: Session, names: Sequence[str]) -> dict[str, TensorRelation]:
    """``Session.tables_named``: names that are not valid table names are simply not found."""
    session.require_open("tables_named")
    valid = []
    for n in names:
        try:
            valid.append(metadata.check_name(n, "table"))
        except TensorSQLError:
            continue
    found = session.executor.catalog.get_many(valid)
    return {k: from_catalog(session, e) for k, e in found.items()}


def tables(session: Session, details: bool = False) -> list[str] | pa.Table:
    """``Session.tables``."""
    session.require_open("tables")
    check_flag(details, "tables", "details")
    names = session.executor.catalog.names()
    if not details:
        return names
    entries = [session.executor.catalog.get(n) for n in names]
    return pa.table(
        {
            "name": pa.array(names, pa.string()),
            "shape": pa.array([list(e.shape) for e in entries], pa.list_(pa.int64())),
            "dtype": pa.array([e.dtype for e in entries], pa.string()),
            "block_shape": pa.array([list(e.block_shape) for e in entries], pa.list_(pa.int64())),
        }
    )


def save(session: Session, rel: TensorRelation, name: str, *, replace: bool = False) -> TensorRelation:
    """``Session.save``: refused before anything is written where the tensor could not be read back as
    written (too many dimensions, a name taken, a temporary table of its name hiding it)."""
    session.require_open("save")
    rel = session._own(rel, "save")
    name = metadata.check_name(name, "save")
    check_flag(replace, "save", "replace")
    if rel.ndim > metadata.MAX_RANK:  # written, its catalog entry could not be read back
        raise ShapeError(
            f"save {name!r}: a stored tensor has at most {metadata.MAX_RANK} dimensions, this one has "
            f"{rel.ndim}"
        )
    if not replace and session.executor.catalog.exists(name):
        raise CatalogError(
            f"a table named {name!r} (or one whose name differs only in the case of ASCII letters: they "
            "are one name) already exists; replace=True overwrites it"
        )
    if session.local_executor.has_temporary(name):  # every read of the tensor would read that one
        raise CatalogError(
            f"save {name!r} refused: a temporary table or view of that name would hide the tensor from "
            "every read; drop it, or save under another name"
        )
    plan = rel.plan()
    session.check_tables(plan)
    try:
        session.executor.store(plan, rel.bindings, name, replace=replace)
    finally:
        session._catalog_gen += 1
    return session.table(name)


def drop(session: Session, name: str) -> None:
    """``Session.drop``: the catalog generation moves even when the drop fails part way."""
    session.require_open("drop")
    try:
        session.executor.catalog.drop(metadata.check_name(name, "drop"))
    finally:
        session._catalog_gen += 1
