"""The GPU executor: a DuckDB executor whose block kernels run on a CUDA device.

It is the embedded executor (``backends.duckdb``) with a second kernel set: the companion extension
``tensorsql_cuda`` (``udf_kernels/cuda``), loaded beside the CPU kernels. Plans are the CPU plans; lowering
differs in two ways (``sqlgen.Lowering``):

- the fused forms the GPU kernel set lacks are not used: an aggregate over a join's products is
  ``tensor_<agg>(tensor_einsum(...))`` instead of ``tensor_einsum_agg``, a fused contraction tree nested
  ``tensor_einsum`` calls instead of ``tensor_einsum_path``, and results come back through Arrow rather than
  the kernels' result sinks;
- each finished statement goes through ``sqlgen.on_device``, which binds every ``tensor_einsum``,
  ``tensor_einsum1`` and ``tensor_map`` call on float32/float64 blocks to its GPU function on the session's
  device. Other dtypes, and every other kernel (slices, casts, block sums), stay on the CPU kernels.

``device="cuda-emulated"`` loads the emulated build of the same kernel set (its device is host memory): the
test suite's way to run this executor, its SQL and the GPU functions' planning on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import duckdb
import numpy as np

from tensorsql.backends.duckdb import sqlgen
from tensorsql.backends.duckdb.executor import DuckDBExecutor
from tensorsql.compile.plan import Plan
from tensorsql.errors import DeviceError, ExtensionError
from tensorsql.ir import expr as E
from tensorsql.ir.blocking import default_block_shape

_DEVICE = re.compile(r"^(cpu|cuda|cuda-emulated)(?::(\d+))?$")


def parse_device(device: object) -> tuple[str, int]:
    """``("cpu", 0)``, ``("cuda", n)`` or ``("cuda-emulated", 0)`` from a device string (``"cuda:1"``)."""
    if not isinstance(device, str):
        raise DeviceError(f"device={device!r} must be a string: 'cpu', 'cuda', 'cuda:<n>' or 'cuda-emulated'")
    m = _DEVICE.match(device.strip().lower())
    if m is None:
        raise DeviceError(
            f"device={device!r} is not a device: use 'cpu', 'cuda', 'cuda:<n>' (n = 0, 1, ...) or "
            "'cuda-emulated' (tests)"
        )
    kind, ordinal = m.group(1), int(m.group(2) or 0)
    if kind == "cpu" and m.group(2) is not None:
        raise DeviceError(f"device={device!r}: the CPU has no ordinal (use 'cpu')")
    if kind == "cuda-emulated" and ordinal != 0:
        raise DeviceError(f"device={device!r}: the emulated device is 'cuda-emulated' (ordinal 0) only")
    return kind, ordinal


def check_architecture(info: str, ordinal: int, where: str) -> None:
    """DeviceError unless the kernels were built for device ``ordinal``: a compute capability at least the
    lowest built (a cubin runs on later minor versions of its major one, the PTX of the newest on anything
    newer). ``info`` is ``tensor_cuda_info()``: "... <i> <name> (<MiB> MiB, sm_<cc>); ... built for
    sm_<a>,<b>;"."""
    devices = {}
    for entry in info.partition("device(s):")[2].split(";"):
        m = re.fullmatch(r"\s*(\d+) .*\(\d+ MiB, sm_(\d+)\)\s*", entry)
        if m:
            devices[int(m.group(1))] = int(m.group(2))
    built = re.search(r"built for sm_([\d,]+);", info)
    if ordinal not in devices or built is None:
        return
    cc = devices[ordinal]
    archs = [int(a) for a in built.group(1).split(",") if a]
    if archs and cc < min(archs):
        raise DeviceError(
            f"device={where!r}: its compute capability sm_{cc} is older than the GPU kernels were built for "
            f"(sm_{built.group(1)}); rebuild with TENSORSQL_CUDA_ARCHS including {cc} "
            "(python -m udf_kernels.gpu_build --force)"
        )


def _major(lib: Path) -> int:
    tail = lib.name.rsplit(".so.", 1)[-1].split(".")[0]
    return int(tail) if tail.isdigit() else 0


