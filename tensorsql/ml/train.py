"""``fit``: mini-batch training of a model on the rows of a warehouse table or query.

Each epoch shuffles the rows inside DuckDB (a temporary table ordered by a hash of each row's values, the
seed and the epoch: the same order for the same data, whatever order the source returns it in), then reads
it a batch at a time as Arrow columns; each step runs the forward pass, the gradients (``ts.grad``) and the
optimizer's update as SQL. After every epoch the weights and the optimizer state are saved as tensor
tables with a row of progress (``checkpoint=``); a run started again with the same checkpoint resumes after
the last saved epoch and ends with the weights of an uninterrupted run.
"""

from __future__ import annotations

import itertools
import json
import math
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from sqlglot import exp

from tensorsql.autodiff import grad
from tensorsql.compile.cache import hashable
from tensorsql.errors import ConfigError, DTypeError, ShapeError
from tensorsql.frontend import wide
from tensorsql.metadata import fold, is_reserved
from tensorsql.ml.optim import SGD, Optimizer

if TYPE_CHECKING:
    from tensorsql.ml.models import Model
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session

_POS = "_ts_pos"
_HASH = "_ts_hash"
#: bytes of rows ``fit`` reads or gathers at a time (whole batches; at least one): one query per batch cost
#: as much as a logistic regression's step
READ_BYTES = 64 << 20
#: ``fit(cache=None)`` keeps the rows in memory when they take at most this many bytes
CACHE_BYTES = 1 << 30
#: a batch of at least this many bytes is gathered by the session's threads, a share each: the main thread
#: alone gathers 8192 random rows of 400 bytes in 0.65-1.2 ms, two threads in ~0.62 ms (a hand-off costs
#: tens of microseconds, as much as gathering a few hundred KiB)
GATHER_SPLIT_BYTES = 1 << 20
_ids = itertools.count()
#: an epoch's (features, labels) chunks
Batches = Iterator[tuple[np.ndarray, np.ndarray]]


@dataclass
class History:
    """Mean batch loss per epoch (every epoch of the run, resumed ones included)."""

    losses: list[float] = field(default_factory=list)
    #: epochs this call ran (fewer than ``epochs`` after a resume)
    ran: int = 0
    #: the epoch a resumed run started after (None: from the start)
    resumed_after: int | None = None


def _ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def _col(name: str) -> exp.Column:
    return exp.Column(this=_ident(name))


#: DuckDB types read as DOUBLE: Arrow gets HUGEINT, UHUGEINT and DECIMAL as decimal128(38, s), which wraps
#: past 38 digits (UHUGEINT 2**128 - 1 arrived as -1) and becomes Python objects (no finiteness check)
_AS_DOUBLE = ("HUGEINT", "UHUGEINT", "DECIMAL")


def _value(name: str, wide_columns: frozenset[str]) -> exp.Expression:
    """A feature or label column as ``fit`` reads it (``_AS_DOUBLE``)."""
    if name in wide_columns:
        return exp.alias_(exp.cast(_col(name), exp.DataType.build("DOUBLE")), _ident(name))
    return _col(name)


