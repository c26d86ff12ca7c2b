"""Session: one embedded DuckDB connection with the kernel extension loaded, and the tensor catalog."""

from __future__ import annotations

import itertools
import math
import operator
import os
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass, field

import duckdb
import numpy as np
import pyarrow as pa
import sqlglot
from sqlglot import exp

import udf_kernels
from tensorsql import allocator, catalog, frontend, ingest, lower, planning, sqlgen
from tensorsql import blocks as B
from tensorsql import expr as E
from tensorsql import tra as T
from tensorsql.dtypes import DTYPES, dtype_name
from tensorsql.errors import (
    CatalogError,
    ConfigError,
    EinsumError,
    ExtensionError,
    KernelError,
    PlanError,
    ShapeError,
    SQLExecutionError,
    TensorSQLError,
)
from tensorsql.relation import TensorRelation
from tensorsql.sqlgen import ident, lit
from tensorsql.subscripts import label_name, parse, split_args
from udf_kernels import sink as udf_sink

_ids = itertools.count()
#: results up to this many bytes are fetched as rows rather than through an Arrow export (Session.run)
SMALL_RESULT_BYTES = 1 << 18


@dataclass(frozen=True)
class Plan:
    """Everything between an expression and its SQL: partitioning, TRA plan, sqlglot AST."""

    root: E.Node
    partitioning: lower.Partitioning
    tra: T.Rel
    ast: exp.Select
    info: planning.PlanInfo
    _text: dict[object, str] = field(default_factory=dict, repr=False, compare=False)
    #: runs of the sink statement, and the name it is prepared under from its second run (Session)
    _sink: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    def sql(self, pretty: bool = True) -> str:
        """The SQL text, generated once per form (sqlglot generation is not free on big graphs)."""
        if pretty not in self._text:
            self._text[pretty] = sqlgen.sql_text(self.ast, pretty=pretty)
        return self._text[pretty]

    def sink_sql(self) -> str:
        """The statement that writes the result into a result sink (``sqlgen.to_sink_ast``), generated once:
        it takes the sink's key as its parameter. Several milliseconds for a multi-step plan."""
        if "sink" not in self._text:
            self._text["sink"] = sqlgen.sql_text(sqlgen.to_sink_ast(self.tra))
        return self._text["sink"]

    def explain(self) -> str:
        lines = ["== Plan ==", *planning.describe(self.info), "", "== EinGraph =="]
        names: dict[int, str] = {}
        for node in E.topological(self.root):
            names[id(node)] = f"v{len(names)}"
            bs = self.partitioning.block_shapes[id(node)]
            head = f"{names[id(node)]} = "
            if isinstance(node, E.Source):
                desc = f"Source {node.table}"
            elif isinstance(node, E.EinSum):
                spec = ",".join(frontend.describe_labels(t) for t in node.in_labels)
                spec += "->" + frontend.describe_labels(node.out_labels)
                args = ", ".join(names[id(c)] for c in node.inputs)
                blocks = self.partitioning.label_blocks[id(node)]
                part = " ".join(f"{label_name(k)}:{v}" for k, v in blocks.items())
                desc = f"EinSum '{spec}' join={node.join} agg={node.agg} ({args}) label blocks [{part}]"
            elif isinstance(node, E.Map):
                param = "" if node.param is None else f"({node.param})"
                desc = f"Map {node.fn}{param} ({names[id(node.input)]})"
            elif isinstance(node, E.Cast):
                desc = f"Cast ({names[id(node.input)]})"
            elif isinstance(node, E.Reblock):
                desc = f"Reblock ({names[id(node.input)]})"
            else:
                raise TypeError(f"unhandled expression node {type(node).__name__}")
            line = f"{head}{desc} shape={node.shape} {node.dtype} blocks={bs}"
            parts = self.info.node_parts.get(id(node))
            if parts:
                line += " parts[" + " ".join(f"{k}:{v}" for k, v in parts.items()) + "]"
            cost = self.info.node_costs.get(id(node))
            if cost:
                line += (
                    " cost["
                    + " ".join(
                        f"{k}={cost[k]:.3g}"
                        for k in ("join", "agg", "repart", "assemble", "total")
                        if k in cost
                    )
                    + "]"
                )
            lines.append(line)
        lines += ["", "== TRA plan ==", T.render(self.tra), "", "== SQL ==", self.sql(pretty=True)]
        return "\n".join(lines)


