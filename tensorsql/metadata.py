"""Stored tensors' names and metadata, checked at the API boundary.

Names follow DuckDB's rule for identifiers, tensorsql-wide: ASCII letters compare without case ("A" and "a"
are one table), every other character exactly; ``tensorsql_catalog`` and names starting with ``_ts_`` are
tensorsql's own, in any case.

Metadata (dtype, shape, block shape) is checked where it is read back, from a catalog row or an Arrow schema.
Either may have been edited by hand, so every field is validated before anything is sized by it; a bad one is
a ``CatalogError`` that names the source and the field (never a raw ValueError, ZeroDivisionError,
RecursionError or MemoryError from further down).
"""

from __future__ import annotations

import json
import math
import string

from tensorsql.dtypes import DTYPES
from tensorsql.errors import CatalogError, TableNameError

#: the catalog table of a database
CATALOG = "tensorsql_catalog"
#: tensorsql's own tables and views (uploads, temporaries, prepared statements): never a user's name
RESERVED_PREFIX = "_ts_"
_FOLD = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)

#: JSON text of a shape longer than this was not written by tensorsql (and is not parsed)
MAX_JSON_CHARS = 4096
#: more dimensions than any kernel spec can label
MAX_RANK = 52
#: block keys are INTEGER columns: blocks per dimension
MAX_BLOCKS_PER_DIM = 2**31 - 1
#: one block is one DuckDB BLOB (and the kernels' limit for a block)
MAX_BLOB_BYTES = 2**32 - 1
#: the whole tensor must be addressable (numpy's limit on an array's bytes)
MAX_TENSOR_BYTES = 2**63 - 1


def fold(name: str) -> str:
    """A name's identity in DuckDB: ASCII letters lowered, every other character as it is."""
    return name.translate(_FOLD)


def is_reserved(name: str) -> bool:
    key = fold(name)
    return key == CATALOG or key.startswith(RESERVED_PREFIX)


def check_name(name: object, what: str) -> str:
    """A user's table name as a plain ``str``, or a typed error: not a str, empty, or reserved (in any case).
    A str subclass becomes a plain str, so no overridden method of it reaches SQL or a message."""
    if not isinstance(name, str):
        raise TableNameError(f"{what}: a table name must be a str, got {type(name).__name__}")
    name = str.__str__(name)
    if not name:
        raise CatalogError(f"{what}: a table name must be a non-empty string, got ''")
    if is_reserved(name):
        raise CatalogError(
            f"{what}: table name {name!r} is reserved by tensorsql ({CATALOG!r} and names starting with "
            f"{RESERVED_PREFIX!r}, in any case: DuckDB's names ignore the case of ASCII letters)"
        )
    return name


def ints(where: str, field: str, text: object, low: int) -> tuple[int, ...]:
    """A JSON list of ints >= ``low`` (a shape or block shape), or a CatalogError naming the field."""
    if isinstance(text, bytes):
        try:
            text = text.decode()
        except UnicodeDecodeError as exc:
            raise CatalogError(f"{where}: {field} is not UTF-8 text ({exc})") from exc
    if not isinstance(text, str):
        raise CatalogError(f"{where}: {field} is {text!r}, not JSON text")
    if len(text) > MAX_JSON_CHARS:
        raise CatalogError(f"{where}: {field} is {len(text)} characters long, not a shape")
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise CatalogError(f"{where}: {field} {text[:80]!r} is not JSON ({exc})") from exc
    if not isinstance(value, list) or len(value) > MAX_RANK:
        raise CatalogError(f"{where}: {field} {text[:80]!r} is not a list of at most {MAX_RANK} ints")
    for d, v in enumerate(value):
        if type(v) is not int or not low <= v <= MAX_TENSOR_BYTES:
            raise CatalogError(f"{where}: {field}[{d}] = {v!r} is not an int in {low}..{MAX_TENSOR_BYTES}")
    return tuple(value)


def parse(
    where: str, dtype: object, shape: object, block_shape: object
) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """Validated (dtype, shape, block_shape) from their stored text; ``where`` names the source in errors."""
    if isinstance(dtype, bytes):
        dtype = dtype.decode(errors="replace")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise CatalogError(f"{where}: dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    shp = ints(where, "shape", shape, 0)
    bs = ints(where, "block_shape", block_shape, 1)
    if len(shp) != len(bs):
        raise CatalogError(
            f"{where}: shape {list(shp)} has {len(shp)} dimensions, block_shape {list(bs)} has {len(bs)}"
        )
    size = DTYPES[dtype].itemsize
    for d, (n, b) in enumerate(zip(shp, bs, strict=True)):
        if -(-n // b) > MAX_BLOCKS_PER_DIM:
            raise CatalogError(
                f"{where}: shape[{d}] = {n} in blocks of {b} is more than {MAX_BLOCKS_PER_DIM} blocks "
                "(block keys are INTEGER)"
            )
    if math.prod(shp) * size > MAX_TENSOR_BYTES:
        raise CatalogError(f"{where}: shape {list(shp)} of {dtype} is more than {MAX_TENSOR_BYTES} bytes")
    block_bytes = math.prod(min(b, max(n, 1)) for n, b in zip(shp, bs, strict=True)) * size
    if block_bytes > MAX_BLOB_BYTES:
        raise CatalogError(
            f"{where}: block_shape {list(bs)} of {dtype} is {block_bytes} bytes a block; a block is at most "
            f"{MAX_BLOB_BYTES} bytes"
        )
    return dtype, shp, bs


__all__ = [
    "CATALOG",
    "MAX_BLOB_BYTES",
    "MAX_RANK",
    "RESERVED_PREFIX",
    "check_name",
    "fold",
    "ints",
    "is_reserved",
    "parse",
]
