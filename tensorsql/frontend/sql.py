"""SQL with tensor table functions (``Session.sql``): the statement is parsed with sqlglot, every tensor
function in its FROM clauses becomes a lazy relation (the same expression graph the Python API builds, so
nested calls are planned as one graph), and is replaced by the query of its generated plan. The rest of the
statement is DuckDB's, untouched.

Table functions (docs "SQL and the command line"):
- ``einsum('ij,jk->ik', A, B [, join => 'add', agg => 'max', strategy => 'sqrt'])``;
- ``tensor_map(A, 'exp' [, param])`` and ``softmax(A [, over => 1])``;
- ``tensor_cells(A [, skip_zeros => true])``: rows ``(i0, ..., value)`` of a tensor;
- ``tensor_from_cells((SELECT i, j, v FROM t), shape => [3, 4] [, block_shape => [2, 2], dtype => ...])``.

Operands are tensor tables (saved relations), nested calls, or ``(SELECT * FROM <either>)``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError
from sqlglot.tokens import TokenType

from tensorsql.dtypes import DTYPES
from tensorsql.errors import (
    SQLExecutionError,
    SQLFrontendError,
    SQLSyntaxError,
    TableNotFoundError,
    TensorSQLError,
)
from tensorsql.frontend import wide
from tensorsql.metadata import fold, is_reserved

if TYPE_CHECKING:
    from tensorsql.relation import TensorRelation
    from tensorsql.session import Session

#: the table functions that return a tensor (block rows k0.., tensor) and may nest
TENSOR_FUNCTIONS = ("einsum", "tensor_map", "softmax", "tensor_from_cells")
#: every table function this front end rewrites
FUNCTIONS = (*TENSOR_FUNCTIONS, "tensor_cells", "predict")

#: what the layers above this front end give its functions, registered when they are imported (``import
#: tensorsql`` imports them all): "softmax" (relation, over=) -> relation, from ``api``; "model" (session,
#: name) -> a saved model, from ``ml.models``. Looked up here, so the front end imports neither.
PROVIDED: dict[str, Callable[..., Any]] = {}


def provide(name: str, fn: Callable[..., Any]) -> None:
    """``fn`` serves the SQL surface as ``name`` (``PROVIDED``)."""
    PROVIDED[name] = fn


def _provided(name: str, call: exp.Expression) -> Callable[..., Any]:
    fn = PROVIDED.get(name)
    if fn is None:
        raise SQLFrontendError(f"{_where(call)}: {name} is not available (import tensorsql registers it)")
    return fn


@dataclass
class Rewritten:
    """A statement with its tensor functions replaced. ``calls``: (the call as written, its relation), for
    EXPLAIN; ``create``: a ``CREATE TABLE name AS SELECT * FROM <tensor>`` to run as ``save`` (name, the
    relation, replace, if_not_exists, insert); ``explain``: the statement was ``EXPLAIN ...``."""

    statement: exp.Expression
    calls: list[tuple[str, TensorRelation]] = field(default_factory=list)
    create: tuple[str, TensorRelation, bool, bool, bool] | None = None
    explain: bool = False
    #: every relation the statement's calls made: their temporary tables (``tensor_from_cells``, a call
    #: computed first) live as long as these do
    made: list[object] = field(default_factory=list)
    #: the statement's own text, when it has no tensor syntax (passed to DuckDB untouched)
    original: str | None = None
    #: calls whose tables are temporary (tensor_from_cells, a call computed first): no view may read them
    temps: bool = False
    #: EXPLAIN only: a call that would be computed first, so DuckDB's plan of the statement is not shown
    unbound: bool = False


def parse(text: str) -> exp.Expression:
    """One statement (SQLSyntaxError, with line and column, for anything sqlglot cannot parse)."""
    if not isinstance(text, str):
        raise SQLFrontendError(f"sql takes SQL text (a str), got {type(text).__name__}")
    try:
        statements = [s for s in sqlglot.parse(text, dialect="duckdb") if s is not None]
    except ParseError as exc:
        first = exc.errors[0] if exc.errors else {}
        where = f" at line {first.get('line')}, column {first.get('col')}" if first else ""
        near = f" near {first.get('highlight')!r}" if first.get("highlight") else ""
        raise SQLSyntaxError(f"SQL syntax error{where}{near}: {first.get('description', exc)}") from exc
    except TokenError as exc:
        raise SQLSyntaxError(f"SQL syntax error: {exc}") from exc
    except RecursionError as exc:  # nested past Python's stack (DuckDB's own limit: max_expression_depth)
        raise SQLSyntaxError("SQL syntax error: the statement is nested too deeply to parse") from exc
    if len(statements) != 1:
        raise SQLFrontendError(f"sql runs one statement at a time; this text has {len(statements)}")
    return statements[0].transform(_plain_predict)


def _plain_predict(node: exp.Expression) -> exp.Expression:
    """sqlglot reads ``predict(...)`` as BigQuery's ML.PREDICT; here it is our table function, a call."""
    if not isinstance(node, exp.Predict):
        return node
    args = [node.args[k] for k in ("this", "expression", "params_struct") if node.args.get(k) is not None]
    # its arguments too: a predict in the query of a predict reached DuckDB as PREDICT(MODEL ...)
    return exp.Anonymous(this="predict", expressions=[a.transform(_plain_predict) for a in args])


