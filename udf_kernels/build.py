"""Build the ``tensorsql_kernels`` DuckDB loadable extension from ``udf_kernels/src``.

The extension is written against DuckDB's stable C extension API. Its headers (``duckdb.h`` and
``duckdb_extension.h``) are not part of the duckdb wheel, so they are taken from, in order:

1. the directory named by the environment variable ``TENSORSQL_DUCKDB_INCLUDE``;
2. the cache ``udf_kernels/_build/include/`` (written by step 3);
3. the duckdb source distribution of the installed duckdb version, fetched with
   ``pip download --no-deps --no-binary duckdb duckdb==<version>``.

The compiled shared library gets DuckDB's 512-byte extension footer appended (metadata fields stored in
reverse order, then 256 zero signature bytes: the extension is unsigned, so connections that load it need
``config={"allow_unsigned_extensions": "true"}``).

The block contractions call OpenBLAS from the ``scipy-openblas32`` wheel (a build and run dependency): its
headers and ``libscipy_openblas.so`` are located through the installed ``scipy_openblas32`` package, and the
extension is linked with an rpath to that directory (plus ``$ORIGIN/../scipy_openblas32/lib`` for an installed
wheel), so it loads without LD_LIBRARY_PATH. Every BLAS symbol carries the ``scipy_`` prefix.

Run as ``python -m udf_kernels.build [--force] [--no-cuda]``: where nvcc is found it also builds the GPU
kernel set, ``tensorsql_cuda`` (``udf_kernels/gpu_build.py``), unless ``--no-cuda``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path

from udf_kernels._errors import KernelBuildError

PACKAGE_DIR = Path(__file__).resolve().parent
SRC_DIR = PACKAGE_DIR / "src"
BUILD_DIR = PACKAGE_DIR / "_build"
INCLUDE_CACHE = BUILD_DIR / "include"
EXTENSION_NAME = "tensorsql_kernels"
EXTENSION_FILE = f"{EXTENSION_NAME}.duckdb_extension"
BUILT_PATH = BUILD_DIR / EXTENSION_FILE
EXTENSION_VERSION = "0.1.0"
# The C API version the extension targets. DuckDB loads extensions whose footer version is <= its own C API
# version (2.0.0 accepts up to v1.5.6); every function used here exists since v1.2.0.
C_API_VERSION = (1, 2, 0)
HEADERS = ("duckdb.h", "duckdb_extension.h")
INCLUDE_ENV = "TENSORSQL_DUCKDB_INCLUDE"

_FOOTER_FIELD = 32
_SIGNATURE_BYTES = 256


def c_api_version_string() -> str:
    return "v{}.{}.{}".format(*C_API_VERSION)


def duckdb_platform() -> str:
    """DuckDB's platform string (e.g. ``linux_amd64``), as written in the footer."""
    import duckdb

    con = duckdb.connect()
    try:
        row = con.execute("PRAGMA platform").fetchone()
    finally:
        con.close()
    if not row:
        raise KernelBuildError("PRAGMA platform returned nothing")
    return str(row[0])


def footer(platform: str, c_api_version: str, extension_version: str) -> bytes:
    """The 512-byte footer DuckDB reads at the end of an extension file."""
    fields = ["4", platform, c_api_version, extension_version, "C_STRUCT", "", "", ""]
    encoded = []
    for field in fields:
        raw = field.encode("ascii")
        if len(raw) > _FOOTER_FIELD:
            raise KernelBuildError(f"footer field {field!r} is longer than {_FOOTER_FIELD} bytes")
        encoded.append(raw.ljust(_FOOTER_FIELD, b"\0"))
    return b"".join(reversed(encoded)) + b"\0" * _SIGNATURE_BYTES


# ---------------------------------------------------------------------------------------------------------
# Headers
# ---------------------------------------------------------------------------------------------------------


def _has_headers(directory: Path) -> bool:
    return all((directory / h).is_file() for h in HEADERS)


def _duckdb_version() -> str:
    import duckdb

    return str(duckdb.__version__)


