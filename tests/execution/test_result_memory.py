"""Result hand-off without copies (row-slab results view the Arrow buffer) and the allocator settings."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts
from tensorsql.backends import arrow as B
from tensorsql.backends.duckdb import allocator
from tensorsql.compile import in_gemm_order


@pytest.fixture(scope="module")
def arrow_s():
    """A session whose results come through Arrow (no result sinks)."""
    sess = ts.connect(threads=2)
    sess.result_sink = False
    yield sess
    sess.close()


def _viewed(arr: np.ndarray) -> bool:
    return isinstance(arr.base, B._BufferOwner)


@pytest.mark.parametrize(
    ("a_blocks", "b_blocks", "viewed"),
    [
        ((300, 200), (200, 100), True),
        ((100, 200), (200, 100), None),
        ((128, 64), (64, 100), None),
        ((300, 200), (200, 50), False),
        ((64, 64), (64, 64), False),
    ],
)
def test_matmul_result_is_a_writable_array(arrow_s, a_blocks, b_blocks, viewed):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((300, 200))
    b = rng.standard_normal((200, 100))
    ra, rb = arrow_s.from_numpy(a, block_shape=a_blocks), arrow_s.from_numpy(b, block_shape=b_blocks)
    rel = arrow_s.einsum("ij,jk->ik", ra, rb, strategy="operands")
    got = rel.numpy()
    assert_einsum_close(got, "ij,jk->ik", a, b)
    assert got.flags.writeable and got.flags.c_contiguous
    if viewed is not None:  # several row panels are viewed only when the rows happen to come in key order
        assert _viewed(got) == viewed
    got[0, 0] = 42.0  # the caller owns the memory: writing does not touch any later result
    again = rel.numpy()
    assert_einsum_close(again, "ij,jk->ik", a, b)


def _table(blobs: list[bytes | None], keys: list[list[int]]) -> pa.Table:
    cols = {f"k{d}": pa.array([k[d] for k in keys], pa.int32()) for d in range(len(keys[0]))}
    cols["tensor"] = pa.array(blobs, pa.binary())
    return pa.table(cols)


def test_slab_view_needs_key_order_and_every_panel():
    x = np.arange(12.0).reshape(4, 3)
    top, bottom = x[:3].tobytes(), x[3:].tobytes()
    ordered = B.assemble(_table([top, bottom], [[0, 0], [1, 0]]), (4, 3), (3, 3), "float64")
    assert _viewed(ordered)
    np.testing.assert_array_equal(ordered, x)
    swapped = B.assemble(_table([bottom, top], [[1, 0], [0, 0]]), (4, 3), (3, 3), "float64")
    assert not _viewed(swapped)
    np.testing.assert_array_equal(swapped, x)
    missing = B.assemble(_table([bottom], [[1, 0]]), (4, 3), (3, 3), "float64")
    assert not _viewed(missing)
    np.testing.assert_array_equal(missing, np.where(np.arange(4)[:, None] < 3, 0.0, x))
    with_null = B.assemble(_table([top, None], [[0, 0], [1, 0]]), (4, 3), (3, 3), "float64")
    assert not _viewed(with_null)
    np.testing.assert_array_equal(with_null[3], 0.0)


def test_slab_view_checks_every_later_key():
    x = np.arange(12.0).reshape(4, 3)
    bad = _table([x[:3].tobytes(), x[3:].tobytes()], [[0, 1], [1, 0]])  # k1 = 1: outside one column block
    with pytest.raises(ts.ShapeError, match=r"block key \(0, 1\) lies outside a tensor of shape \(4, 3\)"):
        B.assemble(bad, (4, 3), (3, 3), "float64")


def test_slab_view_of_a_scalar_and_wrong_sizes_are_checked():
    scalar = B.assemble(_table([np.float32(2.5).tobytes()], [[0]]).drop(["k0"]), (), (), "float32")
    assert scalar.shape == () and scalar == np.float32(2.5)
    bad = _table([np.zeros(8).tobytes(), np.zeros(4).tobytes()], [[0, 0], [1, 0]])
    with pytest.raises(ts.KernelError, match=r"has 64 bytes but its shape \(3, 3\) of float64 needs 72"):
        B.assemble(bad, (4, 3), (3, 3), "float64")


def test_allocator_tuning_is_idempotent_and_reversible(monkeypatch):
    if not allocator.tune():
        pytest.skip("not glibc: the allocator is left alone")
    assert allocator.tune() and allocator.tuned()
    assert allocator.restore() and not allocator.tuned()
    monkeypatch.setenv("TENSORSQL_TUNE_MALLOC", "0")
    assert not allocator.enabled_by_env()
    sess = ts.connect()
    try:
        assert not allocator.tuned()
    finally:
        sess.close()
    monkeypatch.setenv("TENSORSQL_TUNE_MALLOC", "1")
    sess = ts.connect()
    try:
        assert allocator.tuned()
    finally:
        sess.close()


@pytest.mark.parametrize("limit", [0, 1 << 40])
def test_small_and_large_results_fetch_alike(s, monkeypatch, limit):
    """Small results come back as fetched rows, large ones through DuckDB's Arrow export."""
    from tensorsql.backends.duckdb import executor as X

    monkeypatch.setattr(X, "SMALL_RESULT_BYTES", limit)
    rng = np.random.default_rng(1)
    a = rng.standard_normal((50, 40)).astype(np.float32)
    b = rng.standard_normal((40, 30)).astype(np.float32)
    rel = s.einsum("ij,jk->ik", s.from_numpy(a, block_shape=(16, 40)), s.from_numpy(b), strategy="operands")
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)  # float32: near-zero sums differ by path
    table = s.executor.run_arrow(rel.plan(), rel.bindings)
    assert table.column_names == ["k0", "k1", "tensor"]
    assert table.num_rows == 4


