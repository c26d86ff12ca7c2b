"""Python operators on relations: each builds the same lazy graph ``einsum`` does (so a chain of them is
planned and run as one statement), with numpy's broadcasting and result dtypes.

``a + b``, ``a - b``, ``a * b``, ``a / b``: an element-wise extended EinSum (join add / subtract /
multiply / divide) over right-aligned labels; a Python or numpy scalar or array operand joins as an array
operand. ``a @ b``: numpy's matmul as a contraction. ``-a``, ``abs(a)``, ``a ** k``: maps. ``a > b``
(``>= < <=``, ``a.equal(b)``, ``a.not_equal(b)``): masks of 1 and 0 in the operands' dtype (joins greater,
...). ``a.T``, ``a.sum(axis)``, ``a.max(axis)``, ``a.min(axis)``, ``a.mean(axis)``: unary EinSums.
``a.astype(dtype)``: a cast.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from tensorsql.dtypes import DTYPES, dtype_name
from tensorsql.errors import (
    EinsumError,
    IndexingError,
    OperatorError,
    OperatorTypeError,
    RangeError,
    ShapeError,
    ShapeTypeError,
)
from tensorsql.frontend import numpy as frontend
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _letters(n: int, what: str) -> str:
    if n > len(_LETTERS):
        raise ShapeError(f"{what}: a tensor of {n} dimensions has more than {len(_LETTERS)}")
    return _LETTERS[:n]


def _operand(x: TensorRelation, other: object, what: str) -> object:
    """``other`` as an einsum operand: a relation of the same session, or an array (a Python scalar takes
    numpy's weak-scalar dtype rule: ``float32 + 2`` stays float32)."""
    if isinstance(other, type(x)):  # x's class is TensorRelation: ``relation`` imports this module, not back
        if other.session is not x.session:
            raise ShapeError(f"{what}: the operands belong to different sessions")
        return other
    if isinstance(other, bool | numbers.Number) and not isinstance(other, np.generic):
        if what == "/" and x.dtype.kind in "iu" and isinstance(other, int) and not isinstance(other, bool):
            return np.asarray(other, dtype=np.float64)  # true division of integers is float64, any int
        try:
            return np.asarray(other, dtype=np.result_type(x.dtype, other))
        except OverflowError as exc:
            raise RangeError(f"{what}: {other!r} does not fit the tensor's dtype {x.dtype}") from exc
        except TypeError as exc:  # a number numpy keeps as an object (Fraction, Decimal)
            raise OperatorTypeError(
                f"{what}: cannot use a {type(other).__name__} as a tensor (convert it to float first)"
            ) from exc
    try:
        arr = np.asarray(other)
    except Exception as exc:  # an object numpy cannot make an array of
        raise OperatorTypeError(f"{what}: cannot use a {type(other).__name__} as a tensor") from exc
    if arr.dtype.kind not in "biufc":
        raise OperatorTypeError(f"{what}: cannot use an array of dtype {arr.dtype} as a tensor")
    if arr.dtype.kind == "b" or arr.dtype == np.float16:
        # no tensor is bool or float16: numpy's promotion against the relation's dtype (a mask times a
        # float tensor is that float; float16 beside an integer is a float32 here, the narrowest carried)
        want = np.result_type(x.dtype, arr.dtype)
        arr = arr.astype(np.float32 if want == np.float16 else want)
    return arr


#: the comparisons by join, as Python's
_COMPARE = {
    "greater": operator.gt,
    "greater_equal": operator.ge,
    "less": operator.lt,
    "less_equal": operator.le,
    "equal": operator.eq,
    "not_equal": operator.ne,
}


def binary(x: TensorRelation, other: object, join: str, what: str, reflected: bool = False) -> TensorRelation:
    """``x <op> other`` element-wise with numpy broadcasting (``other <op> x`` when ``reflected``)."""
    beyond = _out_of_range(x, other, join)
    if beyond is not None:  # numpy answers uint8 > 300 with all False: a constant mask, still of x's graph
        far = math.inf if beyond else -math.inf  # every value of x lies on one side of it
        truth = _COMPARE[join](far, 0) if reflected else _COMPARE[join](0, far)
        zeros = x.session.map(x, "scale", 0)
        return zeros + 1 if truth else zeros
    y = _operand(x, other, what)
    ny = len(np.shape(y)) if not hasattr(y, "node") else y.ndim  # type: ignore[attr-defined]
    shape_y = tuple(y.shape) if hasattr(y, "node") else np.shape(y)  # type: ignore[attr-defined]
    try:  # numpy's message, naming both shapes (the einsum's named a label the user never wrote)
        np.broadcast_shapes(tuple(x.shape), shape_y)
    except ValueError:
        first, second = (shape_y, tuple(x.shape)) if reflected else (tuple(x.shape), shape_y)
        raise ShapeError(
            f"{what}: operands could not be broadcast together with shapes {first} {second}"
        ) from None
    n = max(x.ndim, ny)
    out = _letters(n, what)
    lx, ly = out[n - x.ndim :], out[n - ny :]
    a, b, la, lb = (y, x, ly, lx) if reflected else (x, y, lx, ly)
    kinds = {np.dtype(a.dtype), np.dtype(b.dtype)}  # type: ignore[attr-defined]
    if join in _COMPARE and kinds == {np.dtype(np.int64), np.dtype(np.uint64)}:
        return _signed_unsigned(x, a, b, la, lb, out, join)
    return x.session.einsum(f"{la},{lb}->{out}", a, b, join=join)


def _signed_unsigned(
    x: TensorRelation, a: object, b: object, la: str, lb: str, out: str, join: str
) -> TensorRelation:
    """An int64 compared with a uint64, exactly as numpy 2 does (in their common float64, 2**62 + 1 > 2**62
    was false): where the int64 is negative it lies below every uint64, elsewhere both compare as uint64.
    The mask is float64, the operands' common dtype, as every comparison's mask is."""
    s = x.session
    a, b = (v if hasattr(v, "node") else s.from_numpy(np.asarray(v)) for v in (a, b))
    first = np.dtype(a.dtype) == np.int64  # type: ignore[attr-defined]
    signed = a if first else b
    unsigned_ = [astype(signed, "uint64"), b] if first else [a, astype(signed, "uint64")]
    masks = astype(s.einsum(f"{la},{lb}->{out}", *unsigned_, join=join), "float64")  # where int64 >= 0
    below = astype(binary(signed, 0, "less", "<"), "float64")  # 1 where the int64 is negative
    kept = binary(masks, binary(below, 1.0, "subtract", "-", reflected=True), "multiply", "*")
    # a negative int64 against any uint64: x < u, x <= u, x != u hold (u > x, u >= x, u != x when it is the
    # right operand); the others do not
    holds = {"less", "less_equal", "not_equal"} if first else {"greater", "greater_equal", "not_equal"}
    return binary(kept, below, "add", "+") if join in holds else kept


def _out_of_range(x: TensorRelation, other: object, join: str) -> bool | None:
    """For a comparison of an integer relation with a Python int beyond its dtype's range: whether the int
    is above it (True) or below (False); None for anything else."""
    if join not in _COMPARE:
        return None
    if x.dtype.kind not in "iu" or isinstance(other, bool) or not isinstance(other, int):
        return None
    info = np.iinfo(x.dtype)
    if info.min <= other <= info.max:
        return None
    return other > info.max


def matmul(x: TensorRelation, other: object, reflected: bool = False) -> TensorRelation:
    """numpy's ``@``: 1-d operands are vectors (their axis dropped from the result), batch axes broadcast."""
    y = _operand(x, other, "@")
    a, b = (y, x) if reflected else (x, y)
    sa = np.shape(a) if not hasattr(a, "node") else a.shape  # type: ignore[attr-defined]
    sb = np.shape(b) if not hasattr(b, "node") else b.shape  # type: ignore[attr-defined]
    na, nb = len(sa), len(sb)
    if na == 0 or nb == 0:
        raise ShapeError("@: matmul does not take a 0-d operand (use *)")
    ja, jb = sa[-1], sb[0] if nb == 1 else sb[-2]
    if ja != jb:  # einsum would broadcast a size 1 here; numpy's matmul never does along its core dimension
        raise EinsumError(
            f"@: the operands' core dimensions differ in size ({ja} against {jb}): shapes "
            f"{tuple(sa)} and {tuple(sb)}"
        )
    batch = max(na, nb, 2) - 2
    letters = _letters(batch + 3, "@")
    bl, i, j, k = letters[:batch], letters[batch], letters[batch + 1], letters[batch + 2]
    la = j if na == 1 else bl[batch - (na - 2) :] + i + j
    lb = j if nb == 1 else bl[batch - (nb - 2) :] + j + k
    out = bl[batch - max(na, nb) + 2 :] if max(na, nb) > 2 else ""
    out += ("" if na == 1 else i) + ("" if nb == 1 else k)
    return x.session.einsum(f"{la},{lb}->{out}", a, b)


def axes_of(x: TensorRelation, axis: object, what: str) -> tuple[int, ...]:
    if axis is None:
        return tuple(range(x.ndim))
    items = axis if isinstance(axis, tuple) else (axis,)
    out: list[int] = []
    for a in items:
        if isinstance(a, bool) or not isinstance(a, numbers.Integral):
            raise ShapeTypeError(f"{what}: axis {a!r} is not an integer")
        if not -x.ndim <= int(a) < x.ndim:
            raise IndexingError(f"{what}: axis {a!r} is out of range for a tensor of shape {x.shape}")
        out.append(int(a) % x.ndim)
    if len(set(out)) != len(out):
        raise ShapeError(f"{what}: axis {axis!r} repeats an axis")
    return tuple(out)


def reduce(
    x: TensorRelation,
    axis: object,
    agg: str,
    what: str,
    *,
    dtype: object = None,
    out: object = None,
    keepdims: object = False,
) -> TensorRelation:
    """``x.sum(axis)`` (``max``, ``min``, ``prod``): a unary EinSum that aggregates the axes away.
    ``dtype``, ``out`` and ``keepdims`` as numpy's (``np.sum(rel)`` passes them): the sum in ``dtype``,
    no ``out`` (a relation is never written into), the reduced axes kept as size 1."""
    if out is not None:
        raise OperatorError(
            f"{what}: out= is not supported (a relation is computed lazily, never into an array)"
        )
    if not isinstance(keepdims, bool | np.bool_):
        raise OperatorError(f"{what}: keepdims must be True or False, got {keepdims!r}")
    if dtype is None and agg in ("sum", "prod"):
        # numpy's sum and prod of a small integer (or bool) accumulate in the platform's integer: int8 [100,
        # 100, 100] sums to 300, not 44 (np.add.reduce's rule; max and min keep the dtype)
        kind, size = np.dtype(x.dtype).kind, np.dtype(x.dtype).itemsize
        if kind in "bi" and (kind == "b" or size < 8):
            dtype = "int64"
        elif kind == "u" and size < 8:
            dtype = "uint64"
    if dtype is not None:
        x = astype(x, dtype)
    axes = axes_of(x, axis, what)
    _letters(x.ndim, what)  # the einsum's label count: a clear error past 52
    labels = list(range(x.ndim))
    kept = [d for d in labels if d not in axes]
    if not keepdims:
        return x.session.einsum(x, labels, kept, agg=agg)
    # a size-1 label per reduced axis, from a ones vector: the result keeps the axis (numpy's keepdims)
    ones = [x.ndim + i for i in range(len(axes))]
    result = [d if d not in axes else ones[sorted(axes).index(d)] for d in labels]
    one = np.ones((1,) * len(axes), dtype=x.dtype)
    return x.session.einsum(x, labels, one, ones, result, agg=agg)


def mean(
    x: TensorRelation, axis: object, *, dtype: object = None, out: object = None, keepdims: object = False
) -> TensorRelation:
    axes = axes_of(x, axis, "mean")
    count = int(np.prod([x.shape[a] for a in axes])) if axes else 1  # none: NaN (0 / 0), as numpy's
    if dtype is None and x.dtype.kind not in "fc":
        dtype = "float64"
    total = reduce(x, axis, "sum", "mean", dtype=dtype, out=out, keepdims=keepdims)
    # divided by the count, as numpy does (times 1/count was an ulp off: mean(ones(49)) 0.9999999999999999,
    # truncated to 0 with an integer dtype)
    if total.dtype.kind in "iu":  # numpy: the sum in that integer dtype, divided, cast back (truncated)
        return astype(binary(astype(total, "float64"), count, "divide", "mean"), total.dtype)
    return binary(total, count, "divide", "mean")


def transpose(x: TensorRelation) -> TensorRelation:
    letters = _letters(x.ndim, ".T")
    return x.session.einsum(f"{letters}->{letters[::-1]}", x)


def astype(x: TensorRelation, dtype: object) -> TensorRelation:
    name = dtype_name(dtype)
    if name not in DTYPES:
        raise OperatorError(f"astype: dtype {dtype!r} is not one of {sorted(DTYPES)}")
    node: E.Node = frontend.cast(x.node, name)
    return type(x)(x.session, node, x.bindings)


def power(x: TensorRelation, exponent: object) -> TensorRelation:
    """``x ** exponent`` with numpy's fast paths: ``x ** 2`` is ``square`` (x * x: libm's powf costs ~10x
    more per element; an MSE loss's square and its gradient's ``x ** 1`` were 2% of a transformer step),
    ``x ** 1`` is ``x``, and on floats and complex ``x ** 0.5`` is ``sqrt`` (Adam's denominator; numpy's
    ``(-0.0) ** 0.5`` is -0.0 and its complex square roots are ``sqrt``'s) and ``x ** -1`` is
    ``reciprocal``. Any other exponent, and integers, are the ``pow`` map."""
    if isinstance(exponent, np.bool_):  # numpy's: int8 ** np.True_ is int8, a weak 1
        exponent = int(exponent)
    if isinstance(exponent, bool) or not isinstance(exponent, numbers.Real):
        raise OperatorTypeError(f"**: the exponent must be a real number, got {type(exponent).__name__}")
    floats = x.dtype.kind in "fc"  # numpy's sqrt and reciprocal fast paths are a float array's
    # numpy 2's promotion: a numpy scalar's dtype counts in full (int8 ** np.int64(3) is int64, float32 **
    # np.float64(3) float64); a Python number is weak, except that an integer array to a Python float power
    # is float64 (int8 ** 2.0 is 10000.0, not a wrapped int8)
    if isinstance(exponent, np.generic):
        want = np.result_type(x.dtype, exponent.dtype)
        if want == np.float16:  # no relation holds float16: float32, as beside a float16 array
            want = np.dtype(np.float32)
    elif x.dtype.kind in "iu" and isinstance(exponent, float):
        want = np.dtype("float64")
    else:
        want = x.dtype
    if want != x.dtype:
        x = astype(x, want)
    e = float(exponent)
    if e == 1.0:
        return x
    if e == 2.0:
        return x.session.map(x, "square")
    if floats and e in (0.5, -1.0):
        return x.session.map(x, "sqrt" if e == 0.5 else "reciprocal")
    return x.session.map(x, "pow", e)


def rpower(x: TensorRelation, base: object) -> TensorRelation:
    """``base ** x`` for a real ``base`` and a float relation: the ``rpow`` map (libm's pow, as numpy's;
    ``ts.grad`` differentiates it). A numpy scalar base promotes as numpy 2 does (``np.float64(2) ** float32``
    is float64); a Python number is weak. numpy's integer powers of an integer relation are not supported."""
    if isinstance(base, np.bool_ | bool):  # numpy's: True ** float32 is float32 (a bool is no wider)
        base = int(base)
    if not isinstance(base, numbers.Real):
        raise OperatorError(f"**: a number ** a relation needs a real base, got {base!r}")
    if x.dtype.kind not in "f":
        raise OperatorError(f"**: a number ** a {x.dtype} relation is not supported: cast it to float")
    if isinstance(base, np.generic):
        want = np.result_type(x.dtype, base.dtype)
        if want != x.dtype:
            x = astype(x, want)
    return x.session.map(x, "rpow", float(base))


def _index(x: TensorRelation, key: object) -> tuple[list[int], list[int], list[int], list[bool]]:
    """numpy basic indexing (ints, slices with any step, ``...``) as (start, count, step, keep) per
    dimension: elements ``start + step * t`` for ``t < count``; an integer index keeps no dimension."""
    items = list(key) if isinstance(key, tuple) else [key]
    ellipses = [i for i, k in enumerate(items) if k is Ellipsis]  # `is`: an array key has no truth value
    if len(ellipses) > 1:
        raise IndexingError("[]: an index can only have a single ellipsis ('...')")
    if ellipses:
        at = ellipses[0]
        items[at : at + 1] = [slice(None)] * (x.ndim - (len(items) - 1))
    if len(items) > x.ndim:
        raise IndexingError(f"[]: too many indices for a tensor of shape {x.shape}: {len(items)}")
    items += [slice(None)] * (x.ndim - len(items))
    start: list[int] = []
    count: list[int] = []
    step: list[int] = []
    keep: list[bool] = []
    for d, (k, n) in enumerate(zip(items, x.shape, strict=True)):
        if isinstance(k, bool) or not isinstance(k, numbers.Integral | slice):
            # numpy's IndexError for what it never takes (a float, a str); arrays and None it takes, and
            # they are not built here
            fancy = k is None or isinstance(k, list | tuple | np.ndarray)
            raise (OperatorError if fancy else IndexingError)(
                f"[]: index {k!r} of dimension {d}: only integers, slices and '...' (basic indexing) "
                "are supported"
            )
        if isinstance(k, slice):
            for part in (k.start, k.stop, k.step):
                if part is not None and (isinstance(part, bool) or not isinstance(part, numbers.Integral)):
                    raise ShapeTypeError(
                        f"[]: slice {k!r} of dimension {d}: bounds and step must be integers"
                    )
            if k.step == 0:
                raise OperatorError(f"[]: slice {k!r} of dimension {d}: the step cannot be zero")
            span = range(*k.indices(n))
            start.append(span.start if len(span) else 0)
            count.append(len(span))
            step.append(span.step if len(span) > 1 else 1)  # one element: any step reads it (even 2**63)
            keep.append(True)
        else:
            i = int(k)
            if not -n <= i < n:
                raise IndexingError(f"[]: index {i} is out of bounds for dimension {d} of size {n}")
            start.append(i % n)
            count.append(1)
            step.append(1)
            keep.append(False)
    return start, count, step, keep


def getitem(x: TensorRelation, key: object) -> TensorRelation:
    """``x[key]`` as a lazy relation (``E.Slice``): in SQL, each block holding the elements is cut into its
    pieces of the result's blocks, and only those blocks of ``x`` are read or computed."""
    start, count, step, keep = _index(x, key)
    shape = tuple(n for n, k in zip(count, keep, strict=True) if k)
    if 0 in count:  # numpy's empty result: nothing to read, but still computed from x (ts.grad finds x)
        out = list(range(x.ndim, x.ndim + len(shape)))
        return x.session.einsum(x, list(range(x.ndim)), np.zeros(shape, dtype=x.dtype), out, out)
    if all(keep) and step == [1] * x.ndim and list(count) == list(x.shape):
        return x  # the whole tensor
    node = E.Slice(
        shape=shape,
        dtype=x.node.dtype,
        input=x.node,
        start=tuple(start),
        count=tuple(count),
        step=tuple(step),
        keep=tuple(keep),
    )
    return type(x)(x.session, node, x.bindings, x.options)


def _comparison(join: str) -> Callable[[TensorRelation, object, bool], TensorRelation]:
    return lambda x, y, r: binary(x, y, join, join, r)


#: numpy's binary ufuncs that are operators here: (relation, other, reflected) -> relation
UFUNCS = {
    "add": lambda x, y, r: binary(x, y, "add", "+", r),
    "subtract": lambda x, y, r: binary(x, y, "subtract", "-", r),
    "multiply": lambda x, y, r: binary(x, y, "multiply", "*", r),
    "divide": lambda x, y, r: binary(x, y, "divide", "/", r),
    "true_divide": lambda x, y, r: binary(x, y, "divide", "/", r),
    "matmul": lambda x, y, r: matmul(x, y, r),
    **{
        name: _comparison(name)
        for name in ("greater", "greater_equal", "less", "less_equal", "equal", "not_equal")
    },
}

#: numpy's one-input ufuncs that are maps: ``np.exp(relation)`` stays a lazy relation (so ``ts.grad`` sees
#: it) instead of computing the relation and returning an array
UNARY_UFUNCS = {
    "exp": "exp",
    "log": "log",
    "sqrt": "sqrt",
    "absolute": "abs",
    "negative": "neg",
    "square": "square",
    "reciprocal": "reciprocal",
    "tanh": "tanh",
}

__all__ = [
    "UFUNCS", "UNARY_UFUNCS", "astype", "axes_of", "binary", "getitem", "matmul", "mean", "power", "reduce",
    "transpose",
]  # fmt: skip
