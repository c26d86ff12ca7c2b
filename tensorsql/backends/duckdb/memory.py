"""A session's memory settings: ``memory_limit``, ``temp_directory`` and the block cap (docs "Memory and
limits").

Sizes are given as DuckDB writes them (``"2GB"``, ``"512 MiB"``, ``"80%"`` of the machine's memory) or as an
int of bytes, and parsed here once: the same number of bytes goes to DuckDB's ``memory_limit`` and to the
kernels' own budget (``udf_kernels.control``), and the default block cap derives from it.
"""

from __future__ import annotations

import functools
import os
import re

import duckdb

from tensorsql.errors import ConfigError
from tensorsql.ir.blocking import LIMIT_BLOCK_BYTES, MAX_BLOCK_BYTES, MIN_BLOCK_BYTES

#: DuckDB's units: powers of 1000 (KB, MB, ...) and of 1024 (KiB, MiB, ...), case-insensitive
_UNITS = {
    "b": 1,
    "byte": 1,
    "bytes": 1,
    "kb": 10**3,
    "kilobyte": 10**3,
    "kilobytes": 10**3,
    "mb": 10**6,
    "megabyte": 10**6,
    "megabytes": 10**6,
    "gb": 10**9,
    "gigabyte": 10**9,
    "gigabytes": 10**9,
    "tb": 10**12,
    "terabyte": 10**12,
    "terabytes": 10**12,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]+|%)\s*$")
#: the least memory_limit a session opens with (DuckDB and the kernel extension need a few MiB themselves)
MIN_MEMORY_LIMIT = 8 << 20
#: the environment variable that sets the block cap of sessions that do not give one
BLOCK_ENV = "TENSORSQL_MAX_BLOCK_BYTES"
#: blocks a kernel call may hold at once (operands, output, packing scratch, DuckDB's copy of its result, an
#: aggregate's state), with room to spare: the default cap lets every thread hold that many within the limit
_BLOCKS_PER_THREAD = 8


def system_memory() -> int:
    """Physical memory of this machine in bytes (what a percentage is of)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError) as exc:  # not POSIX: percentages cannot be resolved
        raise ConfigError(f"cannot read this machine's memory size for a percentage: {exc}") from exc


@functools.cache
def duckdb_default_limit() -> int:
    """DuckDB's default memory_limit in this process (80% of the memory it sees, a container's limit
    included), in bytes: read once from a database of its own."""
    con = duckdb.connect(":memory:")
    try:
        shown = str(con.execute("SELECT current_setting('memory_limit')").fetchall()[0][0])
    finally:
        con.close()
    try:
        return parse_size(shown, "memory_limit")
    except ConfigError:
        return system_memory()


def parse_size(value: object, what: str) -> int:
    """Bytes of an int (bytes) or a DuckDB size string (``"2GB"``, ``"1.5 GiB"``, ``"80%"``); ConfigError
    naming ``what`` for anything else."""
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r} must be an int of bytes or a size string such as '2GB'")
    if isinstance(value, int):
        if value < 1:
            raise ConfigError(f"{what}={value!r} must be a positive number of bytes")
        return value
    if not isinstance(value, str):
        raise ConfigError(
            f"{what}={value!r} must be an int of bytes or a size string such as '2GB' "
            f"(got {type(value).__name__})"
        )
    m = _SIZE.match(value)
    if m is None:
        raise ConfigError(
            f"{what}={value!r} is not a size: give a number and a unit (KB, MB, GB, TB for powers of 1000; "
            "KiB, MiB, GiB, TiB for powers of 1024; B; or % of this machine's memory), or an int of bytes"
        )
    number, unit = float(m.group(1)), m.group(2).lower()
    if unit == "%":
        if not 0 < number <= 100:
            raise ConfigError(f"{what}={value!r}: a percentage must lie in (0, 100]")
        size = int(system_memory() * number / 100)
    elif unit in _UNITS:
        size = int(number * _UNITS[unit])
    else:
        units = "KB, MB, GB, TB, KiB, MiB, GiB, TiB, B or %"
        raise ConfigError(f"{what}={value!r}: unknown unit {m.group(2)!r} (one of {units})")
    if size < 1:
        raise ConfigError(f"{what}={value!r} is less than one byte")
    return size


def memory_limit(value: object) -> int | None:
    """``connect(memory_limit=...)`` in bytes, or None (DuckDB's default: 80% of the machine's memory)."""
    if value is None:
        return None
    size = parse_size(value, "memory_limit")
    if size >= 1 << 62:  # DuckDB's setting overflows past this ("Memory value out of range")
        raise ConfigError(f"memory_limit={value!r} is more than DuckDB can be given (below 2**62 bytes)")
    if size < MIN_MEMORY_LIMIT:
        raise ConfigError(
            f"memory_limit={value!r} ({size} bytes) is below the {MIN_MEMORY_LIMIT >> 20} MiB a session needs"
        )
    return size


def temp_directory(value: object) -> str | None:
    """``connect(temp_directory=...)``: where DuckDB spills what does not fit in memory_limit (created when
    first needed); None keeps DuckDB's default (``<database>.tmp``, or ``.tmp`` for ``:memory:``)."""
    if value is None:
        return None
    if not isinstance(value, str | os.PathLike):
        raise ConfigError(f"temp_directory={value!r} must be a path (str or os.PathLike)")
    path = os.fspath(value)
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(f"temp_directory={value!r} must be a non-empty path")
    if os.path.exists(path) and not os.path.isdir(path):
        raise ConfigError(f"temp_directory={path!r} exists and is not a directory")
    return path


def default_block_cap(limit: int, threads: int) -> int:
    """The block cap of a session that does not set one: MAX_BLOCK_BYTES, or less when ``threads`` kernel
    calls of about _BLOCKS_PER_THREAD blocks each would not fit in ``limit``."""
    share = limit // (_BLOCKS_PER_THREAD * max(1, threads))
    return max(MIN_BLOCK_BYTES, min(MAX_BLOCK_BYTES, share))


def max_block_bytes(value: object, limit: int, threads: int) -> int:
    """``connect(max_block_bytes=...)``, else ``TENSORSQL_MAX_BLOCK_BYTES``, else ``default_block_cap``."""
    what = "max_block_bytes"
    if value is None:
        env = os.environ.get(BLOCK_ENV, "").strip()
        if not env:
            return default_block_cap(limit, threads)
        value, what = (int(env) if env.isdigit() else env), BLOCK_ENV
    size = parse_size(value, what)
    if not MIN_BLOCK_BYTES <= size <= LIMIT_BLOCK_BYTES:
        raise ConfigError(
            f"{what}={value!r} ({size} bytes) must lie between {MIN_BLOCK_BYTES} and {LIMIT_BLOCK_BYTES} "
            "bytes (a block must fit one DuckDB blob and one Arrow binary value)"
        )
    return size


__all__ = [
    "BLOCK_ENV",
    "MIN_MEMORY_LIMIT",
    "default_block_cap",
    "max_block_bytes",
    "memory_limit",
    "parse_size",
    "system_memory",
    "temp_directory",
]
