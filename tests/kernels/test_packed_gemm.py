"""float32 block products on packed operands (udf_kernels/src/pgemm.cpp): the fused aggregate packs each
block once per chunk and reuses it; every layout and ragged edge must match numpy, on every kernel path
(``kernel_path``: the packed kernel, OpenBLAS, the generic loop)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
from kernel_paths import connect
from tolerance import assert_close, assert_einsum_close, einsum_reference, einsum_tolerance


@pytest.fixture(scope="module", params=[1, 2])
def s(request, kernel_path):
    sess = connect(kernel_path, threads=request.param)
    assert sess.execute("SELECT tensorsql_kernel_path()")[0][0] == kernel_path
    yield sess
    sess.close()


@pytest.mark.parametrize(
    ("spec", "shapes"),
    [
        ("ij,jk->ik", [(300, 200), (200, 100)]),
        ("ji,jk->ik", [(200, 300), (200, 100)]),  # A transposed in its blocks
        ("ij,kj->ik", [(300, 200), (100, 200)]),  # B transposed
        ("ji,kj->ik", [(200, 300), (100, 200)]),
        ("ij,jk->ki", [(300, 200), (200, 100)]),  # C^T = B^T A^T
        ("ij,jk->ik", [(17, 16), (16, 19)]),  # the smallest packed sizes, odd edges
        ("ij,jk->ik", [(1000, 50), (50, 70)]),
    ],
)
@pytest.mark.parametrize("blocks", [(64, 48, 40), (100, 100, 100), (7, 200, 33)])
def test_packed_products_match_numpy(s, spec, shapes, blocks):
    rng = np.random.default_rng(0)
    x, y = (rng.standard_normal(sh).astype(np.float32) for sh in shapes)
    lhs = spec.split("->")[0].split(",")
    sizes = {lab: n for term, sh in zip(lhs, shapes, strict=True) for lab, n in zip(term, sh, strict=True)}
    parts = {lab: -(-sizes[lab] // b) for lab, b in zip("ijk", blocks, strict=True)}
    got = s.einsum(spec, x, y, blocks=parts).numpy()
    assert_einsum_close(got, spec, x, y)


@functools.cache
def _big_product():
    """The operands, reference and tolerance of the test below, computed once for all its runs."""
    rng = np.random.default_rng(1)
    a = rng.standard_normal((512, 4096)).astype(np.float32)
    b = rng.standard_normal((4096, 4096)).astype(np.float32)  # 256 blocks of 256 KiB: 64 MiB
    return a, b, einsum_reference("ij,jk->ik", a, b), einsum_tolerance("ij,jk->ik", a, b)


def test_many_reused_blocks_beyond_the_cache(s):
    """More distinct B blocks than a thread keeps packed (32 MiB): the rest are packed per use."""
    a, b, want, tol = _big_product()
    ra = s.from_numpy(a, block_shape=(256, 256))
    rb = s.from_numpy(b, block_shape=(256, 256))
    got = s.einsum("ij,jk->ik", ra, rb, strategy="operands").numpy()
    assert_close(got, want, tol)
