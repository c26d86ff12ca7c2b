"""The module-level API: a numpy-compatible einsum on a default in-process session, and friends."""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import opt_einsum

from tensorsql import frontend
from tensorsql.dtypes import carrier_dtype
from tensorsql.errors import DTypeError, EinsumError, ShapeError
from tensorsql.relation import TensorRelation
from tensorsql.session import Session, as_array
from tensorsql.subscripts import parse, split_args

_default: Session | None = None
_default_lock = threading.Lock()


def connect(database: str = ":memory:", threads: int | None = None) -> Session:
    """A session on an embedded DuckDB: ``:memory:`` or a database file (created if missing)."""
    return Session(database, threads=threads)


def default_session() -> Session:
    global _default
    with _default_lock:
        if _default is None:
            _default = Session()
        return _default


def _numpy_result_dtype(arrays: Sequence[np.ndarray], dtype: object | None, casting: str) -> np.dtype:
    if casting not in ("no", "equiv", "safe", "same_kind", "unsafe"):
        raise DTypeError(f"casting={casting!r}: expected no, equiv, safe, same_kind or unsafe")
    if dtype is not None:
        try:
            want = np.dtype(dtype)  # type: ignore[call-overload]
        except TypeError as exc:
            raise DTypeError(f"unknown dtype={dtype!r}") from exc
        for i, a in enumerate(arrays):
            if not np.can_cast(a.dtype, want, casting):  # type: ignore[arg-type]
                raise DTypeError(
                    f"operand {i} of dtype {a.dtype} cannot be cast to dtype={want} with casting={casting!r}"
                )
        return want
    return np.result_type(*arrays) if arrays else np.dtype("float64")


def einsum(
    *args: object,
    out: np.ndarray | None = None,
    optimize: object = "auto",
    dtype: object | None = None,
    order: str = "K",
    casting: str = "safe",
    join: str | None = None,
    agg: str | None = None,
) -> object:
    """``numpy.einsum`` run as SQL through DuckDB: numpy arrays in, numpy array out.

    Takes numpy's keywords (``out``, ``dtype``, ``order``, ``casting``, ``optimize``) plus the extended
    EinSum's ``join``/``agg``. With any TensorRelation operand the result is a lazy TensorRelation in that
    relation's session (``out`` is then not allowed).
    """
    _, _, operands = split_args(args)
    rel_ops = [op for op in operands if isinstance(op, TensorRelation)]
    if rel_ops:
        if out is not None:
            raise ShapeError("out= is for numpy operands; a TensorRelation result is lazy")
        return rel_ops[0].session.einsum(*args, optimize=optimize, dtype=dtype, join=join, agg=agg)
    if order not in ("K", "A", "C", "F"):
        raise ShapeError(f"order={order!r}: expected one of K, A, C, F")
    arrays = [as_array(op, f"operand {i}") for i, op in enumerate(operands)]
    final = _numpy_result_dtype(arrays, dtype, casting)
    carrier = carrier_dtype(final)
    arrays = [a.astype(carrier, copy=False) for a in arrays]
    if isinstance(args[0], str):
        call_args = [args[0], *arrays]
    else:
        it = iter(arrays)
        call_args = [next(it) if i % 2 == 0 and i < 2 * len(arrays) else a for i, a in enumerate(args)]
    # computed right away, so the operands' memory can be borrowed instead of copied (numpy.einsum reads
    # its operands while they could change too)
    result = default_session().einsum(*call_args, optimize=optimize, join=join, agg=agg, copy=False)
    res = result.numpy()
    if res.dtype.name == carrier and carrier != final.name:  # computed in a wider carrier: cast back
        res = (res != 0) if final == np.bool_ else res.astype(final)
    if order == "F":
        res = np.asfortranarray(res)
    elif order == "C":  # a big interleaved contraction may come back as a transposed view (numpy())
        res = np.ascontiguousarray(res)
    if out is not None:
        if not isinstance(out, np.ndarray) or out.shape != res.shape:
            got = getattr(out, "shape", type(out).__name__)
            raise ShapeError(f"out= must be an ndarray of shape {res.shape}, got {got}")
        if not np.can_cast(res.dtype, out.dtype, casting):  # type: ignore[arg-type]
            raise DTypeError(f"result dtype {res.dtype} cannot be cast to out dtype {out.dtype} ({casting=})")
        np.copyto(out, res, casting="unsafe")
        return out
    return res[()] if res.ndim == 0 else res


