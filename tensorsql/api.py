"""The module-level API: a numpy-compatible einsum on a default in-process session, and friends."""

from __future__ import annotations

import itertools
import operator
import os
import threading
from collections.abc import Callable, Hashable, Sequence
from typing import TypeVar

import numpy as np
import opt_einsum

from tensorsql import autodiff, operators
from tensorsql.arguments import as_array
from tensorsql.backends.base import Executor
from tensorsql.compile import planning
from tensorsql.compile.cache import Entry, hashable
from tensorsql.dtypes import carrier_dtype
from tensorsql.errors import (
    ConfigError,
    DeviceError,
    DTypeError,
    EinsumError,
    EinsumTypeError,
    OutputError,
    SessionClosedError,
    ShapeError,
    ShapeTypeError,
)
from tensorsql.frontend import numpy as frontend
from tensorsql.frontend import sql as sqlfront
from tensorsql.frontend.subscripts import Subscripts, parse, split_args, subscripts_text
from tensorsql.ir import expr as E
from tensorsql.ir import ops
from tensorsql.relation import TensorRelation
from tensorsql.session import Session

_default: Session | None = None
_default_lock = threading.Lock()


def connect(
    database: str = ":memory:",
    threads: int | None = None,
    *,
    strategy: str = "eindecomp",
    read_only: bool = False,
    progress: bool | None = None,
    memory_limit: int | str | None = None,
    temp_directory: str | os.PathLike[str] | None = None,
    max_block_bytes: int | str | None = None,
    workers: int | None = None,
    threads_per_worker: int | None = None,
    cluster: object = None,
    worker_memory_limit: int | str | None = None,
    spill: bool = False,
    device: str = "cpu",
) -> Session:
    """A session on an embedded DuckDB: ``:memory:`` or a database file (created if missing).

    ``threads``: DuckDB's and the kernels' threads; ``strategy``: the session's default blocking strategy
    (``eindecomp``, ``sqrt``, ``data``, ``model``, ``none``, ``operands``); ``read_only``: open a database
    file for reading only (several processes may do so at once; a writer holds the file's lock alone);
    ``progress``: a progress bar on stderr for long queries (None: on when stderr is a terminal, unless
    ``TENSORSQL_PROGRESS=0``).

    Memory (docs "Memory and limits"): ``memory_limit`` bounds DuckDB's buffers and, separately, the
    kernels' own memory (bytes, or a size string such as ``"2GB"``, ``"512MiB"``, ``"50%"``; None: DuckDB's
    default, 80% of the machine's memory); ``temp_directory`` is where DuckDB spills what does not fit;
    ``max_block_bytes`` caps every block a plan makes (None: ``TENSORSQL_MAX_BLOCK_BYTES``, else 256 MiB or
    less under a small memory_limit). Running out raises OutOfMemoryError.

    ``device``: where the block kernels run: ``"cpu"`` (the default), ``"cuda"`` / ``"cuda:<n>"``
    (docs "GPUs"; DeviceError says why when the machine cannot), ``"cuda-emulated"`` (the GPU path
    on the host, for tests).
    """
    from tensorsql.backends.cuda.executor import parse_device

    kind, ordinal = parse_device(device)
    if kind != "cpu" and (workers is not None or cluster is not None):
        raise DeviceError(
            f"device={device!r} on a cluster session is not supported yet: GPU workers are not built "
            "(docs 'GPUs')"
        )
    if workers is not None or cluster is not None:
        for value, what in ((threads, "threads"), (temp_directory, "temp_directory")):
            if value is not None:
                raise ConfigError(
                    f"{what}= is for a single-process session; a cluster's workers take threads_per_worker= "
                    "(a local cluster) and spill= (under each worker's local directory)"
                )
        if cluster is not None and threads_per_worker is not None:
            raise ConfigError(
                "threads_per_worker= sizes the workers a local cluster starts; an attached cluster's workers "
                "have their own (dask worker --nthreads)"
            )
        # what the session checks, checked before a cluster starts: a bad option left it running
        planning.check_strategy(strategy)
        if progress is not None and not isinstance(progress, bool):
            raise ConfigError(f"progress={progress!r} must be a bool or None")
        executor = _cluster_executor(
            database,
            workers,
            1 if threads_per_worker is None else threads_per_worker,
            cluster,
            read_only,
            memory_limit,
            max_block_bytes,
            progress,
            worker_memory_limit,
            spill,
        )
        try:
            return Session(executor, strategy=strategy)
        except BaseException:
            executor.close()
            raise
    for given, what in (
        (worker_memory_limit is not None, "worker_memory_limit"),
        (spill is not False, "spill"),
        (threads_per_worker is not None, "threads_per_worker"),
    ):
        if given:
            raise ConfigError(f"{what}= is for a cluster session (workers= or cluster=)")
    from tensorsql.backends.duckdb.executor import DuckDBExecutor

    options = dict(
        threads=threads,
        read_only=read_only,
        progress=progress,
        memory_limit=memory_limit,
        temp_directory=temp_directory,
        max_block_bytes=max_block_bytes,
    )
    if kind != "cpu":
        from tensorsql.backends.cuda.executor import CudaExecutor

        gpu = CudaExecutor(database, ordinal=ordinal, emulated=kind == "cuda-emulated", **options)
        return Session(gpu, strategy=strategy)
    return Session(DuckDBExecutor(database, **options), strategy=strategy)  # type: ignore[arg-type]


