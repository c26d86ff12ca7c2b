"""numpy einsum -> expression graph: casts, per-operand unary steps, then binary steps along a path."""

from __future__ import annotations

import functools
import math
import operator
from collections.abc import Sequence

import numpy as np
import opt_einsum
import opt_einsum.paths

from tensorsql.dtypes import DTYPES, carrier_dtype, dtype_name, is_complex
from tensorsql.errors import (
    CastingError,
    DTypeError,
    EinsumError,
    EinsumPathError,
    EinsumTypeError,
    OperatorError,
    UnknownStrategyError,
)
from tensorsql.frontend.subscripts import Subscripts, label_name
from tensorsql.ir import expr as E
from tensorsql.ir import ops

#: numpy's ``casting=`` values
CASTINGS = ("no", "equiv", "safe", "same_kind", "unsafe")


def check_casting(casting: object) -> str:
    if not isinstance(casting, str) or casting not in CASTINGS:
        raise CastingError(f"casting={casting!r}: expected one of {', '.join(CASTINGS)}")
    return casting


def result_dtype(dtypes: Sequence[str], join: str, dtype: object | None, casting: str = "safe") -> str:
    """numpy's einsum result dtype, every operand castable to it under ``casting=`` as numpy asks; an integer
    ``divide`` of two operands promotes to float64 like ``/`` does (a single operand is joined with nothing:
    its dtype stays)."""
    check_casting(casting)
    if dtype is not None:
        want = dtype_name(dtype)
        for i, d in enumerate(dtypes):
            if not np.can_cast(DTYPES[d], DTYPES[want], casting):  # type: ignore[arg-type]
                raise DTypeError(
                    f"operand {i} of dtype {d} cannot be cast to dtype={want} with casting={casting!r}"
                )
        return want
    name = np.result_type(*[DTYPES[d] for d in dtypes]).name if dtypes else "float64"
    for i, d in enumerate(dtypes):
        if not np.can_cast(DTYPES[d], DTYPES[name], casting):  # type: ignore[arg-type]
            raise DTypeError(
                f"operand {i} of dtype {d} cannot be cast to the result dtype {name} with casting={casting!r}"
            )
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


def numpy_memory_limit(optimize: object) -> tuple[str, int] | None:
    """numpy's ``optimize=(strategy, memory_limit)`` (the largest intermediate, in elements), else None."""
    if (
        isinstance(optimize, tuple | list)
        and len(optimize) == 2
        and isinstance(optimize[0], str)
        and optimize[0] != "einsum_path"
        and isinstance(optimize[1], int | float)
    ):
        if not math.isfinite(optimize[1]):
            raise EinsumTypeError(
                f"optimize={optimize!r}: the memory limit must be a finite number of elements"
            )
        return optimize[0], int(optimize[1])
    return None


def _checked_path(optimize: Sequence[object], n: int) -> list[tuple[int, ...]]:
    """An explicit path (numpy's ``['einsum_path', (i, j), ...]`` or opt_einsum's ``[(i, j), ...]``)."""
    path = list(optimize)
    if path and isinstance(path[0], str):
        if path[0] != "einsum_path":
            raise EinsumTypeError(
                f"optimize={optimize!r}: expected a path of position tuples (optionally headed by "
                "'einsum_path') or (strategy, memory_limit)"
            )
        path = path[1:]
    remaining = n
    checked: list[tuple[int, ...]] = []
    for step in path:
        if (
            not isinstance(step, list | tuple)
            or not step
            or any(isinstance(i, bool) or not hasattr(i, "__index__") for i in step)
        ):
            raise EinsumTypeError(f"optimize path step {step!r} is not a tuple of operand positions")
        idx = tuple(operator.index(i) for i in step)
        if len(set(idx)) != len(idx) or any(i < 0 or i >= remaining for i in idx):
            raise EinsumPathError(f"optimize path step {step!r} is invalid with {remaining} operands left")
        remaining -= len(idx) - 1
        checked.append(idx)
    if remaining != 1:
        raise EinsumPathError(f"optimize path {optimize!r} leaves {remaining} operands uncontracted")
    return checked


