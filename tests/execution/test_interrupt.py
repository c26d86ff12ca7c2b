"""Ctrl-C during a long query, the kernels' cancellation flag and progress counter (udf_kernels.control), and
the progress bar (tensorsql/backends/duckdb/longrun.py)."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import threading
import time

import duckdb
import numpy as np
import pytest

import tensorsql as ts
import udf_kernels
from tensorsql.backends.duckdb import longrun
from udf_kernels import control


@contextlib.contextmanager
def sigint_after(delay: float):
    """Sends SIGINT to this process after `delay` seconds while the block runs; yields [send time]. A signal
    that lands after the block (the query finished first) is swallowed instead of aborting the test run."""
    armed = threading.Event()
    armed.set()
    sent: list[float] = []

    def handler(signum, frame):
        if armed.is_set():
            raise KeyboardInterrupt

    def fire() -> None:
        sent.append(time.perf_counter())
        os.kill(os.getpid(), signal.SIGINT)

    old = signal.signal(signal.SIGINT, handler)
    timer = threading.Timer(delay, fire)
    timer.start()
    try:
        yield sent
    finally:
        armed.clear()
        timer.cancel()
        timer.join()
        signal.signal(signal.SIGINT, old)


@pytest.mark.parametrize("route", ["numpy", "arrow"])
def test_ctrl_c_stops_a_long_query_promptly(route):
    # one 4096^2 float64 GEMM on one thread: ~3 s of work, far longer than the 0.5 s before the signal
    n = 4096
    rng = np.random.default_rng(0)
    a, b = rng.random((n, n)), rng.random((n, n))
    with ts.connect(threads=1) as s:
        s.executor.progress = False
        rel = s.einsum("ij,jk->ik", s.from_numpy(a), s.from_numpy(b))
        with pytest.raises(KeyboardInterrupt), sigint_after(0.5) as sent:
            if route == "numpy":
                rel.numpy()
            else:
                rel.to_arrow()
        latency = time.perf_counter() - sent[0]
        assert latency < 1.5, f"KeyboardInterrupt {latency:.2f} s after SIGINT"
        # the session still works, and the flag was cleared
        x, y = rng.random((30, 20)), rng.random((20, 10))
        np.testing.assert_allclose(s.einsum("ij,jk->ik", x, y).numpy(), x @ y)
        np.testing.assert_allclose(ts.einsum("ij,jk->ik", x, y), x @ y)


def test_short_queries_run_on_the_calling_thread(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a short query went through run_long")

    monkeypatch.setattr(longrun, "run_long", refuse)
    with ts.connect(threads=2) as s:
        x, y = np.ones((64, 64)), np.ones((64, 64))
        np.testing.assert_allclose(s.einsum("ij,jk->ik", x, y).numpy(), x @ y)
        node = s.einsum("ij,jk->ik", x, y).node
    flops, weighted = longrun.plan_work(node)
    assert flops == weighted == 2 * 64**3
    assert not longrun.is_long(weighted, 2)
    assert longrun.is_long(2.0 * 8192**3, 2)


@pytest.fixture
def raw():
    """A bare DuckDB connection with the kernels loaded, its extension path and kernel-state token."""
    con = duckdb.connect(config={"allow_unsigned_extensions": "true", "threads": "2"})
    path = udf_kernels.load(con)
    yield con, path, control.db_token(con)
    con.close()


QUERIES = {
    "tensor_einsum": "SELECT tensor_einsum('ij,jk->ik', 'multiply', 'sum', 'float64', ?, [8, 8], ?, [8, 8])",
    "tensor_einsum generic": (
        "SELECT tensor_einsum('ij,jk->ik', 'sqdiff', 'sum', 'float64', ?, [8, 8], ?, [8, 8])"
    ),
    "tensor_einsum_agg": (
        "SELECT tensor_einsum_agg('ij,jk->ik', 'multiply', 'sum', 'float64', x, [8, 8], y, [8, 8]) "
        "FROM (SELECT ?::BLOB AS x, ?::BLOB AS y)"
    ),
    "tensor_einsum_path": "SELECT tensor_einsum_path('0,1:ab,bc->ac', 'float64', [8, 8, 8, 8], ?, ?)",
}


@pytest.mark.parametrize("kernel", QUERIES)
def test_cancel_flag_fails_kernels_until_reset(raw, kernel):
    con, path, token = raw
    block = np.arange(64, dtype=np.float64).tobytes()
    q = QUERIES[kernel]
    assert con.execute(q, [block, block]).fetchone()[0] is not None
    assert control.cancel(path, token)
    with pytest.raises(duckdb.Error, match=control.MARKER) as info:
        con.execute(q, [block, block]).fetchall()
    assert control.is_interrupted(info.value) and longrun.is_interrupt(info.value)
    assert control.reset(path, token)
    assert con.execute(q, [block, block]).fetchone()[0] is not None


def test_cancel_stops_a_running_generic_loop(raw):
    # a sqdiff contraction runs in the generic strided loop (~1 s here), stepped over its outer loops
    con, path, token = raw
    rng = np.random.default_rng(3)
    x, y = rng.random((512, 1024)), rng.random((1024, 512))
    q = "SELECT tensor_einsum('ij,jk->ik', 'sqdiff', 'sum', 'float64', ?, [512, 1024], ?, [1024, 512])"
    errors: list[BaseException] = []

    def run() -> None:
        try:
            con.execute(q, [x.tobytes(), y.tobytes()]).fetchall()
        except duckdb.Error as exc:
            errors.append(exc)

    worker = threading.Thread(target=run)
    worker.start()
    deadline = time.perf_counter() + 10.0
    while (control.progress(path, token) or (0.0, 0.0))[1] == 0.0 and time.perf_counter() < deadline:
        time.sleep(0.005)  # cancel once the kernel has announced its work, i.e. is running
    sent = time.perf_counter()
    control.cancel(path, token)
    worker.join()
    latency = time.perf_counter() - sent
    control.reset(path, token)
    assert errors and control.is_interrupted(errors[0])
    assert latency < 2.0, f"the loop stopped {latency:.2f} s after the cancel"


# Each is over the 4 GFLOP from which a GEMM runs in K panels (gemm.cpp, gemm_steps): the panels must add up
# to the product.
STEPPED = [
    ("ki,kj->ij", "float64", (2048, 1024), (2048, 1024)),  # A transposed, row panels over 2 threads
    ("ik,kj->ij", "float32", (256, 2048), (2048, 4096)),  # wide C: column panels, K panels of 512
    ("ik,kj->ij", "complex64", (512, 2048), (2048, 512)),
    ("bik,bkj->bij", "float64", (2, 1024, 2048), (2, 2048, 512)),  # batched
]


@pytest.mark.parametrize(("spec", "dtype", "xs", "ys"), STEPPED)
def test_stepped_gemm_matches_numpy(raw, spec, dtype, xs, ys):
    con, path, token = raw
    rng = np.random.default_rng(4)
    x, y = (rng.random(xs) - 0.5).astype(dtype), (rng.random(ys) - 0.5).astype(dtype)
    if x.dtype.kind == "c":
        x, y = x + 1j * x[..., ::-1], y - 1j * y[::-1]
    control.reset(path, token)
    blob = con.execute(
        f"SELECT tensor_einsum(?, 'multiply', 'sum', '{dtype}', ?, {list(xs)}, ?, {list(ys)})",
        [spec, x.tobytes(), y.tobytes()],
    ).fetchone()[0]
    wide = np.complex128 if x.dtype.kind == "c" else np.float64
    ref = np.einsum(spec, x.astype(wide), y.astype(wide), optimize=True)
    got = np.frombuffer(blob, dtype=dtype).reshape(ref.shape)
    tol = 1e-5 if dtype in ("float32", "complex64") else 1e-12
    assert np.max(np.abs(got - ref)) <= tol * np.max(np.abs(ref))
    sizes = dict(zip(spec.split(",")[0] + spec.split(",")[1].split("-")[0], xs + ys, strict=True))
    flops = 2.0 * np.prod(list(sizes.values()))
    assert control.progress(path, token) == (flops, flops)


def test_tokens_are_per_database(raw):
    _con, path, token = raw
    other = duckdb.connect(config={"allow_unsigned_extensions": "true"})
    udf_kernels.load(other)
    try:
        assert control.db_token(other) != token > 0
        assert control.cancel(path, token)
        block = np.ones(64).tobytes()
        q = QUERIES["tensor_einsum"]
        assert other.execute(q, [block, block]).fetchone()[0] is not None  # another database: unaffected
    finally:
        control.reset(path, token)
        other.close()
    assert not control.cancel(path, 12345) and not control.reset(path, 12345)
    assert control.progress(path, 12345) is None


def test_progress_counts_up_to_the_total(raw):
    con, path, token = raw
    n, bs = 2048, 512  # 4 x 4 blocks: 64 block products in the fused aggregate, 2 * 2048^3 flops
    rng = np.random.default_rng(1)
    a, b = rng.random((n, n)), rng.random((n, n))
    g = n // bs
    rows = [
        (i, j, np.ascontiguousarray(m[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]).tobytes())
        for m in (a,)
        for i in range(g)
        for j in range(g)
    ]
    con.execute("CREATE TABLE A (k0 INT, k1 INT, tensor BLOB)")
    con.executemany("INSERT INTO A VALUES (?, ?, ?)", rows)
    rows = [
        (i, j, np.ascontiguousarray(b[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs]).tobytes())
        for i in range(g)
        for j in range(g)
    ]
    con.execute("CREATE TABLE B (k0 INT, k1 INT, tensor BLOB)")
    con.executemany("INSERT INTO B VALUES (?, ?, ?)", rows)
    control.reset(path, token)
    assert control.progress(path, token) == (0.0, 0.0)
    samples: list[tuple[float, float]] = []
    stop = threading.Event()

    def poll() -> None:
        while not stop.is_set():
            samples.append(control.progress(path, token))
            time.sleep(0.002)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        out = con.execute(
            "SELECT x.k0, y.k1, tensor_einsum_agg('ij,jk->ik', 'multiply', 'sum', 'float64', x.tensor, "
            f"[{bs}, {bs}], y.tensor, [{bs}, {bs}]) FROM A x JOIN B y ON x.k1 = y.k0 GROUP BY x.k0, y.k1"
        ).fetchall()
    finally:
        stop.set()
        poller.join()
    total = 2.0 * n**3
    assert control.progress(path, token) == (total, total)
    done = [d for d, _ in samples]
    assert done == sorted(done)  # monotonic
    assert any(0 < d < total for d in done)  # seen in between, not only at the end
    c = np.zeros((n, n))
    for i, j, blob in out:
        c[i * bs : (i + 1) * bs, j * bs : (j + 1) * bs] = np.frombuffer(blob).reshape(bs, bs)
    np.testing.assert_allclose(c, a @ b)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_run_long_draws_and_clears_a_bar(monkeypatch):
    monkeypatch.setattr(longrun, "BAR_AFTER_SECONDS", 0.0)
    monkeypatch.setattr(longrun, "POLL_SECONDS", 0.01)
    n = 2048
    rng = np.random.default_rng(2)
    a, b = rng.random((n, n)), rng.random((n, n))
    with ts.connect(threads=2) as s:
        rel = s.einsum("ij,jk->ik", s.from_numpy(a), s.from_numpy(b))
        plan = s.plan(rel.node)
        con, path, sql = s.executor.con, s.executor.kernels, s.executor.text(plan, pretty=False)
        token = control.db_token(con)
        term = _Terminal()
        table = longrun.run_long(
            con,
            token,
            path,
            lambda: con.sql(sql).to_arrow_table(),
            total_work=longrun.plan_flops(plan.root),
            progress=True,
            stream=term,
        )
        assert table.num_rows > 0
        assert s.execute("SELECT current_setting('enable_progress_bar')")[0][0] in (False, "false")
        text = term.getvalue()
        assert "tensorsql [" in text and "%" in text
        assert text.endswith("\r\x1b[K")  # erased at the end
        quiet = io.StringIO()  # not a terminal: no bar at all
        fn = lambda: con.sql(sql).to_arrow_table()  # noqa: E731
        longrun.run_long(con, token, path, fn, total_work=1, progress=True, stream=quiet)
        assert quiet.getvalue() == ""


def test_interrupted_errors_become_keyboard_interrupt(raw):
    con, path, token = raw
    handler = signal.getsignal(signal.SIGINT)

    def interrupted():
        raise duckdb.InterruptException("INTERRUPT Error: Interrupted!")

    with pytest.raises(KeyboardInterrupt):
        longrun.run_long(con, token, path, interrupted, total_work=1, progress=False)
    with pytest.raises(KeyboardInterrupt):
        longrun.run_direct(interrupted)

    def fails():
        raise ValueError("not an interrupt")

    with pytest.raises(ValueError, match="not an interrupt"):
        longrun.run_long(con, token, path, fails, total_work=1, progress=False)
    assert longrun.run_long(con, token, path, lambda: 42, total_work=1, progress=False) == 42
    assert signal.getsignal(signal.SIGINT) is handler  # run_long's wrapper is gone again


def test_progress_setting(monkeypatch):
    monkeypatch.delenv("TENSORSQL_PROGRESS", raising=False)
    assert longrun.progress_enabled(None, _Terminal()) is True
    assert longrun.progress_enabled(None, io.StringIO()) is False
    assert longrun.progress_enabled(False, _Terminal()) is False
    assert longrun.progress_enabled(True, io.StringIO()) is True
    monkeypatch.setenv("TENSORSQL_PROGRESS", "0")
    assert longrun.progress_enabled(None, _Terminal()) is False
    monkeypatch.setenv("TENSORSQL_PROGRESS", "1")
    assert longrun.progress_enabled(None, io.StringIO()) is True


def test_a_long_save_or_materialize_finishes(tmp_path):
    """A save or materialize of a plan long enough to run on longrun's worker thread took the executor's
    lock there, which its caller held while it waited: a deadlock (found by review, older than the fix)."""
    import threading

    outcome: list[object] = []

    def work() -> None:
        with ts.connect(str(tmp_path / "long.duckdb"), threads=1) as s:
            a = s.from_numpy(np.random.default_rng(0).random((1500, 1500)))
            prod = a @ a
            assert s.executor._statement(prod.plan()).long  # the worker thread's path
            got = prod.materialize().numpy()
            prod.save("L")
            outcome.append(np.abs(got - s.table("L").numpy()).max())

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "a long save or materialize hung"
    assert outcome == [0.0]



def test_a_collection_on_the_long_run_worker_does_not_deadlock(monkeypatch):
    """A garbage collection that runs on longrun's worker thread runs the finalizers of dead relations there
    (a view to unregister, a table to drop, a prepared statement to deallocate); they took the executor's
    lock, which the caller held while it waited for the worker: a hang Ctrl-C could not end. They are queued,
    and run by the caller as it lets go of the lock."""
    import gc

    real = longrun.run_long

    def collecting(con, token, lib, fn, **kw):
        def fn_then_collect():
            gc.collect()  # what any allocation on the worker may start
            return fn()

        return real(con, token, lib, fn_then_collect, **kw)

    monkeypatch.setattr(longrun, "run_long", collecting)
    outcome: list[object] = []

    def work() -> None:
        with ts.connect(threads=2) as s:
            s.executor.progress = False
            x = np.ones((300, 300))

            class Holder:
                pass

            names = []
            for _ in range(3):  # relations reachable only through a cycle: freed by the collector alone
                h = Holder()
                h.uploaded, h.stored, h.me = s.from_numpy(x), (s.from_numpy(x) * 2).materialize(), h
                names += [h.uploaded.node.table, h.stored.node.table]
                del h
            big = np.random.default_rng(0).random((2000, 2000))
            prod = s.einsum("ij,jk->ik", big, big)
            assert s.executor._statement(prod.plan()).long  # the worker thread's path
            got = prod.numpy()
            left = {n for (n,) in s.execute("SELECT view_name FROM duckdb_views() WHERE temporary")}
            left |= {n for (n,) in s.execute("SELECT table_name FROM duckdb_tables() WHERE temporary")}
            outcome.append((np.abs(got - big @ big).max(), sorted(set(names) & left)))

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(120)
    assert not t.is_alive(), "a collection on the worker thread hung the query"
    assert outcome and outcome[0][0] < 1e-9 * 2000 and outcome[0][1] == []


def test_close_while_another_thread_reads_a_sql_relation(tmp_path):
    """DuckDB refuses to close a connection another thread reads a result from: the session said it was
    closed and kept the database file locked, with no way to close it again. The read is
    interrupted and the connection closed."""
    db = str(tmp_path / "busy.duckdb")
    s = ts.connect(db, threads=2)
    rel = s.sql("SELECT count(*) FROM range(100000000) t(a), range(3) u(b) WHERE hash(a + b) % 7 = 1")
    failed: list[BaseException] = []

    def read() -> None:
        try:
            rel.fetchall()
        except BaseException as exc:  # interrupted by the close (or it finished first)
            failed.append(exc)

    t = threading.Thread(target=read)
    t.start()
    time.sleep(0.2)
    s.close()
    t.join(30)
    assert not t.is_alive() and s.closed
    with ts.connect(db, read_only=True) as again:  # the file is free
        assert again.tables() == []
