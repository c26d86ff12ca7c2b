"""stored tables edited behind tensorsql's back, and from_sql's rules.

Every read of a stored table checks it inside its own query: a key that is NULL, outside the block grid or
repeated, or a blob whose length does not fit its block, raises CorruptTableError naming the table and the
key, on every path (numpy through a result sink or Arrow, to_arrow, einsum under every strategy, save,
reblock, the small-call path). Absent keys stay legitimate: zeros.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql.backends import arrow as B
from tensorsql.compile.planning import STRATEGIES

#: (what the edit does, SQL applied to table {t} stored as 5x7 in 2x3 blocks (grid 3x3, ragged edges),
#: the key and words the error must name)
EDITS = {
    "duplicate_and_missing": (
        'UPDATE {t} SET k0 = 0 WHERE k0 = 1 AND k1 = 2',
        r"\[0, 2\] appears 2 times",
    ),
    "negative_key": ('UPDATE {t} SET k1 = -1 WHERE k0 = 2 AND k1 = 1', r"\[2, -1\] lies outside"),
    "key_outside_the_grid": (
        "UPDATE {t} SET k0 = 3 WHERE k0 = 2 AND k1 = 0",
        r"\[3, 0\] lies outside its block grid \[3, 3\] \(shape \[5, 7\] in blocks of \[2, 3\]\)",
    ),
    "null_key": ("UPDATE {t} SET k0 = NULL WHERE k0 = 1 AND k1 = 1", r"\[NULL, 1\] has a NULL key column"),
    "truncated_blob": (
        "UPDATE {t} SET tensor = tensor[1:8] WHERE k0 = 0 AND k1 = 1",
        r"\[0, 1\] has 8 bytes but its block shape \[2, 3\] of float64 needs 48",
    ),
    # a ragged edge block (1x1 at key [2, 2]) given a full 2x3 block's bytes
    "ragged_edge_blob": (
        "UPDATE {t} SET tensor = (SELECT tensor FROM {t} WHERE k0 = 0 AND k1 = 0) WHERE k0 = 2 AND k1 = 2",
        r"\[2, 2\] has 48 bytes but its block shape \[1, 1\] of float64 needs 8",
    ),
}

X = np.arange(35, dtype=np.float64).reshape(5, 7) + 1
W = np.linspace(-1.0, 1.0, 7 * 4).reshape(7, 4)


def _corrupt(s: ts.Session, name: str, edit: str) -> ts.TensorRelation:
    s.from_numpy(X, block_shape=(2, 3)).save(name, replace=True)
    s.execute(EDITS[edit][0].format(t=f'"{name}"'))
    return s.table(name)


def _raises(edit: str, name: str):
    return pytest.raises(ts.CorruptTableError, match=rf"'{name}': block key {EDITS[edit][1]}")


@pytest.fixture(params=[True, False], ids=["sink", "arrow"])
def path(request, s):
    """Results through the result sink, or through Arrow (TENSORSQL_RESULT_SINK=0)."""
    before = s.result_sink
    s.result_sink = request.param
    yield request.param
    s.result_sink = before


@pytest.mark.parametrize("edit", sorted(EDITS))
def test_reading_a_corrupted_table_raises(s, edit, path):
    rel = _corrupt(s, "edited", edit)
    with _raises(edit, "edited"):
        rel.numpy()
    with _raises(edit, "edited"):
        rel.to_arrow()
    with _raises(edit, "edited"):
        rel.reblock((3, 2)).numpy()
    with _raises(edit, "edited"):
        ts.relu(rel).numpy()
    with _raises(edit, "edited"):
        s.einsum("ij,jk->ik", rel, W).save("derived", replace=True)
    assert "derived" not in s.tables()  # nothing saved, no catalog entry
    with _raises(edit, "edited"):
        s.einsum("ij,jk->ik", rel, W).materialize()


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("edit", sorted(EDITS))
def test_an_einsum_over_a_corrupted_table_raises_under_every_strategy(s, edit, strategy, path):
    rel = _corrupt(s, "edited_in", edit)
    for spec, ops in (("ij,jk->ik", (rel, W)), ("ij,kj->ik", (rel, rel)), ("ij->j", (rel,))):
        with _raises(edit, "edited_in"):
            s.einsum(spec, *ops, strategy=strategy).numpy()
        with _raises(edit, "edited_in"):
            s.einsum(spec, *ops, strategy=strategy).to_arrow()


def test_one_block_tables_are_checked_side_by_side_and_fused(s):
    """Single-block tables read side by side (a positional scan) or in a fused tree are checked too."""
    a, b, c = np.ones((4, 5)), np.ones((5, 3)), np.ones((3, 2))
    for name, x in (("one_a", a), ("one_b", b), ("one_c", c)):
        s.from_numpy(x).save(name, replace=True)
    s.execute('INSERT INTO "one_b" SELECT * FROM "one_b"')
    ra, rb, rc = s.table("one_a"), s.table("one_b"), s.table("one_c")
    for rel in (s.einsum("ij,jk->ik", ra, rb, strategy="none"), s.einsum("ij,jk,kl->il", ra, rb, rc)):
        with pytest.raises(ts.CorruptTableError, match=r"'one_b': block key \[0, 0\] appears 2 times"):
            rel.numpy()


def test_a_corrupted_0d_table_raises(s):
    s.from_numpy(np.float64(2.5)).save("scalar", replace=True)
    s.execute('INSERT INTO "scalar" SELECT * FROM "scalar"')
    with pytest.raises(ts.CorruptTableError, match=r"'scalar': block appears 2 times"):
        s.table("scalar").numpy()
    s.execute('DELETE FROM "scalar"')
    s.from_numpy(np.float64(2.5)).save("scalar", replace=True)
    s.execute("UPDATE \"scalar\" SET tensor = '\\x00'::BLOB")
    with pytest.raises(ts.CorruptTableError, match=r"'scalar': block has 1 bytes but"):
        s.einsum(",ij->ij", s.table("scalar"), np.ones((2, 2))).numpy()


def test_an_arrow_table_with_repeated_keys_is_caught(s):
    table = s.from_numpy(X, block_shape=(5, 4)).to_arrow()
    twice = pa.concat_tables([table, table.slice(0, 1)]).replace_schema_metadata(table.schema.metadata)
    with pytest.raises(ts.CorruptTableError, match=r"block key \[0, 0\] appears 2 times"):
        s.from_arrow(twice)  # an Arrow table cannot change: checked once, when it is registered


def test_from_arrow_checks_the_table_once_when_registered(s):
    """A registered Arrow table cannot change, so it is checked whole by from_arrow, and the queries that
    read it skip the checks (as they do for from_numpy's own views)."""
    table = s.from_numpy(X, block_shape=(2, 3)).to_arrow()
    meta = table.schema.metadata

    def edited(column: str, values: list) -> pa.Table:
        typ = pa.binary() if column == "tensor" else pa.int32()
        changed = table.set_column(table.column_names.index(column), column, pa.array(values, typ))
        return changed.replace_schema_metadata(meta)

    keys0 = table.column("k0").to_pylist()
    blobs = table.column("tensor").to_pylist()
    bad = {
        r"block key \[NULL, 0\] has a NULL key column": edited("k0", [None, *keys0[1:]]),
        r"block key \[7, 0\] lies outside its block grid \[3, 3\]": edited("k0", [7, *keys0[1:]]),
        r"\[0, 0\] has 8 bytes but its block needs 48": edited("tensor", [blobs[0][:8], *blobs[1:]]),
    }
    for match, arrow_table in bad.items():
        with pytest.raises(ts.CorruptTableError, match=match):
            s.from_arrow(arrow_table)
    sparse = s.from_arrow(edited("tensor", [None, *blobs[1:]]))  # a NULL block is absent: zeros
    want = X.copy()
    want[:2, :3] = 0
    np.testing.assert_array_equal(sparse.numpy(), want)
    assert "corrupted stored table" not in s.einsum("ij,jk->ik", sparse, W).sql()


def test_a_table_edited_between_reads_is_caught_by_the_next_read(s):
    """The checks are part of the statement (prepared from its second run on, and the small-call path):
    each run checks the table as it is then."""
    s.from_numpy(W, block_shape=(4, 4)).save("weights", replace=True)
    x_in = s.placeholder((3, 7), "float64")
    step = s.compile(s.einsum("ij,jk->ik", x_in, s.table("weights")), [x_in])
    rel = s.einsum("ij,jk->ik", s.table("weights").reblock((7, 2)), np.ones((4, 2)))
    x = np.ones((3, 7))
    for _ in range(3):
        assert_einsum_close(step(x), "ij,jk->ik", x, W)
        assert_einsum_close(rel.numpy(), "ij,jk->ik", W, np.ones((4, 2)))
    assert s.executor.fast(step._plans[0]) is not None  # the small-call path
    s.execute('UPDATE "weights" SET k0 = 0 WHERE k0 = 1 AND k1 = 0')
    for _ in range(2):
        with pytest.raises(ts.CorruptTableError, match=r"'weights': block key \[0, 0\] appears 2 times"):
            step(x)
        with pytest.raises(ts.CorruptTableError, match=r"'weights': block key \[0, 0\] appears 2 times"):
            rel.numpy()
    s.from_numpy(W, block_shape=(4, 4)).save("weights", replace=True)  # repaired: reads work again
    assert_einsum_close(step(x), "ij,jk->ik", x, W)
    assert_einsum_close(rel.numpy(), "ij,jk->ik", W, np.ones((4, 2)))


def test_absent_blocks_are_zeros_on_every_path(s, path):
    """A sparse stored table (keys missing) is legitimate: its absent blocks are zeros, never memory left
    uninitialised, whichever path the result takes."""
    s.from_numpy(X, block_shape=(2, 3)).save("sparse", replace=True)
    s.execute('DELETE FROM "sparse" WHERE (k0 = 1 AND k1 = 2) OR (k0 = 2 AND k1 = 0)')
    dense = X.copy()
    dense[2:4, 6:7] = 0
    dense[4:5, 0:3] = 0
    for _ in range(3):  # fresh results each time: a missing block must not show an earlier result's bytes
        rel = s.table("sparse")
        np.testing.assert_array_equal(rel.numpy(), dense)
        np.testing.assert_array_equal(B.assemble(rel.to_arrow(), (5, 7), (2, 3), "float64"), dense)
        for strategy in STRATEGIES:
            got = s.einsum("ij,jk->ik", rel, W, strategy=strategy).numpy()
            assert_einsum_close(got, "ij,jk->ik", dense, W)


def test_assemble_checks_keys_before_trusting_the_row_count():
    """A table with one key twice and another missing has as many rows as blocks: assemble must not take it
    for complete (and leave the missing block uninitialised)."""
    x = np.arange(12.0).reshape(4, 3)

    def table(keys, blobs):
        cols = {f"k{d}": pa.array([k[d] for k in keys], pa.int32()) for d in range(2)}
        return pa.table({**cols, "tensor": pa.array(blobs, pa.binary())})

    top, bottom = x[:2].tobytes(), x[2:].tobytes()
    with pytest.raises(ts.ShapeError, match=r"block key \(0, 0\) appears 2 times"):
        B.assemble(table([(0, 0), (0, 0)], [top, bottom]), (4, 3), (2, 3), "float64")
    with pytest.raises(ts.ShapeError, match=r"block key \(-1, 0\) lies outside"):
        B.assemble(table([(0, 0), (-1, 0)], [top, bottom]), (4, 3), (2, 3), "float64")
    nulls = pa.table(
        {
            "k0": pa.array([0, None], pa.int32()),
            "k1": pa.array([0, None], pa.int32()),
            "tensor": pa.array([top, bottom], pa.binary()),
        }
    )
    with pytest.raises(ts.ShapeError, match="NULL key k0"):
        B.assemble(nulls, (4, 3), (2, 3), "float64")
    padded = nulls.set_column(2, "tensor", pa.array([top, None], pa.binary()))  # a padding row: no block
    np.testing.assert_array_equal(B.assemble(padded, (4, 3), (2, 3), "float64"), np.where(x < 6, x, 0.0))


# -- from_sql ----------------------------------------------------------------------------------------------


def test_from_sql_runs_a_volatile_query_once(s):
    """The query runs once: a sequence advances by its row count, and the result is what that one run gave
    (a second run, as the range check used to make, would see 6..11 and drop every row)."""
    s.execute("CREATE OR REPLACE SEQUENCE coords_seq")
    query = "SELECT nextval('coords_seq') - 1 AS i, 1.0 AS v FROM range(6)"
    rel = s.from_sql(query, shape=(6,), block_shape=(4,))
    np.testing.assert_array_equal(rel.numpy(), np.ones(6))
    assert s.execute("SELECT currval('coords_seq')") == [(6,)]
    s.execute("CREATE OR REPLACE SEQUENCE coords_seq")
    with pytest.raises(ts.ShapeError, match=r"the row with coordinates \(3\) lies outside shape \(3,\)"):
        s.from_sql("SELECT nextval('coords_seq') - 1 AS i, 1 AS v FROM range(4)", shape=(3,))
    # random coordinates: every row is counted once, none dropped
    got = s.from_sql(
        "SELECT CAST(floor(random() * 4) AS INTEGER) AS i, 1 AS v FROM range(1000)", shape=(4,), dtype="int64"
    )
    assert got.numpy().sum() == 1000


def test_from_sql_rejects_bad_coordinates_naming_the_row(s):
    s.execute("CREATE OR REPLACE TABLE coo3 (r DOUBLE, c DECIMAL(6, 2), v DOUBLE)")
    s.execute("INSERT INTO coo3 VALUES (0, 1, 1.0), (1.0, 2.00, 2.0), (2, 0, 3.0)")
    rel = s.from_sql("SELECT * FROM coo3", shape=(3, 3))  # integral values of fractional types are fine
    np.testing.assert_array_equal(rel.numpy(), [[0, 1, 0], [0, 0, 2], [3, 0, 0]])
    cases = {  # a row of coo3 -> the error naming it
        "(0.6, 0, 9.0)": r"coordinates \(0\.6, 0\.00\) has a non-integral coordinate i0 = 0\.6",
        "(0, 1.5, 9.0)": r"coordinates \(0\.0, 1\.50\) has a non-integral coordinate i1 = 1\.50",
        "(NULL, 1, 9.0)": r"coordinates \(NULL, 1\.00\) has a NULL coordinate i0",
        "(-1, 1, 9.0)": r"coordinates \(-1\.0, 1\.00\) lies outside shape \(3, 3\)",
        "('inf', 1, 9.0)": r"coordinates \(inf, 1\.00\) lies outside shape \(3, 3\)",
    }
    for row, match in cases.items():
        s.execute("DELETE FROM coo3 WHERE v = 9.0")
        s.execute(f"INSERT INTO coo3 VALUES {row}")
        with pytest.raises(ts.ShapeError, match=match):
            s.from_sql("SELECT * FROM coo3", shape=(3, 3))


@pytest.mark.parametrize(
    ("value", "dtype", "error", "match"),
    [
        ("300", "int8", ts.RangeError, r"\(1\) has value 300 which lies outside the range of int8 \[-128"),
        ("-1", "uint64", ts.RangeError, r"value -1 which lies outside the range of uint64"),
        ("2::HUGEINT ** 63", "int64", ts.RangeError, r"lies outside the range of int64"),
        ("65536.0", "uint16", ts.RangeError, r"value 65536\.0 which lies outside the range of uint16"),
        ("2.5", "int32", ts.CastingError, r"value 2\.5 which is not an integer: the tensor's dtype is int32"),
        ("'inf'::DOUBLE", "int16", ts.RangeError, r"value inf which lies outside the range of int16"),
    ],
)
def test_from_sql_refuses_values_the_dtype_cannot_hold(s, value, dtype, error, match):
    """int8 300 came back as 44 and a negative uint64 raised an untyped error: never wrapped or rounded."""
    with pytest.raises(error, match=match):
        s.from_sql(f"SELECT 1 AS i, {value} AS v", shape=(3,), dtype=dtype)


def test_from_sql_keeps_every_value_the_dtype_holds(s):
    for dtype in ("int8", "uint8", "int64", "uint64"):
        info = np.iinfo(dtype)
        query = f"SELECT 0 AS i, {int(info.min)}::HUGEINT AS v UNION ALL SELECT 1, {int(info.max)}::HUGEINT"
        got = s.from_sql(query, shape=(3,), dtype=dtype).numpy()
        np.testing.assert_array_equal(got, np.array([info.min, info.max, 0], dtype=dtype))
    exact = s.from_sql("SELECT 0 AS i, 3.0 AS v", shape=(1,), dtype="int16").numpy()
    np.testing.assert_array_equal(exact, np.array([3], np.int16))


def test_from_sql_rejects_non_numeric_columns(s):
    with pytest.raises(ts.DTypeError, match=r"column 'i' \(coordinate i0\) has type VARCHAR"):
        s.from_sql("SELECT '1' AS i, 1.0 AS v", shape=(3,))
    with pytest.raises(ts.DTypeError, match=r"column 'v' \(the value\) has type DATE"):
        s.from_sql("SELECT 1 AS i, DATE '2020-01-01' AS v", shape=(3,))
    flags = s.from_sql("SELECT i, i % 2 = 0 AS v FROM range(4) t(i)", shape=(4,))  # a BOOLEAN value is 0/1
    np.testing.assert_array_equal(flags.numpy(), [1, 0, 1, 0])


def test_from_sql_parse_errors_are_typed(s):
    for query in ("SELECT 1 AS i, 2.0 AS v /* never closed", "SELECT 'unterminated", "SELECT 1; SELECT 2"):
        with pytest.raises(ts.SQLExecutionError, match="from_sql"):
            s.from_sql(query, shape=(3,))


def test_from_sql_sums_duplicate_coordinates(s):
    rel = s.from_sql("SELECT i % 3 AS a, i % 2 AS b, i AS v FROM range(10) t(i)", shape=(3, 2), dtype="int64")
    np.testing.assert_array_equal(rel.numpy(), [[6, 12], [4, 8], [10, 5]])


def test_tables_named_like_generated_ctes_are_read(s):
    """A stored table named like a CTE of the generated statement ('t0', 'T1') is read, not hidden by the CTE
    (DuckDB resolves names case-insensitively)."""
    rng = np.random.default_rng(3)
    a, b, c = rng.standard_normal((6, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 3))
    s.from_numpy(a, block_shape=(3, 2)).save("t0", replace=True)
    s.from_numpy(b, block_shape=(2, 5)).save("T1", replace=True)
    s.from_numpy(c, block_shape=(5, 3)).save("t2", replace=True)
    for strategy in STRATEGIES:
        rel = s.einsum("ij,jk,kl->il", s.table("t0"), s.table("T1"), s.table("t2"), strategy=strategy)
        assert_einsum_close(rel.numpy(), "ij,jk,kl->il", a, b, c)


def test_from_arrow_refuses_key_columns_that_are_not_integers(s):
    t = s.from_numpy(np.ones((4, 4)), block_shape=(2, 2)).to_arrow()
    for keys in (pa.array(["0", "0", "1", "1"]), pa.array([0.5, 0.0, 1.0, 1.0])):
        bad = t.set_column(0, "k0", keys).replace_schema_metadata(t.schema.metadata)
        with pytest.raises(ts.CorruptTableError, match=r"key column 'k0' has type .*, not an integer type"):
            s.from_arrow(bad)


@pytest.mark.parametrize("kind", [pa.uint64(), pa.uint32(), pa.int64(), pa.int8()])
def test_from_arrow_takes_any_integer_key_type(s, kind):
    """Keys are INTEGER like every tensor table's: a uint64 key column was bound as HUGEINT, which numpy(),
    save() and @ then failed on."""
    x = np.arange(12.0).reshape(4, 3)
    t = s.from_numpy(x, block_shape=(1, 3)).to_arrow()
    rel = s.from_arrow(t.set_column(0, "k0", t.column("k0").cast(kind)))
    np.testing.assert_array_equal(rel.numpy(), x)
    np.testing.assert_array_equal((rel @ np.ones(3)).numpy(), x.sum(1))
    rel.save("uint_keys", replace=True)
    np.testing.assert_array_equal(s.table("uint_keys").numpy(), x)


def test_from_arrow_refuses_a_uint64_key_past_int64(s):
    t = s.from_numpy(np.ones((2, 3)), block_shape=(1, 3)).to_arrow()
    huge = t.set_column(0, "k0", pa.array([2**63 + 5, 0], pa.uint64()))
    with pytest.raises(ts.CorruptTableError, match=r"\[9223372036854775813, 0\] lies outside its block grid"):
        s.from_arrow(huge)


@pytest.mark.parametrize(
    ("edit", "match"),
    [
        ("UPDATE \"{t}\" SET tensor = tensor_from_list([10, 11, 12, 13], 'float64') WHERE k0 = 0", "0, 0"),
        ("UPDATE \"{t}\" SET tensor = tensor_from_list([10], 'float64') WHERE k0 = 0", "0, 0"),
    ],
    ids=["long_blob", "short_blob"],
)
def test_a_wrong_length_blob_read_without_a_kernel_given_its_shape_raises(s, edit, match):
    """A stored blob of the wrong length passed unchecked where no kernel is given the block's shape: the
    cells of ``tensor_cells(A)`` (dense), of a map or cast over A, ``to_rows()``, and ``map(...).save()``
    came out under other keys or copied it on. Each now raises naming the table and key;
    the stored macro ``tensor_cells('A')`` too, and for a key outside the grid or repeated."""
    t = f"wl_{abs(hash(edit)) % 10**6}"
    s.from_numpy(np.arange(4.0).reshape(2, 2), block_shape=(1, 2)).save(t)
    s.executor.con.execute(edit.format(t=t))
    reads = {
        "cells": lambda: s.sql(f'SELECT * FROM tensor_cells("{t}")').fetchall(),
        "cells of a map": lambda: s.sql(f"SELECT * FROM tensor_cells(tensor_map(\"{t}\", 'neg'))").fetchall(),
        "macro": lambda: s.sql(f"SELECT * FROM tensor_cells('{t}')").fetchall(),
        "to_rows": lambda: s.table(t).to_rows(),
        "map numpy": lambda: s.map(s.table(t), "neg").numpy(),
        "cast numpy": lambda: s.table(t).astype("float32").numpy(),
        "map save": lambda: s.map(s.table(t), "neg").save(f"{t}_neg"),
    }
    for what, read in reads.items():
        with pytest.raises(Exception, match=rf"corrupted stored table .*{t}.*{match}") as info:
            read()
        assert info.type.__name__ in ("CorruptTableError", "InvalidInputException", "SQLExecutionError"), what
    assert f"{t}_neg" not in s.tables()


def test_the_stored_macro_refuses_keys_outside_the_grid_or_twice_and_reads_the_current_schema(s):
    s.from_numpy(np.arange(6.0).reshape(2, 3), block_shape=(1, 3)).save("mk")
    assert len(s.sql("SELECT * FROM tensor_cells('mk')").fetchall()) == 6
    s.executor.con.execute('UPDATE "mk" SET k0 = 0 WHERE k0 = 1')
    with pytest.raises(Exception, match=r"corrupted stored table mk: block key \[0, 0\] lies outside"):
        s.sql("SELECT * FROM tensor_cells('mk')").fetchall()
    s.executor.con.execute('UPDATE "mk" SET k0 = 5 WHERE rowid = (SELECT min(rowid) FROM "mk")')
    with pytest.raises(Exception, match=r"block key \[5, 0\] lies outside its block grid"):
        s.sql("SELECT * FROM tensor_cells('mk')").fetchall()
    s.executor.con.execute('UPDATE "mk" SET k0 = 1 WHERE k0 = 5')
    s.sql("CREATE SCHEMA other")
    sevens = "tensor_from_list([7, 7, 7], 'float64')"
    s.sql(f'CREATE TABLE other."mk" AS SELECT k0, k1, {sevens} AS tensor FROM main."mk"')
    s.sql("USE other")
    try:  # main's catalog was read for other's plain table: its 7s came out as the tensor's cells
        with pytest.raises(Exception, match="tensorsql_catalog does not exist"):
            s.sql("SELECT * FROM tensor_cells('mk')").fetchall()
    finally:
        s.sql("USE main")
    assert sorted(v for _, v in s.sql("SELECT * FROM tensor_cells('mk')").fetchall()) == [0, 1, 2, 3, 4, 5]
