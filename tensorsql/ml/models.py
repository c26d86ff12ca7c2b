"""Models whose weights are tensor relations: linear, logistic and softmax regression, and a multi-layer
perceptron. ``forward`` builds the graph from a feature matrix (a relation or an array), ``loss`` its
training loss, ``predict`` what a user scores with; ``save``/``load`` keep a model as tensor tables and a
row of ``tensorsql_models`` (its kind and sizes), so SQL can score with it (``predict(...)`` in ``s.sql``)."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
from sqlglot import exp

from tensorsql import api
from tensorsql.errors import CatalogError, ConfigError, DTypeError, ShapeError
from tensorsql.frontend import sql as sqlfront
from tensorsql.ml import losses

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session

#: the plain table that lists saved models
MODELS = "tensorsql_models"


def _size(value: object, what: str) -> int:
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | np.integer) or value < 1:
        raise ConfigError(f"{what} must be a positive int, got {value!r}")
    return int(value)  # a numpy int too (a shape's entry), as fit's epochs and batch_size


class Model:
    """Weights as relations, in ``names`` order (the order gradients and optimizer state follow)."""

    kind = "model"
    #: the loss ``fit`` minimises, from (outputs, targets)
    names: tuple[str, ...] = ()

    def __init__(self, session: Session, dtype: str = "float32", seed: int = 0) -> None:
        _check_session(session, type(self).__name__)
        if dtype not in ("float32", "float64"):
            raise ConfigError(f"{type(self).__name__}: dtype must be float32 or float64, got {dtype!r}")
        if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
            raise ConfigError(f"{type(self).__name__}: seed must be a non-negative int, got {seed!r}")
        self.session = session
        self.dtype = dtype
        self.seed = int(seed)
        self.params: dict[str, TensorRelation] = {}

    # -- to override ---------------------------------------------------------------------------------------
    def config(self) -> dict[str, object]:
        raise NotImplementedError

    def forward(self, x: object) -> TensorRelation:
        raise NotImplementedError

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        raise NotImplementedError

    def predict(self, x: object) -> TensorRelation:
        return self.forward(x)

    def targets(self, y: np.ndarray) -> np.ndarray:
        """A label column as the loss's targets (a class id becomes a one-hot row)."""
        return y.astype(self.dtype)

    # -- shared ---------------------------------------------------------------------------------------------
    @property
    def n_features(self) -> int:
        return int(self.config()["n_features"])  # type: ignore[call-overload]

    def inputs(self, x: object) -> object:
        """Features as an operand: an array is cast to the model's dtype (it joins the graph as an array)."""
        from tensorsql.relation import TensorRelation

        if isinstance(x, TensorRelation):
            if x.session is not self.session:
                raise ShapeError("the features belong to another session than the model")
            shape = x.shape
        else:
            arr = np.asarray(x)
            if arr.dtype.kind not in "biuf":
                raise DTypeError(f"{self.kind}: features must be numbers, got an array of {arr.dtype}")
            x = np.ascontiguousarray(arr, dtype=self.dtype)
            shape = x.shape
        if len(shape) != 2 or shape[1] != self.n_features:
            raise ShapeError(f"{self.kind}: features must be (rows, {self.n_features}), got shape {shape}")
        return x

    def init(self, shapes: dict[str, tuple[int, ...]]) -> None:
        """Glorot-uniform matrices, zero vectors, from ``seed`` (the same weights for the same seed)."""
        rng = np.random.default_rng(self.seed)
        for name, shape in shapes.items():
            if len(shape) == 2 and name.startswith("W"):
                limit = np.sqrt(6.0 / (shape[0] + shape[1]))
                value = rng.uniform(-limit, limit, shape)
            else:
                value = np.zeros(shape)
            self.params[name] = self.session.array(value.astype(self.dtype), copy=False)

    def set_params(self, params: Sequence[object]) -> None:
        """The weights, in the order of ``names``: relations of this session, or arrays (uploaded as they
        are: an array of another dtype than the model's is a DTypeError, never a silent cast)."""
        from tensorsql.relation import TensorRelation

        if isinstance(params, str | bytes) or not isinstance(params, Sequence):
            raise ConfigError(f"{self.kind}: set_params takes a list of weights {self.names}, got {params!r}")
        if len(params) != len(self.names):
            raise ShapeError(
                f"{self.kind}: set_params takes {len(self.names)} weights {self.names}, got {len(params)}"
            )
        rels: list[TensorRelation] = []
        for name, given in zip(self.names, params, strict=True):
            if isinstance(given, TensorRelation):
                if given.session is not self.session:
                    raise ShapeError(f"{self.kind}: weight {name} belongs to another session than the model")
                rels.append(given)
                continue
            arr = np.asarray(given)
            if arr.dtype.kind not in "biufc":
                raise DTypeError(f"{self.kind}: weight {name} must be numbers, got {type(given).__name__}")
            rels.append(self.session.array(arr))
        params = rels
        for name, rel in zip(self.names, params, strict=True):
            if rel.shape != self.params[name].shape:
                raise ShapeError(f"{self.kind}: {name} has shape {self.params[name].shape}, got {rel.shape}")
            if rel.dtype != self.dtype:
                raise DTypeError(
                    f"{self.kind}: {name} must be {self.dtype} (the model's dtype), got {rel.dtype}"
                )
        for name, rel in zip(self.names, params, strict=True):
            self.params[name] = rel

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.numpy() for k, v in self.params.items()}

    def save(self, name: str) -> None:
        """The weights as tensor tables ``<name>__<weight>`` and the model's row in ``tensorsql_models``."""
        from tensorsql import metadata

        name = metadata.check_name(name, "save model")
        s = self.session
        _ensure_models_table(s)  # a table of that name that is not the models' fails here, before any weight
        table = exp.Table(this=exp.to_identifier(MODELS, quoted=True))
        s.execute(exp.select("name", "kind", "config").from_(table.copy()).limit(0), "save model")
        row = exp.Tuple(
            expressions=[
                exp.Literal.string(name),
                exp.Literal.string(self.kind),
                # its weights' names, so a later save knows the tables it may replace without building it
                exp.Literal.string(json.dumps({**self.config(), "dtype": self.dtype, "weights": self.names})),
            ]
        )
        # a save never replaces tables it did not write: a user's table "churn__W" was overwritten by a
        # first save, and "churn__W0" by a save over a model "churn" of other weights (an MLP of more layers)
        old = _weight_tables(s, name)
        here = s.local_executor.names_here()
        new = {metadata.fold(f"{name}__{k}") for k in self.params}
        taken = [f"{name}__{k}" for k in self.params if metadata.fold(f"{name}__{k}") in here - old]
        if taken:
            saved = _saved(s, name)
            whose = "the saved model {!r} has no such weight" if saved else "no model {!r} is saved"
            raise CatalogError(
                f"save model {name!r}: table {taken[0]!r} exists and is not this model's "
                f"({whose.format(name)}); give the model another name, or drop the table"
            )
        # the weights and the row together (a model half saved is no model); inside a transaction the
        # user began, part of it. A name in another case is the same model: DuckDB's table names fold
        # case, so "Churn" and "churn" would share weight tables
        with s.local_executor.transaction("save model"):
            for k, rel in self.params.items():
                s.save(rel, f"{name}__{k}", replace=True)
            stored = {metadata.fold(t): t for t in s.tables()}
            for gone in sorted(old - new):  # the replaced model's weights this one does not have
                if gone in stored:
                    s.drop(stored[gone])
            s.execute(exp.delete(table, where=_named(s, name)), "save model")
            s.execute(exp.insert(exp.Values(expressions=[row]), table), "save model")

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}{v.shape}" for k, v in self.params.items())
        return f"<{type(self).__name__} {self.dtype} {shapes}>"


