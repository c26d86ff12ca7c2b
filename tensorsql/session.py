"""Session: the user's handle, a facade over one executor (the embedded DuckDB by default).

It builds expression graphs (front ends), compiles them into plans (``compile``), caches the plans of repeated
calls (``compile.cache``) and hands finished plans to its executor. It imports no engine: the executor is
chosen in ``connect`` and reached only through the ``Executor`` protocol (``backends.base``). What is not
the facade's own lives beside it: relations from data (``ingest``), lazy einsum calls (``lazy``), stored
tensors (``stored``), the SQL a user runs (``session_sql``, policed by ``sqlpolicy``) and compiled graphs
(``compiled``).
"""

from __future__ import annotations

import math
import os
import sys
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from sqlglot import exp

from tensorsql import compile as C
from tensorsql import ingest, lazy, session_sql, stored
from tensorsql.arguments import as_array, check_flag, checked_shape
from tensorsql.backends import arrow
from tensorsql.backends.base import Executor
from tensorsql.compile import planning
from tensorsql.compile.cache import GraphEntry, LRUCache, PlanCache
from tensorsql.compile.plan import Plan, explain
from tensorsql.compiled import Compiled, compute
from tensorsql.dtypes import DTYPES, dtype_name
from tensorsql.errors import (
    ConfigError,
    OutOfMemoryError,
    PlanError,
    SessionClosedError,
    ShapeError,
    TensorSQLError,
)
from tensorsql.frontend import numpy as frontend
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.relation import TensorRelation

_OFF = ("0", "false", "no", "off")
#: results from this size on may come back as a transposed view of the GEMM-ordered result (numpy())
GEMM_ORDER_BYTES = 1 << 20
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
        self._gen = stored.generation(getattr(executor, "local", executor))
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

    def __repr__(self) -> str:
        """What a session is on, without a query (it works on a closed session too)."""
        state = "closed" if self.closed else "open"
        try:
            where = f"database={self.database!r} threads={self.threads}"
        except Exception:  # a half-made or closed executor: the class says enough
            where = f"executor={type(self.executor).__name__}"
        return f"<tensorsql.Session {where} strategy={self._strategy!r} {state}>"

    # -- SQL -----------------------------------------------------------------------------------------------
    def execute(self, query: str | exp.Expression, what: str = "query") -> list[tuple]:
        """Run a SQL statement on the executor and fetch its rows (the embedded DuckDB only)."""
        return session_sql.execute(self, query, what)

    def sql(self, query: str, *, explain: bool = False) -> object:
        """One DuckDB SQL statement in which tensor tables are ordinary tables and the tensor table functions
        (``einsum``, ``tensor_map``, ``softmax``, ``tensor_cells``, ``tensor_from_cells``) are available:
        each is planned like the Python API and replaced by its generated query (docs "SQL and the command
        line"). Returns DuckDB's relation for the statement (``.fetchall()``, ``.arrow()``, ``.df()``);
        ``CREATE [OR REPLACE] TABLE t AS SELECT * FROM <tensor function>`` saves ``t`` as a tensor table
        (None). ``explain=True`` (or a statement starting with ``EXPLAIN``): the plans' rows, not the
        statement's."""
        return session_sql.sql(self, query, explain=explain)

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
        return ingest.from_numpy(self, array, block_shape, blocks, dtype=dtype, copy=copy)

    def array(self, array: object, *, copy: bool = True) -> TensorRelation:
        """A relation whose value is an array, lent to each run that reads it (a slot, or an upload for a big
        or split read) instead of registered now: nothing reaches the engine until a plan reads it, and its
        ``numpy()`` is the array's copy. A model's weights between training runs are such relations.
        ``copy=False`` keeps the array itself (it must not change while the relation is used)."""
        return ingest.array(self, array, copy=copy)

    def from_arrow(self, table: pa.Table) -> TensorRelation:
        """A blocked Arrow table carrying tensorsql schema metadata (what ``to_arrow`` returns)."""
        return ingest.from_arrow(self, table)

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
        return ingest.from_sql(self, query, shape, block_shape, blocks, dtype=dtype, index=index)

    def id_table(self, rel: TensorRelation, d: int) -> pa.Table:
        """(position, id) of dimension ``d`` of a relation ``from_sql(index=...)`` made."""
        return ingest.id_table(self, rel, d)

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
        return ingest.from_table(
            self, table, columns, rows_by=rows_by, fill=fill, dtype=dtype, block_shape=block_shape,
            blocks=blocks,
        )

    # -- stored tensors --------------------------------------------------------------------------------------
    def table(self, name: str) -> TensorRelation:
        """A stored tensor relation from the catalog (its name ignores the case of ASCII letters)."""
        return stored.table(self, name)

    def tables_named(self, names: Sequence[str]) -> dict[str, TensorRelation]:
        """Those of ``names`` that are stored tensor relations, by name folded to lower case, in one catalog
        lookup (a SQL statement's operands); ``table`` says why one is missing."""
        return stored.tables_named(self, names)

    def tables(self, details: bool = False) -> list[str] | pa.Table:
        """The names of the stored tensor relations, as spelled by their last save; ``details=True``: an
        Arrow table of (name, shape, dtype, block_shape), one row per tensor."""
        return stored.tables(self, details)

    def save(self, rel: TensorRelation, name: str, *, replace: bool = False) -> TensorRelation:
        """Stores ``rel`` as table ``name`` with its catalog entry. Names ignore the case of ASCII letters (as
        DuckDB's do): saving "a" where "A" exists needs ``replace=True``, and then replaces it."""
        return stored.save(self, rel, name, replace=replace)

    def drop(self, name: str) -> None:
        """Drops a stored tensor relation: its table and its catalog entry (TableNotFoundError if none)."""
        stored.drop(self, name)

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
        stored.check_read(self, key, roots, gen)

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
        return compute(self, rels, store)

    def materialize(self, rel: TensorRelation) -> TensorRelation:
        self.require_open("materialize")
        rel = self._own(rel, "materialize")
        if isinstance(rel.node, E.Source):
            return rel
        plan = rel.plan()
        self.check_tables(plan)
        name = self.executor.store(plan, rel.bindings, None, temporary=True)
        complete = not T.may_lack_blocks(plan.tra)
        bs, dtype, release = plan.block_shape(), rel.node.dtype, self.executor.drop
        return ingest.stored_relation(self, name, rel.shape, bs, dtype, release=release, complete=complete)

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
        shp = checked_shape(shape, "placeholder")
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
        """A lazy relation for ``numpy.einsum(*args)``, extended with ``join``/``agg`` (docs "Einsum and
        numpy compatibility"). ``dtype=``/``casting=`` as numpy's; a bool or float16 array operand (no tensor
        has those dtypes) takes numpy's promotion against the other operands.

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
        return lazy.einsum(self, args, optimize, dtype, join, agg, strategy, blocks, copy, casting, cache)

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
        check_flag(share, "compile", "share")
        return Compiled(self, outputs, inputs, share=share)


def _result_array(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """The array a result is written into; one this process cannot allocate is a typed error that says so."""
    try:
        return np.empty(shape, dtype=DTYPES[dtype])
    except (MemoryError, ValueError) as exc:
        nbytes = math.prod(shape) * DTYPES[dtype].itemsize
        raise OutOfMemoryError(
            f"cannot allocate the result: shape {shape} of {dtype} is {nbytes / 2**30:.3g} GiB ({exc})"
        ) from exc


__all__ = ["Compiled", "Session", "TensorSQLError", "as_array"]
