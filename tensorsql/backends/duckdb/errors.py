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
from tensorsql.backends.duckdb.sqlgen import corrupt_message
from tensorsql.errors import (
    CatalogError,
    CorruptTableError,
    DatabaseLockedError,
    KernelError,
    OutOfMemoryError,
    SessionClosedError,
    SQLExecutionError,
    TensorSQLError,
    TransactionConflictError,
)
from udf_kernels import control as udf_control

#: DuckDB's "Invalid Input Error: " prefix, then a kernel function's name and a colon
_KERNEL = re.compile(r"^(?:[A-Za-z ]+Error: )?(tensor\w*|tensorsql\w*): ")


def kernel_function(exc: duckdb.Error) -> str | None:
    """The kernel that raised ``exc`` (an InvalidInputException whose message starts with a kernel's name);
    None for DuckDB's own IO error inside a kernel's call (a spill directory it cannot create)."""
    if not isinstance(exc, duckdb.InvalidInputException) or '"exception_type":"IO"' in str(exc):
        return None
    m = _KERNEL.match(str(exc))
    if m is None:
        return None
    name = m.group(1)
    return name if name in udf_kernels.SQL_FUNCTIONS or name in udf_kernels.GPU_SQL_FUNCTIONS else None


def is_conflict(exc: duckdb.Error) -> bool:
    """A write-write conflict with another transaction (DuckDB's optimistic concurrency control)."""
    return isinstance(exc, duckdb.TransactionException) and "conflict" in str(exc).lower()


#: how to get more memory, in every out-of-memory error
OOM_HINT = (
    "raise the limit with tensorsql.connect(memory_limit=...), give DuckDB a temp_directory= to spill to, "
    "use fewer threads, or smaller blocks (connect(max_block_bytes=...))"
)


def out_of_memory(exc: BaseException, what: str) -> OutOfMemoryError | None:
    """An OutOfMemoryError for DuckDB's own out-of-memory error or a kernel's (its budget or the system's
    refusal: ``udf_control.OOM_MARKER``), saying what was allocated and how to get more; None otherwise."""
    if udf_control.is_out_of_memory(exc):
        text = str(exc)
        marker = text.find(udf_control.OOM_MARKER)
        start = text.rfind(": ", 0, marker - 2) if marker > 2 else -1
        return OutOfMemoryError(f"{what}: {text[start + 2 if start >= 0 else 0 :]}")
    text = str(exc).strip()
    pinned = isinstance(exc, duckdb.TransactionException) and "failed to pin block" in text.lower()
    # DuckDB's own out of memory inside a kernel's call (allocating its result), which the kernel reports as
    # its internal error with DuckDB's exception as JSON: it had read as a KernelError, "rejected its input"
    in_kernel = '"exception_type":"outofmemory"' in text.replace(" ", "").lower()
    if isinstance(exc, duckdb.OutOfMemoryException) or pinned or in_kernel:  # a commit without memory too
        first = text.splitlines()[0] if text else "out of memory"
        return OutOfMemoryError(f"{what}: DuckDB ran out of memory ({first}); {OOM_HINT}")
    return None


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
    oom = out_of_memory(exc, what)
    if oom is not None:
        return oom
    corrupt = corrupt_message(str(exc)) if isinstance(exc, duckdb.InvalidInputException) else None
    if corrupt is not None:  # a stored table's check (sqlgen.checked, sqlgen.guard)
        return CorruptTableError(f"{what}: {corrupt}")
    fn = kernel_function(exc)
    if fn is not None:
        return KernelError(f"{what}: a block kernel rejected its input: {exc}")
    if "max_expression_depth" in str(exc):  # a plan of very many small steps, each a CTE DuckDB nests
        return SQLExecutionError(
            f"{what}: {exc} (the plan nests too many steps for one statement: materialize() an intermediate "
            "relation and build on it, or raise DuckDB's limit with SET max_expression_depth)"
        )
    return SQLExecutionError(f"{what}: {exc}")


def wrap_connect(exc: duckdb.Error, database: str) -> TensorSQLError:
    """Opening a database: a lock held by another process, or this process holding the file open with other
    settings, says so; anything else is not a database."""
    oom = out_of_memory(exc, f"cannot open {database!r}")
    if oom is not None:
        return oom
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


__all__ = ["OOM_HINT", "is_conflict", "kernel_function", "out_of_memory", "wrap", "wrap_connect"]
