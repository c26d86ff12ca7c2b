"""The plan cache: repeated calls of one shape skip parsing, planning, lowering and SQL generation.

Keyed by (equation, operand shapes, dtypes, blockings, options); an entry holds the graph's array-operand
leaves in operand order and the finished plan, so a hit only binds the new arrays to the plan's leaves. The
executor keeps its own per-plan state (generated and prepared statements) for as long as the plan lives here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from tensorsql.compile.plan import Plan
from tensorsql.ir import expr as E

#: entries a session keeps (least recently used first out)
CACHE_SIZE = 256


@dataclass(frozen=True, eq=False)
class Entry:
    """A cached call: ``leaves[i]`` is the Operand that operand ``i`` binds to (None for a relation)."""

    leaves: tuple[E.Operand | None, ...]
    plan: Plan
    #: what the call does after the plan's result (e.g. numpy's result dtype), by the front end
    extra: Hashable = None


class PlanCache:
    """A bounded LRU map from call keys to ``Entry``; thread-safe."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> Entry | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: Hashable, entry: Entry) -> Entry:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return entry

    def get_or_build(self, key: Hashable, build: Callable[[], Entry]) -> Entry:
        entry = self.get(key)
        return entry if entry is not None else self.put(key, build())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


def hashable(value: object) -> Hashable | None:
    """``value`` as a cache-key part, or None when it has no stable value (an optimizer object, an array)."""
    if isinstance(value, float):  # by its text: -0.0 and 0.0 are equal, but a scale by them differs
        return ("float", repr(value))
    if value is None or isinstance(value, str | int | bool):
        return (type(value).__name__, value)
    if isinstance(value, list | tuple):
        parts = [hashable(v) for v in value]
        return None if any(p is None for p in parts) else ("seq", tuple(parts))
    if isinstance(value, dict):
        items = [(hashable(k), hashable(v)) for k, v in value.items()]
        if any(k is None or v is None for k, v in items):
            return None
        return ("map", tuple(sorted(items, key=repr)))
    return None


__all__ = ["CACHE_SIZE", "Entry", "PlanCache", "hashable"]