def _cluster_executor(
    database: str,
    workers: int | None,
    threads_per_worker: int,
    cluster: object,
    read_only: bool,
    memory_limit: int | str | None,
    max_block_bytes: int | str | None,
    progress: bool | None = None,
    worker_memory_limit: int | str | None = None,
    spill: bool = False,
) -> Executor:
    """The Dask executor: a LocalCluster of ``workers`` processes it starts (and stops with the session), or
    the running cluster ``cluster`` names (a scheduler address or a ``distributed.Client``)."""
    if workers is not None and cluster is not None:
        raise ConfigError("give workers= (start a local cluster) or cluster= (attach to one), not both")
    if not isinstance(spill, bool):
        raise ConfigError(f"spill={spill!r} must be a bool")
    if cluster is not None and worker_memory_limit is not None:
        raise ConfigError("worker_memory_limit= sizes the workers a local cluster starts; an attached "
                          "cluster's workers have their own (dask worker --memory-limit)")
    from tensorsql.backends.dask import executor as dask_executor

    if cluster is not None:
        passed = not isinstance(cluster, str)
        client = dask_executor.attach(cluster)
        try:
            return dask_executor.DaskExecutor(
                client, own_client=not passed, database=database, read_only=read_only,
                memory_limit=memory_limit, max_block_bytes=max_block_bytes, progress=progress, spill=spill,
            )
        except BaseException:
            if not passed:  # the Client attach made: a Client the caller gave stays theirs
                client.close()
            raise
    client, local = dask_executor.start(workers, threads_per_worker, worker_memory_limit)  # type: ignore[arg-type]
    try:
        return dask_executor.DaskExecutor(
            client, cluster=local, database=database, read_only=read_only,
            memory_limit=memory_limit, max_block_bytes=max_block_bytes, progress=progress, spill=spill,
        )
    except BaseException:
        client.close()
        local.close()
        raise


def default_session() -> Session:
    """The in-process session ``ts.einsum`` runs on (a new one if the last was closed)."""
    global _default
    with _default_lock:
        if _default is None or _default.closed:
            _default = connect()
        return _default


_T = TypeVar("_T")


def _on_default(run: Callable[[Session], _T]) -> _T:
    """``run(default_session())``; once more on a new default session when the one it got was closed
    meanwhile: another thread's ``close()`` between the lookup and the call makes the call fail with
    SessionClosedError (nothing of it had run: its first step needs the open session)."""
    s = default_session()
    try:
        return run(s)
    except SessionClosedError:
        if not s.closed:
            raise
        return run(default_session())


