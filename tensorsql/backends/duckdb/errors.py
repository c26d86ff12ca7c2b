"""DuckDB's exceptions -> tensorsql's, by exception type (and, for kernel checks, by the kernel's own prefix:
every kernel error starts with the name of the SQL function that raised it)."""

from __future__ import annotations

import re

import duckdb

import udf_kernels
from tensorsql.backends.duckdb.sqlgen import corrupt_message
from tensorsql.errors import (
    CorruptTableError,
    DatabaseLockedError,
    KernelError,
    SQLExecutionError,
    TensorSQLError,
)

#: DuckDB's "Invalid Input Error: " prefix, then a kernel function's name and a colon
_KERNEL = re.compile(r"^(?:[A-Za-z ]+Error: )?(tensor\w*|tensorsql\w*): ")


def kernel_function(exc: duckdb.Error) -> str | None:
    """The kernel that raised ``exc`` (an InvalidInputException whose message starts with a kernel's name)."""
    if not isinstance(exc, duckdb.InvalidInputException):
        return None
    m = _KERNEL.match(str(exc))
    return m.group(1) if m and m.group(1) in udf_kernels.SQL_FUNCTIONS else None


def wrap(exc: duckdb.Error, what: str) -> BaseException:
    """The tensorsql error (or KeyboardInterrupt, for an interrupted query) for a DuckDB error."""
    if isinstance(exc, duckdb.InterruptException):
        return KeyboardInterrupt(f"{what}: interrupted")
    corrupt = corrupt_message(str(exc)) if isinstance(exc, duckdb.InvalidInputException) else None
    if corrupt is not None:  # a stored table's check (sqlgen.checked, sqlgen.guard)
        return CorruptTableError(f"{what}: {corrupt}")
    fn = kernel_function(exc)
    if fn is not None:
        return KernelError(f"{what}: a block kernel rejected its input: {exc}")
    return SQLExecutionError(f"{what}: {exc}")


def wrap_connect(exc: duckdb.Error, database: str) -> TensorSQLError:
    """Opening a database: a lock held by another process says so; anything else is not a database."""
    from tensorsql.errors import CatalogError

    if isinstance(exc, duckdb.IOException) and "lock" in str(exc).lower():
        return DatabaseLockedError(
            f"cannot open {database!r}: another process holds its lock ({exc}); DuckDB allows one writing "
            "process, or several with read_only=True"
        )
    return CatalogError(f"cannot open {database!r} as a DuckDB database: {exc}")


__all__ = ["kernel_function", "wrap", "wrap_connect"]
