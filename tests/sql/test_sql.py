"""SQL with tensor table functions (``Session.sql``): every shared equation written as SQL over tensor tables
against numpy; nesting, joins with plain tables, CREATE TABLE AS and the catalog, EXPLAIN, rows in and out,
and a typed error for every bad statement."""

from __future__ import annotations

import re

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from equations import EQUATIONS
from test_einsum_numpy import make_operands
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql import ml
from tensorsql.frontend import sql as sqlfront


@pytest.fixture(scope="module")
def db():
    with ts.connect() as s:
        yield s


def dense(rows: list[tuple], shape: tuple[int, ...]) -> np.ndarray:
    """A tensor from its ``tensor_cells`` rows, every cell present once."""
    out = np.full(shape, np.nan)
    seen = np.zeros(shape, dtype=int)
    for *index, value in rows:
        out[tuple(index)] = value
        seen[tuple(index)] += 1
    assert (seen == 1).all(), "every cell exactly once"
    return out


def _names(case_id: str, n: int) -> list[str]:
    return [f"eq_{case_id}_{i}".replace("-", "_").replace(".", "_") for i in range(n)]


@pytest.mark.parametrize("case", EQUATIONS, ids=lambda c: c.id)
def test_every_equation_as_sql_matches_numpy(db, case):
    ops = make_operands(case.shapes, np.float64, case.id, "sql")
    names = _names(case.id, len(ops))
    for name, o in zip(names, ops, strict=True):
        blocks = tuple(min(3, max(d, 1)) for d in o.shape)
        db.save(db.from_numpy(o, block_shape=blocks), name, replace=True)
    operands = ", ".join(f'"{n}"' for n in names)
    want = np.einsum(case.subscripts, *ops)
    rows = db.sql(f"SELECT * FROM tensor_cells(einsum('{case.subscripts}', {operands}))").fetchall()
    assert_einsum_close(dense(rows, np.shape(want)), case.subscripts, *ops)


@pytest.fixture(scope="module")
def ab(db):
    rng = np.random.default_rng(15)
    a, b = rng.standard_normal((7, 5)), rng.standard_normal((5, 6))
    db.save(db.from_numpy(a, block_shape=(3, 2)), "A", replace=True)
    db.save(db.from_numpy(b, block_shape=(2, 4)), "B", replace=True)
    return a, b


def cells(db, sql: str, shape: tuple[int, ...]) -> np.ndarray:
    return dense(db.sql(sql).fetchall(), shape)


def test_einsum_returns_block_rows_like_a_tensor_table(db, ab):
    _a, _b = ab
    got = db.sql("SELECT * FROM einsum('ij,jk->ik', A, B) ORDER BY k0, k1")
    assert got.columns == ["k0", "k1", "tensor"]
    table = got.to_arrow_table()
    assert table.num_rows >= 1 and table.schema.field("tensor").type == pa.binary()


def test_a_statement_looks_its_tables_up_together(db, ab, monkeypatch):
    """One catalog lookup per statement, not per operand; a table named twice is one operand node (its
    blocks read once by the plan); a name that is not a tensor table still gets its own error."""
    a, _b = ab
    catalog = db.executor.catalog
    calls = []
    monkeypatch.setattr(catalog, "get", lambda name: calls.append(name) or pytest.fail("per-table lookup"))
    real = catalog.get_many
    monkeypatch.setattr(catalog, "get_many", lambda names: calls.append(tuple(names)) or real(names))
    sql = "SELECT * FROM tensor_cells(einsum('ij,jk->ik', einsum('ij,kj->ik', A, A), (SELECT * FROM a)))"
    bound = np.abs(a) @ np.abs(a).T @ np.abs(a)  # the magnitudes summed: a bound on the rounding
    np.testing.assert_allclose(cells(db, sql, (7, 5)), a @ a.T @ a, rtol=0, atol=1e-13 * bound.max())
    assert len(calls) == 1 and sorted(calls[0]) == ["A", "A", "a"]
    monkeypatch.undo()
    with pytest.raises(ts.TableNotFoundError, match=r"operand 1 'nope' is not a tensor table"):
        db.sql("SELECT * FROM einsum('ij,jk->ik', A, nope)")


def test_nested_calls_and_subqueries_are_one_graph(db, ab):
    a, b = ab
    sql = (
        "SELECT * FROM tensor_cells(einsum('ij,jk->ik', einsum('ij->ji', einsum('ij->ji', A)), "
        "(SELECT * FROM B)))"
    )
    np.testing.assert_allclose(cells(db, sql, (7, 6)), a @ b, rtol=1e-12, atol=1e-12)
    (_, rel), *_ = sqlfront.rewrite(db, sql).calls
    assert sum(1 for line in rel.explain().splitlines() if "EinSum" in line) >= 2


def test_extended_einsum_arguments(db, ab):
    a, b = ab
    sql = (
        "SELECT * FROM tensor_cells(einsum('ij,jk->ik', A, B, join => 'add', agg => 'max', "
        "strategy => 'sqrt'))"
    )
    np.testing.assert_allclose(cells(db, sql, (7, 6)), (a[:, :, None] + b[None]).max(1), rtol=1e-12)


def test_maps_and_softmax(db, ab):
    a, _ = ab
    np.testing.assert_allclose(
        cells(db, "SELECT * FROM tensor_cells(tensor_map(A, 'exp'))", a.shape), np.exp(a)
    )
    got = cells(db, "SELECT * FROM tensor_cells(tensor_map(A, fn => 'scale', param => -2.5))", a.shape)
    np.testing.assert_allclose(got, -2.5 * a)
    got = cells(db, "SELECT * FROM tensor_cells(softmax(A, over => 1))", a.shape)
    np.testing.assert_allclose(got, np.exp(a) / np.exp(a).sum(1, keepdims=True), rtol=1e-12)
    got = cells(db, "SELECT * FROM tensor_cells(softmax(A, over => [0, 1]))", a.shape)
    np.testing.assert_allclose(got, np.exp(a) / np.exp(a).sum(), rtol=1e-12)


def test_results_join_with_plain_tables(db, ab):
    a, _ = ab
    db.sql("CREATE OR REPLACE TABLE weights AS SELECT range AS id, 1.0 + range AS w FROM range(7)")
    rows = db.sql(
        "SELECT c.i0, c.value * w.w AS v FROM tensor_cells(einsum('ij->i', A)) AS c "
        "JOIN weights AS w ON w.id = c.i0 ORDER BY c.i0"
    ).fetchall()
    np.testing.assert_allclose([v for _, v in rows], a.sum(1) * (1.0 + np.arange(7)), rtol=1e-12)


