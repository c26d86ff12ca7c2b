"""One-block plans as one kernel call (``tensor_program_into``, udf_kernels/src/program.cpp; the lowering in
tensorsql/backends/duckdb/program.py): every node kind a program runs gives numpy's values, the same values as
the plan run as SQL step by step (``programs`` off), whole graphs of several outputs included; and the kernel
refuses a malformed program, a blob that does not match its declaration and a sink that does not fit, with a
message naming what is wrong, before it computes anything."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from equations import EQUATIONS
from tolerance import assert_close, assert_einsum_close, elementwise_tolerance

import tensorsql as ts
import udf_kernels
from udf_kernels import sink as udf_sink

#: the shared equation list, a sample of every category (numpy's grammar: ellipses, diagonals, broadcasting)
SAMPLE = EQUATIONS[:: max(1, len(EQUATIONS) // 60)]


@pytest.fixture(scope="module")
def pair():
    """Two sessions: programs on (the default) and off (every step a CTE)."""
    with ts.connect(threads=2) as on, ts.connect(threads=2) as off:
        off.executor.programs = False
        yield on, off


def _arrays(shapes, seed=0, dtype="float64"):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(s).astype(dtype) for s in shapes]


def _program_text(rel) -> str:
    return rel.session.executor.sink_text(rel.plan())


@pytest.mark.parametrize("case", SAMPLE, ids=[c.id for c in SAMPLE])
def test_equations_run_as_one_program(pair, case):
    on, off = pair
    ops = _arrays(case.shapes)
    rel = on.einsum(case.subscripts, *ops)
    if all(op.size for op in ops) and all(rel.shape):
        assert "tensor_program_into(" in _program_text(rel)
    got, want = rel.numpy(), off.einsum(case.subscripts, *ops).numpy()
    assert_einsum_close(got, case.subscripts, *ops)
    assert_einsum_close(want, case.subscripts, *ops)


@pytest.mark.parametrize(
    ("join", "agg"),
    [("add", "sum"), ("subtract", "max"), ("sqdiff", "sum"), ("max", "min"), ("divide", "sum"),
     ("absdiff", "max"), ("multiply", "prod"), ("less", "sum")],
)  # fmt: skip
@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_extended_einsums_as_programs(pair, join, agg, dtype):
    on, off = pair
    rng = np.random.default_rng(5)
    x = (rng.integers(1, 5, (6, 4)) if dtype == "int64" else rng.uniform(0.5, 2.0, (6, 4))).astype(dtype)
    y = (rng.integers(1, 5, (4, 3)) if dtype == "int64" else rng.uniform(0.5, 2.0, (4, 3))).astype(dtype)
    rel = on.einsum("ij,jk->ik", x, y, join=join, agg=agg)
    assert "tensor_program_into(" in _program_text(rel)
    want = off.einsum("ij,jk->ik", x, y, join=join, agg=agg).numpy()
    got = rel.numpy()
    if dtype == "int64":
        np.testing.assert_array_equal(got, want)
    else:
        assert_close(got, want, elementwise_tolerance(want, dtype, roundings=8))


def test_maps_casts_slices_and_softmax_as_one_program(pair):
    """A graph of every other node kind: maps (with a param), casts, strided slices that drop dimensions,
    a softmax, all in one call."""
    on, off = pair
    a, b = _arrays([(9, 7), (7, 8)], 3)
    for s in (on, off):
        s.clear_cache()
    outs = []
    for s in (on, off):
        z = s.einsum("ij,jk->ik", a, b)
        w = ts.softmax(s.map(z, "scale", 0.5), over=1)
        v = s.map(w[1:8:3, ::-2], "pow", 2.0).astype("float32")
        u = ts.tanh(z[4, 2:6])
        outs.append((w, v, u))
    for rel in outs[0]:
        assert "tensor_program_into(" in _program_text(rel)
    for got, want in zip(outs[0], outs[1], strict=True):
        g, w = got.numpy(), want.numpy()
        assert g.shape == w.shape and g.dtype == w.dtype
        assert_close(g, w, elementwise_tolerance(w, w.dtype, roundings=32))
    zn = a @ b
    e = np.exp(zn * 0.5 - (zn * 0.5).max(axis=1, keepdims=True))
    sm = e / e.sum(axis=1, keepdims=True)
    assert_close(outs[0][0].numpy(), sm, 64 * np.finfo(float).eps * np.ones_like(sm))
    assert_close(outs[0][2].numpy(), np.tanh(zn[4, 2:6]), 64 * np.finfo(float).eps * np.ones(4))


def test_a_gradient_graph_of_several_outputs_is_one_program(pair):
    """A loss and its gradients, compiled with shared steps: one program call returns every output, equal
    to the CTE statement's."""
    on, off = pair
    rng = np.random.default_rng(7)
    x, w1, w2 = rng.standard_normal((16, 5)), rng.standard_normal((5, 6)), rng.standard_normal((6, 3))
    got = []
    for s in (on, off):
        xs = s.placeholder(x.shape, "float64")
        p1, p2 = s.placeholder(w1.shape, "float64"), s.placeholder(w2.shape, "float64")
        loss = ts.sigmoid(xs @ p1) @ p2
        loss = (loss * loss).sum()
        f = s.compile([loss, *ts.grad(loss, [p1, p2])], [xs, p1, p2], share=True)
        got.append(f(x, w1, w2))
    for g, w in zip(*got, strict=True):
        assert_close(g, w, 1e-12 * np.maximum(1.0, np.abs(w)))


