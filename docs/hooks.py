"""mkdocs hook: the SQL function reference page, generated at build time from the extension's function table
(``udf_kernels.SQL_FUNCTIONS`` and ``udf_kernels.GPU_SQL_FUNCTIONS``), so it can never go stale.

tests/kernels/test_function_table.py checks that table against what DuckDB lists for the loaded extension,
both ways.
"""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = "reference/sql-functions.md"


def _entry(name: str, text: str) -> str:
    """``name(args) -> TYPE: description`` as a heading, the signature and the description."""
    head, sep, desc = text.partition(": ")
    marker = ") -> "
    cut = text.find(": ", text.find(marker) + len(marker)) if marker in text else -1
    if cut >= 0:
        head, desc = text[:cut], text[cut + 2 :]
    elif not sep:
        head, desc = text, ""
    kind = "aggregate" if desc.startswith("aggregate,") else "scalar"
    if kind == "aggregate":
        desc = desc[len("aggregate,") :].strip()
    desc = desc.replace("<", "&lt;").replace(">", "&gt;")
    return f"### `{name}`\n\n```sql\n{head}\n```\n\n*{kind}* — {desc}\n"


def page() -> str:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    import udf_kernels

    out = [
        "# SQL functions of the extension",
        "",
        "Generated when the documentation is built, from the extension's function table "
        "(`udf_kernels.SQL_FUNCTIONS`; the test suite checks it against the functions the loaded extension "
        "registers in DuckDB, both ways). How to load the extension into any DuckDB connection, and what the "
        "kernels promise, is in [Kernels](../internals/kernels.md).",
        "",
        "Blocks are `BLOB`s holding a block's elements in C order, little-endian, no header; shapes are "
        "`BIGINT[]` lists (`INTEGER[]` casts implicitly); `dtype` is a dtype name such as `'float32'`.",
        "",
        "## CPU kernels (`tensorsql_kernels`)",
        "",
    ]
    for name in sorted(udf_kernels.SQL_FUNCTIONS):
        out.append(_entry(name, udf_kernels.SQL_FUNCTIONS[name]))
    out += [
        "## GPU kernels (`tensorsql_cuda`)",
        "",
        "The companion extension for CUDA GPUs (see [GPUs](../user-guide/gpu.md)). `device` is the "
        "CUDA ordinal; the other arguments are those of the CPU function of the same name without `_cuda` "
        "(float32/float64 blocks only).",
        "",
    ]
    for name in sorted(udf_kernels.GPU_SQL_FUNCTIONS):
        out.append(_entry(name, udf_kernels.GPU_SQL_FUNCTIONS[name]))
    return "\n".join(out)


def on_files(files, config):
    from mkdocs.structure.files import File  # mkdocs only where the docs are built

    files.append(File.generated(config, PAGE, content=page()))
    return files


OPERATOR_TABLE = "<!-- operator-table: generated from tensorsql/ir/ops.py when the docs are built -->"


def on_page_markdown(markdown, page, config, files):
    """The operator table from ``tensorsql.ir.ops``, the one source the checks and dtype rules derive from."""
    if OPERATOR_TABLE in markdown:
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from tensorsql.ir import ops

        markdown = markdown.replace(OPERATOR_TABLE, ops.markdown_table())
    return markdown