def test_skip_zeros_and_the_python_twin(db):
    x = np.array([[0.0, 1.5, 0.0], [2.0, 0.0, -3.0]])
    db.save(db.from_numpy(x, block_shape=(1, 2)), "sparse", replace=True)
    rows = sorted(db.sql("SELECT * FROM tensor_cells(sparse, skip_zeros => true)").fetchall())
    assert rows == [(0, 1, 1.5), (1, 0, 2.0), (1, 2, -3.0)]
    python = db.table("sparse").to_rows(skip_zeros=True).to_pydict()
    assert sorted(zip(*python.values(), strict=True)) == rows
    assert db.table("sparse").to_rows().num_rows == 6
    assert db.einsum("ij->ji", x).to_rows(skip_zeros=True).num_rows == 3  # arrays bound: computed first


def test_integer_cells_keep_their_values(db):
    big = np.array([2**62 + 1, -(2**62) - 3], dtype=np.int64)
    db.save(db.from_numpy(big), "ints", replace=True)
    assert sorted(db.sql("SELECT * FROM tensor_cells(ints)").fetchall()) == [
        (0, 2**62 + 1),
        (1, -(2**62) - 3),
    ]


def test_tensor_from_cells_round_trip(db, ab):
    a, _ = ab
    sql = (
        "SELECT * FROM tensor_cells(tensor_from_cells((SELECT i0, i1, value FROM tensor_cells(A)), "
        "shape => [7, 5], block_shape => [4, 4], dtype => 'float32'))"
    )
    np.testing.assert_allclose(cells(db, sql, (7, 5)), a.astype(np.float32), rtol=0)


def test_create_table_as_registers_a_tensor(db, ab):
    a, b = ab
    assert db.sql("CREATE TABLE prod AS SELECT * FROM einsum('ij,jk->ik', A, B)") is None
    np.testing.assert_allclose(db.table("prod").numpy(), a @ b, rtol=1e-12)
    np.testing.assert_allclose(db.einsum("ik->ki", db.table("prod")).numpy(), (a @ b).T, rtol=1e-12)
    with pytest.raises(ts.CatalogError, match="already exists"):
        db.sql("CREATE TABLE prod AS SELECT * FROM einsum('ij->ji', A)")
    assert db.sql("CREATE TABLE IF NOT EXISTS prod AS SELECT * FROM einsum('ij->ji', A)") is None
    assert db.table("prod").shape == (7, 6)
    db.sql("CREATE OR REPLACE TABLE prod AS SELECT * FROM einsum('ij->ji', A)")
    np.testing.assert_allclose(db.table("prod").numpy(), a.T)
    with pytest.raises(ts.CatalogError, match="'prod' is a tensor table, written whole"):
        db.sql("INSERT INTO prod SELECT * FROM prod")
    db.sql("DROP TABLE prod")
    assert "prod" not in db.tables()
    with pytest.raises(ts.TableNotFoundError):
        db.table("prod")


def test_create_table_of_rows_is_a_plain_table(db, ab):
    db.sql("CREATE OR REPLACE TABLE rows_of_a AS SELECT * FROM tensor_cells(A)")
    assert "rows_of_a" not in db.tables()
    assert db.sql("SELECT count(*) FROM rows_of_a").fetchall() == [(35,)]


def test_explain_shows_the_graph_the_blocks_and_the_sql(db, ab):
    rows = db.sql("EXPLAIN SELECT * FROM einsum('ij,jk->ik', A, B)").fetchall()
    keys = [k for k, _ in rows]
    assert keys[0] == "tensorsql: einsum('ij,jk->ik', A, B)"
    text = rows[0][1]
    assert "== EinGraph ==" in text and "== SQL ==" in text and "blocks" in text
    assert any("physical_plan" in k for k in keys)


def test_statements_without_tensor_functions_pass_through(db):
    assert db.sql("SELECT 40 + 2 AS answer").fetchall() == [(42,)]
    assert db.sql("SELECT tensor_itemsize('float32')").fetchall() == [(4,)]  # the extension's scalars


@pytest.mark.parametrize(
    ("sql", "error", "match"),
    [
        (
            "SELECT * FROM einsum('ij,jk->ik', A, Nope)",
            ts.TableNotFoundError,
            r"operand 1 'Nope' is not a tensor",
        ),
        ("SELECT * FROM einsum('ij,jk->ik', A)", ts.EinsumError, r"einsum\('ij,jk->ik', A\): .*operand"),
        ("SELECT * FROM einsum('ij,jk->ik', A, B)) x", ts.SQLSyntaxError, "line 1, column"),
        ("SELECT einsum('ij->ji', A)", ts.SQLFrontendError, "is a table function: use it in FROM"),
        ("SELECT * FROM einsum('ij->ji', A, foo => 1)", ts.SQLFrontendError, "unknown named argument 'foo'"),
        (
            "SELECT * FROM einsum('ij->ji', A, join => 'add', join => 'add')",
            ts.SQLFrontendError,
            "given twice",
        ),
        ("SELECT * FROM einsum(A)", ts.SQLFrontendError, "subscripts must be a string literal"),
        (
            "SELECT * FROM einsum('ij->ji', (SELECT * FROM A WHERE k0 = 0))",
            ts.SQLFrontendError,
            "must be a tensor",
        ),
        ("SELECT * FROM einsum('ij->ji', weights)", ts.TableNotFoundError, "'weights' is not a tensor table"),
        ("SELECT * FROM einsum('ij,jk->ik', A, A)", ts.EinsumError, r"einsum\('ij,jk->ik', A, A\): .*size 7"),
        ("SELECT * FROM einsum('ij->ji', A, join => 'xor')", ts.TensorSQLError, "xor"),
        ("SELECT * FROM tensor_map(A, 'nope')", ts.TensorSQLError, "nope"),
        ("SELECT * FROM softmax(A, over => 5)", ts.ShapeError, "out of range"),
        ("SELECT * FROM tensor_cells(A, skip_zeros => 1)", ts.SQLFrontendError, "true or false"),
        (
            "SELECT * FROM tensor_from_cells((SELECT 1, 2.0), shape => 3)",
            ts.SQLFrontendError,
            r"list such as",
        ),
        ("SELECT 1; SELECT 2", ts.SQLFrontendError, "one statement at a time"),
    ],
)
def test_bad_statements_give_typed_errors(db, ab, sql, error, match):
    with pytest.raises(error, match=match):
        db.sql(sql)


def test_sql_needs_text(db):
    with pytest.raises(ts.SQLFrontendError, match="SQL text"):
        db.sql(42)  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def feats(db):
    db.execute(
        "CREATE OR REPLACE TABLE feats AS SELECT (9 - range) AS id, range * 1.5 AS a, "
        "(range % 3)::INTEGER AS b, range % 2 = 0 AS c, 'x' || range AS label FROM range(10)"
    )
    db.execute(
        "CREATE OR REPLACE TABLE holes AS SELECT range AS id, "
        "CASE WHEN range = 3 THEN NULL ELSE range END AS x FROM range(5)"
    )
    r = np.arange(10)[::-1]  # row i is id i: the range value 9 - i
    return np.stack([r * 1.5, r % 3, (r % 2 == 0)], axis=1)


