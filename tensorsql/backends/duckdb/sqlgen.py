"""TRA plan -> sqlglot AST (DuckDB dialect). SQL text is produced only by :func:`sql_text`.

Physical choices (join methods, pins, padding) are already fields of the TRA nodes (``compile.rewrite``);
this module only spells them. CTE names come from a name generator (``Names``), so the statement can be
spliced into a user's own; array operands (``T.Input``) are rendered by the executor's ``bind`` callback.

Each TRA node becomes a CTE, except that an Aggregate absorbs the row-wise node below it, so a
contraction is one ``SELECT keys, tensor_einsum_agg(spec, join, agg, dtype, x.tensor, ..., y.tensor, ...)
... GROUP BY`` (the fused form of ``tensor_<agg>(tensor_einsum(...))``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from sqlglot import exp

from tensorsql.errors import PlanError
from tensorsql.ir import tra as T
from tensorsql.ir.ops import AGG_FUNCS

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def ident(name: str) -> exp.Identifier:
    return exp.to_identifier(name, quoted=True)


def col(alias: str, name: str) -> exp.Column:
    return exp.Column(this=ident(name), table=ident(alias))


def lit(value: int | float | str) -> exp.Expression:
    if isinstance(value, str):
        return exp.Literal.string(value)
    if isinstance(value, float) and not math.isfinite(value):  # 'nan', 'inf', '-inf': DuckDB's spelling
        return exp.Cast(this=exp.Literal.string(str(value)), to=exp.DataType.build("DOUBLE"))
    if isinstance(value, int) and value < 0:
        return exp.Neg(this=exp.Literal.number(-value))
    return exp.Literal.number(value)


def call(name: str, *args: exp.Expression) -> exp.Expression:
    return exp.Anonymous(this=name, expressions=list(args))


def array(items: list[exp.Expression]) -> exp.Expression:
    # an empty list literal has no element type in DuckDB; cast it so kernels see BIGINT[]
    if not items:
        return exp.Cast(this=exp.Array(expressions=[]), to=exp.DataType.build("BIGINT[]"))
    return exp.Array(expressions=items)


def table(name: str, alias: str) -> exp.Table:
    return exp.Table(this=ident(name), alias=exp.TableAlias(this=ident(alias)))


def extent(schema: T.Schema, label: str, key: exp.Expression) -> exp.Expression:
    """This row's block length along ``label``: ``least(block, size - block * key)`` if ragged."""
    b, n = schema.blocks[label], schema.sizes[label]
    if n <= b or n % b == 0:
        return lit(min(b, n))
    return call("least", lit(b), exp.Sub(this=lit(n), expression=exp.Mul(this=lit(b), expression=key)))


def block_shape(schema: T.Schema, cols: dict[str, exp.Expression]) -> exp.Expression:
    """This row's block shape as a list, from the key columns ``cols`` (label -> column)."""
    return array([extent(schema, lab, cols[lab].copy()) for lab in schema.blob])


def spec(*terms: tuple[str, ...]) -> str:
    """A kernel spec 'ab,bc->ac' with one letter per label, in order of first appearance."""
    letters: dict[str, str] = {}
    for term in terms:
        for lab in term:
            if lab not in letters:
                if len(letters) == len(_LETTERS):
                    raise PlanError("one block kernel call would need more than 52 distinct labels")
                letters[lab] = _LETTERS[len(letters)]
    parts = ["".join(letters[lab] for lab in t) for t in terms]
    return ",".join(parts[:-1]) + "->" + parts[-1]


@dataclass
class Src:
    """An input of a row-wise SELECT: the aliased table, its key column per label, filters on it.

    A Relabel input is read straight from its child (renaming in place, a filter per repeated label) so
    relabelling costs no CTE of its own.
    """

    table: exp.Table | exp.Subquery | None
    cols: dict[str, exp.Expression]
    where: list[exp.Expression]
    alias: str
    #: the block-shape argument of a kernel call on this side, when the side computes it (see ``_pin``)
    shape: exp.Expression | None = None
    #: the block itself, for an inlined one-block operand (``Scalar``: no table, keys all 0)
    value: exp.Expression | None = None

    def tensor(self) -> exp.Expression:
        return self.value.copy() if self.value is not None else col(self.alias, "tensor")


