"""The cluster executor on Dask distributed: ``executor`` (distributed relations,
stages, the session's side), ``worker`` (each worker's own DuckDB). Docs: "The cluster".

``distributed`` is an optional dependency (installed by ``make``): it is imported lazily, and a missing one
raises ``ExtensionError`` with the command that installs it.
"""

from __future__ import annotations

from types import ModuleType

from tensorsql.errors import ExtensionError


def require_distributed() -> ModuleType:
    """``distributed``, or ExtensionError saying how to install it."""
    try:
        import distributed
    except ImportError as exc:
        raise ExtensionError(
            "tensorsql's cluster executor needs dask.distributed: pip install 'tensorsql[distributed]' "
            "(`make test` installs it into .venv)"
        ) from exc
    return distributed
