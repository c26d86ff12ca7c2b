"""Contraction paths: the optimizer a caller names (numpy's and opt_einsum's strategy names, any opt_einsum
``PathOptimizer``, cotengra's ``HyperOptimizer`` when cotengra is installed) gives the path opt_einsum finds
for it, and the einsum along it gives numpy's values within the bound of that path; generated instances of
the ``einsum_benchmark`` package included."""

from __future__ import annotations

import numpy as np
import opt_einsum
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts

EQ = "abc,cd,def,fa,bg,gh->eh"
SHAPES = [(4, 5, 6), (6, 3), (3, 7, 4), (4, 4), (5, 6), (6, 2)]


def _arrays(shapes, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s) for s in shapes]


@pytest.mark.parametrize(
    "optimize",
    ["greedy", "optimal", "dp", "branch-2", "branch-all", "random-greedy", "auto", "auto-hq", True],
)
def test_named_strategies_follow_opt_einsums_path(optimize):
    ops = _arrays(SHAPES)
    ours, _ = ts.einsum_path(EQ, *ops, optimize=optimize)
    if optimize not in ("random-greedy",):  # random: its own draw each search
        theirs, _ = opt_einsum.contract_path(EQ, *ops, optimize="greedy" if optimize is True else optimize)
        assert [tuple(p) for p in ours[1:]] == [tuple(p) for p in theirs]
    got = ts.einsum(EQ, *ops, optimize=optimize)
    assert_einsum_close(got, EQ, *ops)


@pytest.mark.parametrize(
    "make",
    [
        lambda: opt_einsum.RandomGreedy(max_repeats=8),
        lambda: opt_einsum.DynamicProgramming(minimize="size"),
        lambda: opt_einsum.paths.BranchBound(nbranch=2),
    ],
    ids=["random-greedy", "dp-size", "branch"],
)
def test_path_optimizer_objects(make):
    ops = _arrays(SHAPES, 1)
    got = ts.einsum(EQ, *ops, optimize=make())
    assert_einsum_close(got, EQ, *ops)
    rel = ts.default_session().einsum(EQ, *ops, optimize=make())  # a lazy call: an object is not a cache key
    assert_einsum_close(rel.numpy(), EQ, *ops)


@pytest.mark.filterwarnings("ignore:Couldn't import `kahypar`")  # cotengra's own note: a slower default
def test_cotengra_hyper_optimizer():
    ctg = pytest.importorskip("cotengra", reason="cotengra is optional (make bench installs it)")
    ops = _arrays(SHAPES, 2)
    opt = ctg.HyperOptimizer(max_repeats=8, progbar=False)
    assert isinstance(opt, opt_einsum.paths.PathOptimizer)
    got = ts.einsum(EQ, *ops, optimize=opt)
    assert_einsum_close(got, EQ, *ops)
    path, _ = ts.einsum_path(EQ, *ops, optimize=ctg.HyperOptimizer(max_repeats=8, progbar=False))
    assert len(path) - 1 == len(ops) - 1


def test_generated_instances_match_opt_einsum():
    """A few of the benchmark's generated instances (random networks, trees, lattices, chains, MPS, ...)
    through tensorsql, against opt_einsum's contraction (a float64 reference along the same path)."""
    pytest.importorskip("einsum_benchmark", reason="the generators come from the einsum_benchmark package")
    from benchmarks.instances import instances

    chosen = [i for i in instances() if i.family in ("network", "tree", "mps", "chain", "lattice")][::4]
    assert len(chosen) >= 4
    for inst in chosen:
        eq, shapes = inst.build()
        rng = np.random.default_rng(1)
        ops = [rng.standard_normal(s) * 0.5 for s in shapes]  # kept small: every size is cheap here
        ops = [o[tuple(slice(0, min(n, 4)) for n in o.shape)] for o in ops]
        sizes: dict[str, int] = {}
        for term, o in zip(eq.split("->")[0].split(","), ops, strict=True):
            for label, n in zip(term, o.shape, strict=True):
                sizes[label] = min(sizes.get(label, n), n)
        ops = [o[tuple(slice(0, sizes[label]) for label in term)] for term, o in
               zip(eq.split("->")[0].split(","), ops, strict=True)]  # fmt: skip
        got = ts.einsum(eq, *ops)
        assert_einsum_close(got, eq, *ops, optimize="auto")