def contraction_path(sub: Subscripts, optimize: object, memory_limit: object = None) -> list[tuple[int, ...]]:
    """The contraction steps, as positions in the shrinking operand list (numpy's and opt_einsum's form).

    ``optimize``: False/None (all operands in one step, numpy's unoptimized einsum); True (greedy); a
    strategy name (opt_einsum's, which include numpy's 'greedy' and 'optimal'); numpy's
    ``(name, memory_limit)``; an opt_einsum ``PathOptimizer`` (e.g. ``RandomGreedy()``); or an explicit path.
    ``memory_limit``: opt_einsum's (the largest intermediate in elements; None or -1 unbounded; 'max_input').
    """
    n = len(sub.inputs)
    if optimize is False or optimize is None:
        return [tuple(range(n))]
    strategy: object = optimize
    limited = numpy_memory_limit(optimize)
    if limited is not None:
        strategy, memory_limit = limited
        if limited[1] < 1:  # no intermediate fits: numpy contracts everything in one step
            return [tuple(range(n))]
    elif isinstance(optimize, list | tuple):
        return _checked_path(optimize, n)
    elif optimize is True:
        strategy = "greedy"
    elif not isinstance(optimize, str | opt_einsum.paths.PathOptimizer):
        raise EinsumTypeError(
            f"optimize={optimize!r:.80}: expected a bool, a strategy name, (name, memory_limit), an "
            "opt_einsum PathOptimizer or a path"
        )
    if n <= 2:  # nothing to choose (numpy does not look the strategy up either)
        return [tuple(range(n))]
    symbols = {x: opt_einsum.get_symbol(i) for i, x in enumerate(sub.labels())}
    eq = ",".join("".join(symbols[x] for x in t) for t in sub.inputs)
    eq += "->" + "".join(symbols[x] for x in sub.output)
    shapes = [tuple(sub.sizes[x] for x in t) for t in sub.inputs]
    try:
        path, _ = opt_einsum.contract_path(
            eq, *shapes, shapes=True, optimize=strategy, memory_limit=memory_limit
        )
    except KeyError as exc:
        raise UnknownStrategyError(
            f"optimize={strategy!r} is not a path strategy opt_einsum knows: "
            f"{', '.join(sorted(PATH_STRATEGIES))}"
        ) from exc
    except (ValueError, TypeError) as exc:
        raise EinsumError(f"optimize={optimize!r:.80} (memory_limit={memory_limit!r}): {exc}") from exc
    return [tuple(p) for p in path]


#: the strategy names opt_einsum takes (numpy's 'greedy' and 'optimal' among them)
PATH_STRATEGIES = frozenset(opt_einsum.paths._PATH_OPTIONS)


def _iterator_strides(labels: tuple[int, ...], shape: tuple[int, ...], strides: tuple[int, ...], axes):
    """An operand's stride along each iterator axis, as numpy's nditer sees it: repeated labels are one
    (diagonal) axis whose stride is the sum; an absent label or a length-1 axis has stride 0."""
    out: list[int] = []
    for x in axes:
        dims = [k for k, lab in enumerate(labels) if lab == x]
        out.append(0 if not dims or shape[dims[0]] == 1 else sum(strides[k] for k in dims))
    return out


@functools.lru_cache(maxsize=1024)
def k_order(
    inputs: tuple[tuple[int, ...], ...],
    output: tuple[int, ...],
    shapes: tuple[tuple[int, ...], ...],
    strides: tuple[tuple[int, ...], ...],
) -> tuple[int, ...]:
    """The output's axes from outermost to innermost for numpy's ``order='K'`` ("as close to the layout of the
    inputs as possible"): numpy's einsum iterates the output labels, then the summed ones in label order, and
    its nditer sorts those axes by the operands' strides (a stable insertion sort in which a conflict between
    operands keeps C order); the output is allocated in that order."""
    summed = sorted({x for t in inputs for x in t} - set(output))
    axes = [*output, *summed]
    table = [_iterator_strides(t, sh, st, axes) for t, sh, st in zip(inputs, shapes, strides, strict=True)]
    perm = list(range(len(axes) - 1, -1, -1))  # innermost first, as the nditer's axis data
    for i0 in range(1, len(perm)):
        moving, ipos = perm[i0], i0
        for i1 in range(i0 - 1, -1, -1):
            decided = swap = False
            for row in table:
                s0, s1 = abs(row[moving]), abs(row[perm[i1]])
                if s0 and s1:
                    swap = s1 > s0 and (swap or not decided)
                    decided = True
            if decided:
                if not swap:
                    break
                ipos = i1
        if ipos != i0:
            perm.insert(ipos, perm.pop(i0))
    return tuple(a for a in reversed(perm) if a < len(output))


def all_fortran(
    sub: Subscripts, shapes: Sequence[tuple[int, ...]], strides, itemsizes: Sequence[int]
) -> bool:
    """numpy's ``order='A'`` test: is every operand, seen as its einsum view (repeated labels one diagonal
    axis), Fortran-contiguous?"""
    for labels, shape, st, size in zip(sub.inputs, shapes, strides, itemsizes, strict=True):
        axes = list(dict.fromkeys(labels))
        steps = _iterator_strides(labels, shape, st, axes)
        dims = [(shape[labels.index(x)], s) for x, s in zip(axes, steps, strict=True)]
        if any(n == 0 for n, _ in dims):
            continue
        expect = size
        for n, s in dims:
            if n != 1 and s != expect:
                return False
            expect *= n
    return True


def build(
    sub: Subscripts,
    operands: Sequence[E.Node],
    *,
    optimize: object = "auto",
    join: str = "multiply",
    agg: str = "sum",
    dtype: object | None = None,
    casting: str = "safe",
) -> E.Node:
    """The expression graph of one einsum call."""
    out_dtype = result_dtype([op.dtype for op in operands], join, dtype, casting)
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
        contraction_path(sub, optimize)  # validates optimize= as for several operands
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
    if fn == "pow" and param == 0.5 and np.dtype(compute).kind == "f":
        # numpy's power of a float to 0.5 is its sqrt: NaN at -inf and -0.0 at -0.0, where libm's pow gives
        # inf and 0.0
        return cast(E.Map(shape=node.shape, dtype=compute, input=node, fn="sqrt", param=None), out_dtype)
    return cast(E.Map(shape=node.shape, dtype=compute, input=node, fn=fn, param=param), out_dtype)