def fetch_headers(dest: Path = INCLUDE_CACHE) -> Path:
    """Download the duckdb sdist of the installed version and extract the two C API headers into dest."""
    version = _duckdb_version()
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tensorsql-duckdb-sdist-") as tmp:
        cmd = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--no-deps",
            "--no-binary",
            "duckdb",
            f"duckdb=={version}",
            "-d",
            tmp,
            "-q",
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        archives = sorted(Path(tmp).glob("duckdb-*.tar.gz"))
        if proc.returncode != 0 or not archives:
            raise KernelBuildError(
                f"could not download the duckdb {version} source distribution to get duckdb.h and "
                f"duckdb_extension.h (command: {' '.join(cmd)}):\n{proc.stdout}{proc.stderr}\n"
                f"Set {INCLUDE_ENV} to a directory containing both headers to build offline."
            )
        wanted = {f"external/duckdb/src/include/{h}": h for h in HEADERS}
        found: dict[str, bytes] = {}
        with tarfile.open(archives[0], "r:gz") as tar:
            for member in tar:
                # members are named duckdb-<version>/external/duckdb/src/include/<header>
                rel = member.name.split("/", 1)[-1]
                if rel in wanted and member.isfile():
                    fobj = tar.extractfile(member)
                    if fobj is not None:
                        found[wanted[rel]] = fobj.read()
        missing = [h for h in HEADERS if h not in found]
        if missing:
            raise KernelBuildError(f"{archives[0].name} does not contain {', '.join(missing)}")
        for name, data in found.items():
            tmp_path = dest / f".{name}.tmp{os.getpid()}"
            tmp_path.write_bytes(data)
            os.replace(tmp_path, dest / name)
    (dest / "duckdb_version.txt").write_text(version + "\n")
    return dest


def find_headers() -> Path:
    """The directory holding duckdb.h and duckdb_extension.h, fetching them if needed."""
    env = os.environ.get(INCLUDE_ENV)
    if env:
        directory = Path(env)
        if not _has_headers(directory):
            raise KernelBuildError(f"{INCLUDE_ENV}={env} does not contain {' and '.join(HEADERS)}")
        return directory
    stamp = INCLUDE_CACHE / "duckdb_version.txt"
    if _has_headers(INCLUDE_CACHE) and stamp.is_file() and stamp.read_text().strip() == _duckdb_version():
        return INCLUDE_CACHE
    return fetch_headers(INCLUDE_CACHE)


# ---------------------------------------------------------------------------------------------------------
# Compilation
# ---------------------------------------------------------------------------------------------------------


def _sources() -> list[Path]:
    return sorted(SRC_DIR.glob("*.cpp"))


def _inputs() -> list[Path]:
    return [*_sources(), *sorted(SRC_DIR.glob("*.hpp")), Path(__file__).resolve()]


def is_current(output: Path = BUILT_PATH) -> bool:
    """True when the built extension exists and is newer than every source (and this build script)."""
    if not output.is_file():
        return False
    built = output.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in _inputs())


def _compiler() -> str:
    for candidate in (os.environ.get("CXX"), "g++", "c++", "clang++"):
        if candidate and shutil.which(candidate):
            return candidate
    raise KernelBuildError("no C++17 compiler found (set CXX, or install g++)")


def blas_paths() -> tuple[Path, Path, str]:
    """(include dir, library dir, library name) of the scipy-openblas32 wheel."""
    try:
        import scipy_openblas32
    except ImportError as exc:
        raise KernelBuildError(
            "scipy-openblas32 is not installed (pip install scipy-openblas32); the kernels link its BLAS"
        ) from exc
    inc = Path(scipy_openblas32.get_include_dir())
    lib = Path(scipy_openblas32.get_lib_dir())
    name = scipy_openblas32.get_library()
    if not (inc / "cblas.h").is_file() or not (lib / f"lib{name}.so").exists():
        raise KernelBuildError(f"scipy-openblas32 at {lib.parent} lacks cblas.h or lib{name}.so")
    return inc, lib, name


def link_flags() -> list[str]:
    _inc, lib, name = blas_paths()
    return [
        f"-L{lib}",
        f"-l{name}",
        f"-Wl,-rpath,{lib}",
        "-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib",
    ]