def _explained(text: str) -> str | None:
    """The statement under a leading ``EXPLAIN`` (not ``EXPLAIN ANALYZE``, which runs the statement and is
    left to DuckDB as written)."""
    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except TokenError as exc:
        raise SQLSyntaxError(f"SQL syntax error: {exc}") from exc
    while tokens and tokens[-1].token_type == TokenType.SEMICOLON:  # "EXPLAIN ...;" as other statements
        tokens = tokens[:-1]
    if len(tokens) == 2 and tokens[0].text.upper() == "EXPLAIN":
        rest = tokens[1].text
        if not rest.lstrip().upper().startswith("ANALYZE"):
            return rest
    return None


def _unquoted(name: str) -> str:
    """A tensor's name as the stored ``tensor_cells`` macro reads its string (``'"x.y"'`` is x.y), folded."""
    if len(name) >= 2 and name.startswith('"') and name.endswith('"'):
        name = name[1:-1].replace('""', '"')
    return fold(name)


def _where(node: exp.Expression) -> str:
    """The call as written, for messages: ``einsum('ij->ji', A)``."""
    return node.sql(dialect="duckdb", normalize_functions=False)


def _star_source(query: object) -> exp.Expression | None:
    """What ``SELECT * FROM <it>`` reads, when ``query`` is exactly that (no WHERE, JOIN, ...)."""
    if not isinstance(query, exp.Select):
        return None
    src = query.args.get("from_") or query.args.get("from")
    rest = [k for k, v in query.args.items() if v and k not in ("expressions", "from_", "from")]
    if rest or src is None or len(query.expressions) != 1 or not isinstance(query.expressions[0], exp.Star):
        return None
    star = query.expressions[0]
    if any(star.args.get(k) for k in ("except_", "except", "replace", "rename", "ilike")):
        return None  # * EXCLUDE / REPLACE / RENAME / ILIKE changes the rows: DuckDB's query, not a tensor
    return src.this


def _ours(node: exp.Expression, names: tuple[str, ...]) -> bool:
    return isinstance(node, exp.Anonymous) and node.name.lower() in names


