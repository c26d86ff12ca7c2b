"""The one exception tree of tensorsql.

Every error a user can cause derives from :class:`TensorSQLError` and also from the builtin that a
Python programmer would expect (``ValueError`` for bad values, ``KeyError`` for missing names, ...),
so both ``except TensorSQLError`` and ``except ValueError`` work.
"""

from __future__ import annotations


class TensorSQLError(Exception):
    """Root of every error tensorsql raises on purpose."""


class EinsumError(ValueError, TensorSQLError):
    """Malformed subscripts, or operands that do not fit them (label sizes, operand count)."""


class ShapeError(ValueError, TensorSQLError):
    """A shape, block shape or partitioning that is invalid for the tensor it describes."""


class DTypeError(TypeError, TensorSQLError):
    """A dtype tensorsql does not support, or an operation undefined for the dtype."""


class OperatorError(ValueError, TensorSQLError):
    """An unknown or unsupported join, aggregation or map function."""


class RangeError(OverflowError, TensorSQLError):
    """A number outside the range of the integer dtype it must be computed in (``ts.scale(int8_array, 300)``:
    numpy 2 raises OverflowError for it too)."""


class TableNotFoundError(KeyError, TensorSQLError):
    """A named tensor relation that is not in the session's catalog."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CatalogError(ValueError, TensorSQLError):
    """A database that is not tensorsql's, or a catalog entry that does not match its table."""


class KernelError(RuntimeError, TensorSQLError):
    """A block kernel rejected its input inside DuckDB (corrupted or truncated blob, size mismatch)."""


class DatabaseLockedError(OSError, TensorSQLError):
    """The database file is locked by another process (one writer, or many read-only readers)."""


class ExtensionError(RuntimeError, TensorSQLError):
    """The kernel extension could not be built, found or loaded."""


class SQLExecutionError(RuntimeError, TensorSQLError):
    """DuckDB failed to run generated or user SQL for a reason other than a kernel check."""


class ConfigError(ValueError, TensorSQLError):
    """A bad session or call setting (threads, strategy, a value that must be a number)."""


class PlanError(ValueError, TensorSQLError):
    """A plan that cannot be built (unsupported lowering, inconsistent partitioning)."""


__all__ = [
    "CatalogError",
    "ConfigError",
    "DTypeError",
    "DatabaseLockedError",
    "EinsumError",
    "ExtensionError",
    "KernelError",
    "OperatorError",
    "PlanError",
    "RangeError",
    "SQLExecutionError",
    "ShapeError",
    "TableNotFoundError",
    "TensorSQLError",
]