@dataclass(frozen=True)
class Scalar:
    """A one-block operand the executor inlines as an expression (e.g. ``tensor_source(<slot>)``): its keys
    are all 0 and it joins every row of the other side by itself, so it needs no CTE, no FROM and no join."""

    tensor: exp.Expression


def _zero() -> exp.Expression:
    return exp.Cast(this=lit(0), to=exp.DataType.build("INTEGER"))


def _from(*srcs: Src) -> exp.Select:
    """SELECT over the sides that are tables, side by side (POSITIONAL JOIN); inlined sides need no FROM."""
    q = exp.select()
    tables = [src.table for src in srcs if src.table is not None]
    if tables:
        q = q.from_(tables[0])
        for t in tables[1:]:
            q = q.join(exp.Join(this=t, method="POSITIONAL"), copy=False)
    for src in srcs:
        for cond in src.where:
            q = q.where(cond, copy=False)
    return q


@dataclass
class Row:
    """A row-wise SELECT under construction: FROM/JOIN clause, key expressions, tensor expression."""

    source: exp.Select
    keys: dict[str, exp.Expression]
    tensor: exp.Expression


class Names:
    """Fresh CTE names: ``prefix`` + a counter, skipping names the caller reserves (the tables of a user's
    statement the generated SQL is spliced into)."""

    def __init__(self, prefix: str = "t", reserved: set[str] | None = None) -> None:
        self.prefix = prefix
        self.reserved = {r.lower() for r in reserved or ()}
        self._counter = itertools.count()

    def fresh(self) -> str:
        while True:
            name = f"{self.prefix}{next(self._counter)}"
            if name.lower() not in self.reserved:
                return name


#: how an executor renders array operand ``T.Input``: a table or view name, a query that becomes a CTE, or
#: (one-block operands) a ``Scalar`` expression inlined where it is read
Bind = Callable[[T.Input], "str | exp.Select | Scalar"]


def _unbound(rel: T.Input) -> str:
    raise PlanError(f"operand {rel.name!r} (#{rel.index}) has no binding in this statement")


