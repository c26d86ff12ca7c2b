"""Build the GPU kernel set: the companion DuckDB extension ``tensorsql_cuda`` from ``udf_kernels/cuda``.

Two builds of the same sources:

- ``tensorsql_cuda`` (needs nvcc): ``device.cu`` compiled for the GPU architectures in
  ``TENSORSQL_CUDA_ARCHS`` (default ``75;80;90``: T4, A100 and H100/H200 code, plus PTX of the newest
  for later GPUs), the CUDA runtime linked statically (the driver, libcuda, is found at run time) and
  cuBLAS opened with dlopen when the first GEMM needs it. So the extension builds with nvcc alone and loads
  on a machine without a GPU, where ``tensor_cuda_info()`` says why nothing can run. nvcc 13's runtime
  needs an R580 or newer driver; build with an older nvcc (CUDA 12) for older drivers.
- ``tensorsql_cuda_emulated`` (g++ only): ``emulated.cpp`` instead of ``device.cu``, the same element
  functions run on the host. The test suite loads it to test the GPU path on every machine.

A companion extension, not part of ``tensorsql_kernels``: the CPU kernels must build and load everywhere,
and a CUDA runtime in them would tie every build to nvcc. nvcc is looked up in ``TENSORSQL_NVCC``, on
``PATH``, then in ``$CUDA_HOME/bin`` and ``/usr/local/cuda/bin``.

Neither is built behind the user's back: ``python -m udf_kernels.make`` builds the CUDA set only where a
CUDA device is visible (:func:`cuda_device_visible`) or when asked (``--cuda``, ``TENSORSQL_BUILD_CUDA=1``),
and a build started by its first use (``connect(device="cuda-emulated")``) says so on stderr first, then
reports its progress, since it may take up to a minute.

Run as ``python -m udf_kernels.gpu_build [--emulated] [--force]`` to build either one ahead.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from udf_kernels import build as cpu
from udf_kernels._errors import KernelBuildError

GPU_DIR = cpu.PACKAGE_DIR / "cuda"
CUDA_NAME = "tensorsql_cuda"
EMULATED_NAME = "tensorsql_cuda_emulated"
ARCHS_ENV = "TENSORSQL_CUDA_ARCHS"
NVCC_ENV = "TENSORSQL_NVCC"
DEFAULT_ARCHS = "75;80;90"
# The CPU kernels' sources the GPU kernel set shares (argument readers and checks are header-only).
_SHARED_SOURCES = ("spec.cpp",)


def built_path(emulated: bool) -> Path:
    return cpu.BUILD_DIR / f"{EMULATED_NAME if emulated else CUDA_NAME}.duckdb_extension"


def find_nvcc() -> str | None:
    """The nvcc to build with, or None when there is none."""
    env = os.environ.get(NVCC_ENV)
    if env:
        return env if shutil.which(env) else None
    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if home and (Path(home) / "bin" / "nvcc").is_file():
            return str(Path(home) / "bin" / "nvcc")
    return None


def cuda_device_visible() -> bool:
    """Whether this machine shows a CUDA device, so that the CUDA kernel set could run here.

    ``CUDA_VISIBLE_DEVICES`` set empty or to ``-1`` hides every device; otherwise a ``/dev/nvidia<N>``
    device node (Linux, containers given a GPU) or ``nvidia-smi -L`` listing a GPU (WSL and others without
    the nodes) shows one. nvcc alone does not: it is installed on many machines without a GPU.
    """
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1"):
        return False
    if any(node.name.removeprefix("nvidia").isdigit() for node in Path("/dev").glob("nvidia*")):
        return True
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return False
    try:
        proc = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and any(line.startswith("GPU ") for line in proc.stdout.splitlines())


def cuda_wanted(asked: bool | None = None) -> tuple[bool, str]:
    """Whether to build the CUDA kernel set here, and why: ``asked`` (a command-line choice) first, then
    ``TENSORSQL_BUILD_CUDA`` (1 or 0), then whether a CUDA device is visible."""
    if asked is not None:
        return asked, "--cuda" if asked else "--no-cuda"
    env = cpu.env_flag(cpu.BUILD_CUDA_ENV)
    if env is not None:
        return env, f"{cpu.BUILD_CUDA_ENV}={int(env)}"
    if cuda_device_visible():
        return True, "a CUDA device is visible"
    return False, "no CUDA device is visible"


def archs() -> list[str]:
    """The compute capabilities to build machine code for (``TENSORSQL_CUDA_ARCHS``, e.g. ``75;80;90``)."""
    text = os.environ.get(ARCHS_ENV, DEFAULT_ARCHS)
    out = [a.strip() for a in text.replace(",", ";").split(";") if a.strip()]
    if not out or not all(a.isdigit() for a in out):
        raise KernelBuildError(f"{ARCHS_ENV}={text!r} must list compute capabilities such as '80;90'")
    return out


def _inputs() -> list[Path]:
    return [
        *sorted(GPU_DIR.glob("*.cpp")),
        *sorted(GPU_DIR.glob("*.cu")),
        *sorted(GPU_DIR.glob("*.hpp")),
        *sorted(cpu.SRC_DIR.glob("*.hpp")),
        *(cpu.SRC_DIR / s for s in _SHARED_SOURCES),
        Path(__file__).resolve(),
    ]


def is_current(emulated: bool) -> bool:
    out = built_path(emulated)
    if not out.is_file():
        return False
    built = out.stat().st_mtime
    return all(p.stat().st_mtime <= built for p in _inputs())


def _run(cmd: list[str], what: str) -> None:
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise KernelBuildError(f"{what} failed:\n$ {' '.join(cmd)}\n{proc.stdout}{proc.stderr}")


def _nvcc_flags(include_dir: Path) -> list[str]:
    major, minor, patch = cpu.C_API_VERSION
    codes = archs()
    gencode = []
    for a in codes:
        gencode += ["-gencode", f"arch=compute_{a},code=sm_{a}"]
    gencode += ["-gencode", f"arch=compute_{codes[-1]},code=compute_{codes[-1]}"]
    return [
        "-std=c++17",
        "-O3",
        *gencode,
        "-Xcompiler",
        "-fPIC,-fvisibility=hidden,-Wall,-Wextra",
        "--Werror",
        "all-warnings",
        "-isystem",
        str(include_dir),
        f"-DDUCKDB_EXTENSION_API_VERSION_MAJOR={major}",
        f"-DDUCKDB_EXTENSION_API_VERSION_MINOR={minor}",
        f"-DDUCKDB_EXTENSION_API_VERSION_PATCH={patch}",
        f'-DTSK_CUDA_ARCHS="{",".join(codes)}"',
    ]


def build(emulated: bool = False, force: bool = False) -> Path:
    """Build (if needed) and return the GPU kernel set's extension file: the CUDA build, or the emulated one.

    A build says so on stderr before it starts (it may take up to a minute) and reports its progress there.
    Raises :class:`KernelBuildError` when nvcc is missing (CUDA build) or a compile fails.
    """
    out = built_path(emulated)
    if not (GPU_DIR / "kernels.cpp").is_file():
        # an installed wheel ships the CPU extension only
        raise KernelBuildError(f"no GPU kernel sources in {GPU_DIR}: it builds from a source checkout")
    if not force and is_current(emulated):
        return out
    nvcc = None if emulated else find_nvcc()
    if not emulated and nvcc is None:
        raise KernelBuildError(
            "no CUDA compiler: nvcc is not on PATH, in $CUDA_HOME/bin or /usr/local/cuda/bin "
            f"(set {NVCC_ENV})"
        )
    name = EMULATED_NAME if emulated else CUDA_NAME
    with cpu._build_lock(name):
        if not force and is_current(emulated):
            return out
        started = time.monotonic()
        ahead = "python -m udf_kernels.gpu_build" + (" --emulated" if emulated else "")
        cpu.say(
            f"tensorsql: building the {'emulated ' if emulated else ''}GPU kernel set {name} "
            f"({cpu._stale_reason(out, _inputs())}; {'up to a minute' if emulated else 'minutes'}, once; "
            f"`{ahead}` builds it ahead)"
        )
        include_dir = cpu.find_headers()
        cxx = cpu._compiler()
        flags = [*cpu.compile_flags(include_dir), f"-DTSK_GPU_EXTENSION_NAME={name}"]
        host = [GPU_DIR / "kernels.cpp", *(cpu.SRC_DIR / s for s in _SHARED_SOURCES)]
        if emulated:
            host.append(GPU_DIR / "emulated.cpp")
        with tempfile.TemporaryDirectory(prefix="gpu-obj-", dir=cpu.BUILD_DIR) as tmp:
            obj_dir = Path(tmp)
            objects = cpu._run_compiles(cxx, flags, host, obj_dir, name)
            lib = obj_dir / "lib.so"
            if emulated:
                link = [
                    cxx,
                    "-shared",
                    "-fPIC",
                    "-Wl,-z,defs",
                    *map(str, objects),
                    "-pthread",
                    "-o",
                    str(lib),
                ]
            else:
                assert nvcc is not None
                device_obj = obj_dir / "device.o"
                cpu.say(f"building {name}: compiling device.cu with {nvcc} for sm_{','.join(archs())} ...")
                _run(
                    [
                        nvcc,
                        *_nvcc_flags(include_dir),
                        "-c",
                        str(GPU_DIR / "device.cu"),
                        "-o",
                        str(device_obj),
                    ],
                    "compiling device.cu with nvcc",
                )
                link = [
                    nvcc,
                    "-shared",
                    "-Xcompiler",
                    "-fPIC",
                    "-Xlinker",
                    "-z,defs",
                    *map(str, objects),
                    str(device_obj),
                    "-ldl",
                    "-lpthread",
                    "-lrt",
                    "-o",
                    str(lib),
                ]
            cpu.say(f"building {name}: linking")
            _run(link, f"linking {name}")
            cpu.install(lib, out)
        cpu.say(f"building {name}: installed at {out} ({time.monotonic() - started:.0f} s)")
    return out


USAGE = "usage: python -m udf_kernels.gpu_build [--emulated] [--force]"


def main(argv: list[str] | None = None) -> int:
    """Builds the CUDA kernel set (or with ``--emulated`` the emulated one) and prints its path."""
    args = sys.argv[1:] if argv is None else argv
    unknown = [a for a in args if a not in ("--emulated", "--force")]
    if unknown:
        print(f"unknown argument {unknown[0]!r}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        path = build(emulated="--emulated" in args, force="--force" in args)
    except KernelBuildError as exc:
        print(exc, file=sys.stderr)
        return 1
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
