"""Session: the user's handle, a facade over one executor (the embedded DuckDB by default).

It builds expression graphs (front ends), compiles them into plans (``compile``), caches the plans of repeated
calls (``compile.cache``) and hands finished plans to its executor. It imports no engine: the executor is
chosen in ``connect`` and reached only through the ``Executor`` protocol (``backends.base``).
"""

from __future__ import annotations

import itertools
import math
import numbers
import operator
import os
import re
import sys
import weakref
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp

from tensorsql import compile as C
from tensorsql import metadata
from tensorsql.backends import arrow
from tensorsql.backends.base import Executor
from tensorsql.compile import planning
from tensorsql.compile.cache import GraphEntry, LRUCache, PlanCache, hashable
from tensorsql.compile.plan import Plan, explain
from tensorsql.dtypes import CARRIED, DTYPES, carrier_dtype, dtype_name
from tensorsql.errors import (
    CatalogError,
    ConfigError,
    CorruptTableError,
    DTypeError,
    EinsumError,
    OutOfMemoryError,
    PlanError,
    SessionClosedError,
    ShapeError,
    SQLFrontendError,
    TensorSQLError,
)
from tensorsql.frontend import numpy as frontend
from tensorsql.frontend.subscripts import letter_label, parse, split_args
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import resolve_block_shape
from tensorsql.relation import TensorRelation

_OFF = ("0", "false", "no", "off")
#: results from this size on may come back as a transposed view of the GEMM-ordered result (numpy())
GEMM_ORDER_BYTES = 1 << 20
#: numbers the stored-relation names of a compiled graph's shared steps (``Compiled``)
_shared_ids = itertools.count()


#: compiled functions a session keeps (``Session.compiled``)
COMPILED_CACHE_SIZE = 32
#: Python's recursion limit while sessions exist: planning and lowering walk an expression graph
#: recursively, ~10 frames per layer of a network's gradient (its default, 1000, stopped at ~40 layers)
RECURSION_LIMIT = 20_000


