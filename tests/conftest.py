"""Shared fixtures. ``kernel_path``: a test (and the module-scoped fixtures it uses) runs once per float32
GEMM kernel path this machine supports; make sessions and connections on it with kernel_paths.connect /
kernel_paths.duckdb_connect."""

from __future__ import annotations

import pytest
from kernel_paths import supported_kernel_paths


@pytest.fixture(scope="module", params=supported_kernel_paths())
def kernel_path(request) -> str:
    return request.param