def test_from_table_makes_a_matrix_of_features(db, feats):
    rel = db.from_table("feats", ["a", "b", "c"], rows_by="id", block_shape=(4, 2))
    assert rel.shape == (10, 3) and rel.block_shape == (4, 2)
    np.testing.assert_array_equal(rel.numpy(), feats)
    sub = db.from_table("SELECT id, a, b FROM feats WHERE id >= 5", rows_by=["id"], dtype="float32")
    np.testing.assert_array_equal(sub.numpy(), feats[5:, :2].astype(np.float32))


def test_from_table_reads_a_query_or_a_view_once(db):
    """Its columns, count and cells come from one read: a query whose rows change between reads (random())
    gave a count of one read and the cells of another, rows of zeros or rows past the end."""
    db.execute("CREATE OR REPLACE TABLE pairs AS SELECT range AS id, range + 1.0 AS a FROM range(400)")
    db.execute("CREATE OR REPLACE VIEW some_pairs AS SELECT * FROM pairs WHERE random() < 0.5")
    for source, columns in (
        ("SELECT * FROM pairs WHERE random() < 0.5", ["id", "a"]),
        ("some_pairs", ["id", "a"]),
    ):
        for _ in range(3):
            got = db.from_table(source, columns, rows_by="id").numpy()
            np.testing.assert_array_equal(got[:, 1], got[:, 0] + 1)  # every row one of the table's
            assert len(np.unique(got[:, 0])) == len(got)


def test_from_table_reads_a_table_in_a_schema(db, feats):
    db.execute("CREATE SCHEMA IF NOT EXISTS s1")
    db.execute('CREATE SCHEMA IF NOT EXISTS "My Schema"')
    db.execute("CREATE OR REPLACE TABLE s1.t AS SELECT range AS id, range * 2.0 AS a FROM range(5)")
    db.execute(
        'CREATE OR REPLACE TABLE "My Schema"."T x" AS SELECT range AS id, -1.0 * range AS a FROM range(3)'
    )
    db.execute('CREATE OR REPLACE TABLE "dot.ted" AS SELECT 7.0 AS a')
    np.testing.assert_array_equal(db.from_table("s1.t", ["a"], rows_by="id").numpy().ravel(), [0, 2, 4, 6, 8])
    np.testing.assert_array_equal(db.from_table("main.feats", ["a"]).shape, (10, 1))
    np.testing.assert_array_equal(
        db.from_table('"My Schema"."T x"', ["a"], rows_by="id").numpy().ravel(), [0, -1, -2]
    )
    np.testing.assert_array_equal(db.from_table('"dot.ted"', ["a"]).numpy(), [[7.0]])
    with pytest.raises(ts.SQLExecutionError, match="nope"):
        db.from_table("s1.nope", ["a"])


def test_from_table_nulls_are_an_error_or_the_fill(db, feats):
    np.testing.assert_array_equal(
        db.from_table("holes", ["x"], rows_by="id", fill=-1).numpy().ravel(), [0, 1, 2, -1, 4]
    )
    with pytest.raises(ts.SQLExecutionError, match="column 'x' is NULL in row 3"):
        db.from_table("holes", ["x"], rows_by="id")


def test_from_table_features_of_different_types_keep_their_values(db):
    """The features were one UNION ALL, whose common type DuckDB chose: INTEGER beside REAL became FLOAT
    (16777217 -> 16777216), BIGINT beside DOUBLE became DOUBLE even for an int64 tensor, DECIMAL(10,2) beside
    DECIMAL(38,1) rounded 1.25 to 1.3; and a BOOLEAN feature with fill= failed to bind."""
    db.execute(
        "CREATE OR REPLACE TABLE mixed AS SELECT 16777217::INTEGER AS n, 1.5::REAL AS f, "
        "9007199254740993::BIGINT AS big, 2.0::DOUBLE AS d, 1.25::DECIMAL(10,2) AS p, "
        "0.5::DECIMAL(38,1) AS q, true AS b, 7::UBIGINT AS u, 2.5::DOUBLE AS half"
    )
    assert db.from_table("mixed", ["n", "f"]).numpy().tolist() == [[16777217.0, 1.5]]
    assert db.from_table("mixed", ["big", "d"], dtype="int64").numpy().tolist() == [[9007199254740993, 2]]
    assert db.from_table("mixed", ["p", "q"]).numpy().tolist() == [[1.25, 0.5]]
    assert db.from_table("mixed", ["b", "u", "big"], dtype="int64").numpy().tolist() == [[1, 7, 2**53 + 1]]
    with pytest.raises(ts.CastingError, match=r"has value 2.5 which is not an integer: .* int64"):
        db.from_table("mixed", ["big", "half"], dtype="int64")
    with pytest.raises(ts.RangeError, match="value 9007199254740993 which lies outside the range of int32"):
        db.from_table("mixed", ["n", "big"], dtype="int32")
    db.execute("CREATE OR REPLACE TABLE holes2 AS FROM (VALUES (1, true, 0.5), (2, NULL, 1.5)) t(id, b, d)")
    got = db.from_table("holes2", ["b", "d"], rows_by="id", fill=0).numpy()
    np.testing.assert_array_equal(got, [[1.0, 0.5], [0.0, 1.5]])
    assert db.from_table("holes2", ["b"], rows_by="id", fill=2, dtype="int8").numpy().tolist() == [[1], [2]]
    for fill, dtype in ((0.5, "int32"), (1000, "int8"), (1e40, "int64")):  # the user's argument, not a row
        with pytest.raises(ts.ConfigError, match=re.escape(f"fill={fill!r} is not an integer {dtype}")):
            db.from_table("holes2", ["b"], rows_by="id", fill=fill, dtype=dtype)
    db.execute("CREATE OR REPLACE TABLE uhuge AS SELECT (2::UHUGEINT ** 127)::UHUGEINT AS u")
    with pytest.raises(ts.RangeError, match="which lies outside the range of int64"):  # not a cast failure
        db.from_table("uhuge", ["u"], dtype="int64")


@pytest.mark.parametrize(
    ("args", "kwargs", "error", "match"),
    [
        (("feats", ["label"]), {}, ts.DTypeError, "column 'label' has type VARCHAR"),
        (("feats", ["nope"]), {}, ts.ConfigError, "no column 'nope'"),
        (("feats",), {}, ts.ConfigError, "needs columns"),
        (("feats", ["a", "a"]), {}, ts.ConfigError, "repeat"),
        (("feats", ["a"]), {"rows_by": "nope"}, ts.ConfigError, "no column 'nope'"),
        (("feats", ["a"]), {"fill": "zero"}, ts.ConfigError, "fill must be a number"),
        (("SELECT id FROM feats",), {"rows_by": "id"}, ts.ConfigError, "no feature columns"),
        ((42,), {}, ts.ConfigError, "table name or a SELECT"),
        (("SELECT a FROM feats; DROP TABLE feats", ["a"]), {}, ts.ConfigError, r"must be one query"),
        (("WITH x AS (SELECT 1) INSERT INTO feats SELECT 1",), {}, ts.ConfigError, r"must be one query"),
    ],
)
def test_from_table_bad_arguments(db, feats, args, kwargs, error, match):
    with pytest.raises(error, match=match):
        db.from_table(*args, **kwargs)


