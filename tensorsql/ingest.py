"""Relations made from data (``Session.from_numpy``, ``array``, ``from_arrow``, ``from_sql``, ``from_table``):
arrays split into blocks and handed to the executor, rows packed into blocks inside the engine (never
through Python row by row). The executor owns the tables; a relation's source releases them when it goes."""

from __future__ import annotations

import numbers
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from tensorsql import metadata
from tensorsql.arguments import as_array, check_flag, checked_shape
from tensorsql.backends import arrow
from tensorsql.compile import planning
from tensorsql.dtypes import CARRIED, DTYPES, carrier_dtype, dtype_name
from tensorsql.errors import CatalogError, ConfigError, ShapeError
from tensorsql.frontend import ids, wide
from tensorsql.ir import expr as E
from tensorsql.ir.blocking import resolve_block_shape
from tensorsql.relation import TensorRelation

if TYPE_CHECKING:
    from tensorsql.session import Session


def new_blocks(
    session: Session,
    shape: tuple[int, ...],
    block_shape: Sequence[int] | None,
    blocks: Sequence[int] | None,
    dtype: str,
    what: str,
) -> tuple[int, ...]:
    """A new stored relation's block shape: the one given, else the executor's own default (a cluster
    wants square blocks, a block per worker or more, a GPU few large ones), else the CPU's."""
    bs = resolve_block_shape(shape, block_shape, blocks, what)
    if block_shape is not None or blocks is not None:
        return bs
    itemsize = np.dtype(dtype).itemsize
    storage_blocks = getattr(session.executor, "storage_blocks", None)
    if storage_blocks is not None:
        bs = storage_blocks(shape, bs, itemsize)
    # the default within the session's block cap (a small memory_limit's): blocks of a third of the limit
    # left the waves no room (a product's wave budget is a quarter of it)
    cap = getattr(session.executor, "max_block_bytes", None)
    if isinstance(cap, int) and bs:
        bs = planning.fit_shape(shape, bs, itemsize, cap)
    return bs


def stored_relation(
    session: Session,
    name: str,
    shape: tuple[int, ...],
    block_shape: tuple[int, ...],
    dtype: str,
    *,
    release: Callable[[str], None] | None,
    complete: bool = False,
) -> TensorRelation:
    """``complete``: every block is there (an array's split, a result computed from such inputs alone),
    so no step needs to fill absent blocks with zeros first (``T.Densify``)."""
    node = E.Source(shape=shape, dtype=dtype, table=name, block_shape=block_shape, complete=complete)
    if release is not None:
        weakref.finalize(node, release, name)
    return TensorRelation(session, node)


def from_numpy(
    session: Session,
    array: object,
    block_shape: Sequence[int] | None = None,
    blocks: Sequence[int] | None = None,
    *,
    dtype: object | None = None,
    copy: bool = True,
) -> TensorRelation:
    """``Session.from_numpy``: split by ``backends.arrow``, uploaded as verified (valid as split)."""
    session.require_open("from_numpy")
    check_flag(copy, "from_numpy", "copy")
    arr = as_array(array, "from_numpy")
    name = dtype_name(arr.dtype if dtype is None else dtype)
    bs = new_blocks(session, arr.shape, block_shape, blocks, name, "from_numpy")
    table = arrow.split(arr, bs, name, copy=copy)
    view = session.executor.upload(table, (arr.shape, bs, name), verified=True)  # valid as split
    release = session.executor.release
    return stored_relation(session, view, arr.shape, bs, name, release=release, complete=True)


def array(session: Session, array: object, *, copy: bool = True) -> TensorRelation:
    """``Session.array``: an Operand leaf bound to the array; nothing reaches the engine until a run."""
    session.require_open("array")
    check_flag(copy, "array", "copy")
    arr = as_array(array, "array")
    name = carrier_dtype(arr.dtype) if arr.dtype.name in CARRIED else dtype_name(arr.dtype)
    arr = arr.astype(DTYPES[name], copy=copy)
    if copy:
        arrow.own(arr)
    leaf = E.Operand(shape=arr.shape, dtype=arr.dtype.name, name="array")
    return TensorRelation(session, leaf, {leaf: arr})


