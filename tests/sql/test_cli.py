"""The ``tensorsql`` command line: sql (table, CSV, JSON, Parquet), explain, import/export round trips, and
the shell driven through stdin; through subprocess where the process boundary matters."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

import tensorsql as ts
from tensorsql import cli


def run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    code = cli.main(list(argv), out=out)
    return code, out.getvalue()


@pytest.fixture
def db(tmp_path):
    path = str(tmp_path / "cli.duckdb")
    a = np.arange(12.0).reshape(3, 4)
    with ts.connect(path) as s:
        s.save(s.from_numpy(a, block_shape=(2, 2)), "A")
    return path, a


def test_sql_prints_a_table(db):
    path, _a = db
    code, out = run("sql", path, "SELECT * FROM tensor_cells(einsum('ij->ji', A)) ORDER BY i0, i1 LIMIT 3")
    assert code == 0
    assert "i0" in out and "value" in out and "3 rows" in out
    assert "4.0" in out  # A.T[0, 1] = A[1, 0]


def test_sql_as_csv_json_and_parquet(db, tmp_path):
    path, _a = db
    _, out = run(
        "sql", path, "SELECT i0, sum(value) AS s FROM tensor_cells(A) GROUP BY i0 ORDER BY i0", "--csv"
    )
    assert out.splitlines() == ['"i0","s"', "0,6", "1,22", "2,38"]
    _, out = run("sql", path, "SELECT * FROM einsum('ij->i', A) ", "--json")
    (row,) = json.loads(out)
    assert row["k0"] == 0 and row["tensor"] == "<blob 24 bytes>"
    target = str(tmp_path / "cells.parquet")
    run("sql", path, "SELECT * FROM tensor_cells(A)", "--parquet", target)
    assert pq.read_table(target).num_rows == 12


def test_explain(db):
    path, _ = db
    code, out = run("explain", path, "SELECT * FROM einsum('ij,kj->ik', A, A)")
    assert code == 0 and "== EinGraph ==" in out and "physical_plan" in out


def test_import_and_export_round_trips(db, tmp_path):
    path, a = db
    npy = str(tmp_path / "a.npy")
    blocks = str(tmp_path / "a.parquet")
    cells = str(tmp_path / "cells.parquet")
    assert run("export", path, "A", npy)[0] == 0
    np.testing.assert_array_equal(np.load(npy), a)
    run("export", path, "A", blocks)
    run("export", path, "A", cells, "--cells")
    assert (
        run("import", path, "B", npy, "--block-shape", "3,1")[1]
        == "B: shape (3, 4), float64, blocks (3, 1)\n"
    )
    run("import", path, "C", blocks)
    run("import", path, "D", cells, "--shape", "3,4", "--dtype", "float32")
    run(
        "import",
        path,
        "E",
        "SELECT range % 3, range % 4, 1 FROM range(24)",
        "--shape",
        "3,4",
        "--dtype",
        "int32",
    )
    with ts.connect(path) as s:
        np.testing.assert_array_equal(s.table("B").numpy(), a)
        assert s.table("C").block_shape == (2, 2)
        np.testing.assert_array_equal(s.table("C").numpy(), a)
        assert s.table("D").dtype == np.float32
        np.testing.assert_array_equal(s.table("D").numpy(), a.astype(np.float32))
        np.testing.assert_array_equal(s.table("E").numpy(), np.full((3, 4), 2, dtype=np.int32))


def test_bad_imports_and_commands_fail_clearly(db, tmp_path, capsys):
    path, _ = db
    np.save(tmp_path / "a.npy", np.ones(3))
    assert run("import", path, "A", str(tmp_path / "a.npy"))[0] == 1  # A exists: --replace overwrites
    err = capsys.readouterr().err
    assert "CatalogError" in err and "--replace overwrites it" in err and "replace=True" not in err
    assert run("import", path, "a", "SELECT 1, 2.0", "--shape", "3")[0] == 1  # one name, and the query unread
    assert "'a' (or one whose name differs only in the case" in capsys.readouterr().err
    assert run("import", path, "A", str(tmp_path / "a.npy"), "--replace")[0] == 0
    with pytest.raises(SystemExit, match="needs --shape"):
        run("import", path, "X", "SELECT 1, 2.0")
    with pytest.raises(SystemExit, match="integers separated by commas"):
        run("import", path, "X", "SELECT 1, 2.0", "--shape", "three")
    with pytest.raises(SystemExit, match=r"\.npy or \.parquet"):
        run("export", path, "A", str(tmp_path / "a.csv"))
    code = run("sql", path, "SELECT * FROM einsum('ij->ji', Nope)")[0]
    assert code == 1 and "TableNotFoundError" in capsys.readouterr().err
    code = run("sql", path, "SELECT 'x'::INT")[0]  # fails while DuckDB fetches: typed, no traceback
    assert code == 1 and "tensorsql: SQLExecutionError: sql: Conversion Error" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="no file"):
        run("import", path, "X", str(tmp_path / "missing.npy"))


def test_the_shell_through_stdin_in_a_subprocess(db):
    path, a = db
    script = "\n".join(
        [
            ".help",
            ".tables",
            ".timer on",
            "SELECT sum(value) AS total",
            "  FROM tensor_cells(A);",
            "SELEC typo;",
            "SELECT * FROM einsum('ij->ji', Nope);",
            ".explain SELECT * FROM einsum('ij->ji', A)",
            ".bogus",
            "CREATE TABLE T AS SELECT * FROM einsum('ij->ji', A);",
            "SELECT 42 AS answer;",
            ".quit",
            "SELECT 'never reached';",
        ]
    )
    proc = subprocess.run(
        [sys.executable, "-m", "tensorsql", "shell", path],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr
    assert ".tables" in out and "(3, 4)" in out and "(2, 2)" in out
    assert str(a.sum()) in out and "Run Time:" in out
    assert "Error: SQLExecutionError" in out and "Error: TableNotFoundError" in out  # the shell went on
    assert "== EinGraph ==" in out and "unknown command '.bogus'" in out
    assert "42" in out and "never reached" not in out
    with ts.connect(path) as s:
        np.testing.assert_array_equal(s.table("T").numpy(), a.T)


def test_sql_import_and_export_through_the_console_command(tmp_path):
    """The installed entry point's code path in a process of its own: import a .npy, query it, export it."""
    path, npy, out = str(tmp_path / "p.duckdb"), str(tmp_path / "in.npy"), str(tmp_path / "out.npy")
    x = np.arange(6.0).reshape(2, 3)
    np.save(npy, x)

    def cli_run(*argv: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "tensorsql", *argv],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    assert cli_run("import", path, "X", npy).returncode == 0
    got = cli_run(
        "sql", path, "SELECT i0, sum(value) AS s FROM tensor_cells(X) GROUP BY i0 ORDER BY i0", "--csv"
    )
    assert got.returncode == 0 and got.stdout.splitlines()[1:] == ["0,3", "1,12"]
    assert cli_run("export", path, "X", out).returncode == 0
    np.testing.assert_array_equal(np.load(out), x)
    bad = cli_run("sql", path, "SELECT * FROM einsum('ij->ji', Nope)")
    assert bad.returncode == 1 and "TableNotFoundError" in bad.stderr


