"""tensorsql: tensors as relations of blocks, einsum as SQL that DuckDB runs with native block kernels."""

# ruff: noqa: A004  (abs/map/pow mirror numpy-style names on purpose; use them as ts.abs etc.)

from __future__ import annotations

from tensorsql.api import (
    ContractExpression,
    abs,
    connect,
    contract_expression,
    default_session,
    einsum,
    einsum_path,
    exp,
    log,
    map,
    neg,
    pow,
    relu,
    scale,
    softmax,
    sqrt,
)
from tensorsql.errors import (
    CatalogError,
    ConfigError,
    DatabaseLockedError,
    DTypeError,
    EinsumError,
    ExtensionError,
    KernelError,
    OperatorError,
    PlanError,
    RangeError,
    ShapeError,
    SQLExecutionError,
    TableNotFoundError,
    TensorSQLError,
)
from tensorsql.relation import TensorRelation
from tensorsql.session import Compiled, Session

__version__ = "0.1.0"

__all__ = [
    "CatalogError",
    "Compiled",
    "ConfigError",
    "ContractExpression",
    "DTypeError",
    "DatabaseLockedError",
    "EinsumError",
    "ExtensionError",
    "KernelError",
    "OperatorError",
    "PlanError",
    "RangeError",
    "SQLExecutionError",
    "Session",
    "ShapeError",
    "TableNotFoundError",
    "TensorRelation",
    "TensorSQLError",
    "abs",
    "connect",
    "contract_expression",
    "default_session",
    "einsum",
    "einsum_path",
    "exp",
    "log",
    "map",
    "neg",
    "pow",
    "relu",
    "scale",
    "softmax",
    "sqrt",
]
