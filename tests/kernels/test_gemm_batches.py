"""Contractions of a large operand whose own output labels do not fuse into one strided dimension
(``promote_batch`` in gemm.cpp): its leading output labels become batch labels, the other operand is read
with stride 0 along them, and the product runs per batch on the operand in place instead of on a packed copy;
per-batch matrix-vector products run as loops (``matvec_batches``). Every case matches numpy within the
einsum bound (integers exactly), on every kernel path, on 1 and 2 threads, whole and with the summed label
split into blocks (each block's product accumulated into the group's output)."""

from __future__ import annotations

import numpy as np
import pytest
from kernel_paths import connect
from tolerance import assert_einsum_close

CASES = [
    # (equation, shapes): x large, its labels before the summed one promoted to batches
    ("abcde,d->abce", [(6, 7, 9, 15, 84), (15,)]),  # n = 1: a column per batch (the matvec loop)
    ("abcde,de->abc", [(6, 7, 9, 15, 84), (15, 84)]),  # nothing left but a dot per batch
    ("d,abcde->abce", [(15,), (6, 7, 9, 15, 84)]),  # the large operand second: m = 1, a row per batch
    ("abcd,ce->abde", [(2, 3, 40, 3000), (40, 5)]),  # few batches of a real GEMM each
    ("abcd,ec->abde", [(2, 3, 40, 3000), (5, 40)]),  # the small operand transposed
    ("abcd,c->bad", [(6, 5, 40, 300), (40,)]),  # batches in another order in the output: packed as before
    ("abcd,c->adb", [(6, 5, 40, 300), (40,)]),  # an output the product is scattered into
]
DTYPES = ["float32", "float64", "complex64", "complex128", "int64"]


@pytest.fixture(scope="module", params=[1, 2])
def s(request, kernel_path):
    sess = connect(kernel_path, threads=request.param)
    yield sess
    sess.close()


def _operands(shapes, dtype, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for sh in shapes:
        a = rng.standard_normal(sh)
        if dtype.startswith("complex"):
            a = a + 1j * rng.standard_normal(sh)
        out.append((a * 8).astype(dtype) if dtype.startswith("int") else a.astype(dtype))
    return out


@pytest.mark.parametrize(("eq", "shapes"), CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("dtype", DTYPES)
def test_promoted_batches_match_numpy(s, eq, shapes, dtype):
    ops = _operands(shapes, dtype)
    got = s.einsum(eq, *ops, strategy="none").numpy()
    assert_einsum_close(got, eq, *ops)


@pytest.mark.parametrize(("eq", "shapes"), CASES[:4], ids=[c[0] for c in CASES[:4]])
@pytest.mark.parametrize("dtype", ["float64", "complex64", "int64"])
def test_promoted_batches_accumulate_split_sums(s, eq, shapes, dtype):
    """The summed label in 3 blocks: the second and third blocks' products add into the first's."""
    ops = _operands(shapes, dtype, seed=1)
    lhs, out = eq.split("->")
    summed = next(ch for ch in lhs if ch not in out and ch != ",")
    got = s.einsum(eq, *ops, blocks={summed: 3}).numpy()
    assert_einsum_close(got, eq, *ops)


def test_promoted_batches_with_a_repeated_label_stay_packed(s):
    """A diagonal in the large operand: packed (a repeated label is never promoted), still numpy's value."""
    x = _operands([(6, 7, 9, 9, 84)], "float64")[0]
    y = _operands([(9,)], "float64", seed=2)[0]
    got = s.einsum("abdde,d->abe", x, y, strategy="none").numpy()
    assert_einsum_close(got, "abdde,d->abe", x, y)


def _gemm_plan(s, eq, dtype, shapes) -> dict[str, int]:
    con = s.executor.con  # the session's own DuckDB connection, for a parameterized statement
    query = "SELECT tensorsql_gemm_plan(?, ?, ?, ?)"
    (text,) = con.execute(query, [eq, dtype, *map(list, shapes)]).fetchone()
    return {k: int(v) for k, v in (part.split("=") for part in text.split())}


@pytest.mark.parametrize(
    ("eq", "shapes", "want"),
    [
        # the large operand read in place: its leading labels are batches, the small one broadcast
        ("abcde,d->abce", [(6, 7, 9, 15, 84), (15,)], {"nb": 378, "m": 84, "n": 1, "k": 15, "pack_a": 0}),
        ("d,abcde->abce", [(15,), (6, 7, 9, 15, 84)], {"nb": 378, "n": 84, "m": 1, "k": 15, "pack_b": 0}),
        ("abcd,ce->abde", [(2, 3, 40, 3000), (40, 5)], {"nb": 6, "k": 40, "pack_a": 0, "pack_b": 0}),
        # too small to be worth it, or in an order the batches cannot take: packed
        ("abcde,d->abce", [(2, 2, 2, 5, 6), (5,)], {"nb": 1, "m": 48, "pack_a": 1}),
        ("abcd,c->bad", [(6, 5, 40, 300), (40,)], {"nb": 1, "pack_a": 1}),
        # many batches of a real GEMM each: a BLAS call per batch would cost more than the copy
        ("abcde,df->abcef", [(6, 7, 9, 15, 84), (15, 3)], {"nb": 1, "pack_a": 1}),
    ],
)
def test_gemm_plan_promotes_leading_labels(s, eq, shapes, want):
    got = _gemm_plan(s, eq, "float64", shapes)
    assert {k: got[k] for k in want} == want, got