def _order(order: object) -> str:
    """numpy's ``order=``: 'C', 'F', 'A' or 'K' in either case (str or bytes); None is the default 'K'."""
    if order is None:
        return "K"
    if isinstance(order, bytes):
        order = order.decode("latin-1")
    if not isinstance(order, str):
        raise EinsumTypeError(f"order must be a str, not {type(order).__name__}")
    if order.upper() not in ("K", "A", "C", "F"):
        raise ConfigError(f"order={order!r}: expected one of 'C', 'F', 'A' or 'K' (either case)")
    return order.upper()


def _check_exact(dtype: np.dtype) -> np.dtype:
    """``dtype`` when the kernels compute it exactly; numpy's longdouble and clongdouble are refused."""
    if dtype.kind in "fc" and dtype.itemsize > (8 if dtype.kind == "f" else 16):
        bits = np.finfo(dtype).nmant + 1
        name = "longdouble" if dtype.kind == "f" else "clongdouble"
        raise DTypeError(
            f"dtype {dtype} (numpy's {name}, {bits}-bit mantissa) cannot be computed exactly: "
            "tensorsql's kernels compute at most float64/complex128 (53-bit mantissa), which would silently "
            "round every value; convert the operands with .astype(np.float64) (or pass dtype=np.float64, "
            "casting='same_kind') to accept that rounding"
        )
    return dtype


def _numpy_result_dtype(
    arrays: Sequence[np.ndarray], dtype: object | None, casting: object, out: object = None
) -> np.dtype:
    """numpy's result dtype for einsum's ``dtype=``/``casting=``: the operands are cast to it first. Without
    ``dtype=``, an ``out=`` array's dtype joins the operands' (numpy's default ``optimize=False``: int8
    operands into an int64 ``out`` are summed in int64, not wrapped in int8 and copied)."""
    frontend.check_casting(casting)
    joins = dtype is None and isinstance(out, np.ndarray) and not out.dtype.hasobject
    if joins and casting not in ("no", "equiv"):
        try:  # numpy's iterator: the common dtype of every operand and ``out`` together
            joined = np.result_type(*arrays, out.dtype)  # type: ignore[union-attr]
        except TypeError:
            joined = None
        if joined is not None and all(np.can_cast(a.dtype, joined, casting) for a in arrays):  # type: ignore[arg-type]
            dtype = joined
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
        return _check_exact(want)
    for i, a in enumerate(arrays):
        if a.dtype.hasobject:
            raise DTypeError(
                f"operand {i} has dtype object: tensorsql computes numbers in its kernels, not Python "
                "objects; pass dtype= (e.g. dtype=np.float64, casting='unsafe') to convert them first"
            )
    final = np.result_type(*arrays) if arrays else np.dtype("float64")
    for i, a in enumerate(arrays):  # numpy casts every operand to the result dtype, under casting= too
        if not np.can_cast(a.dtype, final, casting):  # type: ignore[arg-type]
            raise DTypeError(
                f"operand {i} of dtype {a.dtype} cannot be cast to the result dtype {final} with "
                f"casting={casting!r}"
            )
    return _check_exact(final)


def _to_carrier(a: np.ndarray, final: np.dtype, carrier: str, what: str) -> np.ndarray:
    """An operand cast to the result dtype (numpy casts operands to ``dtype=``: rounding, truthiness, wrap),
    then to the dtype the kernels compute it in."""
    try:
        return a.astype(final, copy=False).astype(carrier, copy=False)
    except (TypeError, ValueError) as exc:  # object elements that are no numbers
        raise DTypeError(f"{what} of dtype {a.dtype} cannot be converted to {final}: {exc}") from exc