class _Builder:
    def __init__(self, names: Names | None = None, bind: Bind | None = None) -> None:
        self.ctes: list[tuple[str, exp.Select]] = []
        self.refs: dict[T.Rel, str] = {}
        self.names = names or Names()
        self.bind = bind or _unbound

    def ref(self, rel: T.Rel) -> str:
        if isinstance(rel, T.Scan):
            return rel.table
        if rel not in self.refs:
            if isinstance(rel, T.Input):
                bound = self.bind(rel)
                if isinstance(bound, str):
                    self.refs[rel] = bound
                    return bound
                if isinstance(bound, Scalar):  # read as a whole relation: one row, keys 0
                    keys = [exp.alias_(_zero(), ident(k)) for k in rel.schema.keys]
                    bound = exp.select(*keys, exp.alias_(bound.tensor, ident("tensor")))
                query = bound
            else:
                query = self.select(rel)
            self.refs[rel] = self.names.fresh()
            self.ctes.append((self.refs[rel], query))
        return self.refs[rel]

    def scalar(self, rel: T.Rel) -> Scalar | None:
        """The inlined block of a one-block array operand (or its relabelling), if the executor inlines it."""
        leaf = rel.child if isinstance(rel, T.Relabel) else rel
        if not isinstance(leaf, T.Input) or leaf in self.refs:
            return None
        bound = self.bind(leaf)
        return bound if isinstance(bound, Scalar) else None

    def src(self, rel: T.Rel, alias: str) -> Src:
        inline = self.scalar(rel)
        if inline is not None:
            labels = rel.labels if isinstance(rel, T.Relabel) else rel.schema.keys
            return Src(None, {lab: _zero() for lab in labels}, [], alias, value=inline.tensor)
        if isinstance(rel, T.Relabel):
            cols: dict[str, exp.Expression] = {}
            where: list[exp.Expression] = []
            for pos, lab in zip(rel.child.schema.keys, rel.labels, strict=True):
                if lab in cols:
                    where.append(exp.EQ(this=cols[lab].copy(), expression=col(alias, pos)))
                else:
                    cols[lab] = col(alias, pos)
            return Src(table(self.ref(rel.child), alias), cols, where, alias)
        return Src(table(self.ref(rel), alias), {k: col(alias, k) for k in rel.schema.keys}, [], alias)

    def select(self, rel: T.Rel) -> exp.Select:
        if isinstance(rel, T.Positional) and isinstance(rel.child, T.Aggregate | T.Join | T.Unary):
            # the rename back to k0..k{r-1} happens in the child's own SELECT
            rename = dict(zip(rel.child.schema.blob, rel.schema.keys, strict=True))
            if isinstance(rel.child, T.Aggregate):
                return self.aggregate(rel.child, rename)
            row = self.row(rel.child)
            return self.finish(Row(row.source, {rename[k]: row.keys[k] for k in rename}, row.tensor))
        if isinstance(rel, T.Aggregate):
            return self.aggregate(rel)
        if isinstance(rel, T.Repartition):
            return self.repartition(rel)
        return self.finish(self.row(rel))

    @staticmethod
    def finish(row: Row, group: bool = False) -> exp.Select:
        cols = [exp.alias_(e, ident(k)) for k, e in row.keys.items()]
        q = row.source.select(*cols, exp.alias_(row.tensor, ident("tensor")), copy=False)
        if group and row.keys:
            q = q.group_by(*row.keys.values(), copy=False)
        return q

    def row(self, rel: T.Rel) -> Row:
        s = rel.schema
        if isinstance(rel, T.Fused):
            return self.fused(rel)
        if isinstance(rel, T.Join):
            x, y = rel.left.schema, rel.right.schema
            sx, sy = self.src(rel.left, "x"), self.src(rel.right, "y")
            q = self.pair(rel, sx, sy)
            keys = {k: (sx.cols[k] if k in sx.cols else sy.cols[k]).copy() for k in s.keys}
            tensor = call(
                "tensor_einsum",
                lit(spec(x.blob, y.blob, s.blob)),
                lit(rel.join),
                lit(rel.agg),
                lit(s.dtype),
                sx.tensor(),
                sx.shape.copy() if sx.shape is not None else block_shape(x, sx.cols),
                sy.tensor(),
                block_shape(y, sy.cols),
            )
            return Row(q, keys, tensor)
        child: T.Rel = rel.child  # type: ignore[attr-defined]
        c = child.schema
        if isinstance(rel, T.Relabel):
            sc = self.src(rel, "c")
            return Row(_from(sc), sc.cols, sc.tensor())
        sc = self.src(child, "c")
        q = _from(sc)
        keys = {k: sc.cols[k].copy() for k in c.keys}
        if isinstance(rel, T.Unary):
            tensor = call(
                "tensor_einsum1",
                lit(spec(c.blob, s.blob)),
                lit(rel.agg),
                lit(s.dtype),
                sc.tensor(),
                block_shape(c, sc.cols),
            )
        elif isinstance(rel, T.MapBlocks):
            args = [lit(rel.fn), lit(s.dtype), sc.tensor()]
            if rel.param is not None:
                args.append(exp.Cast(this=lit(float(rel.param)), to=exp.DataType.build("DOUBLE")))
            tensor = call("tensor_map", *args)
        elif isinstance(rel, T.CastBlocks):
            tensor = call("tensor_cast", sc.tensor(), lit(c.dtype), lit(s.dtype))
        elif isinstance(rel, T.Positional):
            keys = {k: sc.cols[lab].copy() for k, lab in zip(s.keys, c.blob, strict=True)}
            tensor = sc.tensor()
        else:
            raise TypeError(f"unhandled TRA node {type(rel).__name__}")
        return Row(q, keys, tensor)

    def fused(self, rel: T.Fused) -> Row:
        """``tensor_einsum_path(program, dtype, shapes, x0.tensor, x1.tensor, ...)`` over the one-row inputs,
        side by side (POSITIONAL JOIN). Over stored tables DuckDB reads them as one positional scan, which
        copies no block; a cross product would materialize every input but one (~0.6 GB/s measured). An input
        without its block (no row, or a NULL padding row) makes the result NULL: an absent block."""
        srcs = [self.src(child, f"x{i}") for i, child in enumerate(rel.children)]
        shapes = [lit(child.schema.sizes[k]) for child in rel.children for k in child.schema.blob]
        q = _from(*srcs)
        keys = {k: exp.Cast(this=lit(0), to=exp.DataType.build("INTEGER")) for k in rel.schema.keys}
        tensor = call(
            "tensor_einsum_path",
            lit(program(rel)),
            lit(rel.schema.dtype),
            array(shapes),
            *[src.tensor() for src in srcs],
        )
        return Row(q, keys, tensor)

    def pair(self, join: T.Join, sx: Src, sy: Src) -> exp.Select:
        """The FROM clause that pairs the blocks of a join's two sides, by the join's method
        (``T.JOIN_METHODS``, chosen by ``compile.rewrite.choose_join``)."""
        left, right = join.left, join.right
        if sx.table is None or sy.table is None or join.method == "side_by_side":
            # at most one row a side: over stored tables DuckDB reads them as one positional scan that copies
            # neither block (a hash join copies its build side: ~15 ms for a 64 MiB block). An inlined
            # one-block side pairs with every row of the other by itself: its keys are 0 and so are the
            # other side's keys of every label they share (one block along it too)
            return _from(sx, sy)
        if join.method in ("repeat_left", "repeat_right"):
            small, big, big_rel = (sx, sy, right) if join.method == "repeat_left" else (sy, sx, left)
            return _positional(small, big, self.rows(big, big_rel))
        if join.method != "hash":
            raise TypeError(f"unhandled join method {join.method!r}")
        if join.pin:
            _pin(sx, left.schema)
        q = exp.select().from_(sx.table)
        shared = [k for k in left.schema.keys if k in right.schema.keys]
        if shared:
            on = exp.and_(*[exp.EQ(this=sx.cols[k].copy(), expression=sy.cols[k].copy()) for k in shared])
            q = q.join(sy.table, on=on, copy=False)
        else:
            q = q.join(sy.table, join_type="cross", copy=False)
        for cond in sx.where + sy.where:
            q = q.where(cond, copy=False)
        return q

    def rows(self, src: Src, rel: T.Rel) -> exp.Expression:
        """How many rows a join side has: counted for a stored table (which may lack blocks); for an array
        operand or a computed side, its block grid (more than its rows when an input lacks blocks: the
        positional join then pads, see ``to_ast``)."""
        if isinstance(rel, T.Scan) or (isinstance(rel, T.Relabel) and isinstance(rel.child, T.Scan)):
            count = exp.select(exp.Count(this=exp.Star())).from_(exp.Table(this=src.table.this.copy()))
            return exp.Subquery(this=count)
        return lit(math.prod(rel.schema.nblocks(k) for k in rel.schema.keys))

    def aggregate(self, rel: T.Aggregate, rename: dict[str, str] | None = None) -> exp.Select:
        child = rel.child
        if isinstance(child, T.Join | T.Unary | T.MapBlocks | T.CastBlocks):
            row = self.row(child)
        else:
            sc = self.src(child, "c")
            row = Row(_from(sc), sc.cols, sc.tensor())
        order = list(rename) if rename else list(rel.schema.keys)
        keys = {(rename or {}).get(k, k): row.keys[k] for k in order}
        if _fused(rel, row):
            # tensor_<agg>(tensor_einsum(...)) as one native aggregate: the block products accumulate into
            # the group's output block (GEMM with beta=1 for multiply/sum), no product blob per joined pair
            tensor = call("tensor_einsum_agg", *[a.copy() for a in row.tensor.expressions])
        else:
            tensor = call(AGG_FUNCS[rel.agg], row.tensor, lit(rel.schema.dtype))
        return self.finish(Row(row.source, keys, tensor), group=True)

    def repartition(self, rel: T.Repartition) -> exp.Select:
        src, dst = rel.child.schema, rel.schema
        q = exp.select().from_(table(self.ref(rel.child), "c"))
        keys: dict[str, exp.Expression] = {}
        start, stop, piece, offset, out = [], [], [], [], []
        for i, lab in enumerate(src.blob):
            n, bs, bt = src.sizes[lab], src.blocks[lab], dst.blocks[lab]
            ck = col("c", lab)
            src_len = extent(src, lab, ck.copy())
            if bs == bt:
                keys[lab] = ck.copy()
                start.append(lit(0))
                stop.append(src_len)
                piece.append(src_len.copy())
                offset.append(lit(0))
                out.append(src_len.copy())
                continue
            alias = f"r{i}"
            lo_glob = exp.Mul(this=ck.copy(), expression=lit(bs))
            hi_glob = call(
                "least",
                exp.Mul(this=exp.Paren(this=exp.Add(this=ck.copy(), expression=lit(1))), expression=lit(bs)),
                lit(n),
            )
            first = exp.IntDiv(this=lo_glob.copy(), expression=lit(bt))
            last = exp.Add(
                this=exp.IntDiv(
                    this=exp.Paren(this=exp.Sub(this=hi_glob.copy(), expression=lit(1))), expression=lit(bt)
                ),
                expression=lit(1),
            )
            rng = exp.Table(
                this=call("range", first, last),
                alias=exp.TableAlias(this=ident(alias), columns=[ident(lab)]),
            )
            q = q.join(rng, join_type="cross", copy=False)
            tk = col(alias, lab)
            keys[lab] = exp.Cast(this=tk, to=exp.DataType.build("INTEGER"))
            t_lo = exp.Mul(this=tk.copy(), expression=lit(bt))
            t_hi = exp.Mul(
                this=exp.Paren(this=exp.Add(this=tk.copy(), expression=lit(1))), expression=lit(bt)
            )
            lo = call("greatest", lo_glob.copy(), t_lo.copy())
            hi = call("least", hi_glob.copy(), t_hi)
            start.append(exp.Sub(this=lo.copy(), expression=lo_glob.copy()))
            stop.append(exp.Sub(this=hi.copy(), expression=lo_glob.copy()))
            piece.append(exp.Sub(this=hi.copy(), expression=lo.copy()))
            offset.append(exp.Sub(this=lo.copy(), expression=t_lo.copy()))
            out.append(extent(dst, lab, tk.copy()))
        sliced = call(
            "tensor_slice",
            lit(src.dtype),
            col("c", "tensor"),
            block_shape(src, {k: col("c", k) for k in src.keys}),
            array(start),
            array(stop),
        )
        tensor = call("tensor_assemble", lit(dst.dtype), sliced, array(piece), array(offset), array(out))
        return self.finish(Row(q, keys, tensor), group=True)