def _check_session(session: object, what: str) -> None:
    from tensorsql.session import Session

    if not isinstance(session, Session):  # None raised AttributeError from deep inside
        got = type(session).__name__
        raise ConfigError(f"{what}: the first argument must be a tensorsql Session, got {got}")


def _weight_tables(s: Session, name: str) -> set[str]:
    """The weight tables (folded names) of the models saved as ``name``: those a save may replace. A row
    that does not read as a model (damaged) owns none."""
    from tensorsql import metadata

    if not _saved(s, name):
        return set()
    table = exp.Table(this=exp.to_identifier(MODELS, quoted=True))
    out: set[str] = set()
    for kind, config in s.execute(exp.select("kind", "config").from_(table).where(_named(s, name)), "model"):
        try:
            names = json.loads(config).get("weights")
        except (ValueError, TypeError, AttributeError):
            continue
        if not (isinstance(names, list) and all(isinstance(k, str) for k in names)):
            try:  # a row saved before the names were kept: the model built from it has them
                names = _build(s, name, kind, config).names
            except CatalogError:
                continue
        out |= {metadata.fold(f"{name}__{k}") for k in names}
    return out


def _saved(s: Session, name: str) -> bool:
    """Whether a model of this name (any case of its ASCII letters) has a row in ``tensorsql_models``."""
    return not isinstance(_named(s, name), exp.Boolean)


