"""The one table of operators: every join (⊗), aggregation (⊕) and element-wise map tensorsql knows.

Each row says what the front end, the planner glue, the lowering and SQL generation need to know about an
operator: its kind, its scalar arity, whether it is defined for complex dtypes, what integer input does,
its aggregation identity, whether it takes a parameter, and a one-line doc. Everything else derives from it:
the ``JOINS``/``AGGS``/``MAPS``/``FLOAT_MAPS`` name tuples, ``AGG_FUNCS`` (the SQL aggregate per agg), the
checks (``check_ops``, ``check_map``), the dtype rules (``map_dtype``, ``join_dtype``), the identities
(``agg_identity``) and the docs' operator table (``markdown_table``).

Adding an operator is one row here, plus its name in ``planner/ops.py`` (the planner imports nothing from
tensorsql) and one line in the C++ kernels' table (``udf_kernels/src/ops.hpp``).
``tests/kernels/test_ops_table.py`` checks the three agree, and runs every operator in the kernels against
numpy.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from tensorsql.errors import DTypeError, EinsumError, OperatorError, RangeError

__all__ = [
    "AGGS",
    "AGG_FUNCS",
    "ALWAYS",
    "FLOAT_MAPS",
    "FRACTIONAL_PARAM",
    "JOINS",
    "KINDS",
    "MAPS",
    "NEGATIVE_OR_FRACTIONAL_PARAM",
    "NEVER",
    "OPS",
    "Op",
    "agg_identity",
    "check_empty_reduction",
    "check_map",
    "check_ops",
    "join_dtype",
    "lookup",
    "map_dtype",
    "map_param",
    "markdown_table",
]

#: Operator kinds: a join combines the two operands' elements, an aggregation reduces over the labels not in
#: the output, a map applies an element-wise function to one operand.
KINDS = ("join", "agg", "map")

# What integer input does (``Op.promotes``):
#: integer input stays integer (numpy's wrapping arithmetic)
NEVER = "never"
#: integer input is promoted to float64 first: a float-valued function, as in numpy
ALWAYS = "always"
#: integer input is promoted to float64 when the param is not an integer
FRACTIONAL_PARAM = "non-integer param"
#: integer input is promoted to float64 when the param is not an integer >= 0 (numpy: an integer to a
#: negative integer power is an error)
NEGATIVE_OR_FRACTIONAL_PARAM = "negative or non-integer param"


@dataclass(frozen=True)
class Op:
    """One operator.

    - ``arity``: operands of the scalar function (a join f(x, y): 2; an aggregation's combine step
      acc ⊕ x, associative and commutative: 2; a map f(x): 1; a map's ``param`` is not counted);
    - ``complex``: defined for complex64/complex128;
    - ``promotes``: what integer input does (``NEVER``, ``ALWAYS``, ``FRACTIONAL_PARAM``,
      ``NEGATIVE_OR_FRACTIONAL_PARAM``);
    - ``identity``: an aggregation's identity element in float dtypes (``agg_identity`` gives it per dtype:
      ±inf becomes the integer dtype's min/max);
    - ``param``: what a map's parameter is ("exponent", "factor"), None when it takes none;
    - ``real_result``: complex input gives a real result (numpy's abs);
    - ``numpy``: a map's numpy form ``f(x, p)``, whose result dtype is the map's (``map_dtype``);
    - ``empty``: an aggregation's numpy ufunc name when numpy has no result over an empty axis (max:
      "maximum"; ``check_empty_reduction``), None when the identity is the result (sum: 0, prod: 1).
    """

    name: str
    kind: str
    arity: int
    complex: bool
    promotes: str
    doc: str
    identity: float | None = None
    param: str | None = None
    real_result: bool = False
    numpy: Callable[[np.ndarray, object], np.ndarray] | None = None
    empty: str | None = None

    @property
    def takes_param(self) -> bool:
        return self.param is not None

    @property
    def sql_function(self) -> str:
        """The extension's SQL function that runs it: ``tensor_einsum``/``tensor_einsum_agg`` take joins and
        aggs by name, ``tensor_map`` maps; an agg also has its own aggregate, ``tensor_<agg>``."""
        return {"join": "tensor_einsum", "agg": f"tensor_{self.name}", "map": "tensor_map"}[self.kind]


_INF = math.inf


def _sigmoid(x: np.ndarray) -> np.ndarray:
    if x.dtype.kind in "biu":  # numpy's float result dtype for x first (-x of an unsigned int wraps)
        x = x.astype(np.exp(x[:0]).dtype)
    e = np.exp(-np.abs(x))  # never overflows
    return np.where(x >= 0, 1 / (1 + e), e / (1 + e))

#: The table. Order is the order names are listed to users (errors, docs) and in the C++ kernels' table.
OPS: tuple[Op, ...] = (
    # joins: z = x ⊗ y
    Op("multiply", "join", 2, True, NEVER, "x * y (with agg=sum: a contraction, run as GEMM)"),
    Op("add", "join", 2, True, NEVER, "x + y"),
    Op("subtract", "join", 2, True, NEVER, "x - y"),
    Op("divide", "join", 2, True, ALWAYS, "x / y (integers promote to float64, as numpy's /)"),
    Op("sqdiff", "join", 2, True, NEVER, "(x - y)²: with agg=sum, squared L2 distances"),
    Op(
        "absdiff",
        "join",
        2,
        False,
        NEVER,
        "|x - y|: with agg=max, L-infinity distances (numpy's `np.abs(x - y)`: wraps on unsigned types)",
    ),
    Op("max", "join", 2, False, NEVER, "maximum(x, y), NaN-propagating"),
    Op("min", "join", 2, False, NEVER, "minimum(x, y), NaN-propagating"),
    Op("greater", "join", 2, False, NEVER, "1 where x > y, else 0 (a mask in the operands' dtype)"),
    Op("greater_equal", "join", 2, False, NEVER, "1 where x >= y, else 0"),
    Op("less", "join", 2, False, NEVER, "1 where x < y, else 0"),
    Op("less_equal", "join", 2, False, NEVER, "1 where x <= y, else 0"),
    Op("equal", "join", 2, False, NEVER, "1 where x == y, else 0 (NaN equals nothing)"),
    Op("not_equal", "join", 2, False, NEVER, "1 where x != y, else 0"),
    # aggregations: acc ⊕ x over the labels not in the output
    Op("sum", "agg", 2, True, NEVER, "sum (integers wrap)", identity=0.0),
    Op("max", "agg", 2, False, NEVER, "maximum, NaN-propagating", identity=-_INF, empty="maximum"),
    Op("min", "agg", 2, False, NEVER, "minimum, NaN-propagating", identity=_INF, empty="minimum"),
    Op("prod", "agg", 2, True, NEVER, "product (integers wrap)", identity=1.0),
    # maps: z = f(x)
    Op("exp", "map", 1, True, ALWAYS, "e^x", numpy=lambda x, p: np.exp(x)),
    Op("log", "map", 1, True, ALWAYS, "natural logarithm", numpy=lambda x, p: np.log(x)),
    Op("sqrt", "map", 1, True, ALWAYS, "square root", numpy=lambda x, p: np.sqrt(x)),
    Op("relu", "map", 1, False, NEVER, "max(x, 0)", numpy=lambda x, p: np.maximum(x, 0)),
    Op("neg", "map", 1, True, NEVER, "-x", numpy=lambda x, p: np.negative(x)),
    Op(
        "abs",
        "map",
        1,
        True,
        NEVER,
        "|x| (complex input gives a real result)",
        real_result=True,
        numpy=lambda x, p: np.abs(x),
    ),
    Op(
        "pow",
        "map",
        1,
        True,
        NEGATIVE_OR_FRACTIONAL_PARAM,
        "x ** param",
        param="exponent",
        numpy=lambda x, p: np.power(x, p),
    ),
    Op(
        "scale",
        "map",
        1,
        True,
        FRACTIONAL_PARAM,
        "x * param",
        param="factor",
        numpy=lambda x, p: np.multiply(x, p),
    ),
    Op("square", "map", 1, True, NEVER, "x * x", numpy=lambda x, p: np.multiply(x, x)),
    Op("reciprocal", "map", 1, True, ALWAYS, "1 / x", numpy=lambda x, p: np.true_divide(1, x)),
    Op(
        "sigmoid",
        "map",
        1,
        False,
        ALWAYS,
        "1 / (1 + e^-x), without overflow (real dtypes)",
        numpy=lambda x, p: _sigmoid(x),
    ),
    Op("tanh", "map", 1, True, ALWAYS, "hyperbolic tangent", numpy=lambda x, p: np.tanh(x)),
    Op(
        "softplus",
        "map",
        1,
        False,
        ALWAYS,
        "log(1 + e^x), without overflow (real dtypes)",
        # 0 of x's own dtype: a Python 0 made a bool x's result float64, where exp's is float16
        numpy=lambda x, p: np.logaddexp(np.zeros((), x.dtype), x),
    ),
    Op(
        "rpow",
        "map",
        1,
        False,
        ALWAYS,
        "param ** x (a number to the power of a real tensor: libm's pow, as numpy's)",
        param="base",
        numpy=lambda x, p: np.power(float(p), x),  # a weak Python float: x32 stays float32
    ),
)

_BY_KEY: Mapping[tuple[str, str], Op] = MappingProxyType({(op.kind, op.name): op for op in OPS})


def _names(kind: str) -> tuple[str, ...]:
    return tuple(op.name for op in OPS if op.kind == kind)


#: Join names (⊗), in table order.
JOINS: tuple[str, ...] = _names("join")
#: Aggregation names (⊕), in table order.
AGGS: tuple[str, ...] = _names("agg")
#: Map names, in table order.
MAPS: tuple[str, ...] = _names("map")
#: Maps whose result is float for integer input (the input is promoted first, as numpy does).
FLOAT_MAPS: tuple[str, ...] = tuple(op.name for op in OPS if op.kind == "map" and op.promotes == ALWAYS)
#: agg -> the extension's aggregate that reduces blocks with it (tensor_sum, ...).
AGG_FUNCS: Mapping[str, str] = MappingProxyType({op.name: op.sql_function for op in OPS if op.kind == "agg"})

_LISTED = {"join": "valid joins", "agg": "valid aggregations", "map": "valid"}
_WHAT = {"join": "join", "agg": "agg", "map": "map function"}


def lookup(kind: str, name: object) -> Op:
    """The operator ``name`` of ``kind`` ("join", "agg" or "map"); OperatorError naming the valid ones."""
    if kind not in KINDS:
        raise ValueError(f"unknown operator kind {kind!r}; kinds: {', '.join(KINDS)}")
    op = _BY_KEY.get((kind, name)) if isinstance(name, str) else None
    if op is None:
        raise OperatorError(f"unknown {_WHAT[kind]} {name!r}; {_LISTED[kind]}: {', '.join(_names(kind))}")
    return op


def _is_integer(dtype: str) -> bool:
    return dtype.startswith(("int", "uint"))


def _is_complex(dtype: str) -> bool:
    return dtype.startswith("complex")


def check_ops(join: str, agg: str, dtype: str) -> None:
    """A join and an agg that exist and are defined for ``dtype`` (the einsum's result dtype)."""
    j, a = lookup("join", join), lookup("agg", agg)
    if _is_complex(dtype) and not (j.complex and a.complex):
        raise DTypeError(f"join={join!r}, agg={agg!r} is not defined for complex dtype {dtype}")


def join_dtype(join: str, dtype: str) -> str:
    """The dtype a join computes in when its operands' common dtype is ``dtype`` (divide: float64 for
    integers)."""
    return "float64" if _is_integer(dtype) and lookup("join", join).promotes == ALWAYS else dtype


def check_map(fn: str, param: object = None) -> float | None:
    """Validates a map and its param; returns the param as a float (None for a map that takes none)."""
    op = lookup("map", fn)
    if op.param is None:
        if param is not None:
            raise OperatorError(f"map {fn!r} takes no param, got {param!r}")
        return None
    if param is None:
        raise OperatorError(f"map {fn!r} needs a param (the {op.param})")
    if isinstance(param, int | np.integer) and not isinstance(param, bool | np.bool_):
        as_float = float(param)
        if not math.isfinite(as_float) or int(as_float) != int(param):
            # params travel to the kernels as a DOUBLE: never rounded silently (2**53 + 1 -> 2**53)
            raise RangeError(
                f"map {fn!r}: integer param {int(param)} has no exact float64 value (a map's param is "
                "carried as a float64: integers up to 2**53 in magnitude are exact)"
            )
        return as_float
    # float("2") would read a string as the number, and float(relation) compute the relation while the graph
    # is built (its value frozen into the plan, and no gradient into it)
    if isinstance(param, str | bytes | bool | np.bool_) or hasattr(param, "node"):
        raise OperatorError(f"map {fn!r}: param {param!r} is not a number")
    try:
        return float(param)  # type: ignore[arg-type]
    except (TypeError, ValueError, OverflowError) as exc:
        raise OperatorError(f"map {fn!r}: param {param!r} is not a number") from exc


def map_param(param: float | None) -> int | float | None:
    """A map's param as numpy sees it: an integer value is a Python int (``pow(x, 2.0)`` is ``x ** 2``, which
    keeps an integer dtype; numpy 2 would promote for the float 2.0), anything else a float."""
    if param is None or not math.isfinite(param) or param != int(param):
        return param
    return int(param)


def map_dtype(fn: str, dtype: str, param: float | None = None) -> str:
    """numpy's result dtype of map ``fn`` on ``dtype`` input (with ``param`` as ``map_param`` gives it),
    found by running the map's numpy form on an empty array: exp of int8 is float16, abs of complex64 float32,
    relu of uint64 uint64. It may be a dtype relations do not hold (float16, bool): a carrier computes it.

    One deliberate difference: an integer to a negative integer power is float64 (numpy raises). Raises
    DTypeError where numpy has no loop for the dtype (neg of bool, relu of complex) and RangeError for an
    integer param the integer dtype cannot hold (numpy 2's OverflowError: ``scale(int8, 300)``).
    """
    op = lookup("map", fn)
    if _is_complex(dtype) and not op.complex:
        raise DTypeError(f"map {fn!r} is not defined for complex dtype {dtype}")
    return _numpy_map_dtype(op.name, dtype, map_param(param))


@functools.lru_cache(maxsize=1024)
def keeps_zero(fn: str, dtype: str, param: float | None = None) -> bool:
    """Whether map ``fn`` (with ``param``) sends 0 to 0 for ``dtype`` input, by its numpy form: a map that
    does not (exp, sigmoid, log, reciprocal, pow with an exponent <= 0, ...) must also run on the zero
    blocks a relation leaves out (``T.Densify``)."""
    op = lookup("map", fn)
    zero = np.zeros(1, dtype=dtype)
    with np.errstate(all="ignore"):
        try:
            out = np.asarray(op.numpy(zero, map_param(param)))
        except (ValueError, ArithmeticError):  # numpy refuses an integer to a negative power: 1/0 is not 0
            out = np.asarray(op.numpy(zero.astype(np.float64), param))
    return bool(np.all(out == 0))


@functools.lru_cache(maxsize=1024)
def _numpy_map_dtype(fn: str, dtype: str, p: int | float | None) -> str:
    op = lookup("map", fn)
    integral = _is_integer(dtype) or dtype == "bool"  # numpy's bool ** -1 is int8's (refused), not a bool
    if op.promotes == NEGATIVE_OR_FRACTIONAL_PARAM and isinstance(p, int) and p < 0 and integral:
        return "float64"
    assert op.numpy is not None
    try:
        with np.errstate(all="ignore"):
            return op.numpy(np.zeros(0, dtype=dtype), p).dtype.name
    except OverflowError as exc:
        raise RangeError(
            f"map {fn!r}: {op.param} {p!r} is out of range for dtype {dtype} (numpy: {exc}); "
            f"cast the input to a wider dtype, or give a float {op.param}"
        ) from exc
    except TypeError as exc:
        raise DTypeError(f"map {fn!r} is not defined for dtype {dtype} (numpy: {exc})") from exc


def check_empty_reduction(agg: str, label: str, size: int) -> None:
    """numpy's rule for a reduction over an empty axis: the identity is the result where the aggregation has
    one (sum: 0, prod: 1); max and min have none and raise, as ``np.max`` over an empty axis does."""
    op = lookup("agg", agg)
    if size == 0 and op.empty is not None:
        raise EinsumError(
            f"agg={agg!r} reduces over label {label!r} of size 0 and has no identity (numpy: zero-size array "
            f"to reduction operation {op.empty} which has no identity)"
        )


def agg_identity(agg: str, dtype: str | np.dtype) -> np.generic:
    """The identity of aggregation ``agg`` as a numpy scalar of ``dtype`` (max: -inf, or the integer dtype's
    minimum; min: +inf or its maximum)."""
    op = lookup("agg", agg)
    dt = np.dtype(dtype)
    assert op.identity is not None
    if np.issubdtype(dt, np.integer) and math.isinf(op.identity):
        info = np.iinfo(dt)
        return dt.type(info.min if op.identity < 0 else info.max)
    return dt.type(op.identity)


def _identity_text(op: Op) -> str:
    if op.identity is None:
        return ""
    if math.isinf(op.identity):
        return "-inf (integers: dtype min)" if op.identity < 0 else "+inf (integers: dtype max)"
    return f"{op.identity:g}"


def _promotes_text(op: Op) -> str:
    if op.promotes == NEVER:
        return ""
    return "→ float64" + ("" if op.promotes == ALWAYS else f" for a {op.promotes}")


def markdown_table() -> str:
    """The operator table in Markdown, as the docs show it; ``tests/kernels/test_ops_table.py`` checks it."""
    lines = [
        "| operator | kind | arity | complex | integer input | identity | param | what |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for op in OPS:
        cells = [
            f"`{op.name}`",
            op.kind,
            str(op.arity),
            "yes" if op.complex else "no",
            _promotes_text(op),
            _identity_text(op),
            op.param or "",
            op.doc,
        ]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # python -m tensorsql.ir.ops: print the table
    print(markdown_table(), end="")