def program(rel: T.Fused) -> str:
    """The kernel program of a fused contraction tree: 'i,j:spec' per step, ';'-separated (a string
    argument of ``tensor_einsum_path``, not SQL)."""
    return ";".join(f"{i},{j}:{spec(x, y, z)}" for i, j, x, y, z in rel.steps)


def _fused(rel: T.Aggregate, row: Row) -> bool:
    """Whether an aggregate over a join's row runs as one native aggregate (``tensor_einsum_agg``)."""
    return (
        isinstance(rel.child, T.Join)
        and isinstance(row.tensor, exp.Anonymous)
        and row.tensor.name == "tensor_einsum"
        and rel.child.agg == rel.agg
    )


def _filtered(src: Src, *cols: exp.Expression) -> exp.Select:
    """SELECT <cols> FROM the source, with its filters (repeated labels) applied."""
    q = exp.select(*cols).from_(src.table.copy())
    for cond in src.where:
        q = q.where(cond.copy(), copy=False)
    return q


PIN_COL = "__ts_shape"


def _pin(src: Src, schema: T.Schema) -> None:
    """Read the side through ``SELECT *, tensor_pin(<block shape>) AS __ts_shape``, whose LIST column
    the join then carries to the kernel call (``src.shape``).

    DuckDB's join operators buffer outputs of fewer than 64 rows and so copy every blob of every joined pair
    (a tensor join yields few, large rows), unless the output holds a LIST column. A deterministic list would
    be pulled up above the join by the optimizer; ``tensor_pin`` is a volatile identity, so it stays.
    """
    pinned = call("tensor_pin", block_shape(schema, src.cols))
    inner = exp.select(exp.Star(), exp.alias_(pinned, ident(PIN_COL)))
    src.table = exp.Subquery(this=inner.from_(src.table), alias=exp.TableAlias(this=ident(src.alias)))
    src.shape = col(src.alias, PIN_COL)


