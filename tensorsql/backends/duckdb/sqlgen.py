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
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import cast

from sqlglot import exp

from tensorsql.dtypes import DTYPES
from tensorsql.errors import PlanError
from tensorsql.ir import blocking
from tensorsql.ir import tra as T
from tensorsql.ir.ops import AGG_FUNCS
from tensorsql.sqlexpr import call, col, ident, lit, sql_type

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


def array(items: list[exp.Expression]) -> exp.Expression:
    # an empty list literal has no element type in DuckDB; cast it so kernels see BIGINT[]
    if not items:
        return exp.Cast(this=exp.Array(expressions=[]), to=sql_type("BIGINT[]"))
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


# -- checks of stored tables ----------------------------------------------------------------------------
# A stored table may be edited with SQL between two reads. Every statement that reads one checks it (the
# executor's ``checks`` choose which), in the statement itself, at every run:
# - ``guard``, a UNION ALL branch: each key of each table non-NULL, inside the block grid, and once;
# - every blob a kernel reads is checked by the kernel against its block's shape (before it touches memory);
#   a raw read of the table (the table is the result) checks each blob with ``checked`` instead.
# A check that fails stops the query with DuckDB's error(): CORRUPT, the table's metadata as JSON (a literal)
# and the failing key and number (bytes or count); ``corrupt_message`` writes the user's message from it
# (``errors.wrap``: CorruptTableError). Composing it in Python keeps the SQL small: DuckDB sets up every
# expression of a statement at every run, failing or not (a message built in SQL cost ~1 ms a run, a per-row
# check in front of every kernel ~0.5 ms). A run that fails otherwise (a kernel's check) runs ``diagnosis``,
# which names the table and key when a table is to blame.

#: the start of the message of every check below
CORRUPT = "tensorsql: corrupted stored table"

#: which stored tables a statement checks (``to_ast``/``to_sink_ast``'s ``checks``): all, none, or those a
#: predicate picks (an executor skips the views it checked when it registered them)
Checks = bool | Callable[[T.Scan], bool]


def _case(cond: exp.Expression, then: exp.Expression, default: exp.Expression) -> exp.Case:
    """CASE WHEN cond THEN then ELSE default END, built in place (sqlglot's builder copies its arguments)."""
    return exp.Case(ifs=[exp.If(this=cond, true=then)], default=default)


def _in_grid(scan: T.Scan, keys: list[exp.Expression]) -> exp.Expression | None:
    """Every key inside the block grid (NULL for a NULL key); None for a 0-d table, which has no keys."""
    s = scan.schema
    conds = [
        exp.Between(this=k.copy(), low=lit(0), high=lit(s.nblocks(lab) - 1))
        for lab, k in zip(s.keys, keys, strict=True)
    ]
    return exp.and_(*conds, copy=False) if conds else None


def _about(scan: T.Scan, check: str) -> str:
    """The start of a failed check's error: CORRUPT and what ``corrupt_message`` needs, as JSON."""
    s = scan.schema
    info = {
        "table": scan.table,
        "shape": [s.sizes[k] for k in s.keys],
        "blocks": [s.blocks[k] for k in s.keys],
        "dtype": s.dtype,
        "check": check,
    }
    return f"{CORRUPT} {json.dumps(info)} "


def _failure(
    about: exp.Expression, keys: list[exp.Expression], number: exp.Expression, *, listed: bool = True
) -> exp.Expression:
    """error(about || '[k0, k1] ' || number): the failing key and its byte count or row count. ``keys``: the
    key columns (``listed``), or one expression that is the key's list already."""
    text = sql_type("VARCHAR")
    key: exp.Expression = lit("[]")
    if keys:
        key = exp.Cast(this=exp.Array(expressions=[k.copy() for k in keys]) if listed else keys[0], to=text)
    return call("error", call("concat", about, key, lit(" "), exp.Cast(this=number, to=text)))


def checked(scan: T.Scan, keys: list[exp.Expression], tensor: exp.Expression) -> exp.Expression:
    """A stored block as it is read, checked first: unless it is NULL (absent), its key inside the block
    grid and its blob as long as its block shape and dtype need; else the query stops with an error naming
    the table and the key. A projection of rows the query reads anyway: no scan of its own, no copy. Checked
    before a kernel sees the block, so the error is this one, not the kernel's."""
    s = scan.schema
    cols = dict(zip(s.keys, keys, strict=True))
    extents = [extent(s, k, exp.Cast(this=cols[k].copy(), to=sql_type("BIGINT"))) for k in s.keys]
    need: exp.Expression = lit(DTYPES[s.dtype].itemsize * math.prod(int(e.name) for e in extents if e.is_int))
    for e in extents:
        if not e.is_int:
            need = exp.Mul(this=need, expression=e)
    fits = exp.EQ(this=call("octet_length", tensor.copy()), expression=need)
    in_grid = _in_grid(scan, keys)
    ok = exp.or_(
        exp.Is(this=tensor.copy(), expression=exp.Null()),  # absent, or a positional join's padding row
        fits if in_grid is None else exp.and_(in_grid, fits, copy=False),
        copy=False,
    )
    failed = _failure(lit(_about(scan, "block")), keys, call("octet_length", tensor.copy()))
    return _case(ok, tensor.copy(), exp.Cast(this=failed, to=sql_type("BLOB")))


def _keys_of(index: int, scan: T.Scan, rank: int) -> exp.Select:
    """The keys of stored table ``index`` for ``guard``: (t, k0..k{rank-1} padded with 0, ok), ok being
    whether the key lies inside its grid (NULL for a NULL key). The key columns only: no blob is read."""
    s = scan.schema
    keys: list[exp.Expression] = [exp.column(k, quoted=True) for k in s.keys]
    in_grid = _in_grid(scan, keys)
    keys += [exp.Cast(this=lit(0), to=sql_type("INTEGER")) for _ in range(rank - len(keys))]
    cells = [lit(index), *keys, exp.true() if in_grid is None else in_grid]
    names = ["t", *(f"k{d}" for d in range(rank)), "ok"]
    aliased = [exp.alias_(c, ident(n), copy=False) for c, n in zip(cells, names, strict=True)]
    return exp.select(*aliased, copy=False).from_(exp.Table(this=ident(scan.table)), copy=False)


#: the cells of a ``guard`` row around the raised error
GuardCells = Callable[[exp.Expression], list[exp.Expression]]


def _grouped(scans: list[tuple[int, T.Scan]], row: GuardCells) -> exp.Select:
    """``guard``'s check of tables of several blocks: one GROUP BY over the keys of all of them; a key that
    appears twice, is NULL or lies outside its grid fails."""
    rank = max(len(scan.schema.keys) for _, scan in scans)
    keys: exp.Query = _keys_of(*scans[0], rank)
    for i, scan in scans[1:]:
        keys = exp.union(keys, _keys_of(i, scan, rank), distinct=False, copy=False)
    group = [exp.column(n, quoted=True) for n in ["t", *(f"k{d}" for d in range(rank)), "ok"]]
    per_key = exp.select(*group, exp.alias_(exp.Count(this=exp.Star()), ident("n"), copy=False), copy=False)
    per_key = per_key.from_(exp.Subquery(this=keys, alias=exp.TableAlias(this=ident("u"))), copy=False)
    per_key = per_key.group_by(*[c.copy() for c in group], copy=False)
    bad = exp.or_(
        exp.GT(this=col("g", "n"), expression=lit(1)),
        exp.Not(this=call("coalesce", col("g", "ok"), exp.false())),
        copy=False,
    )
    abouts = {i: lit(_about(scan, "keys")) for i, scan in scans}
    about = (
        next(iter(abouts.values()))
        if len(abouts) == 1
        else exp.Case(
            ifs=[
                exp.If(this=exp.EQ(this=col("g", "t"), expression=lit(i)), true=a) for i, a in abouts.items()
            ]
        )
    )
    failed = _failure(about, [col("g", f"k{d}") for d in range(rank)], col("g", "n"))
    q = exp.select(*row(failed), copy=False).from_(per_key.subquery("g"), copy=False)
    return q.where(bad, copy=False)


