"""Process allocator settings for block-sized buffers (glibc only).

A block result leaves DuckDB through buffers that DuckDB allocates with ``malloc``: the aggregate's result
blob, the Arrow export. glibc serves every allocation above its mmap threshold (at most 32 MiB by default)
with a fresh ``mmap``, so each 64 MiB result is copied into memory that faults in one 4 KiB page at a time;
on the project's VM that fills memory at ~1 GB/s where reused memory takes ~5 GB/s (RESULTS.md). Raising the
mmap threshold and the trim threshold lets freed blocks be reused instead. The setting is process-wide, so
it is applied once, on the first session, and can be turned off with ``TENSORSQL_TUNE_MALLOC=0`` (before the
first ``tensorsql.connect``) or ``tensorsql.allocator.restore()``.
"""

from __future__ import annotations

import ctypes
import os
import platform
import threading

#: glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: allocations up to this size come from the heap and are reused after free
MMAP_THRESHOLD = 1 << 30
#: free memory kept at the top of the heap before it is given back to the system
TRIM_THRESHOLD = 1 << 30

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
        _state["tuned"] = ok
        return ok


def restore() -> bool:
    """Back to glibc's default thresholds (128 KiB mmap threshold, 128 KiB trim threshold)."""
    with _lock:
        libc = _libc()
        if libc is None:
            return False
        ok = libc.mallopt(_M_MMAP_THRESHOLD, 128 * 1024) == 1
        ok = libc.mallopt(_M_TRIM_THRESHOLD, 128 * 1024) == 1 and ok
        _state["tuned"] = False
        return ok


def tuned() -> bool:
    return _state["tuned"]
