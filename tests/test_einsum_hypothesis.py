"""Property tests: random valid einsum equations against numpy, and from_numpy/numpy roundtrips."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tolerance import assert_einsum_close

import tensorsql

LABEL_POOL = "abcdefgXY"
EINSUM_DTYPES = [np.float64, np.int64, np.complex128, np.float32]
ALL_DTYPES = [np.float32, np.float64, np.int64, np.complex128]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@dataclass(frozen=True)
class Problem:
    subscripts: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: type
    seed: int

    def operands(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        dt = np.dtype(self.dtype)
        out = []
        for s in self.shapes:
            if dt.kind == "i":
                out.append(np.asarray(rng.integers(-3, 4, size=s), dtype=dt))
            elif dt.kind == "c":
                out.append(np.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s), dtype=dt))
            else:
                out.append(np.asarray(rng.standard_normal(s), dtype=dt))
        return out


@st.composite
def einsum_problems(draw) -> Problem:
    """1-3 operands with 0-4 labelled dims each (labels may repeat inside an operand), label sizes 1-4,
    occasional size-1 broadcasting of a label, optionally '...' in some operands (with size-1
    broadcast dims), and either implicit output or an explicit random subset/order of the labels."""
    n_ops = draw(st.integers(1, 3))
    labels = draw(st.lists(st.sampled_from(LABEL_POOL), min_size=1, max_size=5, unique=True))
    size = {lab: draw(st.integers(1, 4)) for lab in labels}
    use_ellipsis = draw(st.booleans())
    ell_shape = draw(st.lists(st.integers(1, 3), max_size=2)) if use_ellipsis else []

    terms: list[str] = []
    shapes: list[tuple[int, ...]] = []
    any_ellipsis = False
    for _ in range(n_ops):
        ndim = draw(st.integers(0, 4))
        term = draw(st.lists(st.sampled_from(labels), min_size=ndim, max_size=ndim))
        dims = [size[lab] for lab in term]
        # size-1 broadcasting of a label that occurs once in this operand
        for pos, lab in enumerate(term):
            if term.count(lab) == 1 and size[lab] > 1 and draw(st.integers(0, 5)) == 0:
                dims[pos] = 1
        text = "".join(term)
        if use_ellipsis and draw(st.booleans()):
            any_ellipsis = True
            n_ell = draw(st.integers(0, len(ell_shape)))
            ell = [d if draw(st.integers(0, 3)) else 1 for d in ell_shape[len(ell_shape) - n_ell:]]
            at = draw(st.integers(0, len(term)))
            text = "".join(term[:at]) + "..." + "".join(term[at:])
            dims = dims[:at] + ell + dims[at:]
        terms.append(text)
        shapes.append(tuple(dims))

    subscripts = ",".join(terms)
    if draw(st.booleans()):  # explicit output
        used = list(dict.fromkeys(lab for t in terms for lab in t if lab != "."))
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        out_text = "".join(out)
        if any_ellipsis:
            at = draw(st.integers(0, len(out)))
            out_text = "".join(out[:at]) + "..." + "".join(out[at:])
        subscripts += "->" + out_text
    dtype = draw(st.sampled_from(EINSUM_DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    return Problem(subscripts, tuple(shapes), dtype, seed)


def _assert_matches_numpy(result, problem: Problem, ops: list[np.ndarray]) -> None:
    expected = np.asarray(np.einsum(problem.subscripts, *ops))
    res = np.asarray(result)
    assert res.shape == expected.shape
    assert res.dtype == expected.dtype
    if expected.dtype.kind == "i":
        np.testing.assert_array_equal(res, expected)
        return
    assert_einsum_close(res, problem.subscripts, *ops)  # against a float64 reference, K·eps of the dtype




@SETTINGS
@given(problem=einsum_problems())
def test_random_einsum_matches_numpy(problem: Problem):
    ops = problem.operands()
    np.einsum(problem.subscripts, *ops)  # the strategy only generates what numpy accepts
    _assert_matches_numpy(tensorsql.einsum(problem.subscripts, *ops), problem, ops)


@st.composite
def _block_shape_for(draw, shape):
    return tuple(draw(st.integers(1, max(d, 1))) for d in shape)


@SETTINGS
@given(problem=einsum_problems(), data=st.data())
def test_random_blocked_einsum_matches_numpy(session, problem: Problem, data):
    ops = problem.operands()
    rels = [session.from_numpy(o, block_shape=data.draw(_block_shape_for(o.shape))) for o in ops]
    _assert_matches_numpy(session.einsum(problem.subscripts, *rels).numpy(), problem, ops)


@st.composite
def repeated_label_problems(draw) -> tuple[Problem, dict[str, int], bool]:
    """1-2 operands, the first with a label repeated 2-4 times (a diagonal, a trace), label sizes 1-5, and
    forced ``blocks=`` parts for the repeated label and a random subset of the others (issue 13: a forced
    split of a repeated label made the blocks' whole cross product). Third: whether operands are relations."""
    labels = draw(st.lists(st.sampled_from("abcdef"), min_size=1, max_size=3, unique=True))
    size = {lab: draw(st.integers(1, 5)) for lab in labels}
    rep = labels[0]
    terms: list[str] = []
    for k in range(draw(st.integers(1, 2))):
        term = draw(st.lists(st.sampled_from(labels), min_size=0, max_size=2))
        if k == 0:
            term = draw(st.permutations([rep] * draw(st.integers(2, 4)) + term))
        terms.append("".join(term))
    used = list(dict.fromkeys(lab for t in terms for lab in t))
    out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
    shapes = tuple(tuple(size[lab] for lab in t) for t in terms)
    forced = {rep, *draw(st.lists(st.sampled_from(used), max_size=len(used)))}
    blocks = {lab: draw(st.integers(1, size[lab])) for lab in sorted(forced)}
    problem = Problem(",".join(terms) + "->" + "".join(out), shapes, draw(st.sampled_from(EINSUM_DTYPES)),
                      draw(st.integers(0, 2**32 - 1)))
    return problem, blocks, draw(st.booleans())


@SETTINGS
@given(case=repeated_label_problems(), data=st.data())
def test_repeated_labels_with_forced_blocks_match_numpy(session, case, data):
    problem, blocks, as_relations = case
    ops = problem.operands()
    args: list[object] = list(ops)
    if as_relations:  # stored blockings that disagree with the forced one: re-split, diagonal blocks only
        args = [session.from_numpy(o, block_shape=data.draw(_block_shape_for(o.shape))) for o in ops]
    result = session.einsum(problem.subscripts, *args, blocks=blocks).numpy()
    _assert_matches_numpy(result, problem, ops)


@st.composite
def arrays_with_blocking(draw, min_dim=1):
    ndim = draw(st.integers(0, 4))
    shape = tuple(draw(st.lists(st.integers(min_dim, 6), min_size=ndim, max_size=ndim)))
    if math.prod(shape) > 400:
        shape = tuple(min(d, 3) for d in shape)
    dtype = np.dtype(draw(st.sampled_from(ALL_DTYPES)))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    if dtype.kind == "i":
        a = rng.integers(-(2**62), 2**62, size=shape, dtype=np.int64)
    elif dtype.kind == "c":
        a = np.asarray(rng.standard_normal(shape) + 1j * rng.standard_normal(shape), dtype=dtype)
    else:
        a = np.asarray(rng.standard_normal(shape), dtype=dtype)
    layout = draw(st.sampled_from(["c", "fortran", "reversed_view"]))
    if layout == "fortran":
        a = np.asfortranarray(a)
    elif layout == "reversed_view" and a.ndim:
        a = a[::-1]
    return a


def _assert_identical(back, a: np.ndarray) -> None:
    back = np.asarray(back)
    assert back.shape == a.shape
    assert back.dtype == a.dtype
    np.testing.assert_array_equal(back, a)


@SETTINGS
@given(a=arrays_with_blocking(), data=st.data())
def test_from_numpy_block_shape_roundtrip(session, a: np.ndarray, data):
    block_shape = data.draw(_block_shape_for(a.shape))
    _assert_identical(session.from_numpy(a, block_shape=block_shape).numpy(), a)


@SETTINGS
@given(a=arrays_with_blocking(), data=st.data())
def test_from_numpy_blocks_roundtrip(session, a: np.ndarray, data):
    blocks = tuple(data.draw(st.integers(1, max(d, 1))) for d in a.shape)
    _assert_identical(session.from_numpy(a, blocks=blocks).numpy(), a)


@pytest.mark.parametrize("shape", [(0,), (0, 3), (3, 0), (2, 0, 4)], ids=str)
def test_from_numpy_zero_size_roundtrip(session, shape):
    a = np.ones(shape)
    _assert_identical(session.from_numpy(a, block_shape=tuple(max(1, min(2, d)) for d in shape)).numpy(), a)