def test_interleaved_contraction_returns_a_view_of_the_gemm_order(arrow_s):
    """Through Arrow, big outputs that interleave the operands' labels come back as a transposed view of
    the result in [batch, M, N] order (no scatter pass in the kernel); the relation itself keeps the
    requested order."""
    s = arrow_s
    rng = np.random.default_rng(2)
    x = rng.standard_normal((8, 8, 5, 8)).astype(np.float32)  # bcgf
    y = rng.standard_normal((8, 8, 8, 5)).astype(np.float32)  # adeg
    want = np.einsum("bcgf,adeg->abcdef", x, y)
    rel = s.einsum("bcgf,adeg->abcdef", x, y)
    got = rel.numpy()
    assert_einsum_close(got, "bcgf,adeg->abcdef", x, y)
    assert not got.flags.c_contiguous and got.base is not None
    plan, perm = in_gemm_order(rel.plan(), s.executor.profile)
    assert [plan.root.shape[p] for p in perm] == list(want.shape)
    table = rel.to_arrow()  # the stored form is in the requested label order
    assert_einsum_close(B.assemble(table, rel.shape, rel.block_shape, "float32"), "bcgf,adeg->abcdef", x, y)
    c = ts.einsum("bcgf,adeg->abcdef", x, y, order="C")
    assert c.flags.c_contiguous
    assert_einsum_close(c, "bcgf,adeg->abcdef", x, y)
    small = s.einsum("bcgf,adeg->abcdef", x[:2], y[:2]).numpy()  # under 1 MiB: contiguous as computed
    assert small.flags.c_contiguous
    assert (
        in_gemm_order(s.einsum("ij,jk->ik", x[0, 0], y[0, 0]).plan(), s.executor.profile) is None
    )  # already [M, N]


def test_gemm_order_prefers_the_orientation_whose_blocks_are_row_slabs(s):
    """Through a result sink too: an interleaved output split on one of y's labels is computed with the GEMM's
    operands swapped ([N, M] order: row slabs, written in place) and returned as a transposed view."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((8, 6, 16, 5, 8)).astype(np.float32)  # iaecg
    y = rng.standard_normal((40, 64, 5, 6)).astype(np.float32)  # hfca
    want = np.einsum("iaecg,hfca->hgfei", x, y)
    rel = s.einsum(
        "iaecg,hfca->hgfei", s.from_numpy(x), s.from_numpy(y, block_shape=(20, 64, 5, 6)), strategy="operands"
    )
    plan, perm = in_gemm_order(rel.plan(), s.executor.profile)
    labels = plan.root.out_labels
    assert plan.block_shape() == (20, 64, 8, 16, 8)  # [N, M]: h, f, i, e, g
    assert [plan.root.shape[p] for p in perm] == list(want.shape) and len(set(labels)) == 5
    got = rel.numpy()
    assert not got.flags.c_contiguous and got.base is not None and got.base.flags.c_contiguous
    assert_einsum_close(got, "iaecg,hfca->hgfei", x, y)
    assert ts.einsum("iaecg,hfca->hgfei", x, y, order="C").flags.c_contiguous


def test_gemm_order_keeps_row_slabs_of_the_requested_order(s):
    """When neither GEMM orientation has row-slab blocks but the requested order has, the result stays in
    the requested order (one scatter pass beats a GEMM-ordered result copied block by block)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((16, 30, 3)).astype(np.float32)  # hde
    y = rng.standard_normal((20, 16, 40, 25)).astype(np.float32)  # chab
    rel = s.einsum(
        "hde,chab->abcde", s.from_numpy(x), s.from_numpy(y, block_shape=(20, 16, 20, 25)), strategy="operands"
    )
    assert in_gemm_order(rel.plan(), s.executor.profile) is None
    got = rel.numpy()
    assert got.flags.c_contiguous
    assert_einsum_close(got, "hde,chab->abcde", x, y)
