"""Slots: keys reserved once and re-pointed at new arrays before each EXECUTE of a prepared statement
(udf_kernels.sink.Slot, tensorsql_slot_* in udf_kernels/src/sink.cpp), read from SQL by tensor_source."""

from __future__ import annotations

import ctypes
import gc

import duckdb
import numpy as np
import pytest

import udf_kernels
from udf_kernels import sink as udf_sink

DTYPES = ["float32", "float64", "int32", "int64", "complex64", "complex128"]


@pytest.fixture(scope="module")
def path():
    return udf_kernels.extension_path()


def _connect(threads: int | None = None) -> duckdb.DuckDBPyConnection:
    config = {"allow_unsigned_extensions": "true"}
    if threads is not None:
        config["threads"] = str(threads)
    c = duckdb.connect(config=config)
    udf_kernels.load(c)
    return c


@pytest.fixture(scope="module")
def con():
    c = _connect()
    yield c
    c.close()


def _rand(shape, dtype, rng):
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dt)
    if dt.kind == "i":
        return rng.integers(np.iinfo(dt).min, np.iinfo(dt).max, size=shape, dtype=dt, endpoint=True)
    return rng.standard_normal(shape).astype(dt)


def _source(con, key, dtype, shape, *block):
    args = f"{key}" if not block else f"{key}, {list(block[0])}, {list(block[1])}"
    raw = con.execute(f"SELECT tensor_source({args})").fetchone()[0]
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


# ---------------------------------------------------------------------------------------------------------
# reads
# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (0,), (7,), (3, 5), (2, 3, 4)])
def test_source_round_trips_every_dtype_exactly(con, path, dtype, shape):
    a = np.asarray(_rand(shape, dtype, np.random.default_rng(0)))
    with udf_sink.Slot(path) as slot:
        slot.set(a)
        got = _source(con, slot.key, dtype, shape)
    assert got.tobytes() == a.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_source_blocks_with_ragged_edges(con, path, dtype):
    a = _rand((7, 10), dtype, np.random.default_rng(1))
    with udf_sink.Slot(path) as slot:
        slot.set(a)
        for i in range(0, 7, 3):
            for j in range(0, 10, 4):
                bs = (min(3, 7 - i), min(4, 10 - j))  # edge blocks are smaller
                got = _source(con, slot.key, dtype, bs, (i, j), bs)
                np.testing.assert_array_equal(got, a[i : i + bs[0], j : j + bs[1]])
        np.testing.assert_array_equal(_source(con, slot.key, dtype, (2, 10), (5, 0), (2, 10)), a[5:])  # a run
        assert _source(con, slot.key, dtype, (0, 3), (7, 2), (0, 3)).size == 0  # empty block at the edge
    b = _rand((4, 5, 6), dtype, np.random.default_rng(2))
    with udf_sink.Slot(path) as slot:
        slot.set(b)
        got = _source(con, slot.key, dtype, (3, 2, 5), (1, 3, 1), (3, 2, 5))
        np.testing.assert_array_equal(got, b[1:4, 3:5, 1:6])