def test_duplicate_column_names_and_an_interrupt(db, monkeypatch, capsys):
    """A join of two tensor_cells has each name twice: CSV and JSON kept one of each and the table failed
    with a ValueError; Ctrl-C printed a traceback."""
    path, _ = db
    q = "SELECT * FROM tensor_cells(A) x JOIN tensor_cells(A) y ON x.i0 = y.i1 ORDER BY ALL LIMIT 2"
    code, out = run("sql", path, q, "--csv")
    assert code == 0 and out.splitlines()[0] == '"i0","i1","value","i0_1","i1_1","value_1"'
    code, out = run("sql", path, q, "--json")
    assert code == 0 and set(json.loads(out)[0]) == {"i0", "i1", "value", "i0_1", "i1_1", "value_1"}
    code, out = run("sql", path, q)
    assert code == 0 and "value_1" in out and "2 rows" in out

    def interrupted(args, out):
        raise KeyboardInterrupt

    parser = cli.parser()
    real = parser.parse_args
    monkeypatch.setattr(cli, "parser", lambda: parser)
    monkeypatch.setattr(parser, "parse_args", lambda argv: _with_run(real(argv), interrupted))
    assert run("sql", path, "SELECT 1")[0] == 130
    assert capsys.readouterr().err.strip().endswith("tensorsql: interrupted")


def _with_run(args, fn):
    args.run = fn
    return args


def test_json_has_no_nan_tokens(db):
    """``--json`` wrote Python's NaN and Infinity tokens, which strict JSON parsers refuse."""
    path, _ = db
    query = "SELECT 'nan'::DOUBLE AS x, 'inf'::DOUBLE AS y, '-inf'::DOUBLE AS z, 0.5 AS w"
    _, out = run("sql", path, query, "--json")

    def refuse(token: str) -> None:
        raise ValueError(token)

    (row,) = json.loads(out, parse_constant=refuse)
    assert row == {"x": "NaN", "y": "Infinity", "z": "-Infinity", "w": "0.5"}


def test_the_shell_splits_statements_at_their_own_semicolons():
    """A line ending in ``;`` ended the statement even inside a string or a comment, and two statements on
    one line ran as one text (refused: 'this text has 2')."""
    out = io.StringIO()
    with ts.connect() as s:
        shell = cli.Shell(s, out)
        typed = ["SELECT 'a;", "b' AS x;", "-- a note;", "SELECT 1 AS one; SELECT 2 AS two;"]
        lines = iter([*typed, "SELECT 3 AS", "three"])

        def read(_prompt: str) -> str:
            try:
                return next(lines)
            except StopIteration:
                raise EOFError from None

        shell.loop(read)
    text = out.getvalue()
    assert "Error" not in text, text
    for want in ("a;", "one", "two", "three"):
        assert want in text
    assert text.count("1 row") == 4
    out = io.StringIO()
    with ts.connect() as s:  # the input ends without a final ';'
        lines = iter(["SELECT 1 AS a; SELECT 2 AS b -- last"])
        cli.Shell(s, out).loop(read)
    assert "Error" not in out.getvalue() and out.getvalue().count("1 row") == 2, out.getvalue()
    assert cli._complete("SELECT 1 /* ; */") is None and cli._complete("SELECT '") is None
    assert cli._complete("SELECT 1; SELECT ';';") == ["SELECT 1", "SELECT ';'"]


def test_an_interval_column_is_written_as_text_in_csv(db):
    """``--csv`` of an INTERVAL exited 1 with Arrow's "not implemented"; it is text, as
    in the table and ``--json``."""
    path, _a = db
    for fmt in ("--csv", "--json"):
        code, text = run("sql", path, "SELECT INTERVAL 1 DAY AS d, 2 AS x", fmt)
        assert code == 0 and "days=1" in text and "2" in text
