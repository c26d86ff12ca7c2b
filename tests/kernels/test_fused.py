"""Fused contraction trees: one-block multiply/sum contractions that feed only each other run as one
``tensor_einsum_path`` call over the positional join of their input blocks (``tra.Fused``)."""

from __future__ import annotations

import dataclasses

import duckdb
import numpy as np
import opt_einsum
import pytest
from equations import NARY_OPTIMIZE_CASES
from test_result_sink import _sparse
from tolerance import assert_einsum_close

from tensorsql.compile import fuse, in_gemm_order
from tensorsql.errors import TensorSQLError
from tensorsql.ir import tra as T

DTYPES = ["float32", "float64", "int32", "int64", "complex64", "complex128"]




def _rand(shape, dtype, rng):
    if dtype.startswith("int"):
        return rng.integers(-4, 5, size=shape).astype(dtype)
    x = rng.standard_normal(shape)
    if dtype.startswith("complex"):
        x = x + 1j * rng.standard_normal(shape)
    return x.astype(dtype)


def _fused_nodes(rel) -> list[T.Fused]:
    out, stack = [], [rel.plan().tra]
    while stack:
        r = stack.pop()
        if isinstance(r, T.Fused):
            out.append(r)
        stack.extend(T.inputs(r))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_one_block_tree_runs_as_one_call(s, dtype):
    rng = np.random.default_rng(1)
    spec = "ab,bcd,de,ce->a"
    ops = [_rand(sh, dtype, rng) for sh in [(5, 6), (6, 3, 4), (4, 7), (3, 7)]]
    rel = s.einsum(spec, *ops, strategy="none")
    (fused,) = _fused_nodes(rel)
    assert len(fused.steps) == 3 and len(fused.children) == 4
    # small array operands are lent to the call (inlined tensor_source, no join); stored ones sit side by side
    assert "tensor_einsum_path(" in rel.sql() and rel.sql().count("tensor_source(") == 4
    assert "GROUP BY" not in rel.sql() and " JOIN " not in rel.sql()
    stored = [s.from_numpy(op) for op in ops]
    side = s.einsum(spec, *stored, strategy="none")
    assert "tensor_einsum_path(" in side.sql() and side.sql().count("POSITIONAL JOIN") == 3
    np.testing.assert_array_equal(side.numpy(), rel.numpy())
    want = np.einsum(spec, *ops)
    assert_einsum_close(rel.numpy(), spec, *ops)  # through a result sink
    table = rel.to_arrow()  # through Arrow
    assert table.num_rows == 1
    got = np.frombuffer(table.column("tensor")[0].as_py(), dtype=dtype).reshape(want.shape)
    assert_einsum_close(got, spec, *ops)


@pytest.mark.parametrize("case", NARY_OPTIMIZE_CASES, ids=lambda c: c.id)
def test_nary_cases_match_numpy_as_fused_trees(s, case):
    rng = np.random.default_rng(2)
    ops = [_rand(sh, "float64", rng) for sh in case.shapes]
    rel = s.einsum(case.subscripts, *ops, strategy="none")
    assert_einsum_close(rel.numpy(), case.subscripts, *ops)


def test_an_operand_used_twice_is_read_once(s):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((6, 6)), rng.standard_normal((6, 6))
    ra, rb = s.from_numpy(a), s.from_numpy(b)
    rel = s.einsum("ij,jk,kl->il", ra, rb, ra, strategy="none")
    (fused,) = _fused_nodes(rel)
    assert len(fused.children) == 2
    assert_einsum_close(rel.numpy(), "ij,jk,kl->il", a, b, a)


def test_a_tree_over_one_tensor_reads_it_once_per_use(s):
    """A·Aᵀ·A: every step reads one stored tensor; the kernel takes two or more blocks, so it is read per use
    (it was a kernel error: 'needs at least 2 input blocks')."""
    a = np.random.default_rng(4).standard_normal((7, 5))
    ra = s.from_numpy(a)
    for rel in (
        s.einsum("ij,kj,kl->il", ra, ra, ra, strategy="none"),
        s.einsum("ij,jk->ik", s.einsum("ij,kj->ik", ra, ra), ra),
    ):
        (fused,) = _fused_nodes(rel)
        assert len(fused.children) == 3 and len({id(c) for c in fused.children}) == 1
        assert_einsum_close(rel.numpy(), "ij,kj,kl->il", a, a, a)


def test_a_shared_intermediate_is_not_fused_into_its_consumers(s):
    rng = np.random.default_rng(4)
    a, b, c = (rng.standard_normal((5, 5)) for _ in range(3))
    t = s.einsum("ij,jk->ik", a, b, strategy="none")
    u = s.einsum("ij,jk,kl->il", t, t, c, strategy="none")  # t feeds two steps
    assert_einsum_close(u.numpy(), "ij,jk,kl,lm,mn->in", a, b, a, b, c)  # (a @ b) @ (a @ b) @ c
    for fused in _fused_nodes(u):
        assert len(fused.steps) >= 2
    part = u.plan().partitioning
    assert fuse.fused_steps(u.plan().root, part) == 1  # (t @ t) @ c: only t @ t fuses into its consumer