def compile_flags(include_dir: Path) -> list[str]:
    major, minor, patch = C_API_VERSION
    return [
        "-std=c++17",
        "-O3",
        "-fPIC",
        "-fvisibility=hidden",
        "-fvisibility-inlines-hidden",
        "-Wall",
        "-Wextra",
        "-Werror",
        "-Wconversion",
        "-isystem",
        str(include_dir),
        "-isystem",
        str(blas_paths()[0]),
        f"-DDUCKDB_EXTENSION_API_VERSION_MAJOR={major}",
        f"-DDUCKDB_EXTENSION_API_VERSION_MINOR={minor}",
        f"-DDUCKDB_EXTENSION_API_VERSION_PATCH={patch}",
        f'-DTENSORSQL_KERNELS_VERSION="{EXTENSION_VERSION}"',
    ]


@contextlib.contextmanager
def _build_lock() -> Iterator[None]:
    """Serialises concurrent builds (several processes importing tensorsql at once)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(BUILD_DIR / ".build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _run_compiles(
    cxx: str,
    flags: list[str],
    sources: list[Path],
    obj_dir: Path,
    what: str = "the tensorsql_kernels extension",
) -> list[Path]:
    procs = []
    for src in sources:
        obj = obj_dir / (src.stem + ".o")
        cmd = [cxx, *flags, "-c", str(src), "-o", str(obj)]
        procs.append(
            (
                src,
                obj,
                cmd,
                subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
            )
        )
    errors = []
    for _src, _obj, cmd, proc in procs:
        out, _ = proc.communicate()
        if proc.returncode != 0:
            errors.append(f"$ {' '.join(cmd)}\n{out}")
    if errors:
        raise KernelBuildError(f"compiling {what} failed:\n" + "\n".join(errors))
    return [obj for _src, obj, _cmd, _proc in procs]


def build(force: bool = False) -> Path:
    """Build (if needed) and return the path of ``tensorsql_kernels.duckdb_extension``.

    Rebuilds only when a source under ``udf_kernels/src`` (or this script) is newer than the output, or
    when ``force`` is true. Raises :class:`KernelBuildError` with the compiler output on failure.
    """
    if not force and is_current():
        return BUILT_PATH
    sources = _sources()
    if not sources:
        raise KernelBuildError(f"no C++ sources found in {SRC_DIR}")
    with _build_lock():
        if not force and is_current():  # another process built it while we waited
            return BUILT_PATH
        include_dir = find_headers()
        cxx = _compiler()
        flags = compile_flags(include_dir)
        with tempfile.TemporaryDirectory(prefix="obj-", dir=BUILD_DIR) as tmp:
            obj_dir = Path(tmp)
            objects = _run_compiles(cxx, flags, sources, obj_dir)
            lib = obj_dir / "lib.so"
            link = [cxx, "-shared", "-fPIC", *map(str, objects), *link_flags(), "-pthread", "-o", str(lib)]
            if sys.platform.startswith("linux"):
                link.insert(2, "-Wl,-z,defs")  # the extension may only reach DuckDB through the API struct
            proc = subprocess.run(link, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KernelBuildError(
                    f"linking the tensorsql_kernels extension failed:\n$ {' '.join(link)}\n"
                    f"{proc.stdout}{proc.stderr}"
                )
            install(lib, BUILT_PATH)
    return BUILT_PATH


def install(lib: Path, out: Path) -> None:
    """The linked library ``lib`` as the extension file ``out``: DuckDB's footer appended, written beside it
    and renamed into place (a process loading ``out`` meanwhile sees the old file or the new one, whole)."""
    data = lib.read_bytes() + footer(duckdb_platform(), c_api_version_string(), EXTENSION_VERSION)
    staged = out.parent / f".{out.name}.tmp{os.getpid()}"
    staged.write_bytes(data)
    os.replace(staged, out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    force = "--force" in args
    try:
        path = build(force=force)
    except KernelBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    if "--no-cuda" in args:
        return 0
    # the GPU kernel set too, wherever a CUDA compiler is (README "GPUs (CUDA)")
    from udf_kernels import gpu_build

    if gpu_build.find_nvcc() is not None:
        try:
            print(gpu_build.build(force=force))
        except KernelBuildError as exc:
            print(exc, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
