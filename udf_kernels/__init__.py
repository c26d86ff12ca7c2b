"""Compiled block kernels for tensorsql: a DuckDB loadable extension (``tensorsql_kernels``).

The extension is written in C++17 against DuckDB's stable C extension API and operates on tensor blocks
stored as BLOBs (a block's elements in C order, little-endian, no header). Shapes are ``BIGINT[]`` lists
(``INTEGER[]`` casts implicitly). See :data:`SQL_FUNCTIONS` for the SQL surface.

The extension is unsigned, so the DuckDB connection that loads it must be created with
``duckdb.connect(config={"allow_unsigned_extensions": "true"})``::

    import duckdb, udf_kernels
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(con)
    con.sql("SELECT tensorsql_kernels_version()")

This package does not import tensorsql (the dependency runs tensorsql -> udf_kernels); it raises
:class:`KernelBuildError` / :class:`KernelLoadError`, which tensorsql wraps.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from udf_kernels._errors import KernelBuildError, KernelLoadError

__all__ = [
    "GPU_SQL_FUNCTIONS",
    "KERNEL_PATHS",
    "KERNEL_PATH_ENV",
    "SQL_FUNCTIONS",
    "KernelBuildError",
    "KernelLoadError",
    "extension_path",
    "load",
]

_PACKAGE_DIR = Path(__file__).resolve().parent
EXTENSION_FILE = "tensorsql_kernels.duckdb_extension"

#: The environment variable that selects the float32 GEMM path, read when the extension is loaded into a
#: database (every new DuckDB database reads it again; a second LOAD into the same database does not).
KERNEL_PATH_ENV = "TENSORSQL_KERNEL_PATH"
#: Its values: ``auto`` (the default: ``avx512`` when the CPU has AVX-512F/DQ/VL and FMA, else ``openblas``),
#: ``avx512`` (the packed AVX-512 kernel; loading fails on a CPU without it), ``openblas`` (never the packed
#: kernel) and ``generic`` (no BLAS and no packed kernel: portable loops for every dtype, a reference path).
#: An invalid value makes loading fail with :class:`KernelLoadError`.
KERNEL_PATHS = ("auto", "avx512", "openblas", "generic")

#: Every SQL function the extension registers: name -> signature and one-line description.
#: tests/kernels/test_function_table.py checks it against what DuckDB lists for the loaded extension, both
#: ways.
SQL_FUNCTIONS: dict[str, str] = {
    "tensor_einsum": (
        "tensor_einsum(spec VARCHAR, join VARCHAR, agg VARCHAR, dtype VARCHAR, x BLOB, x_shape BIGINT[], "
        "y BLOB, y_shape BIGINT[]) -> BLOB: Z[lZ] = agg over labels not in lZ of join(X[lX], Y[lY]); "
        "join in multiply|add|subtract|divide|sqdiff|absdiff|max|min, agg in sum|max|min|prod"
    ),
    "tensor_einsum_agg": (
        "tensor_einsum_agg(spec VARCHAR, join VARCHAR, agg VARCHAR, dtype VARCHAR, x BLOB, x_shape BIGINT[], "
        "y BLOB, y_shape BIGINT[]) -> BLOB: aggregate, = tensor_<agg>(tensor_einsum(...), dtype) fused: each "
        "row's block product accumulates into the group's output block (GEMM with beta=1 for multiply/sum); "
        "an empty group gives NULL"
    ),
    "tensor_einsum_path": (
        "tensor_einsum_path(program VARCHAR, dtype VARCHAR, shapes BIGINT[], x0 BLOB, x1 BLOB, ...) -> BLOB: "
        "a tree of binary multiply/sum contractions of single blocks in one call; program is 'i,j:spec' per "
        "step, ';'-separated (operands: the blocks, then the steps' results; the last step's result is "
        "returned), shapes the blocks' shapes concatenated; NULL when a block is NULL; volatile"
    ),
    "tensor_einsum_path_into": (
        "tensor_einsum_path_into(sink BIGINT, start BIGINT[], <tensor_einsum_path's arguments>) -> BIGINT: "
        "the result written into result sink `sink` at `start` (the last step's GEMM writes there in place "
        "when the block is one contiguous run of it); returns the elements written"
    ),
    "tensor_einsum1": (
        "tensor_einsum1(spec VARCHAR, agg VARCHAR, dtype VARCHAR, x BLOB, x_shape BIGINT[]) -> BLOB: "
        "unary einsum (transpose, diagonal, reduction), e.g. 'ij->ji', 'ii->i', 'ij->'"
    ),
    "tensor_map": (
        "tensor_map(fn VARCHAR, dtype VARCHAR, x BLOB [, param DOUBLE]) -> BLOB: elementwise "
        "exp|log|sqrt|relu|neg|abs|pow|scale|square|reciprocal (pow and scale take param)"
    ),
    "tensor_cast": "tensor_cast(x BLOB, from_dtype VARCHAR, to_dtype VARCHAR) -> BLOB: numpy astype",
    "tensor_zeros": "tensor_zeros(dtype VARCHAR, shape BIGINT[]) -> BLOB: an all-zero block",
    "tensor_slice": (
        "tensor_slice(dtype VARCHAR, x BLOB, x_shape BIGINT[], start BIGINT[], stop BIGINT[]) -> BLOB: "
        "x[start0:stop0, ...] in C order"
    ),
    "tensor_slice_strided": (
        "tensor_slice_strided(dtype VARCHAR, x BLOB, x_shape BIGINT[], start BIGINT[], count BIGINT[], "
        "step BIGINT[]) -> BLOB: x[start0 + step0*t0, ...] for t < count (any non-zero step, as numpy's "
        "basic slicing), in C order"
    ),
    "tensor_numel": "tensor_numel(x BLOB, dtype VARCHAR) -> BIGINT: number of elements of the block",
    "tensor_itemsize": "tensor_itemsize(dtype VARCHAR) -> INTEGER: bytes per element",
    "tensor_check": (
        "tensor_check(x BLOB, dtype VARCHAR, shape BIGINT[]) -> BOOLEAN: whether the blob has exactly the "
        "bytes the shape needs"
    ),
    "tensor_to_list": (
        "tensor_to_list(x BLOB, dtype VARCHAR) -> DOUBLE[]: the elements, exactly (float dtypes and the "
        "integers of at most 32 bits; int64/uint64: tensor_to_bigint_list / tensor_to_ubigint_list)"
    ),
    "tensor_to_bigint_list": (
        "tensor_to_bigint_list(x BLOB, dtype VARCHAR) -> BIGINT[]: the elements, exactly (signed integers, "
        "uint8/16/32)"
    ),
    "tensor_to_ubigint_list": (
        "tensor_to_ubigint_list(x BLOB, dtype VARCHAR) -> UBIGINT[]: the elements, exactly "
        "(unsigned integers)"
    ),
    "tensor_from_list": (
        "tensor_from_list(values DOUBLE[]|BIGINT[]|UBIGINT[], dtype VARCHAR) -> BLOB: a block (real dtypes; "
        "each value converted as numpy's astype)"
    ),
    "tensor_get": (
        "tensor_get(x BLOB, dtype VARCHAR, shape BIGINT[], index BIGINT[]) -> DOUBLE: one element "
        "(the dtypes tensor_to_list takes)"
    ),
    "tensor_einsum_into": (
        "tensor_einsum_into(sink BIGINT, start BIGINT[], <tensor_einsum's arguments>) -> BIGINT: the block "
        "product written into result sink `sink` at element coordinates `start` (computed there in place "
        "when the block is one contiguous run of it); returns the elements written"
    ),
    "tensor_einsum_agg_into": (
        "tensor_einsum_agg_into(sink BIGINT, start BIGINT[], <tensor_einsum_agg's arguments>) -> BIGINT: "
        "aggregate, tensor_einsum_agg whose group block is written into result sink `sink` at `start` "
        "instead of returned; returns the elements written"
    ),
    "tensor_sink_write": (
        "tensor_sink_write(sink BIGINT, start BIGINT[], dtype VARCHAR, x BLOB, x_shape BIGINT[]) -> BIGINT: "
        "copies block x into result sink `sink` at `start`; returns the elements written. Sinks are arrays "
        "the caller registers for one query through the C ABI (udf_kernels.sink), never from SQL"
    ),
    "tensor_source": (
        "tensor_source(slot BIGINT [, start BIGINT[], shape BIGINT[]]) -> BLOB: the array lent to slot "
        "`slot` (udf_kernels.sink.Slot), whole in C order or its block of `shape` at element coordinates "
        "`start`; volatile, so a prepared statement reads the slot again at every EXECUTE"
    ),
    "tensor_pin": (
        "tensor_pin(list BIGINT[]) -> BIGINT[]: the list unchanged; volatile, so DuckDB computes it where it "
        "is written (a join side carrying it keeps DuckDB from buffering, and so copying, the join's output)"
    ),
    "tensorsql_kernels_version": "tensorsql_kernels_version() -> VARCHAR: the extension's version",
    "tensorsql_db_token": (
        "tensorsql_db_token() -> BIGINT: the random token of this database's kernel state, to cancel its "
        "kernels and read their progress through the C ABI (udf_kernels.control)"
    ),
    "tensorsql_kernel_path": (
        "tensorsql_kernel_path() -> VARCHAR: the float32 GEMM path of this database "
        f"(avx512|openblas|generic), chosen by {KERNEL_PATH_ENV} (auto|avx512|openblas|generic, "
        "default auto) when the extension was loaded into it"
    ),
    "tensor_program_into": (
        "tensor_program_into(sinks BIGINT[], program VARCHAR, inputs BLOB...) -> BIGINT: a one-block plan's "
        "whole graph (einsums, maps, casts, slices) run in one call, each output written into its result "
        "sink (the program's grammar: udf_kernels/src/program.cpp); returns the elements written"
    ),
    "tensorsql_gemm_plan": (
        "tensorsql_gemm_plan(spec VARCHAR, dtype VARCHAR, x_shape BIGINT[], y_shape BIGINT[]) -> VARCHAR: "
        "how a multiply/sum product of blocks of these shapes maps onto GEMM calls (batches, m, n, k, which "
        "operands are packed, C formed aside or in tiles); computes nothing"
    ),
    "tensor_sum": "tensor_sum(x BLOB, dtype VARCHAR) -> BLOB: aggregate, elementwise sum (same-size blocks)",
    "tensor_max": "tensor_max(x BLOB, dtype VARCHAR) -> BLOB: aggregate, elementwise max (real dtypes)",
    "tensor_min": "tensor_min(x BLOB, dtype VARCHAR) -> BLOB: aggregate, elementwise min (real dtypes)",
    "tensor_prod": "tensor_prod(x BLOB, dtype VARCHAR) -> BLOB: aggregate, elementwise product",
    "tensor_assemble": (
        "tensor_assemble(dtype VARCHAR, x BLOB, x_shape BIGINT[], offset BIGINT[], out_shape BIGINT[]) "
        "-> BLOB: aggregate, writes each piece at offset in a zero block of out_shape"
    ),
    "tensor_pack": (
        "tensor_pack(dtype VARCHAR, idx BIGINT, value DOUBLE|BIGINT|UBIGINT, numel BIGINT) -> BLOB: "
        "aggregate, block of numel elements from (flat index, value) rows; duplicates are summed"
    ),
}

#: The functions of the GPU kernel set, the companion extension ``tensorsql_cuda`` (``udf_kernels/cuda``,
#: built by ``udf_kernels.gpu_build``). ``device`` is the CUDA ordinal; the other arguments are those of the
#: CPU function of the same name without ``_cuda`` (float32/float64 blocks only). tests/gpu/test_gpu.py checks
#: it against what DuckDB lists for the loaded (emulated) extension.
GPU_SQL_FUNCTIONS: dict[str, str] = {
    "tensor_cuda_info": (
        "tensor_cuda_info() -> VARCHAR: what the device layer sees: 'cuda: <n> device(s): <i> <name> (<MiB> "
        "MiB, sm_<cc>); ... built for sm_<archs>; cublas: <library>', or 'error: <why>'"
    ),
    "tensor_einsum_cuda": "tensor_einsum_cuda(device BIGINT, <tensor_einsum's arguments>) -> BLOB",
    "tensor_einsum1_cuda": "tensor_einsum1_cuda(device BIGINT, <tensor_einsum1's arguments>) -> BLOB",
    "tensor_map_cuda": "tensor_map_cuda(device BIGINT, fn VARCHAR, dtype VARCHAR, x BLOB) -> BLOB",
    "tensor_map_param_cuda": (
        "tensor_map_param_cuda(device BIGINT, fn VARCHAR, dtype VARCHAR, x BLOB, param DOUBLE) -> BLOB"
    ),
}


def extension_path() -> Path:
    """Path of ``tensorsql_kernels.duckdb_extension``, building it if needed.

    In a source checkout, builds into ``udf_kernels/_build/`` when the sources are newer than the last
    build; in an installed package, uses the file ``pip install`` built and shipped beside this module.
    Raises :class:`KernelBuildError` when none can be had.
    """
    from udf_kernels import build as _build

    # a source checkout builds from its sources (rebuilt only when they changed); an installed wheel
    # carries the file that `pip install` built
    if _build.SRC_DIR.is_dir() and any(_build.SRC_DIR.glob("*.cpp")):
        return _build.build()
    shipped = _PACKAGE_DIR / EXTENSION_FILE
    if shipped.is_file():
        return shipped
    if _build.BUILT_PATH.is_file():
        return _build.BUILT_PATH
    raise KernelBuildError(
        f"no prebuilt {EXTENSION_FILE} in {_PACKAGE_DIR} and no sources in {_build.SRC_DIR} to build it from"
    )


def _sql_string(text: str) -> str:
    """The path as a SQL string literal, quoted by sqlglot (sqlglot has no LOAD statement node)."""
    from sqlglot import exp

    return exp.Literal.string(text).sql(dialect="duckdb")


def load(con: Any, path: Path | None = None) -> Path:
    """Load the extension (or the extension file ``path``: the GPU kernel set) into the DuckDB connection
    ``con`` and return its path.

    ``con`` must have been created with ``config={"allow_unsigned_extensions": "true"}``. Loading twice into
    the same connection is harmless.
    """
    import duckdb

    path = extension_path() if path is None else path
    try:
        con.execute("LOAD " + _sql_string(str(path))).fetchall()
    except duckdb.Error as exc:
        hint = ""
        if "signature" in str(exc) or "unsigned" in str(exc):
            hint = " (the DuckDB connection must be created with config={'allow_unsigned_extensions': "
            hint += "'true'})"
        raise KernelLoadError(f"could not load {path}: {exc}{hint}") from exc
    return path