def _check_out(out: object, final: np.dtype, casting: object) -> np.ndarray | None:
    """numpy's checks of ``out=`` before anything is computed (its shape is checked against the result)."""
    if out is None:
        return None
    if not isinstance(out, np.ndarray):
        raise EinsumTypeError(f"out= must be a numpy ndarray, got {type(out).__name__}")
    if not out.flags.writeable:
        raise OutputError(
            f"out= is read-only (shape {out.shape}, dtype {out.dtype}): einsum cannot write into it"
        )
    if not np.can_cast(final, out.dtype, casting):  # type: ignore[arg-type]
        raise DTypeError(f"result dtype {final} cannot be cast to out dtype {out.dtype} ({casting=})")
    return out


def _call_key(spec: Hashable, arrays: Sequence[np.ndarray], optimize: object, join: object, agg: object):
    opt = hashable(optimize)
    if spec is None or opt is None:
        return None
    return ("einsum", spec, tuple((a.shape, a.dtype.str) for a in arrays), opt, join, agg)


def _spec_of(args: Sequence[object]) -> Hashable | None:
    """The subscripts of a call, without its arrays (the string, or the sublists of the interleaved form)."""
    if isinstance(args[0], str):
        return ("str", args[0])
    return hashable(
        [
            a.tolist() if isinstance(a, np.ndarray) else a
            for i, a in enumerate(args)
            if i % 2 == 1 or (i == len(args) - 1 and len(args) % 2)
        ]
    )


def _parsed(call_args: Sequence[object]) -> Subscripts:
    inputs, output, arrays = split_args(call_args)
    return parse(inputs, output, [np.shape(a) for a in arrays])


def _entry(s: Session, call_args: list[object], key: Hashable | None, **kw: object) -> Entry:
    """The cached plan of a call; its ``extra`` is the parsed subscripts (for numpy's result layout)."""
    entry = s.plans.get(key) if key is not None else None
    if entry is None:
        rel = s.einsum(*call_args, copy=False, cache=False, **kw)  # type: ignore[arg-type]
        entry = Entry(tuple(rel.bindings), rel.plan(), _parsed(call_args))
        if key is not None:
            s.plans.put(key, entry)
    return entry


def _layout(res: np.ndarray, order: str, sub: Subscripts, arrays: Sequence[np.ndarray]) -> np.ndarray:
    """The result in numpy's memory order: C, F, A (F when every operand is Fortran-contiguous, else C) or K.

    K, "as close to the layout of the inputs as possible": for operands that are not all C-contiguous, the
    axis order numpy's unoptimized einsum allocates for their strides; for C-contiguous operands, the order
    the engine computed in (C, or for a large output that interleaves the operands' labels a transposed view
    in GEMM order, which saves a scatter pass, as numpy's optimized einsum returns its BLAS layout).
    """
    if res.ndim < 2 or (order == "K" and all(a.flags.c_contiguous for a in arrays)):
        return res
    shapes = tuple(a.shape for a in arrays)
    strides = tuple(a.strides for a in arrays)
    if order == "A":
        order = "F" if frontend.all_fortran(sub, shapes, strides, [a.itemsize for a in arrays]) else "C"
    if order == "C":
        return np.ascontiguousarray(res)
    if order == "F":
        return np.asfortranarray(res)
    axes = frontend.k_order(sub.inputs, sub.output, shapes, strides)
    if res.transpose(axes).flags.c_contiguous:
        return res
    laid = np.empty([res.shape[a] for a in axes], res.dtype).transpose(np.argsort(axes))
    laid[...] = res
    return laid


