"""Result sinks: the kernels write result blocks straight into the array numpy() returns."""

from __future__ import annotations

import threading

import duckdb
import numpy as np
import pyarrow as pa
import pytest
from tolerance import assert_einsum_close

import tensorsql as ts
from udf_kernels import sink as udf_sink


def _sink_sql(rel) -> str:
    return rel.session.executor.sink_text(rel.plan())


def _rand(shape, dtype, rng):
    if np.dtype(dtype).kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    if np.dtype(dtype).kind == "i":
        return rng.integers(-5, 6, size=shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64", "complex64", "complex128"])
@pytest.mark.parametrize(
    ("a_blocks", "b_blocks", "fn"),
    [
        ((300, 200), (200, 100), "tensor_einsum_into"),  # one block: computed in place in the array
        ((100, 200), (200, 100), "tensor_einsum_into"),  # row slabs: each one contiguous in the array
        ((128, 200), (200, 30), "tensor_einsum_into"),  # column blocks: formed aside, copied into place
        ((128, 64), (64, 100), "tensor_einsum_agg_into"),  # K split: groups accumulate, then one copy
        ((64, 64), (64, 64), "tensor_einsum_agg_into"),
    ],
)
def test_matmul_through_the_sink(s, dtype, a_blocks, b_blocks, fn):
    rng = np.random.default_rng(0)
    a, b = _rand((300, 200), dtype, rng), _rand((200, 100), dtype, rng)
    ra, rb = s.from_numpy(a, block_shape=a_blocks), s.from_numpy(b, block_shape=b_blocks)
    rel = s.einsum("ij,jk->ik", ra, rb, strategy="operands")
    assert fn + "(" in _sink_sql(rel)
    got = rel.numpy()
    assert got.flags.c_contiguous and got.flags.writeable and got.flags.owndata
    assert_einsum_close(got, "ij,jk->ik", a, b)  # integers exactly


@pytest.mark.parametrize(
    ("spec", "shapes"),
    [
        ("bcgf,adeg->abcdef", [(6, 5, 4, 3), (7, 6, 5, 4)]),  # interleaved output: permuted into place
        ("ij,jk->", [(20, 30), (30, 10)]),  # a scalar result
        ("bij,bjk->bik", [(3, 20, 30), (3, 30, 10)]),
        ("ij,ij->ij", [(40, 30), (40, 30)]),  # no contraction at all
        ("ij->ji", [(40, 30)]),
    ],
)
@pytest.mark.parametrize("blocks", [None, 2])
def test_contractions_through_the_sink_match_numpy(s, spec, shapes, blocks):
    rng = np.random.default_rng(1)
    ops = [rng.standard_normal(sh) for sh in shapes]
    lhs = spec.split("->")[0].split(",")
    opts = {} if blocks is None else {"blocks": {lhs[0][0]: blocks}}
    rel = s.einsum(spec, *ops, **opts)
    got = rel.numpy()
    assert_einsum_close(got, spec, *ops)
    assert got.flags.c_contiguous


def test_stored_and_mapped_roots_use_tensor_sink_write(s):
    x = np.arange(35.0).reshape(5, 7)
    stored = s.from_numpy(x, block_shape=(2, 3))
    assert "tensor_sink_write(" in _sink_sql(stored)
    np.testing.assert_array_equal(stored.numpy(), x)
    mapped = s.map(stored, "square")
    assert "tensor_sink_write(" in _sink_sql(mapped)
    np.testing.assert_array_equal(mapped.numpy(), x * x)
    reblocked = stored.reblock(block_shape=(5, 2))
    np.testing.assert_array_equal(reblocked.numpy(), x)


def test_absent_blocks_come_back_as_zeros(s):
    """A stored relation without some blocks (they read as zeros): not every element is written into the
    sink, so the result goes the Arrow way, which fills the absent blocks."""
    x = np.arange(12.0).reshape(4, 3)
    table = pa.table(
        {
            "k0": pa.array([1], pa.int32()),
            "k1": pa.array([0], pa.int32()),
            "tensor": pa.array([x[2:].tobytes()], pa.binary()),
        }
    ).replace_schema_metadata(
        {b"tensorsql.shape": b"[4, 3]", b"tensorsql.block_shape": b"[2, 3]", b"tensorsql.dtype": b"float64"}
    )
    rel = s.from_arrow(table)
    want = np.where(np.arange(4)[:, None] >= 2, x, 0.0)
    np.testing.assert_array_equal(rel.numpy(), want)
    doubled = s.einsum("ij,jk->ik", rel, np.eye(3), strategy="operands")
    np.testing.assert_array_equal(doubled.numpy(), want)


def test_sinks_can_be_turned_off(s, monkeypatch):
    monkeypatch.setenv("TENSORSQL_RESULT_SINK", "0")
    sess = ts.connect()
    try:
        assert sess.result_sink is False
        x = np.arange(6.0).reshape(2, 3)
        assert sess.value(sess.from_numpy(x).plan(), {}) is not None
        assert sess.result_sink is False
        np.testing.assert_array_equal(sess.from_numpy(x).numpy(), x)
    finally:
        sess.close()


def test_a_key_that_was_not_handed_out_is_refused(s):
    blob = np.zeros(3, np.float32).tobytes()
    with pytest.raises(duckdb.Error, match="no result sink with key 77"):
        s.executor.con.execute("SELECT tensor_sink_write(77, [0], 'float32', ?, [3])", [blob]).fetchall()
    out = np.zeros((2, 3), np.float32)
    with udf_sink.Sink(s.executor.kernels, out) as key:
        pass
    with pytest.raises(duckdb.Error, match=f"no result sink with key {key}"):  # closed
        s.executor.con.execute(
            "SELECT tensor_sink_write(?, [0, 0], 'float32', ?, [1, 3])", [key, blob]
        ).fetchall()


@pytest.mark.parametrize(
    ("start", "shape", "dtype", "match"),
    [
        ([1, 1], [1, 3], "float32", r"block \[1,3\] at \[1,1\] does not fit in the sink's shape \[2,3\]"),
        ([0, -1], [1, 3], "float32", "does not fit"),
        ([0], [3], "float32", "must have the sink's rank 2"),
        ([0, 0], [1, 3], "float64", "block dtype float64 but the sink holds float32"),
    ],
)
def test_writes_are_bounds_checked(s, start, shape, dtype, match):
    out = np.zeros((2, 3), np.float32)
    blob = np.ones(3, np.dtype(dtype)).tobytes()
    query = "SELECT tensor_sink_write(?, ?::BIGINT[], ?, ?, ?::BIGINT[])"
    with udf_sink.Sink(s.executor.kernels, out) as key, pytest.raises(duckdb.Error, match=match):
        s.executor.con.execute(query, [key, start, dtype, blob, shape]).fetchall()
    assert not out.any()


def test_einsum_into_checks_the_block_against_the_sink(s):
    out = np.zeros((2, 2), np.float32)
    x = np.ones((2, 3), np.float32).tobytes()
    y = np.ones((3, 2), np.float32).tobytes()
    with udf_sink.Sink(s.executor.kernels, out) as key:
        args = "(?, [1, 0], 'ab,bc->ac', 'multiply', 'sum', 'float32', ?, [2, 3], ?, [3, 2])"
        for fn in ("tensor_einsum_into", "tensor_einsum_agg_into"):
            with pytest.raises(duckdb.Error, match="does not fit in the sink's shape"):
                s.executor.con.execute("SELECT " + fn + args, [key, x, y]).fetchall()
        assert not out.any()
        n = s.executor.con.execute(
            "SELECT tensor_einsum_agg_into(?, [0, 0], 'ab,bc->ac', 'multiply', 'sum', 'float32', x, [2, 3], "
            "?, [3, 2]) FROM (VALUES (?), (?)) t(x)",
            [key, y, x, x],
        ).fetchall()
    assert n == [(4,)]
    np.testing.assert_array_equal(out, np.full((2, 2), 6.0))  # two rows of one group: summed, then written


def test_the_sink_refuses_what_it_cannot_hold(s):
    with pytest.raises(ValueError, match="one of float32"):
        udf_sink.Sink(s.executor.kernels, np.zeros(3, np.float16))
    with pytest.raises(ValueError, match="writable C-contiguous"):
        udf_sink.Sink(s.executor.kernels, np.zeros((3, 4))[:, ::2])


def test_concurrent_sessions_write_their_own_results():
    rng = np.random.default_rng(5)
    a = rng.standard_normal((200, 150))
    b = rng.standard_normal((150, 120))
    errors: list[BaseException] = []

    def work(seed: int) -> None:
        try:
            with ts.connect(threads=2) as sess:
                for _ in range(5):
                    got = sess.einsum("ij,jk->ik", a * seed, b, blocks={"i": 2, "j": 2}).numpy()
                    assert_einsum_close(got, "ij,jk->ik", a * seed, b)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(k,)) for k in range(1, 4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _sparse(s, x: np.ndarray, block_shape: tuple[int, int], keep: list[tuple[int, int]]):
    """x stored with only the blocks at `keep` (the others absent: zeros)."""
    rows = {"k0": [], "k1": [], "tensor": []}
    for i, j in keep:
        blk = x[i * block_shape[0] : (i + 1) * block_shape[0], j * block_shape[1] : (j + 1) * block_shape[1]]
        rows["k0"].append(i)
        rows["k1"].append(j)
        rows["tensor"].append(np.ascontiguousarray(blk).tobytes())
    table = pa.table(
        {
            "k0": pa.array(rows["k0"], pa.int32()),
            "k1": pa.array(rows["k1"], pa.int32()),
            "tensor": pa.array(rows["tensor"], pa.binary()),
        }
    )
    meta = {
        b"tensorsql.shape": str(list(x.shape)).encode(),
        b"tensorsql.block_shape": str(list(block_shape)).encode(),
        b"tensorsql.dtype": x.dtype.name.encode(),
    }
    dense = np.zeros_like(x)
    for i, j in keep:
        sl = np.s_[
            i * block_shape[0] : (i + 1) * block_shape[0], j * block_shape[1] : (j + 1) * block_shape[1]
        ]
        dense[sl] = x[sl]
    return s.from_arrow(table.replace_schema_metadata(meta)), dense


def test_single_block_sides_pair_by_position(s):
    """A join with a single-block side pairs it with the other side's rows by position (no hash join,
    whose output buffering copies every blob); absent blocks and chains stay exact."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((60, 40))
    b = rng.standard_normal((40, 10))  # one block of at most half a block of a: paired by position
    c = rng.standard_normal((10, 5))
    ra = s.from_numpy(a, block_shape=(20, 40))
    rel = s.einsum("ij,jk->ik", ra, s.from_numpy(b), strategy="operands")
    assert "POSITIONAL JOIN" in rel.sql()
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    chained = s.einsum("ik,kl->il", rel, s.from_numpy(c), strategy="operands")
    assert_einsum_close(chained.numpy(), "ij,jk,kl->il", a, b, c)

    sparse, dense = _sparse(s, a, (20, 40), [(0, 0), (2, 0)])  # the middle row panel is absent
    for strategy in ("operands", "eindecomp"):
        step1 = s.einsum("ij,jk->ik", sparse, s.from_numpy(b), strategy=strategy)
        step2 = s.einsum("ik,kl->il", step1, s.from_numpy(c), strategy="operands")
        if strategy == "operands":  # the second step pairs a computed side: padded where a block is absent
            assert step2.sql().count("POSITIONAL JOIN") == 2 and 'NOT "tensor" IS NULL' in step2.sql()
        want = dense @ b @ c
        assert_einsum_close(step2.numpy(), "ij,jk,kl->il", dense, b, c)
        table = step2.to_arrow()
        assert table.column("tensor").null_count == 0 and table.column("k0").null_count == 0
        from tensorsql.backends import arrow as B

        got = B.assemble(table, want.shape, step2.block_shape, "float64")
        assert_einsum_close(got, "ij,jk,kl->il", dense, b, c)
        saved = step2.save("sparse_chain", replace=True)
        assert_einsum_close(saved.numpy(), "ij,jk,kl->il", dense, b, c)
        assert_einsum_close(step2.reblock(block_shape=(7, 9)).numpy(), "ij,jk,kl->il", dense, b, c)


def test_an_absent_single_block_reads_as_zeros(s):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((60, 40))
    empty, _ = _sparse(s, rng.standard_normal((40, 10)), (40, 10), [])
    rel = s.einsum("ij,jk->ik", s.from_numpy(a, block_shape=(20, 40)), empty, strategy="operands")
    assert "POSITIONAL JOIN" in rel.sql()
    np.testing.assert_array_equal(rel.numpy(), np.zeros((60, 10)))
    diag = s.einsum("ii,ij->ij", s.from_numpy(a[:40, :40], block_shape=(20, 20)), s.from_numpy(a[:40, :30]))
    assert_einsum_close(diag.numpy(), "ii,ij->ij", a[:40, :40], a[:40, :30])


def test_one_block_sides_pair_side_by_side(s):
    """Two one-block sides are read side by side (a positional scan over stored tables: no block copied);
    a side without its block leaves a NULL row, which the result drops."""
    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((30, 20)), rng.standard_normal((20, 10))
    rel = s.einsum("ij,jk->ik", s.from_numpy(a), s.from_numpy(b), strategy="none")
    sql = rel.sql(pretty=False)
    assert "POSITIONAL JOIN" in sql and " JOIN " not in sql.replace("POSITIONAL JOIN", "")
    assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    empty, _ = _sparse(s, b, (20, 10), [])
    for rel in (
        s.einsum("ij,jk->ik", s.from_numpy(a), empty, strategy="none"),
        s.einsum("jk,ij->ik", empty, s.from_numpy(a), strategy="none"),
    ):
        np.testing.assert_array_equal(rel.numpy(), np.zeros((30, 10)))
        table = rel.to_arrow()
        assert table.column("tensor").null_count == 0
        np.testing.assert_array_equal(rel.save("one_block_absent", replace=True).numpy(), np.zeros((30, 10)))


def test_a_plan_run_again_is_prepared_once(s):
    import gc

    rng = np.random.default_rng(9)
    a, b = rng.standard_normal((50, 40)), rng.standard_normal((40, 30))
    rel = s.einsum("ij,jk->ik", a, b, cache=False)  # its own plan (a cached call's stays in the cache)
    for _ in range(3):
        assert_einsum_close(rel.numpy(), "ij,jk->ik", a, b)
    st = s.executor._statements[rel.plan()]
    name, con = st.prepared, s.executor._con(st)  # a one-block call's statement is prepared on the lane
    assert name is not None
    prepared = [r[0] for r in con.execute("SELECT name FROM duckdb_prepared_statements()").fetchall()]
    assert name in prepared
    del rel, st
    gc.collect()
    prepared = [r[0] for r in con.execute("SELECT name FROM duckdb_prepared_statements()").fetchall()]
    assert name not in prepared


def test_a_prepared_plan_whose_table_changed_still_runs(s):
    x = np.arange(12.0).reshape(3, 4)
    s.from_numpy(x).save("prep_src", replace=True)
    rel = s.map(s.table("prep_src"), "square")
    for _ in range(2):
        np.testing.assert_array_equal(rel.numpy(), x * x)
    s.executor.con.execute("DROP TABLE prep_src")
    s.executor.con.execute(
        "CREATE TABLE prep_src AS SELECT 0::INTEGER AS k0, 0::INTEGER AS k1, ?::BLOB AS tensor", [x.tobytes()]
    )
    np.testing.assert_array_equal(rel.numpy(), x * x)
