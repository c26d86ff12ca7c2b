"""A one-block plan as one kernel call: the expression graph -> the program of ``tensor_program_into``.

When every tensor of a plan is one block and every leaf is an array operand (lent through a slot), the plan's
SQL would be one CTE per step, and DuckDB's fixed cost per step is most of a small call's time. Instead the
whole graph becomes a program the kernel runs step after step (udf_kernels/src/program.cpp): the same kernels,
the same values, one DuckDB round trip, every output written into its result sink. Graphs with anything else
(a stored table, a node kind the program has no op for) are left to the SQL path (``None``).
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from tensorsql.backends.duckdb import sqlgen
from tensorsql.ir import expr as E

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _dims(shape: Sequence[int]) -> str:
    return ",".join(str(int(n)) for n in shape) if len(shape) else "-"


def _spec(node: E.EinSum) -> str | None:
    letters: dict[int, str] = {}
    for term in (*node.in_labels, node.out_labels):
        for label in term:
            if label not in letters:
                if len(letters) == len(_LETTERS):
                    return None
                letters[label] = _LETTERS[len(letters)]
    ins = ",".join("".join(letters[x] for x in t) for t in node.in_labels)
    return ins + "->" + "".join(letters[x] for x in node.out_labels)


def _param(value: float) -> str:
    return repr(float(value))


def build(
    outputs: Sequence[E.Node],
    operands: Sequence[E.Operand],
    stages: Sequence[tuple[str, E.Node]] = (),
) -> str | None:
    """The program computing ``outputs`` (written to sinks 0, 1, ... in order) from ``operands`` (the input
    blobs, in order), or None when the graph has a node the program cannot run. ``stages``: (table, graph)
    of shared steps that later graphs read as the stored relation ``table`` (``Executor.many``): each is
    computed once, as a value the readers take."""
    index: dict[E.Node, int] = {}
    ops: list[str] = []
    for leaf in operands:
        index[leaf] = len(ops)
        ops.append(f"i {leaf.dtype} {_dims(leaf.shape)}")
    stage_roots = {table.lower(): root for table, root in stages}
    order: list[E.Node] = []
    seen: set[E.Node] = set()
    for root in [*(r for _, r in stages), *outputs]:
        for node in E.topological(root):
            if node not in seen:
                seen.add(node)
                order.append(node)
    for node in order:
        if node in index:
            continue
        if isinstance(node, E.Source) and node.table.lower() in stage_roots:
            stage = stage_roots[node.table.lower()]  # computed before: stages come first, in order
            if stage not in index or stage.shape != node.shape or stage.dtype != node.dtype:
                return None
            index[node] = index[stage]
            continue
        if isinstance(node, E.Operand):
            return None  # a leaf that is not among the operands (a placeholder left unbound)
        made = _op(node, index)
        if made is None:
            return None
        for op in made:  # each op after the first reads the one before it
            ops.append(op.replace("{prev}", str(len(ops) - 1)))
        if made:
            index[node] = len(ops) - 1
    outs = [f"o {index[root]} {k}" for k, root in enumerate(outputs)]
    return ";".join(ops + outs)


def _op(node: E.Node, index: dict[E.Node, int]) -> list[str] | None:
    """The op(s) computing ``node`` (its inputs numbered in ``index``); the last one makes its value."""
    if isinstance(node, E.EinSum):
        if any(c.dtype != node.dtype for c in node.inputs):
            return None
        spec = _spec(node)
        if spec is None:
            return None
        if len(node.inputs) == 2:
            x, y = (index[c] for c in node.inputs)
            return [f"e {x} {y} {spec} {node.join} {node.agg} {node.dtype}"]
        if len(node.inputs) == 1:
            return [f"u {index[node.inputs[0]]} {spec} {node.agg} {node.dtype}"]
        return None
    if isinstance(node, E.Map):
        if node.input.dtype != node.dtype:
            return None
        param = "" if node.param is None else f" {_param(node.param)}"
        return [f"m {index[node.input]} {node.fn} {node.dtype}{param}"]
    if isinstance(node, E.Cast):
        return [f"c {index[node.input]} {node.dtype}"]
    if isinstance(node, E.Reblock):  # one block: the same value
        index[node] = index[node.input]
        return []
    if isinstance(node, E.Slice):
        x = index[node.input]
        ops = [f"s {x} {_dims(node.start)} {_dims(node.count)} {_dims(node.step)}"]
        if not all(node.keep):
            kept = [n for n, keep in zip(node.count, node.keep, strict=True) if keep]
            ops.append(f"r {{prev}} {_dims(kept)}")
        return ops
    return None


def statement(program: str, sinks: Sequence[int], slots: Sequence[int]) -> exp.Select:
    """``SELECT 1 AS blocks, tensor_program_into([sinks], program, tensor_source(slot), ...) AS elements``."""
    bigint = sqlgen.sql_type("BIGINT")
    keys = exp.Array(expressions=[exp.Cast(this=sqlgen.lit(k), to=bigint.copy()) for k in sinks])
    sources = [sqlgen.call("tensor_source", exp.Cast(this=sqlgen.lit(k), to=bigint.copy())) for k in slots]
    call = sqlgen.call("tensor_program_into", keys, sqlgen.lit(program), *sources)
    return exp.select(
        exp.alias_(sqlgen.lit(1), "blocks", quoted=True), exp.alias_(call, "elements", quoted=True)
    )


__all__ = ["build", "statement"]