# ---------------------------------------------------------------------------------------------------------
# the kernel, called from SQL
# ---------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def con():
    c = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(c)
    yield c
    c.close()


def _run(con, program, blobs, sinks):
    args = ", ".join("?::BLOB" for _ in blobs)
    keys = "[" + ", ".join(str(k) for k in sinks) + "]::BIGINT[]"
    sql = f"SELECT tensor_program_into({keys}, ?{', ' if blobs else ''}{args})"
    return con.execute(sql, [program, *blobs]).fetchone()[0]


def test_the_kernel_runs_a_program_into_sinks(con):
    x, y = np.arange(6.0).reshape(2, 3), np.arange(12.0).reshape(3, 4)
    out1, out2 = np.empty((2, 4)), np.empty((4, 2), dtype=np.float32)
    path = udf_kernels.extension_path()
    with udf_sink.Slot(path) as s1, udf_sink.Slot(path) as s2:
        s1.set(out1, writable=True)
        s2.set(out2, writable=True)
        program = (
            "i float64 2,3;i float64 3,4;e 0 1 ab,bc->ac multiply sum float64;"
            "u 2 ab->ba sum float64;c 3 float32;o 2 0;o 4 1"
        )
        written = _run(con, program, [x.tobytes(), y.tobytes()], [s1.key, s2.key])
    assert written == 16
    np.testing.assert_array_equal(out1, x @ y)
    np.testing.assert_array_equal(out2, (x @ y).T.astype(np.float32))


@pytest.mark.parametrize(
    ("program", "blobs", "match"),
    [
        ("i float64 2,3;o 0 0", [b"\0" * 40], "needs 48"),  # a blob shorter than declared
        ("i float64 2,3;o 1 0", [b"\0" * 48], "reads value 1, but only 1 exist"),
        ("i float64 2,3;x 0;o 0 0", [b"\0" * 48], "unknown op"),
        ("i float64 2,3;e 0 0 ab,bc->ac multiply sum float64;o 1 0", [b"\0" * 48], "'b'"),
        ("i float64 2,3;i float64 2,3;o 0 0", [b"\0" * 48], "declares input 1, but the call has 1 blobs"),
        ("i float64 2,3", [b"\0" * 48], "writes no output"),
        ("i float64 2,3;m 0 exp float32;o 1 0", [b"\0" * 48], "maps a value of dtype float64 as float32"),
        ("i float64 2,3;s 0 0,0 3,1 1,1;o 1 0", [b"\0" * 48], "reads outside"),
        ("i float64 2,3;r 0 5;o 1 0", [b"\0" * 48], "reshapes"),
        ("i float64 2,3;o 0 1", [b"\0" * 48], "sinks has 1 keys"),
        ("i float64 2,3;o 0 2147483647", [b"\0" * 48], "sink index 2147483647 is out of range"),
        ("i float64 2,3;o 0 4294967296", [b"\0" * 48], "sink index 4294967296 is out of range"),
        ("i float64 2,3;o 0 -1", [b"\0" * 48], "sink index -1 is out of range"),
        ("i bogus 2,3;o 0 0", [b"\0" * 48], "dtype"),
        ("i float64 2,x;o 0 0", [b"\0" * 48], "is not an integer"),
    ],
)
def test_malformed_programs_and_inputs_are_refused(con, program, blobs, match):
    out = np.zeros((2, 3))
    with udf_sink.Slot(udf_kernels.extension_path()) as sink:
        sink.set(out, writable=True)
        with pytest.raises(duckdb.Error, match=match):
            _run(con, program, blobs, [sink.key])
    assert not out.any()  # nothing written


def test_a_sink_of_another_shape_or_dtype_is_refused(con):
    x = np.ones((2, 3))
    with udf_sink.Slot(udf_kernels.extension_path()) as sink:
        cases = [(np.zeros((3, 2)), "does not fit in the sink"), (np.zeros((4, 3)), "does not fill sink")]
        for out, match in [*cases, (np.zeros((2, 3), np.float32), "float")]:
            sink.set(out, writable=True)
            with pytest.raises(duckdb.Error, match=match):
                _run(con, "i float64 2,3;o 0 0", [x.tobytes()], [sink.key])
            assert not out.any()
    with pytest.raises(duckdb.Error, match="sink"):
        _run(con, "i float64 2,3;o 0 0", [x.tobytes()], [12345])


def test_outputs_read_from_a_sinks_own_memory_are_staged(con):
    """Two writable slots given as both inputs (``tensor_source``, read in place) and sinks, the program
    swapping them: each output is the input as it was, not as another output's write left it."""
    a, b = np.arange(6.0).reshape(2, 3), -np.arange(6.0).reshape(2, 3)
    want_a, want_b = b.copy(), a.copy()
    path = udf_kernels.extension_path()
    with udf_sink.Slot(path) as sa, udf_sink.Slot(path) as sb:
        sa.set(a, writable=True)
        sb.set(b, writable=True)
        program = "i float64 2,3;i float64 2,3;o 1 0;o 0 1"
        keys = f"[{sa.key}, {sb.key}]::BIGINT[]"
        sql = f"SELECT tensor_program_into({keys}, ?, tensor_source({sa.key}), tensor_source({sb.key}))"
        assert con.execute(sql, [program]).fetchone()[0] == 12
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_array_equal(b, want_b)