def test_plain_duckdb_clients_read_tensor_cells(tmp_path):
    """A database file tensorsql saved to, opened by plain DuckDB with only the extension loaded: the stored
    ``tensor_cells`` macro gives (index, value) rows; ``s.sql`` passes the quoted form to it too."""
    import duckdb

    import udf_kernels

    path = str(tmp_path / "plain.duckdb")
    x = np.arange(24.0).reshape(2, 3, 4) - 7
    with ts.connect(path) as s:
        s.save(s.from_numpy(x, block_shape=(1, 2, 3)), "X3")
        s.save(s.from_numpy(np.array([2**40 + 1, -5], dtype=np.int64)), "ints")
        s.save(s.from_numpy(np.array(2.5, dtype=np.float32)), "scalar")
        s.save(s.from_numpy(np.arange(3.0)), "x.y")
        s.save(s.from_numpy(np.arange(2.0)), 'a"b')
        s.save(s.from_numpy(np.arange(4.0)), '"q')
        s.execute("CREATE TABLE plain AS SELECT 1 AS k0, 'x'::BLOB AS tensor")
    con = duckdb.connect(path, config={"allow_unsigned_extensions": "true"})
    try:
        udf_kernels.load(con)
        got = np.full(x.shape, np.nan)
        for index, value in con.sql("SELECT * FROM tensor_cells('X3')").fetchall():
            got[tuple(index)] = value
        np.testing.assert_array_equal(got, x)
        assert con.sql("SELECT * FROM tensor_cells('ints') ORDER BY index").fetchall() == [
            ([0], 2.0**40 + 1),
            ([1], -5.0),
        ]
        assert con.sql("SELECT sum(value) FROM tensor_cells('x3') WHERE index[1] = 1").fetchall() == [
            (float(x[1].sum()),)
        ]
        assert con.sql("SELECT * FROM tensor_cells('scalar')").fetchall() == [([], 2.5)]  # 0-d: no index
        # names with a dot or a quote, bare or quoted (they read no catalog row before: zero rows, no error)
        named = (("x.y", 3.0), ('"x.y"', 3.0), ('a"b', 1.0), ('"a""b"', 1.0), ('"X3"', 108.0), ('"q', 6.0))
        for name, total in named:
            assert con.execute("SELECT sum(value) FROM tensor_cells(?)", [name]).fetchall() == [(total,)]
        for name in ("main.X3", "plain", "nope"):  # not a tensor of this database: an error, not no rows
            with pytest.raises(duckdb.Error, match=r"is not a tensor table|does not exist"):
                con.execute("SELECT count(*) FROM tensor_cells(?)", [name]).fetchall()
    finally:
        con.close()
    with ts.connect(path) as s:
        assert s.sql("SELECT count(*) FROM tensor_cells('X3')").fetchall() == [(24,)]
        assert s.sql("SELECT * FROM tensor_cells(X3) LIMIT 0").columns == ["i0", "i1", "i2", "value"]


@pytest.fixture
def sales(db):
    db.execute(
        "CREATE OR REPLACE TABLE sales AS SELECT * FROM (VALUES ('bob', DATE '2024-01-02', 3.0), "
        "('alice', DATE '2024-01-01', 1.5), ('bob', DATE '2024-01-01', 2.0), "
        "('carol', DATE '2024-01-03', 4.0), ('alice', DATE '2024-01-01', 0.5)) t(who, day, amount)"
    )


def test_rows_with_arbitrary_ids_map_to_positions_and_back(db, sales):
    import datetime

    rel = db.from_sql("SELECT who, day, amount FROM sales", index=True)
    np.testing.assert_array_equal(rel.numpy(), [[2.0, 0, 0], [2.0, 3.0, 0], [0, 0, 4.0]])
    assert rel.ids(0).to_pydict() == {"position": [0, 1, 2], "id": ["alice", "bob", "carol"]}
    assert rel.ids(1).column("id").to_pylist()[0] == datetime.date(2024, 1, 1)
    rows = sorted(
        (r["i0"], str(r["i1"]), r["value"]) for r in rel.to_rows(ids=True, skip_zeros=True).to_pylist()
    )
    assert rows == [
        ("alice", "2024-01-01", 2.0),
        ("bob", "2024-01-01", 2.0),
        ("bob", "2024-01-02", 3.0),
        ("carol", "2024-01-03", 4.0),
    ]
    per_person = rel.sum(1).to_rows(ids={0: rel.ids(0)}).to_pylist()  # a result mapped back
    assert sorted((r["i0"], r["value"]) for r in per_person) == [("alice", 2.0), ("bob", 5.0), ("carol", 4.0)]


def test_some_dimensions_ids_others_positions(db):
    rel = db.from_sql("SELECT 100000 + 7 * range, range % 3, 1.0 FROM range(6)", shape=(None, 3), index=[0])
    assert rel.shape == (6, 3)
    assert rel.ids(0).column("id").to_pylist() == [100000 + 7 * i for i in range(6)]
    np.testing.assert_array_equal(rel.numpy(), np.eye(3)[np.arange(6) % 3])
    wide = db.from_sql("SELECT 'k' || range, range, 1.0 FROM range(2)", shape=(5, 2), index=[0])
    assert wide.shape == (5, 2)  # a size given may exceed the ids: the other positions are zero


def test_id_tables_go_with_their_relation(db):
    def id_tables() -> int:
        return db.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_ts_ids%'")[0][0]

    before = id_tables()
    rel = db.from_sql("SELECT 'a' || range, 1.0 FROM range(4)", index=True)
    assert id_tables() == before + 1
    del rel
    import gc

    gc.collect()
    assert id_tables() == before


@pytest.mark.parametrize(
    ("query", "kwargs", "error", "match"),
    [
        (
            "SELECT NULL::VARCHAR, 1.0 UNION ALL SELECT 'a', 2.0",
            {"index": True},
            ts.ShapeError,
            "NULL coordinate",
        ),
        (
            "SELECT 'a' || range, 1.0 FROM range(4)",
            {"shape": (3,), "index": True},
            ts.ShapeError,
            "4 distinct ids",
        ),
        ("SELECT 'a', 1, 1.0", {"index": [0]}, ts.ConfigError, "shape= is needed"),
        ("SELECT 'a', 1, 1.0", {"shape": (None, None), "index": [0]}, ts.ConfigError, "holds positions"),
        ("SELECT 'a', 1.0", {"index": [3]}, ts.ConfigError, "names dimension 3"),
        ("SELECT 'a', 1.0", {"index": [0, 0], "shape": (None,)}, ts.ConfigError, "repeats"),
        ("SELECT 'a', 'b', 1.0", {"shape": (None,), "index": True}, ts.ShapeError, "3 columns"),
        ("SELECT 1, 1.0", {}, ts.ConfigError, "shape= is needed"),
    ],
)
def test_bad_id_rows(db, query, kwargs, error, match):
    with pytest.raises(error, match=match):
        db.from_sql(query, **kwargs)


