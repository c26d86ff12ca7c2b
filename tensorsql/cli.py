"""The ``tensorsql`` command line: SQL with tensor functions on a database file, an interactive shell, and
tensors in and out of files (docs "SQL and the command line").

    tensorsql sql DB "SELECT ..." [--csv | --json | --parquet FILE]
    tensorsql shell DB
    tensorsql import DB NAME FILE.npy | FILE.parquet | "SELECT ..." [--shape 3,4] [--block-shape 2,2]
    tensorsql export DB NAME FILE.npy | FILE.parquet [--cells]
    tensorsql explain DB "SELECT ... einsum(...) ..."

The shell is how a SQL user opens tensorsql's database files: DuckDB's own CLI must be of the same storage
version as the pinned duckdb package, and has neither the kernels nor ``einsum``.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Sequence
from typing import IO

import duckdb
import numpy as np
import pyarrow as pa

#: rows a result table shows in the terminal (the rest are counted)
SHOWN_ROWS = 200
#: shell commands
HELP = """\
  SQL ends with ';' (it may span lines). Tensor functions: einsum, tensor_map, softmax, tensor_cells,
  tensor_from_cells (docs "SQL and the command line").
  .tables            tensor tables with their shape, dtype and blocks
  .explain STATEMENT the tensor plans and DuckDB's plan of a statement
  .timer on|off      time each statement
  .help              this text
  .quit / .exit      leave (or Ctrl-D)"""


def _session(database: str, read_only: bool = False) -> object:
    from tensorsql.api import connect

    s = connect(database, read_only=read_only, progress=sys.stderr.isatty())
    if sys.stderr.isatty():  # DuckDB's own progress bar for long statements, where it applies
        s.execute("SET enable_progress_bar = true")
    return s


# -- results -------------------------------------------------------------------------------------------------
def _printable(table: pa.Table) -> pa.Table:
    """Binary columns (tensor blobs) as a short description, nested ones (lists, structs) as text: terminals
    and CSV take text."""
    cols, names, seen = [], [], set()
    for name, col in zip(table.column_names, table.columns, strict=True):
        if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
            col = pa.array([None if v is None else f"<blob {len(v)} bytes>" for v in col.to_pylist()])
        elif pa.types.is_nested(col.type) or pa.types.is_interval(col.type):  # CSV has no INTERVAL either
            col = pa.array([None if v is None else str(v) for v in col.to_pylist()], pa.string())
        unique, i = name, 0
        while unique in seen:  # a join of two tensor_cells: "i0" twice (a JSON row keeps one of each name)
            i += 1
            unique = f"{name}_{i}"
        seen.add(unique)
        cols.append(col)
        names.append(unique)
    return pa.table(cols, names=names) if cols else table


def _json_number(value: object) -> object:
    """NaN and infinities as the strings ``"NaN"``, ``"Infinity"``, ``"-Infinity"`` (``float()`` reads them
    back): JSON has no such numbers, and Python's ``NaN`` token is refused by strict parsers."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    return value


def print_table(table: pa.Table, out: IO[str], limit: int | None = SHOWN_ROWS) -> None:
    from rich.console import Console
    from rich.table import Table

    shown = _printable(table if limit is None else table.slice(0, limit))
    grid = Table(show_header=True, header_style="bold", show_lines=False)
    for name, typ in zip(shown.column_names, table.schema.types, strict=True):
        grid.add_column(f"{name}\n{typ}", overflow="fold")
    for row in zip(*(c.to_pylist() for c in shown.columns), strict=True):
        grid.add_row(*["NULL" if v is None else str(v) for v in row])
    console = Console(file=out, soft_wrap=False, width=None if out.isatty() else 200)
    console.print(grid)
    more = table.num_rows - shown.num_rows
    count = f"{table.num_rows} row{'s' if table.num_rows != 1 else ''}"
    console.print(count + (f" ({more} not shown)" if more else ""))