def _named(s: Session, name: str) -> exp.Expression:
    """The ``tensorsql_models`` rows of model ``name``: its name with any case of its ASCII letters, as its
    tables' names match (DuckDB's ``lower`` folds every letter: 'Äm' and 'äm' are two tables, one model)."""
    from tensorsql import metadata

    table = exp.Table(this=exp.to_identifier(MODELS, quoted=True))
    names = [r[0] for r in s.execute(exp.select("name").from_(table), "model name")]
    same = [n for n in names if isinstance(n, str) and metadata.fold(n) == metadata.fold(name)]
    return exp.column("name").isin(*[exp.Literal.string(n) for n in same]) if same else exp.false()


def _ensure_models_table(s: Session) -> None:
    cols = [
        exp.ColumnDef(this=exp.to_identifier(c), kind=exp.DataType.build("VARCHAR"))
        for c in ("name", "kind", "config")
    ]
    create = exp.Create(
        this=exp.Schema(this=exp.Table(this=exp.to_identifier(MODELS, quoted=True)), expressions=cols),
        kind="TABLE",
        exists=True,
    )
    s.execute(create, "save model")


class LinearRegression(Model):
    """``y = X w + b``, mean squared error."""

    kind = "linear_regression"
    names = ("W", "b")

    def __init__(self, session: Session, n_features: int, *, dtype: str = "float32", seed: int = 0) -> None:
        super().__init__(session, dtype, seed)
        self.features = _size(n_features, f"{type(self).__name__}: n_features")
        self.init({"W": (self.features,), "b": ()})

    def config(self) -> dict[str, object]:
        return {"n_features": self.features}

    def forward(self, x: object) -> TensorRelation:
        return self.session.einsum("ij,j->i", self.inputs(x), self.params["W"]) + self.params["b"]

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        return losses.mse(out, y)


class LogisticRegression(LinearRegression):
    """``p = sigmoid(X w + b)``, binary cross-entropy from the logits; ``predict`` gives ``p``."""

    kind = "logistic_regression"

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        return losses.binary_cross_entropy(out, y)

    def predict(self, x: object) -> TensorRelation:
        return api.sigmoid(self.forward(x))  # type: ignore[return-value]

    def targets(self, y: np.ndarray) -> np.ndarray:
        """0/1 classes (booleans too) or probabilities: the cross-entropy of a target outside [0, 1] falls
        without bound (labels 3/5 trained to a loss of -800), of -1/+1 too."""
        t = _numbers(y, self.kind)
        bad = ~((t >= 0) & (t <= 1))  # NaN too
        if bad.any():
            raise ConfigError(
                f"{self.kind}: labels must be 0/1 classes or probabilities in [0, 1], got {t[bad][:5]!r}"
            )
        return t.astype(self.dtype)


class SoftmaxRegression(Model):
    """``p = softmax(X W + b)`` over ``n_classes``; labels are class ids 0..n_classes-1."""

    kind = "softmax_regression"
    names = ("W", "b")

    def __init__(
        self, session: Session, n_features: int, n_classes: int, *, dtype: str = "float32", seed: int = 0
    ) -> None:
        super().__init__(session, dtype, seed)
        self.features = _size(n_features, f"{type(self).__name__}: n_features")
        self.classes = _size(n_classes, f"{type(self).__name__}: n_classes")
        self.init({"W": (self.features, self.classes), "b": (self.classes,)})

    def config(self) -> dict[str, object]:
        return {"n_features": self.features, "n_classes": self.classes}

    def forward(self, x: object) -> TensorRelation:
        return self.inputs_times(x, "W") + self.params["b"]

    def inputs_times(self, x: object, w: str) -> TensorRelation:
        return self.session.einsum("ij,jk->ik", self.inputs(x), self.params[w])

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        return losses.softmax_cross_entropy(out, y, over=1)

    def predict(self, x: object) -> TensorRelation:
        return api.softmax(self.forward(x), over=1)  # type: ignore[return-value]

    def targets(self, y: np.ndarray) -> np.ndarray:
        return one_hot(y, self.classes, self.dtype, self.kind)