def _positional(small: Src, big: Src, rows: exp.Expression) -> exp.Select:
    """FROM big POSITIONAL JOIN (small's one row, repeated ``rows`` times).

    DuckDB's join operators buffer outputs of fewer than 64 rows, which copies every blob of every joined
    pair (a tensor join yields few, large rows): ~4 GB/s, as much as the products of a memory-bound
    contraction cost. A positional join streams its left side without copying and materializes only its
    right side, here the one small block, repeated by UNNEST. (A filter after the join would copy again,
    so padding rows, when ``rows`` exceeds big's row count, are left for the consumers: see ``to_ast``.)
    """
    copies = exp.Explode(this=call("range", rows))
    right = _filtered(small, exp.Star(), exp.alias_(copies, ident("__ts_rep")))
    join = exp.Join(
        this=exp.Subquery(this=right, alias=exp.TableAlias(this=ident(small.alias))), method="POSITIONAL"
    )
    return exp.select().from_(big.table.copy()).join(join, copy=False)


def _sink_key(key: int) -> exp.Expression:
    """The sink's key, a literal: a reusable slot the executor points at each run's result array, so the
    statement's text stays the same from one run to the next."""
    return exp.Cast(this=lit(key), to=exp.DataType.build("BIGINT"))


def _starts(schema: T.Schema, cols: dict[str, exp.Expression]) -> exp.Expression:
    """A row's block origin in the whole tensor (element coordinates), from its key columns."""
    return array([exp.Mul(this=cols[lab].copy(), expression=lit(schema.blocks[lab])) for lab in schema.blob])