def test_source_lends_the_array_and_stored_copies_outlive_it(con, path):
    """tensor_source hands the kernels the lent array itself (no copy): reads within the query see it, and
    whatever DuckDB keeps past the query (a table, a materialized CTE, a fetched value) is its own copy."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal(300_000)
    with udf_sink.Slot(path) as slot:
        slot.set(a)
        k = slot.key
        n = a.size
        dot = f"tensor_einsum('a,a->', 'multiply', 'sum', 'float64', tensor_source({k}), [{n}], m.b, [{n}])"
        q = f"WITH m AS MATERIALIZED (SELECT tensor_source({k}) AS b) SELECT {dot}, {dot} FROM m"
        got = con.execute(q).fetchone()
        want = float(a @ a)
        for raw in got:
            assert abs(np.frombuffer(raw, dtype=np.float64)[0] - want) <= 1e-12 * n * want
        block = con.execute(f"SELECT tensor_source({k}, [1000], [5000])").fetchone()[0]
        con.execute(f"CREATE OR REPLACE TEMP TABLE lent_copy AS SELECT tensor_source({k}) AS b")
        kept = a.copy()
        a[:] = -1.0  # the query is over: neither the fetched block nor the table may see this
        slot.clear()
    stored = con.execute("SELECT b FROM lent_copy").fetchone()[0]
    assert np.frombuffer(stored, dtype=np.float64).tobytes() == kept.tobytes()
    assert np.frombuffer(block, dtype=np.float64).tobytes() == kept[1000:6000].tobytes()
    con.execute("DROP TABLE lent_copy")


def test_source_block_errors_and_nulls(con, path):
    with udf_sink.Slot(path) as slot:
        slot.set(np.zeros((4, 4)))
        k = slot.key
        fits = rf"tensor_source: block \[2,3\] at \[3,0\] does not fit in slot {k}'s shape \[4,4\]"
        with pytest.raises(duckdb.Error, match=fits):
            con.execute(f"SELECT tensor_source({k}, [3, 0], [2, 3])").fetchall()
        with pytest.raises(duckdb.Error, match="must have the rank 2"):
            con.execute(f"SELECT tensor_source({k}, [0], [2])").fetchall()
        with pytest.raises(duckdb.Error, match="negative dimension"):
            con.execute(f"SELECT tensor_source({k}, [0, 0], [-1, 2])").fetchall()
        row = con.execute(
            f"SELECT tensor_source(NULL), tensor_source({k}, NULL, [1, 1]), "
            f"tensor_source({k}, [0, 0], NULL), tensor_source(NULL, [0, 0], [1, 1])"
        ).fetchone()
        assert row == (None, None, None, None)


def test_unknown_empty_and_freed_slots_are_errors(con, path):
    with pytest.raises(duckdb.Error, match="tensor_source: no slot with key 77"):
        con.execute("SELECT tensor_source(77)").fetchall()
    with pytest.raises(duckdb.Error, match="tensor_source: no slot with key 77"):
        con.execute("SELECT tensor_source(77, [0], [1])").fetchall()
    slot = udf_sink.Slot(path)
    k = slot.key
    with pytest.raises(duckdb.Error, match=f"tensor_source: slot {k} is empty"):
        con.execute(f"SELECT tensor_source({k})").fetchall()
    slot.set(np.ones(3))
    assert len(con.execute(f"SELECT tensor_source({k})").fetchone()[0]) == 24
    slot.clear()
    assert slot.array is None
    with pytest.raises(duckdb.Error, match=f"tensor_source: slot {k} is empty"):
        con.execute(f"SELECT tensor_source({k}, [0], [1])").fetchall()
    slot.free()
    slot.free()  # idempotent
    assert slot.key == 0
    with pytest.raises(duckdb.Error, match=f"tensor_source: no slot with key {k}"):
        con.execute(f"SELECT tensor_source({k})").fetchall()
    with pytest.raises(ValueError, match="freed"):
        slot.set(np.ones(3))


def test_writers_refuse_read_only_and_empty_slots(con, path):
    blob = np.arange(3, dtype=np.float32).tobytes()
    out = np.zeros((2, 3), np.float32)
    with udf_sink.Slot(path) as slot:
        k = slot.key
        with pytest.raises(duckdb.Error, match=f"tensor_sink_write: slot {k} is empty"):
            con.execute(f"SELECT tensor_sink_write({k}, [0, 0], 'float32', ?, [1, 3])", [blob]).fetchall()
        slot.set(out)  # read-only by default
        with pytest.raises(duckdb.Error, match=f"tensor_sink_write: slot {k} is read-only"):
            con.execute(f"SELECT tensor_sink_write({k}, [0, 0], 'float32', ?, [1, 3])", [blob]).fetchall()
        with pytest.raises(duckdb.Error, match=f"tensor_einsum_into: slot {k} is read-only"):
            con.execute(
                f"SELECT tensor_einsum_into({k}, [0, 0], 'ab,bc->ac', 'multiply', 'sum', 'float32', "
                "tensor_zeros('float32', [2, 2]), [2, 2], tensor_zeros('float32', [2, 3]), [2, 3])"
            ).fetchall()
        assert not out.any()
        slot.set(out, writable=True)
        written = con.execute(
            f"SELECT tensor_sink_write({k}, [1, 0], 'float32', ?, [1, 3])", [blob]
        ).fetchone()
        assert written[0] == 3
        np.testing.assert_array_equal(out[1], [0, 1, 2])
        # a read-only slot can still be read
        slot.set(out)
        np.testing.assert_array_equal(_source(con, k, "float32", (2, 3)), out)


def test_slot_set_validates_arrays(path):
    with udf_sink.Slot(path) as slot:
        with pytest.raises(ValueError, match="not float16"):
            slot.set(np.zeros(3, np.float16))
        with pytest.raises(TypeError, match="not complex128"):
            slot.set(np.complex128(1))
        with pytest.raises(ValueError, match="C-contiguous"):
            slot.set(np.zeros((3, 4))[:, ::2])
        ro = np.zeros(3)
        ro.flags.writeable = False
        slot.set(ro)  # reading is fine
        with pytest.raises(ValueError, match="writable"):
            slot.set(ro, writable=True)
        assert slot.array is ro  # a refused set leaves the slot as it was


def test_c_abi_rejects_invalid_arguments(path):
    lib = udf_sink._lib(path)
    shape = (ctypes.c_int64 * 2)(2, 3)
    buf = (ctypes.c_double * 6)()
    key = lib.tensorsql_slot_new()
    assert key > 0
    try:
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 2, shape, 0) == 0
        assert lib.tensorsql_slot_set(key, None, b"float64", 2, shape, 0) == -1  # null base
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float16", 2, shape, 0) == -1  # dtype
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), None, 2, shape, 0) == -1
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 65, shape, 0) == -1  # rank
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", -1, shape, 0) == -1
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 2, None, 0) == -1
        neg = (ctypes.c_int64 * 2)(2, -3)
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 2, neg, 0) == -1
        huge = (ctypes.c_int64 * 2)(1 << 40, 1 << 40)
        assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 2, huge, 0) == -1  # overflow
        assert lib.tensorsql_slot_set(77, ctypes.addressof(buf), b"float64", 2, shape, 0) == -1  # unknown
        assert lib.tensorsql_slot_clear(key) == 0
        assert lib.tensorsql_slot_clear(77) == -1
    finally:
        assert lib.tensorsql_slot_free(key) == 0
    assert lib.tensorsql_slot_free(key) == -1
    assert lib.tensorsql_slot_clear(key) == -1
    assert lib.tensorsql_slot_set(key, ctypes.addressof(buf), b"float64", 2, shape, 0) == -1
    # a sink is a slot set writable, and sink_close frees it
    skey = lib.tensorsql_sink_open(ctypes.addressof(buf), b"float64", 2, shape)
    assert skey > 0
    assert lib.tensorsql_slot_clear(skey) == 0
    assert lib.tensorsql_sink_close(skey) == 0
    assert lib.tensorsql_slot_free(skey) == -1


def test_slot_is_freed_on_garbage_collection(con, path):
    slot = udf_sink.Slot(path)
    slot.set(np.ones(2))
    k = slot.key
    del slot
    gc.collect()
    with pytest.raises(duckdb.Error, match=f"no slot with key {k}"):
        con.execute(f"SELECT tensor_source({k})").fetchall()


# ---------------------------------------------------------------------------------------------------------
# prepared statements: slots re-pointed between EXECUTEs
# ---------------------------------------------------------------------------------------------------------


def test_prepared_einsum_reads_the_slots_at_every_execute(path):
    c = _connect()
    try:
        with udf_sink.Slot(path) as s1, udf_sink.Slot(path) as s2:
            s1.set(np.zeros((2, 3)))
            s2.set(np.zeros((3, 4)))
            c.execute(
                "PREPARE p AS SELECT tensor_einsum('ab,bc->ac', 'multiply', 'sum', 'float64', "
                f"tensor_source({s1.key}), [2, 3], tensor_source({s2.key}), [3, 4])"
            )
            rng = np.random.default_rng(3)
            for _ in range(5):
                a, b = rng.standard_normal((2, 3)), rng.standard_normal((3, 4))
                s1.set(a)
                s2.set(b)
                got = np.frombuffer(c.execute("EXECUTE p").fetchone()[0]).reshape(2, 4)
                np.testing.assert_allclose(got, a @ b, rtol=1e-12, atol=1e-12)
            s1.clear()
            with pytest.raises(duckdb.Error, match=f"slot {s1.key} is empty"):
                c.execute("EXECUTE p").fetchall()
    finally:
        c.close()


def test_prepared_einsum_into_writes_each_result_into_the_new_output(path):
    c = _connect()
    try:
        with udf_sink.Slot(path) as x, udf_sink.Slot(path) as y, udf_sink.Slot(path) as z:
            c.execute(
                f"PREPARE q AS SELECT tensor_einsum_into({z.key}, [0, 0], 'ab,bc->ac', 'multiply', 'sum', "
                f"'float32', tensor_source({x.key}), [3, 5], tensor_source({y.key}), [5, 2])"
            )
            rng = np.random.default_rng(4)
            outs = []
            for _ in range(4):
                a = rng.standard_normal((3, 5)).astype(np.float32)
                b = rng.standard_normal((5, 2)).astype(np.float32)
                out = np.zeros((3, 2), np.float32)
                x.set(a)
                y.set(b)
                z.set(out, writable=True)
                assert c.execute("EXECUTE q").fetchone()[0] == 6
                np.testing.assert_allclose(out, a @ b, rtol=1e-5, atol=1e-5)
                outs.append((out, a @ b))
            for out, want in outs:  # each call wrote its own output only
                np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    finally:
        c.close()


# ---------------------------------------------------------------------------------------------------------
# threads
# ---------------------------------------------------------------------------------------------------------


def test_many_threads_read_one_slot(path):
    c = _connect(threads=4)
    try:
        n = 400_000  # several row groups: the scan runs on several threads
        c.execute(f"CREATE TABLE t AS SELECT range AS i FROM range({n})")
        a = np.arange(8 * 16, dtype=np.int64).reshape(8, 16)
        with udf_sink.Slot(path) as slot:
            slot.set(a)
            k = slot.key
            whole, bad = c.execute(
                f"SELECT count(*) FILTER (WHERE tensor_source({k}) = ?), "
                f"count(*) FILTER (WHERE tensor_source({k}, [i % 8, (i // 8) % 13], [1, 3]) IS DISTINCT FROM "
                f"tensor_slice('int64', ?, [8, 16], [i % 8, (i // 8) % 13], [i % 8 + 1, (i // 8) % 13 + 3])) "
                "FROM t",
                [a.tobytes(), a.tobytes()],
            ).fetchone()
        assert (whole, bad) == (n, 0)
    finally:
        c.close()


def test_python_threads_share_the_registry(path):
    import threading

    errors = []

    def work(seed):
        try:
            c = _connect()
            try:
                rng = np.random.default_rng(seed)
                for _ in range(20):
                    with udf_sink.Slot(path) as slot:
                        a = rng.standard_normal(5)
                        slot.set(a)
                        got = np.frombuffer(c.execute(f"SELECT tensor_source({slot.key})").fetchone()[0])
                        assert np.array_equal(got, a)
            finally:
                c.close()
        except Exception as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
