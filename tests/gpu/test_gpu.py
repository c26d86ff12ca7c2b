"""The GPU executor (``connect(device=...)``, docs "GPUs") against numpy.

Every test runs on two devices: ``cuda-emulated``, the GPU kernel set built with its host emulation of the
device (always), and ``cuda``, a real CUDA GPU (marked ``gpu``: ``pytest -m gpu`` on a GPU machine; skipped,
with the reason the device layer gives, where none is usable). Both run the same SQL, the same GPU functions
and the same contraction planning and GEMM packing; only the device under them differs.
"""

from __future__ import annotations

import math
import re
import zlib

import numpy as np
import pytest
import tolerance
from equations import BLOCKING_CASES, EQUATIONS, Case
from test_einsum_numpy import assert_einsum_close, make_operands
from test_result_sink import _sparse
from test_sparse_inputs import CASES as SPARSE_CASES

import tensorsql as ts
from tensorsql.backends.duckdb import sqlgen
from tensorsql.ir import ops
from tensorsql.ir import tra as T

DEVICES = [
    pytest.param("cuda-emulated", id="emulated"),
    pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
]
DTYPES = [np.float32, np.float64, np.int64, np.complex128]


@pytest.fixture(scope="module", params=DEVICES)
def gpu(request):
    try:
        s = ts.connect(device=request.param, threads=2)
    except ts.DeviceError as exc:
        if request.param == "cuda":
            pytest.skip(f"no usable CUDA device: {exc}")
        raise
    with s:
        yield s


@pytest.fixture(scope="module")
def cpu():
    with ts.connect(threads=2) as s:
        yield s


def _counters(s) -> dict[str, int]:
    """The emulated device's byte and launch counters (a real device reports none)."""
    text = s.executor.device_counters()
    return {k: int(v) for k, v in re.findall(r"(uploaded|downloaded|launches|live) (\d+)", text)}


def _kernel_calls(sql: str) -> set[str]:
    return set(re.findall(r"\b(tensor_\w+)\(", sql))


# --------------------------------------------------------------------------------------------------
# einsum over the shared case list, every dtype (float32/float64 on the device, the others on the CPU)
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize("case", EQUATIONS, ids=lambda c: c.id)
def test_einsum_matches_numpy(gpu, case: Case, dtype):
    ops_ = make_operands(case.shapes, dtype, case.id)
    result = gpu.einsum(case.subscripts, *ops_).numpy()
    assert_einsum_close(result, [case.subscripts, *ops_])


STRATEGIES = ["eindecomp", "sqrt", "data", "model"]


