"""Each Dask worker's own DuckDB with the kernels: a ``WorkerPlugin`` sets it up on every worker, also one
that joins later, and a task reaches it with ``worker_executor()``.

A worker's DuckDB is a ``DuckDBExecutor``, the single-process executor itself, so a stage runs on a worker
with the same SQL generation, checks and kernels as in one process. Many DuckDBs on one machine each default
to ~80% of its memory and all its cores, and together get killed: each worker's DuckDB takes the Dask
worker's own thread count, and a memory_limit of ``MEMORY_SHARE`` of the worker's own limit (the rest is
Dask's: task results, transfers).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import logging
import os
import sys
from typing import Any

from tensorsql.backends.dask import require_distributed
from tensorsql.backends.dask.prepared import PreparedTasks
from tensorsql.backends.duckdb import memory
from tensorsql.errors import ExtensionError

#: imported when this module is (only a cluster session imports it): a helpful error when missing
distributed = require_distributed()

#: the attribute of a ``distributed.Worker`` that holds its executor
ATTRIBUTE = "tensorsql_executor"
#: the attribute of a ``distributed.Worker`` that holds its executor's prepared tasks (``prepared``)
PREPARED = "tensorsql_prepared"
#: the plugin's name on the cluster (registering it again replaces it)
NAME = "tensorsql"
#: the attribute of a ``distributed.Worker`` that says whether its DuckDB spills to a file (``spill``)
SPILL = "tensorsql_spill"
#: the share of a Dask worker's memory limit its DuckDB (and its kernels' budget) may use
MEMORY_SHARE = 0.6
#: seconds a Dask batched stream holds a message after the one before it, on the streams this session owns.
#: Dask's own are 10 ms (client to scheduler), 5 ms (scheduler to a worker) and 2 ms (a worker to the
#: scheduler, the scheduler to a client): a run's graph sent within 10 ms of the last run's released keys
#: waited out the rest, and a stage's task for a worker just sent the last run's frees reached it up to 5 ms
#: after the others (~6 ms of a 70 ms chain: benchmarks/RESULTS.md)
STREAM_INTERVAL = 0.001


def shorten(stream: Any) -> None:
    """A Dask batched stream (None: gone) holds a message for ``STREAM_INTERVAL`` at most."""
    if stream is not None and hasattr(stream, "interval"):
        stream.interval = STREAM_INTERVAL


def worker_limits(nthreads: int, worker_limit: int | None, workers_here: int = 1) -> tuple[int, int]:
    """(threads, memory_limit bytes) of a worker's DuckDB: the worker's threads, and ``MEMORY_SHARE`` of its
    memory limit; a worker without one (``memory_limit=0``) gets that share of this machine's memory divided
    among the ``workers_here`` workers of the machine."""
    if worker_limit is None or worker_limit <= 0:
        worker_limit = memory.system_memory() // max(1, workers_here)
    return max(1, int(nthreads)), max(memory.MIN_MEMORY_LIMIT, int(worker_limit * MEMORY_SHARE))


class TensorSQLWorker(distributed.WorkerPlugin):
    """The plugin: ``client.register_plugin(TensorSQLWorker(), name=NAME)``. ``spill``: the worker's DuckDB
    is a database file under the worker's local directory (DuckDB spills beside it), else in memory.
    ``settle``: the worker is a process of a LocalCluster the session started, whose heap it may freeze
    (``settle_heap``) and whose stream to the scheduler it may shorten (``shorten``); never a worker of an
    attached cluster, which others share and which may even run in the user's own process
    (``LocalCluster(processes=False)``). ``transition``: a key the worker lets go takes the prepared tasks
    reading it along (``prepared``)."""

    name = NAME

    def __init__(self, spill: bool = False, workers_here: int = 1, settle: bool = False) -> None:
        self.spill = spill
        self.workers_here = workers_here
        self.settle = settle
        self._worker: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_worker": None}

    def setup(self, worker: Any) -> None:
        """Every session that attaches registers the plugin again: a worker keeps the DuckDB it has (other
        sessions' tasks may be running on it) where it was made alike; one made otherwise (``spill``)
        is replaced, and the old one closes when the last task holding it lets go (not under it)."""
        from tensorsql.backends.duckdb.executor import DuckDBExecutor

        self._worker = worker
        _hear_spills(worker)
        _trim_when_paused(worker)
        old = getattr(worker, ATTRIBUTE, None)
        if old is not None and not old.closed and getattr(worker, SPILL, None) == self.spill:
            return
        threads, limit = worker_limits(
            worker.state.nthreads, worker.memory_manager.memory_limit, self.workers_here
        )
        database, temp = ":memory:", None
        if self.spill:
            folder = os.path.join(worker.local_directory, "tensorsql")
            os.makedirs(folder, exist_ok=True)
            database, temp = os.path.join(folder, "worker.duckdb"), os.path.join(folder, "spill")
        executor = DuckDBExecutor(
            database, threads=threads, memory_limit=limit, temp_directory=temp, progress=False
        )
        _close_prepared(worker)  # the replaced DuckDB's cursors
        setattr(worker, ATTRIBUTE, executor)
        setattr(worker, PREPARED, PreparedTasks(executor.con))
        setattr(worker, SPILL, self.spill)
        if old is None and self.settle:
            shorten(getattr(worker, "batched_stream", None))  # its task-done messages to the scheduler
            settle_heap()
        elif old is not None and gc.get_freeze_count():
            gc.unfreeze()  # the replaced DuckDB was frozen with the heap: collectable again once let go

    def teardown(self, worker: Any) -> None:
        """Closes the worker's DuckDB when the worker closes. A plugin replaced (a session attaching) or
        removed while the worker runs leaves it to the tasks running on it and to the next setup."""
        if getattr(worker.status, "name", "closing") not in ("closing", "closed", "failed"):
            return
        executor = getattr(worker, ATTRIBUTE, None)
        setattr(worker, ATTRIBUTE, None)
        _close_prepared(worker)
        if executor is not None:
            try:
                executor.close()
            except Exception as exc:  # a query still running on it (a worker closing mid-task)
                logging.getLogger("tensorsql").warning(
                    "tensorsql: worker %s: could not close its DuckDB: %s", worker.address, exc
                )

    def transition(self, key: Any, start: str, finish: str, *args: Any, **kwargs: Any) -> None:
        """A key the worker lets go: the prepared tasks reading it go too (they hold its table)."""
        if finish in ("released", "forgotten") and self._worker is not None:
            prepared = getattr(self._worker, PREPARED, None)
            if prepared is not None:
                prepared.released(key)


#: milliseconds between looks at whether Dask paused the worker for memory (``_trim_when_paused``)
TRIM_EVERY_MS = 250
#: the worker's periodic callback that gives freed memory back while it is paused
TRIM_CALLBACK = "tensorsql-trim"


def _trim_when_paused(worker: Any) -> None:
    """While Dask has the worker paused for memory (over 80% of its limit by default), the memory its
    allocators keep after freeing (pyarrow's pool, glibc's heap) is given back every
    ``TRIM_EVERY_MS``: otherwise, once Dask has spilled all it holds, a paused worker can keep enough of such
    memory never to go under the threshold again, and the query waits forever."""
    callbacks = getattr(worker, "periodic_callbacks", None)
    if not isinstance(callbacks, dict) or TRIM_CALLBACK in callbacks:
        return
    from tornado.ioloop import PeriodicCallback

    def look() -> None:
        if getattr(worker.status, "name", "") == "paused":
            release_memory()

    pc = PeriodicCallback(look, TRIM_EVERY_MS)
    callbacks[TRIM_CALLBACK] = pc
    pc.start()


def release_memory() -> None:
    """Freed memory the process's allocators keep, given back to the system (what there is to give)."""
    import ctypes
    import ctypes.util

    import pyarrow as pa

    with contextlib.suppress(Exception):
        pa.default_memory_pool().release_unused()
    libc = ctypes.util.find_library("c")
    if libc and sys.platform.startswith("linux"):
        with contextlib.suppress(Exception):
            ctypes.CDLL(libc).malloc_trim(0)


#: the attribute of a ``distributed.Worker`` that says its spill buffer tells the prepared tasks of spills
SPILL_HOOK = "tensorsql_spill_hook"


def _hear_spills(worker: Any) -> None:
    """A key Dask spills to disk takes the prepared tasks reading it along: they hold its table, which would
    stay in memory behind Dask's back (a spill is no key transition; workers paused, queries hung)."""
    callbacks = getattr(getattr(worker, "data", None), "fast_to_slow_callbacks", None)
    if not isinstance(callbacks, list) or getattr(worker, SPILL_HOOK, False):
        return  # no spill buffer (no memory limit): nothing is ever spilled

    def spilled(key: Any, value: Any) -> None:
        prepared = getattr(worker, PREPARED, None)
        if prepared is not None:
            try:
                prepared.released(key)
            except Exception as exc:  # never fail Dask's spill
                logging.getLogger("tensorsql").warning("tensorsql: prepared tasks of a spilled key: %s", exc)

    callbacks.append(spilled)
    setattr(worker, SPILL_HOOK, True)


def _close_prepared(worker: Any) -> None:
    prepared = getattr(worker, PREPARED, None)
    setattr(worker, PREPARED, None)
    if prepared is not None:
        prepared.close()


def prepared_tasks(executor: Any) -> PreparedTasks | None:
    """In a task: the prepared tasks of the worker's DuckDB ``executor`` (None on a worker without them)."""
    prepared = getattr(distributed.get_worker(), PREPARED, None)
    if prepared is None or prepared.closed or prepared.con is not executor.con:
        return None
    return prepared


def settle_heap() -> None:
    """Moves the objects a worker holds once set up (Dask's, tensorsql's, DuckDB's Python layer: ~100k) out
    of the garbage collector's reach, after a last collection. A full collection scanned them all, ~50 ms,
    holding the GIL that a running task's Arrow scans wait for: one task in twenty of the square chain took
    twice its time (benchmarks/RESULTS.md). They live as long as the worker; reference counting still frees
    any of them let go, only a cycle among them would stay."""
    gc.collect()
    gc.freeze()
    # given back as the process ends, so its last collection finalizes them: DuckDB's bindings report every
    # object of theirs never finalized ("nanobind: leaked 28 instances!")
    atexit.register(gc.unfreeze)


def worker_executor() -> Any:
    """The DuckDB executor of the worker running the current task; ExtensionError on a worker the plugin
    did not set up (a worker of another cluster, or one whose setup failed)."""
    try:
        worker = distributed.get_worker()
    except ValueError as exc:
        raise ExtensionError("worker_executor() runs inside a task on a Dask worker") from exc
    executor = getattr(worker, ATTRIBUTE, None)
    if executor is None or executor.closed:
        raise ExtensionError(
            f"Dask worker {worker.address} has no tensorsql DuckDB: register the plugin "
            f"(client.register_plugin(tensorsql.backends.dask.worker.TensorSQLWorker()))"
        )
    return executor


#: the attribute of a ``distributed.Worker`` holding {task key: (bytes fed to it, bytes from other workers)}
MOVED = "tensorsql_moved"
#: tasks a worker keeps counts of
KEEP_COUNTS = 100_000


def count_moved(inputs: list[tuple[Any, Any]]) -> None:
    """In a task: records the bytes of all its inputs ((Dask key, Arrow table)), the quantity the planner's
    cost model counts, and of those Dask fetched from other workers (a dependency this worker did not compute
    and was not given: it has no run_spec here)."""
    worker = distributed.get_worker()
    state = worker.state.tasks
    fed = fetched = 0
    for key, table in inputs:
        fed += int(table.nbytes)
        ts = state.get(key)
        if ts is not None and ts.run_spec is None:
            fetched += int(table.nbytes)
    moved = getattr(worker, MOVED, None)
    if moved is None:
        moved = {}
        setattr(worker, MOVED, moved)
    moved[str(worker.get_current_task())] = (fed, fetched)
    while len(moved) > KEEP_COUNTS:  # nobody read them (the client reads them only when asked): oldest out
        try:  # tasks on the worker's other threads drop the same oldest one at once
            del moved[next(iter(moved))]
        except (KeyError, RuntimeError, StopIteration):
            break


def take_moved(dask_worker: Any) -> dict[str, tuple[int, int]]:
    """``client.run`` target: the worker's counts, cleared."""
    moved = getattr(dask_worker, MOVED, None) or {}
    setattr(dask_worker, MOVED, {})
    return dict(moved)


def wave_budget(dask_worker: Any) -> int | None:
    """``client.run`` target: the wave budget of the worker's DuckDB (None before the plugin set it up)."""
    executor = getattr(dask_worker, ATTRIBUTE, None)
    return None if executor is None or executor.closed else int(executor.wave_budget)
