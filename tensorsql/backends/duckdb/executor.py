"""The embedded DuckDB executor: one in-process DuckDB with the kernel extension loaded.

It runs finished plans (``compile.plan.Plan``); it never plans. Per plan it keeps its own state in a weak
table: the generated statements, the prepared statement, and how each array operand reaches the query:
- a small one-block operand is *lent*: a reusable slot of the extension's C ABI points at the caller's array
  for one run, and the statement reads it with ``tensor_source(<slot key>)`` (no copy, no DDL, no Arrow);
- any other operand is split into an Arrow table (``backends.arrow.split``, zero-copy where the blocking
  allows) and registered as a view under a name fixed for the plan.
The result comes back through a result sink (the kernels write into the caller's array) or through Arrow.
From a statement's second run on it is PREPAREd and then EXECUTEd: binding and planning a statement of
several CTEs costs DuckDB milliseconds, as much as the kernels of a small einsum.

A statement that reads no table and has no FROM (one row: the kernel calls of a one-block plan over lent
operands) runs on the *lane*, a second, single-threaded in-memory DuckDB with the same extension. Such a
statement can use one thread only, and DuckDB hands a query's task to a worker thread when it has several:
on this project's 2-core VM that hand-off made up ~60-90 us of a ~250 us small call (``SELECT 1`` itself
costs 190-215 us with 2 threads against ~120 us with one). Slots and sinks are process-wide, so the lane
reads the same lent arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import os
import re
import sys
import time
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import duckdb
import numpy as np
import pyarrow as pa
from sqlglot import exp

import udf_kernels
from tensorsql.backends import arrow
from tensorsql.backends.base import CatalogEntry
from tensorsql.backends.duckdb import allocator, catalog, costs, ingest, longrun, memory, sqlgen, statements
from tensorsql.backends.duckdb import many as many_
from tensorsql.backends.duckdb import program as program_
from tensorsql.backends.duckdb.catalog import DuckDBCatalog
from tensorsql.backends.duckdb.errors import wrap, wrap_connect
from tensorsql.backends.duckdb.locking import ConnectionLock
from tensorsql.backends.duckdb.prepared import check_operand, deallocate
from tensorsql.backends.duckdb.staged import StagedRun
from tensorsql.compile import waves
from tensorsql.compile.plan import Plan
from tensorsql.dtypes import DTYPES
from tensorsql.errors import (
    ConfigError,
    CorruptTableError,
    ExtensionError,
    KernelError,
    OutOfMemoryError,
    PlanError,
    ShapeError,
    SQLExecutionError,
)
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from udf_kernels import control as udf_control
from udf_kernels import sink as udf_sink

log = logging.getLogger("tensorsql")

#: results up to this many bytes are fetched as rows rather than through an Arrow export
SMALL_RESULT_BYTES = 1 << 18
#: one-block array operands up to this many bytes are lent through a slot and inlined where they are read
#: (the kernels read the caller's array itself)
SLOT_BYTES = 1 << 20
#: other array operands up to this many bytes are lent through a slot too, read a block per row
#: (``sqlgen.slot_blocks``: a block that is a run of the array is read in place, others copied); bigger ones
#: are registered as Arrow views, which DuckDB reads in place. A view costs ~1-2 ms to register and
#: unregister per run and keeps the statement from being prepared (a prepared plan may hold the old view's
#: scan): a 1024 x 1024 float32 product of two lent operands took 1.6 ms where two views took 4 ms.
BLOCK_SLOT_BYTES = 16 << 20

#: memory DuckDB needs besides the blocks of a query (measured: a few MiB), and the least wave budget
_DUCKDB_RESERVE = 4 << 20
_MIN_WAVE_BYTES = 1 << 18

_ids = itertools.count()
#: an environment switch's values that turn it off
_OFF = ("0", "false", "no", "off")
#: without connect(memory_limit=), DuckDB's buffers get this share of DuckDB's default limit (80% of the
#: machine's memory, or of its container's) and the kernels' own memory this one: 60% and 30% of it
DEFAULT_DUCKDB_SHARE = 0.75
DEFAULT_KERNEL_SHARE = 0.375
_T = TypeVar("_T")


@dataclass(eq=False)
class _Statement:
    """The executor's state for one plan: operand bindings, generated text, prepared statement."""

    views: list[str | None]
    slots: list[udf_sink.Slot | None]
    #: per operand: a lent one-block operand of at most SLOT_BYTES, inlined where it is read (``Scalar``);
    #: other lent operands are read a block per row (``sqlgen.slot_blocks``)
    inline: list[bool]
    #: (flops, weighted flops) of the plan: whether it runs as a long query (``longrun``)
    work: tuple[float, float]
    #: what each operand's array must be: (shape, dtype)
    wants: list[tuple[tuple[int, ...], np.dtype]] = field(default_factory=list)
    long: bool = False
    sink_slot: udf_sink.Slot | None = None
    #: the result has one blob label per dimension (a result sink can hold it)
    sinkable: bool = True
    text: dict[str, str] = field(default_factory=dict)
    #: the array each operand's view or slot holds now (kept between runs of a relation: ``keep``)
    bound: list[np.ndarray | None] = field(default_factory=list)
    runs: int = 0
    #: the small-call path (``DuckDBExecutor.fast``), made once the statement is prepared
    fast: Callable[[Mapping[E.Operand, np.ndarray]], np.ndarray | None] | None = None
    prepared: str | None = None
    unpreparable: bool = False
    #: the sink statement runs on the executor's single-threaded lane (see the module docstring)
    lane: bool = False
    #: what a failed run executes to find a corrupted stored table (``sqlgen.diagnosis``), made on first use
    diagnosis: list[str] | None = None
    #: the plan holds more than the wave budget at once: it runs in waves (``staged``)
    staged: bool = False


class DuckDBKernels:
    """The extension loaded into one connection (a ``KernelSet``): its file and the functions it has."""

    def __init__(self, executor: DuckDBExecutor) -> None:
        self.path = executor.kernels
        self._executor = executor

    def functions(self) -> list[str]:
        q = (
            "SELECT DISTINCT function_name FROM duckdb_functions() "
            "WHERE function_name LIKE 'tensor%' ORDER BY function_name"
        )
        return [r[0] for r in self._executor.query(q, "kernel functions")]


