"""SQL macros stored in a tensorsql database, so that plain DuckDB clients (the CLI, any driver) with the
extension loaded can read tensor tables as rows without the Python front end.

``tensor_cells('A')``: rows ``(index BIGINT[], value DOUBLE)`` of tensor table ``A``, one per element. A
table macro over ``query_table`` and the catalog, planned by DuckDB like any query: each block of the grid
(a zero block for one the table leaves out) has its elements unnested in C order and each flat position
turned back into the tensor's indices (edge blocks are smaller; their extents come from the key).
int64/uint64 values pass through DOUBLE (exact up to 2**53); complex tensors are refused by
``tensor_to_list``. The Python front end's ``tensor_cells`` (``s.sql``) gives ``(i0, ..., value)`` columns
and exact integers.
"""

from __future__ import annotations

import duckdb

NAME = "tensor_cells"

#: a constant statement (no user data in it): the macro's definition
TENSOR_CELLS = """
CREATE OR REPLACE MACRO tensor_cells(tensor_table) AS TABLE
WITH ts_named AS (
    -- the tensor's name as the catalog holds it: '"x.y"' (quoted, as a name with a dot must be) is x.y
    SELECT CASE
        WHEN len(tensor_table) >= 2 AND starts_with(tensor_table, '"') AND ends_with(tensor_table, '"')
        THEN replace(tensor_table[2:-2], '""', '"')
        ELSE tensor_table
    END AS bare
), meta AS (
    -- the catalog and the table both read in the current schema: after USE s2, the catalog's
    -- name found main's while the table's found s2's (a plain table read as the tensor)
    SELECT CAST(shape AS BIGINT[]) AS shp, CAST(block_shape AS BIGINT[]) AS bs, dtype
    FROM query_table(concat(
        '"', replace(current_database(), '"', '""'), '"."', replace(current_schema(), '"', '""'),
        '".tensorsql_catalog'
    )), ts_named
    WHERE translate(name, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
        = translate(bare, 'ABCDEFGHIJKLMNOPQRSTUVWXYZ', 'abcdefghijklmnopqrstuvwxyz')
), found AS (
    -- no catalog row (a schema-qualified name, a plain table): an error, not zero rows
    SELECT CASE WHEN count(*) = 1 THEN 1 ELSE CAST(error(concat(
        'tensor_cells: ', tensor_table, ' is not a tensor table of this database (name it as saved, ',
        'in double quotes if the name has a dot or a quote: tensor_cells(''"x.y"''))'
    )) AS INTEGER) END AS ok
    FROM meta
), grid_size AS (
    SELECT shp, bs, dtype,
        list_transform(range(len(shp)), lambda d: greatest(1, (shp[d + 1] + bs[d + 1] - 1) // bs[d + 1])) AS n
    FROM meta, found
    WHERE found.ok = 1
), ts_grid AS (
    -- every block of the grid, the pad last: a block the table leaves out is zeros, and so are its cells
    SELECT list_append(
        list_transform(
            range(len(n)),
            lambda d: (g // CAST(coalesce(list_aggregate(n[d + 2:], 'product'), 1) AS BIGINT)) % n[d + 1]
        ),
        -1
    ) AS keys
    FROM grid_size, range(CAST(coalesce(list_aggregate(n, 'product'), 1) AS BIGINT)) AS t(g)
), blocks AS (
    -- the key columns in order, then a pad (so a 0-d tensor, which has no keys, still gives a list)
    SELECT CAST(list_value(*COLUMNS('^(k[0-9]+|__ts_pad)$')) AS BIGINT[]) AS keys, tensor
    FROM query_table(concat(
        '"', replace(current_database(), '"', '""'), '"."', replace(current_schema(), '"', '""'), '"."',
        replace(CASE
        WHEN len(tensor_table) >= 2 AND starts_with(tensor_table, '"') AND ends_with(tensor_table, '"')
        THEN replace(tensor_table[2:-2], '""', '"')
        ELSE tensor_table
    END, '"', '""'), '"')), (SELECT -1 AS __ts_pad)
), keys_ok AS (
    -- a key outside the grid or twice: an error (the grid's LEFT JOIN dropped one, doubled the other)
    SELECT CASE WHEN count(*) = 0 THEN 1 ELSE CAST(error(concat(
        'tensorsql: corrupted stored table ', tensor_table, ': block key ',
        CAST(list_resize(min(bad), len(min(bad)) - 1) AS VARCHAR),
        ' lies outside its block grid or appears twice'
    )) AS INTEGER) END AS ok
    FROM (
        SELECT keys AS bad FROM blocks GROUP BY keys HAVING count(*) > 1
        UNION ALL
        SELECT blocks.keys FROM blocks ANTI JOIN ts_grid ON blocks.keys = ts_grid.keys
    )
), extents AS (
    SELECT
        ts_grid.keys AS keys, bs, dtype, tensor,
        list_transform(
            range(len(shp)), lambda d: least(bs[d + 1], shp[d + 1] - ts_grid.keys[d + 1] * bs[d + 1])
        ) AS e
    FROM ts_grid LEFT JOIN blocks ON ts_grid.keys = blocks.keys, grid_size, keys_ok
    WHERE keys_ok.ok = 1
), unpacked AS (
    SELECT
        keys, bs, e,
        CASE
            WHEN tensor IS NULL THEN list_transform(
                range(CAST(coalesce(list_aggregate(e, 'product'), 1) AS BIGINT)), lambda i: CAST(0 AS DOUBLE)
            )
            WHEN dtype = 'int64' THEN CAST(tensor_to_bigint_list(tensor, dtype) AS DOUBLE[])
            WHEN dtype = 'uint64' THEN CAST(tensor_to_ubigint_list(tensor, dtype) AS DOUBLE[])
            ELSE tensor_to_list(tensor, dtype)
        END AS l
    FROM extents
), ts_checked AS (
    -- a blob of another length than its block's: an error (its cells came out under other keys)
    SELECT keys, bs, e, CASE
        WHEN len(l) = CAST(coalesce(list_aggregate(e, 'product'), 1) AS BIGINT) THEN l
        ELSE CAST(error(concat(
            'tensorsql: corrupted stored table ', tensor_table, ': block key ',
            CAST(list_resize(keys, len(keys) - 1) AS VARCHAR), ' has ', len(l),
            ' elements but its block needs ', CAST(coalesce(list_aggregate(e, 'product'), 1) AS BIGINT)
        )) AS DOUBLE[])
    END AS l
    FROM unpacked
), cells AS (
    SELECT keys, bs, e, unnest(l) AS value, generate_subscripts(l, 1) - 1 AS f FROM ts_checked
)
SELECT
    list_transform(
        range(len(e)),
        lambda d: keys[d + 1] * bs[d + 1]
            + (f // CAST(coalesce(list_aggregate(e[d + 2:], 'product'), 1) AS BIGINT)) % e[d + 1]
    ) AS index,
    value
FROM cells
"""


#: a word of the current definition: a database holding an older one gets this one on its next save (names
#: match as DuckDB's table names do, ASCII letters in any case: its ``lower`` folded every letter, and a
#: tensor 'Äx' read 'äx''s catalog row too; the cells of a block a table leaves out were left out; a name
#: with a dot or a quote, or a schema-qualified one, read no catalog row: zero rows, no error; a blob of the
#: wrong length or a key outside the grid or twice gave cells under other keys; after ``USE s2`` the
#: catalog was main's and the table s2's)
MARKER = "ts_checked"


def _current(con: duckdb.DuckDBPyConnection) -> bool:
    query = (
        "SELECT macro_definition FROM duckdb_functions() "
        "WHERE function_name = ? AND database_name = current_database()"
    )
    rows = con.execute(query, [NAME]).fetchall()
    return any(MARKER in (definition or "") for (definition,) in rows)


def ensure(con: duckdb.DuckDBPyConnection) -> None:
    """The macros, in this database, as this version defines them (made or replaced on a save)."""
    if not _current(con):
        con.execute(TENSOR_CELLS)


__all__ = ["NAME", "TENSOR_CELLS", "ensure"]