def einsum_path(*args: object, optimize: object = "greedy") -> tuple[list[object], str]:
    """Like ``numpy.einsum_path``: (['einsum_path', (i, j), ...], a printable description)."""
    inputs, output, operands = split_args(args)
    shapes = [tuple(op.shape) if isinstance(op, TensorRelation) else np.shape(op) for op in operands]
    sub = parse(inputs, output, shapes)
    if len(sub.inputs) == 1:
        return ["einsum_path", (0,)], "single operand: no contraction path"
    path = frontend.contraction_path(sub, optimize)
    symbols = {x: opt_einsum.get_symbol(i) for i, x in enumerate(sub.labels())}
    eq = (
        ",".join("".join(symbols[x] for x in t) for t in sub.inputs)
        + "->"
        + "".join(symbols[x] for x in sub.output)
    )
    local_shapes = [tuple(sub.sizes[x] for x in t) for t in sub.inputs]
    try:
        _, info = opt_einsum.contract_path(eq, *local_shapes, shapes=True, optimize=path)
    except ValueError as exc:
        raise EinsumError(str(exc)) from exc
    return ["einsum_path", *path], str(info)


def _apply(x: object, fn: str, param: float | None = None) -> object:
    if isinstance(x, TensorRelation):
        return x.session.map(x, fn, param)
    arr = np.asarray(x)
    s = default_session()
    out = s.map(s.from_numpy(arr.astype(carrier_dtype(arr.dtype), copy=False)), fn, param).numpy()
    return out[()] if out.ndim == 0 else out


def map(x: object, fn: str, param: float | None = None) -> object:  # noqa: A001
    """Element-wise ``fn`` (exp, log, sqrt, relu, neg, abs, pow, scale, square, reciprocal)."""
    return _apply(x, fn, param)


def exp(x: object) -> object:
    return _apply(x, "exp")


def log(x: object) -> object:
    return _apply(x, "log")


def sqrt(x: object) -> object:
    return _apply(x, "sqrt")


def relu(x: object) -> object:
    return _apply(x, "relu")


def neg(x: object) -> object:
    return _apply(x, "neg")


def abs(x: object) -> object:  # noqa: A001
    return _apply(x, "abs")


def pow(x: object, exponent: float) -> object:  # noqa: A001
    return _apply(x, "pow", exponent)


def scale(x: object, factor: float) -> object:
    return _apply(x, "scale", factor)


def softmax(x: object, over: int | Sequence[int] = -1) -> object:
    """Softmax over the axes ``over``, built from EinSum steps (DESIGN.md):
    C = max over ``over``; E = exp(X - C); S = sum of E over ``over``; Y = E / S.
    """
    rel = x if isinstance(x, TensorRelation) else None
    s = rel.session if rel is not None else default_session()
    if rel is None:
        arr = np.asarray(x)
        arr = arr.astype(np.result_type(arr.dtype, np.float32) if arr.dtype.kind != "c" else arr.dtype)
        rel = s.from_numpy(arr.astype(carrier_dtype(arr.dtype), copy=False))
    ndim = rel.ndim
    axes = (over,) if isinstance(over, int) else tuple(over)
    norm: list[int] = []
    for a in axes:
        if not isinstance(a, int) or not -ndim <= a < ndim:
            raise ShapeError(f"softmax: axis {a!r} is out of range for a tensor of shape {rel.shape}")
        norm.append(a % ndim)
    if len(set(norm)) != len(norm) or not norm:
        raise ShapeError(f"softmax: over={over!r} must name distinct axes of shape {rel.shape}")
    letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]
    keep = "".join(c for i, c in enumerate(letters) if i not in norm)
    if rel.dtype.kind in "iu":
        rel = s.map(rel, "scale", 1.0)  # promotes to float64
    c = s.einsum(f"{letters}->{keep}", rel, agg="max")
    e = s.map(s.einsum(f"{letters},{keep}->{letters}", rel, c, join="subtract"), "exp")
    total = s.einsum(f"{letters}->{keep}", e)
    y = s.einsum(f"{letters},{keep}->{letters}", e, total, join="divide")
    if isinstance(x, TensorRelation):
        return y
    out = y.numpy()
    return out[()] if out.ndim == 0 else out