def _one_block(scan: T.Scan, row: GuardCells) -> exp.Select:
    """``guard``'s check of a table whose grid is one block: one ungrouped aggregate (a GROUP BY costs
    DuckDB ~1 ms a run, as much as a small call): more than one row, or a key that is NULL or not all zeros,
    fails."""
    s = scan.schema
    keys = [exp.column(k, quoted=True) for k in s.keys]
    cells = [exp.alias_(exp.Count(this=exp.Star()), ident("n"), copy=False)]
    bad = exp.GT(this=col("c", "n"), expression=lit(1))
    number: exp.Expression = col("c", "n")
    key: list[exp.Expression] = []
    in_grid = _in_grid(scan, keys)
    if in_grid is not None:
        outside = exp.Not(this=call("coalesce", in_grid, exp.false()))
        first = call("first", exp.Array(expressions=keys))
        first = exp.Filter(this=first, expression=exp.Where(this=outside))
        cells.append(exp.alias_(first, ident("bad"), copy=False))
        found = exp.Not(this=exp.Is(this=col("c", "bad"), expression=exp.Null()))
        bad = exp.or_(bad, found, copy=False)
        number = _case(found.copy(), lit(1), number)
        zeros = exp.Array(expressions=[exp.Cast(this=lit(0), to=sql_type("INTEGER")) for _ in keys])
        key = [call("coalesce", col("c", "bad"), zeros)]
    failed = _failure(lit(_about(scan, "keys")), key, number, listed=False)
    counted = exp.select(*cells, copy=False).from_(exp.Table(this=ident(scan.table)), copy=False)
    q = exp.select(*row(failed), copy=False).from_(counted.subquery("c"), copy=False)
    return q.where(bad, copy=False)


def guard(scans: list[T.Scan], columns: list[tuple[str, str]]) -> exp.Query:
    """A branch for ``UNION ALL`` beside a statement's result: no row, or the first bad key of the stored
    tables the statement reads (repeated, NULL or outside the grid), raised as an error. Whatever rows the
    query pairs or drops, every key of every table it reads is checked once per run, from its key columns
    only (no blob is read). A union branch is a pipeline of its own, where a cross join with the result
    might materialize the result. ``columns``: (name, SQL type) of the statement's rows."""
    *nulls, (last, last_type) = columns

    def row(failed: exp.Expression) -> list[exp.Expression]:
        typed = [(exp.Cast(this=exp.Null(), to=exp.DataType.build(t)), n) for n, t in nulls]
        raised = exp.Cast(this=failed, to=exp.DataType.build(last_type))
        return [exp.alias_(c, ident(n), copy=False) for c, n in [*typed, (raised, last)]]

    single = [scan for scan in scans if all(scan.schema.nblocks(k) == 1 for k in scan.schema.keys)]
    several = [(i, scan) for i, scan in enumerate(scans) if scan not in single]
    branches: list[exp.Select] = [_one_block(scan, row) for scan in single]
    if several:
        branches.append(_grouped(several, row))
    q: exp.Query = branches[0]
    for branch in branches[1:]:
        q = exp.union(q, branch, distinct=False, copy=False)
    return q


def corrupt_message(text: str) -> str | None:
    """The user's message for a failed check's error text (None when ``text`` is not one): the table, the
    key, and what is wrong with it."""
    at = text.find(CORRUPT)
    if at < 0:
        return None
    rest = text[at + len(CORRUPT) :].lstrip()
    try:
        info, end = json.JSONDecoder().raw_decode(rest)
        key_text, number = rest[end:].strip().rsplit(" ", 1)
        shape, blocks, dtype = info["shape"], info["blocks"], info["dtype"]
        rank = len(shape)
        items = [k.strip() for k in key_text.strip("[]").split(",") if k.strip()][:rank]
        key = [None if k == "NULL" else int(k) for k in items]
        count = int(number)
    except (ValueError, KeyError, TypeError):
        return text[at:]
    grid = list(blocking.grid(tuple(shape), tuple(blocks)))
    shown = "[" + ", ".join("NULL" if k is None else str(k) for k in key) + "]"
    head = f"{CORRUPT} {info['table']!r}: block" + (f" key {shown}" if rank else "")
    if info["check"] == "keys" and count > 1:
        return f"{head} appears {count} times"
    if any(k is None for k in key):
        return f"{head} has a NULL key column"
    if any(not 0 <= k < g for k, g in zip(key, grid, strict=True)):
        return f"{head} lies outside its block grid {grid} (shape {shape} in blocks of {blocks})"
    ext = [min(b, n - b * k) for k, b, n in zip(key, blocks, shape, strict=True)]
    need = DTYPES[dtype].itemsize * math.prod(ext) if dtype in DTYPES else "?"
    return f"{head} has {count} bytes but its block shape {ext} of {dtype} needs {need}"


def diagnosis(root: T.Rel, checks: Checks = True) -> list[exp.Query]:
    """Statements that check the stored tables a plan reads whole, keys first (``guard``) and then every
    blob (``checked``): what a failed run executes next, in order, to tell a corrupted table (the error then
    names it) from any other failure. Empty when the plan reads no table to check."""
    pick = checks if callable(checks) else (lambda _scan: bool(checks))
    scans = list({_scan_key(s): s for s in _scans(root) if pick(s)}.values())
    if not scans:
        return []
    blobs: exp.Query | None = None
    for scan in scans:
        blob = checked(scan, [col("c", k) for k in scan.schema.keys], col("c", "tensor"))
        each = exp.select(exp.alias_(blob, ident("x"), copy=False), copy=False).from_(table(scan.table, "c"))
        blobs = each if blobs is None else exp.union(blobs, each, distinct=False, copy=False)
    out: list[exp.Query] = []
    for rows in (guard(scans, [("x", "BLOB")]), blobs):
        every = exp.Count(this=col("d", "x"))  # count(x), not count(*): every row's check is evaluated
        out.append(exp.select(every).from_(exp.Subquery(this=rows, alias=exp.TableAlias(this=ident("d")))))
    return out


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
    return exp.Cast(this=lit(0), to=sql_type("INTEGER"))


#: one-row sides computed in the statement whose blocks are at most this many bytes are paired by CROSS JOIN
#: rather than POSITIONAL JOIN: DuckDB's positional join cost ~85 us per join of two one-row sides (a chain of
#: 20 small element-wise steps: 2.1 ms, against 1.1 ms cross joined); a cross join copies its build side,
#: which costs more than that from a few MiB on (4 MiB blocks: 1.5 ms positional, 2.7 ms cross, per join)
CROSS_BYTES = 1 << 20


