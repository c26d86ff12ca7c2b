"""Several plans of one graph as one statement (``DuckDBExecutor.many``): a training step's shared forward
steps and every output it returns (the loss, each gradient, each updated weight and optimizer state).

Run one statement per plan, a step of ~12 small plans cost ~12 DuckDB statements (0.3-1 ms each) and sent
every shared intermediate back to numpy and into the next statement. Here each shared step is a
MATERIALIZED CTE that the later plans read by name (``sqlgen.to_multi_sink_ast``: they were planned over a
stored relation of that name, ``E.Source``, with the step's own blocking), and every output writes its
blocks into a result sink of its own. The array operands are lent through one slot each, however many of the
plans read them; the statement is PREPAREd from its second run on, like a single plan's.
"""

from __future__ import annotations

import itertools
import math
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import duckdb
import numpy as np
from sqlglot import exp

from tensorsql.backends.duckdb import longrun, program, sqlgen, statements
from tensorsql.backends.duckdb.prepared import check_operand, deallocate
from tensorsql.compile import waves
from tensorsql.compile.plan import Plan
from tensorsql.dtypes import DTYPES
from tensorsql.errors import ShapeError
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from udf_kernels import sink as udf_sink

if TYPE_CHECKING:
    from tensorsql.backends.duckdb.executor import DuckDBExecutor

_ids = itertools.count()
#: a statement of fewer (weighted) flops that reads no stored table runs on the single-threaded lane
LANE_FLOPS = 1e8

#: what ``many`` returns: bindings -> the outputs' arrays (None: not every element was written, so the
#: caller runs the plans one by one, which fill absent blocks with zeros)
ManyRun = Callable[[Mapping[E.Operand, np.ndarray]], "list[np.ndarray] | None"]


@dataclass(eq=False)
class _Many:
    operands: list[E.Operand]
    slots: list[udf_sink.Slot]
    wants: list[tuple[tuple[int, ...], np.dtype]]
    sinks: list[udf_sink.Slot]
    results: list[tuple[tuple[int, ...], np.dtype]]
    text: str
    #: (flops, weighted flops) of all the plans: whether the statement runs as a long query (``longrun``)
    work: tuple[float, float]
    long: bool
    plans: list[Plan]
    #: runs on the executor's single-threaded lane (``DuckDBExecutor``'s docstring): reads no stored table
    lane: bool = False
    #: the shared steps' names (lower case): CTEs of the statement, never stored tables to check
    stage_tables: set[str] = field(default_factory=set)
    #: the statement is one ``tensor_program_into`` call (``program``): one row, (1, every element written)
    program: bool = False
    prepared: str | None = None
    execute: str = ""
    unpreparable: bool = False
    runs: int = 0
    diagnosis: list[str] | None = field(default=None)


def make(
    ex: DuckDBExecutor,
    stages: Sequence[tuple[str, Plan]],
    outputs: Sequence[Plan],
    block_slot_bytes: int,
    slot_bytes: int,
) -> ManyRun | None:
    """The runner of ``stages`` (each ``(table, plan)``: the plan's result is what later plans read as the
    stored relation ``table``) and ``outputs``; None when the plans cannot run so: no result sinks, an
    operand too big to lend (over ``BLOCK_SLOT_BYTES``: it would need a view), an empty array, a plan that
    would run in waves, or an output a sink cannot hold. ``block_slot_bytes`` and ``slot_bytes``: the
    executor's lending limits (its ``BLOCK_SLOT_BYTES`` and ``SLOT_BYTES``)."""
    if not outputs or not ex._sinks_available():
        return None
    plans = [plan for _, plan in stages] + list(outputs)
    index: dict[E.Operand, int] = {}
    for plan in plans:
        for op in plan.operands:
            nbytes = math.prod(op.shape) * DTYPES[op.dtype].itemsize
            if nbytes > block_slot_bytes or not all(op.shape):
                return None
            index.setdefault(op, len(index))
    budget = ex.wave_budget
    if any(waves.footprint(plan.tra) > budget for plan in plans):
        return None
    for plan in outputs:
        blob = plan.tra.schema.blob
        if len(set(blob)) != len(blob) or not all(plan.root.shape):
            return None
    operands = list(index)
    slots = [udf_sink.Slot(ex.kernels) for _ in operands]
    sinks = [udf_sink.Slot(ex.kernels) for _ in outputs]

    def binder(plan: Plan) -> sqlgen.Bind:
        # in a plan of one block per step every read of an inlined operand is made once: inline any lent
        # one-block operand (elsewhere it would be copied for every row of the other side: up to SLOT_BYTES)
        inline = block_slot_bytes if T.one_row(plan.tra) else slot_bytes

        def bind(rel: T.Input) -> exp.Select | sqlgen.Scalar:
            op = plan.operands[rel.index]
            key = slots[index[op]].key
            block = plan.block_shape(op)
            nbytes = math.prod(op.shape) * DTYPES[op.dtype].itemsize
            if nbytes <= inline and all(b >= n for b, n in zip(block, op.shape, strict=True)):
                cast = exp.Cast(this=sqlgen.lit(key), to=sqlgen.sql_type("BIGINT"))
                return sqlgen.Scalar(sqlgen.call("tensor_source", cast))
            return sqlgen.slot_blocks(key, rel.schema.keys, op.shape, block)

        return bind

    text = program_text = None
    if ex.programs and all(T.one_row(plan.tra) for plan in plans):  # the whole graph as one kernel call
        prog = program.build(
            [plan.root for plan in outputs], operands, [(table, plan.root) for table, plan in stages]
        )
        if prog is not None:
            text = program_text = sqlgen.sql_text(
                program.statement(prog, [sink.key for sink in sinks], [slot.key for slot in slots])
            )
    if text is None:
        ast = sqlgen.to_multi_sink_ast(
            [(table, plan.tra, binder(plan)) for table, plan in stages],
            [(plan.tra, sink.key, binder(plan)) for plan, sink in zip(outputs, sinks, strict=True)],
            checks=ex._must_check,
            in_place=ex._in_place,
        )
        text = sqlgen.sql_text(ast)
    works = [longrun.plan_work(plan.root) for plan in plans]
    work = (sum(w[0] for w in works), sum(w[1] for w in works))
    long = longrun.is_long(work[1], ex.workers)
    stage_tables = {table for table, _ in stages}
    reads = {scan.table for plan in plans for scan in sqlgen._scans(plan.tra)} - stage_tables
    m = _Many(
        operands=operands,
        slots=slots,
        wants=[(op.shape, DTYPES[op.dtype]) for op in operands],
        sinks=sinks,
        results=[(plan.root.shape, DTYPES[plan.root.dtype]) for plan in outputs],
        text=text,
        work=work,
        long=long,
        plans=plans,
        lane=not long and not reads and work[1] < LANE_FLOPS,
        stage_tables={table.lower() for table in stage_tables},
        program=program_text is not None,
    )
    return _runner(ex, m)