def test_split_operands_stay_outside_the_fused_tree(s):
    """Only the one-block part of a plan fuses; a split tensor is joined and aggregated as before."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((64, 8))
    w1, w2, w3 = rng.standard_normal((8, 6)), rng.standard_normal((6, 5)), rng.standard_normal((5, 3))
    path = ["einsum_path", (1, 2), (1, 2), (0, 1)]  # (w1 w2) w3 first, then x times that
    rel = s.einsum("bi,ij,jk,kl->bl", x, w1, w2, w3, blocks={"b": 4}, optimize=path)
    (fused,) = _fused_nodes(rel)
    assert len(fused.steps) == 2
    assert "tensor_einsum('ab,cb->ac'" in rel.sql()  # the split root step: a join of its own
    assert_einsum_close(rel.numpy(), "bi,ij,jk,kl->bl", x, w1, w2, w3)


def test_absent_blocks_are_zeros(s):
    """A stored input without its block (a sparse relation) is zeros, inside the fused call too."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((10, 8)), rng.standard_normal((8, 4))
    empty, _ = _sparse(s, rng.standard_normal((4, 3)), (4, 3), [])
    rel = s.einsum("ij,jk,kl->il", a, b, empty, strategy="none")
    assert _fused_nodes(rel)
    np.testing.assert_array_equal(rel.numpy(), np.zeros((10, 3)))
    assert rel.to_arrow().num_rows == 0  # the result's one block is absent
    np.testing.assert_array_equal(rel.save("fused_absent", replace=True).numpy(), np.zeros((10, 3)))


def test_a_padded_one_block_input_does_not_duplicate_the_block(s):
    """A one-block input computed from a sparse relation through a padded positional join: the fused call
    writes its one block once, with its value (a NULL row of any input makes that row's result NULL, an
    absent block, never a second block of zeros)."""
    rng = np.random.default_rng(11)
    a = rng.standard_normal((60, 40))
    sparse, dense = _sparse(s, a, (20, 40), [(0, 0), (2, 0)])  # the middle row panel is absent
    b, w = rng.standard_normal((40, 4)), rng.standard_normal((4, 3))
    left = s.einsum("ij,jk->ik", sparse, b, strategy="operands")  # 2 of 3 row panels
    # the one-block stored w is paired by position with left's 3-panel grid, which has 2 rows: one padding row
    red = s.einsum("ik,kl->kl", left, s.from_numpy(w), strategy="operands")
    assert "POSITIONAL JOIN" in red.sql() and red.plan().block_shape() == (4, 3)
    w1, w2 = rng.standard_normal((3, 5)), rng.standard_normal((5, 2))
    rel = s.einsum("kl,lm,mn->kn", red, w1, w2, strategy="none")
    assert _fused_nodes(rel)
    # np.einsum("ik,kl->kl", dense @ b, w) @ w1 @ w2
    assert_einsum_close(rel.numpy(), "ij,jk,kl,lm,mn->kn", dense, b, w, w1, w2)
    table = rel.to_arrow()
    assert table.num_rows == 1 and table.column("tensor").null_count == 0


def test_a_fused_tree_feeding_a_split_step_runs_once_per_block(s):
    """The fused block is the small side of a positional join (repeated by UNNEST): still exact."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((96, 4))
    w = [rng.standard_normal((4, 4)) for _ in range(3)]
    inner = s.einsum("ij,jk,kl->il", *w, strategy="none")
    rel = s.einsum("bi,il->bl", s.from_numpy(x, block_shape=(24, 4)), inner, strategy="operands")
    assert "UNNEST" in rel.sql() and "tensor_einsum_path(" in rel.sql()
    assert_einsum_close(rel.numpy(), "bi,ij,jk,kl->bl", x, *w)


def test_the_planner_prefers_one_block_for_small_trees(s, monkeypatch):
    """Under the engine's cost terms a p = 1 plan is credited STEP_SECONDS per fused step."""
    monkeypatch.delenv("TENSORSQL_COST_MODEL", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/nonexistent-tensorsql-test")
    rng = np.random.default_rng(8)
    spec = "Babcd,aij,bik,ckl,dlm,ejp,fop,gno,hmn->Befgh"  # benchmark (d)'s TRN tree
    sizes = dict(
        B=128, a=4, b=7, c=4, d=7, e=3, f=4, g=5, h=5, i=50, j=50, k=50, l=50, m=50, n=50, o=50, p=50
    )
    ops = [
        rng.standard_normal([sizes[c] for c in t]).astype(np.float32) for t in spec.split("->")[0].split(",")
    ]
    rel = s.einsum(spec, *ops)
    info = rel.plan().info
    assert info.p == 1 and any("fused steps" in n for n in info.notes)
    (fused,) = _fused_nodes(rel)
    assert len(fused.steps) == 8
    want = opt_einsum.contract(spec, *[o.astype(np.float64) for o in ops])
    # summed along tensorsql's path (optimize="auto"): K counts its steps' sums, not all 1.2e16 terms
    assert_einsum_close(rel.numpy(), spec, *ops, want=want, optimize="auto")
    monkeypatch.setattr(s.executor, "profile", dataclasses.replace(s.executor.profile, step_seconds=0.0))
    # no credit: the plan at p = 2 stays
    assert s.einsum(spec, *ops).plan().info.p == 2


# ---------------------------------------------------------------------------------------------------------
# the kernel, called from SQL
# ---------------------------------------------------------------------------------------------------------




def _call(con, program, shapes, *arrays, dtype="float64"):
    args = ", ".join("?" for _ in arrays)
    row = con.execute(
        f"SELECT tensor_einsum_path(?, ?, ?::BIGINT[], {args})",
        [program, dtype, shapes, *[None if a is None else a.tobytes() for a in arrays]],
    ).fetchall()[0][0]
    return row


def test_kernel_runs_a_program(con):
    rng = np.random.default_rng(9)
    a, b, c = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))
    got = _call(con, "1,2:ab,bc->ac;0,3:ab,bc->ac", [3, 4, 4, 5, 5, 2], a, b, c)
    assert_einsum_close(np.frombuffer(got).reshape(3, 2), "ab,bc,cd->ad", a, b, c)
    # an operand read by two steps, and a result read by the next step twice
    got = _call(con, "0,1:ab,bc->ac;2,2:ab,bc->ac", [4, 4, 4, 4], a[:, :4].T @ a[:, :4], b[:, :4])
    a4, b4 = a[:, :4], b[:, :4]  # x = (a4.T @ a4) @ b4, got = x @ x
    assert_einsum_close(np.frombuffer(got).reshape(4, 4), "ia,ib,bc,jc,jd,de->ae", a4, a4, b4, a4, a4, b4)


