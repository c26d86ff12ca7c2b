"""What one plan's prepared statement (``executor``) and a graph's (``many``) share: the arrays a run binds
checked against the statement's operands, and the statement deallocated once its plan is collected."""

from __future__ import annotations

import logging
import weakref

import duckdb
import numpy as np

from tensorsql.backends.duckdb import statements
from tensorsql.errors import DTypeError, ShapeError
from tensorsql.ir import expr as E

log = logging.getLogger("tensorsql")


def check_operand(op: E.Operand, arr: np.ndarray, want: tuple[tuple[int, ...], np.dtype]) -> None:
    shape, dtype = want
    if arr.shape != shape:
        raise ShapeError(f"operand {op.name!r} needs an array of shape {shape}, got {arr.shape}")
    if arr.dtype != dtype:
        raise DTypeError(f"operand {op.name!r} needs an array of dtype {dtype}, got {arr.dtype}")


def deallocate(executor_ref: weakref.ref, name: str, lane: bool = False) -> None:
    """A finalizer: the prepared statement ``name`` of a collected plan goes (on any thread: ``locking``)."""
    ex = executor_ref()
    if ex is None or ex.closed:
        return

    def deallocate(name: str) -> None:
        con = ex._lane_con() if lane else ex.con
        if ex.closed or con is None or (not lane and ex._after_transaction(deallocate, name)):
            return
        try:
            con.execute(statements.deallocate(name)).fetchall()
        except duckdb.Error as exc:
            log.warning("tensorsql: could not deallocate prepared statement %s: %s", name, exc)

    ex._lock.run_or_queue(deallocate, name)