class _Rewriter:
    def __init__(self, session: Session, explain: bool = False) -> None:
        self.s = session
        #: planning only (EXPLAIN): tensor_from_cells stands for its tensor without reading the rows
        self.explain = explain
        #: a call EXPLAIN cannot show DuckDB's plan of (it would have to compute something first)
        self.unbound = False
        self.calls: list[tuple[str, TensorRelation]] = []
        self.made: list[object] = []
        self.temps = False
        #: stored tables named by the statement, by folded name (``prefetch``)
        self.known: dict[str, TensorRelation] = {}
        #: the names of the statement's CTEs, folded (``prefetch``): DuckDB binds a read of such a name to the
        #: CTE, not to the tensor table the call was planned for
        self.ctes: set[str] = set()

    # -- operands ------------------------------------------------------------------------------------------
    def tensor(self, node: exp.Expression, call: exp.Expression, what: str) -> TensorRelation:
        """An operand: a tensor table, a nested tensor function, or ``(SELECT * FROM <either>)``."""
        if isinstance(node, exp.Column) and not node.table:
            return self.table(node.name, call, what)
        if isinstance(node, exp.Table) and not node.args.get("db") and isinstance(node.this, exp.Identifier):
            return self.table(node.name, call, what)
        if isinstance(node, exp.Table) and _ours(node.this, TENSOR_FUNCTIONS):
            return self.relation(node.this)
        if _ours(node, TENSOR_FUNCTIONS):
            return self.relation(node)
        if isinstance(node, exp.Subquery):
            src = _star_source(node.this)
            if src is not None:
                return self.tensor(src, call, what)
        raise SQLFrontendError(
            f"{_where(call)}: {what} ({_where(node)}) must be a tensor table, a tensor function (einsum, "
            "tensor_map, softmax, tensor_from_cells) or (SELECT * FROM one of those)"
        )

    def prefetch(self, statement: exp.Expression) -> None:
        """The stored tables the statement's tensor functions name, looked up together (one catalog lookup
        per statement, not per operand)."""
        self.ctes = {fold(cte.alias) for cte in statement.find_all(exp.CTE) if cte.alias}
        names: list[str] = []
        for call in statement.find_all(exp.Anonymous):
            if not _ours(call, FUNCTIONS):
                continue
            own = sorted(c for c in self.ctes if is_reserved(c))
            if own:  # the generated SQL (and the stored macro) read the catalog by its name
                raise SQLFrontendError(
                    f"a CTE named {own[0]!r} is refused beside tensor functions: the name is tensorsql's "
                    "own, which they read"
                )
            for arg in call.expressions:
                if isinstance(arg, exp.Literal) and arg.is_string and _unquoted(arg.name) in self.ctes:
                    raise SQLFrontendError(  # the stored macro's read of the tensor would read the CTE
                        f"{_where(call)}: tensor {arg.name!r} is also the name of a CTE of this statement, "
                        "which DuckDB would read in place of the tensor table; give the CTE another name"
                    )
                node = arg
                if isinstance(node, exp.Subquery):
                    node = _star_source(node.this) or node
                if isinstance(node, exp.Table) and node.args.get("db"):
                    continue
                if (isinstance(node, exp.Column) and not node.table) or (
                    isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier)
                ):
                    names.append(node.name)
        if names:
            self.known.update(self.s.tables_named(names))

    def table(self, name: str, call: exp.Expression, what: str) -> TensorRelation:
        if fold(name) in self.ctes:  # the generated SQL's read of the tensor would read the CTE's rows
            raise SQLFrontendError(
                f"{_where(call)}: {what} {name!r} is also the name of a CTE of this statement, which DuckDB "
                "would read in place of the tensor table; give the CTE another name (a tensor function "
                "reads tensor tables and tensor functions, not a CTE's rows)"
            )
        known = self.known.get(fold(name))
        if known is not None:
            return known
        try:
            return self.s.table(name)
        except TableNotFoundError as exc:
            raise TableNotFoundError(
                f"{_where(call)}: {what} {name!r} is not a tensor table ({exc.args[0] if exc.args else ''})"
            ) from exc

    # -- calls -----------------------------------------------------------------------------------------------
    def arguments(
        self, call: exp.Anonymous, names: tuple[str, ...]
    ) -> tuple[list[exp.Expression], dict[str, exp.Expression]]:
        positional: list[exp.Expression] = []
        named: dict[str, exp.Expression] = {}
        for arg in call.expressions:
            if isinstance(arg, exp.Kwarg | exp.PropertyEQ):
                key = arg.this.name.lower()
                if key not in names:
                    allowed = ", ".join(names) or "none"
                    raise SQLFrontendError(
                        f"{_where(call)}: unknown named argument {key!r} (takes: {allowed})"
                    )
                if key in named:
                    raise SQLFrontendError(f"{_where(call)}: argument {key!r} is given twice")
                named[key] = arg.expression
            else:
                if named:
                    raise SQLFrontendError(f"{_where(call)}: a positional argument follows a named one")
                positional.append(arg)
        return positional, named

    def relation(self, call: exp.Anonymous) -> TensorRelation:
        """A tensor function's relation (nested calls included: one graph)."""
        fn = call.name.lower()
        build: dict[str, Callable[[exp.Anonymous], TensorRelation]] = {
            "einsum": self.einsum,
            "tensor_map": self.map,
            "softmax": self.softmax,
            "tensor_from_cells": self.from_cells,
        }
        try:
            rel = build[fn](call)
        except TensorSQLError as exc:
            if _where(call) in str(exc):
                raise
            raise type(exc)(f"{_where(call)}: {exc}") from exc
        self.made.append(rel)
        return rel

    def einsum(self, call: exp.Anonymous) -> TensorRelation:
        pos, kw = self.arguments(call, ("join", "agg", "strategy"))
        if not pos:
            raise SQLFrontendError(f"{_where(call)}: einsum needs a subscripts string, then its operands")
        subscripts = _string(pos[0], call, "the subscripts")
        ops = [self.tensor(a, call, f"operand {i}") for i, a in enumerate(pos[1:])]
        options = {k: _string(v, call, k) for k, v in kw.items()}
        return self.s.einsum(subscripts, *ops, **options)  # type: ignore[arg-type]

    def map(self, call: exp.Anonymous) -> TensorRelation:
        pos, kw = self.arguments(call, ("fn", "param"))
        args = dict(zip(("x", "fn", "param"), pos, strict=False))
        if len(pos) > 3:
            raise SQLFrontendError(f"{_where(call)}: tensor_map takes (tensor, fn [, param])")
        for k, v in kw.items():
            if k in args:
                raise SQLFrontendError(f"{_where(call)}: argument {k!r} is given twice")
            args[k] = v
        if "x" not in args or "fn" not in args:
            raise SQLFrontendError(f"{_where(call)}: tensor_map takes (tensor, fn [, param])")
        x = self.tensor(args["x"], call, "its tensor")
        param = _number(args["param"], call, "param") if "param" in args else None
        return self.s.map(x, _string(args["fn"], call, "fn"), param)

    def softmax(self, call: exp.Anonymous) -> TensorRelation:
        softmax = _provided("softmax", call)
        pos, kw = self.arguments(call, ("over",))
        if len(pos) != 1:
            raise SQLFrontendError(f"{_where(call)}: softmax takes (tensor [, over => axis or [axes]])")
        x = self.tensor(pos[0], call, "its tensor")
        over: int | list[int] = -1
        if "over" in kw:
            value = kw["over"]
            if isinstance(value, exp.Array):
                over = [_int(v, call, "over") for v in value.expressions]
            else:
                over = _int(value, call, "over")
        return softmax(x, over=over)

    def from_cells(self, call: exp.Anonymous) -> TensorRelation:
        pos, kw = self.arguments(call, ("shape", "block_shape", "dtype"))
        if len(pos) != 1 or "shape" not in kw:
            raise SQLFrontendError(
                f"{_where(call)}: tensor_from_cells takes ((SELECT i0, ..., value ...), shape => [...] "
                "[, block_shape => [...], dtype => '...'])"
            )
        query = pos[0]
        if isinstance(query, exp.Subquery):  # tensor functions inside it are rewritten too
            text = self.rewrite(query.this.copy()).sql(dialect="duckdb", normalize_functions=False)
        elif isinstance(query, exp.Literal) and query.is_string:
            text = query.name
        else:
            raise SQLFrontendError(f"{_where(call)}: the cells must be a (SELECT ...) subquery or its text")
        shape = _ints(kw["shape"], call, "shape")
        block = _ints(kw["block_shape"], call, "block_shape") if "block_shape" in kw else None
        dtype = _string(kw["dtype"], call, "dtype") if "dtype" in kw else "float64"
        if self.explain:  # EXPLAIN plans the statement: the rows are not read, a placeholder stands in
            return self.s.placeholder(shape, dtype, name="tensor_from_cells")
        self.temps = True
        return self.s.from_sql(text, shape, block, dtype=dtype)

    # -- rewriting ----------------------------------------------------------------------------------------
    def rewrite(self, statement: exp.Expression) -> exp.Expression:
        """Every tensor function in a FROM or JOIN replaced by its plan's query (the outermost calls; a nested
        call is part of its parent's graph)."""
        for node in list(statement.find_all(exp.Anonymous)):
            if not _ours(node, FUNCTIONS):
                continue
            parent = node.parent
            inside = node.find_ancestor(exp.Anonymous)
            while inside is not None and not _ours(inside, FUNCTIONS):
                inside = inside.find_ancestor(exp.Anonymous)
            if inside is not None:
                continue  # an argument of an outer call: part of its graph
            first = node.expressions[0] if node.expressions else None
            if node.name.lower() == "tensor_cells" and isinstance(first, exp.Literal) and first.is_string:
                continue  # tensor_cells('A'): the database's own macro, as plain DuckDB clients call it
            if not isinstance(parent, exp.Table):
                if node.name.lower() == "tensor_map":
                    continue  # the extension's scalar tensor_map(fn, dtype, blob): DuckDB's
                raise SQLFrontendError(
                    f"{_where(node)}: {node.name} is a table function: use it in FROM or JOIN "
                    "(SELECT * FROM einsum(...))"
                )
            alias = parent.args.get("alias") or exp.TableAlias(this=exp.to_identifier(node.name.lower()))
            if node.name.lower() == "tensor_cells":
                query = self.cells(node)
            elif node.name.lower() == "predict":
                query = self.predict(node)
            else:
                rel = self.relation(node)
                self.calls.append((_where(node), rel))
                query = self.query(rel)
            sub = exp.Subquery(this=query, alias=alias.copy())
            for key in ("pivots", "sample", "laterals", "joins"):  # what the FROM item carried: its PIVOT was
                if parent.args.get(key):  # dropped (the cells came back unpivoted)
                    sub.set(key, parent.args[key])
            unsupported = ("hints", "system_time", "version", "ordinality", "when", "partition", "changes")
            kept = [k for k in unsupported if parent.args.get(k)]
            if kept:
                raise SQLFrontendError(f"{_where(node)}: {kept[0]} on a tensor function is not supported")
            parent.replace(sub)
        return statement

    def query(self, rel: TensorRelation, dense: bool = False) -> exp.Query:
        """The relation's plan as one query over stored tables; a plan that must run in waves (over the
        memory budget) is computed first into a temporary table, which the query then reads. ``dense``: a
        zero block for each one a stored table leaves out."""
        q = self.s.executor.plan_query(rel.plan(), dense)  # type: ignore[attr-defined]
        if q is None and self.explain:  # nothing is computed for EXPLAIN: DuckDB's own plan is left out
            self.unbound = True
            return exp.select(exp.Null())
        if q is None:
            rel = self.s.materialize(rel)
            self.made.append(rel)
            self.temps = True
            q = self.s.executor.plan_query(rel.plan(), dense)  # type: ignore[attr-defined]
        return q

    def cells(self, call: exp.Anonymous) -> exp.Query:
        pos, kw = self.arguments(call, ("skip_zeros",))
        if len(pos) != 1:
            raise SQLFrontendError(f"{_where(call)}: tensor_cells takes (tensor [, skip_zeros => true])")
        rel = self.tensor(pos[0], call, "its tensor")
        skip = False
        if "skip_zeros" in kw:
            value = kw["skip_zeros"]
            if not isinstance(value, exp.Boolean):
                raise SQLFrontendError(f"{_where(call)}: skip_zeros must be true or false")
            skip = bool(value.this)
        self.calls.append((_where(call), rel))
        try:
            # every cell, those of a block a stored table leaves out too (zeros): avg() over the rows of a
            # tensor with an absent block averaged only the present ones
            query = self.query(rel, dense=not skip)
            return cells_query(query, rel.shape, rel.plan().block_shape(), rel.node.dtype, skip)
        except TensorSQLError as exc:
            raise type(exc)(f"{_where(call)}: {exc}") from exc

    def predict(self, call: exp.Anonymous) -> exp.Query:
        """``predict('model', (SELECT key, features...), key => 'key')``: rows ``(key, value)`` of a saved
        model's predictions (``(key, class, value)`` for a model with several outputs), the features made
        into a matrix inside DuckDB (``from_table``, rows in key order) and the model run as one plan."""
        pos, kw = self.arguments(call, ("key",))
        if len(pos) != 2 or "key" not in kw or not isinstance(pos[1], exp.Subquery):
            raise SQLFrontendError(
                f"{_where(call)}: predict takes ('model name', (SELECT key, features ... FROM ...), "
                "key => 'key column')"
            )
        name = _string(pos[0], call, "the model name")
        key = _string(kw["key"], call, "key")
        try:
            model = _provided("model", call)(self.s, name)
        except TensorSQLError as exc:
            raise type(exc)(f"{_where(call)}: {exc}") from exc
        inner = self.rewrite(pos[1].this.copy())
        if self.explain:  # EXPLAIN reads no rows: the features are not gathered
            self.unbound = True
            return exp.select(exp.Null())
        # the query read once: its features and the keys beside them come from the same rows (read twice, a
        # query with USING SAMPLE or random() paired keys with other rows' predictions)
        rows = self.s.executor.snapshot(inner, "predict")  # type: ignore[attr-defined]
        self.made.append(rows)
        try:
            table = rows.table()
            _, described = self.s.executor.describe(exp.select(exp.Star()).from_(table).limit(0), "predict")
            names = [str(d[0]) for d in described]
            if key.lower() not in {n.lower() for n in names}:
                raise SQLFrontendError(f"the query has no key column {key!r} (columns: {names})")
            feats = [n for n in names if n.lower() != key.lower()]
            if feats and len(feats) == model.n_features:
                types = [d for d in described if str(d[0]).lower() != key.lower()]
                scored = self._scored(table, key, feats, types, model)
                if scored is not None:  # computed now from the rows read once: a table of the results
                    return scored
            x = self.s.from_table(rows.name, feats, rows_by=key, dtype=model.dtype) if feats else None
        except TensorSQLError as exc:
            raise type(exc)(f"{_where(call)}: {exc}") from exc
        if x is None:
            raise SQLFrontendError(f"{_where(call)}: the query has no feature columns besides {key!r}")
        self.made.append(x)
        self.temps = True
        if x.shape[1] != model.n_features:
            raise SQLFrontendError(
                f"{_where(call)}: the query gives {x.shape[1]} feature columns (besides {key!r}); model "
                f"{name!r} takes {model.n_features}"
            )
        out = model.predict(x)
        self.calls.append((_where(call), out))
        cells = cells_query(self.query(out), out.shape, out.plan().block_shape(), out.node.dtype, False)
        window = exp.Window(
            this=exp.Anonymous(this="row_number", expressions=[]),
            order=exp.Order(expressions=[exp.Ordered(this=exp.column(key, quoted=True))]),
        )
        pos = "_ts_pos" if key.lower() != "_ts_pos" else "_ts_pos_1"  # never the key's own name
        keys = exp.select(
            exp.column(key, quoted=True),
            exp.alias_(exp.Sub(this=window, expression=exp.Literal.number(1)), pos, quoted=True),
        ).from_(
            exp.Table(
                this=exp.to_identifier(rows.name, quoted=True),
                alias=exp.TableAlias(this=exp.to_identifier("_ts_rows")),
            )
        )
        cols = [exp.column(key, table="k", quoted=True)]
        if out.ndim == 2 and out.shape[1] > 1:  # one output (a regression MLP's (rows, 1)): no class column
            cols.append(exp.alias_(exp.column("i1", table="c", quoted=True), "class", quoted=True))
        cols.append(exp.alias_(exp.column("value", table="c", quoted=True), "prediction", quoted=True))
        on = exp.column("i0", table="c", quoted=True).eq(exp.column(pos, table="k", quoted=True))
        return (
            exp.select(*cols)
            .from_(exp.Subquery(this=keys, alias=exp.TableAlias(this=exp.to_identifier("k"))))
            .join(exp.Subquery(this=cells, alias=exp.TableAlias(this=exp.to_identifier("c"))), on=on)
        )


    def _scored(
        self, table: exp.Table, key: str, feats: list[str], described: list[tuple], model: object
    ) -> exp.Query | None:
        """``predict``'s rows computed now, when the features fit in memory (``PREDICT_BYTES``): read in key
        order in one query, scored by the model's prediction compiled once per row count
        (``Session.compiled``; one kernel call when its weights are arrays, one prepared statement over its
        weight tables when stored), and registered as a table of (key, [class,] prediction) rows that goes
        with the statement.
        None: too many rows (the features are then made into a matrix inside DuckDB, ``from_table``)."""
        ex = self.s.executor
        wide.check_types(described, feats, "predict")
        ((n,),) = ex.query(exp.select(exp.Count(this=exp.Star())).from_(table.copy()), "predict")
        dtype = np.dtype(model.dtype)  # type: ignore[attr-defined]
        if n == 0 or n * len(feats) * dtype.itemsize > PREDICT_BYTES:
            return None
        doubles = [exp.cast(exp.column(c, quoted=True), exp.DataType.build("DOUBLE")) for c in feats]
        read = (
            exp.select(exp.column(key, quoted=True), *[exp.alias_(d, f"f{i}") for i, d in enumerate(doubles)])
            .from_(table.copy())
            .order_by(exp.column(key, quoted=True))
        )
        got = ex.with_arrow({}, lambda: read)
        keys = got.column(0)
        x = np.empty((n, len(feats)), dtype=dtype)
        for j, c in enumerate(feats):
            col = got.column(j + 1)
            if col.null_count:
                at = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise SQLExecutionError(
                    f"predict: column {c!r} is NULL in row {at} (key {keys[at].as_py()!r}; a feature needs a "
                    "value in every row)"
                )
            with np.errstate(over="ignore"):
                x[:, j] = col.to_numpy(zero_copy_only=False)
        fn_key = ("predict", model, n)
        fn = self.s.compiled.get(fn_key)
        if fn is None:
            xp = self.s.placeholder(x.shape, dtype.name, name="features")
            fn = self.s.compiled.put(fn_key, self.s.compile(model.predict(xp), [xp]))  # type: ignore[attr-defined]
        out = np.asarray(fn(x))  # type: ignore[operator]
        pos = exp.column(key, quoted=True)
        if out.ndim == 2 and out.shape[1] > 1:  # a row per (key, class); a regression MLP's (n, 1): one
            k = out.shape[1]
            result = pa.table(
                {
                    key: keys.take(np.repeat(np.arange(n), k)),
                    "class": pa.array(np.tile(np.arange(k, dtype=np.int64), n)),
                    "prediction": pa.array(out.reshape(-1)),
                }
            )
            cols = [pos, exp.column("class", quoted=True), exp.column("prediction", quoted=True)]
        else:
            result = pa.table({key: keys, "prediction": pa.array(out.reshape(-1))})
            cols = [pos, exp.column("prediction", quoted=True)]
        view = ex.register_rows(result)
        self.made.append(view)
        return exp.select(*cols).from_(exp.Table(this=exp.to_identifier(view.name, quoted=True)))


