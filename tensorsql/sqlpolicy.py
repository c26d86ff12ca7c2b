"""The statements ``Session.sql`` and ``Session.execute`` refuse, so tensor tables stay whole: a tensor table
holds each block once beside its catalog entry, and a write, rename, replace or shadowing temporary table by
plain SQL would leave a wrong tensor or a stale entry. Pure checks of sqlglot statements against the
catalog; a refusal is a typed error that says what to do instead."""

from __future__ import annotations

import re

import sqlglot
from sqlglot import exp

from tensorsql import metadata
from tensorsql.errors import CatalogError, SQLFrontendError

#: the word that makes a table temporary (CREATE TEMP[ORARY] ..., temp.X)
TEMP_WORD = re.compile(r"\btemp(orary)?\b", re.IGNORECASE)


def tensor_name(target: object, catalog: object) -> str | None:
    """The catalog's name for a table reference that is a tensor table (unqualified, or qualified with the
    current database and schema: ``memory.main.X`` too); None for anything else (a plain table, a view, a
    temporary table). A tensor table of another schema's or database's catalog is refused: its entry is
    that catalog's (``DROP TABLE main.X`` while another schema is current dropped the current one's X)."""
    if isinstance(target, exp.Schema):
        target = target.this
    if not isinstance(target, exp.Table) or not isinstance(target.this, exp.Identifier):
        return None
    if in_temp(target):
        return None  # a temporary table is never a tensor table
    database, schema = target.text("catalog"), target.text("db")
    if database or schema:
        here_db, here_schema = catalog.here()  # type: ignore[attr-defined]
        if not database and metadata.fold(schema) == metadata.fold(here_db):
            schema = here_schema  # "memory.X": DuckDB reads a database's name there as the database
        if (database and metadata.fold(database) != metadata.fold(here_db)) or (
            schema and metadata.fold(schema) != metadata.fold(here_schema)
        ):
            where_db, where_schema = database or here_db, schema or here_schema
            if catalog.listed_in(where_db, where_schema, target.name):  # type: ignore[attr-defined]
                raise CatalogError(
                    f"{target.sql(dialect='duckdb')} is a tensor table of {where_db}.{where_schema}'s own "
                    f"catalog; write or drop it from a session whose current schema is that one"
                )
            return None
    want = metadata.fold(target.name)
    for name in catalog.names():  # type: ignore[attr-defined]
        if metadata.fold(name) == want:
            return name
    return None


def dropped_tensors(statement: exp.Expression, catalog: object) -> tuple[list[str], list[exp.Table]]:
    """The tensor tables a ``DROP TABLE`` names (dropped with their catalog entries, as ``Session.drop``) and
    the other tables it names (dropped by DuckDB first, so a failure there drops nothing). tensorsql's own
    tables (its catalog, its temporary tables) are refused: the catalog dropped lost every tensor's entry."""
    kind = str(statement.args.get("kind", "")).upper() if isinstance(statement, exp.Drop) else ""
    if kind not in ("TABLE", "VIEW"):
        return [], []
    tables = list(statement.args.get("tables") or ([statement.this] if statement.this else []))
    for t in tables:
        if isinstance(t, exp.Table) and metadata.is_reserved(t.name):
            raise CatalogError(
                f"dropping {t.name!r} is refused: it is tensorsql's own ({metadata.CATALOG!r} holds the "
                "catalog of every tensor table; drop tensors by their names)"
            )
    if kind != "TABLE":
        return [], []
    tensors = [t for t in tables if tensor_name(t, catalog) is not None]
    names = list(dict.fromkeys(str(tensor_name(t, catalog)) for t in tensors))  # DROP TABLE A, A: once
    return names, [t for t in tables if t not in tensors]


def in_temp(table: exp.Table) -> bool:
    """A name in DuckDB's ``temp`` catalog (``temp.A``, ``temp.main.A``)."""
    database = table.text("catalog")
    return database.lower() == "temp" or (not database and table.text("db").lower() == "temp")