def test_to_rows_id_arguments_are_checked(db, sales):
    rel = db.from_sql("SELECT who, day, amount FROM sales", index=True)
    plain = db.from_numpy(np.ones((2, 2)))
    with pytest.raises(ts.ConfigError, match="has no ids"):
        plain.to_rows(ids=True)
    with pytest.raises(ts.ConfigError, match=r"columns \(position, id\)"):
        plain.to_rows(ids={0: pa.table({"a": [1]})})
    with pytest.raises(ts.ConfigError, match="names dimension 5"):
        rel.to_rows(ids={5: rel.ids(0)})


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO main.guarded SELECT * FROM guarded",
        "INSERT INTO guarded (k0, k1, tensor) SELECT k0 + 5, k1, tensor FROM guarded",  # a column list
        "INSERT INTO guarded BY NAME SELECT * FROM guarded",
        "DELETE FROM guarded",
        "UPDATE guarded SET k0 = 1",
        "ALTER TABLE guarded RENAME TO guarded2",
        "TRUNCATE guarded",
        "CREATE OR REPLACE TABLE Guarded AS SELECT 1 AS x",
        "DELETE FROM memory.guarded",  # the database's name: DuckDB reads it as the database
        "DELETE FROM memory.main.guarded",
        "INSERT INTO memory.main.guarded SELECT * FROM guarded",
        "CREATE OR REPLACE TABLE memory.main.guarded AS SELECT 1 AS x",
        "CREATE TEMP TABLE guarded AS SELECT 1 AS x",  # it would hide the tensor from every read
        "CREATE TEMPORARY TABLE GUARDED (a INTEGER)",
        "CREATE TEMP TABLE temp.guarded AS SELECT 1 AS x",
        "CREATE TABLE temp.main.guarded (k0 INTEGER, k1 INTEGER, tensor BLOB)",
        # EXPLAIN ANALYZE runs the statement, and a PREPAREd one runs at EXECUTE: sqlglot reads both as an
        # opaque Command, which went to DuckDB unchecked (the tensor read as zeros)
        "EXPLAIN ANALYZE DELETE FROM guarded",
        "explain analyze (UPDATE guarded SET k0 = 1)",
        "EXPLAIN ANALYZE INSERT INTO guarded SELECT * FROM guarded",
        "EXPLAIN ANALYZE CREATE OR REPLACE TABLE guarded AS SELECT 1 AS x",
        "EXPLAIN ANALYZE EXPLAIN ANALYZE DELETE FROM guarded",
        "PREPARE p AS DELETE FROM guarded",
        "PREPARE p(INTEGER) AS DELETE FROM guarded WHERE k0 = $1",
        'PREPARE "q x" AS DELETE FROM guarded',  # a quoted name, comments: a pattern let these through
        "PREPARE q /* c */ AS DELETE FROM guarded",
        "PREPARE /* c */ q AS UPDATE guarded SET k0 = 1",
        "EXPLAIN ANALYZE DROP TABLE guarded",
    ],
)
def test_statements_that_would_break_a_tensor_table_are_refused(db, statement):
    db.save(db.from_numpy(np.ones((2, 2))), "guarded", replace=True)
    with pytest.raises(ts.CatalogError, match="'guarded' is a tensor table"):
        db.sql(statement)
    np.testing.assert_array_equal(db.table("guarded").numpy(), np.ones((2, 2)))


@pytest.mark.parametrize(
    "statement",
    [
        "CREATE TEMP TABLE guarded AS SELECT 1 AS x",
        "create temporary table GUARDED (k0 INTEGER, k1 INTEGER, tensor BLOB)",
        "CREATE TEMP VIEW guarded AS SELECT 1 AS x",
        "CREATE TABLE temp.main.guarded (k0 INTEGER, k1 INTEGER, tensor BLOB)",
        "SELECT 1; CREATE TEMP TABLE guarded AS SELECT 1 AS x",
    ],
)
def test_execute_refuses_a_temporary_table_of_a_tensors_name(db, statement):
    """Through execute too: the temporary table hid the tensor, whose reads gave zeros, and drop()
    then dropped it with the tensor's catalog entry, leaving the tensor's table behind."""
    db.save(db.from_numpy(np.arange(4.0).reshape(2, 2)), "guarded", replace=True)
    with pytest.raises(ts.CatalogError, match="'guarded' is a tensor table"):
        db.execute(statement)
    np.testing.assert_array_equal(db.table("guarded").numpy(), np.arange(4.0).reshape(2, 2))
    db.execute("CREATE TEMP TABLE not_guarded AS SELECT 1 AS x; DROP TABLE not_guarded")


@pytest.mark.parametrize(
    "statement",
    [
        "INSERT INTO tensorsql_catalog (name, dtype, shape, block_shape, format_version) "
        "SELECT 'forged', 'float64', [2], [2], 1",
        "INSERT INTO tensorsql_catalog SELECT * FROM tensorsql_catalog",
        "INSERT INTO main.tensorsql_catalog BY NAME SELECT * FROM tensorsql_catalog",
    ],
)
def test_rows_inserted_into_the_catalog_are_refused(db, statement):
    """A forged catalog entry would list a tensor that is not there (or shadow one that is)."""
    db.save(db.from_numpy(np.ones((2, 2))), "listed", replace=True)
    before = db.tables()
    with pytest.raises(ts.CatalogError, match="'tensorsql_catalog' refused: it is tensorsql's own"):
        db.sql(statement)
    assert db.tables() == before


def test_drops_qualified_with_this_database_or_another_schema(tmp_path):
    """memory.main.X and memory.X are this schema's X: dropped with its catalog entry (DuckDB dropped the
    table and left the entry). main.X while another schema is current is that schema's tensor: refused (it
    dropped the current schema's X)."""
    with ts.connect() as s:
        for n in ("X", "Y"):
            s.from_numpy(np.ones(2)).save(n)
        s.sql("DROP TABLE memory.main.X")
        s.sql("DROP TABLE memory.Y")
        assert s.tables() == []
        s.from_numpy(np.ones(2)).save("X")
        s.execute("CREATE SCHEMA s1")
        s.execute("USE s1")
        s.from_numpy(np.full(2, 7.0)).save("X")
        with pytest.raises(ts.CatalogError, match=r"main\.X is a tensor table of memory\.main's own catalog"):
            s.sql("DROP TABLE main.X")
        np.testing.assert_array_equal(s.table("X").numpy(), [7.0, 7.0])
        s.execute("USE main")
        np.testing.assert_array_equal(s.table("X").numpy(), [1.0, 1.0])