#: features up to this many bytes are scored now from one read of the rows (``Rewriter._scored``)
PREDICT_BYTES = 256 << 20


def rewrite(session: Session, text: str, *, explain: bool = False) -> Rewritten:
    """``text`` with its tensor functions replaced (module docstring); ``explain``: as if it began with
    EXPLAIN."""
    inner = _explained(text) if isinstance(text, str) else None
    explain = explain or inner is not None
    statement = parse(inner if inner is not None else text)
    r = _Rewriter(session, explain)
    r.prefetch(statement)
    # EXPLAIN of a CTAS explains its rewrite below (looked at as a save too, its call was listed twice)
    create = None if explain else _create(r, statement)
    if create is not None:
        return Rewritten(statement, r.calls, create, made=r.made)
    if not explain and not any(_ours(n, FUNCTIONS) for n in statement.find_all(exp.Anonymous)):
        return Rewritten(statement, original=text)  # no tensor syntax: DuckDB gets the text as written
    if any(p.this is not None for p in statement.find_all(exp.Pivot)):
        # sqlglot writes a PIVOT/UNPIVOT statement with its source's columns unqualified: a correlated
        # subquery's w.i0 = c.i0 became i0 = i0 (true), and the generated joins' columns ambiguous
        raise SQLFrontendError(
            "a PIVOT or UNPIVOT statement over tensor functions is refused (its rewrite would drop their "
            "table qualifiers); write SELECT ... FROM <source> PIVOT (...), or save the tensor's cells first "
            "(CREATE TABLE c AS SELECT * FROM tensor_cells(...))"
        )
    statement = r.rewrite(statement)
    return Rewritten(statement, r.calls, None, explain, r.made, temps=r.temps, unbound=r.unbound)