class Session:
    """A facade over one executor: relations, einsum, plans and their cache."""

    def __init__(self, executor: Executor, *, strategy: str = "eindecomp") -> None:
        if sys.getrecursionlimit() < RECURSION_LIMIT:  # raised, never lowered: other threads may be deep
            sys.setrecursionlimit(RECURSION_LIMIT)
        self.executor = executor
        self._strategy = planning.check_strategy(strategy)
        #: bumped by every save and drop of a stored tensor; a relation read from a table (``table``) notes
        #: the count it was made at, and a run after a later one checks its tables are still what it read
        #: (replaced by a tensor of another dtype of the same width, its blocks read as garbage). Shared by
        #: the sessions of this process on one database file (``_generation``): a replace by another one
        #: was never noticed, and a relation read its new int64 blobs as float64
        self._gen = _generation(getattr(executor, "local", executor))
        self._read_at: weakref.WeakKeyDictionary[E.Node, int] = weakref.WeakKeyDictionary()
        self._checked_at: weakref.WeakKeyDictionary[object, int] = weakref.WeakKeyDictionary()
        self.plans = PlanCache()
        #: lazy ``einsum`` calls over arrays seen before: key -> their graph, leaves, options and plans
        self._graphs: LRUCache[GraphEntry] = LRUCache()
        #: compiled functions over placeholders alone that callers key by what determines them (``ml.fit``'s
        #: training step per model structure, optimizer and batch shape)
        self.compiled: LRUCache[object] = LRUCache(COMPILED_CACHE_SIZE)
        self._reordered: weakref.WeakKeyDictionary[Plan, tuple[Plan, tuple[int, ...]] | None] = (
            weakref.WeakKeyDictionary()
        )
        #: write results straight into the returned array (result sinks); False: always through Arrow
        #: (``TENSORSQL_RESULT_SINK=0`` turns them off for new sessions)
        self.result_sink = os.environ.get("TENSORSQL_RESULT_SINK", "1").strip().lower() not in _OFF
        #: the id mappings of relations ``from_sql(index=...)`` made: {dimension: temporary table}
        self._id_maps: weakref.WeakKeyDictionary[TensorRelation, dict[int, str]] = weakref.WeakKeyDictionary()
        #: the relations an ``sql`` statement's calls made, by the DuckDB relation that reads them
        self._sql_kept: weakref.WeakKeyDictionary[object, list[TensorRelation]] = weakref.WeakKeyDictionary()

    @property
    def local_executor(self) -> Any:
        """The session's own DuckDB executor: its catalog, saved tensors and source tables (a cluster
        session's database, beside its workers)."""
        return getattr(self.executor, "local", self.executor)

    @property
    def strategy(self) -> str:
        """The session's default blocking strategy (checked when set: a planner never sees an unknown one)."""
        return self._strategy

    @strategy.setter
    def strategy(self, value: str) -> None:
        self._strategy = planning.check_strategy(value)

    @property
    def _catalog_gen(self) -> int:
        return self._gen[0]

    @_catalog_gen.setter
    def _catalog_gen(self, value: int) -> None:
        self._gen[0] = value

    # -- the executor's facts ----------------------------------------------------------------------------
    @property
    def p(self) -> int:
        """Kernel calls the planner aims for: the executor's workers (threads, or workers x threads)."""
        return self.executor.workers

    @property
    def threads(self) -> int:
        return int(getattr(self.executor, "threads", self.executor.workers))

    @property
    def client(self) -> object:
        """The ``distributed.Client`` of a cluster session (None for the embedded one)."""
        return getattr(self.executor, "client", None)

    @property
    def database(self) -> str:
        return getattr(self.executor, "database", self.executor.name)

    def execute(self, query: str | exp.Expression, what: str = "query") -> list[tuple]:
        """Run a SQL statement on the executor and fetch its rows (the embedded DuckDB only)."""
        self.require_open("execute")
        if not isinstance(query, (str, exp.Expression)):
            raise ConfigError(
                f"execute takes SQL text (a str) or a sqlglot expression, got {type(query).__name__}"
            )
        self._refuse_shadows(query)

        def run() -> list[tuple]:
            return self.executor.query(query, str(what))  # type: ignore[attr-defined]

        try:
            return self._user_statement(query, run)
        finally:
            self._catalog_gen += 1  # any statement may have changed a tensor table (a ROLLBACK of a save)

    def _user_statement(self, query: str | exp.Expression, run: Callable[[], Any]) -> Any:
        """``run()`` through the executor's ``user_statement`` where it has one: its clean-ups wait for the
        end of a transaction the statement begins."""
        guard = getattr(self.local_executor, "user_statement", None)
        return guard(query, run) if guard is not None else run()

    def _refuse_shadows(self, query: str | exp.Expression) -> None:
        """A temporary table or view of a tensor's name is refused here too, as in ``sql``: every read of
        the tensor would read it instead (an empty one: a tensor of zeros). Other statements run as given."""
        if isinstance(query, str):
            if not _TEMP_WORD.search(query):  # no CREATE TEMP[ORARY] nor temp.X: nothing to parse
                return
            try:
                statements = sqlglot.parse(query, read="duckdb")
            except (sqlglot.errors.SqlglotError, RecursionError):
                return  # DuckDB's own syntax sqlglot cannot read: DuckDB runs it or says why
        else:
            statements = [query]
        catalog = self.executor.catalog
        for statement in statements:
            if isinstance(statement, exp.Create) and _temporary(statement):
                _refuse_writes(statement, catalog)

    def sql(self, query: str, *, explain: bool = False) -> object:
        """One DuckDB SQL statement in which tensor tables are ordinary tables and the tensor table functions
        (``einsum``, ``tensor_map``, ``softmax``, ``tensor_cells``, ``tensor_from_cells``) are available:
        each is planned like the Python API and replaced by its generated query (README "SQL"). Returns
        DuckDB's relation for the statement (``.fetchall()``, ``.arrow()``, ``.df()``); ``CREATE [OR
        REPLACE] TABLE t AS SELECT * FROM <tensor function>`` saves ``t`` as a tensor table (None).
        ``explain=True`` (or a statement starting with ``EXPLAIN``): the plans' rows, not the statement's."""
        from tensorsql.frontend import sql as sqlfront

        self.require_open("sql")
        relation = getattr(self.executor, "relation", None)
        if relation is None:
            raise ConfigError(
                f"sql runs on the embedded DuckDB session; this one runs on {self.executor.name!r} "
                "(use execute() for its own database)"
            )
        _flag(explain, "sql", "explain")
        self._catalog_gen += 1  # a statement may change tensor tables (a ROLLBACK of a save, a DROP)
        rw = sqlfront.rewrite(self, query, explain=explain)
        if rw.explain:
            return relation(self._explain_rows(rw), "EXPLAIN")
        if rw.create is not None:
            name, rel, replace, if_not_exists, insert = rw.create
            if insert:
                self._insert(name, rel)
                return None
            if if_not_exists and self.executor.catalog.exists(name):
                return None
            self.save(rel, name, replace=replace)
            return None
        statement = rw.statement
        catalog = self.executor.catalog
        _refuse_wrapped(statement, catalog)
        dropped, others = _dropped_tensors(statement, catalog)
        if dropped:
            if others:  # DuckDB drops the plain ones first: if it fails, no tensor is gone
                statement.set("tables", others)
                relation(statement, "sql").fetchall()
            for name in dropped:
                self.drop(name)
            return None
        _refuse_writes(statement, catalog)
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
            self._guard_view(statement, rw.calls)  # type: ignore[attr-defined]
        own = rw.original  # the statement's own text when it had nothing to rewrite
        out = self._user_statement(query, lambda: relation(own if own is not None else statement, "sql"))
        if rw.made:  # their temporary tables go when DuckDB's relation does (it runs again when read again)
            self._sql_kept[out] = rw.made
        return out

    def _guard_view(self, statement: exp.Create, calls: Sequence[tuple[str, TensorRelation]]) -> None:
        """A view over tensor functions keeps SQL made for its tensors' dtype, shape and blocks: it now
        checks at every read that their catalog rows are unchanged (replaced by a tensor of another dtype
        of the same width, it read garbage)."""
        from tensorsql.backends.duckdb import catalog as duck_catalog

        names: dict[str, None] = {}
        for _, rel in calls:
            for node in E.topological(rel.node):
                if isinstance(node, E.Source) and not metadata.is_reserved(node.table):
                    names.setdefault(node.table)
        body = statement.expression
        if not names or not isinstance(body, exp.Query):
            return
        entries = [self.executor.catalog.get(n) for n in names]  # type: ignore[attr-defined]
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

    def _insert(self, name: str, rel: TensorRelation) -> None:
        """``INSERT INTO name SELECT * FROM <tensor>`` into an empty table (plain or tensor): the tensor's
        blocks, and the table is a tensor now; a table with rows is refused (a tensor is written whole)."""
        target = exp.Table(this=exp.to_identifier(name, quoted=True))
        ((rows,),) = self.executor.query(exp.select(exp.Count(this=exp.Star())).from_(target), "sql")
        if rows:
            raise CatalogError(
                f"table {name!r} has {rows} rows, and a tensor is written whole: insert into an empty table, "
                "or replace this one (CREATE OR REPLACE TABLE ... AS SELECT * FROM einsum(...))"
            )
        self.save(rel, name, replace=True)

    def _explain_rows(self, rw: object) -> object:
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
            for row in self.executor.relation(explain, "EXPLAIN").fetchall():  # type: ignore[attr-defined]
                keys.append(str(row[0]))
                values.append(str(row[1]))
        return pa.table({"explain_key": keys, "explain_value": values})

    @property
    def closed(self) -> bool:
        return bool(getattr(self.executor, "closed", False))

    def require_open(self, what: str) -> None:
        """Every public method starts here: a closed session raises one typed error, never the engine's."""
        if self.closed:
            raise SessionClosedError(
                f"{what}: this session on {self.database!r} is closed; open a new one with ts.connect()"
            )

    def close(self) -> None:
        """Closes the engine (idempotent); temporary tables and uploaded arrays go with it, and so do the
        cached plans and compiled functions (which hold the engine's statements)."""
        if not self.closed:
            self.plans.clear()
            self._graphs.clear()
            self.compiled.clear()
            self.executor.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning and running ----------------------------------------------------------------------------
    def plan(self, node: E.Node, options: planning.PlanOptions | None = None) -> Plan:
        """Partition (EinDecomp unless ``options`` say otherwise), lower to TRA, run the physical passes."""
        self.require_open("plan")
        opts = options or planning.PlanOptions()
        try:
            return C.compile_plan(
                node,
                strategy=opts.strategy or self.strategy,
                workers=self.p,
                profile=self.executor.profile,
                blocks=opts.parts,
            )
        except RecursionError as exc:
            raise PlanError(
                f"the expression graph is too deep to plan ({len(E.topological(node))} steps, nested past "
                f"Python's recursion limit of {sys.getrecursionlimit()}): materialize() an intermediate "
                "relation and build on it"
            ) from exc

    def clear_cache(self) -> None:
        """Forgets every cached call (``ts.einsum``'s, lazy ``einsum``'s, ``fit``'s compiled steps): their
        plans, and the prepared statements and slots the executor keeps for them, go once no relation holds
        them."""
        self.require_open("clear_cache")
        self.plans.clear()
        self._graphs.clear()
        self.compiled.clear()

    def explain(self, plan: Plan) -> str:
        self.require_open("explain")
        return explain(plan, self.executor.text(plan), self.executor.notes(plan))

    def value(
        self,
        plan: Plan,
        bindings: dict[E.Operand, np.ndarray],
        *,
        gemm_order: bool = True,
        keep: bool = False,
    ) -> np.ndarray:
        """The plan's result as an array, the kernels writing its blocks into it (a result sink) if they can.
        ``keep`` leaves the operands uploaded for the next run with the same arrays (a relation's).

        A big contraction whose output interleaves its operands' labels comes back as a transposed view of its
        GEMM-ordered result (``compile.in_gemm_order``), like numpy's own contractions.
        """
        self.require_open("compute")
        self.check_tables(plan)
        if self.result_sink:  # ``keep`` means nothing to a plan over lent slots alone: released after a run
            fast = self.executor.fast(plan)  # a small call's plan, already prepared
            if fast is not None:
                res = fast(bindings)
                if res is not None:
                    return res
        root = plan.root
        perm = None
        if gemm_order and DTYPES[root.dtype].itemsize * math.prod(root.shape) >= GEMM_ORDER_BYTES:
            if plan not in self._reordered:  # once per plan: a cached call reuses its reordered plan
                self._reordered[plan] = C.in_gemm_order(plan, self.executor.profile)
            reordered = self._reordered[plan]
            if reordered is not None:
                plan, perm = reordered
                root = plan.root
        out = _result_array(root.shape, root.dtype)
        if not (self.result_sink and self.executor.run_into(plan, bindings, out, keep=keep)):
            out = arrow.assemble(
                self.executor.run_arrow(plan, bindings, keep=keep), root.shape, plan.block_shape(), root.dtype
            )
        return out if perm is None else out.transpose(perm)

    # -- making relations -----------------------------------------------------------------------------------
    def _stored(
        self,
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
        return TensorRelation(self, node)

    def _new_blocks(
        self,
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
        storage_blocks = getattr(self.executor, "storage_blocks", None)
        if storage_blocks is not None:
            bs = storage_blocks(shape, bs, itemsize)
        # the default within the session's block cap (a small memory_limit's): blocks of a third of the limit
        # left the waves no room (a product's wave budget is a quarter of it)
        cap = getattr(self.executor, "max_block_bytes", None)
        if isinstance(cap, int) and bs:
            bs = planning.fit_shape(shape, bs, itemsize, cap)
        return bs

    def from_numpy(
        self,
        array: object,
        block_shape: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
        *,
        dtype: object | None = None,
        copy: bool = True,
    ) -> TensorRelation:
        """Split an array into blocks and register them with the executor (Arrow, no extra table copy).

        ``copy=False`` lets the relation view the array's memory where the blocking allows (row slabs of a
        C-contiguous array); the array must then not change while the relation is in use.
        """
        self.require_open("from_numpy")
        _flag(copy, "from_numpy", "copy")
        arr = as_array(array, "from_numpy")
        name = dtype_name(arr.dtype if dtype is None else dtype)
        bs = self._new_blocks(arr.shape, block_shape, blocks, name, "from_numpy")
        table = arrow.split(arr, bs, name, copy=copy)
        view = self.executor.upload(table, (arr.shape, bs, name), verified=True)  # valid as split
        return self._stored(view, arr.shape, bs, name, release=self.executor.release, complete=True)

    def array(self, array: object, *, copy: bool = True) -> TensorRelation:
        """A relation whose value is an array, lent to each run that reads it (a slot, or an upload for a big
        or split read) instead of registered now: nothing reaches the engine until a plan reads it, and its
        ``numpy()`` is the array's copy. A model's weights between training runs are such relations.
        ``copy=False`` keeps the array itself (it must not change while the relation is used)."""
        self.require_open("array")
        _flag(copy, "array", "copy")
        arr = as_array(array, "array")
        name = carrier_dtype(arr.dtype) if arr.dtype.name in CARRIED else dtype_name(arr.dtype)
        arr = arr.astype(DTYPES[name], copy=copy)
        if copy:
            arrow.own(arr)
        leaf = E.Operand(shape=arr.shape, dtype=arr.dtype.name, name="array")
        return TensorRelation(self, leaf, {leaf: arr})

    def from_arrow(self, table: pa.Table) -> TensorRelation:
        """A blocked Arrow table carrying tensorsql schema metadata (what ``to_arrow`` returns)."""
        self.require_open("from_arrow")
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
        view = self.executor.upload(table, (shape, bs, dtype), verified=verified)
        return self._stored(view, shape, bs, dtype, release=self.executor.release)

    def table(self, name: str) -> TensorRelation:
        """A stored tensor relation from the catalog (its name ignores the case of ASCII letters)."""
        self.require_open("table")
        name = metadata.check_name(name, "table")
        entry = self.executor.catalog.get(name)
        return self._from_catalog(entry)

    def _from_catalog(self, entry: Any) -> TensorRelation:
        rel = self._stored(entry.name, entry.shape, entry.block_shape, entry.dtype, release=None)
        self._read_at[rel.node] = self._catalog_gen
        return rel

    def confirm_read(self, rels: Iterable[TensorRelation]) -> None:
        """The stored tables ``rels`` read were checked against the catalog just now (their dtype, shape and
        blocks are what the relations read): runs before the next save or drop skip that lookup."""
        for rel in rels:
            if isinstance(rel.node, E.Source) and rel.node in self._read_at:
                self._read_at[rel.node] = self._catalog_gen

    def check_tables(self, plan: Plan) -> None:
        """Before a run: the stored tensors the plan reads, if any was saved or dropped since it was read
        (``table``), are still what it read: same dtype, shape and blocks (CorruptTableError otherwise, which
        says to read it again). Nothing to look up while no save, drop or SQL statement happened since."""
        self.check_read(plan, [plan.root])

    def check_read(self, key: object, roots: Sequence[E.Node]) -> None:
        """``check_tables`` for the graphs under ``roots`` (a compiled function's outputs), as ``key``."""
        gen = self._catalog_gen
        if not gen or self._checked_at.get(key) == gen:
            return
        read = self._read_at
        if all(v == gen for v in read.values()):  # no relation read from a table before the change: no walk
            self._checked_at[key] = gen
            return
        nodes = dict.fromkeys(n for root in roots for n in E.topological(root))
        stale = [n for n in nodes if isinstance(n, E.Source) and read.get(n, gen) != gen]
        if stale:
            found = self.executor.catalog.get_many([n.table for n in stale])
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
                self._read_at[n] = gen
        self._checked_at[key] = gen

    def tables_named(self, names: Sequence[str]) -> dict[str, TensorRelation]:
        """Those of ``names`` that are stored tensor relations, by name folded to lower case, in one catalog
        lookup (a SQL statement's operands); ``table`` says why one is missing."""
        self.require_open("tables_named")
        valid = []
        for n in names:
            try:
                valid.append(metadata.check_name(n, "table"))
            except TensorSQLError:
                continue
        found = self.executor.catalog.get_many(valid)
        return {k: self._from_catalog(e) for k, e in found.items()}

    def tables(self, details: bool = False) -> list[str] | pa.Table:
        """The names of the stored tensor relations, as spelled by their last save; ``details=True``: an
        Arrow table of (name, shape, dtype, block_shape), one row per tensor."""
        self.require_open("tables")
        _flag(details, "tables", "details")
        names = self.executor.catalog.names()
        if not details:
            return names
        entries = [self.executor.catalog.get(n) for n in names]
        return pa.table(
            {
                "name": pa.array(names, pa.string()),
                "shape": pa.array([list(e.shape) for e in entries], pa.list_(pa.int64())),
                "dtype": pa.array([e.dtype for e in entries], pa.string()),
                "block_shape": pa.array([list(e.block_shape) for e in entries], pa.list_(pa.int64())),
            }
        )

    def save(self, rel: TensorRelation, name: str, *, replace: bool = False) -> TensorRelation:
        """Stores ``rel`` as table ``name`` with its catalog entry. Names ignore the case of ASCII letters (as
        DuckDB's do): saving "a" where "A" exists needs ``replace=True``, and then replaces it."""
        self.require_open("save")
        rel = self._own(rel, "save")
        name = metadata.check_name(name, "save")
        _flag(replace, "save", "replace")
        if rel.ndim > metadata.MAX_RANK:  # written, its catalog entry could not be read back
            raise ShapeError(
                f"save {name!r}: a stored tensor has at most {metadata.MAX_RANK} dimensions, this one has "
                f"{rel.ndim}"
            )
        if not replace and self.executor.catalog.exists(name):
            raise CatalogError(
                f"a table named {name!r} (or one whose name differs only in the case of ASCII letters: they "
                "are one name) already exists; replace=True overwrites it"
            )
        if self.local_executor.has_temporary(name):  # every read of the tensor would read that one
            raise CatalogError(
                f"save {name!r} refused: a temporary table or view of that name would hide the tensor from "
                "every read; drop it, or save under another name"
            )
        plan = rel.plan()
        self.check_tables(plan)
        try:
            self.executor.store(plan, rel.bindings, name, replace=replace)
        finally:
            self._catalog_gen += 1
        return self.table(name)

    def drop(self, name: str) -> None:
        """Drops a stored tensor relation: its table and its catalog entry (TableNotFoundError if none)."""
        self.require_open("drop")
        try:
            self.executor.catalog.drop(metadata.check_name(name, "drop"))
        finally:
            self._catalog_gen += 1

    def _own(self, rel: object, what: str) -> TensorRelation:
        if not isinstance(rel, TensorRelation):
            raise ShapeError(f"{what} takes a TensorRelation, got {type(rel).__name__}")
        if rel.session is not self:
            raise ShapeError(f"{what}: the relation is another session's; save it and open it with table()")
        return rel

    def compute(self, rels: Sequence[TensorRelation], *, store: bool = False) -> list:
        """Several relations of one graph together: every step two or more of them use (or that one uses
        twice) is computed once and stored, and each relation then reads it (a forward pass shared by a loss
        and its gradients). Returns arrays, or with ``store=True`` stored relations."""
        self.require_open("compute")
        if isinstance(rels, TensorRelation) or not isinstance(rels, Sequence):
            raise ShapeError("compute takes a list of relations")
        rels = [self._own(r, "compute") for r in rels]
        bindings: dict[E.Operand, np.ndarray] = {}
        roots = [_merged(bindings, r) for r in rels]
        done: dict[E.Node, E.Node] = {}
        for node in shared_steps(roots):  # a shared step reads the shared steps below it
            rel = TensorRelation(self, E.substitute(node, done), bindings)
            done[node] = self.materialize(rel).node
        out = []
        for r, root in zip(rels, roots, strict=True):
            rel = TensorRelation(self, E.substitute(root, done), bindings, r.options)
            out.append(self.materialize(rel) if store else rel.numpy())
        return out

    def materialize(self, rel: TensorRelation) -> TensorRelation:
        self.require_open("materialize")
        rel = self._own(rel, "materialize")
        if isinstance(rel.node, E.Source):
            return rel
        plan = rel.plan()
        self.check_tables(plan)
        name = self.executor.store(plan, rel.bindings, None, temporary=True)
        complete = not T.may_lack_blocks(plan.tra)
        return self._stored(
            name, rel.shape, plan.block_shape(), rel.node.dtype, release=self.executor.drop, complete=complete
        )

    def from_sql(
        self,
        query: str,
        shape: Sequence[int | None] | None = None,
        block_shape: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
        *,
        dtype: object = "float64",
        index: bool | int | Sequence[int] | None = None,
    ) -> TensorRelation:
        """Rows (i0, ..., i{r-1}, value) of any query -> a blocked relation, built inside the engine.

        Duplicate coordinates are summed (COO semantics); coordinates that are not given are zero.
        ``index``: the dimensions (or True: all) whose coordinates are arbitrary ids rather than positions:
        they are mapped to positions 0..n-1 in sorted order inside DuckDB, and the mapping is kept next to the
        tensor (``rel.ids(d)``; ``to_rows(ids=True)``). An id dimension's size may be left out (None in
        ``shape``, or ``shape=None`` with ``index=True``): it is the number of distinct ids.
        """
        self.require_open("from_sql")
        if not isinstance(query, str):
            raise ConfigError(f"from_sql: query must be SQL text (a str), got {type(query).__name__}")
        query = str.__str__(query)
        if index is not None and index is not False:
            return self._from_ids(query, shape, block_shape, blocks, dtype, index)
        if shape is None:
            raise ConfigError("from_sql: shape= is needed (it may be left out only for index=True)")
        shape = _shape(shape, "from_sql")
        name = dtype_name(dtype)
        bs = self._new_blocks(shape, block_shape, blocks, name, "from_sql")
        table = self.executor.ingest_rows(query, shape, bs, name)  # type: ignore[attr-defined]
        return self._stored(table, shape, bs, name, release=self.executor.drop)

    def _from_ids(
        self,
        query: str,
        shape: Sequence[int | None] | None,
        block_shape: Sequence[int] | None,
        blocks: Sequence[int] | None,
        dtype: object,
        index: object,
    ) -> TensorRelation:
        from tensorsql.backends.duckdb import ingest
        from tensorsql.frontend import ids

        local = self.local_executor
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
                elif int(count) > _shape([sizes[d]], "from_sql")[0]:
                    raise ShapeError(
                        f"from_sql: dimension {d} has {count} distinct ids, more than its size {sizes[d]}"
                    )
            for d, n in enumerate(sizes):
                if n is None:
                    raise ConfigError(
                        f"from_sql: dimension {d} holds positions, so its size must be in shape="
                    )
            rows = ids.positions(parsed, columns, maps).sql(dialect="duckdb")
            rel = self.from_sql(rows, tuple(int(n) for n in sizes), block_shape, blocks, dtype=dtype)  # type: ignore[arg-type]
        except BaseException:
            for name in maps.values():
                local.drop(name)
            raise
        finally:
            if snap is not None:
                snap.drop()
        self._id_maps[rel] = maps
        weakref.finalize(rel, _drop_all, local, list(maps.values()))
        return rel

    def id_table(self, rel: TensorRelation, d: int) -> pa.Table:
        """(position, id) of dimension ``d`` of a relation ``from_sql(index=...)`` made."""
        maps = self._id_maps.get(rel, {})
        if d not in maps:
            have = sorted(maps) or "none"
            raise ConfigError(f"ids: dimension {d} of this relation has no ids (dimensions with ids: {have})")
        local = self.local_executor
        q = exp.select("position", "id").from_(exp.to_identifier(maps[d], quoted=True)).order_by("position")
        # as Arrow, as DuckDB holds them: through Python values a UBIGINT past 2**63 raised OverflowError and
        # a MAP gained the other rows' keys
        got = local.with_arrow({}, lambda: q)
        return pa.table({"position": got.column("position").cast(pa.int64()), "id": got.column("id")})

    def from_table(
        self,
        table: str,
        columns: Sequence[str] | None = None,
        *,
        rows_by: str | Sequence[str] | None = None,
        fill: float | None = None,
        dtype: object = "float64",
        block_shape: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
    ) -> TensorRelation:
        """A wide table (or a SELECT) -> a matrix: one row per table row, one column per feature.

        ``table``: a table name (with ``columns``, the features in order) or a SELECT (its columns, less
        ``rows_by``, unless ``columns`` names them); ``rows_by``: the column(s) that order the rows (row i
        is the i-th in that order; without it, the source's own order); ``fill``: the value of a NULL
        feature (without it a NULL is an error naming the column and the row). Built inside DuckDB
        (``frontend.wide``), checked and packed like ``from_sql``.
        """
        from tensorsql.frontend import wide

        self.require_open("from_table")
        if rows_by is not None and not isinstance(rows_by, str | list | tuple):
            raise ConfigError(f"from_table: rows_by must be a column name or a list of them, got {rows_by!r}")
        order = [rows_by] if isinstance(rows_by, str) else list(rows_by or [])
        if not all(isinstance(c, str) and c for c in order):
            raise ConfigError(f"from_table: rows_by must be a column name or a list of them, got {rows_by!r}")
        if fill is not None and (isinstance(fill, bool) or not isinstance(fill, numbers.Real)):
            raise ConfigError(f"from_table: fill must be a number, got {fill!r}")
        src, cols = wide.source(table, columns)
        local = self.local_executor
        probe = src.this if isinstance(src, exp.Subquery) else exp.select(exp.Star()).from_(src)
        if not wide.rereads(src, local.describe):
            return self._from_table(local, src, probe, table, cols, order, fill, dtype, block_shape, blocks)
        # read below three times (columns, count, cells): a query or a view is read once, into a snapshot
        snap = local.snapshot(probe, "from_table")
        try:
            src = snap.table()
            probe = exp.select(exp.Star()).from_(src)
            return self._from_table(local, src, probe, table, cols, order, fill, dtype, block_shape, blocks)
        finally:
            snap.drop()

    def _from_table(
        self,
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
        from tensorsql.frontend import wide

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
        return self.from_sql(
            query.sql(dialect="duckdb"), (int(n), len(cols)), block_shape, blocks, dtype=dtype
        )

    # -- einsum --------------------------------------------------------------------------------------------
    def as_relation(self, operand: object) -> TensorRelation:
        self.require_open("as_relation")
        if isinstance(operand, TensorRelation):
            if operand.session is not self:
                raise ShapeError("operand belongs to another session; save it and open it with table()")
            return operand
        return self.from_numpy(operand)

    def placeholder(
        self, shape: Sequence[int], dtype: object = "float64", name: str | None = None
    ) -> TensorRelation:
        """An array operand to be given later: build a lazy graph over placeholders and ``compile`` it."""
        self.require_open("placeholder")
        if name is not None and not isinstance(name, str):
            raise ConfigError(f"placeholder: name must be a str or None, got {type(name).__name__}")
        name = None if name is None else str.__str__(name)
        shp = _shape(shape, "placeholder")
        node = E.Operand(shape=shp, dtype=dtype_name(dtype), name=name or "placeholder")
        return TensorRelation(self, node)

    def einsum(
        self,
        *args: object,
        optimize: object = "auto",
        dtype: object | None = None,
        join: str | None = None,
        agg: str | None = None,
        strategy: str | None = None,
        blocks: dict[object, int] | None = None,
        copy: bool = True,
        casting: str = "safe",
        cache: bool = True,
    ) -> TensorRelation:
        """A lazy relation for ``numpy.einsum(*args)``, extended with ``join``/``agg`` (README "Extended
        EinSum"). ``dtype=``/``casting=`` as numpy's; a bool or float16 array operand (no tensor has those
        dtypes) takes numpy's promotion against the other operands.

        Blocking: EinDecomp by default; ``strategy=`` picks another (sqrt, data, model, none, operands)
        and ``blocks={label: parts}`` fixes the parts of the named labels in every step. Array operands are
        uploaded in the blocking the plan reads them with (they are free to split; stored relations are not);
        ``copy=False`` borrows their memory instead of copying it: every run of the relation reads the arrays
        as they are then (change one and the next run computes with the change; change it while a run
        reads it and that run's result is undefined). With the default, the relation has its own
        read-only copies, and every run gives the same result.

        ``cache``: a call over arrays alone keeps its graph and plan for the next call of the same
        subscripts, operand shapes, dtypes and options (``Session._graphs``, least recently used first out),
        so ``s.einsum(...).numpy()`` in a loop plans once; False plans this relation on its own.
        """
        self.require_open("einsum")
        _flag(copy, "einsum", "copy")
        _flag(cache, "einsum", "cache")
        options = planning.PlanOptions(strategy)  # validated here, once
        frontend.check_casting(casting)
        inputs, output, operands = split_args(args)
        arrays = {
            i: as_array(op, f"operand {i}")
            for i, op in enumerate(operands)
            if not isinstance(op, TensorRelation)
        }
        promoted = None
        if any(a.dtype.name in CARRIED for a in arrays.values()):  # numpy's promotion, in a carried dtype
            kinds = [arrays[i].dtype if i in arrays else op.dtype for i, op in enumerate(operands)]
            promoted = np.result_type(*kinds)
        names: dict[int, str] = {}
        for i, op in enumerate(operands):
            if isinstance(op, TensorRelation):
                if op.session is not self:
                    raise ShapeError("operand belongs to another session; save it and open it with table()")
            else:
                arr = arrays[i]
                names[i] = carrier_dtype(promoted) if arr.dtype.name in CARRIED else dtype_name(arr.dtype)
        # a call seen before (the same subscripts, operand shapes and dtypes, and options) reuses its
        # graph: no parsing, path search or graph building, and its plan is cached with the graph's nodes
        key = self._einsum_key(inputs, output, operands, arrays, names, optimize, dtype, join, agg, casting,
                               strategy, blocks)  # fmt: skip
        # only calls over arrays alone: a graph over a relation would keep the relation's tables alive
        if not cache or any(isinstance(op, TensorRelation) for op in operands):
            key = None
        cached = self._graphs.get(key) if key is not None else None
        leaves: list[E.Operand | None] = []
        nodes: list[E.Node] = []
        bindings: dict[E.Operand, np.ndarray] = {}
        for i, op in enumerate(operands):
            if isinstance(op, TensorRelation):
                nodes.append(_merged(bindings, op))
                leaves.append(None)
                continue
            arr = arrays[i]
            name = names[i]
            try:
                arr = arr.astype(DTYPES[name], copy=copy)
            except MemoryError as exc:  # a broadcast view of 8 bytes may be 512 GiB copied
                nbytes = arr.size * DTYPES[name].itemsize
                raise OutOfMemoryError(
                    f"cannot copy operand {i} of shape {arr.shape} ({nbytes / 2**30:.3g} GiB): {exc}"
                ) from exc
            if copy:  # the relation's own: nobody changes it (a cluster keeps it on the workers)
                arrow.own(arr)
            cached_leaf = cached.leaves[i] if cached is not None else None
            leaf = cached_leaf or E.Operand(shape=arr.shape, dtype=arr.dtype.name, name=f"operand{i}")
            nodes.append(leaf)
            leaves.append(leaf)
            bindings[leaf] = arr
        if cached is not None:
            return TensorRelation(self, cached.node, bindings, cached.options, cache=cached)
        sub = parse(inputs, output, [n.shape for n in nodes])
        if blocks is not None:
            options = planning.PlanOptions(strategy, tuple(_label_parts(blocks, sub.sizes).items()))
        node = frontend.build(
            sub,
            nodes,
            optimize=optimize,
            join=join or "multiply",
            agg=agg or "sum",
            dtype=dtype,
            casting=casting,
        )
        entry = None
        if key is not None:
            entry = self._graphs.put(key, GraphEntry(node, tuple(leaves), options))
        return TensorRelation(self, node, bindings, options, cache=entry)

    @staticmethod
    def _einsum_key(
        inputs: list[list[object]],
        output: list[object] | None,
        operands: list[object],
        arrays: dict[int, np.ndarray],
        names: dict[int, str],
        *options: object,
    ) -> Hashable | None:
        """The key of a lazy einsum call's graph: its subscripts, each array operand's shape and dtype, each
        relation operand's node (by identity), and the options; None when an option has no stable value (an
        optimizer object): such calls are not cached."""
        opts = hashable(list(options))
        if opts is None:
            return None
        ops = tuple(
            (arrays[i].shape, names[i]) if i in arrays else op.node  # type: ignore[attr-defined]
            for i, op in enumerate(operands)
        )
        terms = tuple(tuple(t) for t in inputs)
        return ("einsum", terms, None if output is None else tuple(output), ops, opts)

    def map(self, rel: object, fn: str, param: float | None = None) -> TensorRelation:
        """An element-wise function of every element (exp, log, sqrt, relu, neg, abs, pow, scale, ...)."""
        self.require_open("map")
        r = self.as_relation(rel)
        return TensorRelation(self, frontend.map_node(r.node, fn, param), r.bindings)

    def compile(
        self,
        outputs: TensorRelation | Sequence[TensorRelation],
        inputs: Sequence[TensorRelation],
        *,
        share: bool = False,
    ) -> Compiled:
        """A callable that runs the lazy graph of ``outputs`` on new arrays for the placeholders ``inputs``
        (``placeholder``), planned once: each call binds the arrays and runs the cached plans. ``share``:
        the steps several outputs use are computed once per call and handed to the others as arrays (a
        forward pass shared by a loss and its gradients; a statement more per shared step)."""
        self.require_open("compile")
        _flag(share, "compile", "share")
        return Compiled(self, outputs, inputs, share=share)


def _drop_all(executor: object, names: list[str]) -> None:
    """A relation's id tables, dropped when it is collected (nothing to do once the session has closed)."""
    if getattr(executor, "closed", False):
        return
    for name in names:
        executor.drop(name)  # type: ignore[attr-defined]


def _tensor(target: object, catalog: object) -> str | None:
    """The catalog's name for a table reference that is a tensor table (unqualified, or qualified with the
    current database and schema: ``memory.main.X`` too); None for anything else (a plain table, a view, a
    temporary table). A tensor table of another schema's or database's catalog is refused: its entry is
    that catalog's (``DROP TABLE main.X`` while another schema is current dropped the current one's X)."""
    if isinstance(target, exp.Schema):
        target = target.this
    if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
        return None
    if _in_temp(target):
        return None  # a temporary table is never a tensor table
    database, schema = target.text("catalog"), target.text("db")
    if database or schema:
        here_db, here_schema = catalog.here()  # type: ignore[attr-defined]
        if not database and metadata.fold(schema) == metadata.fold(here_db):
            schema = here_schema  # "memory.X": DuckDB reads a database's name there as the database
        if (database and metadata.fold(database) != metadata.fold(here_db)) or (
            schema and metadata.fold(schema) != metadata.fold(here_schema)
        ):
            where_db, where_schema = database or here_db, schema or here_schema
            if catalog.listed_in(where_db, where_schema, target.name):  # type: ignore[attr-defined]
                raise CatalogError(
                    f"{target.sql(dialect='duckdb')} is a tensor table of {where_db}.{where_schema}'s own "
                    f"catalog; write or drop it from a session whose current schema is that one"
                )
            return None
    want = metadata.fold(target.name)
    for name in catalog.names():  # type: ignore[attr-defined]
        if metadata.fold(name) == want:
            return name
    return None


def _dropped_tensors(statement: exp.Expression, catalog: object) -> tuple[list[str], list[exp.Table]]:
    """The tensor tables a ``DROP TABLE`` names (dropped with their catalog entries, as ``Session.drop``) and
    the other tables it names (dropped by DuckDB first, so a failure there drops nothing). tensorsql's own
    tables (its catalog, its temporary tables) are refused: the catalog dropped lost every tensor's entry."""
    kind = str(statement.args.get("kind", "")).upper() if isinstance(statement, exp.Drop) else ""
    if kind not in ("TABLE", "VIEW"):
        return [], []
    tables = list(statement.args.get("tables") or ([statement.this] if statement.this else []))
    for t in tables:
        if isinstance(t, exp.Table) and metadata.is_reserved(t.name):
            raise CatalogError(
                f"dropping {t.name!r} is refused: it is tensorsql's own ({metadata.CATALOG!r} holds the "
                "catalog of every tensor table; drop tensors by their names)"
            )
    if kind != "TABLE":
        return [], []
    tensors = [t for t in tables if _tensor(t, catalog) is not None]
    names = list(dict.fromkeys(str(_tensor(t, catalog)) for t in tensors))  # DROP TABLE A, A: once
    return names, [t for t in tables if t not in tensors]


def _in_temp(table: exp.Table) -> bool:
    """A name in DuckDB's ``temp`` catalog (``temp.A``, ``temp.main.A``)."""
    database = table.text("catalog")
    return database.lower() == "temp" or (not database and table.text("db").lower() == "temp")


def _created(create: exp.Create) -> exp.Expression:
    """The table a CREATE makes (``CREATE TABLE t (a INT)`` wraps it in its column list)."""
    return create.this.this if isinstance(create.this, exp.Schema) else create.this


def _temporary(create: exp.Create) -> bool:
    """CREATE TEMP TABLE, or a table made in DuckDB's ``temp`` catalog."""
    props = create.args.get("properties")
    if props and any(isinstance(p, exp.TemporaryProperty) for p in props.expressions):
        return True
    target = _created(create)
    return isinstance(target, exp.Table) and _in_temp(target)


def _wrapped(statement: exp.Expression) -> exp.Expression | None:
    """The statement inside ``EXPLAIN ANALYZE <it>`` (which runs it) or ``PREPARE name AS <it>`` (run by a
    later ``EXECUTE``): sqlglot reads those as an opaque Command, which DuckDB then ran unchecked (a DELETE of
    a tensor's rows, an UPDATE of the catalog). Found by tokens (a quoted name, a comment, a parameter list
    before ``AS``); one whose body cannot be found or read is refused (SQLFrontendError), never run
    unchecked. None for any other statement."""
    if not isinstance(statement, exp.Command) or not isinstance(statement.expression, exp.Literal):
        return None
    verb, text = statement.name.upper(), statement.expression.name
    if verb not in ("EXPLAIN", "PREPARE"):
        return None
    refused = SQLFrontendError(
        f"sql cannot read the statement this {verb} runs, so it cannot check that it leaves the tensor "
        f"tables whole; run it without the {verb}, or through execute() on your own responsibility"
    )
    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except (sqlglot.errors.SqlglotError, RecursionError) as exc:
        raise refused from exc
    at = 0
    if verb == "EXPLAIN":
        if tokens and tokens[0].text.upper() in ("ANALYZE", "ANALYSE"):
            at = 1
        elif tokens and tokens[0].token_type == sqlglot.TokenType.L_PAREN:  # EXPLAIN (ANALYZE, ...) stmt
            at = _past_group(tokens, 0)
        else:
            return None  # a plain EXPLAIN runs nothing
    else:
        at = 1  # the prepared statement's name (quoted, or not)
        if at < len(tokens) and tokens[at].token_type == sqlglot.TokenType.L_PAREN:  # its parameter types
            at = _past_group(tokens, at)
        if at >= len(tokens) or tokens[at].text.upper() != "AS":
            raise refused
        at += 1
    if at <= 0 or at >= len(tokens):
        raise refused
    end = len(tokens)
    while tokens[at].token_type == sqlglot.TokenType.L_PAREN and _past_group(tokens, at) == end:
        at, end = at + 1, end - 1  # EXPLAIN ANALYZE (DELETE FROM A)
        if at >= end:
            raise refused
    try:
        body = text[tokens[at].start : tokens[end - 1].end + 1]
        parsed = [s for s in sqlglot.parse(body, read="duckdb") if s is not None]
    except (sqlglot.errors.SqlglotError, RecursionError) as exc:
        raise refused from exc
    if len(parsed) != 1:
        raise refused
    return parsed[0]


def _past_group(tokens: list, at: int) -> int:
    """The index after the parenthesized group opening at ``tokens[at]`` (-1 when it does not close)."""
    depth = 0
    for i in range(at, len(tokens)):
        kind = tokens[i].token_type
        depth += kind == sqlglot.TokenType.L_PAREN
        depth -= kind == sqlglot.TokenType.R_PAREN
        if depth == 0:
            return i + 1
    return -1


def _refuse_wrapped(statement: exp.Expression, catalog: object) -> None:
    """``EXPLAIN ANALYZE`` / ``PREPARE`` of a statement ``sql`` refuses on its own is refused the same way,
    and so is a DROP of a tensor table inside one (only a DROP statement drops a tensor with its entry)."""
    inner = _wrapped(statement)
    if inner is None:
        return
    _refuse_wrapped(inner, catalog)
    dropped, _ = _dropped_tensors(inner, catalog)
    if dropped:
        raise CatalogError(
            f"{statement.name.upper()} of a DROP refused: {dropped[0]!r} is a tensor table; drop a tensor "
            "with DROP TABLE (or drop()), which drops its catalog entry with it"
        )
    _refuse_writes(inner, catalog)


def _refuse_writes(statement: exp.Expression, catalog: object) -> None:
    """A tensor table holds each block once, with its catalog entry: rows inserted, changed or deleted, a
    table renamed or replaced by a plain one would leave a tensor that is wrong or an entry that is stale."""
    kinds = {
        exp.Insert: "INSERT INTO",
        exp.Update: "UPDATE",
        exp.Delete: "DELETE FROM",
        exp.Alter: "ALTER TABLE",
        exp.TruncateTable: "TRUNCATE",
        exp.Create: "CREATE OR REPLACE",
        exp.Merge: "MERGE INTO",
        exp.Copy: "COPY ... FROM",
    }
    for kind, verb in kinds.items():
        if not isinstance(statement, kind):
            continue
        if isinstance(statement, exp.Copy) and not statement.args.get("kind"):
            return  # COPY ... TO reads the table
        if isinstance(statement, exp.TruncateTable):
            targets = list(statement.expressions)
        else:
            targets = [statement.this]
        for target in targets:  # tensorsql's own catalog: a TRUNCATE or a rename lost every tensor's entry
            if isinstance(target, exp.Table) and metadata.is_reserved(target.name) and not (
                isinstance(statement, exp.Create) and not statement.args.get("replace")
            ):
                raise CatalogError(
                    f"{verb} {target.name!r} refused: it is tensorsql's own ({metadata.CATALOG!r} holds the "
                    "tensors' entries); use save(), drop() and the tensor statements"
                )
        if isinstance(statement, exp.Create) and _temporary(statement):
            # a temporary table of a tensor's name hides the tensor from every read, and a DROP of the name
            # then drops the user's temporary table with the tensor's catalog entry (temp.A too: the name is
            # looked up bare)
            target = _created(statement)
            bare = exp.Table(this=target.this) if isinstance(target, exp.Table) else target
            name = _tensor(bare, catalog)
            if name is not None:
                raise CatalogError(
                    f"a temporary table named {name!r} is refused: {name!r} is a tensor table, which it "
                    "would hide from every read; give the temporary table another name"
                )
            return
        if isinstance(statement, exp.Create) and not statement.args.get("replace"):
            return  # a plain CREATE of an existing name fails in DuckDB, typed
        for target in targets:
            name = _tensor(target, catalog)
            if name is not None:
                raise CatalogError(
                    f"{verb} refused: {name!r} is a tensor table, written whole with its catalog entry; "
                    "replace it (CREATE OR REPLACE TABLE ... AS SELECT * FROM einsum(...)) or drop it"
                )


class Compiled:
    """``Session.compile``'s result: ``f(*arrays)`` -> array (or a tuple, for several outputs)."""

    def __init__(
        self,
        session: Session,
        outputs: TensorRelation | Sequence[TensorRelation],
        inputs: Sequence[TensorRelation],
        share: bool = False,
    ) -> None:
        single = isinstance(outputs, TensorRelation)
        for given, what in ((outputs, "outputs"), (inputs, "inputs")):
            if not (single and what == "outputs") and (
                isinstance(given, str | bytes | TensorRelation) or not isinstance(given, Iterable)
            ):
                raise ShapeError(f"compile: {what} must be a list of relations, got {type(given).__name__}")
        inputs = list(inputs)
        outs = [outputs] if single else list(outputs)  # type: ignore[list-item]
        self._single = single
        self._leaves: list[E.Operand] = []
        for i, rel in enumerate(inputs):
            if not (isinstance(rel, TensorRelation) and isinstance(rel.node, E.Operand)):
                raise ShapeError(f"compile: input {i} must be a placeholder (Session.placeholder)")
            if rel.session is not session:
                raise ShapeError(f"compile: input {i} belongs to another session")
            if any(rel.node is leaf for leaf in self._leaves):  # the last array given would silently win
                raise ShapeError(f"compile: input {i} is input {self._leaves.index(rel.node)} again")
            self._leaves.append(rel.node)
        self._session = session
        self._plans: list[Plan] = []
        self._bound: list[dict[E.Operand, np.ndarray]] = []
        for j, rel in enumerate(outs):
            if not isinstance(rel, TensorRelation) or rel.session is not session:
                raise ShapeError(f"compile: output {j} must be a relation of this session")
        merged: dict[E.Operand, np.ndarray] = {}
        for j, rel in enumerate(outs):  # outputs of one cached call with other arrays: fresh leaves
            node = _merged(merged, rel)
            if node is not rel.node:
                leaves = [n for n in E.topological(node) if isinstance(n, E.Operand)]
                bound = {n: merged[n] for n in leaves if n in merged}
                outs[j] = TensorRelation(session, node, bound, rel.options)
        #: shared steps, each run before the outputs into the placeholder that stands for it
        self._stages: list[tuple[Plan, dict[E.Operand, np.ndarray], E.Operand]] = []
        #: the whole graph as one run (``Executor.many``) and the arrays bound in it; None: plan by plan
        self._many: tuple[Callable, dict[E.Operand, np.ndarray]] | None = None
        self._outs = outs
        if share and len(outs) > 1:
            self._many = self._plan_many(outs)
        if self._many is None:
            self._plan_each(outs, share)

    def _plan_many(self, outs: list[TensorRelation]) -> tuple[Callable, dict[E.Operand, np.ndarray]] | None:
        """The outputs and the steps they share as one run of the executor, when it can: each shared step
        is planned by itself, and read by the later plans as a stored relation of the step's blocking."""
        session = self._session
        many = getattr(session.executor, "many", None)
        if many is None or not session.result_sink:  # it writes its outputs through result sinks only
            return None
        bindings: dict[E.Operand, np.ndarray] = {}
        for rel in outs:
            bindings.update(rel.bindings)
        uid = next(_shared_ids)
        done: dict[E.Node, E.Node] = {}
        stages: list[tuple[str, Plan]] = []
        for i, node in enumerate(shared_steps([rel.node for rel in outs])):
            plan = TensorRelation(session, E.substitute(node, done), bindings).plan()
            table = f"_ts_shared_{uid}_{i}"
            blocks = plan.block_shape()
            complete = not T.may_lack_blocks(plan.tra)  # from arrays alone: no absent block to fill later
            done[node] = E.Source(
                shape=node.shape, dtype=node.dtype, table=table, block_shape=blocks, complete=complete
            )
            stages.append((table, plan))
        plans = []
        for j, rel in enumerate(outs):
            plan = TensorRelation(session, E.substitute(rel.node, done), rel.bindings, rel.options).plan()
            self._check_known(plan, j, set(self._leaves), bindings)
            plans.append(plan)
        for _, plan in stages:
            self._check_known(plan, None, set(self._leaves), bindings)
        run = many(stages, plans)
        if run is None:
            return None
        return run, {op: a for op, a in bindings.items() if op not in self._leaves}

    @staticmethod
    def _check_known(plan: Plan, j: int | None, known: set[E.Operand], bindings: Mapping) -> None:
        missing = [op.name for op in plan.operands if op not in known and op not in bindings]
        if missing:
            what = "a shared step" if j is None else f"output {j}"
            raise ShapeError(f"compile: {what} depends on placeholders not in inputs: {missing}")

    def _plan_each(self, outs: list[TensorRelation], share: bool) -> None:
        """A plan per output (and per shared step, whose value the later plans read as an array)."""
        session = self._session
        done: dict[E.Node, E.Node] = {}
        if share and len(outs) > 1:
            bindings: dict[E.Operand, np.ndarray] = {}
            for rel in outs:
                bindings.update(rel.bindings)
            for i, node in enumerate(shared_steps([rel.node for rel in outs])):
                step = TensorRelation(session, E.substitute(node, done), bindings)
                stand_in = E.Operand(shape=node.shape, dtype=node.dtype, name=f"shared{i}")
                self._stages.append((step.plan(), self._bound_of(step), stand_in))
                done[node] = stand_in
        known = set(self._leaves) | {stand_in for _, _, stand_in in self._stages}
        for j, rel in enumerate(outs):
            if done:
                rel = TensorRelation(session, E.substitute(rel.node, done), rel.bindings, rel.options)
            plan = rel.plan()
            self._check_known(plan, j, known, rel.bindings)
            self._plans.append(plan)
            self._bound.append(self._bound_of(rel))

    def _bound_of(self, rel: TensorRelation) -> dict[E.Operand, np.ndarray]:
        return {op: a for op, a in rel.bindings.items() if op not in self._leaves}

    def __call__(self, *arrays: object) -> object:
        if len(arrays) != len(self._leaves):
            raise EinsumError(f"expected {len(self._leaves)} input arrays, got {len(arrays)}")
        given: dict[E.Operand, np.ndarray] = {}
        for i, (leaf, a) in enumerate(zip(self._leaves, arrays, strict=True)):
            arr = as_array(a, f"input {i}")
            if arr.shape != leaf.shape:
                raise ShapeError(f"input {i} ({leaf.name!r}) has shape {arr.shape}, expected {leaf.shape}")
            if arr.dtype.name == leaf.dtype and not arr.dtype.isnative:  # big-endian float64: the same values
                arr = arr.astype(arr.dtype.newbyteorder("="))
            if arr.dtype.name != leaf.dtype:
                want = DTYPES[leaf.dtype]
                if not np.can_cast(arr.dtype, want, "same_kind"):
                    raise DTypeError(
                        f"input {i} ({leaf.name!r}) has dtype {arr.dtype}, expected {leaf.dtype}"
                    )
                with np.errstate(over="ignore", invalid="ignore"):  # found below, as a typed error
                    cast = arr.astype(leaf.dtype)
                if not np.can_cast(arr.dtype, want, "safe") and not _kept(arr, cast):
                    # a narrowing cast that changes values: int64 300 into an int8 placeholder was 44
                    raise DTypeError(
                        f"input {i} ({leaf.name!r}) of dtype {arr.dtype} has values that {leaf.dtype} cannot "
                        "hold (it would wrap or overflow); pass an array of the placeholder's dtype"
                    )
                arr = cast
            given[leaf] = arr
        self._session.check_read(self, [o.node for o in self._outs])
        if self._many is not None and self._session.result_sink:
            self._session.require_open("compute")
            run, bound = self._many
            results = run({**bound, **given})
            if results is not None:
                return results[0] if self._single else tuple(results)
            # an absent block (a sparse stored input: it stays so): from now on the plans run one by one,
            # which fill it with zeros
            self._many = None
        if not self._plans:
            self._plan_each(self._outs, share=True)
        for plan, bound, stand_in in self._stages:
            given[stand_in] = self._session.value(plan, {**bound, **given})
        results = [
            self._session.value(plan, {**bound, **given})
            for plan, bound in zip(self._plans, self._bound, strict=True)
        ]
        return results[0] if self._single else tuple(results)


def shared_steps(roots: Sequence[E.Node]) -> list[E.Node]:
    """The steps (not leaves) of the graphs of ``roots`` that two or more consumers use (a root counts as a
    use), inputs before consumers."""
    uses: dict[E.Node, int] = {}
    order: list[E.Node] = []
    seen: set[E.Node] = set()
    for root in roots:
        uses[root] = uses.get(root, 0) + 1
        for node in E.topological(root):
            if node not in seen:
                seen.add(node)
                order.append(node)
                for child in E.children(node):
                    uses[child] = uses.get(child, 0) + 1
    return [n for n in order if uses.get(n, 0) >= 2 and E.children(n)]


#: the word that makes a table temporary (CREATE TEMP[ORARY] ..., temp.X)
_TEMP_WORD = re.compile(r"\btemp(orary)?\b", re.IGNORECASE)


#: the largest dimension a shape may give (block keys and element offsets are int64)
MAX_DIMENSION = 2**62


def _shape(shape: object, what: str) -> tuple[int, ...]:
    """A user's shape as a tuple of non-negative ints, or a ShapeError naming the call."""
    try:
        given = tuple(shape)  # type: ignore[call-overload]  # once: a generator would be empty the next time
        if any(isinstance(n, bool | np.bool_) for n in given):
            raise TypeError("a bool is not a size")
        shp = tuple(operator.index(n) for n in given)
    except TypeError as exc:
        raise ShapeError(f"{what}: shape={shape!r} is not a sequence of ints") from exc
    if any(n < 0 for n in shp):
        raise ShapeError(f"{what}: shape {shp} has a negative dimension")
    if any(n > MAX_DIMENSION for n in shp):  # 10**20 reached DuckDB as a HUGEINT: its Binder Error
        raise ShapeError(f"{what}: shape {shp} has a dimension past 2**62 elements")
    return shp


#: {database file: [generation]}: one count of the catalog's changes per file, for this process's sessions
#: (which share its DuckDB instance)
_GENERATIONS: dict[str, list[int]] = {}


def _generation(executor: object) -> list[int]:
    """The catalog generation cell of ``executor``'s database: shared by file, its own for ``:memory:``."""
    database = str(getattr(executor, "database", "") or "")
    if database in ("", ":memory:") or database.startswith(":memory:"):
        return [0]
    return _GENERATIONS.setdefault(os.path.realpath(database), [0])


def _flag(value: object, what: str, name: str) -> None:
    """A boolean option is a bool (a str like "no" would be true)."""
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{what}: {name}= must be a bool, got {type(value).__name__}")


def _result_array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The array a result is written into; one this process cannot allocate is a typed error that says so."""
    try:
        return np.empty(shape, dtype=DTYPES[dtype])
    except (MemoryError, ValueError) as exc:
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        raise OutOfMemoryError(
            f"cannot allocate the result: shape {shape} of {dtype} is {nbytes / 2**30:.3g} GiB ({exc})"
        ) from exc


def as_array(value: object, what: str) -> np.ndarray:
    """np.asarray with numpy's complaints about ragged or odd input turned into tensorsql errors."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ShapeError(f"{what}: cannot make an array of {type(value).__name__}: {exc}") from exc


def _merged(bindings: dict[E.Operand, np.ndarray], rel: TensorRelation) -> E.Node:
    """``rel``'s node, its bindings added to ``bindings``. Relations made from one cached call share their
    graph (``Session.einsum``), so two of them bind the same leaves to different arrays: where a leaf is
    bound already to another array, ``rel``'s graph is rebuilt over fresh leaves and those are bound."""
    clash = [leaf for leaf, arr in rel.bindings.items() if leaf in bindings and bindings[leaf] is not arr]
    if not clash:
        bindings.update(rel.bindings)
        return rel.node
    fresh: dict[E.Node, E.Node] = {
        leaf: E.Operand(shape=leaf.shape, dtype=leaf.dtype, name=leaf.name) for leaf in clash
    }
    for leaf, arr in rel.bindings.items():
        bindings[fresh.get(leaf, leaf)] = arr  # type: ignore[index]
    return E.substitute(rel.node, fresh)


def _label_parts(blocks: dict[object, int], sizes: dict[int, int]) -> dict[int, int]:
    """``blocks={'i': 4, 'k': 2}`` (letters, or ints in the sublist form) -> parts per int label."""
    if not isinstance(blocks, dict):
        raise ShapeError(f"blocks must be a dict label -> parts, got {blocks!r}")
    out: dict[int, int] = {}
    for key, parts in blocks.items():
        label = letter_label(key) if isinstance(key, str) and len(key) == 1 else key
        if not isinstance(label, int) or label not in sizes:
            raise EinsumError(f"blocks names label {key!r}, which is not in the einsum")
        if not isinstance(parts, int) or parts < 1 or parts > max(1, sizes[label]):
            raise ShapeError(f"blocks[{key!r}]={parts!r} must be an int in 1..{max(1, sizes[label])}")
        out[label] = parts
    return out


__all__ = ["Compiled", "Session", "TensorSQLError", "as_array"]


def _kept(before: np.ndarray, after: np.ndarray) -> bool:
    """Whether a narrowing cast kept every value: integers exactly, floats without overflowing to
    infinity (rounding to the narrower float is the cast's point)."""
    if after.dtype.kind in "iu":  # compared as values (numpy's mixed-sign comparisons are exact): a round
        # trip through the cast could not see uint8 200 wrapped to int8 -56, of the same width
        return bool(np.array_equal(after, before))
    with np.errstate(invalid="ignore"):
        return not bool(np.any(np.isinf(after) & np.isfinite(before)))

