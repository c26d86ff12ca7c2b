"""The extension's C ABI through ctypes: one handle per loaded library, its functions' signatures declared
once (``udf_kernels.sink`` and ``udf_kernels.control`` each declare theirs).

The library must be the one DuckDB loaded: ``dlopen`` of the same path returns the same instance, so the
handles reach the state of the databases that loaded it.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: a C function's (restype, argtypes)
Signature = tuple[Any, Sequence[Any]]

_handles: dict[tuple[str, bool], ctypes.CDLL] = {}
_declared: set[tuple[str, bool, str]] = set()
_lock = threading.Lock()


def library(path: Path | str, signatures: Mapping[str, Signature], hold_gil: bool = False) -> ctypes.CDLL:
    """The handle of the library at ``path`` with ``signatures`` declared. ``hold_gil``: a ``PyDLL`` handle
    (the same loaded library) whose calls keep the GIL: ~0.4 us less per call for short, never-blocking
    entry points."""
    key = (str(path), hold_gil)
    with _lock:
        lib = _handles.get(key)
        if lib is None:
            lib = (ctypes.PyDLL if hold_gil else ctypes.CDLL)(key[0])
            _handles[key] = lib
        for name, (restype, argtypes) in signatures.items():
            if (*key, name) not in _declared:
                fn = getattr(lib, name)
                fn.restype = restype
                fn.argtypes = list(argtypes)
                _declared.add((*key, name))
    return lib
