"""The module-level API: a numpy-compatible einsum on a default in-process session, and friends."""

from __future__ import annotations

import operator
import threading
from collections.abc import Hashable, Sequence

import numpy as np
import opt_einsum

from tensorsql.compile.cache import Entry, hashable
from tensorsql.dtypes import carrier_dtype
from tensorsql.errors import DTypeError, EinsumError, ShapeError
from tensorsql.frontend import numpy as frontend
from tensorsql.frontend.subscripts import parse, split_args
from tensorsql.ir import expr as E
from tensorsql.ir import ops
from tensorsql.relation import TensorRelation
from tensorsql.session import Session, as_array

_default: Session | None = None
_default_lock = threading.Lock()


def connect(
    database: str = ":memory:",
    threads: int | None = None,
    *,
    strategy: str = "eindecomp",
    read_only: bool = False,
    progress: bool | None = None,
) -> Session:
    """A session on an embedded DuckDB: ``:memory:`` or a database file (created if missing).

    ``threads``: DuckDB's and the kernels' threads; ``strategy``: the session's default blocking strategy
    (``eindecomp``, ``sqrt``, ``data``, ``model``, ``none``, ``operands``); ``read_only``: open a database
    file for reading only (several processes may do so at once; a writer holds the file's lock alone);
    ``progress``: a progress bar on stderr for long queries (None: on when stderr is a terminal, unless
    ``TENSORSQL_PROGRESS=0``).
    """
    from tensorsql.backends.duckdb.executor import DuckDBExecutor

    executor = DuckDBExecutor(database, threads=threads, read_only=read_only, progress=progress)
    return Session(executor, strategy=strategy)


def default_session() -> Session:
    """The in-process session ``ts.einsum`` runs on (a new one if the last was closed)."""
    global _default
    with _default_lock:
        if _default is None or getattr(_default.executor, "closed", False):
            _default = connect()
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


def _call_key(spec: Hashable, arrays: Sequence[np.ndarray], optimize: object, join: object, agg: object):
    opt = hashable(optimize)
    if spec is None or opt is None:
        return None
    return ("einsum", spec, tuple((a.shape, a.dtype.str) for a in arrays), opt, join, agg)


def _spec_of(args: Sequence[object]) -> Hashable | None:
    """The subscripts of a call, without its arrays (the string, or the sublists of the interleaved form)."""
    if isinstance(args[0], str):
        return ("str", args[0])
    return hashable([a for i, a in enumerate(args) if i % 2 == 1 or (i == len(args) - 1 and len(args) % 2)])


def _entry(s: Session, call_args: list[object], key: Hashable | None, **kw: object) -> Entry:
    entry = s.plans.get(key) if key is not None else None
    if entry is None:
        rel = s.einsum(*call_args, copy=False, **kw)  # type: ignore[arg-type]
        entry = Entry(tuple(rel.bindings), rel.plan())
        if key is not None:
            s.plans.put(key, entry)
    return entry


