"""tensorsql.einsum against numpy.einsum over the shared case list (tests/equations.py).

Every case is tiny, but the full product EQUATIONS x dtypes goes through DuckDB, so keep new cases small.
The validity of the cases themselves is checked without tensorsql in tests/planner/test_equations_valid.py.
"""

from __future__ import annotations

import zlib

import kernel_paths
import numpy as np
import pytest
import tolerance
from equations import (
    BLOCKING_CASES,
    EQUATIONS,
    NARY_OPTIMIZE_CASES,
    SUBLIST_CASES,
    Case,
    SublistCase,
    sublist_reference,
)

import tensorsql

DTYPES = [np.float32, np.float64, np.int64, np.complex128]


# --------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------
def _rng(*key) -> np.random.Generator:
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def make_operand(shape, dtype, rng: np.random.Generator) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind == "i":
        return np.asarray(rng.integers(-3, 4, size=shape), dtype=dtype)
    if dtype.kind == "c":
        return np.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), dtype=dtype)
    return np.asarray(rng.standard_normal(shape), dtype=dtype)


def make_operands(shapes, dtype, *key) -> list[np.ndarray]:
    rng = _rng(*key, np.dtype(dtype).name)
    return [make_operand(s, dtype, rng) for s in shapes]


def _wide(a: np.ndarray) -> np.ndarray:
    """The operand at reference precision (float32 -> float64) for computing the expected values."""
    return a.astype(np.float64) if a.dtype == np.float32 else a


def assert_einsum_close(result, call_args: list, expected_dtype=None, **np_kwargs) -> None:
    """Compare a tensorsql result with ``np.einsum(*call_args, **np_kwargs)``.

    ``call_args`` is either ``[subscripts, *operands]`` or the interleaved form.  Floating results are
    compared against a float64 (for float32) reference within tolerance.einsum_tolerance: K·eps of the
    result dtype times the einsum of the absolute values, so that cancellation in sums does not make the
    check flaky; int64 is compared exactly.  Shape and dtype must match numpy's.
    """
    expected = np.asarray(np.einsum(*call_args, **np_kwargs))
    res = np.asarray(result)
    assert res.shape == expected.shape, (res.shape, expected.shape)
    want_dtype = expected.dtype if expected_dtype is None else np.dtype(expected_dtype)
    assert res.dtype == want_dtype, (res.dtype, want_dtype)
    if want_dtype.kind in "iub":
        np.testing.assert_array_equal(res, expected)
        return
    wide = [_wide(x) if isinstance(x, np.ndarray) else x for x in call_args]
    ref = np.asarray(np.einsum(*wide, **{k: v for k, v in np_kwargs.items() if k != "dtype"}))
    tolerance.assert_close(res, ref, tolerance.einsum_tolerance(*call_args, dtype=want_dtype))


def assert_array_close_to(result, call_args: list, expected: np.ndarray) -> None:
    """For results whose reference is already computed (sublist cases with labels >= 52)."""
    res = np.asarray(result)
    expected = np.asarray(expected)
    assert res.shape == expected.shape
    assert res.dtype == expected.dtype
    tolerance.assert_einsum_close(res, *call_args, want=expected, dtype=expected.dtype)




# --------------------------------------------------------------------------------------------------
# EQUATIONS x dtypes through tensorsql.einsum
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", EQUATIONS, ids=lambda c: c.id)
def test_einsum_matches_numpy(case: Case, dtype):
    ops = make_operands(case.shapes, dtype, case.id)
    originals = [o.copy() for o in ops]
    result = tensorsql.einsum(case.subscripts, *ops)
    assert_einsum_close(result, [case.subscripts, *ops])
    for o, orig in zip(ops, originals, strict=True):  # inputs are not modified
        np.testing.assert_array_equal(o, orig)


