"""Checks the shared einsum case list itself against numpy; does not need tensorsql.

Run: ``.venv/bin/python -m pytest tests/planner/test_equations_valid.py``
"""

from __future__ import annotations

import math

import numpy as np
import opt_einsum as oe
import pytest
from equations import (
    BLOCKING_CASES,
    EQUATIONS,
    NARY_OPTIMIZE_CASES,
    SUBLIST_CASES,
    Case,
    SublistCase,
    count_by_category,
    sublist_reference,
)
from tolerance import assert_einsum_close

MAX_OPERAND_ELEMENTS = 500


def _operands(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [np.asarray(rng.standard_normal(s)) for s in shapes]


def test_case_list_size_and_ids():
    assert len(EQUATIONS) >= 170
    ids = [c.id for c in EQUATIONS]
    assert len(ids) == len(set(ids)), "duplicate case ids"
    sub_ids = [c.id for c in SUBLIST_CASES]
    assert len(sub_ids) == len(set(sub_ids))
    counts = count_by_category()
    assert counts["benchmark"] >= 10
    for cat in ("binary", "unary", "implicit", "ellipsis", "broadcast1", "repeated", "shared3",
                "scalar0d", "zerosize", "uppercase", "nary"):
        assert counts.get(cat, 0) >= 5, cat


@pytest.mark.parametrize("case", EQUATIONS, ids=lambda c: c.id)
def test_numpy_valid(case: Case):
    for shape in case.shapes:
        assert math.prod(shape) <= MAX_OPERAND_ELEMENTS, shape
    ops = _operands(case.shapes)
    ref = np.einsum(case.subscripts, *ops)
    # numpy's optimized path and opt_einsum must agree with the plain loop (guards against typos in
    # shapes that only the plain loop would broadcast away unnoticed)
    assert_einsum_close(np.einsum(case.subscripts, *ops, optimize=True), case.subscripts, *ops, want=ref)
    if "..." not in case.subscripts and not _uses_size1_broadcast(case):
        assert_einsum_close(oe.contract(case.subscripts, *ops), case.subscripts, *ops, want=ref)


def _uses_size1_broadcast(case: Case) -> bool:
    """True when some label has size 1 in one place and another size elsewhere (numpy broadcasts it)."""
    inputs = case.subscripts.split("->")[0].split(",")
    sizes: dict[str, set[int]] = {}
    for term, shape in zip(inputs, case.shapes, strict=True):
        if "..." in term:
            continue
        for lab, d in zip(term, shape, strict=True):
            sizes.setdefault(lab, set()).add(d)
    return any(len(s) > 1 for s in sizes.values())


@pytest.mark.parametrize("case", SUBLIST_CASES, ids=lambda c: c.id)
def test_numpy_valid_sublist(case: SublistCase):
    for shape in case.shapes:
        assert math.prod(shape) <= MAX_OPERAND_ELEMENTS, shape
    ops = _operands(case.shapes)
    ref = sublist_reference(case, ops)
    assert_einsum_close(oe.contract(*case.args(ops)), *case.args(ops), want=ref)


def test_sublist_has_labels_above_52():
    assert max(c.max_label for c in SUBLIST_CASES) >= 59
    assert any(len({x for sub in c.sublists for x in sub}) >= 60 for c in SUBLIST_CASES)


def test_numpy_valid_subsets():
    assert 35 <= len(BLOCKING_CASES) <= 45
    for case in BLOCKING_CASES:
        assert all(d > 0 for s in case.shapes for d in s)
    assert len(NARY_OPTIMIZE_CASES) >= 8
    for case in NARY_OPTIMIZE_CASES:
        ops = _operands(case.shapes)
        path, _ = np.einsum_path(case.subscripts, *ops, optimize="greedy")
        assert_einsum_close(np.einsum(case.subscripts, *ops, optimize=path), case.subscripts, *ops,
                            want=np.einsum(case.subscripts, *ops))
