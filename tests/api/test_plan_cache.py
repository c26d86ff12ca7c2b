"""The plan caches: ``ts.einsum``'s (by equation, shapes, dtypes, options), a session's lazy ``einsum`` calls
over arrays (their graph and plan, so ``s.einsum(...).numpy()`` in a loop plans once), their reuse across
relations with other arrays, and what invalidates or bypasses them (a stored table changed, dropped or saved
again in another blocking; relation operands; ``cache=False``; ``clear_cache``)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
from equations import EQUATIONS
from tolerance import assert_einsum_close

import tensorsql as ts

RNG = np.random.default_rng(17)
#: a few equations of every kind from the shared lists
SAMPLE = EQUATIONS[::max(1, len(EQUATIONS) // 12)][:12]


def _arrays(shapes, seed):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(sh) for sh in shapes]


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_a_lazy_call_made_again_reuses_its_graph_and_plan(s, case):
    """The second relation of one call (other arrays of the same shapes) shares the first's graph and plan,
    and computes its own values."""
    first = _arrays(case.shapes, 1)
    second = _arrays(case.shapes, 2)
    r1 = s.einsum(case.subscripts, *first)
    r2 = s.einsum(case.subscripts, *second)
    assert r2.node is r1.node and r2.plan() is r1.plan()
    assert_einsum_close(r1.numpy(), case.subscripts, *first)
    assert_einsum_close(r2.numpy(), case.subscripts, *second)
    assert_einsum_close(r1.numpy(), case.subscripts, *first)  # each run binds its own arrays again


@pytest.mark.parametrize("strategy", ["eindecomp", "sqrt", "none"])
def test_relations_of_one_cached_call_compose(s, strategy):
    """Two relations from one cached call bind the same graph's leaves to different arrays: combined in one
    einsum (or in compute / compile), each keeps its own arrays."""
    a1, a2, w = RNG.standard_normal((6, 8)), RNG.standard_normal((6, 8)), RNG.standard_normal((8, 5))
    q = s.einsum("sa,ab->sb", a1, w, strategy=strategy)
    k = s.einsum("sa,ab->sb", a2, w, strategy=strategy)
    assert q.node is k.node
    scores = s.einsum("sb,tb->st", q, k, strategy=strategy)
    want = np.einsum("sb,tb->st", a1 @ w, a2 @ w)
    assert_einsum_close(scores.numpy(), "sb,tb->st", a1 @ w, a2 @ w, want=want)
    got_q, got_k = s.compute([q, k])
    assert_einsum_close(got_q, "sa,ab->sb", a1, w)
    assert_einsum_close(got_k, "sa,ab->sb", a2, w)
    x = s.placeholder((6, 8), "float64")
    f = s.compile([s.einsum("sa,ab->sb", x, w), q, k], [x])
    got = f(a1 + 1)
    assert_einsum_close(got[0], "sa,ab->sb", a1 + 1, w)
    assert_einsum_close(got[1], "sa,ab->sb", a1, w)
    assert_einsum_close(got[2], "sa,ab->sb", a2, w)


def test_options_dtypes_and_shapes_key_the_cache(s):
    a, b = RNG.standard_normal((5, 4)), RNG.standard_normal((4, 3))
    base = s.einsum("ij,jk->ik", a, b)
    assert s.einsum("ij,jk->ik", a, b).node is base.node
    others = [
        s.einsum("ij,jk->ik", a.astype(np.float32), b.astype(np.float32)),
        s.einsum("ij,jk->ik", a[:4], b),
        s.einsum("ij,jk->ki", a, b),
        s.einsum("ij,jk->ik", a, b, strategy="sqrt"),
        s.einsum("ij,jk->ik", a, b, blocks={"i": 2}),
        s.einsum("ij,jk->ik", a, b, join="add", agg="max"),
        s.einsum("ij,jk->ik", a, b, cache=False),
    ]
    assert all(o.node is not base.node for o in others)
    assert_einsum_close(others[1].numpy(), "ij,jk->ik", a[:4], b)
    assert_einsum_close(others[4].numpy(), "ij,jk->ik", a, b)
    with pytest.raises(ts.ConfigError, match="cache= must be a bool"):
        s.einsum("ij,jk->ik", a, b, cache="yes")


def test_a_relation_gone_leaves_no_array_in_the_cache(s):
    """A cached call's plan outlives its relations; the arrays a relation kept bound between runs (an Arrow
    view of an operand over 16 MiB, slots) are let go with the relation."""
    a, b = RNG.standard_normal((1500, 1400)), RNG.standard_normal((1400, 40))
    rel = s.einsum("ij,jk->ik", a, b, strategy="sqrt")
    for _ in range(2):
        assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    st = s.executor._statements[rel.plan()]
    assert any(x is not None for x in st.bound)
    del rel
    gc.collect()
    assert all(x is None for x in st.bound)
    again = s.einsum("ij,jk->ik", a, b, strategy="sqrt")
    assert s.executor._statements[again.plan()] is st  # the plan and its statement stayed cached
    assert_einsum_close(again.numpy(), "ij,jk->ik", a, b)


def test_clear_cache_lets_plans_go(s):
    a = RNG.standard_normal((7, 7))
    ts.einsum("ij,jk->ik", a, a)
    rel = s.einsum("ij,jk->ik", a, a)
    rel.numpy()
    assert len(s._graphs) and s._graphs.get
    s.clear_cache()
    assert not len(s._graphs) and not len(s.plans)
    assert s.einsum("ij,jk->ik", a, a).node is not rel.node


def test_stored_tables_are_not_cached_and_their_changes_are_seen(s):
    """Calls over relations are planned per relation: a table saved again (new values, another blocking)
    is read anew by a new relation; one read before the change refuses to run with a typed error."""
    x, w = RNG.standard_normal((40, 30)), RNG.standard_normal((30, 8))
    s.from_numpy(x, block_shape=(10, 30)).save("cache_t", replace=True)
    old = s.einsum("ij,jk->ik", s.table("cache_t"), w)
    assert_einsum_close(old.numpy(), "ij,jk->ik", x, w)
    y = x * 2
    s.from_numpy(y, block_shape=(40, 15)).save("cache_t", replace=True)  # another blocking
    new = s.einsum("ij,jk->ik", s.table("cache_t"), w)
    assert new.node is not old.node
    assert_einsum_close(new.numpy(), "ij,jk->ik", y, w)
    with pytest.raises(ts.CorruptTableError, match="replaced"):
        old.numpy()
    s.from_numpy(y + 1, block_shape=(40, 15)).save("cache_t", replace=True)  # the same blocking, new values
    assert_einsum_close(s.einsum("ij,jk->ik", s.table("cache_t"), w).numpy(), "ij,jk->ik", y + 1, w)
    s.drop("cache_t")
    with pytest.raises(ts.CorruptTableError, match="dropped"):
        new.numpy()


def test_ts_einsum_cache_keys_shapes_dtypes_and_options():
    s = ts.default_session()
    a, b = RNG.standard_normal((9, 5)), RNG.standard_normal((5, 4))
    before = s.plans.hits
    for _ in range(3):
        assert_einsum_close(ts.einsum("ij,jk->ik", a, b), "ij,jk->ik", a, b)
    assert s.plans.hits == before + 2
    misses = s.plans.misses
    ts.einsum("ij,jk->ik", a[:8], b)
    ts.einsum("ij,jk->ik", a.astype(np.float32), b.astype(np.float32))
    ts.einsum("ij,jk->ik", a, b, optimize="greedy")
    assert s.plans.misses == misses + 3
