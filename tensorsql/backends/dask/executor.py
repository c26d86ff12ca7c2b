"""The cluster executor: tensor relations partitioned across Dask workers, each stage run as SQL on every
worker over its blocks.

A *distributed relation* is a list of partitions, each an Arrow table of blocks (key columns, ``tensor``)
held on one worker as a Dask future, with the bounding box of its block keys; a relation made here has a
partition per block. A plan runs in stages (``compile.waves``' cut of a TRA plan): every aggregation is a
stage, and its tasks are the planner's kernel calls: one per combination of the blocks of every label the
step joins (EinDecomp chose those blocks for p = the cluster's threads), merged where there are more than
``CALLS_PER_THREAD`` per thread. A task runs on its worker the plan restricted to its blocks
(``waves.restrict``), over only the input partitions it reads, which Dask moves there worker to worker.
A task that owns a range of a summed label makes partial blocks, which one more stage combines, each group
on a worker that holds one of its partials (the paper's aggregation cost). Tasks are placed on the worker
that already holds most of the bytes they read, at most an even share per worker. The client submits tasks
and collects only the final result.

The session's own database (``database=``, a DuckDB with the kernels, in this process) is its catalog:
``save()`` keeps a tensor's blocks there, so no worker's loss loses it; ``table()`` reads it back and
partitions it again. ``from_sql`` runs its query there too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import logging
import math
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from sqlglot import exp

from tensorsql.backends import arrow
from tensorsql.backends.base import CatalogEntry
from tensorsql.backends.dask import prepared as prepared_module
from tensorsql.backends.dask import require_distributed
from tensorsql.backends.duckdb import longrun, memory, sqlgen
from tensorsql.backends.duckdb.errors import wrap
from tensorsql.backends.duckdb.executor import DuckDBExecutor
from tensorsql.compile import waves as W
from tensorsql.compile.plan import Plan
from tensorsql.errors import ConfigError, OutOfMemoryError, SessionClosedError, ShapeError, WorkerLostError
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T

distributed = require_distributed()
log = logging.getLogger("tensorsql")

from tensorsql.backends.dask import worker as worker_side  # noqa: E402

_ids = itertools.count()
#: seconds per byte a block moving between workers costs (Arrow over TCP between local processes: ~1 GB/s)
NET_BYTE = 1e-9
#: seconds per byte of a stored tensor that a plan reads re-split: its partitions come from the workers that
#: hold them (``NET_BYTE``; Dask keeps the replica for the next run) and each task reading a block of the new
#: split assembles it (``tensor_slice`` / ``tensor_assemble``: 0.4-1.4 ns per byte on the project's VM)
REPART_BYTE = 2e-9
#: seconds a stage boundary costs beyond its bytes (a re-split between two steps, partial blocks combined):
#: the last task of the stage reported to the scheduler, the next stage's tasks sent and started (4-7 ms on
#: the project's 2-core VM), and those tasks, whose inputs are new on every run, registering them and
#: planning their SQL afresh (~5 ms): a square chain (1024^2) of two stages took 0.079 s, of one 0.056 s
EXCHANGE = 1.2e-2
#: seconds a run waits for a cluster without workers to get one
WORKER_WAIT = 30
#: the least ``worker_memory_limit`` a LocalCluster's worker may have
MIN_WORKER_MEMORY = 512 << 20
#: seconds between two progress lines of a run
PROGRESS_EVERY = 0.25
#: seconds between looks at a run still waiting for its tasks (stuck ones freed, lost workers noticed)
POLL = 2.0
#: kernel calls (tasks) per cluster thread a stage keeps before merging neighbouring ones
CALLS_PER_THREAD = 1
#: partitions per worker a relation is cut into at most (one per block below that)
PIECES_PER_WORKER = 64
#: bytes below which ``storage_blocks`` cuts a block no further once every worker has one
MIN_STORAGE_BLOCK = 64 << 10

Box = dict[str, tuple[int, int]]


@dataclass
class Part:
    """One partition of a distributed relation: a future of an Arrow table held on a worker, the box of its
    block keys (first, last) per key, the worker it was placed on and its bytes (dense, for a stage's)."""

    future: Any
    box: Box
    worker: str | None = None
    nbytes: int = 0


@dataclass
class DistRel:
    """``columns``: the key columns of the parts' tables by key of ``schema`` where they differ (a stage's
    result read under the names of a rename above it, without a stage of its own)."""

    schema: T.Schema
    parts: list[Part] = field(default_factory=list)
    columns: dict[str, str] | None = None

    def named(self, table: pa.Table) -> pa.Table:
        """A part's table with the schema's key names."""
        if not self.columns:
            return table
        return pa.table(
            {**{k: table.column(self.columns[k]) for k in self.schema.keys}, "tensor": table["tensor"]}
        )


@dataclass
class StageReport:
    """What one stage did: its node and tasks per worker with their blocks; ``modelled``: the bytes its
    kernel calls read as the planner's cost model counts them (every block a call reads, dense); ``fed``
    and ``moved``: the bytes its tasks were given, and of those the bytes Dask brought from other workers,
    as each task counted them where it ran (known once the stage has run)."""

    what: str
    parts: dict[str, int]
    blocks: dict[str, list[str]] = field(default_factory=dict)
    modelled: int = 0
    fed: int | None = None
    moved: int | None = None
    #: the keys of its tasks, until counted
    tasks: list[str] = field(default_factory=list, repr=False)
    #: its tasks, while the run is followed (progress)
    futures: list[Any] = field(default_factory=list, repr=False)
    #: per task of ``futures``: (bytes fed, of them held by other workers than the one it was placed on)
    task_bytes: list[tuple[int, int]] = field(default_factory=list, repr=False)


#: tasks per worker ``explain`` lists by their blocks
SHOWN_TASKS = 8
STREAM_INTERVAL = worker_side.STREAM_INTERVAL


def _box(table: pa.Table, keys: tuple[str, ...]) -> Box:
    out: Box = {}
    for k in keys:
        mm = pc.min_max(table.column(k))
        lo, hi = mm["min"].as_py(), mm["max"].as_py()
        out[k] = (int(lo), int(hi)) if lo is not None else (0, -1)
    return out


def _meets(box: Box, ranges: Mapping[str, tuple[int, int]]) -> bool:
    for k, (lo, hi) in ranges.items():
        if k in box:
            a, b = box[k]
            if b < lo or a > hi:
                return False
    return True


def _empty(schema: T.Schema) -> pa.Table:
    cols = {k: pa.array([], pa.int32()) for k in schema.keys}
    cols["tensor"] = pa.array([], pa.binary())
    return pa.table(cols)


def _piece(table: pa.Table) -> pa.Table:
    return table


def run_part(
    sql: str, rels: list[DistRel], inputs: list[list[pa.Table]], keys: list[list[str]], out_bytes: int = 0
) -> pa.Table:
    """On a worker: one task of a stage, the SQL of the stage restricted to the task's blocks (made at the
    client, once per plan: ``_Run.sql``), over its inputs: the partitions of each relation it reads
    (``rels``, sent without their parts) that Dask brought here, registered as the views ``_ts_in_0``,
    ``_ts_in_1``, ... of a fresh cursor of the worker's DuckDB. Returns the task's blocks. ``keys``: the
    inputs' Dask keys, to count the bytes that came from other workers (``worker.count_moved``). A task
    run again over the same inputs runs prepared (``prepared``) where its result, ``out_bytes`` as the
    plan models it, is at most ``prepared.MAX_RESULT_BYTES``."""
    ex = worker_side.worker_executor()
    flat = [(k, t) for tables, ks in zip(inputs, keys, strict=True) for k, t in zip(ks, tables, strict=True)]
    worker_side.count_moved(flat)

    def register(cur: Any) -> None:
        for i, (dist, tables) in enumerate(zip(rels, inputs, strict=True)):
            named = [dist.named(t) for t in tables]
            cur.register(_view(i), pa.concat_tables(named) if named else _empty(dist.schema))

    def fresh() -> pa.Table:
        cur = ex.con.cursor()
        try:
            register(cur)
            return cur.sql(sql).to_arrow_table()
        finally:
            cur.close()

    try:
        prepared = worker_side.prepared_tasks(ex)
        if prepared is None or out_bytes > prepared_module.MAX_RESULT_BYTES:
            return fresh()
        # what the views are: the inputs' keys, each read under its relation's key names
        names = [(tuple(d.schema.keys), tuple(sorted((d.columns or {}).items()))) for d in rels]
        signature = (sql, tuple(names), tuple(len(ks) for ks in keys), *(k for k, _ in flat))
        return prepared.run(signature, [k for k, _ in flat], [t for _, t in flat], register, fresh)
    except duckdb.Error as exc:  # a kernel's error, out of memory, ...: the typed error, raised at the client
        raise wrap(exc, "einsum") from exc


class _Kept(dict):
    """A plan's kept operands, operand index -> (its array, weakly; its partitions): a dict that can be
    held weakly."""


def _drop(map_ref: weakref.ref, index: int) -> None:
    """A kept operand's array is gone: its partitions are let go."""
    held = map_ref()
    if held is not None:
        held.pop(index, None)


def _usable(rel: DistRel) -> bool:
    """Every partition still held or to be made again (a lost worker's pieces are recomputed from their
    tasks); not one that failed or was cancelled (a closed client)."""
    return all(p.future.status not in ("error", "cancelled") for p in rel.parts)


def _view(i: int) -> str:
    return f"_ts_in_{i}"


def _all_paused(dask_scheduler: Any = None) -> bool:
    """On the scheduler: it has workers, and every one is paused (for memory)."""
    workers = list(dask_scheduler.workers.values())
    return bool(workers) and all(getattr(ws.status, "name", "") == "paused" for ws in workers)


def _unstick(token: str, dask_scheduler: Any = None) -> int:
    """On the scheduler (``client.run_on_scheduler``): the tasks of the session ``token`` waiting for a
    worker (``no-worker``) though their restriction is a loose one: Dask runs such a task on another worker
    only if none of its own is alive when it becomes ready, and never moves it to a worker that joins later.
    Their restriction dropped, they run on any worker. Returns how many (-1 where this Dask keeps its state
    otherwise)."""
    try:
        waiting = list(dask_scheduler.unrunnable)
        stuck = [ts for ts in waiting if token in str(ts.key) and ts.loose_restrictions]
        if not stuck or not dask_scheduler.workers:
            return 0
        for ts in stuck:
            ts.worker_restrictions = None
        dask_scheduler.transitions(
            {ts.key: "processing" for ts in stuck}, stimulus_id=f"tensorsql-unstick-{time.time()}"
        )
        return len(stuck)
    except AttributeError:
        return -1


class _Batch:
    """A run's tasks, sent to the scheduler together as one graph. ``client.submit`` sends a message per
    task, and the client's batched stream holds each message after the first for up to its interval (10 ms):
    a stage's tasks reached their workers ~7 ms apart, and the stage ended with its last. Each task asks for
    its worker, a restriction the scheduler may break (``allow_other_workers``: a lost worker's tasks run
    elsewhere). ``add`` returns the task's future at once, for later tasks of the run to read."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.tasks: dict[str, Any] = {}
        self.where: dict[str, list[str]] = {}

    def add(self, key: str, fn: Callable[..., Any], *args: Any, worker: str) -> Any:
        from dask._task_spec import Task, parse_input

        self.tasks[key] = Task(key, fn, *(parse_input(a) for a in args))
        self.where[key] = [worker]
        return distributed.Future(key, self.client)  # the caller holds it: the key stays wanted till sent

    def send(self) -> None:
        if not self.tasks:
            return
        from dask.highlevelgraph import HighLevelGraph, MaterializedLayer

        name = f"tensorsql-run-{uuid.uuid4().hex}"
        layer = MaterializedLayer(self.tasks, annotations={"workers": self.where.__getitem__})
        graph = HighLevelGraph({name: layer}, {name: set()})
        self.client.get(graph, list(self.tasks), sync=False, allow_other_workers=True)
        self.tasks, self.where = {}, {}


def _read_whole(ast: exp.Expression, views: set[str]) -> exp.Expression:
    """``ast`` with each read of a task's input view behind ``OFFSET 0``: DuckDB then scans the registered
    Arrow table in place and filters after the scan. A filter or a join's key filter pushed into an Arrow
    scan makes it copy every blob it passes (80 MB of blocks through ``WHERE k BETWEEN ...``: 8 ms against
    0.4 ms unfiltered; a D x E task of the skewed chain: 132-144 ms -> 99-111 ms); the task's inputs are
    about the blocks it reads anyway, so the filter saves nothing. The sides of a POSITIONAL JOIN are left
    as they are (``_positional``). (One process puts only its filtered reads of Arrow tables behind it:
    ``sqlgen.to_ast``'s ``in_place``.)"""

    def barrier(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Table) and node.name in views and not _positional(node):
            return sqlgen.read_whole(node.name, node.args.get("alias"))
        return node

    return ast.transform(barrier)


def _positional(table: exp.Table) -> bool:
    """Whether ``table`` is a side of a POSITIONAL JOIN (one-block sides side by side): DuckDB reads those
    by a positional scan, in place and unfiltered; behind ``OFFSET 0`` it would join them by copying the
    right side (two 32 MiB blocks: 2.0-2.4 ms against 6.6 ms)."""

    def positional(join: exp.Expression) -> bool:
        return str(join.args.get("method") or "").upper() == "POSITIONAL"

    parent = table.parent
    if isinstance(parent, exp.Join):
        return positional(parent)
    if isinstance(parent, exp.From) and parent.parent is not None:
        return any(positional(j) for j in parent.parent.args.get("joins") or [])
    return False


def _renamed(rel: T.Rel, rename: Mapping[str, str]) -> T.Rel:
    """``rel`` reading the tables of ``rename`` under their new names; a node read twice stays one node (the
    task's SQL computes it once)."""
    memo: dict[T.Rel, T.Rel] = {}

    def go(r: T.Rel) -> T.Rel:
        if r not in memo:
            if isinstance(r, T.Scan):
                memo[r] = T.Scan(r.schema, rename[r.table], r.complete) if r.table in rename else r
            else:
                memo[r] = T.with_inputs(r, tuple(go(c) for c in T.inputs(r)))
        return memo[r]

    return go(rel)


def _leaf_ranges(rel: T.Rel) -> list[tuple[str, dict[str, tuple[int, int]]]]:
    """(table, ranges) of every Scan a restricted plan reads (ranges empty: all of it)."""
    out: list[tuple[str, dict[str, tuple[int, int]]]] = []

    def walk(r: T.Rel, ranges: dict[str, tuple[int, int]]) -> None:
        if isinstance(r, T.Scan):
            out.append((r.table, ranges))
            return
        if isinstance(r, T.Restrict):
            ranges = {**ranges, **{k: (lo, hi) for k, lo, hi in r.ranges}}
            walk(r.child, ranges)
            return
        for c in T.inputs(r):
            walk(c, {})

    walk(rel, {})
    return out


class DaskExecutor:
    """Runs plans on a Dask cluster (module docstring). ``client``: the ``distributed.Client``; ``cluster``:
    the LocalCluster this executor started (closed with it), None for an attached one."""

    name = "dask"

    def __init__(
        self,
        client: Any,
        *,
        cluster: Any = None,
        own_client: bool = True,
        database: str = ":memory:",
        read_only: bool = False,
        memory_limit: int | str | None = None,
        max_block_bytes: int | str | None = None,
        progress: bool | None = None,
        spill: bool = False,
    ) -> None:
        self.client = client
        #: a line of stages and parts done while a query runs (None: when stderr is a terminal)
        self.progress = progress
        self._cluster = cluster
        #: close the client with the session (not a Client the caller passed in)
        self._own_client = own_client
        #: the session's own database: catalog, saved tensors, from_sql's source tables
        self.local = DuckDBExecutor(
            database,
            threads=1,
            read_only=read_only,
            memory_limit=memory_limit,
            max_block_bytes=max_block_bytes,
        )
        self.catalog = self.local.catalog
        self.kernel_set = self.local.kernel_set
        #: the planner's terms: a kernel call runs on one worker, so it never spreads itself over the cluster
        #: (no ``split_flops``): only more blocks use more workers; blocks between workers move over the
        #: network, slower than memory (``NET_BYTE``); a stage's calls merge into a task per thread, which
        #: reads each of its blocks once (``task_join``); a stored tensor read re-split is fetched and
        #: assembled in the tasks (``REPART_BYTE``); a re-split between steps is a stage boundary
        #: (``EXCHANGE``)
        self.profile = dataclasses.replace(
            self.local.profile,
            split_flops=0.0,
            join_byte=NET_BYTE,
            task_join=True,
            repart_byte=REPART_BYTE,
            exchange=EXCHANGE,
        )
        self.closed = False
        self._rels: dict[str, DistRel] = {}
        self._budget: int | None = None
        #: the stages of the last run (``last_run``: counted when first read)
        #: each thread's last run (``_last_run``): queries running at once on several threads each show and
        #: report their own stages (one list for all reset another thread's progress to "parts 0/0")
        self._runs = threading.local()
        self._token = uuid.uuid4().hex
        #: per plan, the SQL of its stages' tasks (``_Run.sql``): a plan run again sends the same text
        self._sql: weakref.WeakKeyDictionary[Plan, dict[tuple, dict[tuple, str]]] = (
            weakref.WeakKeyDictionary()
        )
        #: per plan, by (threads, wave budget): its last step's decision (``_Run.fused_last``)
        self._decided: weakref.WeakKeyDictionary[Plan, dict[tuple, tuple]] = weakref.WeakKeyDictionary()
        #: per plan run with ``keep`` (a relation's): operand index -> (its array, weakly, and its partitions
        #: on the workers), read again by the plan's next run with the same array instead of shipped again;
        #: let go with the array (the relation), not with the plan, which the plan cache keeps longer
        self._kept: weakref.WeakKeyDictionary[Plan, _Kept] = weakref.WeakKeyDictionary()
        try:
            plugin = worker_side.TensorSQLWorker(spill=spill, settle=cluster is not None)
            client.register_plugin(plugin, name=worker_side.NAME)
        except Exception as exc:
            self.local.close()
            raise ConfigError(f"cannot set up tensorsql on the Dask workers: {exc}") from exc

    @property
    def _last_run(self) -> list[StageReport]:
        return getattr(self._runs, "reports", [])

    @_last_run.setter
    def _last_run(self, reports: list[StageReport]) -> None:
        self._runs.reports = reports

    # -- the cluster ------------------------------------------------------------------------------------
    def _key(self, what: str) -> str:
        """A task's key, unique on the cluster (other clients may share it): this executor's random token and
        a count. Dask would draw a uuid4 per task, ~0.15 ms of ``os.urandom`` each here."""
        return f"tensorsql-{what}-{self._token}-{next(_ids)}"

    def _workers(self) -> dict[str, int]:
        """{address: threads} of the workers now, asked of the scheduler (the Client's cached
        ``scheduler_info`` can lag behind, even show none); a cluster with none for ``WORKER_WAIT`` seconds
        is a WorkerLostError (docs "The cluster")."""
        workers = self._nthreads()
        if not workers:
            try:
                self.client.wait_for_workers(1, timeout=WORKER_WAIT)
            except (TimeoutError, OSError) as exc:
                raise WorkerLostError(f"the Dask cluster has no workers (waited {WORKER_WAIT} s)") from exc
            workers = self.client.nthreads()
        return {addr: int(n) for addr, n in sorted(workers.items())}

    def _nthreads(self) -> dict[str, int]:
        """The scheduler's {worker: threads}; WorkerLostError for a closed Client (whose scheduler attribute
        is None: AttributeError) or a scheduler that is gone (OSError, CommClosedError, a closed pool's
        RuntimeError)."""
        if self.client.status in ("closing", "closed"):
            raise WorkerLostError(
                "the session's Dask client was closed (s.client.close(), or by the owner of the Client given "
                "as cluster=): connect again"
            )
        try:
            return self.client.nthreads()
        except (OSError, distributed.comm.CommClosedError, RuntimeError) as exc:
            raise WorkerLostError(f"lost the connection to the Dask scheduler: {exc}") from exc

    def wave_budget(self) -> int:
        """The smallest wave budget of the workers' DuckDBs: bytes of blocks one part may hold at once."""
        if self._budget is None:
            budgets = self.client.run(worker_side.wave_budget, on_error="return").values()
            known = [b for b in budgets if isinstance(b, int)]
            if not known:  # no worker set up yet: asked again next time, not left unbounded for good
                return 1 << 62
            self._budget = min(known)
        return self._budget

    @property
    def workers(self) -> int:
        """Kernel calls the cluster runs at once (the planner's p): every worker's threads."""
        return max(1, sum(self._workers().values()))

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._rels.clear()
        self._kept.clear()
        try:
            if self._own_client:
                self.client.close()
        finally:
            if self._cluster is not None:
                self._cluster.close()
            self.local.close()

    # -- distributed relations ----------------------------------------------------------------------------
    def _scatter(self, table: pa.Table, schema: T.Schema) -> DistRel:
        """A table's blocks in key order, a partition per block (contiguous runs of blocks past
        ``PIECES_PER_WORKER`` per worker), an equal run of them per worker: neighbouring blocks, which the
        contiguous key ranges of a stage's tasks read together, share a worker."""
        addrs = list(self._workers())
        if schema.keys and table.num_rows > 1:
            table = table.take(pc.sort_indices(table, [(k, "ascending") for k in schema.keys]))
        n = table.num_rows
        pieces = max(1, min(n, PIECES_PER_WORKER * len(addrs)))
        rel = DistRel(schema)
        for i in range(pieces):
            lo, hi = i * n // pieces, (i + 1) * n // pieces
            # a compact copy: a slice keeps the whole table's buffers, which Dask would size and ship
            piece = table.take(pa.array(np.arange(lo, hi, dtype=np.int64)))
            if piece.num_rows == 0 and n:
                continue
            addr = addrs[i * len(addrs) // pieces]
            # a task holding its piece, not scattered data: a worker lost mid-query gets its pieces made
            # again elsewhere from the task (scattered data would be gone, and its dependents would wait)
            fut = self.client.submit(
                _piece, piece, key=self._key("piece"), workers=[addr], allow_other_workers=True, pure=False
            )
            rel.parts.append(Part(fut, _box(piece, schema.keys), addr, int(piece.nbytes)))
        return rel

    def upload(
        self, table: pa.Table, layout: tuple[tuple[int, ...], tuple[int, ...], str], *, verified: bool = False
    ) -> str:
        shape, block_shape, dtype = layout
        if not verified:
            arrow.check_blocks(table, shape, block_shape, dtype)
        schema = T.positional(shape, block_shape, dtype)
        keys = [table.column(k).cast(pa.int32()) for k in schema.keys]
        table = pa.table({**dict(zip(schema.keys, keys, strict=True)), "tensor": table.column("tensor")})
        name = f"_ts_dist_{next(_ids)}"
        self._rels[name] = self._scatter(table, schema)
        return name

    def storage_blocks(
        self, shape: tuple[int, ...], block_shape: tuple[int, ...], itemsize: int
    ) -> tuple[int, ...]:
        """``from_numpy``'s and ``from_sql``'s default blocking on a cluster: the largest dimension's blocks
        halved until every worker has a block, then on until there are ``workers`` blocks per worker (a
        vector: one) while a block keeps ``MIN_STORAGE_BLOCK`` bytes, so square blocks of a matrix split each
        of its dimensions about ``workers`` ways. A one-block relation would sit on one worker, and so would
        every plan that keeps its blocking; a matrix in row strips is cut the wrong way for every product that
        splits its columns, which must then re-split it (slice and re-assemble every block, in every run:
        1.8x the one-process time of the paper's square chain at 1024^2, against 0.9x over square blocks,
        where every product keeps them). The floor keeps a small tensor on a big cluster from being cut into
        thousands of tiny blocks (1000^2 float32 on 64 workers: 64 blocks, not 7,875)."""
        workers = len(self._workers())
        bs = list(block_shape)

        def count(sizes: list[int]) -> int:
            return math.prod(-(-n // b) for n, b in zip(shape, sizes, strict=True) if n)

        def halved() -> list[int] | None:
            d = max(range(len(shape)), key=lambda i: bs[i])
            if bs[d] <= 1:
                return None
            return [-(-b // 2) if i == d else b for i, b in enumerate(bs)]

        while shape and count(bs) < workers:  # a block for every worker, however small
            nxt = halved()
            if nxt is None:
                break
            bs = nxt
        want = workers ** min(len(shape), 2)
        while shape and count(bs) < want:  # square blocks, while they stay worth a kernel call
            nxt = halved()
            if nxt is None or math.prod(nxt) * itemsize < MIN_STORAGE_BLOCK:
                break
            bs = nxt
        return tuple(bs)

    def release(self, name: str) -> None:
        self._rels.pop(name, None)

    def drop(self, name: str) -> None:
        self._rels.pop(name, None)

    def ingest_rows(
        self, query: str, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str
    ) -> str:
        """``from_sql``: the query runs in the session's database (where its tables are), then its blocks are
        partitioned over the workers."""
        local = self.local.ingest_rows(query, shape, block_shape, dtype)
        try:
            table = self._read_local(local, "from_sql")
        finally:
            self.local.drop(local)
        return self.upload(table, (shape, block_shape, dtype), verified=True)

    def query(self, statement: exp.Expression | str, what: str = "query") -> list[tuple]:
        """SQL on the session's own database (``Session.execute``)."""
        return self.local.query(statement, what)

    # -- running plans --------------------------------------------------------------------------------------
    def text(self, plan: Plan, pretty: bool = True) -> str:
        return self.local.text(plan, pretty=pretty)

    def notes(self, plan: Plan) -> list[str]:
        workers = self._workers()
        lines = [
            f"runs on {len(workers)} Dask workers ({sum(workers.values())} threads): each aggregation is a "
            "stage whose tasks are the plan's kernel calls, each placed on the worker holding most of what "
            "it reads (a last step that is no aggregation computes those under it in its own tasks, where "
            "its tasks split them as finely and compute no block of them twice)"
        ]
        # the calling thread's last run, only where it ran this plan (it showed another relation's stages)
        ran = getattr(self._runs, "plan", None) is plan
        for i, st in enumerate(self.last_run if ran else []):
            lines.append(f"last run, stage {i}: {st.what}")
            for w in sorted(st.blocks):
                shown = st.blocks[w]
                more = f", ... ({len(shown)} tasks)" if len(shown) > SHOWN_TASKS else ""
                lines.append(f"  {w} runs blocks {'; '.join(shown[:SHOWN_TASKS])}{more}")
            measured = (
                ""
                if st.fed is None
                else f"; measured {st.fed:,} fed, {st.moved or 0:,} of them from other workers"
            )
            lines.append(f"  bytes: modelled {st.modelled:,} fed to its kernel calls{measured}")
        return lines

    def fast(self, plan: Plan) -> Callable[[Mapping[E.Operand, np.ndarray]], np.ndarray | None] | None:
        return None

    def many(self, stages: Sequence[tuple[str, Plan]], outputs: Sequence[Plan]) -> None:
        return None  # each plan runs as its own stages on the workers

    def run_into(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], out: np.ndarray, *, keep: bool = False
    ) -> bool:
        return False  # results come back as Arrow partitions (``run_arrow``)

    def run_arrow(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], *, keep: bool = False
    ) -> pa.Table:
        rel = self._execute(plan, bindings, keep=keep)
        # from the workers themselves where this session started them (one hop, no copy through the
        # scheduler); an attached cluster's workers may not be reachable from here: Dask's own setting
        direct = True if self._cluster is not None else None
        futures = [p.future for p in rel.parts]
        with self._cancelling(futures), self._lost():
            # the gather waits for the tasks itself: each part comes as soon as Dask knows it is done, with
            # no hop through this thread in between (~1 ms of a 45 ms chain)
            tables = [rel.named(t) for t in self._gather(futures, direct, progress=True)]
        self._done()
        return pa.concat_tables(tables) if tables else _empty(rel.schema)

    @contextlib.contextmanager
    def _cancelling(self, futures: list[Any]) -> Iterator[None]:
        """A run that stops early (Ctrl-C, an error, a lost cluster) cancels its tasks: they kept the workers
        busy after Ctrl-C, and the run's reports kept every stage wanted until the thread's next run."""
        try:
            yield
        except BaseException:
            wanted = [f for st in self._last_run for f in st.futures] + list(futures)
            with contextlib.suppress(Exception):  # a closed client or a lost scheduler: nothing to cancel
                if self.client.status not in ("closing", "closed"):
                    self.client.cancel(wanted)
            self._done()
            raise

    def _gather(self, futures: list[Any], direct: bool | None, progress: bool = False) -> list[pa.Table]:
        """The parts, fetched as they finish, under the same watch as ``_await`` (``progress``: with its
        progress lines): a worker lost after the tasks finished and before their results came would leave
        Dask's gather waiting forever (the parts made again are placed on the lost addresses), so they are
        moved to the workers there are, or the run gives up after ``WORKER_WAIT`` seconds (and its futures
        are cancelled, which ends the gather). A failed task raises its error as soon as it fails."""
        box: dict[str, Any] = {}
        done = threading.Event()

        def fetch() -> None:
            try:
                box["tables"] = self.client.gather(futures, direct=direct)
            except BaseException as exc:  # raised in the calling thread below
                box["error"] = exc
            finally:
                done.set()

        threading.Thread(target=fetch, name="tensorsql-gather", daemon=True).start()
        stream = sys.stderr if progress and longrun.progress_enabled(self.progress) else None
        try:
            self._watch(done, stream)
            if stream is not None:
                self._show_progress(stream, end=True)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.cancel(futures)
            raise
        if "error" in box:
            raise box["error"]
        return box["tables"]

    def _await(self, futures: list[Any]) -> None:
        """Until the run's ``futures`` are done (finished or failed), looking every ``POLL`` seconds for what
        Dask alone would wait on forever: tasks placed on workers that are all gone (a worker restriction,
        even a loose one, keeps a task off the workers that joined since: dask/distributed#7346) run
        elsewhere (``_unstick``); a cluster left without any worker for ``WORKER_WAIT`` seconds is a
        WorkerLostError."""
        # done callbacks and an event, not distributed.wait(timeout=): on Python 3.11 asyncio's wait_for can
        # let a CancelledError out when the timeout and the result meet, and Dask's sync() then fails with
        # an UnboundLocalError (seen with sessions attaching while queries ran)
        left, lock, finished = len(futures), threading.Lock(), threading.Event()

        def one(_: Any) -> None:
            nonlocal left
            with lock:
                left -= 1
                if left <= 0:
                    finished.set()

        if not futures:
            return
        for f in futures:
            f.add_done_callback(one)
        stream = sys.stderr if longrun.progress_enabled(self.progress) else None
        self._watch(finished, stream)
        if stream is not None:
            self._show_progress(stream, end=True)

    def _watch(self, finished: threading.Event, stream: Any) -> None:
        """Until ``finished`` is set: a progress line on ``stream`` every ``PROGRESS_EVERY`` seconds, and
        every ``POLL`` seconds the looks of ``_await`` (stuck tasks freed, a cluster without workers given up
        on, a closed session noticed)."""
        alone: float | None = None
        paused: float | None = None
        every = PROGRESS_EVERY if stream is not None else POLL
        looked, unstick = time.monotonic(), True
        while not finished.wait(every):
            if stream is not None:
                self._show_progress(stream)
            if time.monotonic() - looked < 0.9 * POLL:
                continue
            looked = time.monotonic()
            if self.closed:
                raise SessionClosedError("the session was closed while its query ran")
            if self._nthreads():
                alone = None
                if self._all_paused():  # no worker may start a task: Dask resumes one under its threshold
                    paused = time.monotonic() if paused is None else paused
                    if time.monotonic() - paused > WORKER_WAIT:
                        raise OutOfMemoryError(
                            f"every worker of the Dask cluster was paused for memory for {WORKER_WAIT} s "
                            "(Dask pauses a worker over 80% of its memory limit), with tasks of the query "
                            "left to run; give the workers more memory (connect(worker_memory_limit=...)), "
                            "or fewer workers more each"
                        )
                else:
                    paused = None
                if unstick:
                    try:
                        self.client.run_on_scheduler(_unstick, self._token)
                    except (OSError, distributed.comm.CommClosedError):
                        raise
                    except Exception as exc:  # a scheduler that cannot import tensorsql: Dask's own waiting
                        log.info("tensorsql: cannot look for stuck tasks on the scheduler: %s", exc)
                        unstick = False
                continue
            alone = time.monotonic() if alone is None else alone
            if time.monotonic() - alone > WORKER_WAIT:
                raise WorkerLostError(
                    f"the Dask cluster lost all its workers while a query ran, and none came back in "
                    f"{WORKER_WAIT} s"
                )

    def _all_paused(self) -> bool:
        """Whether the scheduler has every worker paused (a look that fails says no: the query waits on)."""
        try:
            return bool(self.client.run_on_scheduler(_all_paused))
        except Exception:  # a scheduler that cannot import tensorsql, or one going away: the other looks tell
            return False

    @contextlib.contextmanager
    def _lost(self) -> Iterator[None]:
        """Dask's errors of a lost worker or scheduler, or of a session closed under a query, typed."""
        try:
            yield
        except distributed.scheduler.KilledWorker as exc:  # names the last worker that died running it
            raise WorkerLostError(f"a task's workers kept dying: {exc}") from exc
        except distributed.client.FutureCancelledError as exc:
            if self.closed:
                raise SessionClosedError("the session was closed while its query ran") from exc
            raise WorkerLostError(f"a task of the query was cancelled on the cluster: {exc}") from exc
        except (OSError, distributed.comm.CommClosedError) as exc:
            raise WorkerLostError(f"lost the connection to the Dask cluster: {exc}") from exc

    def _show_progress(self, stream: Any, end: bool = False) -> None:
        """A line on ``stream`` of the last run's stages done / total, parts done, and the bytes the parts
        done read, with those placed on other workers (``end``: the last line). Those are the plan's: the
        workers' own counts (``last_run``) cost a round trip to every worker, and a replica Dask kept from an
        earlier run moves nothing."""
        stages = [st.futures for st in self._last_run]
        total = sum(len(f) for f in stages)
        done = [sum(f.done() for f in futures) for futures in stages]
        finished = sum(d == len(f) for d, f in zip(done, stages, strict=True))
        fed = moved = 0
        for st in self._last_run:
            for f, (n, far) in zip(st.futures, st.task_bytes, strict=True):
                if f.done():
                    fed, moved = fed + n, moved + far
        stream.write(
            f"\rtensorsql: stages {finished}/{len(stages)}, parts {sum(done)}/{total}, "
            f"{_mb(fed)} read, {_mb(moved)} from other workers"
        )
        if end:
            stream.write("\n")
        stream.flush()

    def _done(self) -> None:
        """A run finished: its reports let go of the stages' futures (Dask then frees what no relation
        holds); the byte counts stay on the workers until ``last_run`` is read."""
        for st in self._last_run:
            st.futures, st.task_bytes = [], []

    @property
    def last_run(self) -> list[StageReport]:
        """The stages of the last run, with the bytes their tasks were fed and moved (asked of the workers
        when first read after a run, not on every run: a query pays no round trip for its report)."""
        self._count_moved()
        return self._last_run

    def _count_moved(self) -> None:
        """Each stage's bytes read from other workers, as its tasks counted them where they ran (an input
        Dask fetched from a peer, not one computed or already held there)."""
        if not any(st.tasks for st in self._last_run):
            return
        counted: dict[str, tuple[int, int]] = {}
        try:  # a count is a report: a worker lost or restarting meanwhile never fails the query
            if self.client.status in ("closing", "closed"):  # client.run would raise AttributeError
                raise distributed.comm.CommClosedError("the Dask client was closed")
            answers = self.client.run(worker_side.take_moved, on_error="return")
        except (OSError, distributed.comm.CommClosedError, TimeoutError) as exc:
            log.info("tensorsql: could not collect the bytes moved: %s", exc)
            answers = {}
        for per_worker in answers.values():
            if isinstance(per_worker, dict):
                counted.update(per_worker)
        for st in self._last_run:
            got = [counted.get(str(k), (0, 0)) for k in st.tasks]
            st.fed, st.moved = sum(g[0] for g in got), sum(g[1] for g in got)
            st.tasks, st.futures, st.task_bytes = [], [], []

    def store(
        self,
        plan: Plan,
        bindings: Mapping[E.Operand, np.ndarray],
        name: str | None,
        *,
        replace: bool = False,
        temporary: bool = False,
    ) -> str:
        """``materialize()`` keeps the result partitioned on the workers; ``save()`` writes its blocks into
        the session's database (durable: no worker holds the only copy) with the catalog entry."""
        if temporary:
            dist = self._execute(plan, bindings)
            with self._cancelling([p.future for p in dist.parts]), self._lost():
                self._await([p.future for p in dist.parts])
                # a failed task raises here, as in one process: kept, every read would raise it again
                for p in dist.parts:
                    if p.future.status in ("error", "cancelled"):
                        p.future.result()
            self._done()
            name = f"_ts_dist_{next(_ids)}"
            self._rels[name] = dist
            return name
        if name is None:
            raise ConfigError("a permanent table needs a name")
        table = self.run_arrow(plan, bindings)
        view = f"_ts_save_{next(_ids)}"
        local = self.local
        create = exp.Create(
            this=exp.Table(this=sqlgen.ident(name)),
            kind="TABLE",
            expression=exp.select(exp.Star()).from_(view),
            replace=replace,
        )
        entry = CatalogEntry(name, plan.root.dtype, plan.root.shape, plan.block_shape())
        with local._lock:
            try:
                local.con.register(view, table)
            except duckdb.Error as exc:  # the user's transaction aborted, a closed connection
                raise wrap(exc, f"save {name!r}") from exc
            try:
                local.with_entry(entry, lambda: local.query(create, f"save {name!r}"))
            finally:
                local.unregister_view(view)
        return name

    def _read_local(self, table: str, what: str) -> pa.Table:
        """All rows of a table of the session's own database, as Arrow (a DuckDB error typed)."""
        query = sqlgen.sql_text(exp.select(exp.Star()).from_(exp.Table(this=sqlgen.ident(table))))
        with self.local._lock:
            try:
                return self.local.con.sql(query).to_arrow_table()
            except duckdb.Error as exc:
                raise wrap(exc, what) from exc

    def _source(self, scan: T.Scan, temps: dict[str, DistRel]) -> str:
        """The distributed relation a Scan reads: one of ours, or a saved table read from the session's
        database and partitioned (checked on the way, as any stored table is)."""
        if scan.table in self._rels or scan.table in temps:
            return scan.table
        s = scan.schema
        table = self._read_local(scan.table, f"table {scan.table!r}")
        shape = tuple(s.sizes[k] for k in s.keys)
        blocks = tuple(s.blocks[k] for k in s.keys)
        arrow.check_blocks(table, shape, blocks, s.dtype, f"corrupted stored table {scan.table!r}")
        name = f"_ts_dist_{next(_ids)}"
        temps[name] = self._scatter(table, s)
        return name

    def _execute(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], *, keep: bool = False
    ) -> DistRel:
        """The plan's stages sent to the cluster; its result's partitions (futures). ``keep``: the array
        operands stay on the workers for the plan's next run with the same arrays (``Executor.run_arrow``),
        as a relation's uploads stay in one process: a relation run again ships nothing through the client.
        Only arrays nobody can change (``arrow.immutable``: a relation's own copies) are kept: the workers
        hold copies, which would not see a ``copy=False`` array changed in place, as one process does."""
        temps: dict[str, DistRel] = {}
        self._last_run = []
        leaves: dict[T.Rel, T.Rel] = {}
        kept = self._kept.get(plan, {}) if keep else {}
        scattered: dict[int, tuple[np.ndarray, DistRel]] = {}

        def leaf(rel: T.Rel) -> T.Rel:
            if rel in leaves:
                return leaves[rel]
            if isinstance(rel, T.Input):
                op = plan.operands[rel.index]
                arr = bindings.get(op)
                if arr is None:
                    raise ShapeError(f"operand {op.name!r} has no array bound to it")
                hit = kept.get(rel.index)
                if hit is not None and hit[0]() is arr and _usable(hit[1]):
                    dist = hit[1]
                else:
                    table = arrow.split(np.asarray(arr), plan.block_shape(op), op.dtype)
                    dist = self._scatter(table, rel.schema)
                scattered[rel.index] = (arr, dist)
                name = f"_ts_dist_{next(_ids)}"
                temps[name] = dist
                out: T.Rel = T.Scan(rel.schema, name)
            elif isinstance(rel, T.Scan):
                out = T.Scan(rel.schema, self._source(rel, temps))
            else:
                out = T.with_inputs(rel, tuple(leaf(c) for c in T.inputs(rel)))
            leaves[rel] = out
            return out

        memo, decided = self._sql.setdefault(plan, {}), self._decided.setdefault(plan, {})
        run = _Run(self, {**self._rels, **temps}, memo, decided)
        try:
            root = leaf(plan.tra)
        finally:  # ``leaf`` calls itself through its closure: a cycle that held the arrays till a collection
            leaf = None  # type: ignore[assignment]
        run.rels.update(temps)
        result = run.last(root)
        run.batch.send()
        self._last_run = run.reports
        self._runs.plan = plan
        if keep:
            held = _Kept()
            # the callbacks hold the map weakly: it and its partitions go by reference counting
            map_ref = weakref.ref(held)
            for index, (arr, dist) in scattered.items():
                if not arrow.immutable(arr):  # copy=False over an array its owner may change: shipped anew
                    continue
                ref = weakref.ref(arr, lambda _, index=index: _drop(map_ref, index))
                held[index] = (ref, dist)
            self._kept[plan] = held
        else:
            self._kept.pop(plan, None)
        return result


class _Run(W.Stager):
    """One plan's stages on the cluster (the distributed counterpart of ``duckdb.staged.StagedRun``)."""

    def __init__(
        self,
        ex: DaskExecutor,
        rels: dict[str, DistRel],
        sql: dict[tuple, dict[tuple, str]],
        decided: dict[tuple, tuple],
    ) -> None:
        super().__init__()
        self.ex = ex
        self.rels = rels
        self.stages = 0
        workers = ex._workers()
        self.addrs = list(workers)
        self.threads = max(1, sum(workers.values()))
        self.budget = ex.wave_budget()
        #: the plan's task SQL by (stage number, the stage's cuts, the task's ranges), for these threads and
        #: this budget: what the stages are (which aggregations the last step computes) depends on them
        self.memo = sql.setdefault((self.threads, self.budget), {})
        #: the plan's ``fused_last`` decisions, by (threads, budget), where one can be replayed
        self.decided = decided
        self.reports: list[StageReport] = []
        self.stored: set[str] = set()
        #: the stages' tasks, sent once the plan is cut (``_execute``)
        self.batch = _Batch(ex.client)

    def store(
        self, rel: T.Rel, space: Mapping[str, int], cuts: Mapping[str, int], schema: T.Schema, what: str
    ) -> str:
        name = f"_ts_stage_{next(_ids)}"
        self.rels[name] = self.stage(rel, space, cuts, schema, what)
        self.stored.add(name)
        return name

    def last(self, root: T.Rel) -> DistRel:
        space = {k: root.schema.nblocks(k) for k in root.schema.keys}
        fused = self.fused_last(root, space)
        if fused is not None:
            step, calls, cuts = fused
            top, columns = _renames(root)
            if isinstance(top, T.Aggregate):  # the last aggregation's own stage, read renamed
                return _renamed_parts(self.stage(step, calls, cuts, top.schema, "result"), root, columns)
            return self.stage(step, calls, cuts, root.schema, "result")
        rel = self.below(root)  # every aggregation a stage of kernel calls
        inner, columns = _renames(rel)
        if isinstance(inner, T.Scan) and inner.table in self.stored:  # the last aggregation's stage, renamed
            return _renamed_parts(self.rels[inner.table], root, columns)
        return self.stage(rel, space, self.cuts(rel, space, set(space)), root.schema, "result")

    def fused_last(
        self, root: T.Rel, space: Mapping[str, int]
    ) -> tuple[T.Rel, dict[str, int], dict[str, int]] | None:
        """The last step (a join or map over aggregations: the chain's final add) with aggregations under it
        computed in its own tasks instead of in stages of their own: (the step, the space of its calls, its
        cuts); None where that would cost parallelism or work. Each stage is a round of tasks, each paying a
        Dask round trip, its inputs' registration and DuckDB's planning: ~10 ms, which on the paper's square
        chain is as much as a step's kernel call. An aggregation (at any depth: C x (D x E) and D x E under it
        alike) stays in the last step only if it is not stored anyway (a step left to a stage reads it too);
        if, as a stage, it would cut no label it sums away (no partial blocks to combine) into no more tasks
        than the last step has; and if the blocks of it the step's tasks compute are disjoint (no block
        computed by two tasks, or twice by one: a label the step cuts that does not reach it, a repeated
        label, a coarser blocking behind a repartition, the same aggregation read as itself and transposed).
        Where the step's own cuts make them overlap, the step is cut along the other labels alone if that
        still gives every thread a task (``_whole``: the skewed chain's add cut by columns only, so that
        D x E, too short to share by rows, runs in it: one stage instead of two). Those that fail are stored,
        and the others checked again. None where the step with them does not fit a worker's wave budget at
        its cuts (their own stages could cut the labels they sum away).

        A last step that is itself an aggregation (a chain of products, ``ij,jk,kl->il``) is cut as its own
        stage would be (``materialize``: over the labels it joins, merged along its sums first) and computes
        those under it the same way; where those cuts split its sum (partial blocks, one more stage to
        combine them) it keeps a stage of its own (X @ Y @ Z, 1024^2 on 2 workers: 40 -> 30 ms).

        The decision depends only on the plan, the threads and the wave budget: a plan run again replays it
        (``decided``: the same ``_computing`` calls, so the same stages made in the same order, which the
        task SQL is kept by) instead of checking again, ~1-2 ms of the client's planning per run of the
        square chain."""
        inner, _ = _renames(root)
        top = inner if isinstance(inner, T.Aggregate) else None
        body = top.child if top is not None else root  # what the step computes aggregations in
        if top is not None:
            space = {k: top.child.schema.nblocks(k) for k in top.child.schema.keys}
        free = set(top.schema.keys) if top is not None else set(space)

        def step(ours: set[T.Aggregate]) -> tuple[T.Rel, dict[T.Aggregate, T.Aggregate]]:
            rel, nodes = self._computing(body, ours)
            return (rel if top is None else T.with_inputs(top, (rel,))), nodes

        aggs = [r for r in T.nodes(body) if isinstance(r, T.Aggregate)]
        known = self.decided.get((self.threads, self.budget))
        if known is not None:  # the plan's earlier run decided: the same stages, made in the same order
            calls, cuts = known
            for picks in calls:
                rel, _ = step({aggs[i] for i in picks})
            return None if cuts is None else (rel, dict(space), dict(cuts))
        ours = {r for r in aggs if not self.is_stored(r)}
        calls: list[tuple[int, ...]] = []
        while ours:  # each round stores one or more of them (and what is under those), or returns
            calls.append(tuple(i for i, a in enumerate(aggs) if a in ours))
            rel, nodes = step(ours)
            if set(nodes) != ours:  # storing one stored some of them too: read those from their stage
                ours = set(nodes)
                continue
            options = [self.cuts(rel, space, free)]
            if top is not None and any(c > 1 for k, c in options[0].items() if k not in free):
                options = []  # its own sum cut over the tasks: a stage of its own, then one to combine
            whole = self._whole(rel, space, list(nodes.values())) if top is None else set()
            if whole and any(options[0].get(k, 1) > 1 for k in whole):
                other = self.cuts_keeping(rel, space, set(space), whole)
                enough = min(self.threads, W.count(options[0], space))
                if other is not None and W.count(other, space) >= enough:
                    options.insert(0, other)
            # the step with them must fit a worker's wave budget at its cuts; stages of their own could cut
            # the labels they sum away to fit
            options = [c for c in options if W.footprint(rel, W.largest(c, space)) <= self.budget]
            if not options:
                self.decided[(self.threads, self.budget)] = (calls, None)
                return None
            failed: set[T.Aggregate] = set()
            for cuts in options:
                tasks = W.count(cuts, space)
                boxes = _boxes(rel, cuts, space)
                failed = {
                    a for a, node in nodes.items() if not self._inlinable(node, tasks, boxes.get(node, []))
                }
                if not failed:
                    self.decided[(self.threads, self.budget)] = (calls, tuple(cuts.items()))
                    return rel, dict(space), cuts
            ours -= failed
        self.decided[(self.threads, self.budget)] = (calls, None)
        return None

    def _computing(self, root: T.Rel, ours: set[T.Aggregate]) -> tuple[T.Rel, dict[T.Aggregate, T.Aggregate]]:
        """``root`` with the aggregations in ``ours`` computed in it (over their own inputs, as rewritten)
        and every other one stored; and {aggregation of ``ours`` left in it: its node there}."""
        memo: dict[T.Rel, T.Rel] = {}
        nodes: dict[T.Aggregate, T.Aggregate] = {}

        def go(r: T.Rel) -> T.Rel:
            if r not in memo:
                if isinstance(r, T.Aggregate) and r not in ours:
                    memo[r] = self.materialize(r)
                else:
                    memo[r] = T.with_inputs(r, tuple(go(c) for c in T.inputs(r)))
                    if isinstance(r, T.Aggregate):
                        nodes[r] = memo[r]
            return memo[r]

        rel = go(root)
        return rel, {a: node for a, node in nodes.items() if not self.is_stored(a)}

    def _whole(self, rel: T.Rel, space: Mapping[str, int], nodes: list[T.Rel]) -> set[str]:
        """The labels of the last step ``rel`` that, cut in two alone, make two of its tasks compute the same
        blocks of one of ``nodes`` (the aggregations it computes): the labels to leave whole for them."""
        out: set[str] = set()
        for k, n in space.items():
            if n > 1:
                boxes = _boxes(rel, {k: 2}, space)
                if any(not _disjoint(node.schema, boxes.get(node, [])) for node in nodes):
                    out.add(k)
        return out

    def _inlinable(self, agg: T.Aggregate, tasks: int, reached: list[dict[str, tuple[int, int]]]) -> bool:
        """``agg`` (over its inputs as the step computes them) computed in the last step, whose tasks reach it
        with ``reached`` (every wave's key ranges, one entry per way a wave reads it): see ``fused_last``."""
        inner = agg.child.schema
        space = {k: inner.nblocks(k) for k in inner.keys}
        own = self.cuts(agg, space, set(agg.schema.keys))
        if any(c > 1 for k, c in own.items() if k not in agg.schema.keys) or W.count(own, space) > tasks:
            return False
        return bool(reached) and _disjoint(agg.schema, reached)

    def cuts(self, rel: T.Rel, space: Mapping[str, int], free: set[str]) -> dict[str, int]:
        out = self.cuts_keeping(rel, space, free, set())
        assert out is not None  # nothing kept whole: never None
        return out

    def cuts_keeping(
        self, rel: T.Rel, space: Mapping[str, int], free: set[str], whole: set[str]
    ) -> dict[str, int] | None:
        """The step's kernel calls: a task per combination of the blocks of every label it joins (the
        blocks EinDecomp chose for p = the cluster's threads). Past ``CALLS_PER_THREAD`` per thread (blocks
        finer than the plan's tiles: a stored tensor's own blocking, a block-size cap) neighbouring calls
        merge, along summed labels first (fewer partial blocks to combine); never coarser than a worker's
        wave budget allows (``waves.choose_cuts``). Labels in ``whole`` are not cut (None if the budget
        needs them cut)."""
        limit = CALLS_PER_THREAD * self.threads
        fit = W.choose_cuts(rel, space, self.budget, free)
        if any(fit[k] > 1 for k in whole):
            return None
        cuts = {k: 1 if k in whole else n for k, n in space.items()}
        while W.count(cuts, space) > limit:
            pool = [k for k in space if k not in free and cuts[k] > fit[k]]
            pool = pool or [k for k in space if cuts[k] > fit[k]]
            if not pool:
                break
            k = max(pool, key=lambda lab: (cuts[lab], lab))
            cuts[k] = max(fit[k], -(-cuts[k] // 2))
        return cuts

    def sql(self, key: tuple, part: T.Rel, tables: list[str]) -> str:
        """A task's SQL, its relations read as the views ``_ts_in_<i>`` in the order of ``tables``; made once
        per plan (a stage's restricted plans come out the same each run, in the same order)."""
        text = self.memo.get(key)
        if text is None:
            views = {name: _view(i) for i, name in enumerate(tables)}
            ast = sqlgen.to_ast(_renamed(part, views), checks=False)
            text = sqlgen.sql_text(_read_whole(ast, set(views.values())))
            self.memo[key] = text
        return text

    def place(self, needs: list[list[Part]]) -> list[str]:
        """A worker per task: the one already holding most of the bytes the task reads, among those with
        fewer than an even share of the stage's tasks (ties: the least loaded, then the first)."""
        cap = -(-len(needs) // len(self.addrs))
        load = dict.fromkeys(self.addrs, 0)
        rank = {a: i for i, a in enumerate(self.addrs)}
        out: list[str] = [""] * len(needs)
        for i in sorted(range(len(needs)), key=lambda i: -sum(p.nbytes for p in needs[i])):
            local = dict.fromkeys(self.addrs, 0)
            for p in needs[i]:
                if p.worker in local:
                    local[p.worker] += p.nbytes
            free = [a for a in self.addrs if load[a] < cap]
            out[i] = max(free, key=lambda a: (local[a], -load[a], -rank[a]))
            load[out[i]] += 1
        return out

    def stage(
        self, rel: T.Rel, space: Mapping[str, int], cuts: Mapping[str, int], schema: T.Schema, what: str
    ) -> DistRel:
        out = DistRel(schema)
        report = StageReport(what, {})
        tasks: list[tuple[dict[str, tuple[int, int]], T.Rel, dict[str, tuple[T.Schema, list[Part]]]]] = []
        for ranges in W.waves(cuts, space):
            part = W.restrict(rel, ranges)
            inputs: dict[str, tuple[T.Schema, list[Part]]] = {}
            for table, need in _leaf_ranges(part):
                dist = self.rels[table]
                have = inputs.setdefault(table, (dist.schema, []))[1]
                seen = {id(p) for p in have}  # read twice (a self-join): every partition either read needs
                have.extend(p for p in dist.parts if _meets(p.box, need) and id(p) not in seen)
            tasks.append((ranges, part, inputs))
        where = self.place([[p for _, parts in inputs.values() for p in parts] for _, _, inputs in tasks])
        number, self.stages = self.stages, self.stages + 1
        for (ranges, part, inputs), addr in zip(tasks, where, strict=True):
            fed = far = 0
            for dist_schema, parts in inputs.values():
                for p in parts:
                    n = W.box_bytes(dist_schema, p.box)
                    fed, far = fed + n, far + (n if p.worker != addr else 0)
            report.modelled += fed
            report.task_bytes.append((fed, far))
            sql = self.sql((number, tuple(cuts.items()), tuple(ranges.items())), part, list(inputs))
            rels = [DistRel(self.rels[name].schema, columns=self.rels[name].columns) for name in inputs]
            args = [[p.future for p in parts] for _, parts in inputs.values()]
            keys = [[p.future.key for p in parts] for _, parts in inputs.values()]
            box = {k: ranges.get(k, (0, schema.nblocks(k) - 1)) for k in schema.keys}
            nbytes = W.box_bytes(schema, box)
            fut = self.batch.add(self.ex._key("part"), run_part, sql, rels, args, keys, nbytes, worker=addr)
            report.tasks.append(fut.key)
            report.futures.append(fut)
            out.parts.append(Part(fut, box, addr, nbytes))
            report.parts[addr] = report.parts.get(addr, 0) + 1
            report.blocks.setdefault(addr, []).append(_show(ranges) or "all")
        self.reports.append(report)
        return out


def _boxes(rel: T.Rel, cuts: Mapping[str, int], space: Mapping[str, int]) -> dict[T.Rel, list[W.Ranges]]:
    """The key ranges at which each node under ``rel`` is read by the tasks of ``cuts``, one entry per
    task and per way it reads the node."""
    out: dict[T.Rel, list[W.Ranges]] = {}
    for ranges in W.waves(cuts, space):
        for node, got in W.ranges_at(rel, ranges).items():
            out.setdefault(node, []).extend(got)
    return out


def _disjoint(schema: T.Schema, reached: list[W.Ranges]) -> bool:
    """Whether no two of ``reached`` (key ranges of a relation of ``schema``; a key not named: all of its
    blocks) share a block."""
    boxes = [{k: got.get(k, (0, schema.nblocks(k) - 1)) for k in schema.keys} for got in reached]
    return not any(
        all(a[k][0] <= b[k][1] and b[k][0] <= a[k][1] for k in schema.keys)
        for i, a in enumerate(boxes)
        for b in boxes[i + 1 :]
    )


def _renamed_parts(done: DistRel, root: T.Rel, columns: Mapping[str, str]) -> DistRel:
    """A stage's partitions read as ``root``, the renames on top of its step (``columns``: key of ``root``
    -> key of the stage), without a stage of their own."""
    parts = [
        Part(p.future, {k: p.box[c] for k, c in columns.items()}, p.worker, p.nbytes) for p in done.parts
    ]
    return DistRel(root.schema, parts, dict(columns))


def _renames(rel: T.Rel) -> tuple[T.Rel, dict[str, str]]:
    """``rel`` without the key renames on top of it (Positional, a Relabel without repeated labels), and
    {key of ``rel``: key of what is below them}."""
    columns = {k: k for k in rel.schema.keys}
    while True:
        if isinstance(rel, T.Positional):
            step = dict(zip(rel.schema.keys, rel.child.schema.blob, strict=True))
        elif isinstance(rel, T.Relabel) and len(set(rel.labels)) == len(rel.labels):
            step = dict(zip(rel.labels, rel.child.schema.keys, strict=True))
        else:
            return rel, columns
        if set(step.values()) != set(rel.child.schema.keys):
            return rel, columns
        columns = {k: step[c] for k, c in columns.items()}
        rel = rel.child


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _show(ranges: Mapping[str, tuple[int, int]]) -> str:
    """A task's blocks: ``i=0..1,k=2`` (label, first..last block)."""
    return ",".join(f"{k}={lo}" if lo == hi else f"{k}={lo}..{hi}" for k, (lo, hi) in ranges.items())


def start(workers: int, threads_per_worker: int, memory_limit: int | str | None = None) -> tuple[Any, Any]:
    """A LocalCluster of ``workers`` processes (``memory_limit`` each, else Dask's default: the machine's
    memory shared among them) and its Client; prints the dashboard's address."""
    for value, what in ((workers, "workers"), (threads_per_worker, "threads_per_worker")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"{what}={value!r} must be a positive int")
    limit: int | str = "auto"
    if memory_limit is not None:
        limit = memory.parse_size(memory_limit, "worker_memory_limit")
        if limit < MIN_WORKER_MEMORY:  # the nanny would restart an idle worker over and over
            raise ConfigError(
                f"worker_memory_limit={memory_limit!r} is below the {MIN_WORKER_MEMORY >> 20} MiB a worker "
                "needs: a Dask worker process with tensorsql loaded holds ~200 MB before any data"
            )
    try:
        cluster = distributed.LocalCluster(
            n_workers=workers,
            threads_per_worker=threads_per_worker,
            processes=True,
            dashboard_address=":0",
            memory_limit=limit,
        )
    except Exception as exc:  # a worker that cannot start, Dask's event loop after a failed attach, ...
        # the workers are new processes that import the main module: a script run without the main guard
        # starts a cluster again in each of them, where Dask says only "Nanny failed to start"
        guard = (
            "; this is a worker process importing the main module: a script that starts a cluster must do "
            'so under `if __name__ == "__main__":`'
            if "__mp_main__" in sys.modules  # the main module imported again, in a spawned process
            else ""
        )
        raise ConfigError(
            f"could not start a local Dask cluster of {workers} workers: {type(exc).__name__}: {exc}{guard}"
        ) from exc
    try:
        client = distributed.Client(cluster)
    except BaseException:
        cluster.close()
        raise
    _prompt(client)
    try:  # the scheduler is this session's own: its streams to the workers, also to those that join later
        client.register_plugin(_PromptStreams(), name=_PromptStreams.name)
    except Exception as exc:  # only slower: every message still arrives
        log.info("tensorsql: cannot shorten the scheduler's stream intervals: %s", exc)
    print(f"tensorsql: Dask dashboard at {cluster.dashboard_link}", file=sys.stderr)
    return client, cluster


_shorten = worker_side.shorten


def _prompt(client: Any) -> None:
    """The client's stream to the scheduler, shortened."""
    _shorten(getattr(client, "scheduler_comm", None))


class _PromptStreams(distributed.SchedulerPlugin):
    """On a LocalCluster's scheduler (this session's own, not an attached one, which others share): its
    streams to the workers and to the clients hold a message for ``STREAM_INTERVAL`` at most (a stage's
    second task done within Dask's 2 ms of the first reached the client that much later)."""

    name = "tensorsql-streams"

    def start(self, scheduler: Any) -> None:
        for address in list(scheduler.stream_comms):
            self.add_worker(scheduler, address)
        for client in list(scheduler.client_comms):
            self.add_client(scheduler, client)

    def add_client(self, scheduler: Any = None, client: str = "") -> None:
        # Dask tells its plugins of a client before it makes the client's stream: shortened once the
        # scheduler's loop comes back to it
        loop = getattr(scheduler, "loop", None)
        if loop is None:
            _shorten(scheduler.client_comms.get(client))
        else:
            loop.add_callback(lambda: _shorten(scheduler.client_comms.get(client)))

    def add_worker(self, scheduler: Any = None, worker: str = "") -> None:
        _shorten(scheduler.stream_comms.get(worker))


#: seconds to wait for a scheduler's answer
ATTACH_TIMEOUT = 10


def attach(cluster: object) -> Any:
    """A Client of a running scheduler (``"tcp://host:8786"``) or the given ``distributed.Client``."""
    if isinstance(cluster, distributed.Client):
        return cluster
    if not isinstance(cluster, str) or not cluster.strip():
        raise ConfigError(f"cluster={cluster!r} must be a scheduler address ('tcp://host:8786') or a Client")
    try:
        client = distributed.Client(cluster, timeout=ATTACH_TIMEOUT)
    except (OSError, TimeoutError, ValueError, TypeError) as exc:  # TypeError: tls:// without a TLS context
        raise ConfigError(f"cannot reach the Dask scheduler at {cluster!r}: {exc}") from exc
    _prompt(client)  # the session's own client (a Client passed in is the caller's, left as it is)
    return client


__all__ = ["DaskExecutor", "attach", "start"]