def _wrap_duckdb(exc: duckdb.Error, what: str) -> TensorSQLError:
    msg = str(exc)
    if "tensor_" in msg and not isinstance(exc, duckdb.CatalogException | duckdb.ParserException):
        return KernelError(f"{what}: a block kernel rejected its input: {msg}")
    return SQLExecutionError(f"{what}: {msg}")


class Session:
    """An embedded DuckDB (``:memory:`` or a file) with the kernels loaded."""

    def __init__(
        self, database: str = ":memory:", threads: int | None = None, strategy: str = "eindecomp"
    ) -> None:
        if allocator.enabled_by_env():
            allocator.tune()
        config = {"allow_unsigned_extensions": "true"}
        if threads is not None:
            if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
                raise ConfigError(f"threads={threads!r} must be a positive int")
            config["threads"] = str(threads)
        try:
            self.con = duckdb.connect(str(database), config=config)
        except duckdb.Error as exc:
            raise CatalogError(f"cannot open {database!r} as a DuckDB database: {exc}") from exc
        try:
            self._kernels = udf_kernels.load(self.con)
        except (udf_kernels.KernelBuildError, udf_kernels.KernelLoadError, duckdb.Error, OSError) as exc:
            raise ExtensionError(f"cannot load the tensorsql kernel extension: {exc}") from exc
        if strategy not in planning.STRATEGIES:
            raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(planning.STRATEGIES)}")
        self.database = str(database)
        self.threads = threads
        self.strategy = strategy
        self._lock = threading.RLock()
        #: write results straight into the returned array (``udf_kernels.sink``); None: not checked yet
        self.result_sink: bool | None = None if _env_on("TENSORSQL_RESULT_SINK") else False
        #: kernel calls the planner aims for: the session's threads (workers x threads when distributed)
        self.p = threads or int(self.execute("SELECT current_setting('threads')")[0][0])

    # -- helpers ---------------------------------------------------------------------------------
    def _name(self, prefix: str = "_ts_tmp") -> str:
        return f"{prefix}_{next(_ids)}"

    def execute(self, query: exp.Expression | str, what: str = "query") -> list[tuple]:
        """Run a statement and fetch all its rows (DuckDB 2 blocks a connection with an open result)."""
        return self._execute(query, what)[0]

    def _execute(self, query: exp.Expression | str, what: str) -> tuple[list[tuple], list[tuple]]:
        text = query if isinstance(query, str) else sqlgen.sql_text(query)
        with self._lock:
            try:
                cur = self.con.execute(text)
                return cur.fetchall(), list(cur.description or [])
            except duckdb.Error as exc:
                raise _wrap_duckdb(exc, what) from exc

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- planning and execution ---------------------------------------------------------------------
    def plan(
        self,
        node: E.Node,
        *,
        strategy: str | None = None,
        blocks: dict[int, int] | None = None,
        free_inputs: set[int] | None = None,
    ) -> Plan:
        """Partition (EinDecomp unless told otherwise), lower to TRA, and build the SQL AST."""
        if blocks:
            part = planning.override_blocks(node, blocks)
            info = planning.PlanInfo("blocks", 0, notes=[f"explicit blocks={blocks}"])
        else:
            part, info = planning.plan_blocks(
                node, strategy=strategy or self.strategy, threads=self.p, free_inputs=free_inputs
            )
        rel = lower.lower(node, part)
        return Plan(node, part, rel, sqlgen.to_ast(rel), info)

    def gemm_order(self, plan: Plan) -> tuple[Plan, tuple[int, ...]] | None:
        """The plan's root contraction with its output in the GEMM's own label order, and the axes
        permutation back to the requested order; None when that is the requested order already.

        For a multiply/sum einsum whose output labels interleave the operands' (``bdgf,aceg->abcdef``),
        the kernel otherwise forms each product in [batch, M, N] order and scatters it into place: one
        more pass over a result that is often bigger than both inputs. In [batch, M, N] order (or
        [batch, N, M], the GEMM with its operands swapped) the GEMM writes the block in place, and the
        caller returns a transposed view, as numpy and opt_einsum do. The orientation whose blocks are row
        slabs is preferred; when neither orientation's blocks are row slabs but the requested order's are,
        the requested order stays (a block that is not a row slab is copied into place once more, in a
        result sink as in an Arrow assembly: measured slower than the scatter). The blocking is the plan's,
        per label, so the inputs are read exactly as before.
        """
        node = plan.root
        if not (isinstance(node, E.EinSum) and len(node.inputs) == 2):
            return None
        if node.join != "multiply" or node.agg != "sum":
            return None
        xl, yl = node.in_labels
        zl = node.out_labels
        xs, ys, zs = set(xl), set(yl), set(zl)
        batch = [lab for lab in dict.fromkeys(xl) if lab in ys and lab in zs]
        m = [lab for lab in dict.fromkeys(xl) if lab in zs and lab not in ys]
        n = [lab for lab in dict.fromkeys(yl) if lab in zs and lab not in xs]
        if sorted(batch + m + n) != sorted(zl):
            return None
        size = dict(zip(zl, node.shape, strict=True))
        lb = plan.partitioning.label_blocks[id(node)]

        def slabs(order: tuple[int, ...]) -> bool:  # blocks are row slabs: only the first axis is split
            return all(lb[lab] >= size[lab] for lab in order[1:])

        orders = [tuple(batch + m + n), tuple(batch + n + m)]
        if tuple(zl) in orders:
            return None
        natural = next((o for o in orders if slabs(o)), orders[0])
        if slabs(tuple(zl)) and not slabs(natural):
            return None
        node2 = E.EinSum(
            shape=tuple(size[lab] for lab in natural),
            dtype=node.dtype,
            inputs=node.inputs,
            in_labels=node.in_labels,
            out_labels=natural,
            join=node.join,
            agg=node.agg,
        )
        old = plan.partitioning
        part = lower.Partitioning(
            label_blocks={**old.label_blocks, id(node2): dict(lb)},
            block_shapes={**old.block_shapes, id(node2): tuple(lb[lab] for lab in natural)},
        )
        rel = lower.lower(node2, part)
        perm = tuple(natural.index(lab) for lab in zl)
        return Plan(node2, part, rel, sqlgen.to_ast(rel), plan.info), perm

    def run(self, plan: Plan) -> pa.Table:
        """Execute a plan's SQL; the result is an Arrow table of (k0.., tensor) rows.

        A small result (up to SMALL_RESULT_BYTES) is fetched as rows: DuckDB's relation API binds a query
        once more before its Arrow export (~1 ms of a few-ms query), which only pays off for big blobs.
        """
        text = plan.sql(pretty=False)
        small = math.prod(plan.root.shape) * DTYPES[plan.root.dtype].itemsize <= SMALL_RESULT_BYTES
        with self._lock:
            try:
                if not small:
                    return self.con.sql(text).to_arrow_table()
                cur = self.con.execute(text)
                rows = cur.fetchall()
                names = [d[0] for d in cur.description or []]
            except duckdb.Error as exc:
                raise _wrap_duckdb(exc, "einsum") from exc
        cols = {
            name: pa.array([r[j] for r in rows], pa.binary() if name == "tensor" else pa.int32())
            for j, name in enumerate(names)
        }
        return pa.table(cols)

    def run_into(self, plan: Plan) -> np.ndarray | None:
        """The plan's result as a new C-contiguous array, each block written into it by the kernels (a
        result sink, ``udf_kernels.sink``): no DuckDB blob, Arrow buffer or assembly copy on the way.

        None when sinks are off or unavailable, or when the result has absent blocks (a sparse stored
        input): the caller then goes through ``run`` and ``blocks.assemble``, which fills those with zeros.
        """
        root = plan.root
        schema = plan.tra.schema
        if self.result_sink is False or len(set(schema.blob)) != len(schema.blob):
            return None
        dt = DTYPES[root.dtype]
        out = np.empty(root.shape, dtype=dt)
        if out.size == 0:
            return None
        with self._lock:
            if self.result_sink is None:
                self.result_sink = udf_sink.available(self._kernels, self.con)
                if not self.result_sink:
                    return None
            try:
                sink = udf_sink.Sink(self._kernels, out)
                key = sink.open()
            except ValueError:  # the kernels refused the array: go through Arrow
                return None
            try:
                _blocks, elements = self._run_sink(plan, key)
            except duckdb.Error as exc:
                raise _wrap_duckdb(exc, "einsum") from exc
            finally:
                sink.close()
        if elements != out.size:  # absent blocks (or a malformed stored relation): not every element written
            return None
        return out

    def _run_sink(self, plan: Plan, key: int) -> tuple[int, int]:
        """Runs the plan's sink statement. From its second run on, the statement is prepared once and then
        executed: binding and planning a statement of several CTEs costs DuckDB a few milliseconds, as
        much as the kernels of a small einsum tree. A prepared statement that no longer binds (a table it
        reads was replaced) is dropped and the statement run as text."""
        state = plan._sink
        name = state.get("name")
        if name is None:
            state["runs"] = runs = int(state.get("runs", 0)) + 1  # type: ignore[call-overload]
            if runs < 2 or state.get("unpreparable"):
                return self.con.execute(plan.sink_sql(), [key]).fetchall()[0]
            name = self._name("_ts_stmt")
            try:
                self.con.execute("PREPARE " + ident(name).sql(dialect="duckdb") + " AS " + plan.sink_sql())
            except duckdb.Error:
                state["unpreparable"] = True
                return self.con.execute(plan.sink_sql(), [key]).fetchall()[0]
            state["name"] = name
            weakref.finalize(plan, _deallocate, weakref.ref(self), name)
        call = exp.Anonymous(this=ident(str(name)), expressions=[exp.Literal.number(key)])
        try:
            return self.con.execute("EXECUTE " + sqlgen.sql_text(call)).fetchall()[0]
        except duckdb.Error:
            state.pop("name", None)
            _deallocate(weakref.ref(self), str(name))
            return self.con.execute(plan.sink_sql(), [key]).fetchall()[0]

    # -- making relations -----------------------------------------------------------------------------
    def _source(
        self, table: str, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str
    ) -> E.Source:
        return E.Source(shape=shape, dtype=dtype, table=table, block_shape=block_shape)

    def from_numpy(
        self,
        array: object,
        block_shape: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
        *,
        dtype: object | None = None,
        copy: bool = True,
    ) -> TensorRelation:
        """Split an array into blocks and register them with DuckDB (Arrow, no extra table copy).

        ``copy=False`` lets the relation view the array's memory where the blocking allows (row slabs of a
        C-contiguous array); the array must then not change while the relation is in use.
        """
        arr = as_array(array, "from_numpy")
        name = dtype_name(arr.dtype if dtype is None else dtype)
        bs = B.resolve_block_shape(arr.shape, block_shape, blocks, "from_numpy")
        table = B.split(arr, bs, name, copy=copy)
        view = self._name()
        with self._lock:
            self.con.register(view, table)
        node = self._source(view, arr.shape, bs, name)
        weakref.finalize(node, _unregister, weakref.ref(self), view)
        return TensorRelation(self, node)

    def from_arrow(self, table: pa.Table) -> TensorRelation:
        """A blocked Arrow table carrying tensorsql schema metadata (what ``to_arrow`` returns)."""
        import json

        meta = table.schema.metadata or {}
        try:
            dtype = meta[b"tensorsql.dtype"].decode()
            shape = tuple(json.loads(meta[b"tensorsql.shape"]))
            bs = tuple(json.loads(meta[b"tensorsql.block_shape"]))
        except (KeyError, ValueError) as exc:
            raise CatalogError("Arrow table has no tensorsql metadata (dtype, shape, block_shape)") from exc
        view = self._name()
        with self._lock:
            self.con.register(view, table)
        node = self._source(view, shape, bs, dtype_name(dtype))
        weakref.finalize(node, _unregister, weakref.ref(self), view)
        return TensorRelation(self, node)

    def table(self, name: str) -> TensorRelation:
        """A stored tensor relation from the catalog."""
        with self._lock:
            entry = catalog.get(self.con, name)
        return TensorRelation(self, self._source(name, entry.shape, entry.block_shape, entry.dtype))

    def tables(self) -> list[str]:
        with self._lock:
            return catalog.names(self.con)

    def save(self, rel: TensorRelation, name: str, *, replace: bool = False) -> TensorRelation:
        if not isinstance(name, str) or not name:
            raise CatalogError(f"table name must be a non-empty string, got {name!r}")
        if name == catalog.CATALOG or name.startswith("_ts_"):
            raise CatalogError(f"table name {name!r} is reserved by tensorsql")
        exists = (
            exp.select(exp.Count(this=exp.Star()))
            .from_("information_schema.tables")
            .where(exp.EQ(this=exp.column("table_name"), expression=lit(name)))
        )
        if not replace and self.execute(exists)[0][0]:
            raise CatalogError(f"a table named {name!r} already exists (replace=True overwrites it)")
        plan = rel.plan()
        bs = plan.partitioning.block_shapes[id(rel.node)]
        create = exp.Create(
            this=exp.Table(this=ident(name)),
            kind="TABLE",
            expression=plan.ast,
            replace=replace,
        )
        with self._lock:
            self.execute(exp.Transaction(), "begin")
            try:
                self.execute(create, f"save {name!r}")
                catalog.put(self.con, catalog.Entry(name, rel.node.dtype, rel.shape, bs))
                self.execute(exp.Commit(), "commit")
            except BaseException:
                self.con.execute("ROLLBACK").fetchall()
                raise
        return self.table(name)

    def materialize(self, rel: TensorRelation) -> TensorRelation:
        if isinstance(rel.node, E.Source):
            return rel
        plan = rel.plan()
        bs = plan.partitioning.block_shapes[id(rel.node)]
        name = self._name()
        create = exp.Create(
            this=exp.Table(this=ident(name)),
            kind="TABLE",
            expression=plan.ast,
            properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
        )
        self.execute(create, "materialize")
        node = self._source(name, rel.shape, bs, rel.node.dtype)
        weakref.finalize(node, _drop_temp, weakref.ref(self), name)
        return TensorRelation(self, node)

    def from_sql(
        self,
        query: str,
        shape: Sequence[int],
        block_shape: Sequence[int] | None = None,
        blocks: Sequence[int] | None = None,
        *,
        dtype: object = "float64",
    ) -> TensorRelation:
        """Rows (i0, ..., i{r-1}, value) of any query -> a blocked relation, built inside DuckDB.

        Duplicate coordinates are summed (COO semantics); coordinates that are not given are zero.
        """
        try:
            shape = tuple(operator.index(n) for n in shape)
        except TypeError as exc:
            raise ShapeError(f"from_sql: shape={shape!r} is not a sequence of ints") from exc
        if any(n < 0 for n in shape):
            raise ShapeError(f"from_sql: shape {shape} has a negative dimension")
        name = dtype_name(dtype)
        bs = B.resolve_block_shape(shape, block_shape, blocks, "from_sql")
        try:
            parsed = sqlglot.parse_one(query, read="duckdb")
        except sqlglot.errors.ParseError as exc:
            raise SQLExecutionError(f"from_sql: cannot parse the query: {exc}") from exc
        if not isinstance(parsed, exp.Query):
            raise SQLExecutionError("from_sql: the query must be a SELECT (or another row-returning query)")
        r = len(shape)
        _, described = self._execute(exp.select(exp.Star()).from_(parsed.subquery("q")).limit(0), "from_sql")
        if len(described) != r + 1:
            cols = ", ".join([*(f"i{d}" for d in range(r)), "value"])
            raise ShapeError(
                f"from_sql: the query returns {len(described)} column(s) but a {r}-d tensor needs "
                f"{r + 1} ({cols})"
            )
        check = ingest.out_of_range(parsed, shape)
        if check is not None:
            rows = self.execute(check, "from_sql")
            if rows:
                raise ShapeError(f"from_sql: row with coordinates {rows[0]} lies outside shape {shape}")
        dense = ingest.blocks_from_rows(parsed, shape, bs, name)
        view = self._name()
        create = exp.Create(
            this=exp.Table(this=ident(view)),
            kind="TABLE",
            expression=dense,
            properties=exp.Properties(expressions=[exp.TemporaryProperty()]),
        )
        self.execute(create, "from_sql")
        node = self._source(view, shape, bs, name)
        weakref.finalize(node, _drop_temp, weakref.ref(self), view)
        return TensorRelation(self, node)

    # -- einsum --------------------------------------------------------------------------------------
    def as_relation(self, operand: object) -> TensorRelation:
        if isinstance(operand, TensorRelation):
            if operand.session is not self:
                raise ShapeError("operand belongs to another session; save it and open it with table()")
            return operand
        return self.from_numpy(operand)

    def einsum(
        self,
        *args: object,
        optimize: object = "auto",
        dtype: object | None = None,
        join: str | None = None,
        agg: str | None = None,
        strategy: str | None = None,
        blocks: dict[object, int] | None = None,
        copy: bool = True,
    ) -> TensorRelation:
        """A lazy relation for ``numpy.einsum(*args)``, extended with ``join``/``agg`` (DESIGN.md).

        Blocking: EinDecomp by default; ``strategy=`` picks another (sqrt, data, model, none, operands)
        and ``blocks={label: parts}`` fixes the parts of the named labels in every step. numpy operands
        are uploaded in the blocking the plan wants (they are free to split; stored relations are not);
        ``copy=False`` borrows their memory where it can (see ``from_numpy``).
        """
        if strategy is not None and strategy not in planning.STRATEGIES:
            raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(planning.STRATEGIES)}")
        inputs, output, operands = split_args(args)
        for op in operands:
            if isinstance(op, TensorRelation) and op.session is not self:
                raise ShapeError("operand belongs to another session; save it and open it with table()")
        arrays = {
            i: as_array(op, f"operand {i}")
            for i, op in enumerate(operands)
            if not isinstance(op, TensorRelation)
        }
        shapes_in = [arrays[i].shape if i in arrays else op.shape for i, op in enumerate(operands)]
        sub = parse(inputs, output, shapes_in)
        parts = _label_parts(blocks, sub.sizes) if blocks is not None else None
        kw = {"optimize": optimize, "join": join or "multiply", "agg": agg or "sum", "dtype": dtype}

        blocking = {i: tuple(max(1, n) for n in a.shape) for i, a in arrays.items()}
        if arrays and parts is None and sum(a.size for a in arrays.values()) >= planning.SMALL_ELEMENTS:
            holders = {
                i: E.Source(
                    shape=a.shape,
                    dtype=dtype_name(a.dtype),
                    table=f"_ts_pending_{i}",
                    block_shape=blocking[i],
                )
                for i, a in arrays.items()
            }
            nodes = [
                op.node if isinstance(op, TensorRelation) else holders[i] for i, op in enumerate(operands)
            ]
            _, info = planning.plan_blocks(
                frontend.build(sub, nodes, **kw),
                strategy=strategy or self.strategy,
                threads=self.p,
                free_inputs={id(h) for h in holders.values()},
            )
            blocking.update({i: info.input_blocks.get(id(h), blocking[i]) for i, h in holders.items()})
        rels = [
            self.from_numpy(arrays[i], block_shape=blocking[i], copy=copy) if i in arrays else op
            for i, op in enumerate(operands)
        ]
        node = frontend.build(sub, [r.node for r in rels], **kw)
        free = {id(rels[i].node) for i in arrays}
        options = {"strategy": strategy, "blocks": parts, "free_inputs": free}
        return TensorRelation(self, node, plan_options=options)

    def map(self, rel: object, fn: str, param: float | None = None) -> TensorRelation:
        """An element-wise function of every element (exp, log, sqrt, relu, neg, abs, pow, scale, ...)."""
        r = self.as_relation(rel)
        node = frontend.map_node(r.node, fn, param)
        return TensorRelation(self, node)