def _from(*srcs: Src, cross: bool = False) -> exp.Select:
    """SELECT over the sides that are tables, side by side (POSITIONAL JOIN; ``cross``: CROSS JOIN, for
    sides of at most one row each); inlined sides need no FROM."""
    q = exp.select()
    tables = [src.table for src in srcs if src.table is not None]
    if tables:
        q = q.from_(tables[0])
        for t in tables[1:]:
            q = (
                q.join(t, join_type="cross", copy=False)
                if cross
                else q.join(exp.Join(this=t, method="POSITIONAL"), copy=False)
            )
    for src in srcs:
        for cond in src.where:
            q = q.where(cond, copy=False)
    return q


def _small_computed(rel: T.Rel, computed: set[str]) -> bool:
    """A side made in the statement (not a stored table, read in place by a positional scan; ``computed``:
    tables that are CTEs of the statement) whose one block takes at most ``CROSS_BYTES``."""
    leaf = rel.child if isinstance(rel, T.Relabel | T.Restrict) else rel
    leaf = leaf.child if isinstance(leaf, T.Restrict) else leaf
    if isinstance(leaf, T.Scan) and leaf.table.lower() not in computed:
        return False
    s = rel.schema
    return math.prod(min(s.blocks[k], s.sizes[k]) for k in s.keys) * DTYPES[s.dtype].itemsize <= CROSS_BYTES


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