def fit(
    model: Model,
    source: str,
    features: Sequence[str] | None = None,
    label: str | None = None,
    *,
    epochs: int = 10,
    batch_size: int = 256,
    optimizer: Optimizer | None = None,
    seed: int = 0,
    checkpoint: str | None = None,
    progress: bool | None = None,
    cache: bool | None = None,
) -> History:
    """Train ``model`` on ``source`` (a table name or a SELECT): ``features`` are its feature columns (a
    SELECT's own columns less ``label`` when omitted), ``label`` its target column. ``cache``: read the
    rows once and keep them in memory (None: when they take at most ``CACHE_BYTES``); else every epoch
    reads its shuffled rows from DuckDB a chunk at a time. Either way DuckDB shuffles, in the same order."""
    from tensorsql.ml.models import Model, TransformerBlock

    if not isinstance(model, Model):
        raise ConfigError(
            f"fit: model must be a tensorsql.ml model (LinearRegression, MLP, ...), got {model!r}"
        )
    if isinstance(model, TransformerBlock):
        raise ConfigError(
            "fit: trains a model on rows of features and a label column; a TransformerBlock maps a sequence "
            "to a sequence: step it with ts.grad and an optimizer (docs 'Machine learning')"
        )
    s = model.session
    optimizer = optimizer if optimizer is not None else SGD(0.1)
    for value, what in ((epochs, "epochs"), (batch_size, "batch_size")):
        if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
            raise ConfigError(f"fit: {what} must be a positive int, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise ConfigError(f"fit: seed must be a non-negative int, got {seed!r}")
    epochs, batch_size, seed = int(epochs), int(batch_size), int(seed)
    if not isinstance(label, str) or not label:
        raise ConfigError(f"fit: label must name the target column, got {label!r}")
    if cache is not None and not isinstance(cache, bool):
        raise ConfigError(f"fit: cache must be True, False or None, got {cache!r}")
    if not isinstance(optimizer, Optimizer):
        raise ConfigError(f"fit: optimizer must be an Optimizer (SGD, Adam, AdamW), got {optimizer!r}")
    shapes = [model.params[k].shape for k in model.names]
    held = [[v.shape for v in st.values()] for st in optimizer.state]
    pairs = zip(held, shapes, strict=False)
    if held and (len(held) != len(shapes) or any(h != sh for hs, sh in pairs for h in hs)):
        raise ConfigError(
            f"fit: the optimizer holds state for parameters of shapes {held}, not this {model.kind}'s "
            f"{shapes} (an optimizer trains one model: give this one its own)"
        )
    src, cols = wide.source(source, features, "fit")
    local = s.local_executor
    probe = src.this if isinstance(src, exp.Subquery) else exp.select(exp.Star()).from_(src)
    # read below more than once (columns, count, rows; rows again each epoch when streamed): a query or a
    # view is read once, into a snapshot dropped when fit ends (random() rows counted in one read and
    # gathered from another were refused, or trained on a row count of another read)
    snap = local.snapshot(probe, "fit") if wide.rereads(src, local.describe) else None
    if snap is not None:
        probe = exp.select(exp.Star()).from_(snap.table())
    try:  # the snapshot goes on every path, an error before training too
        _, described = local.describe(exp.select(exp.Star()).from_(exp.Subquery(this=probe)).limit(0), "fit")
        names = [str(d[0]) for d in described]
        spelled = {n.lower(): n for n in names}  # DuckDB matches names case-insensitively
        if label.lower() not in spelled:
            raise ConfigError(f"fit: no label column {label!r} in the source (columns: {names})")
        label = spelled[label.lower()]
        feats = list(cols) if cols is not None else [n for n in names if n != label]
        missing = [c for c in feats if c.lower() not in spelled]
        if missing:
            raise ConfigError(f"fit: no feature column {missing[0]!r} in the source (columns: {names})")
        feats = [spelled[c.lower()] for c in feats]
        if label in feats:
            raise ConfigError(f"fit: the label {label!r} is also among the features")
        types = {str(d[0]): d for d in described}
        wide.check_types([types[c] for c in feats], feats, "fit")
        wide.check_types([types[label]], [label], "fit", role="the label")
        as_double = frozenset(
            c for c in [*feats, label] if str(types[c][1]).upper().split("(")[0].strip() in _AS_DOUBLE
        )
        if len(feats) != model.n_features:
            raise ConfigError(f"fit: {len(feats)} feature columns for a model of {model.n_features} features")
        ((n,),) = local.query(exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=probe)), "fit")
        if n == 0:
            raise ConfigError("fit: the source has no rows")
        ck = Checkpoint(s, checkpoint) if checkpoint is not None else None
        history = History()
        start = 0
        if ck is not None:
            saved = ck.restore(model, optimizer, epochs)
            if saved is not None:
                start, history.losses = saved
                history.resumed_after = start
            ck.check_free(model, optimizer, start, epochs)
        batches = math.ceil(n / batch_size)
        row_bytes = (len(feats) + 1) * np.dtype(model.dtype).itemsize
        chunk = batch_size * max(1, READ_BYTES // (row_bytes * batch_size))  # whole batches per read
        if cache is None:  # what the cache holds: the features, the labels, a hash and a row number per row
            cache = n * (row_bytes + 16) <= CACHE_BYTES
        rows: _Rows = (
            _Cached(local, probe, feats, label, model, n, batch_size, as_double)  # a gather per batch
            if cache
            else _Streamed(local, probe, feats, label, model, n, chunk, as_double)
        )
        bar = _Progress(progress, (epochs - start) * batches)
        stepper = Stepper(model, optimizer)
        try:
            for epoch in range(start, epochs):
                total = 0.0
                then = epoch + 1 if epoch + 1 < epochs else None
                for xs, ys in rows.epoch(seed, epoch, then):  # whole batches, in the epoch's order
                    for at in range(0, len(ys), batch_size):
                        x, y = xs[at : at + batch_size], ys[at : at + batch_size]
                        total += stepper.step(x, model.targets(y)) * len(y)
                        bar.advance(f"epoch {epoch + 1}/{epochs}")
                history.losses.append(total / n)
                history.ran += 1
                bar.note(f"epoch {epoch + 1}/{epochs}: loss {history.losses[-1]:.6g}")
                if ck is not None:
                    stepper.sync()  # the epoch's weights and state as relations, which the checkpoint saves
                    ck.save(model, optimizer, epoch + 1, history.losses)
        finally:
            stepper.sync()  # the weights and state as relations again (also after an interrupted epoch)
            bar.close()
            rows.close()
        return history
    finally:
        if snap is not None:
            snap.drop()


class Stepper:
    """The training step compiled once (``Session.compile``, planned once, run on new arrays each call): per
    batch shape, (features, targets, weights, optimizer state, step factors) -> (loss, new weights, new
    state), one graph whose shared steps (the forward pass, each gradient) are computed once, as one SQL
    statement where the executor can (``Executor.many``). Weights and state stay arrays between steps and
    become relations again at ``sync``."""

    def __init__(self, model: Model, optimizer: Optimizer) -> None:
        self.model, self.opt, self.s = model, optimizer, model.session
        self.params = [model.params[k].numpy() for k in model.names]
        if optimizer.state:
            self.state = [{k: v.numpy() for k, v in st.items()} for st in optimizer.state]
        else:
            self.state = [{k: np.zeros_like(p) for k in optimizer.state_names} for p in self.params]
        self.t = optimizer.steps
        self.steps: dict[tuple, object] = {}

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One update; returns the batch's loss."""
        key = (x.shape, y.shape)
        if key not in self.steps:
            self.steps[key] = self._cached_step(x, y)
        self.t += 1
        factors = [np.asarray(f, dtype=self.model.dtype) for f in self.opt.factors(self.t).values()]
        names = self.opt.state_names
        state = [st[k] for st in self.state for k in names]
        loss, *out = self.steps[key](x, y, *self.params, *state, *factors)  # type: ignore[operator]
        n = len(self.params)
        self.params = [np.asarray(p) for p in out[:n]]
        rest = iter(out[n:])
        self.state = [{k: np.asarray(next(rest)) for k in names} for _ in range(n)]
        return float(loss)

    def _placeholders(self, x: np.ndarray, y: np.ndarray) -> tuple[object, object, list]:
        s, model = self.s, self.model
        xs = s.placeholder(x.shape, x.dtype, name="features")
        ys = s.placeholder(y.shape, y.dtype, name="targets")
        ps = [s.placeholder(p.shape, p.dtype, name=k) for k, p in zip(model.names, self.params, strict=True)]
        return xs, ys, ps

    def _loss(self, xs: object, ys: object, ps: list) -> TensorRelation:
        model = self.model
        held = dict(model.params)
        model.params = dict(zip(model.names, ps, strict=True))
        try:
            return model.loss(model.forward(xs), ys)
        finally:
            model.params = held

    def _cached_step(self, x: np.ndarray, y: np.ndarray) -> object:
        """The compiled step of this model's kind and sizes, optimizer and batch shape: compiled once per
        session (a step is a graph over placeholders alone, so every model of one structure shares it; a
        second ``fit``, a grid search's next fold, plans nothing)."""
        hyper = tuple(sorted((k, v) for k, v in vars(self.opt).items() if k not in ("state", "steps")))
        key = (
            "fit-step",
            type(self.model).__name__,
            json.dumps(self.model.config(), sort_keys=True),
            self.model.dtype,
            type(self.opt).__name__,
            hashable(hyper),
            x.shape,
            str(x.dtype),
            y.shape,
            str(y.dtype),
        )
        if key[5] is None:  # a hyperparameter without a stable value: this stepper's own step
            return self._compile_step(x, y)
        cache = self.s.compiled
        step = cache.get(key)
        if step is None:
            step = cache.put(key, self._compile_step(x, y))
        return step

    def _compile_step(self, x: np.ndarray, y: np.ndarray) -> object:
        s, dtype, names = self.s, self.model.dtype, self.opt.state_names
        xs, ys, ps = self._placeholders(x, y)
        loss = self._loss(xs, ys, ps)
        state = [
            {k: s.placeholder(p.shape, dtype, name=f"{w}_{k}") for k in names}
            for w, p in zip(self.model.names, ps, strict=True)
        ]
        factors = {k: s.placeholder((), dtype, name=k) for k in self.opt.factors(1)}
        news, after = [], []
        for p, g, st in zip(ps, grad(loss, ps), state, strict=True):
            new, updated = self.opt.update(p, g, st, factors)
            news.append(new)
            after.extend(updated[k] for k in names)
        inputs = [xs, ys, *ps, *[st[k] for st in state for k in names], *factors.values()]
        return s.compile([loss, *news, *after], inputs, share=True)

    def _compile_grads(self, x: np.ndarray, y: np.ndarray) -> object:
        """(features, targets, weights) -> (loss, gradients), without the update (benchmarks time it)."""
        xs, ys, ps = self._placeholders(x, y)
        loss = self._loss(xs, ys, ps)
        return self.s.compile([loss, *grad(loss, ps)], [xs, ys, *ps], share=True)

    def sync(self) -> None:
        s = self.s  # the step's own new arrays: lent as they are, nothing uploaded
        self.model.set_params([s.array(p, copy=False) for p in self.params])
        self.opt.state = [{k: s.array(v, copy=False) for k, v in st.items()} for st in self.state]
        self.opt.steps = self.t


def _row_hash(columns: list[str]) -> exp.Expression:
    """A row's identity for shuffling: DuckDB's hash of its values (equal rows are interchangeable)."""
    return exp.Anonymous(this="hash", expressions=[_col(c) for c in columns])


#: the two multipliers of MurmurHash3's 64-bit finalizer (a bijection of 64-bit words that mixes every bit)
_MIX = (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53)
_WORD = (1 << 64) - 1
_U64 = exp.DataType.build("UBIGINT", dialect="duckdb")
_U128 = exp.DataType.build("UHUGEINT", dialect="duckdb")


def _mixed(x: int) -> int:
    """MurmurHash3's 64-bit finalizer of one word (a Python int)."""
    for m in _MIX:
        x ^= x >> 33
        x = (x * m) & _WORD
    return x ^ (x >> 33)


def _salt(seed: int, epoch: int) -> int:
    """The word an epoch's keys are salted with: a different one for every (seed, epoch)."""
    return _mixed(_mixed(seed & _WORD) ^ (epoch & _WORD))


def _epoch_keys(hashes: np.ndarray, seed: int, epoch: int) -> np.ndarray:
    """The sort keys of an epoch's order from the rows' hashes (uint64): the finalizer of (hash xor salt), a
    bijection of the hash, so two rows tie only when their hashes are equal (equal rows, interchangeable).
    The same words as ``_epoch_key_sql``, which orders rows too many to keep in memory."""
    x = hashes ^ np.uint64(_salt(seed, epoch))
    for m in _MIX:
        x ^= x >> np.uint64(33)
        x *= np.uint64(m)  # wraps modulo 2**64, as the finalizer means
    x ^= x >> np.uint64(33)
    return x


def _epoch_key_sql(h: exp.Expression, seed: int, epoch: int) -> exp.Expression:
    """``_epoch_keys`` in DuckDB SQL (``h``: a UBIGINT column): products in UHUGEINT, cut to 64 bits."""

    def shifted(x: exp.Expression) -> exp.Expression:
        return exp.BitwiseXor(
            this=x, expression=exp.BitwiseRightShift(this=x.copy(), expression=exp.Literal.number(33))
        )

    def times(x: exp.Expression, m: int) -> exp.Expression:
        wide_x = exp.Cast(this=x, to=_U128.copy())
        product = exp.BitwiseAnd(
            this=exp.Paren(this=exp.Mul(this=wide_x, expression=exp.Literal.number(m))),
            expression=exp.Literal.number(_WORD),
        )
        return exp.Cast(this=exp.Paren(this=product), to=_U64.copy())

    salt = exp.Cast(this=exp.Literal.number(_salt(seed, epoch)), to=_U64.copy())
    x: exp.Expression = exp.BitwiseXor(this=exp.Cast(this=h, to=_U64.copy()), expression=salt)
    for m in _MIX:
        x = times(shifted(x), m)
    return shifted(x)


def _matrix(
    rows: pa.Table | pa.RecordBatch, feats: list[str], label: str, model: Model, out: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The features as a (rows, features) matrix of the model's dtype (into ``out`` when given) and the
    labels; a NULL anywhere is an error."""
    for c in [*feats, label]:
        if rows.column(c).null_count:
            raise ConfigError(f"fit: column {c!r} has NULLs (features and labels need a number in every row)")
    x = np.empty((rows.num_rows, len(feats)), dtype=model.dtype) if out is None else out
    cols = [rows.column(c).to_numpy(zero_copy_only=False) for c in feats]
    # column by column into row slabs of ~1 MiB, which stay in cache: whole strided columns measured 2.7x
    # slower (0.24 s for 300,000 x 100 float32)
    step = max(64, (1 << 20) // max(1, x.itemsize * len(feats)))
    floats = any(c.dtype.kind == "f" for c in cols)
    for lo in range(0, len(x), step):
        slab = x[lo : lo + step]
        with np.errstate(over="ignore"):  # a value beyond the model's dtype: an infinity, refused below
            for j, col in enumerate(cols):
                slab[:, j] = col[lo : lo + step]
        if floats and not np.isfinite(slab).all():  # checked while the slab is in cache
            _not_finite(feats, cols, lo, slab, model.dtype)
    y = rows.column(label).to_numpy(zero_copy_only=False)
    if y.dtype.kind == "f":
        with np.errstate(over="ignore"):
            cast = y.astype(model.dtype, copy=False)
        if not np.isfinite(cast).all():
            _not_finite([label], [y], 0, cast[:, None], model.dtype)
    return x, y


def _not_finite(names: list[str], cols: list[np.ndarray], lo: int, slab: np.ndarray, dtype: object) -> None:
    """A NaN or an infinity trains every weight to NaN: a ConfigError naming the first column with one in
    ``slab`` (the rows from ``lo`` in the model's dtype), and its value in the source (1e300 is finite
    there, and an infinity in float32)."""
    for j, (name, col) in enumerate(zip(names, cols, strict=True)):
        bad = np.flatnonzero(~np.isfinite(slab[:, j]))
        if bad.size:
            value = col[lo + int(bad[0])]
            beyond = f", beyond {np.dtype(dtype).name}'s range" if np.isfinite(value) else ""
            raise ConfigError(
                f"fit: column {name!r} has {value}{beyond} (features and labels must be finite numbers)"
            )


class _Rows:
    """Where ``fit`` gets each epoch's rows: (features, labels) chunks of whole batches in shuffled order."""

    def epoch(self, seed: int, epoch: int, then: int | None = None) -> Batches:
        """The rows of ``epoch``; ``then``: the epoch that comes next (its order may be made meanwhile)."""
        raise NotImplementedError

    def close(self) -> None:
        """Drops what the source holds (called once, also after an error)."""


#: sources of at least this many rows sort the next epoch's order on a thread of its own while this epoch
#: trains (below it the sort takes a fraction of a millisecond, less than the hand-off between threads)
SORT_AHEAD_ROWS = 50_000


class _Cached(_Rows):
    """The rows read from the source once, with each row's hash; per epoch numpy sorts the rows' epoch keys
    (``_epoch_keys``) into the epoch's order, and the batches are gathered from memory, ``chunk`` rows (a
    batch) at a time. An epoch costs a sort of one word a row instead of a sorted copy of every column
    (1.2 s for 300,000 x 101 float32 columns), and no query (a query's round trip took 3 ms of a 5 ms
    epoch of 150 rows). The source streams into the matrix a record batch at a time, so the read holds one
    batch of the source's own columns besides the cache."""

    def __init__(
        self,
        local: object,
        probe: exp.Query,
        feats: list[str],
        label: str,
        model: Model,
        n: int,
        chunk: int,
        as_double: frozenset[str] = frozenset(),
    ) -> None:
        self.local, self.chunk = local, chunk
        self.threads = int(getattr(local, "threads", getattr(local, "workers", 1)) or 1)
        self.pool: ThreadPoolExecutor | None = None  # made at the first big gather (inside fit's try)
        self.shuffler: ThreadPoolExecutor | None = None  # sorts the next epoch's order
        self.next: tuple[tuple[int, int], Future[np.ndarray]] | None = None
        src = exp.Subquery(this=probe, alias=exp.TableAlias(this=_ident("_ts_src")))
        columns = [*feats, label]
        hashed = wide.unused(_HASH, columns)
        values = [_value(c, as_double) for c in columns]
        query = exp.select(*values, exp.alias_(_row_hash(columns), hashed, quoted=True))
        self.x = np.empty((n, len(feats)), dtype=model.dtype)
        ys: list[np.ndarray] = []
        hashes: list[pa.Array] = []
        at = 0

        def consume(batch: pa.RecordBatch) -> None:
            nonlocal at
            if at + batch.num_rows > n:
                raise ConfigError(f"fit: the source returned more than the {n} rows it counted (it changed)")
            _, y = _matrix(batch, feats, label, model, self.x[at : at + batch.num_rows])
            ys.append(y)
            hashes.append(batch.column(hashed))
            at += batch.num_rows

        local.read_batches(lambda: query.from_(src), consume)  # type: ignore[attr-defined]
        if at != n:
            raise ConfigError(f"fit: the source returned {at} rows, not the {n} it counted (it changed)")
        self.y = np.concatenate(ys) if ys else np.empty(0)
        self.hashes = (
            pa.chunked_array(hashes, type=pa.uint64()).to_numpy() if hashes else np.empty(0, np.uint64)
        )

    def epoch(self, seed: int, epoch: int, then: int | None = None) -> Batches:
        idx = self._order(seed, epoch)
        if then is not None and self.threads >= 2 and len(idx) >= SORT_AHEAD_ROWS:
            # the next epoch's order is sorted on a thread of its own while this epoch's steps run (numpy's
            # sort lets go of the GIL): the keys and sort of 1,000,000 rows take 40-90 ms
            if self.shuffler is None:
                self.shuffler = ThreadPoolExecutor(1, "tensorsql-shuffle")
            self.next = (seed, then), self.shuffler.submit(self._sort, seed, then)
        # gathered a batch at a time: bounded extra memory, and the gathered rows stay in cache for the step
        # (1,000,000 x 100 float32 per epoch: 0.08 s a batch at a time, 0.14-0.25 s in 64 MiB chunks)
        parts = [idx[lo : lo + self.chunk] for lo in range(0, len(idx), self.chunk)]
        ahead = None
        for i, part in enumerate(parts):
            x = self._gather(part) if ahead is None else ahead.result()
            # the next batch is gathered by a pool thread while the caller steps on this one: a small
            # model's step runs on one thread (the executor's lane), so the gather used to leave a core idle
            # for 0.6-0.7 ms of a logistic regression's ~3.5 ms step
            ahead = self._ahead(parts[i + 1]) if i + 1 < len(parts) else None
            yield x, np.take(self.y, part)

    def _order(self, seed: int, epoch: int) -> np.ndarray:
        """The row numbers of ``epoch`` in its order: sorted meanwhile when asked for before."""
        ahead, self.next = self.next, None
        if ahead is not None:
            key, future = ahead
            if key == (seed, epoch):
                return future.result()
            future.result()  # another epoch's (a caller that skipped one): waited for, so none runs on
        return self._sort(seed, epoch)

    def _sort(self, seed: int, epoch: int) -> np.ndarray:
        """The row numbers in the epoch's order: rows tie only on equal hashes (equal rows)."""
        return np.argsort(_epoch_keys(self.hashes, seed, epoch))

    def _ahead(self, part: np.ndarray) -> Future[np.ndarray] | None:
        """The gather of ``part`` started on a pool thread; None when one thread is all there is, or the
        batch is too small to be worth a hand-off (it is gathered when its turn comes)."""
        if not self._pooled(part):
            return None
        return self._pool().submit(np.take, self.x, part, 0)

    def _pooled(self, part: np.ndarray) -> bool:
        """Whether gathering the rows ``part`` is worth a pool thread's hand-off (``GATHER_SPLIT_BYTES``)."""
        return self.threads >= 2 and len(part) * self.x.strides[0] >= GATHER_SPLIT_BYTES

    def _pool(self) -> ThreadPoolExecutor:
        if self.pool is None:
            self.pool = ThreadPoolExecutor(self.threads - 1, "tensorsql-gather")
        return self.pool

    def _gather(self, part: np.ndarray) -> np.ndarray:
        """The feature rows ``part`` (row numbers), in that order; split among the pool's threads when big
        (numpy's take lets go of the GIL while it copies)."""
        x = self.x
        if not self._pooled(part):
            return np.take(x, part, axis=0)
        pool = self._pool()
        out = np.empty((len(part), x.shape[1]), dtype=x.dtype)
        cuts = np.linspace(0, len(part), self.threads + 1, dtype=np.int64)
        # mode="clip" lets numpy write into ``out`` unbuffered; every row number is in range, so it clips none
        done = [
            pool.submit(np.take, x, part[a:b], 0, out[a:b], "clip") for a, b in itertools.pairwise(cuts[1:])
        ]
        np.take(x, part[: cuts[1]], 0, out[: cuts[1]], "clip")
        for f in done:
            f.result()
        return out

    def close(self) -> None:
        self.next = None  # an order no epoch will read (a run cut short): shutdown waits for its sort
        for pool in (self.pool, self.shuffler):
            if pool is not None:
                pool.shutdown()
        self.pool = self.shuffler = None


class _Streamed(_Rows):
    """Rows too many to keep: each epoch stores the rows in its order as a temporary table ``(columns...,
    _ts_pos)`` and reads it back ``chunk`` rows per query (whole batches)."""

    def __init__(
        self,
        local: object,
        probe: exp.Query,
        feats: list[str],
        label: str,
        model: Model,
        n: int,
        chunk: int,
        as_double: frozenset[str] = frozenset(),
    ) -> None:
        self.local, self.probe, self.model = local, probe, model
        self.feats, self.label, self.n, self.chunk = feats, label, n, chunk
        self.as_double = as_double
        self.table: str | None = None

    def epoch(self, seed: int, epoch: int, then: int | None = None) -> Batches:
        self.close()
        self.table = f"_ts_fit_{next(_ids)}"
        columns = [*self.feats, self.label]
        hashed = wide.unused(_HASH, columns)
        hashes = exp.select(
            *[_col(c) for c in columns], exp.alias_(_row_hash(columns), hashed, quoted=True)
        ).from_(exp.Subquery(this=self.probe, alias=exp.TableAlias(this=_ident("_ts_src"))))
        order = exp.Order(expressions=[exp.Ordered(this=_epoch_key_sql(_col(hashed), seed, epoch))])
        number = exp.Sub(
            this=exp.Window(this=exp.Anonymous(this="row_number", expressions=[]), order=order),
            expression=exp.Literal.number(1),
        )
        at = wide.unused(_POS, [*columns, hashed])
        values = [_value(c, self.as_double) for c in columns]
        rows = exp.select(*values, exp.alias_(number, at, quoted=True)).from_(
            exp.Subquery(this=hashes, alias=exp.TableAlias(this=_ident("_ts_hashed")))
        )
        create = exp.Create(
            this=exp.Table(this=_ident(self.table)),
            kind="TABLE",
            expression=rows,
            properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
        )
        self.local.query(create, "fit: shuffling the rows")  # type: ignore[attr-defined]
        for lo in range(0, self.n, self.chunk):
            pos = _col(at)
            query = (
                exp.select(*[_col(c) for c in columns])
                .from_(exp.Table(this=_ident(self.table)))
                .where(exp.and_(pos >= lo, pos.copy() < lo + self.chunk))
                .order_by(_col(at))
            )
            chunk = self.local.with_arrow({}, lambda q=query: q)  # type: ignore[attr-defined]
            yield _matrix(chunk, self.feats, self.label, self.model)

    def close(self) -> None:
        if self.table is not None:
            drop = exp.Drop(tables=[exp.Table(this=_ident(self.table))], kind="TABLE", exists=True)
            self.local.query(drop, "fit")  # type: ignore[attr-defined]
            self.table = None


#: the progress table's columns and types, in order: the first three in every one, ``setup`` and
#: ``writing`` added to one written before they were kept
_PROGRESS = {
    "epoch": "INTEGER",
    "steps": "INTEGER",
    "losses": "VARCHAR",
    "setup": "VARCHAR",
    "writing": "INTEGER",
}
_REQUIRED = ("epoch", "steps", "losses")


class Checkpoint:
    """Weights and optimizer state of the last finished epoch as tensor tables ``<name>__e<epoch>__...``,
    and ``<name>__progress`` (epoch, optimizer steps, losses): written after the tables, so a run stopped at
    any point resumes from a whole epoch. The previous epoch's tables are dropped after."""

    def __init__(self, session: Session, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"fit: checkpoint must be a name, got {name!r}")
        if is_reserved(name):  # its tables would be refused at the first save, after an epoch had trained
            raise ConfigError(f"fit: checkpoint {name!r} is a name tensorsql reserves for its own tables")
        self.s = session
        self.name = name
        self.progress = exp.Table(this=_ident(f"{name}__progress"))

    def check_free(self, model: Model, optimizer: Optimizer, start: int, epochs: int) -> None:
        """Before training: the tables of the epochs to come are free, or tensor tables of the epoch an
        earlier run of this checkpoint was writing when it stopped (``_mark``). A user's table of such a
        name (``ck__e1__W``), even a tensor or a saved model's weights, was replaced, then dropped with the
        epoch."""
        local = self.s.local_executor
        here = local.names_here()
        tensors = {fold(n) for n in self.s.tables()}
        writing = self._writing()
        for epoch in range(start + 1, epochs + 1):
            for table in self._tables(model, optimizer, epoch).values():
                if fold(table) in here and not (epoch == writing and fold(table) in tensors):
                    raise ConfigError(
                        f"fit: checkpoint {self.name!r} would write table {table!r}, a table or view it did "
                        "not write; give another checkpoint name, or drop it"
                    )

    def _tables(self, model: Model, optimizer: Optimizer, epoch: int) -> dict[str, str]:
        out = {f"param:{k}": f"{self.name}__e{epoch}__{k}" for k in model.names}
        for i, k in enumerate(model.names):
            for st in optimizer.state_names:
                out[f"state:{i}:{st}"] = f"{self.name}__e{epoch}__{k}__{st}"
        return out

    def save(self, model: Model, optimizer: Optimizer, epoch: int, losses: list[float]) -> None:
        s = self.s
        tables = self._tables(model, optimizer, epoch)
        self._ensure_progress()
        before = self._epoch()
        self._mark(epoch)  # the epoch's tables are this checkpoint's from now on, also if it stops halfway
        for i, k in enumerate(model.names):
            s.save(model.params[k], tables[f"param:{k}"], replace=True)
            for st in optimizer.state_names:
                s.save(optimizer.state[i][st], tables[f"state:{i}:{st}"], replace=True)
        row = exp.Tuple(
            expressions=[
                exp.Literal.number(epoch),
                exp.Literal.number(optimizer.steps),
                exp.Literal.string(json.dumps(losses)),
                exp.Literal.string(json.dumps(_setup(model, optimizer), sort_keys=True)),
                exp.Null(),
            ]
        )
        with s.local_executor.transaction("checkpoint"):
            s.execute(exp.delete(self.progress.copy()))
            s.execute(self._insert(row))
        if before is not None and before != epoch:
            stored = {fold(n) for n in s.tables()}  # as DuckDB's names match: a resume may spell it in
            # another case ("ck" then "CK"), whose last epoch's tables would stay otherwise
            for old in self._tables(model, optimizer, before).values():
                if fold(old) in stored:
                    s.drop(old)

    def _ensure_progress(self) -> None:
        cols = [exp.ColumnDef(this=_ident(c), kind=exp.DataType.build(_PROGRESS[c])) for c in _REQUIRED]
        schema = exp.Schema(this=self.progress.copy(), expressions=cols)
        self.s.execute(exp.Create(this=schema, kind="TABLE", exists=True))
        for c in (c for c in _PROGRESS if c not in _REQUIRED):
            col = exp.ColumnDef(this=_ident(c), kind=exp.DataType.build(_PROGRESS[c]), exists=True)
            self.s.execute(exp.Alter(this=self.progress.copy(), kind="TABLE", actions=[col]))

    def _mark(self, epoch: int) -> None:
        """The progress row says ``epoch``'s tables are being written (a row of epoch 0 where no epoch is
        saved yet): a run stopped halfway leaves tables its next run may replace, and only those."""
        if self._row() is None:
            values = [exp.Literal.number(0), exp.Literal.number(0), exp.Literal.string("[]"), exp.Null()]
            row = exp.Tuple(expressions=[*values, exp.Literal.number(epoch)])
            self.s.execute(self._insert(row))
        else:
            self.s.execute(exp.update(self.progress.copy(), {"writing": exp.Literal.number(epoch)}))

    def _insert(self, row: exp.Tuple) -> exp.Insert:
        return exp.insert(
            exp.Values(expressions=[row]), self.progress.copy(), columns=[_ident(c) for c in _PROGRESS]
        )

    def _writing(self) -> int | None:
        """The epoch whose tables a stopped run was writing (None: none, or a checkpoint written before
        the mark was kept)."""
        row = self._row()
        writing = None if row is None else row.get("writing")
        return writing if isinstance(writing, int) and not isinstance(writing, bool) else None

    def _row(self) -> dict[str, object] | None:
        """The progress row by column, None when there is none. The table is looked up, never read on the
        chance: inside the user's transaction a failed read aborts it (the user's writes would be lost). A
        table (or view) of that name that a checkpoint did not write, or a damaged row, is a ConfigError
        before anything is trained or written."""
        local = self.s.local_executor
        if not local.has_table(self.progress.name):
            return None
        rows, described = local.describe(exp.select(exp.Star()).from_(self.progress.copy()), "fit")
        got = {str(d[0]).lower(): str(d[1]).upper() for d in described}
        missing = any(c not in got for c in _REQUIRED)  # the added ones may be absent (written before)
        if missing or set(got) - set(_PROGRESS) or any(got[c] != _PROGRESS[c] for c in got):
            raise ConfigError(
                f"fit: checkpoint {self.name!r}: {self.progress.name!r} is not the progress table of a "
                f"checkpoint (its columns: {', '.join(f'{c} {t}' for c, t in got.items())}); give another "
                "checkpoint name"
            )
        if not rows:
            return None
        if len(rows) != 1:
            raise self._damaged(f"{len(rows)} progress rows")
        return {str(d[0]).lower(): v for d, v in zip(described, rows[0], strict=True)}

    def _damaged(self, what: str) -> ConfigError:
        return ConfigError(
            f"fit: checkpoint {self.name!r} is damaged ({what} in {self.progress.name!r}): drop its tables "
            "to start over, or give another checkpoint name"
        )

    def _progress(self) -> tuple[int, int, list[float], dict | None] | None:
        """(epoch, optimizer steps, losses, setup) of the progress row, checked; None when there is none."""
        row = self._row()
        if row is None:
            return None
        epoch, steps = row["epoch"], row["steps"]
        if not isinstance(epoch, int) or not isinstance(steps, int) or epoch < 0 or steps < 0:
            raise self._damaged(f"epoch {epoch!r}, steps {steps!r}")
        if epoch == 0:  # the first epoch's tables marked (``_mark``), none saved whole yet
            if steps or str(row["losses"]) != "[]":
                raise self._damaged(f"epoch 0 with steps {steps!r}, losses {row['losses']!r}")
            return None
        try:
            losses = json.loads(str(row["losses"]))
        except ValueError:
            losses = None
        if not isinstance(losses, list) or len(losses) != epoch:
            raise self._damaged(f"losses {row['losses']!r}")
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in losses):
            raise self._damaged(f"losses {row['losses']!r}")
        setup = row.get("setup")  # None: a checkpoint written before the setup was kept (its tables go by)
        if setup is not None:
            try:
                setup = json.loads(str(setup))
            except ValueError:
                setup = None
            if not isinstance(setup, dict):
                raise self._damaged(f"setup {row['setup']!r}")
        return epoch, steps, [float(v) for v in losses], setup

    def _epoch(self) -> int | None:
        found = self._progress()
        return None if found is None else found[0]

    def restore(self, model: Model, optimizer: Optimizer, epochs: int) -> tuple[int, list[float]] | None:
        """The saved epoch and losses, with the model's weights and the optimizer's state set from them (read
        into memory: the model never reads the checkpoint's tables, which a later epoch drops); None when
        nothing was saved yet. Checked before any of it is set: a checkpoint of more epochs than ``epochs``
        is a ConfigError (so a refused fit leaves the model and the optimizer unchanged)."""
        found = self._progress()
        if found is None:
            return None
        epoch, steps, losses, written = found
        if epoch > epochs:  # it returned the later epoch's weights as if it had trained to `epochs`
            raise ConfigError(
                f"fit: checkpoint {self.name!r} holds {epoch} epochs, more than epochs={epochs}: ask for at "
                "least as many, or give a new checkpoint name"
            )
        if written is not None:
            want = _setup(model, optimizer)
            got = written
            if got != json.loads(json.dumps(want)):
                raise ConfigError(
                    f"fit: checkpoint {self.name!r} (epoch {epoch}) was written for {_describe(got)}; this "
                    f"fit trains {_describe(want)} (give another checkpoint name, or drop its tables to "
                    "start over)"
                )
        tables = self._tables(model, optimizer, epoch)
        stored = {fold(n) for n in self.s.tables()}
        missing = sorted(t for t in tables.values() if fold(t) not in stored)
        if missing:
            raise ConfigError(
                f"fit: checkpoint {self.name!r} (epoch {epoch}) lacks {', '.join(missing)}: it was written "
                f"for another model or optimizer than this {model.kind} with {type(optimizer).__name__} "
                "(give another checkpoint name, or drop its tables to start over)"
            )
        s = self.s

        def read(table: str) -> TensorRelation:
            return s.from_numpy(s.table(table).numpy())

        params = [read(tables[f"param:{k}"]) for k in model.names]
        state = [
            {st: read(tables[f"state:{i}:{st}"]) for st in optimizer.state_names}
            for i in range(len(model.names))
        ]
        try:
            model.set_params(params)
        except (ShapeError, DTypeError) as exc:
            raise ConfigError(f"fit: checkpoint {self.name!r} does not fit this model: {exc}") from exc
        optimizer.steps = steps
        optimizer.state = state
        return epoch, losses


class _Progress:
    """A rich progress bar over the run's batches (on a terminal, or when asked), with a line per epoch."""

    def __init__(self, show: bool | None, total: int) -> None:
        self.bar = None
        if show is None:
            show = sys.stderr.isatty()
        if show:
            from rich.progress import Progress

            self.bar = Progress(transient=False)
            self.task = self.bar.add_task("training", total=total)
            self.bar.start()

    def advance(self, what: str) -> None:
        if self.bar is not None:
            self.bar.update(self.task, advance=1, description=what)

    def note(self, line: str) -> None:
        if self.bar is not None:
            self.bar.console.print(line)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.stop()


__all__ = ["Checkpoint", "History", "Stepper", "fit"]


def _setup(model: Model, optimizer: Optimizer) -> dict[str, object]:
    """What a checkpoint was written for: the model (kind, sizes, dtype) and the optimizer (its kind and the
    state it keeps). Its settings (learning rate, betas, decay) may change on a resume."""
    return {
        "model": model.kind,
        "config": model.config(),
        "dtype": model.dtype,
        "optimizer": type(optimizer).__name__,
        "state": list(optimizer.state_names),
    }


def _describe(setup: dict[str, object]) -> str:
    state = setup.get("state")
    keeps = f" keeping {', '.join(map(str, state))}" if isinstance(state, list) and state else ""
    model = f"a {setup.get('dtype')} {setup.get('model')} {setup.get('config')}"
    return f"{model} with {setup.get('optimizer')}{keeps}"