def write_result(result: object, args: argparse.Namespace, out: IO[str]) -> None:
    if result is None:
        out.write("OK\n")
        return
    table_mode = not (
        getattr(args, "parquet", None) or getattr(args, "csv", False) or getattr(args, "json", False)
    )
    if table_mode:
        shown, more = _first_rows(result, SHOWN_ROWS)
        print_table(shown, out, limit=None)
        if more:
            out.write(f"(only the first {SHOWN_ROWS} rows shown; --csv, --json or --parquet give them all)\n")
        return
    table = result.to_arrow_table()  # type: ignore[attr-defined]
    if getattr(args, "parquet", None):
        import pyarrow.parquet as pq

        pq.write_table(table, args.parquet)
        out.write(f"{table.num_rows} rows written to {args.parquet}\n")
    elif getattr(args, "csv", False):
        import pyarrow.csv as pacsv

        sink = pa.BufferOutputStream()
        pacsv.write_csv(_printable(table), sink)
        out.write(sink.getvalue().to_pybytes().decode())
    elif getattr(args, "json", False):
        rows = [{k: _json_number(v) for k, v in row.items()} for row in _printable(table).to_pylist()]
        out.write(json.dumps(rows, default=str, allow_nan=False) + "\n")
    else:
        print_table(table, out)


def _first_rows(result: object, limit: int) -> tuple[pa.Table, bool]:
    """At most ``limit`` rows of a result, read batch by batch (a big result is not read whole to show its
    first rows), and whether there were more."""
    reader = result.arrow()  # type: ignore[attr-defined]
    batches, rows = [], 0
    for batch in reader:
        batches.append(batch)
        rows += batch.num_rows
        if rows > limit:
            break
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return table.slice(0, limit), rows > limit


# -- commands ------------------------------------------------------------------------------------------------
def cmd_sql(args: argparse.Namespace, out: IO[str]) -> int:
    with _session(args.database) as s:  # type: ignore[attr-defined]
        write_result(s.sql(args.statement), args, out)
    return 0


def cmd_explain(args: argparse.Namespace, out: IO[str]) -> int:
    with _session(args.database) as s:  # type: ignore[attr-defined]
        for key, value in s.sql(args.statement, explain=True).fetchall():
            out.write(f"== {key} ==\n{value}\n")
    return 0