def _create(r: _Rewriter, statement: exp.Expression) -> tuple[str, TensorRelation, bool, bool, bool] | None:
    """``CREATE [OR REPLACE] TABLE name AS SELECT * FROM <tensor function>``, or ``INSERT INTO name SELECT *
    FROM <tensor function>``: a save, so the table is a tensor relation afterwards (its catalog entry written
    in the same transaction). (name, relation, replace, if not exists, insert)."""
    insert = isinstance(statement, exp.Insert)
    if insert:
        body, target = statement.expression, statement.this
        if any(statement.args.get(k) for k in ("overwrite", "conflict", "returning")):
            return None
    elif isinstance(statement, exp.Create) and str(statement.args.get("kind", "")).upper() == "TABLE":
        body, target = statement.expression, statement.this
        if statement.args.get("properties") is not None:
            return None  # TEMP and other properties: DuckDB's own CREATE
    else:
        return None
    while isinstance(body, exp.Subquery) and not body.alias:  # AS (SELECT * FROM einsum(...))
        body = body.this
    src = _star_source(body)
    if not (isinstance(src, exp.Table) and _ours(src.this, TENSOR_FUNCTIONS)):
        return None
    if not isinstance(target, exp.Table):
        return None  # a column list (an exp.Schema target): DuckDB's own statement
    if target.args.get("db"):  # the current schema's name (main.T) is the plain name; another is refused:
        # DuckDB made a plain table of blobs there, with no catalog entry (a tensor's entry is its schema's)
        here_db, here_schema = r.s.executor.catalog.here()  # type: ignore[attr-defined]
        db, schema = target.text("catalog"), target.text("db")
        if not db and schema.lower() == here_db.lower():
            db, schema = here_db, here_schema  # "memory.T": DuckDB reads a database's name there
        if (db and db.lower() != here_db.lower()) or schema.lower() != here_schema.lower():
            raise SQLFrontendError(
                f"{target.sql(dialect='duckdb')}: a tensor is saved in the session's current schema "
                f"({here_db}.{here_schema}); USE the other one first, or name the table without it"
            )
        target = exp.Table(this=target.this)
    rel = r.relation(src.this)
    r.calls.append((_where(src.this), rel))
    replace, exists = bool(statement.args.get("replace")), bool(statement.args.get("exists"))
    return target.name, rel, replace, exists, insert