def preload_cublas() -> str | None:
    """Loads the cuBLAS of an installed ``nvidia-cublas`` wheel (torch's CUDA builds bring one) into the
    process, so the kernel set's dlopen by soname finds it; the path loaded, or None."""
    try:
        import nvidia  # type: ignore[import-not-found]
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        found = {*Path(root).glob("cu*/lib/libcublas.so.*"), *Path(root).glob("cublas/lib/libcublas.so.*")}
        for lib in sorted(found, key=_major, reverse=True):  # the newest major version first
            try:
                ctypes.CDLL(str(lib), mode=ctypes.RTLD_GLOBAL)
            except OSError:
                continue
            return str(lib)
    return None


class CudaExecutor(DuckDBExecutor):
    """The embedded DuckDB with the GPU kernel set on CUDA device ``ordinal`` (``emulated``: the host)."""

    name = "cuda"

    def __init__(self, database: str = ":memory:", *, ordinal: int = 0, emulated: bool = False, **kw: object):
        super().__init__(database, **kw)  # type: ignore[arg-type]
        try:
            #: what the device layer reported when the session started (``tensor_cuda_info()``)
            self.device_info = self._load_gpu_kernels(ordinal, emulated)
        except BaseException:
            super().close()
            raise
        self.ordinal = ordinal
        self.device = "cuda-emulated" if emulated else f"cuda:{ordinal}"
        self.lowering = sqlgen.Lowering(einsum_agg=False, einsum_path=False, device=ordinal)
        self._lane = False  # the single-threaded lane serves sink statements, which this executor has none of

    def _load_gpu_kernels(self, ordinal: int, emulated: bool) -> str:
        import udf_kernels
        from udf_kernels import KernelBuildError, KernelLoadError, gpu_build

        where = "cuda-emulated" if emulated else f"cuda:{ordinal}"
        try:
            path = gpu_build.build(emulated=emulated)
        except KernelBuildError as exc:
            raise DeviceError(f"device={where!r}: cannot build the GPU kernels: {exc}") from exc
        if not emulated:
            preload_cublas()
        try:
            udf_kernels.load(self.con, path)
            info = str(self.con.execute("SELECT tensor_cuda_info()").fetchall()[0][0])
        except (KernelLoadError, duckdb.Error) as exc:
            raise ExtensionError(f"cannot load the GPU kernel set {path}: {exc}") from exc
        if info.startswith("error:"):
            raise DeviceError(
                f"device={where!r}: no usable CUDA device: {info.removeprefix('error:').strip()}"
            )
        found = re.match(r"^\w[\w-]*: (\d+) device", info)
        count = int(found.group(1)) if found else 0
        if ordinal >= count:
            raise DeviceError(f"device={where!r}: this machine has {count} CUDA device(s) ({info})")
        if "cublas error:" in info:
            raise DeviceError(f"device={where!r}: {info.split('cublas error:', 1)[1].strip()}")
        check_architecture(info, ordinal, where)
        return info

    @property
    def workers(self) -> int:
        """One: a kernel call fills the device by itself (its GEMM or grid is the parallelism), so the planner
        splits work into blocks only where memory makes it (``max_block_bytes``); every split is one more
        launch, one more copy of a shared operand block, and a block sum on the CPU."""
        return 1

    def storage_blocks(
        self, shape: tuple[int, ...], block_shape: tuple[int, ...], itemsize: int
    ) -> tuple[int, ...]:
        """``from_numpy``'s and ``from_sql``'s default blocking on the GPU: blocks of up to
        ``max_block_bytes`` (the largest dimension halved until a block fits), where the CPU's 4 MiB default
        made a stored 4096^2 matmul 64 launches and 16 block sums on the host."""
        return default_block_shape(shape, max(1, self.max_block_bytes // max(1, itemsize)))

    # Result sinks, prepared small calls and one-statement graphs use kernel forms the GPU set lacks (results
    # written into the caller's array by the kernels); their callers fall back to the general path.
    def fast(self, plan: Plan) -> None:  # type: ignore[override]
        return None

    def run_into(
        self, plan: Plan, bindings: Mapping[E.Operand, np.ndarray], out: np.ndarray, *, keep: bool = False
    ) -> bool:
        return False

    def many(self, stages: Sequence[tuple[str, Plan]], outputs: Sequence[Plan]) -> None:  # type: ignore[override]
        return None

    def device_counters(self) -> str:
        """``tensor_cuda_info()`` now (the emulated device adds the bytes it moved and its launches)."""
        with self._lock:
            return str(self.con.execute("SELECT tensor_cuda_info()").fetchall()[0][0])