def _finish(
    res: np.ndarray,
    final: np.dtype,
    carrier: str,
    out: np.ndarray | None,
    layout: Callable[[np.ndarray], np.ndarray],
) -> object:
    # computed in a wider carrier: cast back (dtype equality first: ``dtype.name`` costs microseconds)
    if res.dtype != final and carrier != final.name and res.dtype.name == carrier:
        with np.errstate(over="ignore"):  # float16's inf past 65504, silently, as numpy's own float16 sum
            res = (res != 0) if final == np.bool_ else res.astype(final)
    if out is not None:
        if out.shape != res.shape:
            raise ShapeError(f"out= must be an ndarray of shape {res.shape}, got {out.shape}")
        np.copyto(out, res, casting="unsafe")
        return out
    res = layout(res)
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
    text = subscripts_text(args[0]) if args else None
    if text is not None and not isinstance(args[0], str):
        args = (text, *args[1:])
    # the string form's operands follow the string: no need to parse it before the plan cache is asked
    operands = list(args[1:]) if text is not None else split_args(args)[2]
    rel_ops = [op for op in operands if isinstance(op, TensorRelation)]
    if rel_ops:
        if out is not None:
            raise ShapeError("out= is for numpy operands; a TensorRelation result is lazy")
        _order(order)  # checked as numpy does; a relation has no memory layout to follow
        return rel_ops[0].session.einsum(
            *args, optimize=optimize, dtype=dtype, join=join, agg=agg, casting=casting
        )
    order = _order(order)
    arrays = [as_array(op, f"operand {i}") for i, op in enumerate(operands)]
    final = _numpy_result_dtype(arrays, dtype, casting, out)
    out = _check_out(out, final, casting)
    carrier = carrier_dtype(final)
    cast = [_to_carrier(a, final, carrier, f"operand {i}") for i, a in enumerate(arrays)]
    if text is not None:
        call_args = [text, *cast]
    else:
        it = iter(cast)
        call_args = [next(it) if i % 2 == 0 and i < 2 * len(cast) else a for i, a in enumerate(args)]
    key = _call_key(_spec_of(args), cast, optimize, join, agg)

    def run(s: Session) -> tuple[np.ndarray, Entry]:
        # computed right away, so the operands' memory can be borrowed instead of copied (numpy.einsum reads
        # its operands while they could change too)
        entry = _entry(s, call_args, key, optimize=optimize, join=join, agg=agg)
        return s.value(entry.plan, dict(zip(entry.leaves, cast, strict=True))), entry  # type: ignore[arg-type]

    res, entry = _on_default(run)
    sub = entry.extra if isinstance(entry.extra, Subscripts) else _parsed(call_args)
    return _finish(res, final, carrier, out, lambda r: _layout(r, order, sub, arrays))


def _interleaved(spec: object, rest: Sequence[object]) -> tuple[list[object], list[object]]:
    """contract_expression's interleaved form ``(shape0, sub0, shape1, sub1, ..., [output])`` split into
    (shapes, sublists + output)."""
    items = [spec, *rest]
    shapes = items[0 : len(items) - len(items) % 2 : 2]
    subs = [items[i] for i in range(1, len(items), 2)]
    out = [items[-1]] if len(items) % 2 else []
    return shapes, [*subs, *out]


def _describe(sublists: Sequence[object], n_inputs: int) -> str:
    """The interleaved form's sublists as text, e.g. ``[0, 1],[1, 2]->[0, 2]`` (an expression's repr)."""
    text = ",".join(str(list(x)) for x in sublists[:n_inputs])  # type: ignore[call-overload]
    return text + "".join("->" + str(list(x)) for x in sublists[n_inputs:])  # type: ignore[call-overload]


