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

A build takes minutes (the generic loops are instantiated for every dtype, join and aggregation at -O3), so
it reports each step on stderr as it goes; nothing compiles silently.

Run as ``python -m udf_kernels.build [--force] [--no-cuda]``: the CPU extension. The GPU kernel set
(``udf_kernels/gpu_build.py``) is built as well only when asked, with ``TENSORSQL_BUILD_CUDA=1`` (then in a
child process: this module never imports the GPU build, which imports it); ``--no-cuda`` overrides that.
``python -m udf_kernels.make`` builds everything that can run on this machine.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
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
#: ``1`` asks ``python -m udf_kernels.build`` and ``python -m udf_kernels.make`` for the GPU kernel set too;
#: ``0`` keeps ``udf_kernels.make`` from building it even where a CUDA device is visible.
BUILD_CUDA_ENV = "TENSORSQL_BUILD_CUDA"

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


def say(message: str) -> None:
    """One line of build progress on stderr (stdout stays free for the paths ``main`` prints)."""
    print(message, file=sys.stderr, flush=True)


def env_flag(name: str) -> bool | None:
    """The boolean environment variable ``name``: True (1/yes/true/on), False (0/no/false/off) or None when
    unset or empty. Anything else raises :class:`KernelBuildError`, so a typo is not read as "no"."""
    text = os.environ.get(name, "").strip().lower()
    if not text:
        return None
    if text in ("1", "yes", "true", "on"):
        return True
    if text in ("0", "no", "false", "off"):
        return False
    raise KernelBuildError(f"{name}={os.environ[name]!r}: expected 1 or 0")


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
    say(f"{EXTENSION_NAME}: fetching the duckdb C API headers (pip download of the duckdb {version} sdist)")
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
    """BLAS from the scipy-openblas32 wheel, found first beside an installed ``udf_kernels`` (the
    ``$ORIGIN``-relative path: a wheel's extension then uses the environment it is installed in), else where
    this build found it (a source checkout)."""
    _inc, lib, name = blas_paths()
    return [
        f"-L{lib}",
        f"-l{name}",
        "-Wl,-rpath,$ORIGIN/../scipy_openblas32/lib",
        f"-Wl,-rpath,{lib}",
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
def _build_lock(what: str = EXTENSION_NAME) -> Iterator[None]:
    """Serialises concurrent builds (several processes importing tensorsql at once); says so when it waits,
    since the other build may take minutes."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # pragma: no cover - non-POSIX
        yield
        return
    with open(BUILD_DIR / ".build.lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            say(f"{what}: waiting for another process's kernel build to finish ({BUILD_DIR / '.build.lock'})")
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


#: The sources that take longest to compile (the loops instantiated for every dtype, join and aggregation at
#: -O3: about 130, 50 and 25 s on one core), longest first; the others take seconds.
_HEAVY_SOURCES = ("loop_int.cpp", "loop_float.cpp", "gemm.cpp")
#: Seconds without a finished compile after which the build says what it is still compiling.
_HEARTBEAT_S = 30.0


def _run_compiles(
    cxx: str,
    flags: list[str],
    sources: list[Path],
    obj_dir: Path,
    what: str = EXTENSION_NAME,
) -> list[Path]:
    """Compiles every source into ``obj_dir``, all at once, and reports each as it finishes.

    The heaviest sources set the wall time, so they start first at normal priority and the light ones run
    under ``nice``: those fill whatever core is free rather than taking turns with the longest compiles.
    Raises :class:`KernelBuildError` with every failing command and its output.
    """
    rank = {name: i for i, name in enumerate(_HEAVY_SOURCES)}
    by_cost = sorted(sources, key=lambda src: rank.get(src.name, len(rank)))
    niced = {src for src in sources if src.name not in rank}
    if len(niced) == len(sources) or not shutil.which("nice"):
        niced = set()  # nothing heavy to make way for
    cores = os.cpu_count() or 1
    say(f"building {what}: compiling {len(sources)} sources with {cxx} ({cores} cores) ...")
    started = time.monotonic()

    def compile_one(src: Path) -> tuple[list[str], subprocess.CompletedProcess[str], float]:
        cmd = [cxx, *flags, "-c", str(src), "-o", str(obj_dir / (src.stem + ".o"))]
        prefix = ["nice", "-n", "10"] if src in niced else []
        proc = subprocess.run([*prefix, *cmd], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return cmd, proc, time.monotonic() - started

    errors = []
    width = len(str(len(sources)))
    done = 0
    with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
        futures = {pool.submit(compile_one, src): src for src in by_cost}
        pending = set(futures)
        while pending:
            finished, pending = wait(pending, timeout=_HEARTBEAT_S, return_when=FIRST_COMPLETED)
            if not finished:  # the heaviest compile can run for minutes alone: say it is still going
                left = [src.name for src in by_cost if any(futures[f] == src for f in pending)]
                names = ", ".join(left[:3]) + (f" and {len(left) - 3} more" if len(left) > 3 else "")
                say(f"  ... still compiling {names} ({time.monotonic() - started:.0f} s)")
            for future in finished:
                done += 1
                cmd, proc, at = future.result()
                status = "done" if proc.returncode == 0 else "FAILED"
                say(f"  [{done:>{width}}/{len(sources)}] {futures[future].name} {status} ({at:.0f} s)")
                if proc.returncode != 0:
                    errors.append(f"$ {' '.join(cmd)}\n{proc.stdout}")
    if errors:
        raise KernelBuildError(f"compiling {what} failed:\n" + "\n".join(errors))
    return [obj_dir / (src.stem + ".o") for src in sources]


def _stale_reason(output: Path, inputs: list[Path]) -> str:
    """Why ``output`` is rebuilt: missing, or the first input newer than it."""
    if not output.is_file():
        return "not built yet"
    built = output.stat().st_mtime
    newer = [p for p in inputs if p.stat().st_mtime > built]
    return f"{newer[0].name} changed since the last build" if newer else "--force"


def build(force: bool = False) -> Path:
    """Build (if needed) and return the path of ``tensorsql_kernels.duckdb_extension``.

    Rebuilds only when a source under ``udf_kernels/src`` (or this script) is newer than the output, or
    when ``force`` is true, reporting its progress on stderr. Raises :class:`KernelBuildError` with the
    compiler output on failure.
    """
    if not force and is_current():
        return BUILT_PATH
    sources = _sources()
    if not sources:
        raise KernelBuildError(f"no C++ sources found in {SRC_DIR}")
    with _build_lock():
        if not force and is_current():  # another process built it while we waited
            return BUILT_PATH
        started = time.monotonic()
        say(f"building {EXTENSION_NAME} ({_stale_reason(BUILT_PATH, _inputs())})")
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
            say(f"building {EXTENSION_NAME}: linking")
            proc = subprocess.run(link, capture_output=True, text=True)
            if proc.returncode != 0:
                raise KernelBuildError(
                    f"linking the tensorsql_kernels extension failed:\n$ {' '.join(link)}\n"
                    f"{proc.stdout}{proc.stderr}"
                )
            install(lib, BUILT_PATH)
        say(f"building {EXTENSION_NAME}: installed at {BUILT_PATH} ({time.monotonic() - started:.0f} s)")
    return BUILT_PATH


def install(lib: Path, out: Path) -> None:
    """The linked library ``lib`` as the extension file ``out``: DuckDB's footer appended, written beside it
    and renamed into place (a process loading ``out`` meanwhile sees the old file or the new one, whole)."""
    data = lib.read_bytes() + footer(duckdb_platform(), c_api_version_string(), EXTENSION_VERSION)
    staged = out.parent / f".{out.name}.tmp{os.getpid()}"
    staged.write_bytes(data)
    os.replace(staged, out)


USAGE = "usage: python -m udf_kernels.build [--force] [--no-cuda]"


def main(argv: list[str] | None = None) -> int:
    """Builds the CPU extension and prints its path; with ``TENSORSQL_BUILD_CUDA=1`` (and no ``--no-cuda``),
    then the GPU kernel set, in a child process (``python -m udf_kernels.gpu_build``)."""
    args = sys.argv[1:] if argv is None else argv
    unknown = [a for a in args if a not in ("--force", "--no-cuda")]
    if unknown:
        print(f"unknown argument {unknown[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    force = "--force" in args
    try:
        path = build(force=force)
        cuda = "--no-cuda" not in args and env_flag(BUILD_CUDA_ENV) is True
    except KernelBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    if not cuda:
        return 0
    say(f"{BUILD_CUDA_ENV}=1: building the GPU kernel set too (python -m udf_kernels.gpu_build)")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(PACKAGE_DIR.parent), env.get("PYTHONPATH")]))
    cmd = [sys.executable, "-m", "udf_kernels.gpu_build", *(["--force"] if force else [])]
    return subprocess.run(cmd, env=env).returncode


if __name__ == "__main__":
    sys.exit(main())