def created(create: exp.Create) -> exp.Expression:
    """The table a CREATE makes (``CREATE TABLE t (a INT)`` wraps it in its column list)."""
    return create.this.this if isinstance(create.this, exp.Schema) else create.this


def temporary(create: exp.Create) -> bool:
    """CREATE TEMP TABLE, or a table made in DuckDB's ``temp`` catalog."""
    props = create.args.get("properties")
    if props and any(isinstance(p, exp.TemporaryProperty) for p in props.expressions):
        return True
    target = created(create)
    return isinstance(target, exp.Table) and in_temp(target)


def wrapped(statement: exp.Expression) -> exp.Expression | None:
    """The statement inside ``EXPLAIN ANALYZE <it>`` (which runs it) or ``PREPARE name AS <it>`` (run by a
    later ``EXECUTE``): sqlglot reads those as an opaque Command, which DuckDB would run unchecked (a DELETE
    of a tensor's rows, an UPDATE of the catalog). Found by tokens (a quoted name, a comment, a parameter list
    before ``AS``); one whose body cannot be found or read is refused (SQLFrontendError), never run
    unchecked. None for any other statement."""
    if not isinstance(statement, exp.Command) or not isinstance(statement.expression, exp.Literal):
        return None
    verb, text = statement.name.upper(), statement.expression.name
    if verb not in ("EXPLAIN", "PREPARE"):
        return None
    refused = SQLFrontendError(
        f"sql cannot read the statement this {verb} runs, so it cannot check that it leaves the tensor "
        f"tables whole; run it without the {verb}, or through execute() on your own responsibility"
    )
    try:
        tokens = sqlglot.tokenize(text, read="duckdb")
    except (sqlglot.errors.SqlglotError, RecursionError) as exc:
        raise refused from exc
    at = 0
    if verb == "EXPLAIN":
        if tokens and tokens[0].text.upper() in ("ANALYZE", "ANALYSE"):
            at = 1
        elif tokens and tokens[0].token_type == sqlglot.TokenType.L_PAREN:  # EXPLAIN (ANALYZE, ...) stmt
            at = _past_group(tokens, 0)
        else:
            return None  # a plain EXPLAIN runs nothing
    else:
        at = 1  # the prepared statement's name (quoted, or not)
        if at < len(tokens) and tokens[at].token_type == sqlglot.TokenType.L_PAREN:  # its parameter types
            at = _past_group(tokens, at)
        if at >= len(tokens) or tokens[at].text.upper() != "AS":
            raise refused
        at += 1
    if at <= 0 or at >= len(tokens):
        raise refused
    end = len(tokens)
    while tokens[at].token_type == sqlglot.TokenType.L_PAREN and _past_group(tokens, at) == end:
        at, end = at + 1, end - 1  # EXPLAIN ANALYZE (DELETE FROM A)
        if at >= end:
            raise refused
    try:
        body = text[tokens[at].start : tokens[end - 1].end + 1]
        parsed = [s for s in sqlglot.parse(body, read="duckdb") if s is not None]
    except (sqlglot.errors.SqlglotError, RecursionError) as exc:
        raise refused from exc
    if len(parsed) != 1:
        raise refused
    return parsed[0]


def _past_group(tokens: list, at: int) -> int:
    """The index after the parenthesized group opening at ``tokens[at]`` (-1 when it does not close)."""
    depth = 0
    for i in range(at, len(tokens)):
        kind = tokens[i].token_type
        depth += kind == sqlglot.TokenType.L_PAREN
        depth -= kind == sqlglot.TokenType.R_PAREN
        if depth == 0:
            return i + 1
    return -1


