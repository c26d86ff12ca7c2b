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


class EinsumTypeError(TypeError, EinsumError):
    """An einsum argument of the wrong type: subscripts that are neither a string nor sublists, a label that
    is not an int, an ``out=`` that is not an ndarray, an ``order=`` or ``optimize=`` of no known kind.
    numpy raises TypeError for these; it is also an EinsumError (ValueError) like every other einsum input
    error."""


class EinsumPathError(RuntimeError, EinsumError):
    """An explicit contraction path (``optimize=[...]``) that does not contract the operands: numpy's
    RuntimeError ("invalid einsum_path"); also an EinsumError."""


class UnknownStrategyError(KeyError, EinsumError):
    """An ``optimize=`` strategy name that neither numpy nor opt_einsum knows: numpy's and opt_einsum's
    KeyError; also an EinsumError."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class ShapeError(ValueError, TensorSQLError):
    """A shape, block shape or partitioning that is invalid for the tensor it describes."""


class IndexingError(IndexError, ShapeError):
    """An index out of bounds, too many indices, two ellipses, or an axis out of range: numpy's IndexError
    (its AxisError is both), so ``except IndexError`` written for arrays catches it; also a ShapeError."""


class ShapeTypeError(TypeError, ShapeError):
    """An axis that is not an integer, or ``float()``/``int()``/``complex()`` of a relation of several
    elements: numpy's TypeError; also a ShapeError."""


class DTypeError(TypeError, TensorSQLError):
    """A dtype tensorsql does not support, or an operation undefined for the dtype."""


class CastingError(ValueError, DTypeError):
    """An unknown ``casting=`` rule: numpy's ValueError; also a DTypeError."""


class OutputError(ValueError, TensorSQLError):
    """An ``out=`` array that cannot receive the result (read-only), as numpy's ValueError."""


class OperatorError(ValueError, TensorSQLError):
    """An unknown or unsupported join, aggregation or map function."""


class OperatorTypeError(TypeError, OperatorError):
    """An operand of a type no operator takes (``rel + None``, ``rel ** 'a'``, a ``Fraction``): numpy's
    TypeError (still an OperatorError)."""


class RangeError(OverflowError, TensorSQLError):
    """A number outside the range of the integer dtype it must be computed in (``ts.scale(int8_array, 300)``:
    numpy 2 raises OverflowError for it too)."""


class TableNotFoundError(KeyError, TensorSQLError):
    """A named tensor relation that is not in the session's catalog."""

    def __str__(self) -> str:  # KeyError would repr() the message
        return str(self.args[0]) if self.args else ""


class CatalogError(ValueError, TensorSQLError):
    """A database that is not tensorsql's, a catalog entry that is corrupted or does not match its table, or
    a table name that is taken, empty or reserved."""


class TableNameError(TypeError, CatalogError):
    """A table name that is not a ``str`` (a ``TypeError``, and a ``CatalogError`` like every bad name)."""


class KernelError(RuntimeError, TensorSQLError):
    """A block kernel rejected its input inside DuckDB (corrupted or truncated blob, size mismatch)."""


class CorruptTableError(CatalogError, KernelError):
    """A stored table whose rows do not fit its metadata (found by the checks every read runs inside its
    query): a block key that is NULL, outside the block grid or repeated, or a blob whose length does not
    fit its block's shape and dtype. The message names the table and the key. It is a ``CatalogError`` (the
    table and its catalog entry disagree) and a ``KernelError``, what a bad blob raised before the checks."""


class DatabaseLockedError(OSError, TensorSQLError):
    """The database file is locked by another process (one writer, or many read-only readers), or is open in
    this process already with other settings (``read_only``, ``threads``)."""


class ExtensionError(RuntimeError, TensorSQLError):
    """The kernel extension could not be built, found or loaded."""


class WorkerLostError(RuntimeError, TensorSQLError):
    """A cluster query could not finish: the workers holding or running its blocks were lost and none could
    take over (message names the worker), or the session closed under it."""


class DeviceError(RuntimeError, TensorSQLError):
    """A session asked for a device it cannot use: ``device='cuda'`` on a machine without a CUDA GPU, driver,
    cuBLAS or CUDA compiler, an ordinal the machine lacks, or a device string of no known form. The message
    says which and why."""


class SQLExecutionError(RuntimeError, TensorSQLError):
    """DuckDB failed to run generated or user SQL for a reason other than a kernel check."""


class TransactionConflictError(SQLExecutionError):
    """Another connection changed the same table or catalog rows in a concurrent transaction: nothing of this
    statement was kept; retry once the other transaction has ended."""


class SessionClosedError(ValueError, TensorSQLError):
    """A session used after ``close()`` (a ``ValueError``, like I/O on a closed file)."""


class OutOfMemoryError(MemoryError, TensorSQLError):
    """An allocation that the session's ``memory_limit`` or the machine does not allow (the message says what
    was allocated, its size, and how to get more)."""


class SQLFrontendError(ValueError, TensorSQLError):
    """A statement's tensor syntax is wrong (``Session.sql``): the message quotes the call at fault."""


class SQLSyntaxError(SQLFrontendError):
    """SQL that does not parse; the message gives the line and column."""


class ConfigError(ValueError, TensorSQLError):
    """A bad session or call setting (threads, strategy, a value that must be a number)."""


class PlanError(ValueError, TensorSQLError):
    """A plan that cannot be built (unsupported lowering, inconsistent partitioning)."""


class GradError(ValueError, TensorSQLError):
    """A gradient that cannot be taken: a loss that is not a real scalar, ``wrt`` not in its graph."""


__all__ = [
    "CastingError",
    "CatalogError",
    "ConfigError",
    "CorruptTableError",
    "DTypeError",
    "DatabaseLockedError",
    "EinsumError",
    "EinsumPathError",
    "EinsumTypeError",
    "GradError",
    "ExtensionError",
    "KernelError",
    "OperatorError",
    "OutOfMemoryError",
    "OutputError",
    "PlanError",
    "RangeError",
    "SQLExecutionError",
    "SQLFrontendError",
    "SQLSyntaxError",
    "SessionClosedError",
    "ShapeError",
    "TableNameError",
    "TableNotFoundError",
    "TensorSQLError",
    "TransactionConflictError",
    "UnknownStrategyError",
    "WorkerLostError",
]
