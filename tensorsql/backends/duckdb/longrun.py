"""Long queries: Ctrl-C that stops them promptly, and a smooth progress bar.

A query runs on the calling thread when its estimated work is short (:func:`is_long` is False): no thread
hand-off, so small calls stay as cheap as a DuckDB round trip. A long one runs through :func:`run_long`: the
query executes on a worker thread while the calling (main) thread waits in short intervals, where Python
delivers SIGINT. On Ctrl-C it interrupts DuckDB (``con.interrupt()``) and sets the kernels' cancellation flag
(``udf_kernels.control``): the kernels stop at their next check (a GEMM K panel, a tile, a row, a step of a
fused tree: well under a second), so the worker returns promptly; then the flag is cleared and
``KeyboardInterrupt`` is raised. Before, a DuckDB query only noticed the signal when it ended, and raised
``RuntimeError: Query interrupted``.

While it waits, the main thread draws a progress bar on stderr (when it is a terminal) from the kernels'
counter of finished flops against the plan's estimate (:func:`plan_flops`), every ~0.1 s. DuckDB's own bar
follows its source scans, which a tensor query, a few huge rows, passes in a few jumps; it is switched off
for the queries that run here. :func:`progress_enabled` resolves the setting: an explicit ``progress=``
first, then ``TENSORSQL_PROGRESS=0/1``, then whether stderr is a terminal.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeVar

import duckdb

from tensorsql.ir import expr as E
from udf_kernels import control

T = TypeVar("T")

#: estimated run time below which a query runs on the calling thread (no hand-off to a worker)
MIN_SECONDS = 0.05
#: seconds per GEMM flop on one thread (the planner's default cost model: 14 ps)
FLOP_SECONDS = 14e-12
#: the generic strided loop (joins other than multiply/sum) costs this many GEMM flops per flop it counts
LOOP_WEIGHT = 30.0
#: how often the waiting thread wakes (Ctrl-C is delivered at once; this paces the bar)
POLL_SECONDS = 0.1
#: the bar shows only for queries that run at least this long (no flicker on short ones)
BAR_AFTER_SECONDS = 0.3
#: DuckDB's error for a query that ``con.interrupt()`` (or its own SIGINT check) stopped
_DUCKDB_INTERRUPTED = ("Query interrupted", "INTERRUPT Error", "Interrupted!")


def plan_work(root: E.Node) -> tuple[float, float]:
    """The work of an expression graph in flops, counted as the kernels count it (``control.hpp``): 2 per
    element pair of every binary einsum (the product of its label sizes), nothing for unary steps, maps and
    repartitions (memory-bound). Returned twice: as counted (the progress bar's total), and weighted for
    estimating time (:func:`is_long`), where joins other than multiply/sum (the generic loop, not GEMM)
    count ``LOOP_WEIGHT`` times. One walk of the graph (a few microseconds: it runs for every query)."""
    flops = weighted = 0.0
    seen: set[int] = set()
    stack = [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, E.EinSum):
            stack.extend(node.inputs)
            if len(node.inputs) == 2:
                size: dict[int, int] = {}
                for labels, operand in zip(node.in_labels, node.inputs, strict=True):
                    for lab, n in zip(labels, operand.shape, strict=True):
                        if n > size.get(lab, 1):
                            size[lab] = n
                f = 2.0 * math.prod(size.values())
                flops += f
                weighted += f if node.join == "multiply" and node.agg == "sum" else f * LOOP_WEIGHT
        elif not isinstance(node, E.Source):
            stack.extend(E.children(node))
    return flops, weighted


def plan_flops(root: E.Node) -> float:
    """The flops of an expression graph as the kernels count them (:func:`plan_work`)."""
    return plan_work(root)[0]


def is_long(
    flops: float,
    threads: int = 1,
    *,
    flop_seconds: float = FLOP_SECONDS,
    min_seconds: float = MIN_SECONDS,
) -> bool:
    """Whether ``flops`` of work (``plan_work(root)[1]``) over ``threads`` threads is estimated
    to take ``min_seconds`` or more: then the query runs through :func:`run_long`, otherwise directly."""
    return flops * flop_seconds / max(1, threads) >= min_seconds


def progress_enabled(option: bool | None = None, stream: IO[str] | None = None) -> bool:
    """Whether long queries draw a progress bar: ``option`` when given (the session's ``progress=``), else
    ``TENSORSQL_PROGRESS`` (``0``/``1``) when set, else whether ``stream`` (stderr) is a terminal."""
    if option is not None:
        return bool(option)
    env = os.environ.get("TENSORSQL_PROGRESS", "").strip().lower()
    if env in ("0", "false", "no", "off"):
        return False
    if env in ("1", "true", "yes", "on"):
        return True
    return _isatty(sys.stderr if stream is None else stream)


def is_interrupt(exc: BaseException) -> bool:
    """Whether an error from a query means it was interrupted: a cancelled kernel's (``control.MARKER``), or
    DuckDB's own interrupt."""
    if isinstance(exc, duckdb.InterruptException) or control.is_interrupted(exc):
        return True
    return isinstance(exc, duckdb.Error | RuntimeError) and any(m in str(exc) for m in _DUCKDB_INTERRUPTED)


def run_direct(fn: Callable[[], T]) -> T:
    """Runs ``fn`` on this thread (a short query); an interrupted query raises KeyboardInterrupt."""
    try:
        return fn()
    except Exception as exc:
        if is_interrupt(exc):
            raise KeyboardInterrupt from exc
        raise


def run_long(
    con: Any,
    token: int,
    lib_path: Path | str,
    fn: Callable[[], T],
    *,
    total_work: float,
    progress: bool,
    stream: IO[str] | None = None,
) -> T:
    """Runs ``fn`` (which executes a query on DuckDB connection ``con``) on a worker thread and returns its
    result, while this thread waits and, when ``progress`` and ``stream`` (stderr) is a terminal, draws a bar
    of the kernels' finished work against ``total_work`` flops.

    ``token`` is the kernel state of ``con``'s database (``udf_kernels.control.db_token``), ``lib_path`` the
    loaded extension. On Ctrl-C while waiting, the query is interrupted (``con.interrupt()``) and the kernels
    cancelled; this returns only after the worker has finished (a result sink the query writes stays lent
    until then), clears the flag and raises KeyboardInterrupt. A query that failed as interrupted raises
    KeyboardInterrupt too; any other error of ``fn`` is raised as it is.

    Ctrl-C never raises inside this function: on the main thread, SIGINT's handler is wrapped for its
    duration, and what the previous handler raises (KeyboardInterrupt for Python's default) is recorded and
    raised once the worker is done. An exception landing between two statements could otherwise escape
    while the worker still runs (Thread.start() itself waits in Python code).
    """
    control.reset(lib_path, token)
    con.execute("SET enable_progress_bar = false")  # ours replaces DuckDB's (or there is none)
    out = sys.stderr if stream is None else stream
    bar = _Bar(out, total_work) if progress and _isatty(out) else None
    # The worker hands its outcome over a SimpleQueue, not Thread.join: before Python 3.13 an exception
    # inside join() can mark a running thread as stopped (the bpo-45274 handling releases the thread's own
    # lock), and then join() would return while the query still runs and still writes into its result.
    done: queue.SimpleQueue[object] = queue.SimpleQueue()
    raised: list[BaseException] = []  # what Ctrl-C raised (the previous SIGINT handler's exception)

    def work() -> None:
        try:
            outcome = (True, fn())
        except BaseException as exc:  # handed to the waiting thread
            outcome = (False, exc)
        done.put(outcome)

    def on_sigint(signum: int, frame: Any) -> None:
        try:
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                raise KeyboardInterrupt
        except BaseException as exc:
            raised.append(exc)
            done.put(_WAKE)  # wakes the waiting get() at once

    previous = _swap_sigint(on_sigint)
    try:
        threading.Thread(target=work, name="tensorsql-query", daemon=True).start()
        cancelled = False
        while True:
            try:
                item = done.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if bar is not None and not raised:
                    with contextlib.suppress(Exception):  # nothing may leave the loop but the worker's end
                        bar.update(control.progress(lib_path, token))
                continue
            if item is not _WAKE:
                break
            if not cancelled:
                cancelled = True
                with contextlib.suppress(Exception):
                    con.interrupt()
                control.cancel(lib_path, token)
    finally:
        if previous is not _NOT_SWAPPED:
            signal.signal(signal.SIGINT, previous)
        if bar is not None:
            bar.close()
    ok, value = item
    if raised or (not ok and is_interrupt(value)):
        control.reset(lib_path, token)
        if raised and not isinstance(raised[0], KeyboardInterrupt):
            raise raised[0]
        raise KeyboardInterrupt from None
    if not ok:
        raise value
    return value


_WAKE = object()
_NOT_SWAPPED = object()


def _swap_sigint(handler: Callable[[int, Any], None]) -> Any:
    """Installs ``handler`` for SIGINT and returns the previous handler; _NOT_SWAPPED off the main thread
    (where Python delivers no signals) or when the previous one is not Python's (then it stays)."""
    if threading.current_thread() is not threading.main_thread():
        return _NOT_SWAPPED
    previous = signal.getsignal(signal.SIGINT)
    if previous is None:  # installed outside Python: leave it alone
        return _NOT_SWAPPED
    signal.signal(signal.SIGINT, handler)
    return previous


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):
        return False


class _Bar:
    """A one-line progress bar: drawn after BAR_AFTER_SECONDS, eased toward the counter's fraction so the
    kernels' steps show as motion rather than jumps, never moving back; erased by close()."""

    WIDTH = 30

    def __init__(self, stream: IO[str], total_work: float) -> None:
        self.stream = stream
        self.total = max(float(total_work), 1.0)
        self.start = time.perf_counter()
        self.shown = 0.0
        self.drawn = False

    def update(self, counters: tuple[float, float] | None) -> None:
        elapsed = time.perf_counter() - self.start
        if counters is None or elapsed < BAR_AFTER_SECONDS:
            return
        done, announced = counters
        target = min(done / max(self.total, announced), 1.0)
        if target > self.shown:
            self.shown += max(0.5 * (target - self.shown), min(0.01, target - self.shown))
        filled = int(self.shown * self.WIDTH)
        line = f"tensorsql [{'#' * filled}{'.' * (self.WIDTH - filled)}] {self.shown:4.0%} {elapsed:6.1f} s"
        if self.shown >= 0.05:
            line += f"  ~{elapsed * (1 - self.shown) / self.shown:5.1f} s left"
        self._write("\r" + line + "\x1b[K")
        self.drawn = True

    def close(self) -> None:
        if self.drawn:
            self._write("\r\x1b[K")
            self.drawn = False

    def _write(self, text: str) -> None:
        try:
            self.stream.write(text)
            self.stream.flush()
        except (OSError, ValueError):  # a closed or broken stderr: no bar
            pass