def _sink_rows(b: _Builder, root: T.Rel, key: int) -> exp.Select:
    """One row per result block, each block written into the result sink (``written``: its elements).

    The root contraction (Positional over a fused Aggregate over a Join) writes from the kernel: as a scalar
    ``tensor_einsum_into`` when every contracted label is one block (each group is one joined pair, so the
    product goes straight into the caller's array), else as the aggregate ``tensor_einsum_agg_into`` (each
    group's accumulated block is copied there once). Any other root writes its blocks with
    ``tensor_sink_write``.
    """
    written = ident("written")
    if isinstance(root, T.Fused):
        row = b.fused(root)
        args = [_sink_key(key), _starts(root.schema, row.keys), *[a.copy() for a in row.tensor.expressions]]
        return row.source.select(exp.alias_(call("tensor_einsum_path_into", *args), written), copy=False)
    agg = root.child if isinstance(root, T.Positional) else None
    row = b.row(agg.child) if isinstance(agg, T.Aggregate) and isinstance(agg.child, T.Join) else None
    if row is not None and _fused(agg, row):
        args = [_sink_key(key), _starts(agg.schema, row.keys), *[a.copy() for a in row.tensor.expressions]]
        js = agg.child.schema
        if all(js.blocks[lab] >= js.sizes[lab] for lab in js.keys if lab not in agg.schema.keys):
            return row.source.select(exp.alias_(call("tensor_einsum_into", *args), written), copy=False)
        q = row.source.select(exp.alias_(call("tensor_einsum_agg_into", *args), written), copy=False)
        return q.group_by(*[row.keys[k].copy() for k in agg.schema.keys], copy=False)
    s = root.schema
    direct = _row_of(b, root)
    if direct is not None:  # a row-wise root writes each block as it computes it: no CTE in between
        cols = direct.keys
        starts, shape = _starts(s, cols), block_shape(s, cols)
        tensor = call("tensor_sink_write", _sink_key(key), starts, lit(s.dtype), direct.tensor, shape)
        return direct.source.select(exp.alias_(tensor, written), copy=False)
    cols = {k: col("c", k) for k in s.keys}
    starts, shape = _starts(s, cols), block_shape(s, cols)
    tensor = call("tensor_sink_write", _sink_key(key), starts, lit(s.dtype), col("c", "tensor"), shape)
    return exp.select(exp.alias_(tensor, written)).from_(table(b.ref(root), "c"))


