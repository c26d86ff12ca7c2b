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
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
from sqlglot import exp

from tensorsql.autodiff import grad
from tensorsql.errors import ConfigError, TensorSQLError
from tensorsql.frontend import wide
from tensorsql.ml.optim import SGD, Optimizer

if TYPE_CHECKING:
    from tensorsql.ml.models import Model
    from tensorsql.session import Session

_POS = "_ts_pos"
#: bytes of features ``fit`` reads from the shuffled rows per query (whole batches; at least one)
READ_BYTES = 64 << 20
_ids = itertools.count()


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
) -> History:
    """Train ``model`` on ``source`` (a table name or a SELECT): ``features`` are its feature columns (a
    SELECT's own columns less ``label`` when omitted), ``label`` its target column."""
    s = model.session
    optimizer = optimizer if optimizer is not None else SGD(0.1)
    for value, what in ((epochs, "epochs"), (batch_size, "batch_size")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"fit: {what} must be a positive int, got {value!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"fit: seed must be an int, got {seed!r}")
    if not isinstance(label, str) or not label:
        raise ConfigError(f"fit: label must name the target column, got {label!r}")
    if not isinstance(optimizer, Optimizer):
        raise ConfigError(f"fit: optimizer must be an Optimizer (SGD, Adam, AdamW), got {optimizer!r}")
    src, cols = wide.source(source, features)
    local = getattr(s.executor, "local", s.executor)
    probe = src.this if isinstance(src, exp.Subquery) else exp.select(exp.Star()).from_(src)
    _, described = local.describe(exp.select(exp.Star()).from_(exp.Subquery(this=probe)).limit(0), "fit")
    names = [str(d[0]) for d in described]
    if label not in names:
        raise ConfigError(f"fit: no label column {label!r} in the source (columns: {names})")
    feats = list(cols) if cols is not None else [n for n in names if n != label]
    missing = [c for c in feats if c not in names]
    if missing:
        raise ConfigError(f"fit: no feature column {missing[0]!r} in the source (columns: {names})")
    if label in feats:
        raise ConfigError(f"fit: the label {label!r} is also among the features")
    types = {str(d[0]): d for d in described}
    wide.check_types([types[c] for c in [*feats, label]], [*feats, label])
    if len(feats) != model.n_features:
        raise ConfigError(f"fit: {len(feats)} feature columns for a model of {model.n_features} features")
    ((n,),) = local.query(exp.select(exp.Count(this=exp.Star())).from_(exp.Subquery(this=probe)), "fit")
    if n == 0:
        raise ConfigError("fit: the source has no rows")
    ck = Checkpoint(s, checkpoint) if checkpoint is not None else None
    history = History()
    start = 0
    if ck is not None:
        saved = ck.restore(model, optimizer)
        if saved is not None:
            start, history.losses = saved
            history.resumed_after = start
    batches = math.ceil(n / batch_size)
    # rows read per query: whole batches, up to READ_BYTES of features (one query per batch cost ~3 ms of
    # DuckDB and Arrow per 8192 x 100 batch, as much as the step itself)
    row_bytes = (len(feats) + 1) * np.dtype(model.dtype).itemsize
    chunk = batch_size * max(1, READ_BYTES // max(1, row_bytes * batch_size))
    bar = _Progress(progress, (epochs - start) * batches)
    stepper = Stepper(model, optimizer)
    try:
        for epoch in range(start, epochs):
            table = f"_ts_fit_{next(_ids)}"
            _shuffle(local, probe, [*feats, label], table, seed, epoch)
            total = 0.0
            try:
                for lo in range(0, n, chunk):  # a query per chunk of batches; the batches are its slices
                    xs, ys = _batch(local, table, feats, label, lo, min(n, lo + chunk), model)
                    for at in range(0, len(ys), batch_size):
                        x, y = xs[at : at + batch_size], ys[at : at + batch_size]
                        total += stepper.step(x, model.targets(y)) * len(y)
                        bar.advance(f"epoch {epoch + 1}/{epochs}")
            finally:
                drop = exp.Drop(tables=[exp.Table(this=_ident(table))], kind="TABLE", exists=True)
                local.query(drop, "fit")
            stepper.sync()  # the epoch's weights and state as relations (the checkpoint saves them)
            history.losses.append(total / n)
            history.ran += 1
            bar.note(f"epoch {epoch + 1}/{epochs}: loss {history.losses[-1]:.6g}")
            if ck is not None:
                ck.save(model, optimizer, epoch + 1, history.losses)
    finally:
        bar.close()
    return history


class Stepper:
    """The training step compiled once (``Session.compile``, planned once, run on new arrays each call):
    per batch shape, (features, targets, weights) -> (loss, gradients); per weight shape, the optimizer's
    (weight, gradient, state, step factors) -> (new weight, new state). Weights and state stay arrays
    between steps and become relations again at ``sync``."""

    def __init__(self, model: Model, optimizer: Optimizer) -> None:
        self.model, self.opt, self.s = model, optimizer, model.session
        self.params = [model.params[k].numpy() for k in model.names]
        if optimizer.state:
            self.state = [{k: v.numpy() for k, v in st.items()} for st in optimizer.state]
        else:
            self.state = [{k: np.zeros_like(p) for k in optimizer.state_names} for p in self.params]
        self.t = optimizer.steps
        self.grads: dict[tuple, object] = {}
        self.updates: dict[tuple, object] = {}

    def step(self, x: np.ndarray, y: np.ndarray) -> float:
        """One update; returns the batch's loss."""
        key = (x.shape, y.shape)
        if key not in self.grads:
            self.grads[key] = self._compile_grads(x, y)
        loss, *grads = self.grads[key](x, y, *self.params)  # type: ignore[operator]
        self.t += 1
        factors = [np.asarray(f, dtype=self.model.dtype) for f in self.opt.factors(self.t).values()]
        names = self.opt.state_names
        for i, (p, g) in enumerate(zip(self.params, grads, strict=True)):
            if p.shape not in self.updates:
                self.updates[p.shape] = self._compile_update(p.shape)
            out = self.updates[p.shape](p, g, *[self.state[i][k] for k in names], *factors)  # type: ignore[operator]
            out = out if isinstance(out, tuple) else (out,)
            self.params[i] = np.asarray(out[0])
            self.state[i] = {k: np.asarray(v) for k, v in zip(names, out[1:], strict=True)}
        return float(loss)

    def _compile_grads(self, x: np.ndarray, y: np.ndarray) -> object:
        s, model = self.s, self.model
        xs = s.placeholder(x.shape, x.dtype, name="features")
        ys = s.placeholder(y.shape, y.dtype, name="targets")
        ps = [s.placeholder(p.shape, p.dtype, name=k) for k, p in zip(model.names, self.params, strict=True)]
        held = dict(model.params)
        model.params = dict(zip(model.names, ps, strict=True))
        try:
            loss = model.loss(model.forward(xs), ys)
        finally:
            model.params = held
        # the forward steps the loss and the gradients share: computed once per batch
        return s.compile([loss, *grad(loss, ps)], [xs, ys, *ps], share=True)

    def _compile_update(self, shape: tuple[int, ...]) -> object:
        s, dtype = self.s, self.model.dtype
        p, g = s.placeholder(shape, dtype, name="weight"), s.placeholder(shape, dtype, name="gradient")
        state = {k: s.placeholder(shape, dtype, name=k) for k in self.opt.state_names}
        factors = {k: s.placeholder((), dtype, name=k) for k in self.opt.factors(1)}
        new, after = self.opt.update(p, g, state, factors)
        outputs = [new, *[after[k] for k in self.opt.state_names]]
        return s.compile(outputs, [p, g, *state.values(), *factors.values()])

    def sync(self) -> None:
        s = self.s
        self.model.set_params([s.from_numpy(p) for p in self.params])
        self.opt.state = [{k: s.from_numpy(v) for k, v in st.items()} for st in self.state]
        self.opt.steps = self.t


def _shuffle(local: object, probe: exp.Query, columns: list[str], table: str, seed: int, epoch: int) -> None:
    """The rows as a temporary table ``(columns..., _ts_pos)``, numbered in an order fixed by their values,
    the seed and the epoch (equal rows are interchangeable)."""
    key = exp.Anonymous(
        this="hash",
        expressions=[*[_col(c) for c in columns], exp.Literal.number(seed), exp.Literal.number(epoch)],
    )
    order = exp.Order(expressions=[exp.Ordered(this=key), *[exp.Ordered(this=_col(c)) for c in columns]])
    number = exp.Sub(
        this=exp.Window(this=exp.Anonymous(this="row_number", expressions=[]), order=order),
        expression=exp.Literal.number(1),
    )
    rows = exp.select(*[_col(c) for c in columns], exp.alias_(number, _POS, quoted=True)).from_(
        exp.Subquery(this=probe, alias=exp.TableAlias(this=_ident("_ts_src")))
    )
    create = exp.Create(
        this=exp.Table(this=_ident(table)),
        kind="TABLE",
        expression=rows,
        properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
    )
    local.query(create, "fit: shuffling the rows")  # type: ignore[attr-defined]


def _batch(
    local: object, table: str, feats: list[str], label: str, lo: int, hi: int, model: Model
) -> tuple[np.ndarray, np.ndarray]:
    pos = _col(_POS)
    query = (
        exp.select(*[_col(c) for c in [*feats, label]])
        .from_(exp.Table(this=_ident(table)))
        .where(exp.and_(exp.GTE(this=pos, expression=exp.Literal.number(lo)), pos.copy() < hi))
        .order_by(_col(_POS))
    )
    rows = local.with_arrow({}, lambda: query)  # type: ignore[attr-defined]
    for c in [*feats, label]:
        column = rows.column(c)
        if column.null_count:
            raise ConfigError(f"fit: column {c!r} has NULLs (features and labels need a number in every row)")
    x = np.empty((rows.num_rows, len(feats)), dtype=model.dtype)  # one copy, column by column
    for j, c in enumerate(feats):
        x[:, j] = rows.column(c).to_numpy(zero_copy_only=False)
    y = rows.column(label).to_numpy(zero_copy_only=False)
    return x, y


class Checkpoint:
    """Weights and optimizer state of the last finished epoch as tensor tables ``<name>__e<epoch>__...``,
    and ``<name>__progress`` (epoch, optimizer steps, losses): written after the tables, so a run stopped at
    any point resumes from a whole epoch. The previous epoch's tables are dropped after."""

    def __init__(self, session: Session, name: str) -> None:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"fit: checkpoint must be a name, got {name!r}")
        self.s = session
        self.name = name
        self.progress = exp.Table(this=_ident(f"{name}__progress"))

    def _tables(self, model: Model, optimizer: Optimizer, epoch: int) -> dict[str, str]:
        out = {f"param:{k}": f"{self.name}__e{epoch}__{k}" for k in model.names}
        for i, k in enumerate(model.names):
            for st in optimizer.state_names:
                out[f"state:{i}:{st}"] = f"{self.name}__e{epoch}__{k}__{st}"
        return out

    def save(self, model: Model, optimizer: Optimizer, epoch: int, losses: list[float]) -> None:
        s = self.s
        tables = self._tables(model, optimizer, epoch)
        for i, k in enumerate(model.names):
            s.save(model.params[k], tables[f"param:{k}"], replace=True)
            for st in optimizer.state_names:
                s.save(optimizer.state[i][st], tables[f"state:{i}:{st}"], replace=True)
        cols = [
            exp.ColumnDef(this=_ident(c), kind=exp.DataType.build(t))
            for c, t in (("epoch", "INTEGER"), ("steps", "INTEGER"), ("losses", "VARCHAR"))
        ]
        schema = exp.Schema(this=self.progress.copy(), expressions=cols)
        s.execute(exp.Create(this=schema, kind="TABLE", exists=True))
        before = self._epoch()
        row = exp.Tuple(
            expressions=[
                exp.Literal.number(epoch),
                exp.Literal.number(optimizer.steps),
                exp.Literal.string(json.dumps(losses)),
            ]
        )
        s.execute(exp.Transaction())
        try:
            s.execute(exp.delete(self.progress.copy()))
            s.execute(exp.insert(exp.Values(expressions=[row]), self.progress.copy()))
            s.execute(exp.Commit())
        except TensorSQLError:
            s.execute(exp.Rollback())
            raise
        if before is not None and before != epoch:
            stored = set(s.tables())
            for old in self._tables(model, optimizer, before).values():
                if old in stored:
                    s.drop(old)

    def _epoch(self) -> int | None:
        try:
            rows = self.s.execute(exp.select("epoch").from_(self.progress.copy()))
        except TensorSQLError:
            return None
        return int(rows[0][0]) if rows else None

    def restore(self, model: Model, optimizer: Optimizer) -> tuple[int, list[float]] | None:
        """The saved epoch and losses, with the model's weights and the optimizer's state set from them;
        None when nothing was saved yet."""
        try:
            rows = self.s.execute(exp.select("epoch", "steps", "losses").from_(self.progress.copy()))
        except TensorSQLError:
            return None
        if not rows:
            return None
        epoch, steps, losses = int(rows[0][0]), int(rows[0][1]), json.loads(rows[0][2])
        tables = self._tables(model, optimizer, epoch)
        model.set_params([self.s.table(tables[f"param:{k}"]) for k in model.names])
        optimizer.steps = steps
        optimizer.state = [
            {st: self.s.table(tables[f"state:{i}:{st}"]) for st in optimizer.state_names}
            for i in range(len(model.names))
        ]
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
