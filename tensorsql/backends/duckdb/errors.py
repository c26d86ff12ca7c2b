"""DuckDB's exceptions -> tensorsql's, by exception type (and, for kernel checks, by the kernel's own prefix:
every kernel error starts with the name of the SQL function that raised it).

A Binder, Parser or Catalog error is a SQL error even when its text names a kernel (``tensor_pack(...)`` with
wrong argument types is DuckDB's binder talking, not a kernel's check); only an ``InvalidInputException`` that
starts with a kernel's name is a ``KernelError``.
"""

from __future__ import annotations

import re

import duckdb

import udf_kernels
from tensorsql.errors import (
    CatalogError,
    DatabaseLockedError,
    KernelError,
    SessionClosedError,
    SQLExecutionError,
    TensorSQLError,
    TransactionConflictError,
)

#: DuckDB's "Invalid Input Error: " prefix, then a kernel function's name and a colon
_KERNEL = re.compile(r"^(?:[A-Za-z ]+Error: )?(tensor\w*|tensorsql\w*): ")


def kernel_function(exc: duckdb.Error) -> str | None:
    """The kernel that raised ``exc`` (an InvalidInputException whose message starts with a kernel's name)."""
    if not isinstance(exc, duckdb.InvalidInputException):
        return None
    m = _KERNEL.match(str(exc))
    return m.group(1) if m and m.group(1) in udf_kernels.SQL_FUNCTIONS else None


def is_conflict(exc: duckdb.Error) -> bool:
    """A write-write conflict with another transaction (DuckDB's optimistic concurrency control)."""
    return isinstance(exc, duckdb.TransactionException) and "conflict" in str(exc).lower()


def wrap(exc: duckdb.Error, what: str) -> BaseException:
    """The tensorsql error (or KeyboardInterrupt, for an interrupted query) for a DuckDB error."""
    if isinstance(exc, duckdb.InterruptException):
        return KeyboardInterrupt(f"{what}: interrupted")
    if isinstance(exc, duckdb.ConnectionException):
        return SessionClosedError(f"{what}: the session's connection is closed ({exc})")
    if is_conflict(exc):
        return TransactionConflictError(
            f"{what}: another transaction changed the same table or catalog rows at the same time; nothing "
            f"was written, retry once it has ended ({exc})"
        )
    fn = kernel_function(exc)
    if fn is not None:
        return KernelError(f"{what}: a block kernel rejected its input: {exc}")
    return SQLExecutionError(f"{what}: {exc}")


def wrap_connect(exc: duckdb.Error, database: str) -> TensorSQLError:
    """Opening a database: a lock held by another process, or this process holding the file open with other
    settings, says so; anything else is not a database."""
    if isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower():
        return DatabaseLockedError(
            f"cannot open {database!r}: another process holds its lock ({exc}); DuckDB allows one writing "
            "process, or several with read_only=True"
        )
    if isinstance(exc, duckdb.ConnectionException) and "different configuration" in str(exc):
        return DatabaseLockedError(
            f"cannot open {database!r}: this process has it open already with other settings (read_only, "
            f"threads); close that session first, or open it with the same settings ({exc})"
        )
    return CatalogError(f"cannot open {database!r} as a DuckDB database: {exc}")


__all__ = ["is_conflict", "kernel_function", "wrap", "wrap_connect"]