def _row_of(b: _Builder, root: T.Rel) -> Row | None:
    """The root as one row-wise SELECT (keys in the root's positional names), when it is one."""
    if isinstance(root, T.Positional) and isinstance(root.child, T.Join | T.Unary):
        rename = dict(zip(root.child.schema.blob, root.schema.keys, strict=True))
        row = b.row(root.child)
        return Row(row.source, {rename[k]: row.keys[k] for k in rename}, row.tensor)
    if isinstance(root, T.MapBlocks | T.CastBlocks):
        return b.row(root)
    return None


def to_sink_ast(
    root: T.Rel, *, key: int, names: Names | None = None, bind: Bind | None = None
) -> exp.Select:
    """The plan as one statement that writes every result block into the result sink ``key`` (a slot the
    caller points at a C-contiguous array) and returns (blocks, elements) written, for a completeness
    check."""
    if len(set(root.schema.blob)) != len(root.schema.blob):
        raise TypeError("a result sink needs one blob label per dimension")
    b = _Builder(names, bind)
    rows = _sink_rows(b, root, key)
    if not b.ctes and rows.args.get("from_") is None and not rows.args.get("group"):
        # every input inlined and one output block: the row itself is the answer, one row with no FROM (no
        # aggregate to count it, which costs DuckDB as much as the rest of such a statement)
        (written,) = rows.expressions
        return exp.select(exp.alias_(lit(1), ident("blocks")), exp.alias_(written.this, ident("elements")))
    w = col("w", "written")
    q = exp.select(
        exp.alias_(exp.Count(this=w), ident("blocks")), exp.alias_(exp.Sum(this=w.copy()), ident("elements"))
    ).from_(exp.Subquery(this=rows, alias=exp.TableAlias(this=ident("w"))))
    for cte_name, cte in b.ctes:
        q = q.with_(ident(cte_name), as_=cte, copy=False)
    return q


def to_ast(root: T.Rel, *, names: Names | None = None, bind: Bind | None = None) -> exp.Select:
    """The whole plan as one statement: a WITH clause of CTEs and a final SELECT (without the padding
    rows a positional join may leave, so results and saved tables hold real blocks only)."""
    b = _Builder(names, bind)
    name = b.ref(root)
    q = exp.select(exp.Star()).from_(exp.Table(this=ident(name)))
    if T.may_pad(root):
        q = q.where(
            exp.Not(this=exp.Is(this=exp.column("tensor", quoted=True), expression=exp.Null())), copy=False
        )
    for cte_name, cte in b.ctes:
        q = q.with_(ident(cte_name), as_=cte, copy=False)
    return q


def sql_text(ast: exp.Expression, pretty: bool = False) -> str:
    return ast.sql(dialect="duckdb", pretty=pretty, normalize_functions=False)
