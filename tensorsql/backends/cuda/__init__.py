"""The GPU executor: the embedded DuckDB with the GPU kernel set (``udf_kernels/cuda``) bound to
its statements. Docs: "GPUs"."""

from __future__ import annotations

from tensorsql.backends.cuda.executor import CudaExecutor, parse_device

__all__ = ["CudaExecutor", "parse_device"]