def test_star_with_exclude_or_replace_is_duckdbs_query_not_a_tensor(db):
    """SELECT * EXCLUDE (tensor) FROM einsum(...) saved a whole tensor table; an operand (SELECT * REPLACE
    (...) FROM A) was read as A."""
    db.save(db.from_numpy(np.ones((2, 2))), "starred", replace=True)
    db.sql("CREATE OR REPLACE TABLE keys_only AS SELECT * EXCLUDE (tensor) FROM einsum('ij->ij', starred)")
    assert [c[0] for c in db.execute("DESCRIBE keys_only")] == ["k0", "k1"]
    assert "keys_only" not in db.tables()
    with pytest.raises(ts.SQLFrontendError, match="must be a tensor table"):
        db.sql("SELECT * FROM tensor_cells((SELECT * REPLACE (k0 + 1 AS k0) FROM starred))")


def test_tensorsqls_own_tables_cannot_be_dropped_and_a_name_twice_drops_once(db):
    refused = ("DROP TABLE tensorsql_catalog", "DROP TABLE IF EXISTS Tensorsql_Catalog", "DROP VIEW _ts_x")
    for statement in refused:
        with pytest.raises(ts.CatalogError, match="is tensorsql's own"):
            db.sql(statement)
    db.save(db.from_numpy(np.ones(2)), "twice", replace=True)
    assert db.sql("DROP TABLE twice, TWICE") is None
    assert "twice" not in db.tables()


def test_plain_tables_are_not_tensor_tables(db):
    db.sql("CREATE OR REPLACE TABLE plain_t(a INT)")
    db.sql("INSERT INTO plain_t VALUES (1)").fetchall()
    assert db.sql("SELECT * FROM plain_t").fetchall() == [(1,)]
    db.sql("DROP TABLE plain_t")


def test_drop_of_several_tables_drops_nothing_when_one_is_missing(db):
    db.save(db.from_numpy(np.ones(2)), "kept", replace=True)
    with pytest.raises(ts.SQLExecutionError, match="does not exist"):
        db.sql("DROP TABLE kept, no_such_table")
    assert "kept" in db.tables()
    db.sql("CREATE OR REPLACE TABLE plain_z(a INT)")
    assert db.sql("DROP TABLE kept, plain_z") is None
    assert "kept" not in db.tables()


def test_views_over_temporary_tensors_are_refused(db):
    with pytest.raises(ts.SQLFrontendError, match="CREATE VIEW over tensor_from_cells"):
        db.sql(
            "CREATE VIEW v_cells AS SELECT * FROM "
            "tensor_cells(tensor_from_cells((SELECT 0, 1.0), shape => [2]))"
        )


GOLDEN_STATEMENTS = {
    "sql_tensor_cells_of_einsum": "SELECT i0, value FROM tensor_cells(einsum('ij->i', G)) WHERE value > 0",
    "sql_join_with_plain_table": (
        "SELECT c.i0, c.value * w.w FROM tensor_cells(einsum('ij,jk->ik', G, G)) AS c JOIN w ON w.id = c.i0"
    ),
}


@pytest.mark.parametrize("name", sorted(GOLDEN_STATEMENTS))
def test_rewritten_statements_match_their_golden_sql(name):
    """The statement DuckDB gets after the rewrite (a fresh session, one stored 4x4 tensor in 2x2 blocks)."""
    from test_golden_sql import check_golden

    with ts.connect() as s:
        s.save(s.from_numpy(np.ones((4, 4)), block_shape=(2, 2)), "G")
        rw = sqlfront.rewrite(s, GOLDEN_STATEMENTS[name])
        check_golden(name, rw.statement.sql(dialect="duckdb", pretty=True, normalize_functions=False) + "\n")


def test_insert_into_an_empty_table_makes_it_a_tensor(db, ab):
    a, b = ab
    db.sql("CREATE OR REPLACE TABLE empty_t(k0 INTEGER, k1 INTEGER, tensor BLOB)")
    assert db.sql("INSERT INTO empty_t SELECT * FROM einsum('ij,jk->ik', A, B)") is None
    np.testing.assert_allclose(db.table("empty_t").numpy(), a @ b, rtol=1e-12)
    with pytest.raises(ts.CatalogError, match=r"table .empty_t. has \d+ rows, and a tensor is written whole"):
        db.sql("INSERT INTO empty_t SELECT * FROM einsum('ij->ji', A)")
    with pytest.raises(ts.SQLExecutionError, match="does not exist"):
        db.sql("INSERT INTO no_such_table SELECT * FROM einsum('ij->ji', A)")
    db.sql("DROP TABLE empty_t")


def test_explain_reads_no_rows(db, ab):
    """EXPLAIN plans tensor_from_cells with a placeholder: no rows are read, no temporary table is made."""

    def temps() -> int:
        return db.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name LIKE '_ts_tmp%'")[0][0]

    before = temps()
    rows = db.sql(
        "EXPLAIN SELECT * FROM einsum('ij,jk->ik', A, tensor_from_cells((SELECT 0, 0, 1.0), shape => [5, 2]))"
    ).fetchall()
    assert "== EinGraph ==" in rows[0][1] and rows[-1][0] == "duckdb" and "not shown" in rows[-1][1]
    assert temps() == before


def test_writes_that_would_break_a_tensor_table_or_the_catalog(db, tmp_path):
    """COPY ... FROM appended blocks and MERGE INTO deleted one (read as zeros); TRUNCATE and a rename of
    tensorsql's catalog lost every entry; a tensor saved under a temporary table's name was hidden by it.
    COPY ... TO reads the table and runs."""
    x = np.arange(16.0).reshape(4, 4)
    db.save(db.from_numpy(x, block_shape=(2, 2)), "guarded2", replace=True)
    out = str(tmp_path / "g.parquet")
    db.sql(f"COPY guarded2 TO '{out}' (FORMAT parquet)")
    for statement in (
        f"COPY guarded2 FROM '{out}' (FORMAT parquet)",
        "MERGE INTO guarded2 USING (SELECT 0 AS k0, 0 AS k1) AS m "
        "ON guarded2.k0 = m.k0 AND guarded2.k1 = m.k1 WHEN MATCHED THEN DELETE",
    ):
        with pytest.raises(ts.CatalogError, match="'guarded2' is a tensor table"):
            db.sql(statement)
    for statement in ("TRUNCATE tensorsql_catalog", "ALTER TABLE tensorsql_catalog RENAME TO c2",
                      "DELETE FROM tensorsql_catalog", "EXPLAIN ANALYZE TRUNCATE tensorsql_catalog",
                      "EXPLAIN ANALYZE UPDATE tensorsql_catalog SET dtype = 'int64'"):  # fmt: skip
        with pytest.raises(ts.CatalogError, match="'tensorsql_catalog' refused: it is tensorsql's own"):
            db.sql(statement)
    np.testing.assert_array_equal(db.table("guarded2").numpy(), x)
    db.execute("CREATE TEMP TABLE shadowed (k0 INTEGER, k1 INTEGER, tensor BLOB)")
    try:
        saves = (
            lambda: db.save(db.from_numpy(x), "Shadowed"),
            lambda: db.sql("CREATE TABLE shadowed AS SELECT * FROM einsum('ij->ji', guarded2)"),
        )
        for save in saves:
            with pytest.raises(ts.CatalogError, match="a temporary table or view of that name would hide"):
                save()
        assert "shadowed" not in [n.lower() for n in db.tables()]
    finally:
        db.execute("DROP TABLE temp.shadowed")


