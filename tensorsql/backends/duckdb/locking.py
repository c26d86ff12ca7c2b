"""The executor's connection lock, and the clean-ups that must never wait for it.

A relation's view, a temporary table or a prepared statement is dropped by a finalizer when Python collects
its owner, and a collection runs on whatever thread happens to allocate: also on a long query's worker
thread (``longrun``), while the caller holds the lock and waits for that worker. A finalizer that waited for
the lock there would wait forever, and Ctrl-C could not end it. So a clean-up takes the lock only when it is
free, as its outermost holder; otherwise it is queued, and the thread holding the lock runs the queue as it
lets go of its outermost hold (with the lock still held, so no statement runs between).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable

#: a clean-up: a function of the lock holder's and the name it drops
Cleanup = tuple[Callable[[str], None], str]


class ConnectionLock:
    """A reentrant lock whose outermost release first runs the clean-ups queued while it was held
    (``later``). ``ready()`` says whether they may run now (not while a result is being streamed)."""

    def __init__(self, ready: Callable[[], bool]) -> None:
        self._lock = threading.RLock()
        self._depth = 0  # changed only by the thread holding the lock
        #: a deque: appended from any thread, popped by the holder, each one atomic under the GIL
        self._queue: collections.deque[Cleanup] = collections.deque()
        self._ready = ready

    def acquire(self, blocking: bool = True) -> bool:
        got = self._lock.acquire(blocking)
        if got:
            self._depth += 1
        return got

    def release(self) -> None:
        outermost = self._depth == 1
        try:
            if outermost:
                self.run_queued()
        finally:
            self._depth -= 1
            self._lock.release()
        if outermost and self._queue and self._ready() and self.acquire(blocking=False):
            self.release()  # queued after this thread looked, by one that could not take the lock then

    def __enter__(self) -> ConnectionLock:
        self.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def later(self, clean: Callable[[str], None], name: str) -> None:
        """Queues ``clean(name)`` for the lock's holder (or for this thread's own outermost release)."""
        self._queue.append((clean, name))

    def run_queued(self) -> None:
        """Runs the queued clean-ups (the caller holds the lock); each logs its own failure."""
        while self._queue and self._ready():
            try:
                clean, name = self._queue.popleft()
            except IndexError:
                return
            clean(name)

    def run_or_queue(self, clean: Callable[[str], None], name: str) -> None:
        """``clean(name)`` with the lock held, by the outermost release of it: now when the lock is free;
        later when another thread holds it (never waiting for that thread), or when this one does (it may be
        inside a statement or a transaction of tensorsql's, which a ROLLBACK would take the clean-up back
        with)."""
        self.later(clean, name)
        if self.acquire(blocking=False):
            self.release()


__all__ = ["ConnectionLock"]