# -- literals ----------------------------------------------------------------------------
def _string(node: exp.Expression, call: exp.Expression, what: str) -> str:
    if isinstance(node, exp.Literal) and node.is_string:
        return node.name
    raise SQLFrontendError(f"{_where(call)}: {what} must be a string literal, got {_where(node)}")


def _number(node: exp.Expression, call: exp.Expression, what: str) -> float | int:
    """A numeric literal: an integer one as an exact int (through float, 2**53 + 1 became 2**53 where the
    Python API raises RangeError)."""
    sign = 1.0
    if isinstance(node, exp.Neg):
        sign, node = -1.0, node.this
    if isinstance(node, exp.Literal) and not node.is_string and node.is_int:
        return int(node.name) if sign > 0 else -int(node.name)
    if isinstance(node, exp.Literal) and not node.is_string:
        value = sign * float(node.name)
        if value != value or value in (float("inf"), float("-inf")):
            raise SQLFrontendError(f"{_where(call)}: {what} must be a finite number, got {_where(node)}")
        return value
    raise SQLFrontendError(f"{_where(call)}: {what} must be a number, got {_where(node)}")


def _int(node: exp.Expression, call: exp.Expression, what: str) -> int:
    value = _number(node, call, what)
    if value != int(value):
        raise SQLFrontendError(f"{_where(call)}: {what} must be an integer, got {_where(node)}")
    return int(value)


