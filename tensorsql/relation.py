"""TensorRelation: a tensor stored (or to be computed) as a relation of (block keys, tensor blob)."""

from __future__ import annotations

import math
import numbers
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
from sqlglot import exp

from tensorsql import operators
from tensorsql.backends import arrow
from tensorsql.dtypes import DTYPES
from tensorsql.errors import (
    ConfigError,
    IndexingError,
    OperatorError,
    OutputError,
    ShapeError,
    ShapeTypeError,
)
from tensorsql.ir import blocking
from tensorsql.ir import expr as E

if TYPE_CHECKING:
    from tensorsql.compile.cache import GraphEntry
    from tensorsql.compile.plan import Plan
    from tensorsql.compile.planning import PlanOptions
    from tensorsql.session import Session


class TensorRelation:
    """A handle on an expression node in a session; computing happens on ``numpy()``/``save()``/...

    Relations from ``from_numpy``/``from_sql``/``table`` are stored; ``einsum`` results are lazy and run as
    one statement when their value is first asked for. ``bindings`` are the arrays its array operands
    (``E.Operand`` leaves) stand for.
    """

    __slots__ = ("__weakref__", "_cache", "_plan", "bindings", "node", "options", "session")

    def __init__(
        self,
        session: Session,
        node: E.Node,
        bindings: dict[E.Operand, np.ndarray] | None = None,
        options: PlanOptions | None = None,
        *,
        cache: GraphEntry | None = None,
    ) -> None:
        self.session = session
        self.node = node
        self.bindings = bindings or {}
        self.options = options
        self._plan: Plan | None = None
        #: the cached call this relation's graph came from: its plan is made once for all of them
        self._cache = cache

    def plan(self) -> Plan:
        """The plan this relation runs with (computed once; once per cached call for an einsum's)."""
        if self._plan is None:
            cache = self._cache
            # what else a plan depends on: the session's strategy and p, the engine's terms
            key = (self.session.strategy, self.session.p, getattr(self.session.executor, "profile", None))
            plan = cache.plans.get(key) if cache is not None else None
            if plan is None:
                plan = self.session.plan(self.node, self.options)
                if cache is not None:
                    cache.plans[key] = plan
            self._plan = plan
            ex = self.session.executor
            let_go = getattr(ex, "let_go", None)
            if cache is not None and let_go is not None and ex.keeps(plan):  # the cache outlives us: what
                # we keep bound between runs (views of our arrays) must not
                arrays = tuple(id(a) for a in self.bindings.values())
                weakref.finalize(self, let_go, plan, arrays)
        return self._plan

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.node.dtype]

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.plan().block_shape()

    def numpy(self) -> np.ndarray:
        """The value as a new array, its blocks written into it by the kernels (``Session.value``).

        A big contraction whose output interleaves its operands' labels comes back as a transposed view of
        its GEMM-ordered result, like numpy's own contractions; every other result is C-contiguous.
        """
        arr = self.bindings.get(self.node) if isinstance(self.node, E.Operand) else None
        if arr is not None:  # an array's relation (``Session.array``): its value is the array
            self.session.require_open("numpy")
            return np.array(arr, copy=True)
        return self.session.value(self.plan(), self.bindings, keep=True)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def to_arrow(self) -> pa.Table:
        """Key columns and the ``tensor`` blob column, with dtype/shape/block_shape in schema metadata."""
        self.session.require_open("to_arrow")
        self.session.check_tables(self.plan())
        table = self.session.executor.run_arrow(self.plan(), self.bindings, keep=True)
        return table.replace_schema_metadata(arrow.metadata(self.shape, self.block_shape, self.node.dtype))

    def to_rows(self, *, skip_zeros: bool = False, ids: bool | dict[int, pa.Table] = False) -> pa.Table:
        """The tensor as rows ``(i0, ..., i{r-1}, value)`` (SQL's ``tensor_cells``), made in SQL from the
        blocks; ``skip_zeros`` leaves out the zero cells. ``ids``: True maps the positions of this relation's
        id dimensions (``from_sql(index=...)``) back to their ids; or {dimension: a (position, id) table,
        such as ``other.ids(0)``} maps a result's positions through another relation's ids. Row order is not
        defined."""
        self.session.require_open("to_rows")
        if not isinstance(skip_zeros, bool):
            raise ConfigError(f"to_rows: skip_zeros must be a bool, got {type(skip_zeros).__name__}")
        from tensorsql.frontend import ids as idmaps
        from tensorsql.frontend import sql as sqlfront

        maps = self._id_sources(ids)
        relation = getattr(self.session.executor, "relation", None)
        if relation is None:  # a cluster: the blocks come back, the rows are made here
            rows = sqlfront.cells_from_array(self.numpy(), skip_zeros)
            if not maps:
                return rows
            return self.session.executor.local.with_arrow(  # type: ignore[attr-defined]
                {"_ts_cells_rows": rows, **{f"_ts_idmap_{d}": t for d, t in maps.items()}},
                lambda: idmaps.rows_with_ids(
                    exp.select(exp.Star()).from_("_ts_cells_rows"),
                    self.ndim,
                    {d: exp.Table(this=exp.to_identifier(f"_ts_idmap_{d}")) for d in maps},
                ),
            )
        rel = self
        self.session.check_tables(rel.plan())
        dense = not skip_zeros  # the cells of a block a stored table leaves out are zeros, rows too
        query = self.session.executor.plan_query(rel.plan(), dense)
        if query is None:  # arrays bound, or a plan over the memory budget: computed into a table first
            rel = self.materialize()
            query = self.session.executor.plan_query(rel.plan(), dense)
        cells = sqlfront.cells_query(query, self.shape, rel.block_shape, self.node.dtype, skip_zeros)
        if not maps:
            return relation(cells, "to_rows").to_arrow_table()
        views = {f"_ts_idmap_{d}": t for d, t in maps.items()}
        tables = {d: exp.Table(this=exp.to_identifier(f"_ts_idmap_{d}")) for d in maps}
        return self.session.executor.with_arrow(  # type: ignore[attr-defined]
            views, lambda: idmaps.rows_with_ids(cells, self.ndim, tables)
        )

    def _id_sources(self, ids: object) -> dict[int, pa.Table]:
        if ids is False or ids is None:
            return {}
        if ids is True:
            maps = self.session._id_maps.get(self, {})
            if not maps:
                raise ConfigError(
                    "to_rows: ids=True, but this relation has no ids (from_sql(index=...) gives them)"
                )
            return {d: self.ids(d) for d in maps}
        if not isinstance(ids, dict):
            raise ConfigError(
                f"to_rows: ids= must be True or {{dimension: (position, id) table}}, got {ids!r}"
            )
        out: dict[int, pa.Table] = {}
        for d, table in ids.items():
            if isinstance(d, bool) or not isinstance(d, int) or not 0 <= d < self.ndim:
                raise ConfigError(f"to_rows: ids= names dimension {d!r} of a {self.ndim}-d tensor")
            if not isinstance(table, pa.Table) or table.column_names != ["position", "id"]:
                raise ConfigError("to_rows: an ids= table has columns (position, id), as rel.ids(d) gives")
            out[d] = table
        return out

    def ids(self, d: int) -> pa.Table:
        """(position, id) of dimension ``d``, for a relation ``from_sql(index=...)`` made."""
        self.session.require_open("ids")
        return self.session.id_table(self, d)

    def save(self, name: str, *, replace: bool = False) -> TensorRelation:
        """Store as a table ``name`` with a catalog entry; returns the stored relation."""
        return self.session.save(self, name, replace=replace)

    def materialize(self) -> TensorRelation:
        """Compute once into a temporary table, so later uses read the blocks instead of recomputing."""
        return self.session.materialize(self)

    def sql(self, pretty: bool = True) -> str:
        self.session.require_open("sql")
        return self.session.executor.text(self.plan(), pretty=pretty)

    def explain(self) -> str:
        return self.session.explain(self.plan())

    def reblock(
        self, block_shape: tuple[int, ...] | None = None, blocks: tuple[int, ...] | None = None
    ) -> TensorRelation:
        """The same tensor with another block shape (a repartition done in SQL by slice/assemble)."""
        bs = blocking.resolve_block_shape(self.shape, block_shape, blocks, "reblock")
        node = E.Reblock(shape=self.shape, dtype=self.node.dtype, input=self.node, block_shape=bs)
        return TensorRelation(self.session, node, self.bindings, self.options)

    def __repr__(self) -> str:
        if isinstance(self.node, E.Source):
            return (
                f"<TensorRelation stored shape={self.shape} dtype={self.node.dtype} "
                f"blocks={self.node.block_shape}>"
            )
        blocks = f"blocks={self._plan.block_shape()}" if self._plan is not None else "not planned yet"
        return f"<TensorRelation lazy (not computed) shape={self.shape} dtype={self.node.dtype} {blocks}>"

    # -- Python operators (``tensorsql.operators``): the same lazy graph as einsum ---------------------------
    def __array_ufunc__(self, ufunc: np.ufunc, method: str, *inputs: object, **kwargs: object) -> object:
        """``ndarray <op> relation`` (numpy asks the relation first): the operators' relation; ``np.exp`` and
        the other ufuncs that are maps (``operators.UNARY_UFUNCS``), and ``np.power``, the map's relation.
        Any other ufunc computes the relations and applies itself to the arrays."""
        name = ufunc.__name__
        op = operators.UFUNCS.get(name)
        if method == "__call__" and not kwargs and op is not None and len(inputs) == 2:
            x, y = inputs
            if x is self:
                return op(self, y, False)
            return op(self, x, True)
        alone = len(inputs) == 1 and inputs[0] is self  # not ``inputs == (self,)``: array == rel is lazy
        if method == "__call__" and not kwargs and alone and name in operators.UNARY_UFUNCS:
            out = self.session.map(self, operators.UNARY_UFUNCS[name])
            with np.errstate(all="ignore"):  # numpy's result dtype (np.reciprocal of integers stays integer)
                want = ufunc(np.ones((), dtype=self.dtype)).dtype
            if out.dtype == want:
                return out
        power = name in ("power", "float_power") and len(inputs) == 2 and inputs[0] is self
        number = power and np.ndim(inputs[1]) == 0 and not isinstance(inputs[1], TensorRelation)
        if method == "__call__" and not kwargs and number:
            wide = "complex128" if self.dtype.kind == "c" else "float64"  # float_power: numpy's widest
            base = self if name == "power" else self.astype(wide)
            return base ** inputs[1]
        rpower = name in ("power", "float_power") and len(inputs) == 2 and inputs[1] is self
        number = rpower and isinstance(inputs[0], numbers.Real) and self.dtype.kind == "f"
        if method == "__call__" and not kwargs and number:  # ``np.float64(2) ** rel``: the map's relation
            return operators.rpower(self if name == "power" else self.astype("float64"), inputs[0])
        outs = kwargs.get("out", ())
        if any(isinstance(o, TensorRelation) for o in (outs if isinstance(outs, tuple) else (outs,))):
            # numpy would hand the call back to the relation again and again (a segfault, out of C stack)
            raise OutputError(
                f"np.{name}(..., out=<relation>): a relation cannot be written into; give out= a numpy array"
            )
        if method == "at" and inputs and isinstance(inputs[0], TensorRelation):
            raise OutputError(f"np.{name}.at: a relation cannot be changed in place; compute a new one")
        arrays = [i.numpy() if isinstance(i, TensorRelation) else i for i in inputs]
        kwargs = {k: v.numpy() if isinstance(v, TensorRelation) else v for k, v in kwargs.items()}
        return getattr(ufunc, method)(*arrays, **kwargs)

    def __add__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "add", "+")

    def __radd__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "add", "+", reflected=True)

    def __sub__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "subtract", "-")

    def __rsub__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "subtract", "-", reflected=True)

    def __mul__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "multiply", "*")

    def __rmul__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "multiply", "*", reflected=True)

    def __truediv__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "divide", "/")

    def __rtruediv__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "divide", "/", reflected=True)

    def __matmul__(self, other: object) -> TensorRelation:
        return operators.matmul(self, other)

    def __rmatmul__(self, other: object) -> TensorRelation:
        return operators.matmul(self, other, reflected=True)

    # comparisons: 1/0 masks in the operands' dtype (a tensor has no bool dtype). == and != stay Python's
    # identity (a relation is a dict key), as equal() / not_equal()
    def __gt__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "greater", ">")

    def __ge__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "greater_equal", ">=")

    def __lt__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "less", "<")

    def __le__(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "less_equal", "<=")

    def equal(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "equal", "equal")

    def not_equal(self, other: object) -> TensorRelation:
        return operators.binary(self, other, "not_equal", "not_equal")

    def __neg__(self) -> TensorRelation:
        return self.session.map(self, "neg")

    def __pos__(self) -> TensorRelation:
        return self

    def __abs__(self) -> TensorRelation:
        return self.session.map(self, "abs")

    def __pow__(self, exponent: object) -> TensorRelation:
        return operators.power(self, exponent)

    def __rpow__(self, base: object) -> TensorRelation:
        return operators.rpower(self, base)

    @property
    def T(self) -> TensorRelation:
        return operators.transpose(self)

    # numpy's reductions (np.sum(rel), np.mean(rel), ...) call these with dtype=, out=, keepdims= (and
    # initial=, where= when given: refused, typed)
    def sum(
        self,
        axis: object = None,
        dtype: object = None,
        out: object = None,
        keepdims: object = False,
        **rest: object,
    ) -> TensorRelation:
        _unsupported("sum", rest)
        return operators.reduce(self, axis, "sum", "sum", dtype=dtype, out=out, keepdims=keepdims)

    def max(
        self, axis: object = None, out: object = None, keepdims: object = False, **rest: object
    ) -> TensorRelation:
        _unsupported("max", rest)
        return operators.reduce(self, axis, "max", "max", out=out, keepdims=keepdims)

    def min(
        self, axis: object = None, out: object = None, keepdims: object = False, **rest: object
    ) -> TensorRelation:
        _unsupported("min", rest)
        return operators.reduce(self, axis, "min", "min", out=out, keepdims=keepdims)

    def prod(
        self,
        axis: object = None,
        dtype: object = None,
        out: object = None,
        keepdims: object = False,
        **rest: object,
    ) -> TensorRelation:
        _unsupported("prod", rest)
        return operators.reduce(self, axis, "prod", "prod", dtype=dtype, out=out, keepdims=keepdims)

    def mean(
        self,
        axis: object = None,
        dtype: object = None,
        out: object = None,
        keepdims: object = False,
        **rest: object,
    ) -> TensorRelation:
        _unsupported("mean", rest)
        return operators.mean(self, axis, dtype=dtype, out=out, keepdims=keepdims)

    def astype(self, dtype: object) -> TensorRelation:
        return operators.astype(self, dtype)

    def __getitem__(self, key: object) -> TensorRelation:
        """numpy basic indexing (ints, slices with any step, ``...``): a lazy relation of those elements, a
        slice in SQL that reads (or computes) only the blocks holding them."""
        return operators.getitem(self, key)

    def _item(self, what: str) -> object:
        """The value of a relation of one element (computed), as numpy converts an array of one element;
        any other size is numpy's TypeError (``ShapeTypeError``), for ``bool()`` its ValueError."""
        if math.prod(self.shape) != 1:
            if what == "bool()":
                raise ShapeError(
                    f"bool() of a relation of shape {self.shape}: the truth value of several elements is "
                    "ambiguous (use .any() or .all() on the array)"
                )
            raise ShapeTypeError(
                f"{what} of a relation of shape {self.shape}: only a relation of one element converts to a "
                "Python scalar"
            )
        return self.numpy().reshape(()).item()

    def item(self, *args: int) -> object:
        """numpy's ``item``: the one element as a Python scalar, or, with an index (flat, or one per axis),
        that element; it computes the relation."""
        if not args and math.prod(self.shape) != 1:  # numpy's ValueError
            raise ShapeError(
                f"item() of a relation of shape {self.shape}: only a relation of one element converts to a "
                "Python scalar (or name the element: item(i) or item(i, j, ...))"
            )
        if args:  # numpy's checks of the index on a view of the shape, before anything is computed
            where = f"item{args} of a relation of shape {self.shape}"
            try:
                np.broadcast_to(False, self.shape).item(*args)
            except IndexError as exc:
                raise IndexingError(f"{where}: {exc}") from exc
            except TypeError as exc:
                raise ShapeTypeError(f"{where}: {exc}") from exc
            except ValueError as exc:
                raise ShapeError(f"{where}: {exc}") from exc
        return self.numpy().item(*args)

    def __bool__(self) -> bool:  # numpy's: by value, never by length (``if rel > 100`` was always taken)
        return bool(self._item("bool()"))

    def __float__(self) -> float:
        return float(self._item("float()"))  # type: ignore[arg-type]

    def __int__(self) -> int:
        return int(self._item("int()"))  # type: ignore[call-overload]

    def __complex__(self) -> complex:
        return complex(self._item("complex()"))  # type: ignore[arg-type]

    def __len__(self) -> int:
        if self.ndim == 0:
            raise ShapeTypeError("len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self) -> Iterator[TensorRelation]:
        """Along the first axis, as numpy's arrays iterate (each step reads the blocks of one row)."""
        if self.ndim == 0:
            raise ShapeTypeError("iteration over a 0-d tensor")
        return (self[i] for i in range(self.shape[0]))

    def head(self, n: int = 5) -> np.ndarray:
        """The first ``n`` entries along the first axis, as an array: a preview that reads (and computes) only
        the blocks holding them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ConfigError(f"head: n must be a non-negative int, got {n!r}")
        if self.ndim == 0:
            return self.numpy()
        return self[:n].numpy()


def _unsupported(what: str, rest: dict[str, object]) -> None:
    """numpy's reduction arguments a relation does not take (``initial=``, ``where=``): an OperatorError."""
    if rest:
        names = ", ".join(f"{k}=" for k in rest)
        raise OperatorError(
            f"{what}: {names} is not supported on a relation (numpy's {names}); compute the array first "
            "(rel.numpy()), or mask the relation with an element-wise product"
        )