def text(run: ManyRun) -> str:
    """The statement a runner executes (for tests and ``explain``)."""
    return _TEXTS[run]


_TEXTS: weakref.WeakKeyDictionary[Callable, str] = weakref.WeakKeyDictionary()


def _runner(ex: DuckDBExecutor, m: _Many) -> ManyRun:
    lock = ex._lock
    con = (ex._lane_con() if m.lane else None) or ex.con
    m.lane = con is not ex.con  # where its prepared statement lives (no lane could be made: the session's)
    ex_ref = weakref.ref(ex)

    def execute() -> list[tuple]:
        m.runs += 1
        if m.prepared is None:
            if m.runs < 2 or m.unpreparable:
                return con.execute(m.text).fetchall()
            name = f"_ts_many_{next(_ids)}"
            try:
                con.execute(statements.prepare(name, exp.Var(this=m.text))).fetchall()
            except duckdb.Error:
                m.unpreparable = True
                return con.execute(m.text).fetchall()
            m.prepared, m.execute = name, statements.execute(name)
            weakref.finalize(run, deallocate, ex_ref, name, m.lane)
        try:
            return con.execute(m.execute).fetchall()
        except (duckdb.InvalidInputException, duckdb.InterruptException):
            raise  # the data's fault (a kernel's or a stored table's check) or Ctrl-C: not the statement's
        except duckdb.Error:
            name, m.prepared, m.unpreparable = m.prepared, None, True
            deallocate(ex_ref, name, m.lane)
            return con.execute(m.text).fetchall()

    def run(bindings: Mapping[E.Operand, np.ndarray]) -> list[np.ndarray] | None:
        outs = [np.empty(shape, dtype=dtype) for shape, dtype in m.results]
        with lock:
            try:
                for op, slot, want in zip(m.operands, m.slots, m.wants, strict=True):
                    arr = bindings.get(op)
                    if arr is None:
                        raise ShapeError(f"operand {op.name!r} has no array bound to it")
                    check_operand(op, arr, want)
                    slot.set(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
                for sink, out in zip(m.sinks, outs, strict=True):
                    sink.set(out, writable=True)
                rows = ex._run(m, execute)  # type: ignore[arg-type]
            except duckdb.Error as exc:
                if m.diagnosis is None:
                    def stored(scan: T.Scan) -> bool:  # the shared steps exist only inside the statement
                        return scan.table.lower() not in m.stage_tables and ex._must_check(scan)

                    found = [q for p in m.plans for q in sqlgen.diagnosis(p.tra, stored)]
                    m.diagnosis = [sqlgen.sql_text(q) for q in found]
                raise ex._failed(exc, "einsum", m.diagnosis) from exc
            finally:
                for slot in (*m.sinks, *m.slots):
                    slot.clear()
        if m.program:  # one row: every output's elements written by the one call
            ((_, elements),) = rows
            return outs if elements == sum(out.size for out in outs) else None
        written = [0] * len(outs)
        for o, elements in rows:  # a row per block (the guard's rows have no output; a padding row, no write)
            if o is not None and elements is not None:
                written[o] += elements
        if any(w != out.size for w, out in zip(written, outs, strict=True)):
            return None
        return outs

    _TEXTS[run] = m.text
    return run


__all__ = ["ManyRun", "make", "text"]