def _finish(res: np.ndarray, final: np.dtype, carrier: str, order: str, out: object, casting: str) -> object:
    if carrier != final.name and res.dtype.name == carrier:  # computed in a wider carrier: cast back
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
    relation's session (``out`` is then not allowed). Repeated calls of one equation, shapes and dtypes reuse
    their plan and prepared statement (``Session.plans``).
    """
    # the string form's operands follow the string: no need to parse it before the plan cache is asked
    operands = list(args[1:]) if args and isinstance(args[0], str) else split_args(args)[2]
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
    s = default_session()
    key = _call_key(_spec_of(args), arrays, optimize, join, agg)
    # computed right away, so the operands' memory can be borrowed instead of copied (numpy.einsum reads
    # its operands while they could change too)
    entry = _entry(s, call_args, key, optimize=optimize, join=join, agg=agg)
    res = s.value(entry.plan, dict(zip(entry.leaves, arrays, strict=True)))  # type: ignore[arg-type]
    return _finish(res, final, carrier, order, out, casting)


class ContractExpression:
    """``contract_expression``'s callable: ``expr(*arrays, out=None)``, planned once per operand dtypes."""

    def __init__(
        self,
        subscripts: str,
        shapes: Sequence[tuple[int, ...] | np.ndarray],
        *,
        constants: Sequence[int] = (),
        optimize: object = "auto",
        dtype: object | None = None,
        order: str = "K",
        casting: str = "safe",
        join: str | None = None,
        agg: str | None = None,
        session: Session | None = None,
    ) -> None:
        if not isinstance(subscripts, str):
            raise EinsumError(
                f"contract_expression takes a subscripts string, got {type(subscripts).__name__}"
            )
        consts = set(constants)
        if any(not isinstance(c, int) or not 0 <= c < len(shapes) for c in consts):
            raise EinsumError(f"constants={list(constants)!r}: positions must be in 0..{len(shapes) - 1}")
        self._constants = {i: as_array(shapes[i], f"constant {i}") for i in sorted(consts)}
        self.shapes: list[tuple[int, ...]] = []
        for i, shp in enumerate(shapes):
            if i in consts:
                self.shapes.append(self._constants[i].shape)
                continue
            try:
                self.shapes.append(tuple(operator.index(n) for n in shp))  # type: ignore[union-attr]
            except (TypeError, ValueError) as exc:
                raise ShapeError(f"shape {i} = {shp!r} is not a sequence of ints") from exc
        inputs, output, _ = split_args([subscripts, *self.shapes])
        parse(inputs, output, self.shapes)  # the equation and shapes agree, or an EinsumError now
        if order not in ("K", "A", "C", "F"):
            raise ShapeError(f"order={order!r}: expected one of K, A, C, F")
        self.subscripts = subscripts
        self.num_args = len(shapes) - len(consts)
        self._kw = {"optimize": optimize, "join": join, "agg": agg}
        self._dtype, self._order, self._casting = dtype, order, casting
        self._session = session
        self._entries: dict[tuple[np.dtype, ...], tuple[Entry, np.dtype, str, np.dtype, bool]] = {}

    def __call__(self, *arrays: object, out: np.ndarray | None = None, **_: object) -> object:
        if len(arrays) != self.num_args:
            raise EinsumError(f"this expression takes {self.num_args} arrays, got {len(arrays)}")
        if self._constants:
            given = iter(arrays)
            full = [
                self._constants[i] if i in self._constants else as_array(next(given), f"operand {i}")
                for i in range(len(self.shapes))
            ]
        else:
            full = [
                a if isinstance(a, np.ndarray) else as_array(a, f"operand {i}") for i, a in enumerate(arrays)
            ]
        for i, (a, shp) in enumerate(zip(full, self.shapes, strict=True)):
            if a.shape != shp:
                raise ShapeError(f"operand {i} has shape {a.shape}, but the expression was built for {shp}")
        sig = tuple(a.dtype for a in full)
        found = self._entries.get(sig)
        s = self._session or default_session()
        if found is None:
            final = _numpy_result_dtype(full, self._dtype, self._casting)
            carrier = carrier_dtype(final)
            cast = [a.astype(carrier, copy=False) for a in full]
            entry = _entry(s, [self.subscripts, *cast], None, **self._kw)
            found = self._entries[sig] = (entry, final, carrier, np.dtype(carrier), carrier == final.name)
        entry, final, carrier, cdt, same = found
        cast = [a if a.dtype == cdt else a.astype(cdt) for a in full]
        res = s.value(entry.plan, dict(zip(entry.leaves, cast, strict=True)))  # type: ignore[arg-type]
        if same and out is None and self._order == "K":
            return res[()] if res.ndim == 0 else res
        return _finish(res, final, carrier, self._order, out, self._casting)

    def __repr__(self) -> str:
        return f"<ContractExpression('{self.subscripts}')>"


def contract_expression(subscripts: str, *shapes: object, constants: Sequence[int] = (), **kwargs: object):
    """opt_einsum's ``contract_expression``: a reusable callable for one equation and operand shapes, planned
    once (per operand dtypes) and then run on new arrays for the cost of one engine round trip.

    ``constants``: positions whose entries in ``shapes`` are arrays fixed for every call. Keywords: numpy's
    ``optimize``/``dtype``/``order``/``casting``, the extended EinSum's ``join``/``agg``, and ``session``.
    """
    return ContractExpression(subscripts, shapes, constants=constants, **kwargs)  # type: ignore[arg-type]


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
    """A map of an array has numpy's result dtype (``ops.map_dtype``): computed in the relation dtype that
    carries it (float16 in float32, bool in int64), then cast to it."""
    if isinstance(x, TensorRelation):
        return x.session.map(x, fn, param)
    arr = as_array(x, fn)
    final = np.dtype(ops.map_dtype(fn, arr.dtype.name, ops.check_map(fn, param)))
    arr = arr.astype(carrier_dtype(arr.dtype), copy=False)
    s = default_session()
    opt = hashable(param)
    key = None if opt is None else ("map", fn, opt, arr.shape, arr.dtype.str)
    entry = s.plans.get(key) if key is not None else None
    if entry is None:  # the array is an operand of the plan (lent to the query), planned once per shape
        leaf = E.Operand(shape=arr.shape, dtype=arr.dtype.name, name="x")
        entry = Entry((leaf,), s.map(TensorRelation(s, leaf, {leaf: arr}), fn, param).plan())
        if key is not None:
            s.plans.put(key, entry)
    out = s.value(entry.plan, {entry.leaves[0]: arr})  # type: ignore[dict-item]
    if out.dtype != final:  # float16 overflows to inf as numpy's float16 result does: no warning
        with np.errstate(over="ignore"):
            out = (out != 0) if final == np.bool_ else out.astype(final)
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
    """Softmax over the axes ``over``, built from EinSum steps (README "Element-wise maps and softmax"):
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