class ContractExpression:
    """``contract_expression``'s callable: ``expr(*arrays, out=None)``, planned once per operand dtypes."""

    def __init__(
        self,
        subscripts: object,
        shapes: Sequence[object],
        *,
        constants: Sequence[int] = (),
        optimize: object = "auto",
        dtype: object | None = None,
        order: str = "K",
        casting: str = "safe",
        join: str | None = None,
        agg: str | None = None,
        session: Session | None = None,
        memory_limit: object = None,
        use_blas: object = None,
    ) -> None:
        # use_blas: opt_einsum's switch for its BLAS calls; tensorsql's kernels choose their own GEMM path
        text = subscripts_text(subscripts)
        if text is None:
            shapes, sublists = _interleaved(subscripts, shapes)
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
                self.shapes.append(tuple(operator.index(n) for n in shp))  # type: ignore[attr-defined]
            except (TypeError, ValueError) as exc:
                raise ShapeError(f"shape {i} = {shp!r} is not a sequence of ints") from exc
            if any(n < 0 for n in self.shapes[-1]):  # refused at the first call, not here, before
                raise ShapeError(f"shape {i} = {shp!r} has a negative size")
        self._text, self._sublists = text, None if text is not None else sublists
        template = self._call_args(self.shapes)
        inputs, output, _ = split_args(template)
        self._sub = parse(inputs, output, self.shapes)  # the equation and shapes agree, or an EinsumError now
        self._order = _order(order)
        frontend.check_casting(casting)
        path = frontend.contraction_path(self._sub, optimize, memory_limit)  # planned once, as opt_einsum
        self.subscripts = text if text is not None else _describe(sublists, len(self.shapes))
        self.num_args = len(shapes) - len(consts)
        self._kw = {"optimize": ["einsum_path", *path], "join": join, "agg": agg}
        self._dtype, self._casting = dtype, casting
        self._session = session
        self._entries: dict[tuple[np.dtype, ...], tuple[Entry, np.dtype, str, np.dtype]] = {}

    def _call_args(self, operands: Sequence[object]) -> list[object]:
        if self._sublists is None:
            return [self._text, *operands]
        args: list[object] = []
        for op, sublist in zip(operands, self._sublists, strict=False):
            args += [op, sublist]
        return args + self._sublists[len(operands) :]

    def __call__(
        self,
        *arrays: object,
        out: np.ndarray | None = None,
        backend: object = None,
        evaluate_constants: bool = False,
    ) -> object:
        """The contraction of ``arrays`` (the non-constant operands, in order), into ``out=`` if given.
        ``backend``/``evaluate_constants``: opt_einsum's keywords (only its numpy backend applies here;
        constants are always bound once)."""
        if backend not in (None, "auto", "numpy"):
            raise ConfigError(
                f"backend={backend!r}: tensorsql computes with its own engine (None, 'auto', 'numpy')"
            )
        if len(arrays) != self.num_args:
            raise EinsumError(
                f"this expression takes {self.num_args} arrays, got {len(arrays)} (the non-constant operands)"
            )
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
        # an out= array's dtype joins the operands' (``_numpy_result_dtype``)
        sig = (*(a.dtype for a in full), out.dtype if isinstance(out, np.ndarray) else None)
        found = self._entries.get(sig)
        s = self._session or default_session()
        if found is None:
            final = _numpy_result_dtype(full, self._dtype, self._casting, out)
            carrier = carrier_dtype(final)
            cast = [_to_carrier(a, final, carrier, f"operand {i}") for i, a in enumerate(full)]
            entry = _entry(s, self._call_args(cast), None, **self._kw)
            consts = {i: cast[i] for i in self._constants}  # cast once, like the plan
            found = self._entries[sig] = (entry, final, carrier, final == np.dtype(carrier), consts)
        entry, final, carrier, direct, consts = found
        out = _check_out(out, final, self._casting)
        # an operand already in the result dtype, which the kernels compute in, goes as it is; any other is
        # cast to the result dtype first (numpy's rounding, truthiness, wrap), then to the carrier
        cast = [
            consts[i]
            if i in consts
            else a
            if direct and a.dtype == final
            else _to_carrier(a, final, carrier, f"operand {i}")
            for i, a in enumerate(full)
        ]
        bound = dict(zip(entry.leaves, cast, strict=True))
        if self._session is not None:
            res = s.value(entry.plan, bound)  # type: ignore[arg-type]
        else:  # its plan runs on any default session (a closed one replaced, even between lookup and run)
            res = _on_default(lambda d: d.value(entry.plan, bound))  # type: ignore[arg-type]
        return _finish(res, final, carrier, out, lambda r: _layout(r, self._order, self._sub, full))

    def __repr__(self) -> str:
        return f"<ContractExpression('{self.subscripts}')>"


