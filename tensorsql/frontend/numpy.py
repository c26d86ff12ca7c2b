"""numpy einsum -> expression graph: casts, per-operand unary steps, then binary steps along a path."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import opt_einsum

from tensorsql.dtypes import DTYPES, carrier_dtype, dtype_name, is_complex
from tensorsql.errors import DTypeError, EinsumError, OperatorError
from tensorsql.frontend.subscripts import Subscripts, label_name
from tensorsql.ir import expr as E
from tensorsql.ir import ops


def result_dtype(dtypes: Sequence[str], join: str, dtype: object | None) -> str:
    """numpy's einsum result dtype; an integer ``divide`` of two operands promotes to float64 like ``/`` does
    (a single operand is joined with nothing: its dtype stays)."""
    if dtype is not None:
        want = dtype_name(dtype)
        for i, d in enumerate(dtypes):
            if not np.can_cast(DTYPES[d], DTYPES[want], "safe"):
                raise DTypeError(f"operand {i} of dtype {d} cannot be cast safely to dtype={want}")
        return want
    name = np.result_type(*[DTYPES[d] for d in dtypes]).name if dtypes else "float64"
    return ops.join_dtype(join, name) if len(dtypes) > 1 else name


def cast(node: E.Node, dtype: str) -> E.Node:
    return node if node.dtype == dtype else E.Cast(shape=node.shape, dtype=dtype, input=node)


def unary(
    node: E.Node, labels: tuple[int, ...], out: tuple[int, ...], sizes: dict[int, int], agg: str
) -> E.Node:
    """A unary EinSum, or the node itself when ``labels -> out`` is the identity."""
    if labels == out:
        return node
    return E.EinSum(
        shape=tuple(sizes[x] for x in out),
        dtype=node.dtype,
        inputs=(node,),
        in_labels=(labels,),
        out_labels=out,
        join="multiply",
        agg=agg,
    )


def binary(
    a: E.Node,
    la: tuple[int, ...],
    b: E.Node,
    lb: tuple[int, ...],
    out: tuple[int, ...],
    sizes: dict[int, int],
    join: str,
    agg: str,
) -> E.Node:
    return E.EinSum(
        shape=tuple(sizes[x] for x in out),
        dtype=a.dtype,
        inputs=(a, b),
        in_labels=(la, lb),
        out_labels=out,
        join=join,
        agg=agg,
    )


def contraction_path(sub: Subscripts, optimize: object) -> list[tuple[int, ...]]:
    """The pairwise order, from opt_einsum for strategy names or validated when given explicitly."""
    n = len(sub.inputs)
    if optimize is False or optimize is None:
        return [(0, 1)] * (n - 1)
    if isinstance(optimize, list | tuple) and not isinstance(optimize, str):
        path = list(optimize)
        if path and path[0] == "einsum_path":
            path = path[1:]
        remaining = n
        checked: list[tuple[int, ...]] = []
        for step in path:
            if not isinstance(step, list | tuple) or not step:
                raise EinsumError(f"optimize path step {step!r} is not a tuple of operand positions")
            idx = tuple(int(i) for i in step)
            if len(set(idx)) != len(idx) or any(i < 0 or i >= remaining for i in idx):
                raise EinsumError(f"optimize path step {step!r} is invalid with {remaining} operands left")
            remaining -= len(idx) - 1
            checked.append(idx)
        if remaining != 1:
            raise EinsumError(f"optimize path {optimize!r} leaves {remaining} operands uncontracted")
        return checked
    strategy = "greedy" if optimize is True else optimize
    if not isinstance(strategy, str):
        raise EinsumError(f"optimize={optimize!r}: expected a bool, a strategy name or a path")
    symbols = {x: opt_einsum.get_symbol(i) for i, x in enumerate(sub.labels())}
    eq = ",".join("".join(symbols[x] for x in t) for t in sub.inputs)
    eq += "->" + "".join(symbols[x] for x in sub.output)
    shapes = [tuple(sub.sizes[x] for x in t) for t in sub.inputs]
    try:
        path, _ = opt_einsum.contract_path(eq, *shapes, shapes=True, optimize=strategy)
    except (KeyError, ValueError, TypeError) as exc:
        raise EinsumError(f"optimize={optimize!r} is not a path strategy opt_einsum knows: {exc}") from exc
    return [tuple(p) for p in path]


def build(
    sub: Subscripts,
    operands: Sequence[E.Node],
    *,
    optimize: object = "auto",
    join: str = "multiply",
    agg: str = "sum",
    dtype: object | None = None,
) -> E.Node:
    """The expression graph of one einsum call."""
    out_dtype = result_dtype([op.dtype for op in operands], join, dtype)
    ops.check_ops(join, agg, out_dtype)
    plain = join == "multiply" and agg == "sum"
    if len(operands) > 2 and not plain:
        raise OperatorError(
            f"join={join!r}, agg={agg!r} is defined for one or two operands; got {len(operands)} "
            "(chain them as separate einsum calls)"
        )
    sizes = sub.sizes
    for x in dict.fromkeys(x for labels in sub.inputs for x in labels):
        if x not in sub.output:
            ops.check_empty_reduction(agg, label_name(x), sizes[x])
    counts: dict[int, int] = {}
    for labels in sub.inputs:
        for x in set(labels):
            counts[x] = counts.get(x, 0) + 1

    # Per operand: squeeze size-1 dims that broadcast, take diagonals of repeated labels and (for the
    # plain semiring only) sum out labels no other operand and not the output needs.
    items: list[tuple[E.Node, tuple[int, ...]]] = []
    for node, labels in zip(operands, sub.inputs, strict=True):
        node = cast(node, out_dtype)
        if len(operands) == 1:
            items.append((node, labels))
            continue
        keep: list[int] = []
        for x, n in zip(labels, node.shape, strict=True):
            if n == 1 and sizes[x] != 1:
                continue
            if plain and counts[x] == 1 and x not in sub.output:
                continue
            if x not in keep:
                keep.append(x)
        local_sizes = {x: n for x, n in zip(labels, node.shape, strict=True)}
        squeezed = unary(node, labels, tuple(keep), local_sizes, "sum")
        items.append((squeezed, tuple(keep)))
        for x in set(labels) - set(keep):
            counts[x] -= 1

    if len(items) == 1:
        node, labels = items[0]
        local = {x: n for x, n in zip(labels, node.shape, strict=True)}
        return unary(node, labels, sub.output, local, agg)

    for step in contraction_path(sub, optimize):
        picked = [items[i] for i in step]
        for i in sorted(step, reverse=True):
            del items[i]
        needed = set(sub.output)
        for _, labels in items:
            needed.update(labels)
        node, labels = picked[0]
        if len(picked) == 1:
            keep = tuple(x for x in dict.fromkeys(labels) if x in needed)
            node, labels = unary(node, labels, keep, sizes, agg), keep
        for k in range(1, len(picked)):
            other, olabels = picked[k]
            union = tuple(dict.fromkeys(labels + olabels))
            if k == len(picked) - 1 and not items:
                out = sub.output
            else:
                later = set(needed)
                for _, more in picked[k + 1 :]:
                    later.update(more)
                out = tuple(x for x in union if x in later)
            node, labels = binary(node, labels, other, olabels, out, sizes, join, agg), out
        items.append((node, labels))
    node, labels = items[0]
    return unary(node, labels, sub.output, sizes, agg)


def describe_labels(labels: Sequence[int]) -> str:
    return "".join(label_name(x) if len(label_name(x)) == 1 else f"[{label_name(x)}]" for x in labels)


def map_node(node: E.Node, fn: str, param: float | None = None) -> E.Node:
    """An element-wise map with numpy's result dtype (``ops.map_dtype``), computed in the relation dtype that
    carries it: integer input to a float-valued function is cast first (exp of int16 runs in float32), and a
    map with a real result of complex input (abs) runs in the complex dtype, then takes the real part."""
    param = ops.check_map(fn, param)
    out_dtype = carrier_dtype(np.dtype(ops.map_dtype(fn, node.dtype, param)))
    compute = node.dtype if ops.lookup("map", fn).real_result and is_complex(node.dtype) else out_dtype
    node = cast(node, compute)
    return cast(E.Map(shape=node.shape, dtype=compute, input=node, fn=fn, param=param), out_dtype)
