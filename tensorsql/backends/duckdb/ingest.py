"""Warehouse rows -> tensor relation: the SQL that turns (i0, ..., i{r-1}, value) rows into blocks.

Everything runs inside DuckDB: rows get block keys and a flat in-block index, ``tensor_pack`` builds one
block per key (duplicates summed, COO style), and a LEFT JOIN from the full key grid fills absent blocks
with ``tensor_zeros`` so the relation is dense.
"""

from __future__ import annotations

from sqlglot import exp

from tensorsql.backends.duckdb import sqlgen
from tensorsql.backends.duckdb.sqlgen import call, col, ident, lit
from tensorsql.ir import blocking as B
from tensorsql.ir import tra as T


def _rows(parsed: exp.Query, r: int) -> exp.Select:
    """The user's query with its columns renamed positionally to i0..i{r-1}, v."""
    names = [*(f"i{d}" for d in range(r)), "v"]
    alias = exp.TableAlias(this=ident("q"), columns=[ident(c) for c in names])
    return exp.select(exp.Star()).from_(exp.Subquery(this=parsed.copy(), alias=alias))


def out_of_range(parsed: exp.Query, shape: tuple[int, ...]) -> exp.Select | None:
    """The first row whose coordinates are NULL or outside ``shape`` (None for a 0-d tensor)."""
    if not shape:
        return None
    bad = [
        exp.or_(
            exp.Is(this=col("s", f"i{d}"), expression=exp.Null()),
            exp.LT(this=col("s", f"i{d}"), expression=lit(0)),
            exp.GTE(this=col("s", f"i{d}"), expression=lit(n)),
        )
        for d, n in enumerate(shape)
    ]
    cols = [col("s", f"i{d}") for d in range(len(shape))]
    return exp.select(*cols).from_(_rows(parsed, len(shape)).subquery("s")).where(exp.or_(*bad)).limit(1)


def blocks_from_rows(
    parsed: exp.Query, shape: tuple[int, ...], block_shape: tuple[int, ...], dtype: str
) -> exp.Select:
    """A SELECT of (k0..k{r-1}, tensor) with every block of the grid, built from the query's rows."""
    r = len(shape)
    pos = T.positional(shape, block_shape, dtype)
    # per row: block keys and the flat C-order index inside the (possibly ragged) block
    keyed_cols: list[exp.Expression] = []
    flat: exp.Expression = lit(0)
    for d, b in enumerate(block_shape):
        k = exp.Cast(
            this=exp.IntDiv(this=col("s", f"i{d}"), expression=lit(b)), to=exp.DataType.build("INTEGER")
        )
        keyed_cols.append(exp.alias_(k, ident(f"k{d}")))
        ext = sqlgen.extent(pos, f"k{d}", exp.Paren(this=k.copy()))
        local = exp.Mod(this=col("s", f"i{d}"), expression=lit(b))
        flat = exp.Add(this=exp.Mul(this=exp.Paren(this=flat), expression=ext), expression=local)
    # integers exactly (a uint64 above 2**63 as UBIGINT), never through DOUBLE
    value_type = "UBIGINT" if dtype.startswith("uint") else "BIGINT" if dtype.startswith("int") else "DOUBLE"
    keyed = exp.select(
        *keyed_cols,
        exp.alias_(exp.Cast(this=flat, to=exp.DataType.build("BIGINT")), ident("idx")),
        exp.alias_(
            exp.Cast(this=col("s", "v"), to=exp.DataType.build(value_type, dialect="duckdb")), ident("v")
        ),
    ).from_(_rows(parsed, r).subquery("s"))
    numel: exp.Expression = lit(1)
    for d in range(r):
        numel = exp.Mul(this=numel, expression=sqlgen.extent(pos, f"k{d}", col("p", f"k{d}")))
    pack = call(
        "tensor_pack",
        lit(dtype),
        col("p", "idx"),
        col("p", "v"),
        exp.Cast(this=numel, to=exp.DataType.build("BIGINT")),
    )
    packed = (
        exp.select(*[col("p", f"k{d}") for d in range(r)], exp.alias_(pack, ident("tensor")))
        .from_(keyed.subquery("p"))
        .group_by(*[col("p", f"k{d}") for d in range(r)])
    )
    # densify: every block key of the grid, a zero block where no row fell
    zeros = call(
        "tensor_zeros",
        lit(dtype),
        sqlgen.array([sqlgen.extent(pos, f"k{d}", col(f"g{d}", "k")) for d in range(r)]),
    )
    dense = exp.select(
        *[
            exp.alias_(exp.Cast(this=col(f"g{d}", "k"), to=exp.DataType.build("INTEGER")), ident(f"k{d}"))
            for d in range(r)
        ],
        exp.alias_(call("coalesce", col("b", "tensor"), zeros), ident("tensor")),
    )
    if r == 0:
        dense = dense.from_(exp.select(exp.alias_(lit(0), ident("one"))).subquery("g"))
    for d, n in enumerate(B.grid(shape, block_shape)):
        rng = exp.Table(
            this=call("range", lit(0), lit(n)),
            alias=exp.TableAlias(this=ident(f"g{d}"), columns=[ident("k")]),
        )
        dense = dense.from_(rng) if d == 0 else dense.join(rng, join_type="cross")
    on = (
        exp.and_(*[exp.EQ(this=col("b", f"k{d}"), expression=col(f"g{d}", "k")) for d in range(r)])
        if r
        else exp.true()
    )
    return dense.join(packed.subquery("b"), on=on, join_type="left")