def _ints(node: exp.Expression, call: exp.Expression, what: str) -> list[int]:
    if not isinstance(node, exp.Array):
        raise SQLFrontendError(f"{_where(call)}: {what} must be a list such as [3, 4], got {_where(node)}")
    return [_int(v, call, what) for v in node.expressions]


# -- tensor_cells ----------------------------------------------------------------------------
_LISTS = {"int64": "tensor_to_bigint_list", "uint64": "tensor_to_ubigint_list"}


def cells_query(
    blocks: exp.Query, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str, skip_zeros: bool
) -> exp.Query:
    """Rows ``(i0, ..., i{r-1}, value)`` of a tensor from the query of its blocks (``k0..``, ``tensor``):
    each block's elements unnested in C order, each flat position turned back into the tensor's indices
    (edge blocks are smaller: their extents come from the key)."""
    if DTYPES[dtype].kind == "c":
        raise SQLFrontendError(f"tensor_cells: a {dtype} tensor has complex cells; SQL values are real")
    r = len(shape)
    keys = [f"k{d}" for d in range(r)]
    to_list = _LISTS.get(dtype, "tensor_to_list")

    def c(name: str, table: str | None = None) -> exp.Column:
        return exp.column(name, table=table, quoted=True)

    def num(n: int) -> exp.Literal:
        return exp.Literal.number(n)

    # per block (not per cell): the offset of its first element per dimension, and the strides of its
    # extents (edge blocks are smaller: DuckDB's own least(), not sqlglot's NULL-safe CASE, per block)
    extents = [
        exp.Anonymous(
            this="least",
            expressions=[num(b), exp.Sub(this=num(n), expression=exp.Mul(this=c(k), expression=num(b)))],
        )
        for k, n, b in zip(keys, shape, block_shape, strict=True)
    ]
    per_block: list[exp.Expression] = []
    for d in range(r):
        per_block.append(exp.alias_(exp.Mul(this=c(keys[d]), expression=num(block_shape[d])), f"o{d}"))
        per_block.append(exp.alias_(extents[d].copy(), f"e{d}"))
        stride: exp.Expression = num(1)
        for e in extents[d + 1 :]:
            stride = exp.Mul(this=stride, expression=e.copy())
        per_block.append(exp.alias_(stride, f"s{d}"))
    lists = exp.select(
        *per_block,
        exp.alias_(exp.Anonymous(this=to_list, expressions=[c("tensor"), exp.Literal.string(dtype)]), "l"),
    ).from_(exp.Subquery(this=blocks, alias=exp.TableAlias(this=exp.to_identifier("_ts_blocks"))))
    flat = exp.Sub(
        this=exp.Anonymous(this="generate_subscripts", expressions=[c("l"), num(1)]), expression=num(1)
    )
    block_cols = [c(f"{p}{d}") for d in range(r) for p in "oes"]
    cells = exp.select(
        *block_cols,
        exp.alias_(exp.Explode(this=c("l")), "value"),
        exp.alias_(flat, "f"),
    ).from_(exp.Subquery(this=lists, alias=exp.TableAlias(this=exp.to_identifier("_ts_lists"))))
    out: list[exp.Expression] = []
    for d in range(r):
        local: exp.Expression = exp.Paren(this=exp.IntDiv(this=c("f"), expression=c(f"s{d}")))
        if d:  # the first dimension's quotient is below its extent already
            local = exp.Mod(this=local, expression=c(f"e{d}"))
        index = exp.Add(this=c(f"o{d}"), expression=local)
        out.append(exp.alias_(exp.Cast(this=index, to=exp.DataType.build("BIGINT")), f"i{d}"))
    q = exp.select(*out, c("value")).from_(
        exp.Subquery(this=cells, alias=exp.TableAlias(this=exp.to_identifier("_ts_cells")))
    )
    if skip_zeros:
        q = q.where(exp.NEQ(this=c("value"), expression=num(0)))
    return q


def cells_from_array(values: np.ndarray, skip_zeros: bool) -> pa.Table:
    """``cells_query``'s rows from an array in memory (a session without SQL on its blocks: a cluster)."""
    if values.dtype.kind == "c":
        raise SQLFrontendError(f"to_rows: a {values.dtype} tensor has complex cells; SQL values are real")
    if values.ndim == 0:
        flat = values.reshape(1)[: 0 if skip_zeros and values == 0 else 1]
        index: tuple = ()
    else:
        index = np.nonzero(values) if skip_zeros else tuple(np.indices(values.shape).reshape(values.ndim, -1))
        flat = values[index] if skip_zeros else values.reshape(-1)
    if values.dtype.name not in _LISTS:  # as SQL gives them: DOUBLE, or BIGINT / UBIGINT for 64-bit ints
        flat = flat.astype(np.float64)
    cols = {f"i{d}": pa.array(np.asarray(ix, dtype=np.int64)) for d, ix in enumerate(index)}
    return pa.table({**cols, "value": pa.array(flat)})


__all__ = ["FUNCTIONS", "Rewritten", "cells_from_array", "cells_query", "parse", "rewrite"]