def _ints(text: str | None, what: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError:
        raise SystemExit(f"tensorsql: {what} must be integers separated by commas, got {text!r}") from None


def cmd_import(args: argparse.Namespace, out: IO[str]) -> int:
    import pyarrow.parquet as pq

    from tensorsql.errors import CatalogError

    shape, block = _ints(args.shape, "--shape"), _ints(args.block_shape, "--block-shape")
    with _session(args.database) as s:  # type: ignore[attr-defined]
        if not args.replace and s.executor.catalog.exists(args.name):  # before reading the source
            raise CatalogError(
                f"a table named {args.name!r} (or one whose name differs only in the case of ASCII letters) "
                "already exists in the database; --replace overwrites it"
            )
        source = args.source
        if source.endswith(".npy") and os.path.exists(source):
            rel = s.from_numpy(np.load(source, allow_pickle=False), block_shape=block)
        elif source.endswith(".parquet") and os.path.exists(source):
            table = pq.read_table(source)
            if b"tensorsql.shape" in (table.schema.metadata or {}):
                rel = s.from_arrow(table)  # blocks written by `tensorsql export` (or to_arrow())
            else:  # rows (i0, ..., value): read by DuckDB, like a query
                if shape is None:
                    raise SystemExit("tensorsql: a parquet file of rows (i0, ..., value) needs --shape")
                view = "_ts_import_rows"
                s.executor.con.register(view, table)  # type: ignore[attr-defined]
                try:
                    from sqlglot import exp

                    query = exp.select(exp.Star()).from_(exp.to_identifier(view)).sql(dialect="duckdb")
                    rel = s.from_sql(query, shape, block, dtype=args.dtype).materialize()
                finally:
                    s.executor.con.unregister(view)  # type: ignore[attr-defined]
        elif os.path.exists(source):
            raise SystemExit(f"tensorsql: cannot import {source!r}: give a .npy or .parquet file, or a query")
        elif source.lower().endswith((".npy", ".parquet")):
            raise SystemExit(f"tensorsql: no file {source!r}")
        else:  # a query of rows
            if shape is None:
                raise SystemExit("tensorsql: importing a query of rows (i0, ..., value) needs --shape")
            rel = s.from_sql(source, shape, block, dtype=args.dtype)
        s.save(rel, args.name, replace=args.replace)
        saved = s.table(args.name)
        out.write(f"{args.name}: shape {saved.shape}, {saved.node.dtype}, blocks {saved.block_shape}\n")
    return 0


def cmd_export(args: argparse.Namespace, out: IO[str]) -> int:
    import pyarrow.parquet as pq

    with _session(args.database, read_only=True) as s:  # type: ignore[attr-defined]
        rel = s.table(args.name)
        if args.file.endswith(".npy"):
            np.save(args.file, rel.numpy(), allow_pickle=False)
        elif args.file.endswith(".parquet"):
            table = rel.to_rows() if args.cells else rel.to_arrow()
            pq.write_table(table, args.file)
        else:
            raise SystemExit(f"tensorsql: cannot export to {args.file!r}: give a .npy or .parquet file")
        out.write(f"{args.name} -> {args.file}\n")
    return 0


# -- the shell -----------------------------------------------------------------------------------------------
class Shell:
    """The interactive shell: statements end with ';', dot commands act at once, an error is printed and the
    shell goes on. Reads with prompt_toolkit (history, editing) on a terminal, plain lines otherwise."""

    def __init__(self, session: object, out: IO[str]) -> None:
        self.s = session
        self.out = out
        self.timer = False

    def tables(self) -> None:
        info = self.s.tables(details=True)  # type: ignore[attr-defined]
        shown = {
            "name": info.column("name"),
            "shape": pa.array([str(tuple(v)) for v in info.column("shape").to_pylist()]),
            "dtype": info.column("dtype"),
            "blocks": pa.array([str(tuple(v)) for v in info.column("block_shape").to_pylist()]),
        }
        print_table(pa.table(shown), self.out, limit=None)

    def command(self, line: str) -> bool:
        """A dot command; False to leave."""
        word, _, rest = line.strip().partition(" ")
        word = word.lower()
        if word in (".quit", ".exit", ".q"):
            return False
        if word == ".help":
            self.out.write(HELP + "\n")
        elif word == ".tables":
            self.tables()
        elif word == ".timer":
            if rest.strip().lower() not in ("on", "off"):
                self.out.write("usage: .timer on|off\n")
            else:
                self.timer = rest.strip().lower() == "on"
        elif word == ".explain":
            statement = rest.strip().rstrip(";")
            if not statement:
                self.out.write("usage: .explain SELECT ...\n")
            else:
                self.run(statement, explain=True)
        else:
            self.out.write(f"unknown command {word!r}; .help lists them\n")
        return True

    def run(self, statement: str, explain: bool = False) -> None:
        from tensorsql.errors import TensorSQLError

        start = time.perf_counter()
        try:
            result = self.s.sql(statement, explain=explain)  # type: ignore[attr-defined]
            if explain and result is not None:
                for key, value in result.fetchall():
                    self.out.write(f"== {key} ==\n{value}\n")
            else:
                write_result(result, argparse.Namespace(), self.out)
        except (TensorSQLError, Exception) as exc:  # a typo never kills the shell
            self.out.write(f"Error: {type(exc).__name__}: {exc}\n")
        if self.timer:
            self.out.write(f"Run Time: {time.perf_counter() - start:.3f} s\n")

    def loop(self, lines: object) -> None:
        """``lines``: a callable giving the next line for a prompt (EOFError at the end)."""
        buffer: list[str] = []
        while True:
            try:
                line = lines("tensorsql> " if not buffer else "      ...> ")  # type: ignore[operator]
            except EOFError:
                break
            except KeyboardInterrupt:  # Ctrl-C drops the statement being typed
                buffer = []
                continue
            if not buffer and line.strip().startswith("."):
                if not self.command(line):
                    return
                continue
            buffer.append(line)
            statements = _complete("\n".join(buffer))
            if statements is not None:
                buffer = []
                for statement in statements:
                    self.run(statement)
        rest = "\n".join(buffer).strip()
        if rest:  # no final ";": its statements all the same (an open string: as typed)
            for statement in _complete(rest + "\n;") or [rest.rstrip(";")]:
                self.run(statement)


def _complete(text: str) -> list[str] | None:
    """The statements of ``text`` when it ends with a ``;`` that ends a statement (not one in a string, a
    quoted name or a comment), split at each such ``;``; None while a statement is still being typed (the
    shell reads another line). A line ending in ``;`` inside a string cut the string in two."""
    import sqlglot
    from sqlglot.errors import TokenError
    from sqlglot.tokens import TokenType

    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except TokenError:  # an open string, quoted name or comment: the statement goes on
        return None
    if not tokens or tokens[-1].token_type != TokenType.SEMICOLON:
        return None
    out, start = [], 0
    for tok in tokens:
        if tok.token_type == TokenType.SEMICOLON:
            piece = text[start : tok.start].strip()
            if piece:
                out.append(piece)
            start = tok.end + 1
    return out


def cmd_shell(args: argparse.Namespace, out: IO[str]) -> int:
    with _session(args.database) as s:  # type: ignore[attr-defined]
        shell = Shell(s, out)
        if sys.stdin.isatty() and out.isatty():
            from prompt_toolkit import PromptSession
            from prompt_toolkit.history import FileHistory

            history = os.path.join(os.path.expanduser("~"), ".tensorsql_history")
            prompt = PromptSession(history=FileHistory(history))
            out.write(f"tensorsql shell on {args.database}: .help for help, .quit to leave\n")
            shell.loop(prompt.prompt)
        else:

            def read(_prompt: str) -> str:
                line = sys.stdin.readline()
                if not line:
                    raise EOFError
                return line.rstrip("\n")

            shell.loop(read)
    return 0


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tensorsql", description=" ".join(__doc__.split("\n\n")[0].split()))
    sub = ap.add_subparsers(dest="command", required=True)
    p = sub.add_parser("sql", help="run one statement and print its result")
    p.add_argument("database")
    p.add_argument("statement")
    fmt = p.add_mutually_exclusive_group()
    fmt.add_argument("--csv", action="store_true")
    fmt.add_argument("--json", action="store_true")
    fmt.add_argument("--parquet", metavar="FILE")
    p.set_defaults(run=cmd_sql)
    p = sub.add_parser("shell", help="an interactive SQL shell")
    p.add_argument("database")
    p.set_defaults(run=cmd_shell)
    p = sub.add_parser("explain", help="the tensor plans and DuckDB's plan of a statement")
    p.add_argument("database")
    p.add_argument("statement")
    p.set_defaults(run=cmd_explain)
    p = sub.add_parser("import", help="a tensor table from a .npy or .parquet file or a query of rows")
    p.add_argument("database")
    p.add_argument("name")
    p.add_argument("source", help="FILE.npy, FILE.parquet, or a query of rows (i0, ..., value)")
    p.add_argument("--shape", help="the shape for rows: 3,4")
    p.add_argument("--block-shape", help="the block shape: 128,128 (default: tensorsql's)")
    p.add_argument("--dtype", default="float64", help="the dtype for rows (default float64)")
    p.add_argument("--replace", action="store_true", help="overwrite a table of that name")
    p.set_defaults(run=cmd_import)
    p = sub.add_parser("export", help="a tensor table to a .npy or .parquet file")
    p.add_argument("database")
    p.add_argument("name")
    p.add_argument("file")
    p.add_argument("--cells", action="store_true", help="parquet of rows (i0, ..., value), not blocks")
    p.set_defaults(run=cmd_export)
    return ap


def main(argv: Sequence[str] | None = None, out: IO[str] | None = None) -> int:
    from tensorsql.backends.duckdb.errors import wrap
    from tensorsql.errors import TensorSQLError

    args = parser().parse_args(argv)
    database = getattr(args, "database", ":memory:")
    if args.command in ("explain", "export") and database != ":memory:" and not os.path.exists(database):
        sys.stderr.write(f"tensorsql: no database file {database!r}\n")
        return 1
    if args.command in ("sql", "shell") and database != ":memory:" and not os.path.exists(database):
        sys.stderr.write(f"tensorsql: {database!r} does not exist: creating a new database\n")
    try:
        return int(args.run(args, out or sys.stdout))
    except KeyboardInterrupt:
        sys.stderr.write("tensorsql: interrupted\n")
        return 130  # the shell's code for a command ended by SIGINT
    except TensorSQLError as exc:
        sys.stderr.write(f"tensorsql: {type(exc).__name__}: {exc}\n")
        return 1
    except duckdb.Error as exc:  # raised while DuckDB fetched the rows (a cast, a stored table's check)
        typed = wrap(exc, args.command)
        if isinstance(typed, KeyboardInterrupt):
            sys.stderr.write("tensorsql: interrupted\n")
            return 130
        sys.stderr.write(f"tensorsql: {type(typed).__name__}: {typed}\n")
        return 1
    except (OSError, ValueError, pa.ArrowException) as exc:  # a file that cannot be read or written
        sys.stderr.write(f"tensorsql: {type(exc).__name__}: {exc}\n")
        return 1


__all__ = ["Shell", "main", "parser"]