def _numbers(y: object, what: str) -> np.ndarray:
    """A label column as numbers: booleans as 0/1, DECIMAL and HUGEINT values (Python objects) as floats."""
    arr = np.asarray(y)
    if arr.dtype.kind == "b":
        return arr.astype(np.int64)
    if arr.dtype.kind == "O":
        try:
            return arr.astype(np.float64)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{what}: labels must be numbers, got {arr[:5]!r}...") from exc
    if arr.dtype.kind not in "iuf":
        raise ConfigError(f"{what}: labels must be numbers, got an array of {arr.dtype}")
    return arr


def one_hot(y: np.ndarray, classes: int, dtype: str, what: str) -> np.ndarray:
    ids = _numbers(y, what)
    if ids.dtype.kind == "f":
        if not np.all(np.isfinite(ids)) or not np.all(ids == np.round(ids)):
            raise ConfigError(f"{what}: labels must be class ids (integers), got {ids[:5]!r}...")
        ids = ids.astype(np.int64)
    if ids.dtype.kind not in "iu" or (ids.size and (ids.min() < 0 or ids.max() >= classes)):
        raise ConfigError(f"{what}: labels must be class ids 0..{classes - 1}")
    out = np.zeros((ids.shape[0], classes), dtype=dtype)
    out[np.arange(ids.shape[0]), ids] = 1
    return out


