"""The plan caches: repeated calls of one shape skip parsing, planning, lowering and SQL generation.

``ts.einsum``'s cache is keyed by (equation, operand shapes, dtypes, blockings, options); an entry holds the
graph's array-operand leaves in operand order and the finished plan, so a hit only binds the new arrays to the
plan's leaves. A session caches the graphs of its lazy ``einsum`` calls the same way, and the plan of each
graph node (by identity) with its options, so a lazy relation made again from the same call runs its cached
plan. The executor keeps its own per-plan state (generated and prepared statements) for as long as the plan
lives here.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Generic, TypeVar

from tensorsql.compile.plan import Plan
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    import numpy as np

#: entries a session keeps (least recently used first out)
CACHE_SIZE = 256


@dataclass(frozen=True, eq=False)
class Entry:
    """A cached call: ``leaves[i]`` is the Operand that operand ``i`` binds to (None for a relation)."""

    leaves: tuple[E.Operand | None, ...]
    plan: Plan
    #: what the call does after the plan's result (e.g. numpy's result dtype), by the front end
    extra: Hashable = None


@dataclass(eq=False)
class GraphEntry:
    """A lazy einsum call's graph over arrays alone: the node, the Operand leaf of each operand (None for a
    relation), the plan options, and the plans made of it so far, by (strategy, p, engine profile).
    Relations made from the entry share its graph and bind its leaves to their own arrays."""

    node: E.Node
    leaves: tuple[E.Operand | None, ...]
    options: object
    plans: dict[tuple[object, ...], Plan] = field(default_factory=dict)


V = TypeVar("V")


class LRUCache(Generic[V]):
    """A bounded LRU map from hashable keys to values; thread-safe."""

    def __init__(self, size: int = CACHE_SIZE) -> None:
        self.size = size
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0

    def get(self, key: Hashable) -> V | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(key)
            self.hits += 1
            return entry

    def put(self, key: Hashable, entry: V) -> V:
        with self._lock:
            self._entries[key] = entry
            self._entries.move_to_end(key)
            while len(self._entries) > self.size:
                self._entries.popitem(last=False)
        return entry

    def get_or_build(self, key: Hashable, build: Callable[[], V]) -> V:
        entry = self.get(key)
        return entry if entry is not None else self.put(key, build())

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)


class PlanCache(LRUCache[Entry]):
    """Calls' keys to their ``Entry`` (leaves and plan)."""


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


def einsum_key(
    inputs: list[list[object]],
    output: list[object] | None,
    operands: list[object],
    arrays: dict[int, np.ndarray],
    names: dict[int, str],
    *options: object,
) -> Hashable | None:
    """The key of a lazy einsum call's graph (``Session._graphs``): its subscripts, each array operand's shape
    and dtype, each relation operand's node (by identity), and the options; None when an option has no
    stable value (an optimizer object): such calls are not cached."""
    opts = hashable(list(options))
    if opts is None:
        return None
    ops = tuple(
        (arrays[i].shape, names[i]) if i in arrays else op.node  # type: ignore[attr-defined]
        for i, op in enumerate(operands)
    )
    terms = tuple(tuple(t) for t in inputs)
    return ("einsum", terms, None if output is None else tuple(output), ops, opts)


__all__ = ["CACHE_SIZE", "Entry", "GraphEntry", "LRUCache", "PlanCache", "einsum_key", "hashable"]