def contract_expression(subscripts: object, *shapes: object, constants: Sequence[int] = (), **kwargs: object):
    """opt_einsum's ``contract_expression``: a reusable callable for one equation and operand shapes, planned
    once (per operand dtypes) and then run on new arrays for the cost of one engine round trip.

    ``subscripts`` and ``shapes`` as opt_einsum takes them: a string then one shape per operand, or the
    interleaved ``shape0, sublist0, shape1, sublist1, ..., [output]``. ``constants``: positions whose entries
    in ``shapes`` are arrays fixed for every call. Keywords: numpy's ``optimize``, ``dtype``, ``order`` and
    ``casting``; opt_einsum's ``memory_limit`` and ``use_blas`` (accepted; the kernels choose their own GEMM);
    the extended EinSum's ``join``/``agg``; and ``session``.
    """
    if "out" in kwargs:
        raise ConfigError(
            "out= is an argument of the expression's call (expr(*arrays, out=...)), not of its creation"
        )
    return ContractExpression(subscripts, shapes, constants=constants, **kwargs)  # type: ignore[arg-type]


def _numpy_letter(label: int) -> str:
    return chr(ord("A") + label) if label < 26 else chr(ord("a") + label - 26)


def einsum_path(*args: object, optimize: object = "greedy") -> tuple[list[object], str]:
    """Like ``numpy.einsum_path``: (['einsum_path', (i, j), ...], a printable description).

    ``optimize`` as for ``einsum`` (numpy's names and ``(name, memory_limit)``, opt_einsum's names and
    PathOptimizers, an explicit path). The description writes labels 0..51 as numpy's letters."""
    inputs, output, operands = split_args(args)
    shapes = [tuple(op.shape) if isinstance(op, TensorRelation) else np.shape(op) for op in operands]
    sub = parse(inputs, output, shapes)
    path = frontend.contraction_path(sub, optimize)
    others = itertools.count(52)
    symbols = {
        x: _numpy_letter(x) if 0 <= x < 52 else opt_einsum.get_symbol(next(others))
        for x in sorted(sub.labels())
    }
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
    opt = hashable(param)
    key = None if opt is None else ("map", fn, opt, arr.shape, arr.dtype.str)

    def run(s: Session) -> np.ndarray:
        entry = s.plans.get(key) if key is not None else None
        if entry is None:  # the array is an operand of the plan (lent to the query), planned once per shape
            leaf = E.Operand(shape=arr.shape, dtype=arr.dtype.name, name="x")
            entry = Entry((leaf,), s.map(TensorRelation(s, leaf, {leaf: arr}), fn, param).plan())
            if key is not None:
                s.plans.put(key, entry)
        return s.value(entry.plan, {entry.leaves[0]: arr})  # type: ignore[dict-item]

    out = _on_default(run)
    if out.dtype != final:  # float16 overflows to inf as numpy's float16 result does: no warning
        with np.errstate(over="ignore"):
            out = (out != 0) if final == np.bool_ else out.astype(final)
    return out[()] if out.ndim == 0 else out


def map(x: object, fn: str, param: float | None = None) -> object:  # noqa: A001
    """Element-wise ``fn``: exp, log, sqrt, relu, neg, abs, pow, scale, square, reciprocal, sigmoid, tanh,
    softplus."""
    return _apply(x, fn, param)


def exp(x: object) -> object:
    return _apply(x, "exp")


def log(x: object) -> object:
    return _apply(x, "log")


def sqrt(x: object) -> object:
    return _apply(x, "sqrt")


def relu(x: object) -> object:
    return _apply(x, "relu")


def sigmoid(x: object) -> object:
    return _apply(x, "sigmoid")


def tanh(x: object) -> object:
    return _apply(x, "tanh")


def softplus(x: object) -> object:
    return _apply(x, "softplus")


def neg(x: object) -> object:
    return _apply(x, "neg")


def abs(x: object) -> object:  # noqa: A001
    return _apply(x, "abs")


def pow(x: object, exponent: float) -> object:  # noqa: A001
    return _apply(x, "pow", exponent)


