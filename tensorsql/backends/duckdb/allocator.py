"""Process allocator settings for block-sized buffers (glibc only).

A block result leaves DuckDB through buffers that DuckDB allocates with ``malloc``: the aggregate's result
blob, the Arrow export. glibc serves every allocation above its mmap threshold (at most 32 MiB by default),
and any allocation too big for a thread arena's 64 MiB heap, with a fresh ``mmap``, so each 64 MiB result is
copied into memory that faults in one 4 KiB page at a time; on the project's VM that fills memory at ~1 GB/s
where reused memory takes ~5 GB/s (a 64 MiB Arrow export: ~50 ms against ~15 ms, RESULTS.md). Raising the
mmap and trim thresholds and keeping one arena lets freed blocks be reused instead. The setting is
process-wide, so it is applied once, on the first session, and can be turned off with
``TENSORSQL_TUNE_MALLOC=0`` (before the first ``tensorsql.connect``) or
``tensorsql.backends.duckdb.allocator.restore()``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8

#: allocations up to this size come from the heap and are reused after free
MMAP_THRESHOLD = 1 << 30
#: free memory kept at the top of the heap before it is given back to the system
TRIM_THRESHOLD = 1 << 30
#: one arena: a thread arena's heap holds at most 64 MiB, so a bigger block allocated on a DuckDB worker
#: thread (the Arrow export of a 4096^2 float32 result) would still be a fresh mmap there; small
#: allocations keep their per-thread caches (tcache), so the shared arena costs little contention
ARENA_MAX = 1

_lock = threading.Lock()
_state = {"tuned": False}


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        libc = ctypes.CDLL(None)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc


def enabled_by_env() -> bool:
    return os.environ.get("TENSORSQL_TUNE_MALLOC", "1").strip().lower() not in ("0", "false", "no", "off")


def tune() -> bool:
    """Raise glibc's mmap and trim thresholds once per process; True when the settings are in effect."""
    with _lock:
        if _state["tuned"]:
            return True
        libc = _libc()
        if libc is None:
            return False
        ok = libc.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1 and ok
        ok = libc.mallopt(_M_ARENA_MAX, ARENA_MAX) == 1 and ok
        _state["tuned"] = ok
        return ok


def restore() -> bool:
    """Back to glibc's default thresholds (128 KiB mmap threshold, 128 KiB trim threshold, 8 arenas per
    core); threads already attached to the main arena stay there."""
    with _lock:
        libc = _libc()
        if libc is None:
            return False
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 128 * 1024) == 1 and ok
        ok = libc.mallopt(_M_ARENA_MAX, 8 * (os.cpu_count() or 1)) == 1 and ok
        _state["tuned"] = False
        return ok


def tuned() -> bool:
    return _state["tuned"]
