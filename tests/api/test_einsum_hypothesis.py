"""Property tests: random valid einsum equations against numpy (also at the integer dtypes' extremes and with
empty axes, and with the extended EinSum's joins and aggregations), and from_numpy/numpy roundtrips."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from numpy_ref import AGG_REF, JOIN_REF
from tolerance import assert_close, assert_einsum_close, reduction_tolerance

import tensorsql
from tensorsql.ir import ops as OPS

LABEL_POOL = "abcdefgXY"
EINSUM_DTYPES = [np.float64, np.int64, np.complex128, np.float32]
ALL_DTYPES = [np.float32, np.float64, np.int64, np.complex128]

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


#: integer dtypes drawn at their extremes (min, max, their neighbours, 0, +-1; 2**63 + 10 for uint64)
EXTREME_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]


def _extreme_pool(dt: np.dtype) -> np.ndarray:
    info = np.iinfo(dt)
    vals = {info.min, info.max, info.min + 1, info.max - 1, 0, 1, 2, info.max // 2 + 1}
    if dt.kind == "i":
        vals |= {-1, -2}
    if dt == np.uint64:
        vals |= {2**63 + 10, 2**63 - 1}
    return np.array(sorted(vals), dtype=dt)


@dataclass(frozen=True)
class Problem:
    subscripts: str
    shapes: tuple[tuple[int, ...], ...]
    dtype: type
    seed: int
    extreme: bool = False  # integers drawn from the dtype's extremes

    def operands(self) -> list[np.ndarray]:
        rng = np.random.default_rng(self.seed)
        dt = np.dtype(self.dtype)
        out = []
        for s in self.shapes:
            if self.extreme and dt.kind in "iu":
                out.append(rng.choice(_extreme_pool(dt), size=s))
            elif dt.kind == "i":
                out.append(np.asarray(rng.integers(-3, 4, size=s), dtype=dt))
            elif dt.kind == "c":
                out.append(np.asarray(rng.standard_normal(s) + 1j * rng.standard_normal(s), dtype=dt))
            else:
                out.append(np.asarray(rng.standard_normal(s), dtype=dt))
        return out


@st.composite
def einsum_problems(
    draw,
    min_size: int = 1,
    dtypes=None,
    extreme: bool = False,
    max_ops: int = 3,
    ellipsis: bool = True,
    explicit: bool = False,
) -> Problem:
    """1-3 operands with 0-4 labelled dims each (labels may repeat inside an operand), label sizes 1-4,
    occasional size-1 broadcasting of a label, optionally '...' in some operands (with size-1
    broadcast dims), and either implicit output or an explicit random subset/order of the labels.

    ``min_size=0``: empty axes too; ``dtypes``/``extreme``: integer dtypes drawn at their extremes;
    ``max_ops``, ``ellipsis``, ``explicit``: fewer operands, no '...', an explicit output always."""
    n_ops = draw(st.integers(1, max_ops))
    labels = draw(st.lists(st.sampled_from(LABEL_POOL), min_size=1, max_size=5, unique=True))
    size = {lab: draw(st.integers(min_size, 4)) for lab in labels}
    use_ellipsis = ellipsis and draw(st.booleans())
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
            ell = [d if draw(st.integers(0, 3)) else 1 for d in ell_shape[len(ell_shape) - n_ell :]]
            at = draw(st.integers(0, len(term)))
            text = "".join(term[:at]) + "..." + "".join(term[at:])
            dims = dims[:at] + ell + dims[at:]
        terms.append(text)
        shapes.append(tuple(dims))

    subscripts = ",".join(terms)
    if explicit or draw(st.booleans()):  # explicit output
        used = list(dict.fromkeys(lab for t in terms for lab in t if lab != "."))
        out = draw(st.permutations(used))[: draw(st.integers(0, len(used)))]
        out_text = "".join(out)
        if any_ellipsis:
            at = draw(st.integers(0, len(out)))
            out_text = "".join(out[:at]) + "..." + "".join(out[at:])
        subscripts += "->" + out_text
    dtype = draw(st.sampled_from(dtypes or EINSUM_DTYPES))
    seed = draw(st.integers(0, 2**32 - 1))
    return Problem(subscripts, tuple(shapes), dtype, seed, extreme)


def _assert_matches_numpy(result, problem: Problem, ops: list[np.ndarray]) -> None:
    expected = np.asarray(np.einsum(problem.subscripts, *ops))
    res = np.asarray(result)
    assert res.shape == expected.shape
    assert res.dtype == expected.dtype
    if expected.dtype.kind in "iu":
        np.testing.assert_array_equal(res, expected)
        return
    assert_einsum_close(res, problem.subscripts, *ops)  # against a float64 reference, K·eps of the dtype


@SETTINGS
@given(problem=einsum_problems())
def test_random_einsum_matches_numpy(problem: Problem):
    ops = problem.operands()
    np.einsum(problem.subscripts, *ops)  # the strategy only generates what numpy accepts
    _assert_matches_numpy(tensorsql.einsum(problem.subscripts, *ops), problem, ops)


@SETTINGS
@given(problem=einsum_problems(min_size=0, dtypes=EINSUM_DTYPES + EXTREME_DTYPES, extreme=True))
def test_random_einsum_at_integer_extremes_and_empty_axes_matches_numpy(problem: Problem):
    """Wrapping integer arithmetic at every integer dtype's extremes (uint64 above 2**63), and empty axes
    (a sum over an empty label is 0, an empty output is empty), exactly as numpy."""
    ops = problem.operands()
    np.einsum(problem.subscripts, *ops)
    _assert_matches_numpy(tensorsql.einsum(problem.subscripts, *ops), problem, ops)




def extended_reference(subscripts: str, ops: list[np.ndarray], join: str, agg: str):
    """The extended EinSum by broadcasting: every operand's diagonal spread over all labels, joined, and
    reduced by agg over the labels not in the output (in the terms' dtype, as einsum computes; numpy's
    ValueError for max/min over an empty label). Returns (result, terms, reduced axes, the permutation from
    the kept labels' order to the output's)."""
    lhs, out = subscripts.split("->")
    terms = lhs.split(",")
    labels = list(dict.fromkeys(c for term in terms for c in term))
    sizes: dict[str, int] = {}
    for term, op in zip(terms, ops, strict=True):
        for c, n in zip(term, op.shape, strict=True):
            sizes[c] = n if n != 1 else sizes.get(c, 1)  # a label's sizes agree or are 1 (broadcast)
    full = []
    for term, op in zip(terms, ops, strict=True):
        uniq = "".join(dict.fromkeys(term))
        arr = np.einsum(f"{term}->{uniq}", op)  # the diagonal of repeated labels
        order = sorted(range(len(uniq)), key=lambda i: labels.index(uniq[i]))
        arr = arr.transpose(order).reshape([arr.shape[uniq.index(c)] if c in uniq else 1 for c in labels])
        full.append(np.broadcast_to(arr, [sizes[c] for c in labels]))
    with np.errstate(all="ignore"):
        joined = JOIN_REF[join](full[0], full[1]) if len(full) == 2 else full[0]
        axes = tuple(i for i, c in enumerate(labels) if c not in out)
        kw = {"dtype": joined.dtype} if agg in ("sum", "prod") else {}
        res = AGG_REF[agg](joined, axis=axes, **kw) if axes else joined
    kept = [c for c in labels if c in out]
    perm = [kept.index(c) for c in out]
    return np.asarray(res).transpose(perm), joined, axes, perm


@SETTINGS
@given(
    problem=einsum_problems(
        min_size=0,
        dtypes=[np.float64, *EXTREME_DTYPES],
        extreme=True,
        max_ops=2,
        ellipsis=False,
        explicit=True,
    ),
    join=st.sampled_from(OPS.JOINS),
    agg=st.sampled_from(OPS.AGGS),
)
def test_random_extended_einsum_matches_numpy(problem: Problem, join: str, agg: str):
    """Every join and aggregation on random one- and two-operand equations, at the integer extremes and with
    empty axes: integers exactly, floats within the reduction's rounding error, numpy's ValueError where a
    max/min reduces over an empty label."""
    ops = problem.operands()
    try:
        want, terms, axes, perm = extended_reference(problem.subscripts, ops, join, agg)
    except ValueError:
        with pytest.raises(tensorsql.EinsumError, match="has no identity"):
            tensorsql.einsum(problem.subscripts, *ops, join=join, agg=agg)
        return
    got = np.asarray(tensorsql.einsum(problem.subscripts, *ops, join=join, agg=agg))
    assert got.shape == want.shape and got.dtype == want.dtype
    if want.dtype.kind in "iu":
        np.testing.assert_array_equal(got, want)
    else:
        if axes:  # the reduction's tolerance, in the kept labels' order: to the output's
            tol = np.asarray(reduction_tolerance(terms, agg, axes, want.dtype)).transpose(perm)
        else:
            tol = 4 * np.finfo(want.dtype).eps * np.abs(want)
        assert_close(got, want, tol)


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
    forced ``blocks=`` parts for the repeated label and a random subset of the others (a forced
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


@st.composite
def reblock_problems(draw):
    """An array, a stored block shape, and a target block shape whose every dimension is the stored block
    times or divided by a whole ratio (a merge or a split, or kept), with ragged edges and mixed dimensions:
    the repartitions that skip the slice (merge) or the assemble (split) in ``sqlgen``."""
    rank = draw(st.integers(1, 3))
    shape = tuple(draw(st.integers(1, 13)) for _ in range(rank))
    stored, target = [], []
    for n in shape:
        base = draw(st.integers(1, max(1, n)))
        ratio = draw(st.integers(1, 4))
        bigger = draw(st.booleans())
        stored.append(base * ratio if not bigger else base)
        target.append(base if not bigger else base * ratio)
    dtype = draw(st.sampled_from(ALL_DTYPES))
    return shape, tuple(stored), tuple(target), dtype, draw(st.integers(0, 2**16))


@SETTINGS
@given(case=reblock_problems())
def test_reblock_by_whole_ratios_matches_numpy(session, case):
    shape, stored, target, dtype, seed = case
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) * 8).astype(dtype)
    rel = session.from_numpy(a, block_shape=stored).reblock(target)
    _assert_identical(rel.numpy(), a)
    _assert_identical(rel[::2].numpy(), a[::2])  # a slice over the reblocked relation (a filtered read)
