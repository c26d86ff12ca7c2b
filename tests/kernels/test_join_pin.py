"""tensor_pin and pinned join sides: a join of few block pairs carries a LIST column through DuckDB's
join, so the join does not buffer (copy) its small outputs; the list must stay below the join."""

from __future__ import annotations

import dataclasses
import json

import duckdb
import numpy as np
from tolerance import assert_einsum_close

import udf_kernels


def test_tensor_pin_is_an_identity_on_lists(s):
    values = "([1, 2, 3]), ([]), (NULL), ([4, NULL, 6]), ([9223372036854775807])"
    rows = s.executor.con.execute(f"SELECT tensor_pin(v) FROM (VALUES {values}) t(v)").fetchall()
    assert [r[0] for r in rows] == [[1, 2, 3], [], None, [4, None, 6], [9223372036854775807]]
    many = s.executor.con.execute(
        "SELECT list(tensor_pin([i, i + 1]) ORDER BY i) FROM range(5000) r(i)"
    ).fetchall()[0][0]
    assert many == [[i, i + 1] for i in range(5000)]


def test_tensor_pin_is_volatile():
    """Volatile: DuckDB neither folds a constant call nor lifts it above a join."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(con)
    func = con.execute(
        "SELECT DISTINCT stability FROM duckdb_functions() WHERE function_name = 'tensor_pin'"
    ).fetchall()
    assert func == [("VOLATILE",)]
    con.close()


def _join_child_projects_pin(plan: dict) -> bool:
    """Whether a HASH_JOIN in the physical plan has, below it, the projection computing the pinned list
    (EXPLAIN names it by its alias, or by the call when it was not lifted into a projection of its own)."""

    def below(node: dict) -> bool:
        text = json.dumps(node.get("extra_info", {}))
        if node.get("name", "").strip() == "PROJECTION" and ("__ts_shape" in text or "tensor_pin" in text):
            return True
        return any(below(c) for c in node.get("children", []))

    def walk(node: dict) -> bool:
        if node.get("name", "").strip() == "HASH_JOIN" and any(below(c) for c in node.get("children", [])):
            return True
        return any(walk(c) for c in node.get("children", []))

    return any(walk(n) for n in plan)


def _matmul(s, a, b, a_blocks, b_blocks):
    return s.einsum(
        "ij,jk->ik",
        s.from_numpy(a, block_shape=a_blocks),
        s.from_numpy(b, block_shape=b_blocks),
        strategy="operands",
    )


def test_a_small_join_pins_its_left_side_below_the_join(s):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((64, 48)).astype(np.float32)
    b = rng.standard_normal((48, 40)).astype(np.float32)
    rel = _matmul(s, a, b, (32, 48), b.shape)
    sql = rel.sql(pretty=False)
    assert 'tensor_pin([32, 48]) AS "__ts_shape"' in sql and '"x"."__ts_shape"' in sql
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    plan = s.executor.con.execute("EXPLAIN (FORMAT JSON) " + sql).fetchall()[0][1]
    assert _join_child_projects_pin(json.loads(plan)), "the optimizer lifted tensor_pin above the join"


def test_ragged_pinned_shapes_follow_the_keys(s):
    rng = np.random.default_rng(1)
    a = rng.standard_normal((50, 30))
    b = rng.standard_normal((30, 20))
    rel = _matmul(s, a, b, (16, 7), (7, 9))
    assert "tensor_pin([least(" in rel.sql(pretty=False)
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    assert_einsum_close(rel.materialize().numpy(), "ij,jk->ik", a, b)


def test_joins_of_many_pairs_are_not_pinned(s, monkeypatch):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((32, 32))
    rel = _matmul(s, a, a, (4, 4), (4, 4))  # 8 x 8 x 8 = 512 pairs
    assert "tensor_pin" in rel.sql(pretty=False)
    monkeypatch.setattr(s.executor, "profile", dataclasses.replace(s.executor.profile, pin_pairs=512))
    rel = _matmul(s, a, a, (4, 4), (4, 4))
    assert "tensor_pin" not in rel.sql(pretty=False)
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, a)


def test_repeated_labels_and_cross_joins_are_pinned_too(s):
    rng = np.random.default_rng(3)
    x = rng.standard_normal((6, 6, 5))
    y = rng.standard_normal((4,))
    ry = s.from_numpy(y, block_shape=(2,))  # split: one-block sides on both ends would pair by position
    rel = s.einsum("iij,k->jk", s.from_numpy(x, block_shape=(3, 3, 5)), ry, strategy="operands")
    assert "tensor_pin" in rel.sql(pretty=False)
    assert_einsum_close(rel.numpy(), "iij,k->jk", x, y)