def test_kernel_gives_null_for_a_null_block(con):
    """NULL is an absent block: the result is absent too (zeros to every consumer)."""
    a = np.ones((3, 4))
    assert _call(con, "0,1:ab,bc->ac;2,0:ac,ab->cb", [3, 4, 4, 5], a, None) is None


@pytest.mark.parametrize(
    "program, shapes, match",
    [
        ("0,1:ab,bc->ac;4,2:ac,cd->ad", [3, 4, 4, 5, 5, 2], "reads operand 4, but only 4 exist"),
        ("0,1:ab,bc->ac", [3, 4, 4, 5, 5, 2], "input 2 is never read"),
        ("0,1:ab,bc->ac;3,2:ac,cd->ad", [3, 4, 4, 5, 5], "shapes has 5 entries"),
        ("0,1:ab,bc->ac;3,2:ac,cd->ad", [3, 4, 4, 5, 5, 3], "input 2 has 80 bytes but shape"),
        ("0,1:ab,bc->ac;3,2:ac,cd->ad", [3, 4, 4, 6, 6, 2], "input 1 has 160 bytes but shape"),
        ("x", [3, 4, 4, 5, 5, 2], "step 'x' is not 'i,j:spec'"),
        ("0,-1:ab,bc->ac;3,2:ac,cd->ad", [3, 4, 4, 5, 5, 2], "not a non-negative integer"),
        ("0,1:ab,bc->ac;3,2:ac,c->ad", [3, 4, 4, 5, 5], "label"),
        ("0,1:ab,bc->ac;0,2:abc,cd->ad", [3, 4, 4, 5, 5, 2], "input 0 is read with ranks 2 and 3"),
        ("0,1:ab,bc->ac;3,2:ac,cd->ad", [3, 4, 4, 5, 5, -2], "negative"),
    ],
)
def test_kernel_rejects_bad_programs(con, program, shapes, match):
    arrays = [np.ones((3, 4)), np.ones((4, 5)), np.ones((5, 2))]
    with pytest.raises(duckdb.Error, match=match):
        _call(con, program, shapes, *arrays)


def test_kernel_needs_two_inputs(con):
    with pytest.raises(duckdb.Error, match="at least 2 input blocks"):
        _call(con, "0,0:ab,bc->ac", [3, 3], np.ones((3, 3)))


def test_kernel_errors_surface_as_typed_errors(s):
    with pytest.raises(TensorSQLError):
        s.execute("SELECT tensor_einsum_path('0,1:ab,bc->ac', 'float64', [2, 2, 2, 2], ''::BLOB, ''::BLOB)")


def test_a_fused_root_may_come_back_in_gemm_order(s):
    """``numpy()`` may run a big result in its root GEMM's order and return a transposed view; the fused
    call then ends with that step."""
    rng = np.random.default_rng(10)
    x, w, y = rng.standard_normal((64, 8)), rng.standard_normal((8, 64)), rng.standard_normal((64, 64))
    rel = s.einsum("ik,kl,jl->jil", x, w, y, strategy="none", optimize=["einsum_path", (0, 1), (0, 1)])
    assert in_gemm_order(rel.plan(), rel.session.executor.profile) is not None
    got = rel.numpy()
    assert_einsum_close(got, "ik,kl,jl->jil", x, w, y)
    (fused,) = _fused_nodes(rel)
    assert len(fused.steps) == 2