class DuckDBExecutor:
    """An embedded DuckDB (``:memory:`` or a file) with the kernels loaded."""

    name = "duckdb"
    profile = costs.PROFILE
    #: the kernels' fused forms its statements may use (all of them: the CPU kernel set has every one)
    lowering = sqlgen.FUSED

    def __init__(
        self,
        database: str = ":memory:",
        *,
        threads: int | None = None,
        read_only: bool = False,
        progress: bool | None = None,
        memory_limit: int | str | None = None,
        temp_directory: str | os.PathLike[str] | None = None,
        max_block_bytes: int | str | None = None,
    ) -> None:
        if allocator.enabled_by_env():
            allocator.tune()
        config = {"allow_unsigned_extensions": "true"}
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ConfigError(f"threads={threads!r} must be a positive int")
            config["threads"] = str(threads)
        limit = memory.memory_limit(memory_limit)
        if limit is not None:
            config["memory_limit"] = f"{limit}B"
        spill = memory.temp_directory(temp_directory)
        if spill is not None:
            config["temp_directory"] = spill
        if max_block_bytes is not None:  # checked before anything is opened; the default needs the limit
            memory.max_block_bytes(max_block_bytes, limit or memory.MIN_MEMORY_LIMIT, 1)
        if not isinstance(read_only, bool):
            raise ConfigError(f"read_only={read_only!r} must be a bool")
        if progress is not None and not isinstance(progress, bool):
            raise ConfigError(f"progress={progress!r} must be a bool or None")
        if read_only and str(database) == ":memory:":
            raise ConfigError("read_only=True needs a database file, not ':memory:'")
        self.database = str(database)
        try:
            self.con = duckdb.connect(self.database, read_only=read_only, config=config)
        except duckdb.Error as exc:
            raise wrap_connect(exc, self.database) from exc
        try:
            # ZSTD stores a row group's blobs so that a scan decompresses them into one buffer (a 1.6 GB
            # table of 3 MB blocks needs a 2 GiB allocation, refused under a 2 GB memory_limit); uncompressed,
            # a scan reads the blocks it needs one by one. Tensor blocks barely compress anyway. (A SET:
            # DuckDB ignores this option in the connect config.)
            self.con.execute("SET disabled_compression_methods = 'zstd'").fetchall()
            self.kernels = udf_kernels.load(self.con)
        except (udf_kernels.KernelBuildError, udf_kernels.KernelLoadError, duckdb.Error, OSError) as exc:
            self.con.close()
            raise ExtensionError(f"cannot load the tensorsql kernel extension: {exc}") from exc
        self.read_only = read_only
        #: a progress bar for long queries (None: TENSORSQL_PROGRESS, else whether stderr is a terminal)
        self.progress = progress
        self._token: int | None = None
        #: clean-ups asked for while a result streams or another thread holds the lock run as it is let go
        self._lock = ConnectionLock(lambda: not self._streaming)
        self.catalog = DuckDBCatalog(self.con, self._lock)
        self.kernel_set = DuckDBKernels(self)
        self._statements: weakref.WeakKeyDictionary[Plan, _Statement] = weakref.WeakKeyDictionary()
        #: uploaded views, checked whole when uploaded (immutable Arrow tables: reads skip the checks)
        self._views: set[str] = set()
        #: while a result is streamed from the connection (``read_batches``), the clean-ups finalizers ask
        #: for (garbage collected in the consumer, same thread) wait: the connection takes no other query then
        self._streaming = 0
        #: the connections ``cursor()`` handed out (closed with this one)
        self._cursors: weakref.WeakSet[duckdb.DuckDBPyConnection] = weakref.WeakSet()
        #: inside a transaction the user began (``transaction_ended``): clean-ups wait for its end
        self.user_transaction = False
        self._after_txn: list[tuple[Callable[[str], None], str]] = []
        #: the stage tables of a run in waves (``staged``), ours: reads skip the checks
        self._stages: set[str] = set()
        #: sinks and slots: None until checked once against this connection
        self._sinks: bool | None = None
        self._slots: bool | None = None
        self._workers = threads or int(self.query("SELECT current_setting('threads')")[0][0])
        #: the single-threaded DuckDB for one-row statements: made on first use; False when it cannot be made
        self._lane: duckdb.DuckDBPyConnection | bool | None = None
        #: one-block plans over lent operands run as one ``tensor_program_into`` call (``program``); False:
        #: as SQL, one CTE per step (``TENSORSQL_PROGRAMS=0`` for new sessions)
        self.programs = os.environ.get("TENSORSQL_PROGRAMS", "1").strip().lower() not in _OFF
        self.closed = False
        try:
            #: bytes DuckDB's buffers may use, and so may the kernels' own memory (docs "Memory and limits");
            #: without a limit, shares of DuckDB's default (80% of the memory it sees) that leave 10% over
            #: together (each at 80%, a runaway query could grow to the machine's memory and be killed)
            self.kernel_limit = limit
            if limit is None:
                current, default = self._duckdb_limit(), memory.duckdb_default_limit()
                if current == default:  # a database of its own, or the first session on it: our shares
                    self.memory_limit = int(default * DEFAULT_DUCKDB_SHARE)
                    size = sqlgen.lit(f"{self.memory_limit}B")
                    item = exp.SetItem(this=exp.EQ(this=exp.column("memory_limit"), expression=size))
                    self.con.execute(sqlgen.sql_text(exp.Set(expressions=[item]))).fetchall()
                else:  # a file another session of this process opened (one database): its limit, not a
                    # share of it again (each session shrank the shared limit by a quarter)
                    self.memory_limit = current
                self.kernel_limit = int(self.memory_limit * DEFAULT_KERNEL_SHARE / DEFAULT_DUCKDB_SHARE)
            else:
                self.memory_limit = limit
            self._set_kernel_limit(self.con)
            #: no block a plan makes is larger (``EngineProfile.max_block_bytes``)
            self.max_block_bytes = memory.max_block_bytes(max_block_bytes, self.memory_limit, self._workers)
        except BaseException:
            self.close()
            raise
        self.profile = dataclasses.replace(costs.PROFILE, max_block_bytes=self.max_block_bytes)

    # -- memory ----------------------------------------------------------------------------------------------
    def _duckdb_limit(self) -> int:
        """DuckDB's own memory_limit (its default: 80% of the machine's memory), in bytes."""
        shown = str(self.query("SELECT current_setting('memory_limit')", "memory_limit")[0][0])
        try:
            return memory.parse_size(shown, "memory_limit")
        except ConfigError:  # not a size DuckDB should print: the machine's memory bounds it anyway
            return memory.system_memory()

    def _set_kernel_limit(self, con: duckdb.DuckDBPyConnection) -> None:
        """Gives the kernels loaded into ``con``'s database the session's memory_limit as their budget."""
        token = udf_control.db_token(con)
        if not udf_control.set_memory_limit(self.kernels, token, self.kernel_limit):
            raise ExtensionError("the loaded kernels do not know their own database (no memory budget)")

    def kernel_memory(self) -> tuple[int, int]:
        """(used, limit): the bytes the kernels of the session's database hold now, and their limit."""
        with self._lock:
            got = udf_control.memory(self.kernels, udf_control.db_token(self.con))
        if got is None:
            raise ExtensionError("the loaded kernels do not know their own database (no memory budget)")
        return got

    # -- plain statements ------------------------------------------------------------------------------
    @property
    def workers(self) -> int:
        return self._workers

    @property
    def threads(self) -> int:
        """DuckDB's threads, the kernels' thread budget (``workers`` is the planner's p; a GPU executor plans
        for one kernel call at a time on as many threads)."""
        return self._workers

    def query(self, statement: exp.Expression | str, what: str = "query") -> list[tuple]:
        """Run a statement and fetch all its rows (DuckDB 2 blocks a connection with an open result)."""
        return self.describe(statement, what)[0]

    def describe(self, statement: exp.Expression | str, what: str) -> tuple[list[tuple], list[tuple]]:
        text = statement if isinstance(statement, str) else sqlgen.sql_text(statement)
        with self._lock:
            try:
                cur = self.con.execute(text)
                return cur.fetchall(), list(cur.description or [])
            except duckdb.Error as exc:
                raise wrap(exc, what) from exc

    def has_temporary(self, name: str) -> bool:
        """Whether a temporary table or view ``name`` is on the connection (it would hide a tensor table)."""
        with self._lock:
            return catalog.temporary_exists(self.con, name)

    def names_here(self) -> set[str]:
        """The folded names of the tables and views of the current schema (``catalog.names_here``)."""
        with self._lock:
            return catalog.names_here(self.con)

    def has_table(self, name: str) -> bool:
        """Whether a table or view ``name`` is here (the current schema, any case of its ASCII letters). A
        lookup, not a read on the chance: inside the user's transaction a failed read aborts it."""
        with self._lock:
            return catalog.table_exists(self.con, name)

    def snapshot(self, query: exp.Query, what: str) -> Snapshot:
        """The rows of ``query`` as they are now, in a temporary table: a query read more than once (its
        columns, its count, its cells, the keys beside them) must give the same rows each time, and one with
        ``USING SAMPLE``, ``random()`` or a table written in between would not."""
        return Snapshot(self, self._temp_table(query, lambda exc: wrap(exc, what)))

    def _temp_table(self, query: exp.Query, error: Callable[[duckdb.Error], BaseException]) -> str:
        """CREATE TEMPORARY TABLE of ``query``'s rows under a fresh name (returned); ``error`` types a
        failure."""
        name = f"_ts_tmp_{next(_ids)}"
        create = exp.Create(
            this=exp.Table(this=sqlgen.ident(name)),
            kind="TABLE",
            expression=query,
            properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
        )
        with self._lock:
            try:
                self.con.execute(sqlgen.sql_text(create)).fetchall()
            except duckdb.Error as exc:
                raise error(exc) from exc
        return name

    def close(self) -> None:
        """Closes the connection (and the lane, and the cursors handed out), after any tensorsql call that
        holds the lock on another thread. DuckDB refuses to close a connection whose cursor runs a query, or
        that another thread reads a result from outside tensorsql's calls (an ``s.sql`` relation): those are
        interrupted, and a close still refused after a few tries is a typed error, the session still open
        (closed, it had kept the database file locked with no way to close it again)."""
        with self._lock:
            if self.closed:
                return
            try:
                for cur in list(self._cursors):
                    _close_interrupting(cur)
                _close_interrupting(self.con)
            except duckdb.Error as exc:
                raise wrap(exc, "close") from exc
            self.closed = True
            if isinstance(self._lane, duckdb.DuckDBPyConnection):
                with contextlib.suppress(duckdb.Error):
                    self._lane.close()

    def _lane_con(self) -> duckdb.DuckDBPyConnection | None:
        """The lane (made on first use); None when it cannot be made (the statement then runs here).

        DuckDB runs the lane's statements on one thread, but its kernels get the session's thread budget: the
        extension sizes its budget from ``threads`` when it is loaded, so the lane is opened with the
        session's threads, loaded, then set to one thread. A one-row statement is one big kernel call as
        often as a small one (a 1000^2 float64 GEMM: 26 ms on one thread, 13 ms on two)."""
        if self._lane is None:
            try:
                config = {
                    "allow_unsigned_extensions": "true",
                    "threads": str(self.threads),
                    "memory_limit": f"{self.memory_limit}B",
                }
                lane = duckdb.connect(":memory:", config=config)
            except duckdb.Error as exc:
                log.warning("tensorsql: no single-threaded lane for small calls: %s", exc)
                self._lane = False
                return None
            try:
                udf_kernels.load(lane)
                lane.execute("SET threads = 1")
                self._set_kernel_limit(lane)
            except (udf_kernels.KernelLoadError, ExtensionError, duckdb.Error, OSError) as exc:
                log.warning("tensorsql: no single-threaded lane for small calls: %s", exc)
                lane.close()
                self._lane = False
                return None
            self._lane = lane
        return self._lane or None

    def _con(self, st: _Statement) -> duckdb.DuckDBPyConnection:
        """The connection the statement's sink text runs on: the lane for a one-row statement."""
        if st.lane:
            lane = self._lane_con()
            if lane is not None:
                return lane
            st.lane = False
        return self.con

    # -- relations the engine holds ----------------------------------------------------------------------
    def upload(
        self, table: pa.Table, layout: tuple[tuple[int, ...], tuple[int, ...], str], *, verified: bool = False
    ) -> str:
        """Registers a blocked Arrow table of ``layout`` (shape, block shape, dtype) as a view (DuckDB reads
        it in place); returns its name.

        The table is checked whole here unless ``verified`` (``arrow.split`` made it): CorruptTableError for a
        key column that is not integer, a NULL, out-of-grid or repeated key, a blob of the wrong length. An
        Arrow table cannot change, so the queries that read the view skip the checks every stored table gets
        (``sqlgen.checked``, ``guard``).
        """
        if not verified:
            arrow.check_blocks(table, *layout)
        name = f"_ts_tmp_{next(_ids)}"
        with self._lock:
            try:
                self.con.register(name, table)
            except duckdb.Error as exc:  # an aborted transaction of the user's, a closed connection
                raise wrap(exc, "upload") from exc
            self._views.add(name)
        return name

    def register_rows(self, table: pa.Table) -> Registered:
        """An Arrow table of rows registered as a view under a fresh name (DuckDB reads it in place), until
        the returned handle goes (a statement's computed rows: SQL ``predict``)."""
        name = f"_ts_rows_{next(_ids)}"
        with self._lock:
            try:
                self.con.register(name, table)
            except duckdb.Error as exc:
                raise wrap(exc, "register rows") from exc
        return Registered(self, name)

    def release(self, name: str) -> None:
        """Unregisters an uploaded view (finalizers call this, on any thread: ``locking``)."""
        self._lock.run_or_queue(self._release_held, name)

    def keeps(self, plan: Plan) -> bool:
        """Whether a run of ``plan`` with ``keep`` leaves arrays bound after it: operands uploaded as views
        (lent slots are released after every run)."""
        with self._lock:
            return any(v is not None for v in self._statement(plan).views)

    def let_go(self, plan: Plan, arrays: tuple[int, ...]) -> None:
        """A relation that kept its arrays bound to ``plan`` between runs (``keep``) is gone, while the plan
        lives on in a cache: its arrays (``id``s), where still bound, are unbound (views unregistered, slots
        emptied), so the cache holds no user array. A finalizer calls this, on any thread (``locking``)."""
        ref = weakref.ref(plan)
        key = f"let_go {id(plan)}"

        def unbind(_: str) -> None:
            live = ref()
            st = self._statements.get(live) if live is not None else None
            if st is None or self.closed or self._after_transaction(unbind, key):
                return
            if any(b is not None and id(b) in arrays for b in st.bound):
                self._unbind(st)

        self._lock.run_or_queue(unbind, key)

    def _release_held(self, name: str) -> None:
        if self._after_transaction(self._release_held, name):
            return
        self._views.discard(name)
        if not self.closed:  # a closed connection has nothing to release
            _unregister_logged(self.con, name)

    def _after_transaction(self, clean: Callable[[str], None], name: str) -> bool:
        """Inside a transaction the user began, a clean-up waits for its end (True): a view unregistered or a
        temporary table dropped there came back with a ROLLBACK, and nothing would drop it again."""
        if not self.user_transaction:
            return False
        self._after_txn.append((clean, name))
        return True

    def user_statement(self, statement: str | exp.Expression, run: Callable[[], _T]) -> _T:
        """``run()``, a user's statement; when it may begin or end a transaction, then looks which, holding
        the lock throughout: a clean-up run between (at the lock's release) would be inside a transaction
        just begun, and a ROLLBACK would take it back."""
        with self._lock:
            try:
                return run()
            finally:
                text = statement if isinstance(statement, str) else ""
                if isinstance(statement, exp.Transaction | exp.Commit | exp.Rollback | exp.Command):
                    text = statement.sql(dialect="duckdb")
                if _TRANSACTION_WORDS.search(text):
                    self.transaction_ended()

    def transaction_ended(self) -> None:
        """Looks whether the user's transaction is open (the session calls this after a statement that may
        begin or end one), and once it is not, runs the clean-ups that waited for its end."""
        with self._lock:
            if self.closed:
                return
            self.user_transaction = catalog.in_transaction(self.con)
            if not self.user_transaction:
                waiting, self._after_txn = self._after_txn, []
                for clean, name in waiting:
                    clean(name)

    def drop(self, name: str) -> None:
        """Drops a temporary table (finalizers call this, on any thread: ``locking``)."""
        self._lock.run_or_queue(self._drop_held, name)

    def _drop_held(self, name: str) -> None:
        """``drop`` for a caller that holds the lock, or runs for one that does and waits for it (a long
        run's worker thread: taking the lock there would wait forever)."""
        if self.closed or self._after_transaction(self._drop_held, name):
            return
        drop = exp.Drop(tables=[exp.Table(this=sqlgen.ident(name))], kind="TABLE", exists=True)
        try:
            self.con.execute(sqlgen.sql_text(drop)).fetchall()
        except duckdb.Error as exc:
            log.warning("tensorsql: could not drop temporary table %s: %s", name, exc)

    def store(
        self,
        plan: Plan,
        bindings: Mapping[E.Operand, np.ndarray],
        name: str | None,
        *,
        replace: bool = False,
        temporary: bool = False,
    ) -> str:
        """CREATE TABLE ``name`` AS the plan's result (a fresh temporary name when None), returning the name;
        a permanent table gets its catalog entry in the same transaction."""
        if name is None:
            if not temporary:
                raise ConfigError("a permanent table needs a name")
            name = f"_ts_tmp_{next(_ids)}"
        st = self._statement(plan)
        with self._lock:
            what = "materialize" if temporary else f"save {name!r}"
            try:
                self._bind(st, plan, bindings)
                props = exp.Properties(expressions=[exp.TemporaryProperty()]) if temporary else None

                def create(query: exp.Query) -> exp.Create:
                    table = exp.Table(this=sqlgen.ident(name))
                    return exp.Create(
                        this=table, kind="TABLE", expression=query, replace=replace, properties=props
                    )

                def fill() -> None:
                    if not st.staged:
                        ast = sqlgen.to_ast(
                            plan.tra,
                            bind=self._binder(st, plan),
                            checks=self._must_check,
                            lowering=self.lowering,
                            in_place=self._in_place,
                        )
                        # straight on the connection: the caller holds the lock, and a long run calls this
                        # on longrun's worker thread, where taking it (self.query) waited forever
                        try:
                            self.con.execute(sqlgen.sql_text(create(ast))).fetchall()
                        except duckdb.Error as exc:
                            raise wrap(exc, what) from exc
                        return
                    with self._staged(st, plan) as run:
                        try:
                            run.create(plan.tra, create, name)
                        except duckdb.Error as exc:
                            raise wrap(exc, what) from exc

                if temporary:
                    self._run(st, fill)
                    return name
                entry = CatalogEntry(name, plan.root.dtype, plan.root.shape, plan.block_shape())
                self.with_entry(entry, lambda: self._run(st, fill))
                return name
            except (KernelError, SQLExecutionError) as err:  # rolled back: a stored table to blame?
                corrupt = self._blame(err, self._diagnosis(st, plan), what)
                if corrupt is None:
                    raise
                raise corrupt from err
            finally:
                self._unbind(st)

    def with_entry(self, entry: CatalogEntry, fill: Callable[[], object]) -> None:
        """``fill()`` (which makes table ``entry.name``) and its catalog entry, in one transaction: both or
        neither."""
        with self._lock, self.transaction(f"save {entry.name!r}"):
            fill()
            self.catalog.put(entry)

    @contextlib.contextmanager
    def transaction(self, what: str) -> Iterator[None]:
        """The block in one transaction (``catalog.transaction``: part of the user's where one is open)."""
        with self._lock, catalog.transaction(self.con, what):
            yield

    def ingest_rows(
        self, query: str, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str
    ) -> str:
        """Rows (i0, ..., i{r-1}, value) of a user query -> a dense blocked temporary table (its name).

        The query runs once, inside the one statement that builds the table and checks every row as it
        passes (``ingest``); before it, DuckDB only binds it (LIMIT 0) for its columns' types."""
        parsed = ingest.parse_rows(query)
        _, described = self.describe(exp.select(exp.Star()).from_(parsed.subquery("q")).limit(0), "from_sql")
        columns = [(str(d[0]), str(d[1])) for d in described]
        ingest.check_columns(columns, len(shape))
        self._check_room(shape, dtype)
        dense = ingest.blocks_from_rows(parsed, shape, block_shape, dtype, [t for _, t in columns])
        return self._temp_table(dense, lambda exc: ingest.row_error(exc) or wrap(exc, "from_sql"))

    def _check_room(self, shape: tuple[int, ...], dtype: str) -> None:
        """A dense table of ``shape`` can be held: in memory and on the disk that DuckDB writes to together.
        Its grid is known before any row is read; three cells of a 2**32 x 2**32 tensor wrote temporary
        files until the disk was full (~90 s) before failing."""
        import shutil

        need = math.prod(shape) * DTYPES[dtype].itemsize
        if need <= self.memory_limit:
            return
        where = os.path.dirname(os.path.abspath(self.database)) if self.database != ":memory:" else None
        if where is None:
            try:
                setting = self.con.execute("SELECT current_setting('temp_directory')").fetchall()[0][0]
                where = str(setting or "")
            except duckdb.Error:
                where = ""
            where = where or os.getcwd()
        while where and not os.path.isdir(where):  # a temporary directory DuckDB makes when it spills
            where = os.path.dirname(os.path.abspath(where))
        try:
            free = shutil.disk_usage(where or os.getcwd()).free
        except OSError:
            return  # no say: DuckDB's own limits decide
        if need > self.memory_limit + free:
            raise OutOfMemoryError(
                f"from_sql: a dense tensor of shape {list(shape)} {dtype} takes {need} bytes, more than this "
                f"session's memory limit ({self.memory_limit} bytes) and the free disk where DuckDB writes "
                f"({free} bytes) together"
            )

    # -- running plans -------------------------------------------------------------------------------------
    def plan_query(self, plan: Plan, dense: bool = False) -> exp.Query | None:
        """The plan as one query over stored tables, to inline into a user's statement (``Session.sql``);
        None when it reads arrays or must run in waves (the caller materializes it first). ``dense``: every
        block of the grid, a zero block for one a stored table leaves out (its cells are zeros too)."""
        st = self._statement(plan)
        if st.staged or plan.operands:
            return None
        return sqlgen.to_ast(
            T.Densify(plan.tra.schema, plan.tra) if dense else plan.tra,
            bind=self._binder(st, plan),
            checks=self._must_check,
            lowering=self.lowering,
            in_place=self._in_place,
        )

    def relation(
        self, statement: exp.Expression | str | pa.Table, what: str = "sql"
    ) -> duckdb.DuckDBPyRelation:
        """DuckDB's relation for a user's statement (``Session.sql``: a sqlglot tree, or the user's own text
        when it has nothing to rewrite), or for an Arrow table of rows; a DuckDB error typed."""
        with self._lock:
            try:
                if isinstance(statement, pa.Table):
                    return self.con.from_arrow(statement)
                text = statement if isinstance(statement, str) else sqlgen.sql_text(statement)
                return self.con.sql(text)
            except duckdb.Error as exc:
                raise wrap(exc, what) from exc

    def with_arrow(
        self,
        views: Mapping[str, pa.Table],
        build: Callable[[], exp.Query],
        cursor: duckdb.DuckDBPyConnection | None = None,
    ) -> pa.Table:
        """The rows of ``build()``'s query, with Arrow tables registered under ``views`` while it runs; on
        ``cursor`` (from ``cursor()``) when given, outside the session's lock, so it can run beside other
        statements (``fit`` sorts the next epoch's order while this one's steps run)."""
        if cursor is not None:
            return _with_arrow(cursor, views, build)
        with self._lock:
            return _with_arrow(self.con, views, build)

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of its own to the session's database, for ``with_arrow`` beside other statements
        (its own registered views; DuckDB runs connections of one database at once). The caller closes it."""
        with self._lock:
            try:
                cur = self.con.cursor()
            except duckdb.Error as exc:
                raise wrap(exc, "to_rows") from exc
            self._cursors.add(cur)
            return cur

    def unregister_view(self, name: str) -> None:
        """Unregisters a view registered for one statement, a failure logged (``_unregister_logged``)."""
        _unregister_logged(self.con, name)

    def read_batches(
        self, build: Callable[[], exp.Query], consume: Callable[[pa.RecordBatch], None], rows: int = 1 << 16
    ) -> None:
        """Streams the rows of ``build()``'s query to ``consume``, ``rows`` at a time, so the caller can keep
        what it needs of each batch without the whole result held as Arrow at once."""
        with self._lock:
            reader = None
            self._streaming += 1
            try:
                reader = self.con.sql(sqlgen.sql_text(build())).to_arrow_reader(rows)
                for batch in reader:
                    consume(batch)
            except duckdb.Error as exc:
                raise wrap(exc, "to_rows") from exc
            finally:  # a consumer that raises leaves the result open: the connection would refuse the next
                try:
                    if reader is not None:
                        reader.close()
                finally:
                    self._streaming -= 1  # what the consumer's collections queued runs as the lock goes

    def text(self, plan: Plan, pretty: bool = True) -> str:
        """The SQL text of the plan (array operands as the views or slots this executor binds them to)."""
        st = self._statement(plan)
        key = "pretty" if pretty else "flat"
        if key not in st.text:
            st.text[key] = sqlgen.sql_text(
                sqlgen.to_ast(
                    plan.tra,
                    bind=self._binder(st, plan),
                    checks=self._must_check,
                    lowering=self.lowering,
                    in_place=self._in_place,
                ),
                pretty=pretty,
            )
        return st.text[key]

    def run_arrow(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], *, keep: bool = False
    ) -> pa.Table:
        """The plan's result as an Arrow table of (k0.., tensor) rows.

        A small result (up to SMALL_RESULT_BYTES) is fetched as rows: DuckDB's relation API binds a query once
        more before its Arrow export (~1 ms of a few-ms query), which only pays off for big blobs.
        """
        st = self._statement(plan)
        text = self.text(plan, pretty=False)
        small = math.prod(plan.root.shape) * DTYPES[plan.root.dtype].itemsize <= SMALL_RESULT_BYTES
        with self._lock:
            try:
                self._bind(st, plan, bindings)
                if st.staged:
                    with self._staged(st, plan) as run:
                        return self._run(st, lambda: run.arrow(plan.tra, _arrow_batch_rows(plan)))
                if not small:
                    rows = _arrow_batch_rows(plan)
                    return self._run(st, lambda: self.con.sql(text).to_arrow_table(batch_size=rows))
                rows, names = self._run(st, lambda: _fetch_rows(self.con, text))
            except duckdb.Error as exc:
                raise self._failed(exc, "einsum", self._diagnosis(st, plan)) from exc
            finally:
                self._unbind(st, keep)
        cols = {
            name: pa.array([r[j] for r in rows], pa.binary() if name == "tensor" else pa.int32())
            for j, name in enumerate(names)
        }
        return pa.table(cols)

    def fast(self, plan: Plan) -> Callable[[Mapping[E.Operand, np.ndarray]], np.ndarray | None] | None:
        """The shortest run of a plan that has become a small call: every operand lent through a slot, the
        result through the sink slot, the statement prepared (it reads no table, so it stays valid). The
        returned function binds, executes and releases with nothing else in between, and returns the result
        (None when not every element was written: the caller then takes the general path). None when the plan
        is not such a call (yet)."""
        st = self._statements.get(plan)
        if st is None or st.prepared is None or st.long or not st.sinkable or st.sink_slot is None:
            return None
        if any(v is not None for v in st.views) or any(x is not None for x in st.bound):
            return None
        if st.fast is None:
            st.fast = _fast_call(self, plan, st)
        return st.fast

    def many(self, stages: Sequence[tuple[str, Plan]], outputs: Sequence[Plan]) -> many_.ManyRun | None:
        """Several plans of one graph run as one statement (``backends.duckdb.many``): each stage's result is
        the relation later plans read by the stage's table name; each output comes back as an array."""
        with self._lock:
            return many_.make(self, stages, outputs, BLOCK_SLOT_BYTES, SLOT_BYTES)

    def run_into(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], out: np.ndarray, *, keep: bool = False
    ) -> bool:
        """Runs the plan with its result written by the kernels straight into ``out`` (a result sink): no
        DuckDB blob, Arrow buffer or assembly copy. False when sinks are unavailable, the kernels refuse the
        array, or not every element was written (absent blocks of a sparse stored input): the caller then goes
        through ``run_arrow``, which fills those with zeros."""
        if out.size == 0:
            return False
        with self._lock:
            if not self._sinks_available():
                return False
            st = self._statement(plan)
            sink = st.sink_slot
            if not st.sinkable or sink is None:
                return False
            try:
                self._bind(st, plan, bindings)
                try:
                    sink.set(out, writable=True)
                except ValueError:  # an array the kernels cannot hold: the caller goes through Arrow
                    return False
                if st.staged:
                    with self._staged(st, plan) as run:
                        _blocks, elements = self._run(st, lambda: run.sink(plan.tra, sink.key))
                else:
                    _blocks, elements = self._run(st, lambda: self._run_sink(st, plan))
            except duckdb.Error as exc:
                raise self._failed(exc, "einsum", self._diagnosis(st, plan)) from exc
            finally:
                sink.clear()
                self._unbind(st, keep)
        return elements == out.size

    def _run(self, st: _Statement, fn: Callable[[], _T]) -> _T:
        """Runs ``fn`` (a query of the statement's plan) here when the plan is short; else on a worker thread
        (``longrun.run_long``), so Ctrl-C stops it promptly (DuckDB's interrupt and the kernels' cancellation
        flag) and a progress bar follows the kernels' finished flops. Called with the lock held."""
        if not st.long:
            return longrun.run_direct(fn)
        flops = st.work[0]
        if self._token is None:
            self._token = udf_control.db_token(self.con)
        return longrun.run_long(
            self.con,
            self._token,
            self.kernels,
            fn,
            total_work=flops,
            progress=longrun.progress_enabled(self.progress),
        )

    def _run_sink(self, st: _Statement, plan: Plan) -> tuple[int, int]:
        """Runs the plan's sink statement: as text on its first run, prepared from its second on. A view
        operand registered anew drops the prepared statement for good (``_bind``: a prepared plan may still
        scan the old table); one that no longer binds (a table it reads was replaced) is dropped, and the text
        runs."""
        text = self._sink_text(st, plan)
        con = self._con(st)
        st.runs += 1
        if st.prepared is None:
            if st.runs < 2 or st.unpreparable:
                return con.execute(text).fetchall()[0]
            name = f"_ts_stmt_{next(_ids)}"
            try:
                con.execute(statements.prepare(name, _parsed(text))).fetchall()
            except duckdb.Error:
                st.unpreparable = True
                return con.execute(text).fetchall()[0]
            st.prepared = name
            st.text["execute"] = statements.execute(name)
            weakref.finalize(plan, deallocate, weakref.ref(self), name, st.lane)
        try:
            return con.execute(st.text["execute"]).fetchall()[0]
        except (duckdb.InvalidInputException, duckdb.InterruptException):
            raise  # the data's fault (a kernel's or a stored table's check) or Ctrl-C: not the statement's
        except duckdb.Error:
            self._forget_prepared(st)
            return con.execute(text).fetchall()[0]

    def sink_text(self, plan: Plan) -> str:
        """The statement that writes the plan's result into a result sink (generated once per plan)."""
        return self._sink_text(self._statement(plan), plan)

    def _sink_text(self, st: _Statement, plan: Plan) -> str:
        if "sink" not in st.text:
            if st.sink_slot is None:
                raise ExtensionError("the loaded kernels do not see result sinks")
            program = self._program(st, plan)
            if program is not None:  # one kernel call for the whole graph, on the lane
                st.text["sink"] = program
                st.lane = not st.long
                return program
            ast = sqlgen.to_sink_ast(
                plan.tra,
                key=st.sink_slot.key,
                bind=self._binder(st, plan),
                checks=self._must_check,
                in_place=self._in_place,
            )
            st.text["sink"] = sqlgen.sql_text(ast)
            st.lane = not st.long and ast.find(exp.From, exp.Table) is None
        return st.text["sink"]

    def _program(self, st: _Statement, plan: Plan) -> str | None:
        """The statement of a one-block plan over lent operands as one ``tensor_program_into`` call
        (``program``), or None: a plan with more than one block somewhere, a stored table or a view operand,
        or a node the program has no op for, runs as SQL."""
        if not self.programs or st.staged or not T.one_row(plan.tra):
            return None
        if any(s is None for s in st.slots) or st.sink_slot is None:
            return None
        text = program_.build([plan.root], plan.operands)
        if text is None:
            return None
        slots = [s.key for s in st.slots]  # type: ignore[union-attr]
        return sqlgen.sql_text(program_.statement(text, [st.sink_slot.key], slots))

    def _must_check(self, scan: T.Scan) -> bool:
        """Whether a statement checks a stored table it reads: any but a view checked when uploaded and the
        stage tables of a run in waves."""
        return scan.table not in self._views and scan.table not in self._stages

    def _in_place(self, scan: T.Scan) -> bool:
        """Whether a stored table is an Arrow table registered with DuckDB (``upload``), read in place."""
        return scan.table in self._views

    @property
    def wave_budget(self) -> int:
        """Bytes of blocks one query may read and make before its plan runs in waves (``compile.waves``): a
        quarter of what the memory limit leaves after DuckDB's own few MiB. DuckDB copies the blobs of a
        chunk (or a hash table's build side) into an arena that grows in powers of two, so S bytes of blocks
        can take 2S; measured: 18.9 MB read as one chunk failed under 32 MiB, asking for a 16 MiB piece."""
        return max(_MIN_WAVE_BYTES, (self.memory_limit - _DUCKDB_RESERVE) // 4)

    def notes(self, plan: Plan) -> list[str]:
        """How the plan runs, beyond its SQL: in waves when it holds more than the wave budget."""
        if not self._statement(plan).staged:
            return []
        held = waves.footprint(plan.tra)
        return [
            f"runs in waves: its blocks come to ~{held:,} bytes at once, over the wave budget of "
            f"{self.wave_budget:,} bytes (a quarter of memory_limit); each aggregation is stored by queries "
            "over ranges of its keys, then the result is made in ranges of its keys "
            "(docs 'Memory and limits')"
        ]

    def _staged(self, st: _Statement, plan: Plan) -> StagedRun:
        bind = self._binder(st, plan)
        return StagedRun(
            self.con,
            bind,
            self._must_check,
            self.wave_budget,
            self._stages,
            self._drop_held,  # every run in stages holds the lock, and a long one drops on its worker thread
            self.lowering,
            self._in_place,
        )

    def _diagnosis(self, st: _Statement, plan: Plan) -> list[str]:
        """The texts of ``sqlgen.diagnosis`` for the plan (made once)."""
        if st.diagnosis is None:
            st.diagnosis = [sqlgen.sql_text(q) for q in sqlgen.diagnosis(plan.tra, self._must_check)]
        return st.diagnosis

    def _failed(self, exc: duckdb.Error, what: str, diagnosis: list[str]) -> BaseException:
        """The error a failed run raises: CorruptTableError when a stored table it reads is to blame (a kernel
        that rejected a blob, say), else DuckDB's error as mapped (``errors.wrap``)."""
        err = wrap(exc, what)
        return self._blame(err, diagnosis, what) or err

    def _blame(self, err: BaseException, diagnosis: list[str], what: str) -> CorruptTableError | None:
        """After a run failed with ``err``: the CorruptTableError naming the table and key when the
        diagnosis finds a stored table corrupted (more queries, on failures only), else None."""
        if isinstance(err, CorruptTableError) or not isinstance(err, KernelError | SQLExecutionError):
            return None
        with self._lock:
            for text in diagnosis:
                try:
                    self.con.execute(text).fetchall()
                except duckdb.Error as exc:
                    found = wrap(exc, what)
                    return found if isinstance(found, CorruptTableError) else None
        return None

    # -- operand bindings ----------------------------------------------------------------------------------
    def _sinks_available(self) -> bool:
        """Whether the kernels see sinks and slots registered through the C ABI (checked once)."""
        with self._lock:
            if self._sinks is None:
                self._sinks = udf_sink.available(self.kernels, self.con)
            return self._sinks

    def _statement(self, plan: Plan) -> _Statement:
        st = self._statements.get(plan)
        if st is not None:
            return st
        try:
            return self._new_statement(plan)
        except RecursionError as exc:  # past the session's raised limit (``session.RECURSION_LIMIT``)
            raise PlanError(
                "the plan is too deep to lower to SQL (nested past Python's recursion limit of "
                f"{sys.getrecursionlimit()}): materialize() an intermediate relation and build on it"
            ) from exc

    def _new_statement(self, plan: Plan) -> _Statement:
        views: list[str | None] = []
        slots: list[udf_sink.Slot | None] = []
        inline: list[bool] = []
        lend = self._sinks_available()
        uid = next(_ids)
        # in a plan of one block per step every operand is read once: every operand is lent and inlined,
        # whatever its size (the kernels read the caller's array; a view's scan, or a join of the row, would
        # copy it). Elsewhere an inlined operand is read for every row of the other side: up to SLOT_BYTES
        one_row = T.one_row(plan.tra)
        for k, op in enumerate(plan.operands):
            nbytes = math.prod(op.shape) * DTYPES[op.dtype].itemsize
            one_block = all(b >= n for b, n in zip(plan.block_shape(op), op.shape, strict=True))
            inline.append(one_block and (one_row or nbytes <= SLOT_BYTES))
            small = nbytes <= BLOCK_SLOT_BYTES or (one_row and one_block)
            if lend and small and all(op.shape):  # 0-d too; no empty array (0 bytes)
                views.append(None)
                slots.append(udf_sink.Slot(self.kernels))
            else:
                views.append(f"_ts_arg_{uid}_{k}")
                slots.append(None)
        sink_slot = udf_sink.Slot(self.kernels) if lend else None
        blob = plan.tra.schema.blob
        st = _Statement(
            views=views,
            slots=slots,
            inline=inline,
            work=longrun.plan_work(plan.root),
            sink_slot=sink_slot,
            sinkable=len(set(blob)) == len(blob),
        )
        st.bound = [None] * len(views)
        st.wants = [(op.shape, DTYPES[op.dtype]) for op in plan.operands]
        st.long = longrun.is_long(st.work[1], self._workers)
        st.staged = waves.footprint(plan.tra) > self.wave_budget
        self._statements[plan] = st
        names = [v for v in views if v is not None]
        if names:  # views kept registered between a relation's runs go with its plan
            weakref.finalize(plan, _unregister, weakref.ref(self), names)
        return st

    def _binder(self, st: _Statement, plan: Plan) -> sqlgen.Bind:
        """Renders operand k: its view's name, or the lent block ``tensor_source(<slot key>)`` inlined."""

        def bind(rel: T.Input) -> str | exp.Select | sqlgen.Scalar:
            view = st.views[rel.index]
            if view is not None:
                return view
            slot = st.slots[rel.index]
            assert slot is not None
            if st.inline[rel.index]:
                key = exp.Cast(this=sqlgen.lit(slot.key), to=sqlgen.sql_type("BIGINT"))
                return sqlgen.Scalar(sqlgen.call("tensor_source", key))
            op = plan.operands[rel.index]
            return sqlgen.slot_blocks(slot.key, rel.schema.keys, op.shape, plan.block_shape(op))

        return bind

    def _bind(self, st: _Statement, plan: Plan, bindings: Mapping[E.Operand, np.ndarray]) -> None:
        for k, op in enumerate(plan.operands):
            arr = bindings.get(op)
            if arr is None:
                raise ShapeError(f"operand {op.name!r} has no array bound to it")
            check_operand(op, arr, st.wants[k])
            if st.bound[k] is arr:  # kept from the relation's last run
                continue
            view = st.views[k]
            if view is not None:
                if st.prepared is not None:  # a prepared plan may hold the old view's scan: never reuse it
                    self._forget_prepared(st)
                try:
                    self.con.register(view, arrow.split(arr, plan.block_shape(op), op.dtype, copy=False))
                except duckdb.Error as exc:  # an open result of the user's on the connection, an aborted txn
                    raise wrap(exc, f"einsum: operand {op.name!r}") from exc
            else:
                st.slots[k].set(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))  # type: ignore[union-attr]
            st.bound[k] = arr

    def _unbind(self, st: _Statement, keep: bool = False) -> None:
        """Releases the operands after a run; ``keep`` leaves them bound for the next run with the same arrays
        (a lazy relation run again reads its uploaded views as they are). A statement over lent slots alone
        is always released: setting a slot again costs microseconds, and a released statement runs on the
        small-call path (``fast``) next time."""
        if keep and any(v is not None for v in st.views):
            return
        for k, view in enumerate(st.views):
            if view is not None and st.bound[k] is not None:
                _unregister_logged(self.con, view)
        for slot in st.slots:
            if slot is not None:
                slot.clear()
        st.bound = [None] * len(st.views)

    def _forget_prepared(self, st: _Statement) -> None:
        name, st.prepared = st.prepared, None
        st.unpreparable = True
        if name is not None:
            deallocate(weakref.ref(self), name, st.lane)