def refuse_wrapped(statement: exp.Expression, catalog: object) -> None:
    """``EXPLAIN ANALYZE`` / ``PREPARE`` of a statement ``sql`` refuses on its own is refused the same way,
    and so is a DROP of a tensor table inside one (only a DROP statement drops a tensor with its entry)."""
    inner = wrapped(statement)
    if inner is None:
        return
    refuse_wrapped(inner, catalog)
    dropped, _ = dropped_tensors(inner, catalog)
    if dropped:
        raise CatalogError(
            f"{statement.name.upper()} of a DROP refused: {dropped[0]!r} is a tensor table; drop a tensor "
            "with DROP TABLE (or drop()), which drops its catalog entry with it"
        )
    refuse_writes(inner, catalog)


def refuse_writes(statement: exp.Expression, catalog: object) -> None:
    """A tensor table holds each block once, with its catalog entry: rows inserted, changed or deleted, a
    table renamed or replaced by a plain one would leave a tensor that is wrong or an entry that is stale."""
    kinds = {
        exp.Insert: "INSERT INTO",
        exp.Update: "UPDATE",
        exp.Delete: "DELETE FROM",
        exp.Alter: "ALTER TABLE",
        exp.TruncateTable: "TRUNCATE",
        exp.Create: "CREATE OR REPLACE",
        exp.Merge: "MERGE INTO",
        exp.Copy: "COPY ... FROM",
    }
    for kind, verb in kinds.items():
        if not isinstance(statement, kind):
            continue
        if isinstance(statement, exp.Copy) and not statement.args.get("kind"):
            return  # COPY ... TO reads the table
        if isinstance(statement, exp.TruncateTable):
            targets = list(statement.expressions)
        else:
            targets = [statement.this]
        # ``INSERT INTO t (a, b) ...`` names its table inside a column list
        targets = [t.this if isinstance(t, exp.Schema) else t for t in targets]
        for target in targets:  # tensorsql's own catalog: a TRUNCATE or a rename lost every tensor's entry
            if isinstance(target, exp.Table) and metadata.is_reserved(target.name) and not (
                isinstance(statement, exp.Create) and not statement.args.get("replace")
            ):
                raise CatalogError(
                    f"{verb} {target.name!r} refused: it is tensorsql's own ({metadata.CATALOG!r} holds the "
                    "tensors' entries); use save(), drop() and the tensor statements"
                )
        if isinstance(statement, exp.Create) and temporary(statement):
            # a temporary table of a tensor's name hides the tensor from every read, and a DROP of the name
            # then drops the user's temporary table with the tensor's catalog entry (temp.A too: the name is
            # looked up bare)
            target = created(statement)
            bare = exp.Table(this=target.this) if isinstance(target, exp.Table) else target
            name = tensor_name(bare, catalog)
            if name is not None:
                raise CatalogError(
                    f"a temporary table named {name!r} is refused: {name!r} is a tensor table, which it "
                    "would hide from every read; give the temporary table another name"
                )
            return
        if isinstance(statement, exp.Create) and not statement.args.get("replace"):
            return  # a plain CREATE of an existing name fails in DuckDB, typed
        for target in targets:
            name = tensor_name(target, catalog)
            if name is not None:
                raise CatalogError(
                    f"{verb} refused: {name!r} is a tensor table, written whole with its catalog entry; "
                    "replace it (CREATE OR REPLACE TABLE ... AS SELECT * FROM einsum(...)) or drop it"
                )


def refuse_shadows(query: str | exp.Expression, catalog: object) -> None:
    """A temporary table or view of a tensor's name is refused in ``execute`` too, as in ``sql``: every read
    of the tensor would read it instead (an empty one: a tensor of zeros). Other statements run as given."""
    if isinstance(query, str):
        if not TEMP_WORD.search(query):  # no CREATE TEMP[ORARY] nor temp.X: nothing to parse
            return
        try:
            statements = sqlglot.parse(query, read="duckdb")
        except (sqlglot.errors.SqlglotError, RecursionError):
            return  # DuckDB's own syntax sqlglot cannot read: DuckDB runs it or says why
    else:
        statements = [query]
    for statement in statements:
        if isinstance(statement, exp.Create) and temporary(statement):
            refuse_writes(statement, catalog)