def _env_on(name: str) -> bool:
    return os.environ.get(name, "1").strip().lower() not in ("0", "false", "no", "off")


def as_array(value: object, what: str) -> np.ndarray:
    """np.asarray with numpy's complaints about ragged or odd input turned into tensorsql errors."""
    try:
        return np.asarray(value)
    except (ValueError, TypeError) as exc:
        raise ShapeError(f"{what}: cannot make an array of {type(value).__name__}: {exc}") from exc


def _label_parts(blocks: dict[object, int], sizes: dict[int, int]) -> dict[int, int]:
    """``blocks={'i': 4, 'k': 2}`` (letters, or ints in the sublist form) -> parts per int label."""
    from tensorsql.subscripts import letter_label

    if not isinstance(blocks, dict):
        raise ShapeError(f"blocks must be a dict label -> parts, got {blocks!r}")
    out: dict[int, int] = {}
    for key, parts in blocks.items():
        label = letter_label(key) if isinstance(key, str) and len(key) == 1 else key
        if not isinstance(label, int) or label not in sizes:
            raise EinsumError(f"blocks names label {key!r}, which is not in the einsum")
        if not isinstance(parts, int) or parts < 1 or parts > max(1, sizes[label]):
            raise ShapeError(f"blocks[{key!r}]={parts!r} must be an int in 1..{max(1, sizes[label])}")
        out[label] = parts
    return out


def _unregister(session_ref: weakref.ref, view: str) -> None:
    s = session_ref()
    if s is None:
        return
    try:
        with s._lock:
            s.con.unregister(view)
    except (duckdb.Error, AttributeError):
        pass


def _quietly(session_ref: weakref.ref, statement: str) -> None:
    """Runs a clean-up statement from a finalizer, if the session is still open; failures are ignored."""
    s = session_ref()
    if s is None:
        return
    try:
        with s._lock:
            s.con.execute(statement)
    except duckdb.Error:
        pass


def _deallocate(session_ref: weakref.ref, name: str) -> None:
    _quietly(session_ref, "DEALLOCATE " + ident(name).sql(dialect="duckdb"))


def _drop_temp(session_ref: weakref.ref, name: str) -> None:
    _quietly(
        session_ref, sqlgen.sql_text(exp.Drop(this=exp.Table(this=ident(name)), kind="TABLE", exists=True))
    )


__all__ = ["Plan", "Session", "as_array"]