@pytest.mark.parametrize("dtype", [np.float64, np.int64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", SUBLIST_CASES, ids=lambda c: c.id)
def test_einsum_sublist_matches_numpy(case: SublistCase, dtype):
    ops = make_operands(case.shapes, dtype, case.id)
    if len(ops) > 10 and np.dtype(dtype).kind == "i":  # long chains: +-1 so ints neither vanish nor overflow
        ops = [np.where(o >= 0, 1, -1).astype(dtype) for o in ops]
    result = tensorsql.einsum(*case.args(ops))
    if case.max_label < 52:
        assert_einsum_close(result, case.args(ops))
    else:  # numpy's interleaved form stops at 52 labels: pairwise numpy reference
        assert_array_close_to(result, case.args(ops), sublist_reference(case, ops))


def test_einsum_sublist_equals_string_form():
    case = next(c for c in EQUATIONS if c.id == "nary-chain4")
    ops = make_operands(case.shapes, np.float64, case.id)
    got = tensorsql.einsum(ops[0], [0, 1], ops[1], [1, 2], ops[2], [2, 3], ops[3], [3, 4], [0, 4])
    want = tensorsql.einsum("ab,bc,cd,de->ae", *ops)
    tolerance.assert_einsum_close(got, "ab,bc,cd,de->ae", *ops, want=want)


def test_einsum_non_contiguous_operands():
    rng = _rng("non-contiguous")
    a = rng.standard_normal((6, 5))[::2, ::-1]  # strided + negative stride view, (3, 5)
    b = np.asfortranarray(rng.standard_normal((5, 4)))
    c = rng.standard_normal((4, 3)).T  # transposed view, (3, 4)
    assert_einsum_close(tensorsql.einsum("ij,jk,lk->il", a, b, c), ["ij,jk,lk->il", a, b, c])


# --------------------------------------------------------------------------------------------------
# dtype handling
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "dtypes",
    [
        (np.float32, np.float64),
        (np.int64, np.float64),
        (np.int64, np.float32),
        (np.float64, np.complex128),
        (np.int64, np.complex128),
        (np.float32, np.float32),
    ],
    ids=lambda ds: "-".join(np.dtype(d).name for d in ds),
)
def test_mixed_dtype_promotion(dtypes):
    rng = _rng("mixed", dtypes)
    a = make_operand((3, 4), dtypes[0], rng)
    b = make_operand((4, 2), dtypes[1], rng)
    assert_einsum_close(tensorsql.einsum("ij,jk->ik", a, b), ["ij,jk->ik", a, b])


@pytest.mark.parametrize(
    ("in_dtype", "out_dtype"),
    [(np.float32, np.float64), (np.int64, np.float64), (np.float64, np.complex128)],
    ids=lambda d: np.dtype(d).name,
)
@pytest.mark.parametrize("case_id", ["binary-matmul", "unary-trace", "nary-chain3", "ellipsis-bmm"])
def test_dtype_argument(case_id, in_dtype, out_dtype):
    case = next(c for c in EQUATIONS if c.id == case_id)
    ops = make_operands(case.shapes, in_dtype, case.id)
    result = tensorsql.einsum(case.subscripts, *ops, dtype=out_dtype)
    assert_einsum_close(result, [case.subscripts, *ops], expected_dtype=out_dtype, dtype=out_dtype)


# --------------------------------------------------------------------------------------------------
# optimize= variations
# --------------------------------------------------------------------------------------------------
OPTIMIZE = [False, True, "greedy", "optimal", "auto", "einsum_path"]


@pytest.mark.parametrize("optimize", OPTIMIZE, ids=str)
@pytest.mark.parametrize("case", NARY_OPTIMIZE_CASES, ids=lambda c: c.id)
def test_optimize_variants(case: Case, optimize):
    ops = make_operands(case.shapes, np.float64, case.id)
    if optimize == "einsum_path":
        optimize, _ = np.einsum_path(case.subscripts, *ops, optimize="greedy")
    result = tensorsql.einsum(case.subscripts, *ops, optimize=optimize)
    assert_einsum_close(result, [case.subscripts, *ops])


@pytest.mark.parametrize("case", NARY_OPTIMIZE_CASES[:4], ids=lambda c: c.id)
def test_optimize_path_through_session(session, case: Case):
    ops = make_operands(case.shapes, np.float64, case.id)
    path, _ = np.einsum_path(case.subscripts, *ops, optimize="optimal")
    rels = [session.from_numpy(o, block_shape=tuple(min(2, d) for d in o.shape)) for o in ops]
    result = session.einsum(case.subscripts, *rels, optimize=path).numpy()
    assert_einsum_close(result, [case.subscripts, *ops])


# --------------------------------------------------------------------------------------------------
# blocked relations: ragged block shapes and blocks= partitionings
# --------------------------------------------------------------------------------------------------
def _bs(fn):
    return lambda shape: {"block_shape": tuple(fn(d) for d in shape)}


def _parts(n):
    return lambda shape: {"blocks": tuple(min(n, d) for d in shape)}


BLOCKINGS = {
    "block1": _bs(lambda d: 1),
    "block2_ragged": _bs(lambda d: min(2, d)),
    "block3_ragged": _bs(lambda d: min(3, d)),
    "block_dim_minus_1": _bs(lambda d: max(1, d - 1)),
    "block_whole": _bs(lambda d: d),
    "blocks2": _parts(2),
    "blocks3": _parts(3),
}


@pytest.mark.parametrize("blocking", list(BLOCKINGS), ids=str)
@pytest.mark.parametrize("case", BLOCKING_CASES, ids=lambda c: c.id)
def test_blocked_einsum(session, case: Case, blocking):
    ops = make_operands(case.shapes, np.float64, case.id, blocking)
    rels = [session.from_numpy(o, **BLOCKINGS[blocking](o.shape)) for o in ops]
    for rel, o in zip(rels, ops, strict=True):
        assert tuple(rel.shape) == o.shape
    lazy = session.einsum(case.subscripts, *rels)
    assert not isinstance(lazy, np.ndarray)
    assert_einsum_close(lazy.numpy(), [case.subscripts, *ops])


@pytest.mark.parametrize("dtype", [np.int64, np.complex128, np.float32], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", BLOCKING_CASES[::4], ids=lambda c: c.id)
def test_blocked_einsum_dtypes(session, case: Case, dtype):
    ops = make_operands(case.shapes, dtype, case.id, "blocked")
    rels = [session.from_numpy(o, block_shape=tuple(min(2, d) for d in o.shape)) for o in ops]
    assert_einsum_close(session.einsum(case.subscripts, *rels).numpy(), [case.subscripts, *ops])


@pytest.mark.parametrize("case", [c for c in BLOCKING_CASES if len(c.shapes) >= 2][:8], ids=lambda c: c.id)
def test_session_einsum_mixes_relations_and_arrays(session, case: Case):
    ops = make_operands(case.shapes, np.float64, case.id, "mixed")
    args = [session.from_numpy(o, block_shape=tuple(min(3, d) for d in o.shape)) if i % 2 == 0 else o
            for i, o in enumerate(ops)]
    assert_einsum_close(session.einsum(case.subscripts, *args).numpy(), [case.subscripts, *ops])


def test_session_einsum_chained_lazy(session):
    """The lazy result of one einsum feeds another one."""
    rng = _rng("chained")
    a, b, c = (rng.standard_normal(s) for s in [(5, 4), (4, 3), (3, 5)])
    ra, rb, rc = (session.from_numpy(x, block_shape=(2, 2)) for x in (a, b, c))
    ab = session.einsum("ij,jk->ik", ra, rb)
    result = session.einsum("ik,kl->li", ab, rc).numpy()
    tolerance.assert_einsum_close(result, "ij,jk,kl->li", a, b, c)


# --------------------------------------------------------------------------------------------------
# every GEMM kernel path (TENSORSQL_KERNEL_PATH): a representative subset through a session on each
# --------------------------------------------------------------------------------------------------
# every fourth contraction of EQUATIONS (each category), and products big enough for the packed float32
# kernel (M, N >= 16), transposed, batched, interleaved (tiled scatter), with diagonals, and chained
PATH_CASES = [c for c in EQUATIONS if len(c.shapes) >= 2][::4] + [
    Case(f"large-{i}", eq, shapes, "large")
    for i, (eq, shapes) in enumerate(
        [
            ("ij,jk->ik", ((40, 33), (33, 50))),
            ("ji,kj->ik", ((33, 40), (50, 33))),
            ("ij,jk->ki", ((40, 300), (300, 24))),
            ("bij,bjk->bik", ((3, 20, 17), (3, 17, 24))),
            ("abk,kcd->acbd", ((10, 12, 20), (20, 9, 8))),
            ("abcd,cdef->abef", ((4, 5, 6, 6), (6, 6, 5, 4))),
            ("iij,jk->ik", ((20, 20, 30), (30, 18))),
            ("ij,jk,kl->il", ((30, 20), (20, 40), (40, 16))),
        ]
    )
]
PATH_DTYPES = [np.float32, np.float64, np.complex64, np.complex128]


@pytest.fixture(scope="module")
def path_session(kernel_path):
    s = kernel_paths.connect(kernel_path, threads=2)
    assert s.execute("SELECT tensorsql_kernel_path()")[0][0] == kernel_path
    yield s
    s.close()


@pytest.mark.parametrize("dtype", PATH_DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", PATH_CASES, ids=lambda c: c.id)
def test_einsum_matches_numpy_on_every_kernel_path(path_session, case: Case, dtype):
    ops = make_operands(case.shapes, dtype, case.id)
    assert_einsum_close(path_session.einsum(case.subscripts, *ops).numpy(), [case.subscripts, *ops])


# --------------------------------------------------------------------------------------------------
# errors: where numpy rejects the call with ValueError, so does tensorsql
# --------------------------------------------------------------------------------------------------
INVALID = [
    ("output_label_not_in_input", "ij,jk->il", [(3, 4), (4, 5)]),
    ("size_mismatch", "ij,jk->ik", [(3, 4), (5, 6)]),
    ("too_many_operands", "ij->i", [(3, 4), (4,)]),
    ("too_few_operands", "ij,jk->ik", [(3, 4)]),
    ("rank_mismatch", "ijk->i", [(3, 4)]),
    ("repeated_output_label", "ij->ii", [(3, 3)]),
    ("diagonal_mismatch", "ii->i", [(3, 4)]),
    ("ellipsis_missing_in_output", "...i->i", [(2, 3)]),
    ("bad_character", "i$,j->ij", [(3, 4), (4,)]),
]


@pytest.mark.parametrize(("subscripts", "shapes"), [x[1:] for x in INVALID], ids=[x[0] for x in INVALID])
def test_invalid_raises_value_error_like_numpy(subscripts, shapes):
    ops = [np.ones(s) for s in shapes]
    with pytest.raises(ValueError):
        np.einsum(subscripts, *ops)
    with pytest.raises(ValueError):
        tensorsql.einsum(subscripts, *ops)