def from_arrow(session: Session, table: pa.Table) -> TensorRelation:
    """``Session.from_arrow``: the metadata and columns checked first; keys of another integer type
    are checked inside the grid and cast to INTEGER."""
    session.require_open("from_arrow")
    if not isinstance(table, pa.Table):
        raise CatalogError(f"from_arrow takes a pyarrow.Table, got {type(table).__name__}")
    meta = table.schema.metadata or {}
    fields = [b"tensorsql.dtype", b"tensorsql.shape", b"tensorsql.block_shape"]
    if any(f not in meta for f in fields):
        raise CatalogError("Arrow table has no tensorsql metadata (dtype, shape, block_shape)")
    dtype, shape, bs = metadata.parse("from_arrow: the Arrow metadata", *(meta[f] for f in fields))
    want = {f"k{d}" for d in range(len(shape))} | {"tensor"}
    if set(table.column_names) != want:
        raise CatalogError(
            f"from_arrow: a {len(shape)}-d tensor's table has columns {sorted(want)}, this one has "
            f"{table.column_names}"
        )
    keys = [f"k{d}" for d in range(len(shape))]
    verified = False
    if any(table.schema.field(k).type != pa.int32() for k in keys):
        # checked inside the grid, the keys are INTEGER like every tensor table's (DuckDB bound a uint64
        # key as HUGEINT, which the kernels' calls do not take)
        arrow.check_blocks(table, shape, bs, dtype)
        for k in keys:
            table = table.set_column(table.schema.get_field_index(k), k, table.column(k).cast(pa.int32()))
        verified = True
    view = session.executor.upload(table, (shape, bs, dtype), verified=verified)
    return stored_relation(session, view, shape, bs, dtype, release=session.executor.release)


def from_sql(
    session: Session,
    query: str,
    shape: Sequence[int | None] | None = None,
    block_shape: Sequence[int] | None = None,
    blocks: Sequence[int] | None = None,
    *,
    dtype: object = "float64",
    index: bool | int | Sequence[int] | None = None,
) -> TensorRelation:
    """``Session.from_sql``: the rows packed by the executor (``ingest_rows``); ids mapped first."""
    session.require_open("from_sql")
    if not isinstance(query, str):
        raise ConfigError(f"from_sql: query must be SQL text (a str), got {type(query).__name__}")
    query = str.__str__(query)
    if index is not None and index is not False:
        return _from_ids(session, query, shape, block_shape, blocks, dtype, index)
    if shape is None:
        raise ConfigError("from_sql: shape= is needed (it may be left out only for index=True)")
    shape = checked_shape(shape, "from_sql")
    name = dtype_name(dtype)
    bs = new_blocks(session, shape, block_shape, blocks, name, "from_sql")
    table = session.executor.ingest_rows(query, shape, bs, name)  # type: ignore[attr-defined]
    return stored_relation(session, table, shape, bs, name, release=session.executor.drop)


def _from_ids(
    session: Session,
    query: str,
    shape: Sequence[int | None] | None,
    block_shape: Sequence[int] | None,
    blocks: Sequence[int] | None,
    dtype: object,
    index: object,
) -> TensorRelation:
    # the engine's module, imported when used: importing tensorsql loads no engine
    from tensorsql.backends.duckdb import ingest

    local = session.local_executor
    parsed = ingest.parse_rows(query)
    _, described = local.describe(exp.select(exp.Star()).from_(parsed.subquery("q")).limit(0), "from_sql")
    columns = len(described)
    rank = len(shape) if shape is not None else columns - 1
    if columns != rank + 1:
        raise ShapeError(f"from_sql: the query has {columns} columns; a {rank}-d tensor needs {rank + 1}")
    which = ids.dims(index, rank)
    if shape is None and len(which) != rank:
        raise ConfigError(
            "from_sql: shape= is needed unless index=True (every dimension's size from its ids)"
        )
    sizes = list(shape) if shape is not None else [None] * rank
    maps: dict[int, str] = {}
    # read once per dimension with ids and once for the positions: a query is read once, into a snapshot
    # (random() rows gave ids of one read and positions of another: NULL coordinates)
    snap = local.snapshot(parsed, "from_sql") if which else None
    if snap is not None:
        parsed = exp.select(exp.Star()).from_(snap.table())
    try:
        for d in which:
            name, create = ids.mapping(parsed, columns, d)
            local.query(create, "from_sql")
            maps[d] = name
            ((count,),) = local.query(
                exp.select(exp.Count(this=exp.Star())).from_(exp.to_identifier(name, quoted=True)),
                "from_sql",
            )
            if sizes[d] is None:
                sizes[d] = int(count)
            elif int(count) > checked_shape([sizes[d]], "from_sql")[0]:
                raise ShapeError(
                    f"from_sql: dimension {d} has {count} distinct ids, more than its size {sizes[d]}"
                )
        for d, n in enumerate(sizes):
            if n is None:
                raise ConfigError(
                    f"from_sql: dimension {d} holds positions, so its size must be in shape="
                )
        rows = ids.positions(parsed, columns, maps).sql(dialect="duckdb")
        rel = from_sql(session, rows, tuple(int(n) for n in sizes), block_shape, blocks, dtype=dtype)  # type: ignore[arg-type]
    except BaseException:
        for name in maps.values():
            local.drop(name)
        raise
    finally:
        if snap is not None:
            snap.drop()
    session._id_maps[rel] = maps
    weakref.finalize(rel, _drop_all, local, list(maps.values()))
    return rel