class MLP(SoftmaxRegression):
    """A feed-forward network (the EinDecomp paper's FFNN): ``layers`` = [features, hidden..., outputs],
    ``activation`` (relu, tanh, sigmoid) between layers; a classifier (softmax cross-entropy over the
    outputs, labels are class ids) or, with ``task="regression"``, mean squared error."""

    kind = "mlp"

    def __init__(
        self,
        session: Session,
        layers: list[int],
        *,
        activation: str = "relu",
        task: str = "classification",
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        Model.__init__(self, session, dtype, seed)
        if not isinstance(layers, list | tuple) or len(layers) < 2:
            raise ConfigError(f"MLP: layers must list at least [features, outputs], got {layers!r}")
        self.layers = [_size(n, f"MLP: layers[{i}]") for i, n in enumerate(layers)]
        if activation not in ("relu", "tanh", "sigmoid"):
            raise ConfigError(f"MLP: activation must be relu, tanh or sigmoid, got {activation!r}")
        if task not in ("classification", "regression"):
            raise ConfigError(f"MLP: task must be classification or regression, got {task!r}")
        self.activation, self.task = activation, task
        self.features, self.classes = self.layers[0], self.layers[-1]
        shapes: dict[str, tuple[int, ...]] = {}
        for i, (a, b) in enumerate(zip(self.layers, self.layers[1:], strict=False)):
            shapes[f"W{i}"], shapes[f"b{i}"] = (a, b), (b,)
        self.names = tuple(shapes)
        self.init(shapes)

    def config(self) -> dict[str, object]:
        return {
            "n_features": self.features,
            "layers": self.layers,
            "activation": self.activation,
            "task": self.task,
        }

    def forward(self, x: object) -> TensorRelation:
        h = self.inputs(x)
        depth = len(self.layers) - 1
        for i in range(depth):
            h = self.session.einsum("ij,jk->ik", h, self.params[f"W{i}"]) + self.params[f"b{i}"]
            if i < depth - 1:
                h = self.session.map(h, self.activation)
        return h  # type: ignore[return-value]

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        if self.task == "regression":
            return losses.mse(out, y)
        return losses.softmax_cross_entropy(out, y, over=1)

    def predict(self, x: object) -> TensorRelation:
        out = self.forward(x)
        return out if self.task == "regression" else api.softmax(out, over=1)  # type: ignore[return-value]

    def targets(self, y: np.ndarray) -> np.ndarray:
        if self.task == "regression":
            y = np.asarray(y, dtype=self.dtype)
            return y.reshape(-1, 1) if y.ndim == 1 and self.classes == 1 else y
        return one_hot(y, self.classes, self.dtype, self.kind)


KINDS: dict[str, type[Model]] = {
    cls.kind: cls for cls in (LinearRegression, LogisticRegression, SoftmaxRegression, MLP)
}


def load(session: Session, name: str) -> Model:
    """A model saved with ``save(name)``: its kind and sizes from ``tensorsql_models``, its weights from the
    tensor tables."""
    from tensorsql.errors import TableNotFoundError

    _check_session(session, "load")
    table = exp.Table(this=exp.to_identifier(MODELS, quoted=True))
    # looked up, not read on the chance: inside the user's transaction a failed read aborts it
    if not session.local_executor.has_table(MODELS):
        raise TableNotFoundError(f"no saved model {name!r} (no {MODELS} table)")
    query = exp.select("kind", "config").from_(table).where(_named(session, name))
    rows = session.execute(query, "load model")
    if not rows:
        raise TableNotFoundError(f"no saved model {name!r} in {MODELS}")
    if len(rows) > 1:  # saved by a version that told names apart by case: their weight tables are one set
        raise CatalogError(
            f"{MODELS} has {len(rows)} models named {name!r} in different cases, which share their weight "
            "tables; save the model again to keep one"
        )
    kind, config = rows[0]
    model = _build(session, name, kind, config)
    try:
        model.set_params([session.table(f"{name}__{k}") for k in model.names])
    except (ShapeError, DTypeError) as exc:  # sizes in the row that its weight tables do not have
        raise CatalogError(f"saved model {name!r}: its weights do not fit its {MODELS} row: {exc}") from exc
    return model


def load_cached(session: Session, name: str) -> Model:
    """``load``, reused while the model's ``tensorsql_models`` row and its weight tables' catalog entries are
    what they were: a scoring query (SQL ``predict``) looks them up (a few catalog reads) instead of building
    the model again. The weights are read from their tables at every run, so new values in the same tables
    are seen; a model saved again (another row, or weights of other shapes or blocks) is loaded anew."""
    from tensorsql import metadata
    from tensorsql.errors import TableNotFoundError

    _check_session(session, "load")
    if not session.local_executor.has_table(MODELS):
        raise TableNotFoundError(f"no saved model {name!r} (no {MODELS} table)")
    table = exp.Table(this=exp.to_identifier(MODELS, quoted=True))
    every = session.execute(exp.select("name", "kind", "config").from_(table), "load model")
    rows = [r[1:] for r in every if isinstance(r[0], str) and metadata.fold(r[0]) == metadata.fold(name)]
    if len(rows) != 1:
        return load(session, name)  # no such model, or several: load says why
    try:
        names = list(json.loads(rows[0][1]).get("weights", []))
    except (TypeError, ValueError, AttributeError):
        return load(session, name)
    found = session.executor.catalog.get_many([f"{name}__{k}" for k in names])
    held = sorted((k, (e.dtype, tuple(e.shape), tuple(e.block_shape))) for k, e in found.items())
    state = (rows[0], tuple(held))
    key = ("saved model", metadata.fold(name))
    cached = session.compiled.get(key)
    if cached is not None and cached[0] == state:  # type: ignore[index]
        model = cached[1]  # type: ignore[index]
        session.confirm_read(model.params.values())  # checked against the catalog just now
        return model  # type: ignore[no-any-return]
    model = load(session, name)
    session.compiled.put(key, (state, model))
    return model


def _build(session: Session, name: str, kind: object, config: object) -> Model:
    """A model of the kind and sizes of a ``tensorsql_models`` row (its weights new); CatalogError for a
    row ``save`` did not write."""
    cls = KINDS.get(kind)  # type: ignore[call-overload]
    if cls is None:
        raise CatalogError(f"saved model {name!r} has an unknown kind {kind!r} in {MODELS}")
    try:
        cfg = json.loads(config)
        dtype = cfg.pop("dtype")
        if cls is TransformerBlock:
            heads, hidden, causal = cfg["heads"], cfg["hidden"], cfg["causal"]
            model: Model = TransformerBlock(session, cfg["model"], heads, hidden, causal=causal, dtype=dtype)
        elif cls is MLP:
            act, task = cfg["activation"], cfg["task"]
            model = MLP(session, cfg["layers"], activation=act, task=task, dtype=dtype)
        elif cls is SoftmaxRegression:
            model = SoftmaxRegression(session, cfg["n_features"], cfg["n_classes"], dtype=dtype)
        else:
            model = cls(session, cfg["n_features"], dtype=dtype)  # type: ignore[call-arg]
    except (ValueError, TypeError, KeyError, AttributeError, ConfigError) as exc:  # not what save wrote
        what = f"no field {exc}" if isinstance(exc, KeyError) else str(exc)
        raise CatalogError(
            f"saved model {name!r}: its {MODELS} row is corrupted ({what}): {config!r}"
        ) from exc
    return model




class TransformerBlock(Model):
    """One pre-norm transformer block of the LLaMA shape, on a sequence ``X`` (seq, model): ``H = X +
    Attention(RMSNorm(X))``, ``Y = H + MLP(RMSNorm(H))``. Attention has ``heads`` heads of ``model // heads``
    (softmax over the keys, ``causal`` masks the future); the MLP is ``relu(N W1 + b1) W2 + b2``. Every step
    is an EinSum or a map, so ``ts.grad`` differentiates it and EinDecomp plans it. ``loss`` is the mean
    squared error against a target sequence (a stand-in for a language model's head)."""

    kind = "transformer_block"

    def __init__(
        self,
        session: Session,
        model: int,
        heads: int,
        hidden: int,
        *,
        causal: bool = True,
        dtype: str = "float32",
        seed: int = 0,
    ) -> None:
        super().__init__(session, dtype, seed)
        self.model = _size(model, "TransformerBlock: model")
        self.heads = _size(heads, "TransformerBlock: heads")
        self.hidden = _size(hidden, "TransformerBlock: hidden")
        if self.model % self.heads:
            raise ConfigError(f"TransformerBlock: model={model} is not a multiple of heads={heads}")
        if not isinstance(causal, bool):
            raise ConfigError(f"TransformerBlock: causal must be a bool, got {causal!r}")
        self.causal = causal
        e = self.model // self.heads
        shapes: dict[str, tuple[int, ...]] = {
            "g1": (self.model,),
            "Wq": (self.model, self.heads, e),
            "Wk": (self.model, self.heads, e),
            "Wv": (self.model, self.heads, e),
            "Wo": (self.heads, e, self.model),
            "g2": (self.model,),
            "W1": (self.model, self.hidden),
            "b1": (self.hidden,),
            "W2": (self.hidden, self.model),
            "b2": (self.model,),
        }
        self.names = tuple(shapes)
        rng = np.random.default_rng(seed)
        for name, shape in shapes.items():
            if name.startswith("g"):
                value = np.ones(shape)
            elif name.startswith("b"):
                value = np.zeros(shape)
            else:
                fan_in = shape[0] if name != "Wo" else self.model
                value = rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape)
            self.params[name] = session.array(value.astype(dtype), copy=False)

    def config(self) -> dict[str, object]:
        return {
            "n_features": self.model,
            "model": self.model,
            "heads": self.heads,
            "hidden": self.hidden,
            "causal": self.causal,
        }

    def rmsnorm(self, x: TensorRelation, g: TensorRelation, eps: float = 1e-6) -> TensorRelation:
        s = self.session
        mean_square = s.einsum("sd,sd->s", x, x) * (1.0 / self.model)
        scale = s.map(mean_square + eps, "pow", -0.5)
        return s.einsum("sd,s,d->sd", x, scale, g)

    def forward(self, x: object) -> TensorRelation:
        s, p = self.session, self.params
        x = s.as_relation(self.inputs(x))
        seq = x.shape[0]
        n = self.rmsnorm(x, p["g1"])
        q = s.einsum("sd,dhe->hse", n, p["Wq"])
        k = s.einsum("sd,dhe->hse", n, p["Wk"])
        v = s.einsum("sd,dhe->hse", n, p["Wv"])
        e = self.model // self.heads
        scores = s.einsum("hse,hte->hst", q, k) * (1.0 / math.sqrt(e))  # a Python float keeps float32
        if self.causal:  # -inf above the diagonal: those keys get no weight
            mask = np.triu(np.full((seq, seq), -np.inf, dtype=self.dtype), 1)
            mask[np.isinf(mask)] = np.finfo(self.dtype).min  # finite: the max-subtracted exp is exactly 0
            scores = s.einsum("hst,st->hst", scores, mask, join="add")
        weights = api.softmax(scores, over=2)
        attended = s.einsum("hst,hte->hse", weights, v)
        h = s.einsum("hse,hed->sd", attended, p["Wo"]) + x
        m = self.rmsnorm(h, p["g2"])
        up = s.map(s.einsum("sd,df->sf", m, p["W1"]) + p["b1"], "relu")
        return s.einsum("sf,fd->sd", up, p["W2"]) + p["b2"] + h  # type: ignore[return-value]

    def loss(self, out: TensorRelation, y: object) -> TensorRelation:
        return losses.mse(out, y)


KINDS[TransformerBlock.kind] = TransformerBlock

# SQL's predict('model', ...) scores with the models saved here (the SQL front end looks the loader up)
sqlfront.provide("model", load_cached)


__all__ = [
    "MLP",
    "LinearRegression",
    "LogisticRegression",
    "Model",
    "SoftmaxRegression",
    "TransformerBlock",
    "load",
]