class Registered:
    """A view of rows registered by ``register_rows``, unregistered by ``drop`` or when this goes."""

    def __init__(self, executor: DuckDBExecutor, name: str) -> None:
        self.name = name
        self._finalizer = weakref.finalize(self, executor.release, name)

    def drop(self) -> None:
        self._finalizer()


class Snapshot:
    """A temporary table of a query's rows (``DuckDBExecutor.snapshot``), dropped by ``drop`` or when this
    goes (with whatever holds it: a statement's DuckDB relation that reads it again each time it runs, or a
    call that failed before its own ``drop``)."""

    def __init__(self, executor: DuckDBExecutor, name: str) -> None:
        self.name = name
        self.executor = executor
        self._finalizer = weakref.finalize(self, executor.drop, name)

    def table(self) -> exp.Table:
        return exp.Table(this=sqlgen.ident(self.name))

    def columns(self, what: str) -> list[str]:
        _, described = self.executor.describe(exp.select(exp.Star()).from_(self.table()).limit(0), what)
        return [str(d[0]) for d in described]

    def drop(self) -> None:
        self._finalizer()


def _fast_call(
    ex: DuckDBExecutor, plan: Plan, st: _Statement
) -> Callable[[Mapping[E.Operand, np.ndarray]], np.ndarray | None]:
    """``DuckDBExecutor.fast``'s function for one prepared, slot-only statement."""
    con, lock, text = ex._con(st), ex._lock, st.text["execute"]
    operands, wants = plan.operands, st.wants
    slots: list[udf_sink.Slot] = [slot for slot in st.slots if slot is not None]
    sink = st.sink_slot
    assert sink is not None and len(slots) == len(operands)
    shape, dtype = plan.root.shape, DTYPES[plan.root.dtype]
    diagnosis = ex._diagnosis(st, plan)

    def run(bindings: Mapping[E.Operand, np.ndarray]) -> np.ndarray | None:
        out = np.empty(shape, dtype=dtype)
        with lock:
            try:
                for op, slot, want in zip(operands, slots, wants, strict=True):
                    arr = bindings[op]
                    check_operand(op, arr, want)
                    slot.set(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
                sink.set(out, writable=True)
                _blocks, elements = longrun.run_direct(lambda: con.execute(text).fetchall()[0])
            except duckdb.Error as exc:
                raise ex._failed(exc, "einsum", diagnosis) from exc
            finally:
                sink.clear()
                for slot in slots:
                    slot.clear()
        return out if elements == out.size else None

    return run  # holds no reference to the plan: the caller does while it runs (a plan kept alive by its own
    # statement's function would never be freed, nor its prepared statement deallocated)


#: DuckDB exports a BLOB column as Arrow binary, whose int32 offsets hold at most this many bytes per batch
ARROW_BATCH_BYTES = (1 << 31) - 1
#: DuckDB's own default rows per exported batch
ARROW_BATCH_ROWS = 131072


def _arrow_batch_rows(plan: Plan) -> int:
    """Rows per Arrow batch such that a batch of the plan's result blocks stays within Arrow binary's
    offsets (a few 256 MiB blocks would pass 2 GiB: DuckDB then refuses the export)."""
    block = math.prod(plan.block_shape()) * DTYPES[plan.root.dtype].itemsize
    return max(1, min(ARROW_BATCH_ROWS, ARROW_BATCH_BYTES // max(1, block)))


def _fetch_rows(con: duckdb.DuckDBPyConnection, text: str) -> tuple[list[tuple], list[str]]:
    cur = con.execute(text)
    return cur.fetchall(), [d[0] for d in cur.description or []]


def _parsed(text: str) -> exp.Expression:
    """A generated statement's text as a sqlglot node that prints it unchanged (it was generated by sqlglot
    already; parsing it again would cost milliseconds)."""
    return exp.Var(this=text)


def _unregister(executor_ref: weakref.ref, names: list[str]) -> None:
    ex = executor_ref()
    if ex is None or ex.closed:
        return
    for name in names:
        ex.release(name)


#: a statement that begins or ends a transaction starts with one of these (or one after a ';' does)
_TRANSACTION_WORDS = re.compile(r"(^|;)\s*(begin|start|commit|rollback|abort|end)\b", re.IGNORECASE)


def _close_interrupting(con: duckdb.DuckDBPyConnection, tries: int = 8) -> None:
    """``con.close()``; when DuckDB refuses (a query of another thread's runs on it), that query is
    interrupted and the close tried again, waiting up to ~2.5 s in all; the last refusal is raised."""
    for attempt in range(tries):
        try:
            con.close()
            return
        except duckdb.Error:
            if attempt == tries - 1:
                raise
            with contextlib.suppress(duckdb.Error):
                con.interrupt()
            time.sleep(0.01 * 2**attempt)


def _with_arrow(
    con: duckdb.DuckDBPyConnection,
    views: Mapping[str, pa.Table],
    build: Callable[[], exp.Query],
) -> pa.Table:
    """``DuckDBExecutor.with_arrow`` on ``con``."""
    try:
        for name, table in views.items():
            con.register(name, table)
        return con.sql(sqlgen.sql_text(build())).to_arrow_table()
    except duckdb.Error as exc:
        raise wrap(exc, "to_rows") from exc
    finally:
        for name in views:
            _unregister_logged(con, name)


def _unregister_logged(con: duckdb.DuckDBPyConnection, name: str) -> None:
    """Unregisters view ``name``, a failure logged: raised in a ``finally`` or a clean-up, it would hide the
    statement's own error (inside the user's aborted transaction, DuckDB refuses both)."""
    try:
        con.unregister(name)
    except duckdb.Error as exc:
        log.warning("tensorsql: could not unregister view %s: %s", name, exc)


__all__ = ["SLOT_BYTES", "SMALL_RESULT_BYTES", "DuckDBExecutor"]