def id_table(session: Session, rel: TensorRelation, d: int) -> pa.Table:
    """``Session.id_table``."""
    maps = session._id_maps.get(rel, {})
    if d not in maps:
        have = sorted(maps) or "none"
        raise ConfigError(f"ids: dimension {d} of this relation has no ids (dimensions with ids: {have})")
    local = session.local_executor
    q = exp.select("position", "id").from_(exp.to_identifier(maps[d], quoted=True)).order_by("position")
    # as Arrow, as DuckDB holds them: through Python values a UBIGINT past 2**63 raised OverflowError and
    # a MAP gained the other rows' keys
    got = local.with_arrow({}, lambda: q)
    return pa.table({"position": got.column("position").cast(pa.int64()), "id": got.column("id")})


def from_table(
    session: Session,
    table: str,
    columns: Sequence[str] | None = None,
    *,
    rows_by: str | Sequence[str] | None = None,
    fill: float | None = None,
    dtype: object = "float64",
    block_shape: Sequence[int] | None = None,
    blocks: Sequence[int] | None = None,
) -> TensorRelation:
    """``Session.from_table``: a source that may read differently twice (a query, a view) is read
    once, into a snapshot."""
    session.require_open("from_table")
    if rows_by is not None and not isinstance(rows_by, str | list | tuple):
        raise ConfigError(f"from_table: rows_by must be a column name or a list of them, got {rows_by!r}")
    order = [rows_by] if isinstance(rows_by, str) else list(rows_by or [])
    if not all(isinstance(c, str) and c for c in order):
        raise ConfigError(f"from_table: rows_by must be a column name or a list of them, got {rows_by!r}")
    if fill is not None and (isinstance(fill, bool) or not isinstance(fill, numbers.Real)):
        raise ConfigError(f"from_table: fill must be a number, got {fill!r}")
    src, cols = wide.source(table, columns)
    local = session.local_executor
    probe = src.this if isinstance(src, exp.Subquery) else exp.select(exp.Star()).from_(src)
    if not wide.rereads(src, local.describe):
        return _from_table(session, local, src, probe, table, cols, order, fill, dtype, block_shape, blocks)
    # read below three times (columns, count, cells): a query or a view is read once, into a snapshot
    snap = local.snapshot(probe, "from_table")
    try:
        src = snap.table()
        probe = exp.select(exp.Star()).from_(src)
        return _from_table(session, local, src, probe, table, cols, order, fill, dtype, block_shape, blocks)
    finally:
        snap.drop()


def _from_table(
    session: Session,
    local: Any,
    src: exp.Expression,
    probe: exp.Query,
    table: str,
    cols: list[str] | None,
    order: list[str],
    fill: float | None,
    dtype: object,
    block_shape: Sequence[int] | None,
    blocks: Sequence[int] | None,
) -> TensorRelation:
    _, described = local.describe(
        exp.select(exp.Star()).from_(exp.Subquery(this=probe)).limit(0), "from_table"
    )
    names = [str(d[0]) for d in described]
    spelled = {n.lower(): n for n in names}  # DuckDB matches names case-insensitively
    missing = [c for c in [*(cols or []), *order] if c.lower() not in spelled]
    if missing:
        raise ConfigError(f"from_table: no column {missing[0]!r} in {table!r} (columns: {names})")
    order = [spelled[c.lower()] for c in order]
    if cols is None:
        cols = [n for n in names if n not in order]
    cols = [spelled[c.lower()] for c in cols]
    if not cols:
        raise ConfigError(f"from_table: {table!r} has no feature columns besides rows_by={order}")
    types = {str(d[0]): d for d in described}
    wide.check_types([types[c] for c in cols], cols)
    ((n,),) = local.describe(
        exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=probe)), "from_table"
    )[0]
    name = dtype_name(dtype)
    query = wide.cells_query(src, cols, order, fill, name, [str(types[c][1]) for c in cols])
    return from_sql(
        session, query.sql(dialect="duckdb"), (int(n), len(cols)), block_shape, blocks, dtype=dtype
    )


def _drop_all(executor: object, names: list[str]) -> None:
    """A relation's id tables, dropped when it is collected (nothing to do once the session has closed)."""
    if getattr(executor, "closed", False):
        return
    for name in names:
        executor.drop(name)  # type: ignore[attr-defined]