def test_tensor_cells_include_the_cells_of_absent_blocks(db):
    """An absent block is zeros, and so are its cells: tensor_cells (both forms) and to_rows() left them
    out, so avg() over a row averaged only the present ones."""
    import pyarrow.compute as pc

    x = np.arange(1, 17.0).reshape(4, 4)
    t = db.from_numpy(x, block_shape=(2, 2)).to_arrow()
    gone = pc.and_(pc.equal(t["k0"], 1), pc.equal(t["k1"], 1))
    db.save(db.from_arrow(t.filter(pc.invert(gone))), "holed", replace=True)
    want = x.copy()
    want[2:, 2:] = 0
    means = db.sql("SELECT i0, avg(value) FROM tensor_cells(holed) GROUP BY i0 ORDER BY i0").fetchall()
    np.testing.assert_allclose([m for _, m in means], want.mean(1))
    assert db.sql("SELECT count(*) FROM tensor_cells(einsum('ij->ij', holed))").fetchall() == [(16,)]
    assert db.sql("SELECT count(*) FROM tensor_cells(holed, skip_zeros => true)").fetchall() == [(12,)]
    rows = db.sql("SELECT index, value FROM tensor_cells('holed')").fetchall()  # the stored macro
    assert len(rows) == 16 and sum(v for _, v in rows) == want.sum()
    assert db.table("holed").to_rows().num_rows == 16
    assert db.table("holed").to_rows(skip_zeros=True).num_rows == 12


def test_explain_with_a_semicolon_and_a_statement_nested_too_deeply(db):
    db.save(db.from_numpy(np.ones((2, 2))), "semi", replace=True)
    rows = db.sql("EXPLAIN SELECT * FROM einsum('ij->ji', semi);").fetchall()
    assert rows[0][0].startswith("tensorsql: einsum")
    with pytest.raises(ts.SQLSyntaxError, match="nested too deeply"):
        db.sql("SELECT " + "(" * 3000 + "1" + ")" * 3000)


def test_create_table_as_a_tensor_function_in_any_spelling(db):
    """CREATE TABLE t AS (SELECT * FROM einsum(...)) and a name qualified with the current schema made a plain
    table of blobs with no catalog entry; another schema's name is refused."""
    x = np.arange(4.0).reshape(2, 2)
    db.save(db.from_numpy(x), "spelled", replace=True)
    for name, statement in (
        ("sp_paren", "CREATE OR REPLACE TABLE sp_paren AS (SELECT * FROM einsum('ij->ji', spelled))"),
        ("sp_main", "CREATE OR REPLACE TABLE main.sp_main AS SELECT * FROM einsum('ij->ji', spelled)"),
        ("sp_full", "CREATE OR REPLACE TABLE memory.main.sp_full AS SELECT * FROM einsum('ij->ji', spelled)"),
    ):
        db.sql(statement)
        np.testing.assert_array_equal(db.table(name).numpy(), x.T)
    db.execute("CREATE SCHEMA IF NOT EXISTS elsewhere")
    with pytest.raises(ts.SQLFrontendError, match="a tensor is saved in the session's current schema"):
        db.sql("CREATE TABLE elsewhere.sp AS SELECT * FROM einsum('ij->ji', spelled)")


def test_a_view_over_tensor_functions_refuses_a_replaced_tensor(tmp_path):
    """A view keeps SQL made for its tensors' dtype, shape and blocks: after a replace by an int64 tensor
    (the same blob width) it read float64 garbage. It checks their catalog rows at every read,
    also from a new session."""
    path = str(tmp_path / "views.duckdb")
    x = np.arange(12.0).reshape(3, 4)
    with ts.connect(path) as s:
        s.from_numpy(x).save("VA")
        s.sql("CREATE VIEW vw AS SELECT * FROM tensor_cells(einsum('ij->ji', VA))")
        s.sql("CREATE VIEW vw_plain AS SELECT 1 AS one")  # no tensor: as written
        rows = s.sql("SELECT i0, i1, value FROM vw ORDER BY i0, i1").fetchall()
        assert [v for *_, v in rows] == x.T.reshape(-1).tolist()
    with ts.connect(path) as s:
        assert len(s.sql("SELECT * FROM vw").fetchall()) == 12
        s.from_numpy(np.arange(12, dtype=np.int64).reshape(3, 4)).save("VA", replace=True)
        with pytest.raises(duckdb.Error, match=r"view vw reads tensor 'VA' as float64 .* replaced"):
            s.sql("SELECT * FROM vw").fetchall()
        assert s.sql("SELECT * FROM vw_plain").fetchall() == [(1,)]
        # replaced in other blocks: the guard fires before a kernel reads the new blobs (the kernel's
        # blob-size error came first)
        s.from_numpy(x, block_shape=(3, 4)).save("VA", replace=True)
        s.sql("CREATE OR REPLACE VIEW vw2 AS SELECT * FROM tensor_cells(einsum('ij->ji', VA))")
        s.from_numpy(x, block_shape=(1, 2)).save("VA", replace=True)
        with pytest.raises(duckdb.Error, match=r"view vw2 reads tensor 'VA' as float64 .* replaced"):
            s.sql("SELECT * FROM vw2").fetchall()
        s.from_numpy(x, block_shape=(3, 4)).save("VA", replace=True)
        assert len(s.sql("SELECT * FROM vw2").fetchall()) == 12