def scale(x: object, factor: float) -> object:
    return _apply(x, "scale", factor)


def _over(
    x: object, over: int | Sequence[int], what: str, s: Session | None = None
) -> tuple[TensorRelation, str, str]:
    """``x`` as a float relation (of session ``s`` for an array), and the letters of all its axes and of
    those not in ``over``."""
    rel = x if isinstance(x, TensorRelation) else None
    s = rel.session if rel is not None else (s or default_session())
    if rel is None:
        arr = np.asarray(x)
        arr = arr.astype(np.result_type(arr.dtype, np.float32) if arr.dtype.kind != "c" else arr.dtype)
        rel = s.from_numpy(arr.astype(carrier_dtype(arr.dtype), copy=False))
    ndim = rel.ndim
    if isinstance(over, str | bytes) or not isinstance(over, int | np.integer | Sequence):
        raise ShapeTypeError(f"{what}: over must be an axis or a list of axes, got {over!r}")
    axes = (over,) if isinstance(over, int | np.integer) else tuple(over)
    if not axes:
        raise ShapeError(f"{what}: over={over!r} must name distinct axes of shape {rel.shape}")
    norm = operators.axes_of(rel, axes, what)  # numpy's classes: IndexingError, ShapeTypeError
    letters = "abcdefghijklmnopqrstuvwxyz"[:ndim]
    keep = "".join(c for i, c in enumerate(letters) if i not in norm)
    if rel.dtype.kind in "iub":  # X - max(X) in floats, as for an array: in int8 it wrapped (a scale by 1.0
        # kept the int)
        rel = operators.astype(rel, np.result_type(rel.dtype, np.float32))
    return rel, letters, keep


def _result(x: object, y: TensorRelation) -> object:
    if isinstance(x, TensorRelation):
        return y
    out = y.numpy()
    return out[()] if out.ndim == 0 else out


def softmax(x: object, over: int | Sequence[int] = -1) -> object:
    """Softmax over the axes ``over``, built from EinSum steps (docs "Einsum and numpy compatibility"):
    C = max over ``over``; E = exp(X - C); S = sum of E over ``over``; Y = E / S.
    """
    if not isinstance(x, TensorRelation):  # an array: on the default session, computed now
        return _on_default(lambda s: _result(x, softmax(_over(x, over, "softmax", s)[0], over)))
    rel, letters, keep = _over(x, over, "softmax")
    s = rel.session
    c = autodiff.shift(s.einsum(f"{letters}->{keep}", rel, agg="max"))  # Y is the same for any C: no gradient
    e = s.map(s.einsum(f"{letters},{keep}->{letters}", rel, c, join="subtract"), "exp")
    total = s.einsum(f"{letters}->{keep}", e)
    return _result(x, s.einsum(f"{letters},{keep}->{letters}", e, total, join="divide"))


def log_softmax(x: object, over: int | Sequence[int] = -1) -> object:
    """log(softmax(X)) without forming the softmax: D = X - max over ``over``; Y = D - log(sum exp(D)).
    Finite where the softmax underflows to 0 (a very negative logit), as cross-entropies need."""
    if not isinstance(x, TensorRelation):  # an array: on the default session, computed now
        return _on_default(lambda s: _result(x, log_softmax(_over(x, over, "log_softmax", s)[0], over)))
    rel, letters, keep = _over(x, over, "log_softmax")
    s = rel.session
    c = autodiff.shift(s.einsum(f"{letters}->{keep}", rel, agg="max"))
    d = s.einsum(f"{letters},{keep}->{letters}", rel, c, join="subtract")
    lse = s.map(s.einsum(f"{letters}->{keep}", s.map(d, "exp")), "log")
    return _result(x, s.einsum(f"{letters},{keep}->{letters}", d, lse, join="subtract"))


# SQL's softmax(A [, over => ...]) is this one (the SQL front end sits below this module: it looks it up)
sqlfront.provide("softmax", softmax)