@pytest.mark.parametrize("strategy", STRATEGIES)
@pytest.mark.parametrize("case", BLOCKING_CASES, ids=lambda c: c.id)
def test_ragged_blocks_every_strategy(gpu, case: Case, strategy):
    """Stored operands in ragged blocks (a dimension of 5 in blocks of 3 and 2), planned by each strategy:
    the joins and aggregations over blocks are SQL, each block product a GPU call."""
    dtype = np.float64 if zlib.crc32(case.id.encode()) % 2 else np.float32
    ops_ = make_operands(case.shapes, dtype, case.id, "ragged")
    rels = [gpu.from_numpy(o, block_shape=tuple(max(1, (d + 1) // 2) for d in o.shape)) for o in ops_]
    result = gpu.einsum(case.subscripts, *rels, strategy=strategy).numpy()
    assert_einsum_close(result, [case.subscripts, *ops_])


# --------------------------------------------------------------------------------------------------
# what runs where
# --------------------------------------------------------------------------------------------------
def test_float_kernels_are_bound_to_the_device_and_others_stay_on_the_cpu(gpu):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((6, 5)), rng.standard_normal((5, 4))
    kinds = [(np.float32, True), (np.float64, True), (np.int64, False), (np.complex64, True)]
    kinds.append((np.complex128, True))
    for dtype, on_device in kinds:
        A = gpu.from_numpy(a.astype(dtype), block_shape=(3, 5))
        B = gpu.from_numpy(b.astype(dtype), block_shape=(5, 2))
        calls = _kernel_calls((A @ B).sql())
        assert ("tensor_einsum_cuda" in calls) == on_device, (dtype, calls)
        assert ("tensor_einsum" in calls) == (not on_device), (dtype, calls)
    m = _kernel_calls(ts.exp(gpu.from_numpy(a)).sql())
    assert "tensor_map_cuda" in m and "tensor_map" not in m
    # complex blocks: multiply/sum contractions on the device, every other kernel on the CPU
    c = gpu.from_numpy(a + 1j * a)
    assert "tensor_map_cuda" not in _kernel_calls(ts.exp(c).sql())
    added = _kernel_calls(ts.einsum("ij,ij->ij", c, c, join="add").sql())
    assert "tensor_einsum" in added and "tensor_einsum_cuda" not in added
    assert "tensor_map_param_cuda" in _kernel_calls(ts.map(gpu.from_numpy(a), "scale", 2.0).sql())
    assert "tensor_einsum1_cuda" in _kernel_calls(gpu.from_numpy(a).sum(axis=0).sql())


def test_no_fused_form_the_gpu_kernel_set_lacks(gpu, cpu):
    """A blocked contraction aggregates the GPU's products with tensor_sum (the CPU session fuses them into
    tensor_einsum_agg); a one-block tree is nested GPU calls (the CPU session: one tensor_einsum_path)."""
    rng = np.random.default_rng(2)
    a, b = rng.standard_normal((8, 6)), rng.standard_normal((6, 4))

    def blocked(s):  # the operands' blocking kept (the GPU session's planner, p = 1, would assemble them)
        x, y = s.from_numpy(a, block_shape=(4, 3)), s.from_numpy(b, block_shape=(3, 4))
        return s.einsum("ij,jk->ik", x, y, strategy="operands")

    assert "tensor_einsum_agg" in _kernel_calls(blocked(cpu).sql())
    on_gpu = _kernel_calls(blocked(gpu).sql())
    assert "tensor_einsum_agg" not in on_gpu and {"tensor_sum", "tensor_einsum_cuda"} <= on_gpu
    np.testing.assert_allclose(blocked(gpu).numpy(), a @ b, rtol=1e-12)

    x, y, z = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((5, 2))

    def tree(s):
        return s.einsum("ij,jk,kl->il", s.from_numpy(x), s.from_numpy(y), s.from_numpy(z))

    assert any(isinstance(r, T.Fused) for r in T.nodes(tree(gpu).plan().tra))  # the same plan
    assert "tensor_einsum_path" in _kernel_calls(tree(cpu).sql())
    calls = tree(gpu).sql()
    assert "tensor_einsum_path" not in calls and calls.count("tensor_einsum_cuda(") == 2
    np.testing.assert_allclose(tree(gpu).numpy(), x @ y @ z, rtol=1e-12)


def test_the_device_is_planned_as_one_kernel_call_at_a_time(gpu):
    """A GPU session plans with p = 1 and stores arrays in blocks of up to ``max_block_bytes`` (the
    CPU's 4 MiB blocks made a stored 4096^2 matmul 64 launches, each operand block copied four times, and 16
    block sums on the host): a stored matmul is one launch."""
    assert gpu.p == 1 and gpu.threads == 2  # DuckDB's threads stay the kernels' thread budget
    rng = np.random.default_rng(4)
    a, b = rng.standard_normal((1200, 900)), rng.standard_normal((900, 1100))  # 8.6 and 7.9 MB
    with ts.connect(device=gpu.executor.device, max_block_bytes=64 << 20, threads=2) as s:
        A, B = s.from_numpy(a), s.from_numpy(b)
        assert A.block_shape == a.shape and B.block_shape == b.shape
        assert s.from_numpy(a, block_shape=(600, 900)).block_shape == (600, 900)  # given blocks are kept
        cells = "SELECT i, j, CAST(i - j AS DOUBLE) AS v FROM range(1200) r(i), range(900) c(j)"
        from_rows = s.from_sql(cells, shape=(1200, 900))
        assert from_rows.block_shape == (1200, 900)  # from_sql stores the same blocks
        want = np.subtract.outer(np.arange(1200.0), np.arange(900.0))
        np.testing.assert_array_equal(from_rows.numpy(), want)
        emulated = s.executor.device == "cuda-emulated"
        before = _counters(s) if emulated else {}
        atol = np.finfo(np.float64).eps * 900 * 16 * np.abs(a).max() * np.abs(b).max()  # K terms can cancel
        np.testing.assert_allclose((A @ B).numpy(), a @ b, rtol=0, atol=atol)
        if emulated:
            assert _counters(s)["launches"] - before["launches"] == 1
    with ts.connect(device=gpu.executor.device, max_block_bytes=64 << 10) as small:
        blocked = small.from_numpy(a.astype(np.float32))
        bs = blocked.block_shape
        assert np.prod(bs) * 4 <= 64 << 10 and np.prod(bs) * 8 > 64 << 10  # halved until a block fits the cap
        np.testing.assert_array_equal(blocked.numpy(), a.astype(np.float32))


def test_each_block_is_copied_to_the_device_once_and_back_once(gpu):
    if gpu.executor.device == "cuda:0" and "emulated" not in gpu.executor.device_info:
        pytest.skip("a real device does not count its copies")
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((16, 8)), rng.standard_normal((8, 12))
    A, B = gpu.from_numpy(a), gpu.from_numpy(b)
    rel = A @ B
    before = _counters(gpu)
    np.testing.assert_allclose(rel.numpy(), a @ b, rtol=1e-12)
    after = _counters(gpu)
    assert after["uploaded"] - before["uploaded"] == a.nbytes + b.nbytes
    assert after["downloaded"] - before["downloaded"] == (a @ b).nbytes
    assert after["live"] == 0  # every device buffer freed when its call ended
    # a layout cuBLAS takes as it is is not packed: a plain matmul is one GEMM launch
    assert after["launches"] - before["launches"] == 1


# --------------------------------------------------------------------------------------------------
# maps, extended joins and aggregations, absent blocks
# --------------------------------------------------------------------------------------------------
PARAMS = {"pow": [-1.0, 0.5, 3.0], "scale": [-2.5], "rpow": [0.5, 3.0]}


def _maps():
    for fn in ops.MAPS:
        for p in PARAMS.get(fn, [None]) if ops.lookup("map", fn).param is not None else [None]:
            yield fn, p


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=lambda d: np.dtype(d).name)
@pytest.mark.parametrize(("fn", "param"), list(_maps()))
def test_every_map(gpu, fn, param, dtype):
    rng = np.random.default_rng(4)
    x = (np.abs(rng.standard_normal((5, 7))) + 0.25).astype(dtype)  # positive: log, sqrt, powers stay real
    x[0, :3] = [-1.5, 0.0, 40.0] if fn not in ("log", "sqrt", "pow") else x[0, :3]
    got = ts.map(gpu.from_numpy(x, block_shape=(3, 4)), fn, param).numpy()
    with np.errstate(all="ignore"):
        want = np.asarray(ops.lookup("map", fn).numpy(x.astype(np.float64), ops.map_param(param)))
    assert got.dtype == x.dtype
    tolerance.assert_close(got, want, tolerance.elementwise_tolerance(want, dtype, roundings=4))


@pytest.mark.parametrize("case", list(SPARSE_CASES))
def test_joins_and_aggregations_over_absent_blocks(gpu, case):
    rng = np.random.default_rng(42)
    x = -np.abs(rng.standard_normal((6, 8))) - 0.5
    y = rng.standard_normal((6, 8))
    A, da = _sparse(gpu, x, (3, 4), [(0, 0), (1, 1), (0, 1)])
    B, db = _sparse(gpu, y, (3, 4), [(1, 0), (1, 1)])
    make, want = SPARSE_CASES[case]
    rel = make(A, B, gpu.from_numpy(y))
    np.testing.assert_allclose(rel.numpy(), want(da, db, y), rtol=1e-12, atol=1e-14)


JOINS = {
    "add": np.add,
    "subtract": np.subtract,
    "divide": np.divide,
    "sqdiff": lambda x, y: (x - y) ** 2,
    "absdiff": lambda x, y: np.abs(x - y),
    "max": np.maximum,
    "min": np.minimum,
    "greater": lambda x, y: (x > y).astype(np.float64),
    "multiply": np.multiply,
}


def test_a_plan_run_in_waves_binds_each_wave_to_the_device(gpu, monkeypatch):
    """Under a small memory budget a plan runs in waves (``staged``): each wave's statement is lowered for the
    device too."""
    from tensorsql.backends.duckdb.executor import DuckDBExecutor

    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((12, 10)), rng.standard_normal((10, 8))
    A, B = gpu.from_numpy(a, block_shape=(4, 5)), gpu.from_numpy(b, block_shape=(5, 4))
    monkeypatch.setattr(DuckDBExecutor, "wave_budget", property(lambda self: 1 << 9))
    monkeypatch.setattr(gpu, "strategy", "operands")  # the blocks kept: several block products per wave
    rel = ts.exp(A @ B)
    assert "runs in waves" in rel.explain()
    emulated = gpu.executor.device == "cuda-emulated"
    before = _counters(gpu) if emulated else {}
    np.testing.assert_allclose(rel.numpy(), np.exp(a @ b), rtol=1e-12)
    if emulated:  # every block product and every exp of the waves ran on the device
        assert _counters(gpu)["launches"] - before["launches"] >= 3 * 2 * 2 + 3 * 2
    np.testing.assert_allclose(gpu.from_arrow(rel.to_arrow()).numpy(), np.exp(a @ b), rtol=1e-12)


@pytest.mark.parametrize(
    ("join", "agg"),
    [
        (j, a)
        for j in ("add", "subtract", "divide", "sqdiff", "absdiff", "max", "min", "greater")
        for a in ("sum", "max")
    ]
    + [("multiply", "max"), ("multiply", "min"), ("multiply", "prod")],
)
def test_extended_einsum(gpu, join, agg):
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((4, 5)), rng.standard_normal((5, 3)) + 3.0
    got = ts.einsum("ij,jk->ik", gpu.from_numpy(a, block_shape=(2, 5)), gpu.from_numpy(b), join=join, agg=agg)
    pair = JOINS[join](a[:, :, None], b[None, :, :])
    want = getattr(np, {"sum": "sum", "max": "max", "min": "min", "prod": "prod"}[agg])(pair, axis=1)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-12, atol=1e-12)


def test_softmax_and_a_gradient(gpu):
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((8, 5)), rng.standard_normal((5, 3))
    X, W = gpu.from_numpy(x), gpu.from_numpy(w)
    sm = ts.softmax(X @ W).numpy()
    e = np.exp(x @ w - (x @ w).max(-1, keepdims=True))
    np.testing.assert_allclose(sm, e / e.sum(-1, keepdims=True), rtol=1e-12)
    loss = ((X @ W) * (X @ W)).sum()
    (g,) = ts.grad(loss, wrt=[W])
    np.testing.assert_allclose(g.numpy(), 2 * x.T @ (x @ w), rtol=1e-12)


# --------------------------------------------------------------------------------------------------
# errors
# --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("device", "match"),
    [
        ("gpu", "is not a device"),
        ("cuda:x", "is not a device"),
        ("cuda:-1", "is not a device"),
        (0, "must be a string"),
        ("cpu:0", "the CPU has no ordinal"),
        ("cuda-emulated:1", "ordinal 0"),
        ("cuda:7", "has 1 CUDA device|no usable CUDA device|has 0 CUDA"),
    ],
)
def test_bad_devices(device, match):
    if device == "cuda:7":
        try:
            ts.connect(device="cuda-emulated").close()
        except ts.DeviceError:  # pragma: no cover - the emulated device always builds
            pytest.fail("the emulated device must be usable")
    with pytest.raises(ts.DeviceError, match=match):
        ts.connect(device=device)


def test_an_old_gpu_is_refused_before_any_query():
    from tensorsql.backends.cuda.executor import check_architecture

    info = (
        "cuda: 2 device(s): 0 Tesla V100 (16160 MiB, sm_70); 1 NVIDIA H100 (81559 MiB, sm_90); "
        "built for sm_75,80,90; cublas: libcublas.so.13"
    )
    check_architecture(info, 1, "cuda:1")
    with pytest.raises(ts.DeviceError, match="sm_70 is older than the GPU kernels were built for"):
        check_architecture(info, 0, "cuda:0")
    # the device count is not a device: ordinal 2 of "2 device(s)" is no entry (connect refuses it first)
    newer = info.replace("0 Tesla V100 (16160 MiB, sm_70)", "0 NVIDIA H100 (81559 MiB, sm_90)")
    check_architecture(newer, 2, "x")
    two = "cuda: 2 device(s): 0 A (1 MiB, sm_90); 1 B (1 MiB, sm_70); built for sm_75;"
    with pytest.raises(ts.DeviceError, match="sm_70"):
        check_architecture(two, 1, "y")


def test_cuda_without_a_usable_device_says_why():
    try:
        s = ts.connect(device="cuda")
    except ts.DeviceError as exc:
        assert "cuda:0" in str(exc) and ("CUDA" in str(exc) or "cuBLAS" in str(exc) or "nvcc" in str(exc))
        assert isinstance(exc, RuntimeError) and isinstance(exc, ts.TensorSQLError)
        return
    with s:  # pragma: no cover - a machine with a GPU
        assert s.executor.device == "cuda:0"


def test_running_out_of_device_memory_is_out_of_memory(monkeypatch):
    """The device refusing an allocation is OutOfMemoryError (the emulated device with 4 KiB of memory)."""
    monkeypatch.setenv("TENSORSQL_EMULATED_DEVICE_BYTES", "4096")
    with ts.connect(device="cuda-emulated") as s:
        a = np.ones((32, 32))  # 8 KiB
        with pytest.raises(ts.OutOfMemoryError, match="out of memory on the device allocating operand x"):
            s.einsum("ij,jk->ik", a, a).numpy()
        small = np.ones((8, 8))
        np.testing.assert_array_equal(s.einsum("ij,jk->ik", small, small).numpy(), small @ small)


def test_a_cluster_session_refuses_a_device():
    with pytest.raises(ts.DeviceError, match="cluster"):
        ts.connect(device="cuda-emulated", workers=2)


def test_the_gpu_functions_check_their_inputs(gpu):
    bad = [
        (
            "SELECT tensor_einsum_cuda(0, 'ij,jk->ik', 'multiply', 'sum', 'float32', '\\x00'::BLOB, [1, 1], "
            "'\\x00\\x00\\x00\\x00'::BLOB, [1, 1])",
            "operand x has 1 bytes but shape \\[1,1\\] of float32 needs 4",
        ),
        (
            "SELECT tensor_einsum_cuda(0, 'ij,jk->ik', 'multiply', 'sum', 'int32', ''::BLOB, [0, 0], "
            "''::BLOB, "
            "[0, 0])",
            "dtype int32 with join 'multiply' and agg 'sum' is not computed on the GPU",
        ),
        (
            "SELECT tensor_einsum_cuda(0, 'ij,jk->ik', 'bogus', 'sum', 'float32', ''::BLOB, [0, 0], "
            "''::BLOB, "
            "[0, 0])",
            "unknown join 'bogus'",
        ),
        ("SELECT tensor_einsum1_cuda(0, 'ij->k', 'sum', 'float64', ''::BLOB, [0, 0])", "tensor_einsum1_cuda"),
        ("SELECT tensor_map_cuda(0, 'pow', 'float64', ''::BLOB)", "needs a param"),
        ("SELECT tensor_map_cuda(0, 'exp', 'float64', '\\x00\\x00\\x00'::BLOB)", "whole number|bytes"),
        ("SELECT tensor_einsum1_cuda(0, 'ij->', 'max', 'float64', ''::BLOB, [0, 3])", "has no identity"),
        (
            "SELECT tensor_map_cuda(5000, 'exp', 'float64', "
            "'\\x00\\x00\\x00\\x00\\x00\\x00\\x00\\x00'::BLOB)",
            "out of range",
        ),
    ]
    for query, match in bad:
        with pytest.raises(ts.KernelError, match=match):
            gpu.execute(query)


def test_the_function_table_lists_the_gpu_functions(gpu):
    import udf_kernels

    query = "SELECT DISTINCT function_name FROM duckdb_functions() WHERE function_name LIKE '%cuda%'"
    rows = gpu.execute(query)
    assert {r[0] for r in rows} == set(udf_kernels.GPU_SQL_FUNCTIONS)


# --------------------------------------------------------------------------------------------------
# the statement pass and the build
# --------------------------------------------------------------------------------------------------
def test_on_device_binds_float_kernels_only():
    from sqlglot import exp

    def call(name, *args):
        return exp.Anonymous(
            this=name, expressions=[sqlgen.lit(a) if not isinstance(a, exp.Expression) else a for a in args]
        )

    x = exp.column("t")
    q = exp.select(
        call("tensor_map", "exp", "float32", x),
        call("tensor_map", "scale", "float64", x, 2.0),
        call("tensor_map", "exp", "int64", x),
        call("tensor_einsum1", "ij->i", "sum", "float64", x, x),
        call(
            "tensor_sum", call("tensor_einsum", "i,i->", "multiply", "sum", "float32", x, x, x, x), "float32"
        ),
        call("tensor_cast", x, "float32", "float64"),
    )
    text = sqlgen.sql_text(sqlgen.on_device(q, 3))
    assert text.count("tensor_map_cuda(3, 'exp', 'float32'") == 1
    assert "tensor_map_param_cuda(3, 'scale', 'float64'" in text
    assert "tensor_map('exp', 'int64'" in text
    assert "tensor_einsum1_cuda(3, 'ij->i'" in text and "tensor_einsum_cuda(3, 'i,i->'" in text
    assert "tensor_sum(tensor_einsum_cuda" in text and "tensor_cast(t, 'float32'" in text
    complex_calls = exp.select(
        call("tensor_einsum", "i,i->", "multiply", "sum", "complex64", x, x, x, x),
        call("tensor_einsum", "i,i->", "add", "sum", "complex128", x, x, x, x),
        call("tensor_einsum1", "ij->i", "sum", "complex64", x, x),
    )
    text = sqlgen.sql_text(sqlgen.on_device(complex_calls, 0))
    assert "tensor_einsum_cuda(0, 'i,i->', 'multiply', 'sum', 'complex64'" in text
    assert "tensor_einsum('i,i->', 'add', 'sum', 'complex128'" in text and "tensor_einsum1('ij->i'" in text


def test_the_cuda_sources_compile():
    """The real GPU kernel set builds (device.cu for the architectures TENSORSQL_CUDA_ARCHS names) where it is
    wanted: a CUDA device is visible, or TENSORSQL_BUILD_CUDA=1 / make kernels-cuda asked for it; and its
    extension loads, without a GPU saying why nothing can run."""
    from udf_kernels import gpu_build

    if not gpu_build.is_current(emulated=False):  # a current build is checked wherever it was made
        wanted, why = gpu_build.cuda_wanted()
        if not wanted:
            pytest.skip(f"the CUDA kernel set is not built here: {why} (make kernels-cuda builds it)")
        if gpu_build.find_nvcc() is None:
            pytest.skip("no nvcc on this machine: the CUDA build is not checked here")
    path = gpu_build.build(emulated=False)
    import duckdb

    import udf_kernels

    con = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    try:
        udf_kernels.load(con, path)
        info = con.execute("SELECT tensor_cuda_info()").fetchall()[0][0]
    finally:
        con.close()
    assert info.startswith(("cuda:", "error:")), info


def test_training_on_the_device_matches_the_cpu(gpu, cpu):
    """``ml.fit`` runs its forward, backward and update steps through the GPU executor (its one-statement and
    result-sink fast paths fall back to the general path) and reaches the CPU's losses."""
    from tensorsql import ml

    losses = []
    for s in (cpu, gpu):
        s.sql(
            "CREATE OR REPLACE TABLE rows_gpu AS SELECT range AS id, (range * 7919 % 1000) / 1000.0 AS a, "
            "(range * 104729 % 1000) / 1000.0 AS b FROM range(300)"
        )
        s.sql(
            "CREATE OR REPLACE TABLE labelled_gpu AS SELECT *, CAST(a - b > 0 AS INTEGER) AS y FROM rows_gpu"
        )
        model = ml.LogisticRegression(s, n_features=2, dtype="float64", seed=1)
        h = ml.fit(
            model,
            "labelled_gpu",
            ["a", "b"],
            "y",
            epochs=2,
            batch_size=64,
            optimizer=ml.Adam(0.2),
            progress=False,
            seed=1,
        )
        losses.append(h.losses)
    np.testing.assert_allclose(losses[1], losses[0], rtol=1e-12)
    assert losses[1][-1] < losses[1][0]


def test_long_sums_are_summed_in_levels_and_products_keep_the_sign_of_zero(gpu):
    """One running total per output (on the emulated device): 2e7 float32 ones summed to
    16777216, 1e7 float64 tenths 7e5 eps off; and a product with nothing summed was 0 + x, which made -0.0
    (numpy's sign, and 1/x's) +0.0."""
    ones = np.ones(2 * 10**7, np.float32)
    assert gpu.einsum("i->", ones).numpy() == 2e7
    assert gpu.einsum("i,i->", ones, ones).numpy() == 2e7
    tenths = np.full(10**7, 0.1)
    exact = math.fsum(tenths)
    for got in (gpu.einsum("i->", tenths).numpy(), gpu.einsum("ij->i", tenths.reshape(1, -1)).numpy()[0]):
        assert abs(float(got) - exact) <= 600 * np.finfo(np.float64).eps * exact
    a, b = np.array([-0.0, 2.0]), np.array([1.0, -0.0])
    A, B = gpu.from_numpy(a), gpu.from_numpy(b)
    np.testing.assert_array_equal(np.signbit((A * B).numpy()), np.signbit(a * b))
    np.testing.assert_array_equal(np.signbit((A + A).numpy()), np.signbit(a + a))
    assert np.signbit(gpu.from_numpy(np.array([[-0.0]])).T.numpy()).all()