def slot_blocks(
    key: int, keys: tuple[str, ...], shape: tuple[int, ...], block: tuple[int, ...]
) -> exp.Select:
    """The blocks of an array lent through slot ``key``, one row each in row-major key order (as an uploaded
    view holds them, so positional joins line up): ``tensor_source(key, start, extent)`` over ``range(n)``,
    each row's keys and edge extents worked out from its row number."""
    grid = [-(-n // b) for n, b in zip(shape, block, strict=True)]
    row = exp.column("i", "_ts_r", quoted=True)
    cols: list[exp.Expression] = []
    starts: list[exp.Expression] = []
    extents: list[exp.Expression] = []
    bigint = sql_type("BIGINT")
    for d, (name, n, b) in enumerate(zip(keys, shape, block, strict=True)):
        after = math.prod(grid[d + 1 :])
        k = row.copy() if after == 1 else exp.IntDiv(this=row.copy(), expression=lit(after))
        k = exp.Mod(this=exp.Paren(this=k), expression=lit(grid[d])) if d else k
        cols.append(exp.alias_(exp.Cast(this=k, to=sql_type("INTEGER")), ident(name)))
        start = exp.Mul(this=exp.Paren(this=k.copy()), expression=lit(b))
        starts.append(exp.Cast(this=start, to=bigint))
        extents.append(call("least", lit(b), exp.Sub(this=lit(n), expression=start.copy())))
    tensor = call("tensor_source", exp.Cast(this=lit(key), to=bigint), array(starts), array(extents))
    source = exp.Table(
        this=call("range", lit(math.prod(grid))),
        alias=exp.TableAlias(this=ident("_ts_r"), columns=[ident("i")]),
    )
    return exp.select(*cols, exp.alias_(tensor, ident("tensor"))).from_(source)


def _unbound(rel: T.Input) -> str:
    raise PlanError(f"operand {rel.name!r} (#{rel.index}) has no binding in this statement")


def _scans(root: T.Rel) -> list[T.Scan]:
    """The stored tables a plan reads (Scan nodes)."""
    return [rel for rel in T.nodes(root) if isinstance(rel, T.Scan)]


def _scan_key(scan: T.Scan) -> tuple[object, ...]:
    """A stored table with its metadata: two Scan nodes of one table read it once as far as checks go."""
    s = scan.schema
    return scan.table, tuple((s.sizes[k], s.blocks[k]) for k in s.keys), s.dtype


@dataclass(frozen=True)
class Lowering:
    """Which of the kernels' fused forms a statement may use: an executor whose kernel set lacks one (the GPU
    kernel set, ``backends.cuda``) turns it off, and the same plan is lowered to the plain kernels instead.
    ``einsum_agg``: an aggregate over a join's products as one ``tensor_einsum_agg`` (else
    ``tensor_<agg>(tensor_einsum(...))``); ``einsum_path``: a fused contraction tree as one
    ``tensor_einsum_path`` call (else nested ``tensor_einsum`` calls, one per step)."""

    einsum_agg: bool = True
    einsum_path: bool = True
    #: a CUDA ordinal: the block kernels the GPU kernel set has run there (``on_device``); None: the CPU's
    device: int | None = None


FUSED = Lowering()

#: The kernels the GPU kernel set (``udf_kernels/cuda``) computes, by name: the position of their dtype
#: argument, and the GPU function (with the ordinal as a first argument) by their argument count.
_DEVICE_KERNELS: dict[str, tuple[int, dict[int, str]]] = {
    "tensor_einsum": (3, {8: "tensor_einsum_cuda"}),
    "tensor_einsum1": (2, {5: "tensor_einsum1_cuda"}),
    "tensor_map": (1, {3: "tensor_map_cuda", 4: "tensor_map_param_cuda"}),
}
#: The dtypes the GPU kernel set computes; blocks of any other dtype stay on the CPU kernels, except complex
#: blocks in multiply/sum contractions (``tensor_einsum`` with join ``multiply`` and agg ``sum``).
DEVICE_DTYPES = ("float32", "float64")
DEVICE_COMPLEX = ("complex64", "complex128")


def _multiply_sum(name: str, args: list[exp.Expression]) -> bool:
    """Whether a kernel call is a multiply/sum ``tensor_einsum`` (literal join and agg)."""
    if name != "tensor_einsum":
        return False
    join, agg = args[1], args[2]
    return all(isinstance(a, exp.Literal) and a.is_string for a in (join, agg)) and (join.this, agg.this) == (
        "multiply",
        "sum",
    )


def on_device(ast: exp.Expression, ordinal: int) -> exp.Expression:
    """The statement with each block kernel call the GPU computes bound to its GPU function on device
    ``ordinal``, in place (a pass over the finished statement: the plan, its joins and aggregates stay as they
    are; nested calls are each bound)."""
    for node in list(ast.find_all(exp.Anonymous)):
        if node.name not in _DEVICE_KERNELS:
            continue
        position, by_count = _DEVICE_KERNELS[node.name]
        args = list(node.expressions)
        name = by_count.get(len(args))
        dtype = args[position] if position < len(args) else None
        if name is None or not (isinstance(dtype, exp.Literal) and dtype.is_string):
            continue
        if dtype.this in DEVICE_DTYPES or (dtype.this in DEVICE_COMPLEX and _multiply_sum(node.name, args)):
            node.set("this", name)
            node.set("expressions", [lit(ordinal), *args])
    return ast


class _Builder:
    def __init__(
        self,
        root: T.Rel,
        names: Names | None = None,
        bind: Bind | None = None,
        checks: Checks = False,
        lowering: Lowering = FUSED,
        in_place: Callable[[T.Scan], bool] | None = None,
    ) -> None:
        self.lowering = lowering
        #: stored tables that are Arrow tables registered with DuckDB (``_whole``)
        self.in_place: Callable[[T.Scan], bool] = in_place or (lambda _scan: False)
        self.ctes: list[tuple[str, exp.Select]] = []
        self.refs: dict[T.Rel, str] = {}
        self.names = names or Names()
        # no CTE may take a stored table's name: it would hide the table from every reference in the statement
        self.names.reserved |= {scan.table.lower() for scan in _scans(root)}
        self.bind = bind or _unbound
        #: whether to check a stored table the statement reads (``checked``, ``guard``)
        self.check: Callable[[T.Scan], bool] = checks if callable(checks) else (lambda _scan: bool(checks))
        #: the stored tables read, once each (by table and metadata)
        self.scans: dict[tuple[object, ...], T.Scan] = {}
        #: "tables" that are CTEs of this statement (``to_multi_sink_ast``'s stages), lower case
        self.computed: set[str] = set()
        #: how many relations read each relation (``inline_row`` inlines one read once)
        self.uses: dict[T.Rel, int] = {}
        self.count(root)

    def count(self, root: T.Rel) -> None:
        """Adds the reads of ``root``'s relations (``root`` itself is read once: by the statement)."""
        self.uses[root] = self.uses.get(root, 0) + 1
        if self.uses[root] > 1:
            return
        stack = [root]
        while stack:
            for child in T.inputs(stack.pop()):
                self.uses[child] = self.uses.get(child, 0) + 1
                if self.uses[child] == 1:
                    stack.append(child)

    def inline_row(self, rel: T.Rel) -> exp.Expression | None:
        """The block of a one-row relation read once, as an expression, when it needs no FROM (every input
        of its row inlined): its reader nests the kernel calls instead of joining a CTE of one row (DuckDB
        pairs two one-row CTEs in ~45 us, a nested call costs ~4 us). None otherwise."""
        if rel in self.refs or self.uses.get(rel, 0) != 1:
            return None
        if any(rel.schema.nblocks(k) > 1 for k in rel.schema.keys):
            return None
        if isinstance(rel, T.Positional) and isinstance(rel.child, T.Aggregate | T.Join | T.Unary):
            return self.inline_row(rel.child)
        if isinstance(rel, T.Aggregate):
            if not isinstance(rel.child, T.Join) or not _single_pairs(rel) or self.uses.get(rel.child) != 1:
                return None
            row = self.row(rel.child)
            if not _fused(rel, row):
                return None
        elif isinstance(rel, T.Join | T.Unary | T.MapBlocks | T.CastBlocks | T.Fused):
            row = self.row(rel)
        else:
            return None
        q = row.source
        if q.args.get("from_") is not None or q.args.get("joins") or q.args.get("where") is not None:
            return None
        return row.tensor

    def ref(self, rel: T.Rel) -> str:
        if isinstance(rel, T.Scan):
            if self.check(rel):
                self.scans.setdefault(_scan_key(rel), rel)
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

    def src(self, rel: T.Rel, alias: str, one_row: bool = False) -> Src:
        """``rel`` as an input of a row-wise SELECT; ``one_row``: the reader makes one row, so an inlined
        block is computed once."""
        inline = self.scalar(rel)
        labels = rel.labels if isinstance(rel, T.Relabel) else rel.schema.keys
        if inline is not None:
            return Src(None, {lab: _zero() for lab in labels}, [], alias, value=inline.tensor)
        if one_row:
            leaf = rel.child if isinstance(rel, T.Relabel) else rel
            if leaf is rel or self.uses.get(rel) == 1:
                value = self.inline_row(leaf)
                if value is not None:
                    return Src(None, {lab: _zero() for lab in labels}, [], alias, value=value)
        if isinstance(rel, T.Restrict):
            inner = self.src(rel.child, alias)
            if inner.table is not None:
                source = self._whole(rel.child, inner.table)
                inner.table = _within(source, alias, {k: inner.cols[k] for k, _, _ in rel.ranges}, rel)
            return inner
        if isinstance(rel, T.Relabel):
            cols: dict[str, exp.Expression] = {}
            where: list[exp.Expression] = []
            for pos, lab in zip(rel.child.schema.keys, rel.labels, strict=True):
                if lab in cols:
                    where.append(exp.EQ(this=cols[lab].copy(), expression=col(alias, pos)))
                else:
                    cols[lab] = col(alias, pos)
            child = rel.child
            if isinstance(child, T.Restrict):  # read the restricted rows straight from the child's child
                source = self._whole(child.child, table(self.ref(child.child), alias))
                keys = {k: col(alias, k) for k, _, _ in child.ranges}
                return Src(_within(source, alias, keys, child), cols, where, alias)
            return Src(table(self.ref(child), alias), cols, where, alias)
        return Src(table(self.ref(rel), alias), {k: col(alias, k) for k in rel.schema.keys}, [], alias)

    def _whole(self, rel: T.Rel, source: exp.Table | exp.Subquery) -> exp.Table | exp.Subquery:
        """``source``, the read of ``rel`` that a restriction filters, behind ``OFFSET 0`` where ``rel`` is a
        registered Arrow table: a filter DuckDB pushes into an Arrow scan makes it copy every blob it passes
        (``A[100:3000, 5]`` of a stored 4096² float32 in 1024² blocks: 12.0 -> 5.6 ms); a DuckDB table's scan
        keeps the filter (it skips what the filter drops)."""
        if not (isinstance(rel, T.Scan) and isinstance(source, exp.Table) and self.in_place(rel)):
            return source
        return read_whole(rel.table, source.args.get("alias"))

    def passed(self, rel: T.Rel, sc: Src) -> exp.Expression:
        """The blocks of ``rel`` read through ``sc`` by a step whose kernel is not given their shape (a map, a
        cast, a rename): checked (``checked``) where ``rel`` is a stored table, as where the stored table is
        the result itself. A wrong-length blob came out as cells of other keys, or as a map of it saved."""
        leaf = rel.child if isinstance(rel, T.Restrict) else rel
        if sc.value is None and isinstance(leaf, T.Scan):
            return self.read(leaf, sc.alias)
        return sc.tensor()

    def read(self, rel: T.Rel, alias: str) -> exp.Expression:
        """The ``tensor`` column of ``rel`` under ``alias``, where no kernel reads it (the stored table itself
        is the result): checked (``checked``) when ``rel`` is a stored table."""
        tensor = col(alias, "tensor")
        if isinstance(rel, T.Scan) and self.check(rel):
            return checked(rel, [col(alias, k) for k in rel.schema.keys], tensor)
        return tensor

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
        if isinstance(rel, T.Slice):
            return self.slice(rel)
        if isinstance(rel, T.Densify):
            blocks: exp.Expression = table(self.ref(rel.child), "b")
            if isinstance(rel.child, T.Scan) and self.check(rel.child):  # no kernel checks what passes here
                keys = [exp.alias_(col("b", k), ident(k)) for k in rel.child.schema.keys]
                tensor = exp.alias_(self.read(rel.child, "b"), ident("tensor"), copy=False)
                blocks = exp.select(*keys, tensor).from_(blocks).subquery("b")
            return dense_grid(rel.schema, blocks)
        if isinstance(rel, T.Restrict):  # a stored table's blocks checked as they pass (``read``)
            sc = self.src(rel, "c")
            tensor = self.read(rel.child, "c") if sc.value is None else sc.tensor()
            return self.finish(Row(_from(sc), sc.cols, tensor))
        return self.finish(self.row(rel))

    @staticmethod
    def finish(row: Row, group: bool = False) -> exp.Select:
        cols = [exp.alias_(e, ident(k)) for k, e in row.keys.items()]
        q = row.source.select(*cols, exp.alias_(row.tensor, ident("tensor"), copy=False), copy=False)
        if group and row.keys:
            q = q.group_by(*row.keys.values(), copy=False)
        return q

    def row(self, rel: T.Rel) -> Row:
        s = rel.schema
        if isinstance(rel, T.Fused):
            return self.fused(rel)
        if isinstance(rel, T.Join):
            x, y = rel.left.schema, rel.right.schema
            one = all(s.nblocks(k) == 1 for k in s.keys)
            sx, sy = self.src(rel.left, "x", one), self.src(rel.right, "y", one)
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
        if isinstance(rel, T.Relabel | T.Restrict):
            sc = self.src(rel, "c")
            return Row(_from(sc), sc.cols, self.passed(child, sc))
        sc = self.src(child, "c", all(s.nblocks(k) == 1 for k in s.keys))
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
            args = [lit(rel.fn), lit(s.dtype), self.passed(child, sc)]
            if rel.param is not None:
                args.append(exp.Cast(this=lit(float(rel.param)), to=sql_type("DOUBLE")))
            tensor = call("tensor_map", *args)
        elif isinstance(rel, T.CastBlocks):
            tensor = call("tensor_cast", self.passed(child, sc), lit(c.dtype), lit(s.dtype))
        elif isinstance(rel, T.Positional):
            keys = {k: sc.cols[lab].copy() for k, lab in zip(s.keys, c.blob, strict=True)}
            tensor = self.passed(child, sc)
        else:
            raise TypeError(f"unhandled TRA node {type(rel).__name__}")
        return Row(q, keys, tensor)

    def fused(self, rel: T.Fused) -> Row:
        """``tensor_einsum_path(program, dtype, shapes, x0.tensor, x1.tensor, ...)`` over the one-row inputs,
        side by side (POSITIONAL JOIN). Over stored tables DuckDB reads them as one positional scan, which
        copies no block; a cross product would materialize every input but one (~0.6 GB/s measured). An input
        without its block (no row, or a NULL padding row) makes the result NULL: an absent block."""
        srcs = [self.src(child, f"x{i}", True) for i, child in enumerate(rel.children)]
        shapes = [lit(child.schema.sizes[k]) for child in rel.children for k in child.schema.blob]
        q = _from(*srcs, cross=all(_small_computed(child, self.computed) for child in rel.children))
        keys = {k: exp.Cast(this=lit(0), to=sql_type("INTEGER")) for k in rel.schema.keys}
        if not self.lowering.einsum_path:
            return Row(q, keys, _nested_steps(rel, [src.tensor() for src in srcs]))
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
            return _from(
                sx, sy, cross=_small_computed(left, self.computed) and _small_computed(right, self.computed)
            )
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
        if isinstance(rel, T.Restrict) or (isinstance(rel, T.Relabel) and isinstance(rel.child, T.Restrict)):
            # one wave of a plan run in pieces: the rows its key ranges keep
            return exp.Subquery(this=exp.select(exp.Count(this=exp.Star())).from_(src.table.copy()))
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
        if (_fused(rel, row) and _single_pairs(rel)) or _single_rows(rel):
            # every group is one joined pair (or one row): its product (or block) is the group's block, no
            # aggregate (DuckDB's hash aggregate costs ~25 us per step of one row, the aggregate state
            # copies the block, and an aggregate ends a pipeline)
            return self.finish(Row(row.source, keys, row.tensor))
        if _fused(rel, row) and self.lowering.einsum_agg:
            # tensor_<agg>(tensor_einsum(...)) as one native aggregate: the block products accumulate into
            # the group's output block (GEMM with beta=1 for multiply/sum), no product blob per joined pair
            tensor = call("tensor_einsum_agg", *row.tensor.expressions)
        else:
            tensor = call(AGG_FUNCS[rel.agg], row.tensor, lit(rel.schema.dtype))
        return self.finish(Row(row.source, keys, tensor), group=True)

    def repartition(self, rel: T.Repartition) -> exp.Select:
        """Every source block sliced into the target blocks it overlaps, and the pieces of each target block
        assembled. A source row gets one row per overlapped target block by UNNEST of a ``range`` of target
        keys per re-split position, each in a subquery of its own: a lateral CROSS JOIN with ``range`` would
        copy the source block into every row it makes (1.1 GB held to cut a 13.6 MB tensor into 256 blocks).
        Positions tied by a repeated label (``rel.diagonal``) share one target key, so only diagonal target
        blocks are made, from the source blocks that overlap them along every tied position."""
        src, dst = rel.child.schema, rel.schema
        if not rel.diagonal and all(dst.blocks[lab] % src.blocks[lab] == 0 for lab in src.blob):
            return self._merge(rel)
        # a split: every target block lies inside one source block, so its one piece is the block (no
        # assemble copying it again, no GROUP BY)
        split = not rel.diagonal and all(src.blocks[lab] % dst.blocks[lab] == 0 for lab in src.blob)
        lead = {i: i for i in range(len(src.blob))}
        for group in rel.diagonal:  # a position that keeps its blocks gives the key without a range
            first = next((i for i in group if src.blocks[src.blob[i]] == dst.blocks[src.blob[i]]), group[0])
            lead.update((i, first) for i in group)
        source: exp.Table | exp.Subquery = table(self.ref(rel.child), "c")
        target: dict[int, exp.Expression] = {}
        ranged: set[int] = set()
        for i in sorted(set(lead.values())):
            lab = src.blob[i]
            if src.blocks[lab] == dst.blocks[lab]:
                target[i] = col("c", lab)
                continue
            bt = dst.blocks[lab]
            lo_glob, hi_glob = _source_span(src, lab)
            first = exp.IntDiv(this=lo_glob, expression=lit(bt))
            end = exp.Paren(this=exp.Sub(this=hi_glob, expression=lit(1)))
            last = exp.Add(this=exp.IntDiv(this=end, expression=lit(bt)), expression=lit(1))
            name = f"{_RANGE_COL}{i}"
            keys_of_row = exp.Explode(this=call("range", first, last))
            rows = exp.select(exp.Star(), exp.alias_(keys_of_row, ident(name)))
            source = exp.Subquery(this=rows.from_(source), alias=exp.TableAlias(this=ident("c")))
            target[i] = col("c", name)
            ranged.add(i)
        q = exp.select().from_(source)
        keys: dict[str, exp.Expression] = {}
        start, stop, piece, offset, out = [], [], [], [], []
        for i, lab in enumerate(src.blob):
            ck = col("c", lab)
            tk = target[lead[i]]
            src_len = extent(src, lab, ck.copy())
            if src.blocks[lab] == dst.blocks[lab] and lead[i] not in ranged:
                if lead[i] != i:  # tied to another position that keeps its blocks: the same block key
                    q = q.where(exp.EQ(this=ck.copy(), expression=tk.copy()), copy=False)
                keys[lab] = ck.copy()
                start.append(lit(0))
                stop.append(src_len)
                piece.append(src_len.copy())
                offset.append(lit(0))
                out.append(src_len.copy())
                continue
            bt = dst.blocks[lab]
            lo_glob, hi_glob = _source_span(src, lab)
            as_int = exp.Cast(this=tk.copy(), to=sql_type("INTEGER"))
            keys[lab] = as_int if lead[i] in ranged else tk.copy()
            t_lo = exp.Mul(this=tk.copy(), expression=lit(bt))
            t_end = exp.Paren(this=exp.Add(this=tk.copy(), expression=lit(1)))
            t_hi = exp.Mul(this=t_end, expression=lit(bt))
            lo = call("greatest", lo_glob.copy(), t_lo.copy())
            hi = call("least", hi_glob.copy(), t_hi)
            if lead[i] != i:  # the shared target block must overlap this source block along i too
                q = q.where(exp.LT(this=lo.copy(), expression=hi.copy()), copy=False)
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
        if split:
            return self.finish(Row(q, keys, sliced))
        tensor = call("tensor_assemble", lit(dst.dtype), sliced, array(piece), array(offset), array(out))
        return self.finish(Row(q, keys, tensor), group=True)

    def _merge(self, rel: T.Repartition) -> exp.Select:
        """A repartition into blocks that are each a whole number of source blocks: every source block lies
        in one target block (key ``k // ratio``) at offset ``(k % ratio) * block``, so it is assembled as it
        is: no slice copies it first, and no UNNEST repeats its row."""
        src, dst = rel.child.schema, rel.schema
        keys: dict[str, exp.Expression] = {}
        piece, offset, out = [], [], []
        for lab in src.blob:
            ck = col("c", lab)
            bs, bt = src.blocks[lab], dst.blocks[lab]
            piece.append(extent(src, lab, ck.copy()))
            if bs == bt:
                keys[lab] = ck.copy()
                offset.append(lit(0))
                out.append(extent(dst, lab, ck.copy()))
                continue
            ratio = bt // bs
            tk = exp.Cast(
                this=exp.IntDiv(this=ck.copy(), expression=lit(ratio)), to=sql_type("INTEGER")
            )
            keys[lab] = tk
            offset.append(
                exp.Mul(
                    this=exp.Paren(this=exp.Mod(this=ck.copy(), expression=lit(ratio))), expression=lit(bs)
                )
            )
            out.append(extent(dst, lab, tk.copy()))
        tensor = call(
            "tensor_assemble", lit(dst.dtype), col("c", "tensor"), array(piece), array(offset), array(out)
        )
        q = exp.select().from_(table(self.ref(rel.child), "c"))
        if T.may_pad(rel.child):  # a padding row (NULL keys and block) is no piece (the UNNEST drops it)
            q = q.where(exp.Not(this=exp.Is(this=col("c", "tensor"), expression=exp.Null())), copy=False)
        return self.finish(Row(q, keys, tensor), group=True)

    def slice(self, rel: T.Slice) -> exp.Select:
        """Each child block cut into its pieces of the output blocks (``tensor_slice_strided``) and the pieces
        of an output block assembled. Where the pieces are to be found is known when planning
        (``T.Slice.pieces``): per sliced dimension a small VALUES table (child block, output block, first
        element, elements, offset) joined on the child's key, so the query does no index arithmetic. A
        dimension kept whole keeps its keys; where every output block is a single piece, no assembling."""
        src, dst = rel.child.schema, rel.schema
        sc = self.src(rel.child, "c")
        leaf = rel.child.child if isinstance(rel.child, T.Restrict) else rel.child
        if sc.table is not None and leaf is rel.child:  # joined to the pieces' VALUES below: a filter
            sc.table = self._whole(leaf, sc.table)
        x = self.read(leaf, "c") if sc.value is None else sc.tensor()
        q = _from(sc)
        keys: dict[str, exp.Expression] = {}
        start, count, step, piece, offset, out = [], [], [], [], [], []
        whole = True
        # a restricted child (a wave, or the blocks the slice holds) lists only its blocks' pieces
        kept_blocks = {}
        if isinstance(rel.child, T.Restrict):
            kept_blocks = {k: (lo, hi) for k, lo, hi in rel.child.ranges}
        for d, lab in enumerate(src.keys):
            ck = sc.cols[lab]
            lo, hi = kept_blocks.get(lab, (0, src.nblocks(lab) - 1))
            pieces = [p for p in rel.pieces(d) if lo <= p[0] <= hi] or [(-1, 0, 0, 0, 0)]  # -1: no block
            kept = dst.keys[rel.out_dim(d)] if rel.keep[d] else None
            if (
                kept is not None
                and (rel.start[d], rel.step[d], rel.count[d]) == (0, 1, src.sizes[lab])
                and dst.blocks[kept] == src.blocks[lab]
            ):  # the child's own blocks: keep the key
                key, a, n, o = ck.copy(), lit(0), extent(src, lab, ck.copy()), lit(0)
            else:
                alias = f"m{d}"
                rows = [tuple(lit(v) for v in p) for p in pieces]
                where = exp.values(rows, alias=alias, columns=["s", "t", "a", "n", "o"])
                on = exp.EQ(this=col(alias, "s"), expression=ck.copy())
                if q.args.get("from_") is None:  # an inlined one-block child: no table to join to
                    q = q.from_(where, copy=False).where(on, copy=False)
                else:
                    q = q.join(where, on=on, copy=False)
                key, a, n, o = col(alias, "t"), col(alias, "a"), col(alias, "n"), col(alias, "o")
                if kept is not None:
                    bt, total = dst.blocks[kept], dst.sizes[kept]
                    targets = [p[1] for p in pieces]
                    whole = (
                        whole
                        and len(set(targets)) == len(targets)
                        and all(p[4] == 0 and p[3] == min(bt, total - bt * p[1]) for p in pieces)
                    )
            start.append(a)
            count.append(n)
            step.append(lit(rel.step[d]))
            if kept is not None:
                keys[kept] = key
                piece.append(n.copy())
                offset.append(o.copy())
                out.append(extent(dst, kept, key.copy()))
        sliced = call(
            "tensor_slice_strided",
            lit(src.dtype),
            x,
            block_shape(src, sc.cols),
            array(start),
            array(count),
            array(step),
        )
        if whole:
            return self.finish(Row(q, keys, sliced))
        tensor = call("tensor_assemble", lit(dst.dtype), sliced, array(piece), array(offset), array(out))
        return self.finish(Row(q, keys, tensor), group=True)


def read_whole(name: str, alias: exp.TableAlias | None) -> exp.Subquery:
    """``(SELECT * FROM name OFFSET 0) AS alias``: DuckDB pushes no filter past a LIMIT/OFFSET, so it scans a
    registered Arrow table in place and filters after the scan (a filter pushed into the scan would copy
    every blob it passes)."""
    inner = exp.select(exp.Star()).from_(exp.Table(this=ident(name))).offset(0)
    return exp.Subquery(this=inner, alias=alias)


def _within(
    source: exp.Table | exp.Subquery, alias: str, keys: dict[str, exp.Expression], rel: T.Restrict
) -> exp.Subquery:
    """``(SELECT * FROM source WHERE key BETWEEN first AND last ...) AS alias``: the filter sits right on the
    source, where DuckDB pushes it into the table scan (only the kept rows' blocks are read) before any
    volatile projection (``_pin``) could stop it."""
    q = exp.select(exp.Star()).from_(source)
    for k, lo, hi in rel.ranges:
        q = q.where(exp.Between(this=keys[k].copy(), low=lit(lo), high=lit(hi)), copy=False)
    return exp.Subquery(this=q, alias=exp.TableAlias(this=ident(alias)))


#: the target-key columns a repartition adds to its source rows (never a key label: those are k0, k1, ...)
_RANGE_COL = "__ts_r"


def _source_span(src: T.Schema, lab: str) -> tuple[exp.Expression, exp.Expression]:
    """[first, end) element, along ``lab``, of the source row's block (alias "c")."""
    ck, bs = col("c", lab), src.blocks[lab]
    lo = exp.Mul(this=ck.copy(), expression=lit(bs))
    after = exp.Paren(this=exp.Add(this=ck.copy(), expression=lit(1)))
    hi = call("least", exp.Mul(this=after, expression=lit(bs)), lit(src.sizes[lab]))
    return lo, hi


def program(rel: T.Fused) -> str:
    """The kernel program of a fused contraction tree: 'i,j:spec' per step, ';'-separated (a string
    argument of ``tensor_einsum_path``, not SQL)."""
    return ";".join(f"{i},{j}:{spec(x, y, z)}" for i, j, x, y, z in rel.steps)


def _nested_steps(rel: T.Fused, blocks: list[exp.Expression]) -> exp.Expression:
    """A fused tree as nested ``tensor_einsum`` calls, one per step (each step's result is read once: a tree).
    Step labels are the step's own, so each operand carries its shape positionally."""
    operands: list[tuple[exp.Expression, tuple[int, ...]]] = [
        (block, tuple(child.schema.sizes[k] for k in child.schema.blob))
        for block, child in zip(blocks, rel.children, strict=True)
    ]
    dtype = lit(rel.schema.dtype)
    for i, j, x, y, z in rel.steps:
        (a, shape_a), (b, shape_b) = operands[i], operands[j]
        size = dict(zip(x, shape_a, strict=True)) | dict(zip(y, shape_b, strict=True))
        args = (
            lit(spec(x, y, z)),
            lit("multiply"),
            lit("sum"),
            dtype,
            a,
            array([lit(n) for n in shape_a]),
            b,
            array([lit(n) for n in shape_b]),
        )
        operands.append((call("tensor_einsum", *args), tuple(size[lab] for lab in z)))
    return operands[-1][0]


def _fused(rel: T.Aggregate, row: Row) -> bool:
    """Whether an aggregate over a join's row runs as one native aggregate (``tensor_einsum_agg``)."""
    return (
        isinstance(rel.child, T.Join)
        and isinstance(row.tensor, exp.Anonymous)
        and row.tensor.name == "tensor_einsum"
        and rel.child.agg == rel.agg
    )


def _single_pairs(rel: T.Aggregate) -> bool:
    """Whether every group of the aggregate over a join is one joined pair: each label it sums over is one
    block (so is each key of a side it does not keep, and none is repeated)."""
    js = rel.child.schema
    return all(js.blocks[lab] >= js.sizes[lab] for lab in js.keys if lab not in rel.schema.keys)


def _single_rows(rel: T.Aggregate) -> bool:
    """Whether every group of the aggregate is at most one row of a per-block kernel's result (a unary
    einsum, a map, a cast: the kernel checks the block it reads, as the aggregate would): each label it sums
    over is one block (a relation has one row per key), and the aggregate keeps the dtype, so each group's
    block is its one row's block."""
    c = rel.child.schema
    return (
        isinstance(rel.child, T.Unary | T.MapBlocks | T.CastBlocks)
        and c.dtype == rel.schema.dtype
        and all(c.nblocks(lab) == 1 for lab in c.keys if lab not in rel.schema.keys)
    )


def dense_grid(schema: T.Schema, blocks: exp.Expression) -> exp.Select:
    """(k0.., tensor) for every block key of a positional ``schema``'s grid: the block of ``blocks`` (a
    FROM item aliased ``b``, with k0.. and tensor columns) where it has one, else ``tensor_zeros`` of the
    block's extent. The grid of keys is a cross join of ``range`` tables, LEFT JOINed with the blocks."""
    r = len(schema.keys)
    extents = [extent(schema, k, col(f"g{d}", "k")) for d, k in enumerate(schema.keys)]
    zeros = call("tensor_zeros", lit(schema.dtype), array(extents))
    dense = exp.select(
        *[
            exp.alias_(exp.Cast(this=col(f"g{d}", "k"), to=sql_type("INTEGER")), ident(k))
            for d, k in enumerate(schema.keys)
        ],
        exp.alias_(call("coalesce", col("b", "tensor"), zeros), ident("tensor")),
    )
    if r == 0:
        dense = dense.from_(exp.select(exp.alias_(lit(0), ident("one"))).subquery("g"))
    for d, k in enumerate(schema.keys):
        rng = exp.Table(
            this=call("range", lit(0), lit(schema.nblocks(k))),
            alias=exp.TableAlias(this=ident(f"g{d}"), columns=[ident("k")]),
        )
        dense = dense.from_(rng) if d == 0 else dense.join(rng, join_type="cross")
    on = (
        exp.and_(*[exp.EQ(this=col("b", k), expression=col(f"g{d}", "k")) for d, k in enumerate(schema.keys)])
        if r
        else exp.true()
    )
    return dense.join(blocks, on=on, join_type="left")


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
    return exp.Cast(this=lit(key), to=sql_type("BIGINT"))


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
        args = [_sink_key(key), _starts(root.schema, row.keys), *row.tensor.expressions]
        into = exp.alias_(call("tensor_einsum_path_into", *args), written, copy=False)
        return row.source.select(into, copy=False)
    agg = root.child if isinstance(root, T.Positional) else None
    row = b.row(agg.child) if isinstance(agg, T.Aggregate) and isinstance(agg.child, T.Join) else None
    if row is not None and _fused(agg, row):
        args = [_sink_key(key), _starts(agg.schema, row.keys), *row.tensor.expressions]
        js = agg.child.schema
        if all(js.blocks[lab] >= js.sizes[lab] for lab in js.keys if lab not in agg.schema.keys):
            into = exp.alias_(call("tensor_einsum_into", *args), written, copy=False)
            return row.source.select(into, copy=False)
        into = exp.alias_(call("tensor_einsum_agg_into", *args), written, copy=False)
        q = row.source.select(into, copy=False)
        return q.group_by(*[row.keys[k].copy() for k in agg.schema.keys], copy=False)
    s = root.schema
    direct = _row_of(b, root)
    if direct is not None:  # a row-wise root writes each block as it computes it: no CTE in between
        cols = direct.keys
        starts, shape = _starts(s, cols), block_shape(s, cols)
        if isinstance(direct.tensor, exp.Anonymous) and direct.tensor.name == "tensor_einsum":
            # the product goes straight into the caller's array: no result blob, which DuckDB would hold
            # beside the others of its chunk (a chunk has up to 2048 rows, so possibly the whole result)
            args = [_sink_key(key), starts, *[a.copy() for a in direct.tensor.expressions]]
            return direct.source.select(exp.alias_(call("tensor_einsum_into", *args), written), copy=False)
        tensor = call("tensor_sink_write", _sink_key(key), starts, lit(s.dtype), direct.tensor, shape)
        return direct.source.select(exp.alias_(tensor, written, copy=False), copy=False)
    cols = {k: col("c", k) for k in s.keys}
    starts, shape = _starts(s, cols), block_shape(s, cols)
    source = table(b.ref(root), "c")
    tensor = call("tensor_sink_write", _sink_key(key), starts, lit(s.dtype), b.read(root, "c"), shape)
    return exp.select(exp.alias_(tensor, written, copy=False)).from_(source)


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
    root: T.Rel,
    *,
    key: int,
    names: Names | None = None,
    bind: Bind | None = None,
    checks: Checks = False,
    in_place: Callable[[T.Scan], bool] | None = None,
) -> exp.Select:
    """The plan as one statement that writes every result block into the result sink ``key`` (a slot the
    caller points at a C-contiguous array) and returns (blocks, elements) written, for a completeness
    check. ``checks``: check the stored tables it reads (see ``guard``), so every written block has a
    distinct key inside the grid and "elements == size" means every block was written."""
    if len(set(root.schema.blob)) != len(root.schema.blob):
        raise TypeError("a result sink needs one blob label per dimension")
    b = _Builder(root, names, bind, checks, in_place=in_place)
    rows: exp.Query = _sink_rows(b, root, key)
    if not b.ctes and rows.args.get("from_") is None and not rows.args.get("group"):
        # every input inlined and one output block: the row itself is the answer, one row with no FROM (no
        # aggregate to count it, which costs DuckDB as much as the rest of such a statement)
        (written,) = rows.expressions
        return exp.select(exp.alias_(lit(1), ident("blocks")), exp.alias_(written.this, ident("elements")))
    if b.scans:
        rows = exp.union(rows, guard(list(b.scans.values()), [("written", "BIGINT")]), distinct=False)
    w = col("w", "written")
    q = exp.select(
        exp.alias_(exp.Count(this=w), ident("blocks")), exp.alias_(exp.Sum(this=w.copy()), ident("elements"))
    ).from_(exp.Subquery(this=rows, alias=exp.TableAlias(this=ident("w"))))
    for cte_name, cte in b.ctes:
        q = q.with_(ident(cte_name), as_=cte, copy=False)
    return q


def to_multi_sink_ast(
    stages: list[tuple[str, T.Rel, Bind | None]],
    outputs: list[tuple[T.Rel, int, Bind | None]],
    *,
    checks: Checks = False,
    in_place: Callable[[T.Scan], bool] | None = None,
) -> exp.Query:
    """Several plans as one statement (a training step: the forward steps a loss and its gradients share,
    then every output): each stage ``(table, root, bind)`` becomes the MATERIALIZED CTE ``table`` in
    ``k0..``/``tensor`` columns (computed once, however many later plans scan it by that name), and each
    output ``(root, key, bind)`` writes its blocks into result sink ``key`` as ``to_sink_ast`` does. One
    row ``(o, written)`` per block written, ``o`` the output's index, ``written`` its elements, for the
    caller's completeness check (the guard's rows, if any, have a NULL ``o``). The rows are not summed per
    output here: a GROUP BY over the UNION ALL cost DuckDB 0.2-0.3 ms of a ~1.5 ms logistic-regression step.
    ``bind`` renders the array operands of that plan; ``in_place`` as for ``to_ast``."""
    roots = [root for _, root, _ in stages] + [root for root, _, _ in outputs]
    stage_tables = {table.lower() for table, _, _ in stages}
    names = Names(reserved=stage_tables)
    for root in roots:
        names.reserved |= {scan.table.lower() for scan in _scans(root)}
    check = checks if callable(checks) else (lambda _scan: bool(checks))
    b = _Builder(
        roots[0],
        names,
        None,
        lambda scan: scan.table.lower() not in stage_tables and check(scan),
        in_place=in_place,
    )
    b.computed = stage_tables
    for root in roots[1:]:
        b.count(root)
    # reading no stored table (lent arrays only, every block present) no step lacks a row: no padding rows
    # to drop from a stage (the filter cost DuckDB ~10 ms of a transformer block's step)
    dense = all(scan.table.lower() in stage_tables for root in roots for scan in _scans(root))
    for table_name, root, bind in stages:
        keys = tuple(f"k{i}" for i in range(len(root.schema.keys)))
        if root.schema.keys != keys:
            raise PlanError(f"stage {table_name!r} ends in keys {root.schema.keys}, not positional {keys}")
        b.bind = bind or _unbound
        q = exp.select(exp.Star()).from_(exp.Table(this=ident(b.ref(root))))
        if not dense and T.may_pad(root):
            q = q.where(exp.Not(this=exp.Is(this=exp.column("tensor", quoted=True), expression=exp.Null())))
        b.ctes.append((table_name, q))
    o, written = ident("o"), col("w", "written")
    branches: list[exp.Select] = []
    for j, (root, key, bind) in enumerate(outputs):
        if len(set(root.schema.blob)) != len(root.schema.blob):
            raise TypeError("a result sink needs one blob label per dimension")
        b.bind = bind or _unbound
        rows = exp.Subquery(this=_sink_rows(b, root, key), alias=exp.TableAlias(this=ident("w")))
        branches.append(exp.select(exp.alias_(lit(j), o), written.copy()).from_(rows))
    union: exp.Query = branches[0]
    for branch in branches[1:]:
        union = exp.union(union, branch, distinct=False, copy=False)
    if b.scans:
        checked = guard(list(b.scans.values()), [("o", "INTEGER"), ("written", "BIGINT")])
        union = exp.union(union, checked, distinct=False, copy=False)
    for cte_name, cte in b.ctes:
        shared = cte_name.lower() in stage_tables or None
        union = union.with_(ident(cte_name), as_=cte, materialized=shared, copy=False)
    return union


def to_ast(
    root: T.Rel,
    *,
    names: Names | None = None,
    bind: Bind | None = None,
    checks: Checks = False,
    lowering: Lowering = FUSED,
    in_place: Callable[[T.Scan], bool] | None = None,
) -> exp.Query:
    """The whole plan as one statement: a WITH clause of CTEs and a final SELECT (without the padding
    rows a positional join may leave, so results and saved tables hold real blocks only). ``checks``: check
    the stored tables it reads (``checked`` where their blocks are read, ``guard`` for their keys);
    ``in_place``: the stored tables that are registered Arrow tables (``_Builder._whole``)."""
    b = _Builder(root, names, bind, checks, lowering, in_place)
    name = b.ref(root)
    q: exp.Query
    if isinstance(root, T.Scan) and b.check(root):  # the stored table itself: its blocks checked as they pass
        keys = [exp.alias_(col("c", k), ident(k)) for k in root.schema.keys]
        blocks = exp.alias_(b.read(root, "c"), ident("tensor"), copy=False)
        q = exp.select(*keys, blocks).from_(table(name, "c"))
    else:
        q = exp.select(exp.Star()).from_(exp.Table(this=ident(name)))
    if T.may_pad(root):
        q = q.where(
            exp.Not(this=exp.Is(this=exp.column("tensor", quoted=True), expression=exp.Null())), copy=False
        )
    if b.scans:
        columns = [(k, "INTEGER") for k in root.schema.keys] + [("tensor", "BLOB")]
        q = exp.union(q, guard(list(b.scans.values()), columns), distinct=False)
    for cte_name, cte in b.ctes:
        q = q.with_(ident(cte_name), as_=cte, copy=False)
    if lowering.device is not None:
        return cast(exp.Query, on_device(q, lowering.device))
    return q


def sql_text(ast: exp.Expression, pretty: bool = False) -> str:
    return ast.sql(dialect="duckdb", pretty=pretty, normalize_functions=False)