def test_a_cte_named_like_a_tensor_is_refused(db):
    """DuckDB bound the generated SQL's read of the tensor to the user's CTE of the same name: its blocks
    were read with the tensor's dtype and shape (int64 7, 8, 9 read as float64 3.5e-323, ...)."""
    db.save(db.from_numpy(np.array([[1.5, 2.5, 3.5]])), "cte_t", replace=True)
    db.save(db.from_numpy(np.array([[7, 8, 9]], dtype=np.int64)), "cte_i", replace=True)
    for q in (
        "WITH cte_t AS (SELECT * FROM cte_i) SELECT * FROM tensor_cells(cte_t)",
        "WITH CTE_T AS (SELECT * FROM cte_i) SELECT * FROM tensor_cells(einsum('ij->j', cte_t))",
        "WITH cte_t AS (SELECT * FROM cte_t WHERE false) SELECT * FROM tensor_cells(cte_t)",
        "WITH cte_t AS (SELECT * FROM cte_i) SELECT * FROM tensor_cells('cte_t')",  # the stored macro's form
        """WITH "CTE_T" AS (SELECT * FROM cte_i) SELECT * FROM tensor_cells('"cte_t"')""",
    ):
        with pytest.raises(ts.SQLFrontendError, match=r"'\"?cte_t\"?' is also the name of a CTE"):
            db.sql(q)
    fake = "SELECT 'cte_t' AS name, [1, 3] AS shape, [1, 3] AS block_shape, 'int64' AS dtype"
    with pytest.raises(ts.SQLFrontendError, match="a CTE named 'tensorsql_catalog' is refused"):
        db.sql(f"WITH tensorsql_catalog AS ({fake}) SELECT * FROM tensor_cells('cte_t')")
    rows = db.sql("WITH other AS (SELECT 1) SELECT * FROM tensor_cells(cte_t)").fetchall()
    assert sorted(rows) == [(0, 0, 1.5), (0, 1, 2.5), (0, 2, 3.5)]


def test_sql_statement_edge_cases(db):
    """A PIVOT statement over tensor functions lost its source's table qualifiers (a correlated subquery's
    w.i0 = c.i0 became true); SELECT ... FROM tensor_cells(A) PIVOT (...) dropped the pivot; an integer
    tensor_map param went through float (2**53 + 1 -> 2**53); a predict in a predict's query reached DuckDB;
    a shape of 10**20 was DuckDB's Binder Error."""
    db.save(db.from_numpy(np.array([[1.0, 2.0], [3.0, 4.0]])), "pv", replace=True)
    db.save(db.from_numpy(np.array([1], dtype=np.int64)), "pv_i", replace=True)
    with pytest.raises(ts.SQLFrontendError, match="a PIVOT or UNPIVOT statement over tensor functions"):
        db.sql("SELECT * FROM (PIVOT (SELECT * FROM tensor_cells(pv)) ON i1 USING sum(value))")
    got = db.sql("SELECT * FROM tensor_cells(pv) PIVOT (sum(value) FOR i1 IN (0, 1)) ORDER BY i0").fetchall()
    assert got == [(0, 1.0, 2.0), (1, 3.0, 4.0)]
    with pytest.raises(ts.RangeError, match="9007199254740993 has no exact float64"):
        db.sql("SELECT * FROM tensor_cells(tensor_map(pv_i, 'scale', 9007199254740993))")
    assert db.sql("SELECT * FROM tensor_cells(tensor_map(pv_i, 'scale', -3))").fetchall() == [(0, -3)]
    with pytest.raises(ts.ShapeError, match=r"a dimension past 2\*\*62"):
        big = 10**19
        db.sql(f"SELECT * FROM tensor_cells(tensor_from_cells((SELECT 0, 1.0), shape => [{big}]))")
    db.execute("CREATE OR REPLACE TABLE pd AS SELECT range AS id, range * 0.1 AS a, range * 0.2 AS b "
               "FROM range(4)")
    model = ml.LinearRegression(db, 2, dtype="float64")
    model.set_params([np.array([1.0, 10.0]), np.array(0.5)])
    model.save("pv_lin")
    inner = "predict('pv_lin', (SELECT id, a, b FROM pd), key => 'id')"
    rows = db.sql(f"SELECT * FROM predict('pv_lin', (SELECT id, prediction AS a, 0.0 AS b FROM {inner}), "
                  "key => 'id') ORDER BY id").fetchall()  # fmt: skip
    x = np.arange(4) * 0.1
    np.testing.assert_allclose([r[1] for r in rows], (x + 10 * 2 * x + 0.5) + 0.5, rtol=1e-12)


def test_ids_come_back_as_duckdb_holds_them(db):
    """An id table went through Python values: a UBIGINT id past 2**63 raised the builtin OverflowError, a
    MAP id gained the other rows' keys. It is read as Arrow."""
    big = "18446744073709551615::UBIGINT"
    rel = db.from_sql(f"SELECT * FROM (VALUES (0::UBIGINT, 2.0), ({big}, 1.0))", index=True)
    ids = rel.ids(0)
    assert ids.column("id").type == pa.uint64()
    assert ids.column("id").to_pylist() == [0, 2**64 - 1]
    rows = rel.to_rows(ids=True)
    assert sorted(zip(rows.column(0).to_pylist(), rows.column("value").to_pylist(), strict=True)) == [
        (0, 2.0),
        (2**64 - 1, 1.0),
    ]
    maps = db.from_sql("SELECT * FROM (VALUES (MAP {'a': 1}, 1.0), (MAP {'b': 2}, 2.0))", index=True)
    assert [dict(m) for m in maps.ids(0).column("id").to_pylist()] == [{"a": 1}, {"b": 2}]


def test_a_dense_grid_that_cannot_be_held_is_refused_before_any_row_is_read(db):
    """Three cells of a 2**32 x 2**32 tensor passed every per-dimension check and wrote temporary files
    until the disk was full (~90 s): the grid's bytes are known up front."""
    with pytest.raises(ts.OutOfMemoryError, match=r"shape \[4294967296, 4294967296\] float64 takes"):
        db.from_sql("SELECT 0, 0, 1.0", (2**32, 2**32))
    with pytest.raises(ts.OutOfMemoryError, match="more than this session's memory limit"):
        db.sql("SELECT * FROM tensor_from_cells((SELECT 0 AS i, 1.0 AS x), shape => [4611686018427387904])")


def test_from_sql_reads_values_as_from_table_does(db):
    """``from_sql("VALUES ...")`` was refused as no SELECT, where ``from_table`` reads it."""
    np.testing.assert_array_equal(db.from_sql("VALUES (0, 1.0), (2, 3.5)", [3]).numpy(), [1.0, 0.0, 3.5])
    rel = db.from_sql("VALUES ('a', 1.0), ('b', 2.0)", index=True)
    assert rel.ids(0).column("id").to_pylist() == ["a", "b"]
    with pytest.raises(ts.SQLExecutionError, match="must be a SELECT"):
        db.from_sql("DROP TABLE t", [3])


def test_explain_of_a_create_table_as_lists_its_call_once(db):
    db.save(db.from_numpy(np.ones((2, 3))), "ex_ctas", replace=True)
    rows = db.sql("EXPLAIN CREATE TABLE ex_t AS SELECT * FROM einsum('ij->j', ex_ctas)").fetchall()
    assert [k for k, _ in rows] == ["tensorsql: einsum('ij->j', ex_ctas)", "physical_plan"]
    assert "ex_t" not in db.tables()
