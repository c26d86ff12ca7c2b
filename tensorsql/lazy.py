"""A session's lazy einsum: the call's operands checked and uploaded (or borrowed), and its expression graph
built, or taken from the session's graph cache when the same call was seen before (``Session.einsum``)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from tensorsql.arguments import as_array, check_flag
from tensorsql.backends import arrow
from tensorsql.compile import planning
from tensorsql.compile.cache import GraphEntry, einsum_key
from tensorsql.compiled import merge_into
from tensorsql.dtypes import CARRIED, DTYPES, carrier_dtype, dtype_name
from tensorsql.errors import OutOfMemoryError, ShapeError
from tensorsql.frontend import numpy as frontend
from tensorsql.frontend.subscripts import label_parts, parse, split_args
from tensorsql.ir import expr as E
from tensorsql.relation import TensorRelation

if TYPE_CHECKING:
    from tensorsql.session import Session


def einsum(
    session: Session,
    args: tuple[object, ...],
    optimize: object,
    dtype: object | None,
    join: str | None,
    agg: str | None,
    strategy: str | None,
    blocks: dict[object, int] | None,
    copy: bool,
    casting: str,
    cache: bool,
) -> TensorRelation:
    """The relation of ``session.einsum(*args, ...)`` (its docstring has the options)."""
    session.require_open("einsum")
    check_flag(copy, "einsum", "copy")
    check_flag(cache, "einsum", "cache")
    options = planning.PlanOptions(strategy)  # validated here, once
    frontend.check_casting(casting)
    inputs, output, operands = split_args(args)
    arrays = {
        i: as_array(op, f"operand {i}")
        for i, op in enumerate(operands)
        if not isinstance(op, TensorRelation)
    }
    promoted = None
    if any(a.dtype.name in CARRIED for a in arrays.values()):  # numpy's promotion, in a carried dtype
        kinds = [arrays[i].dtype if i in arrays else op.dtype for i, op in enumerate(operands)]
        promoted = np.result_type(*kinds)
    names: dict[int, str] = {}
    for i, op in enumerate(operands):
        if isinstance(op, TensorRelation):
            if op.session is not session:
                raise ShapeError("operand belongs to another session; save it and open it with table()")
        else:
            arr = arrays[i]
            names[i] = carrier_dtype(promoted) if arr.dtype.name in CARRIED else dtype_name(arr.dtype)
    # a call seen before (the same subscripts, operand shapes and dtypes, and options) reuses its
    # graph: no parsing, path search or graph building, and its plan is cached with the graph's nodes
    key = einsum_key(inputs, output, operands, arrays, names, optimize, dtype, join, agg, casting,
                     strategy, blocks)  # fmt: skip
    # only calls over arrays alone: a graph over a relation would keep the relation's tables alive
    if not cache or any(isinstance(op, TensorRelation) for op in operands):
        key = None
    cached = session._graphs.get(key) if key is not None else None
    leaves: list[E.Operand | None] = []
    nodes: list[E.Node] = []
    bindings: dict[E.Operand, np.ndarray] = {}
    for i, op in enumerate(operands):
        if isinstance(op, TensorRelation):
            nodes.append(merge_into(bindings, op))
            leaves.append(None)
            continue
        arr = arrays[i]
        name = names[i]
        try:
            arr = arr.astype(DTYPES[name], copy=copy)
        except MemoryError as exc:  # a broadcast view of 8 bytes may be 512 GiB copied
            nbytes = arr.size * DTYPES[name].itemsize
            raise OutOfMemoryError(
                f"cannot copy operand {i} of shape {arr.shape} ({nbytes / 2**30:.3g} GiB): {exc}"
            ) from exc
        if copy:  # the relation's own: nobody changes it (a cluster keeps it on the workers)
            arrow.own(arr)
        cached_leaf = cached.leaves[i] if cached is not None else None
        leaf = cached_leaf or E.Operand(shape=arr.shape, dtype=arr.dtype.name, name=f"operand{i}")
        nodes.append(leaf)
        leaves.append(leaf)
        bindings[leaf] = arr
    if cached is not None:
        return TensorRelation(session, cached.node, bindings, cached.options, cache=cached)
    sub = parse(inputs, output, [n.shape for n in nodes])
    if blocks is not None:
        options = planning.PlanOptions(strategy, tuple(label_parts(blocks, sub.sizes).items()))
    node = frontend.build(
        sub,
        nodes,
        optimize=optimize,
        join=join or "multiply",
        agg=agg or "sum",
        dtype=dtype,
        casting=casting,
    )
    entry = None
    if key is not None:
        entry = session._graphs.put(key, GraphEntry(node, tuple(leaves), options))
    return TensorRelation(session, node, bindings, options, cache=entry)
