"""Machine learning: losses and their gradients, optimizers against their published update rules, models
trained from a table (accuracy, a numpy-by-hand MLP), checkpoint and resume, save/load, bad inputs."""

from __future__ import annotations

import threading
import time

import numpy as np
import pyarrow as pa
import pytest
from test_autodiff import check

import tensorsql as ts
from tensorsql import ml
from tensorsql.ml import train


@pytest.fixture(scope="module")
def s():
    with ts.connect(threads=1) as session:
        yield session


def table(s, name, columns):
    s.executor.con.register("_ts_test_rows", pa.table(columns))
    try:
        s.execute(f'CREATE OR REPLACE TABLE "{name}" AS SELECT * FROM _ts_test_rows')
    finally:
        s.executor.con.unregister("_ts_test_rows")


RNG = np.random.default_rng(33)


# ---- losses ------------------------------------------------------------------------------------------------
def test_losses_match_numpy_and_differentiate(s):
    z, y = RNG.standard_normal((6, 3)), RNG.random((6, 3))
    Z = s.from_numpy(z)
    np.testing.assert_allclose(ml.mse(Z, y).numpy(), ((z - y) ** 2).mean(), rtol=1e-12)
    bce = np.mean(np.logaddexp(0, z) - y * z)
    np.testing.assert_allclose(ml.binary_cross_entropy(Z, y).numpy(), bce, rtol=1e-12)
    onehot = np.eye(3)[[0, 2, 1, 1, 0, 2]]
    logp = z - z.max(1, keepdims=True)
    logp = logp - np.log(np.exp(logp).sum(1, keepdims=True))
    ce = ml.softmax_cross_entropy(Z, onehot, over=1)
    np.testing.assert_allclose(ce.numpy(), -(onehot * logp).sum() / 6)
    # finite for extreme logits, where sigmoid or softmax alone underflow
    big = s.from_numpy(np.array([[800.0, -800.0, 0.0]]))
    assert np.isfinite(ml.binary_cross_entropy(big, np.array([[0.0, 1.0, 1.0]])).numpy())
    assert np.isfinite(ml.softmax_cross_entropy(big, np.array([[0.0, 1.0, 0.0]])).numpy())
    check(s, lambda Z, Y: ml.binary_cross_entropy(Z, Y), [z, y], wrt=[0])
    check(s, lambda Z, Y: ml.softmax_cross_entropy(Z, Y, over=1), [z, onehot], wrt=[0])
    check(s, lambda Z, Y: ml.mse(Z, Y), [z, y], wrt=[0, 1])
    with pytest.raises(ts.ShapeError, match=r"mse: the targets have shape \(3,\), the predictions \(6, 3\)"):
        ml.mse(Z, np.zeros(3))


# ---- optimizers --------------------------------------------------------------------------------------------
def _reference(kind, p, grads, lr, **kw):
    """The update rules as torch documents them, in numpy."""
    m, v = np.zeros_like(p), np.zeros_like(p)
    for t, g in enumerate(grads, 1):
        if kind == "sgd":
            g = g + kw.get("weight_decay", 0) * p
            m = kw["momentum"] * m + g
            p = p - lr * ((g + kw["momentum"] * m) if kw.get("nesterov") else m)
        else:
            b1, b2 = 0.9, 0.999
            if kind == "adam":
                g = g + kw.get("weight_decay", 0) * p
            else:
                p = p * (1 - lr * kw["weight_decay"])
            m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
            p = p - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + 1e-8)
    return p


@pytest.mark.parametrize(
    ("kind", "make", "kw"),
    [
        ("sgd", lambda: ml.SGD(0.05, momentum=0.9), {"momentum": 0.9}),
        ("sgd", lambda: ml.SGD(0.05, momentum=0.5, nesterov=True, weight_decay=0.1),
         {"momentum": 0.5, "nesterov": True, "weight_decay": 0.1}),
        ("sgd", lambda: ml.SGD(0.05), {"momentum": 0.0}),
        ("adam", lambda: ml.Adam(0.01, weight_decay=0.05), {"weight_decay": 0.05}),
        ("adamw", lambda: ml.AdamW(0.01, weight_decay=0.2), {"weight_decay": 0.2}),
    ],
)  # fmt: skip
def test_optimizers_follow_their_update_rules(s, kind, make, kw):
    p0 = RNG.standard_normal((3, 2))
    grads = [RNG.standard_normal((3, 2)) for _ in range(4)]
    opt = make()
    params = [s.from_numpy(p0)]
    for g in grads:
        params = opt.step(params, [s.from_numpy(g)])
    want = _reference(kind, p0, grads, opt.lr, **kw)
    np.testing.assert_allclose(params[0].numpy(), want, rtol=1e-12, atol=1e-14)
    assert all(isinstance(v, ts.TensorRelation) for st in opt.state for v in st.values())


def test_optimizer_errors(s):
    with pytest.raises(ts.ConfigError, match="SGD: lr must be a finite number"):
        ml.SGD("fast")
    with pytest.raises(ts.ConfigError, match=r"Adam: betas must be below 1"):
        ml.Adam(betas=(1.0, 0.9))
    with pytest.raises(ts.ConfigError, match="nesterov needs momentum"):
        ml.SGD(0.1, nesterov=True)
    with pytest.raises(ts.ShapeError, match=r"parameter 0 has shape \(2,\), its gradient \(3,\)"):
        ml.SGD(0.1).step([s.from_numpy(np.zeros(2))], [s.from_numpy(np.zeros(3))])


# ---- training from a table ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def separable(s):
    n, f = 1200, 4
    x = RNG.standard_normal((n, f))
    w = np.array([1.5, -2.0, 0.5, 1.0])
    y = (x @ w + 0.2 > 0).astype(np.int32)
    x += 0.15 * np.sign(x @ w + 0.2)[:, None] * w / np.linalg.norm(w)  # a margin: separable
    table(s, "points", {**{f"f{i}": x[:, i] for i in range(f)}, "label": y})
    return x, y


def test_logistic_regression_separates_a_separable_table(s, separable):
    x, y = separable
    model = ml.LogisticRegression(s, 4, dtype="float64")
    hist = ml.fit(model, "points", ["f0", "f1", "f2", "f3"], "label", epochs=4, batch_size=300,
                  optimizer=ml.Adam(0.2), progress=False)  # fmt: skip
    assert hist.ran == 4 and hist.losses[-1] < hist.losses[0]
    accuracy = ((model.predict(x).numpy() > 0.5) == y).mean()
    assert accuracy >= 0.99, accuracy


def test_cached_and_streamed_rows_train_alike(s, separable, monkeypatch):
    """Rows kept in memory (cache=True) and rows read back from DuckDB each epoch (cache=False, a chunk of
    whole batches per query) come in the same shuffled order: the same losses and weights; the order
    changes per epoch and with the seed, and no temporary table is left behind."""
    feats = ["f0", "f1", "f2", "f3"]
    # 1000 rows' bytes: chunks of 2 whole batches of 350 (700 rows), 2 queries an epoch, not 1000-row reads
    monkeypatch.setattr(train, "READ_BYTES", 1000 * 5 * 8)
    sizes = []
    real = train.Stepper.step

    def step(self, x, y):
        sizes.append(len(y))
        return real(self, x, y)

    monkeypatch.setattr(train.Stepper, "step", step)
    read = type(s.executor).read_batches  # the cache fills from record batches of 97 rows
    monkeypatch.setattr(type(s.executor), "read_batches", lambda self, b, c, rows=0: read(self, b, c, 97))
    runs = {}
    for cache, seed in ((True, 0), (False, 0), (True, 1)):
        model = ml.LogisticRegression(s, 4, dtype="float64")
        hist = ml.fit(model, "points", feats, "label", epochs=3, batch_size=350, optimizer=ml.SGD(0.3),
                      seed=seed, cache=cache, progress=False)  # fmt: skip
        runs[cache, seed] = hist.losses, model.weights()["W"]
    assert sizes == [350, 350, 350, 150] * 9  # whole batches, both ways, the short one last
    np.testing.assert_allclose(runs[True, 0][0], runs[False, 0][0], rtol=1e-13)
    np.testing.assert_allclose(runs[True, 0][1], runs[False, 0][1], rtol=1e-13)
    assert not np.allclose(runs[True, 0][1], runs[True, 1][1], rtol=1e-6)  # another seed, another order
    assert not [t for (t,) in s.execute("SELECT table_name FROM duckdb_tables()") if t.startswith("_ts_fit")]
    with pytest.raises(ts.ConfigError, match="cache must be True, False or None"):
        ml.fit(ml.LogisticRegression(s, 4), "points", feats, "label", cache="yes", progress=False)


@pytest.mark.parametrize("threads", [2, 3])
def test_batches_gathered_by_several_threads_are_the_same(separable, threads, monkeypatch):
    """With several threads a big batch is gathered by a pool, the next one while the caller steps on this
    one, and the next epoch's order is sorted meanwhile: the same rows in the same order as one thread gives,
    so training goes bit for bit the same; the threads end with the run."""
    feats = ["f0", "f1", "f2", "f3"]
    x, y = separable
    runs = []
    real = train._Cached.epoch
    with ts.connect(threads=threads) as s2:
        table(s2, "points", {**{f"f{i}": x[:, i] for i in range(4)}, "label": y})
        for split in (1 << 60, 1):  # never pooled nor sorted ahead; every batch pooled, every order ahead
            monkeypatch.setattr(train, "GATHER_SPLIT_BYTES", split)
            monkeypatch.setattr(train, "SORT_AHEAD_ROWS", split)
            seen = []

            def epoch(self, seed, epoch, then=None, seen=seen):
                for xb, yb in real(self, seed, epoch, then):
                    seen.append((self.pool is not None, xb.copy(), yb.copy()))
                    yield xb, yb

            monkeypatch.setattr(train._Cached, "epoch", epoch)
            model = ml.LogisticRegression(s2, 4, dtype="float64")
            hist = ml.fit(model, "points", feats, "label", epochs=3, batch_size=250, optimizer=ml.Adam(0.1),
                          progress=False)  # fmt: skip
            runs.append((hist.losses, model.weights()["W"], seen))
            names = [t.name for t in threading.enumerate()]
            assert not [n for n in names if n.startswith(("tensorsql-gather", "tensorsql-shuffle"))]
    (l1, w1, g1), (l2, w2, g2) = runs
    assert [len(b) for _, b, _ in g1] == [250, 250, 250, 250, 200] * 3
    assert not any(pooled for pooled, _, _ in g1) and all(pooled for pooled, _, _ in g2)
    for (_, a, ya), (_, b, yb) in zip(g1, g2, strict=True):
        assert a.tobytes() == b.tobytes() and ya.tobytes() == yb.tobytes()
    assert l1 == l2 and w1.tobytes() == w2.tobytes()


def test_next_epoch_order_sorted_meanwhile(separable, monkeypatch):
    """The next epoch's order, sorted on a thread of its own while this epoch runs, is the order sorted when
    its epoch starts; an epoch other than the announced one gets its own order; a run that ends with a sort
    under way (an error mid-epoch) waits for it and leaves no thread behind."""
    from sqlglot import exp

    monkeypatch.setattr(train, "GATHER_SPLIT_BYTES", 1)
    monkeypatch.setattr(train, "SORT_AHEAD_ROWS", 1)
    x, y = separable
    with ts.connect(threads=2) as s2:
        table(s2, "points", {**{f"f{i}": x[:, i] for i in range(4)}, "label": y})
        feats = ["f0", "f1", "f2", "f3"]
        model = ml.LogisticRegression(s2, 4, dtype="float64")
        probe = exp.select(exp.Star()).from_("points")
        rows = train._Cached(s2.local_executor, probe, feats, "label", model, len(y), 300)

        def epoch(e, then=None):
            return [(a.copy(), b.copy()) for a, b in rows.epoch(7, e, then)]

        def raw(batches):
            return [a.tobytes() + b.tobytes() for a, b in batches]

        try:
            first = epoch(0, then=1)
            assert rows.next is not None and rows.next[0] == (7, 1)
            meanwhile, alone = epoch(1), epoch(1)
            assert rows.next is None
            epoch(2, then=3)
            other, alone5 = epoch(5), epoch(5)  # epoch 3's order was sorted, epoch 5 asked for
            for got, want in ((meanwhile, alone), (other, alone5)):
                assert raw(got) == raw(want)
            assert sorted(np.concatenate([b for _, b in first]).tolist()) == sorted(y.tolist())
            assert first[0][0].tobytes() != meanwhile[0][0].tobytes()  # another epoch, another order
            real = train._Cached._sort

            def slow(self, seed, epoch):
                time.sleep(0.3)
                return real(self, seed, epoch)

            monkeypatch.setattr(train._Cached, "_sort", slow)
            batches = rows.epoch(7, 8, then=9)
            next(batches)
        finally:
            rows.close()
        assert rows.next is None and rows.shuffler is None
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith(("tensorsql-gather", "tensorsql-shuffle"))]


def test_epoch_keys_in_numpy_and_sql_agree():
    """Rows kept in memory are ordered by numpy, rows streamed by DuckDB: both compute the same key of every
    hash (the extremes of the word included) for any seed and epoch, negative and beyond 64 bits too; the key
    is a bijection of the hash, so distinct rows never tie."""
    import duckdb
    from sqlglot import exp

    rng = np.random.default_rng(5)
    h = rng.integers(0, 2**64 - 1, size=2000, dtype=np.uint64, endpoint=True)
    h[:4] = [0, 1, 2**63, 2**64 - 1]
    con = duckdb.connect()
    con.register("hs", pa.table({"h": h}))
    for seed, epoch in ((0, 0), (7, 1), (-3, 12), (2**70 + 5, 2**40)):
        query = exp.select(exp.alias_(train._epoch_key_sql(exp.column("h"), seed, epoch), "k")).from_("hs")
        got = con.sql(query.sql("duckdb")).fetchnumpy()["k"]
        want = train._epoch_keys(h, seed, epoch)
        assert got.dtype == np.uint64 and np.array_equal(got, want)
        assert len(np.unique(want)) == len(np.unique(h))
    assert not np.array_equal(train._epoch_keys(h, 0, 0), train._epoch_keys(h, 0, 1))
    con.close()


def test_mlp_full_batch_steps_match_numpy_by_hand(s):
    """Full-batch gradient descent (one batch per epoch: the row order cannot matter) against the same
    network written out in numpy, from the same initial weights."""
    n = 40
    x = RNG.standard_normal((n, 3))
    y = RNG.integers(0, 3, n)
    table(s, "mlp_rows", {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "y": y})
    model = ml.MLP(s, [3, 5, 3], dtype="float64", seed=4)
    w = model.weights()
    hist = ml.fit(model, "SELECT a, b, c, y FROM mlp_rows", label="y", epochs=5, batch_size=n,
                  optimizer=ml.SGD(0.5), progress=False)  # fmt: skip
    W0, b0, W1, b1 = w["W0"], w["b0"], w["W1"], w["b1"]
    onehot = np.eye(3)[y]
    losses = []
    for _ in range(5):
        h_pre = x @ W0 + b0
        h = np.maximum(h_pre, 0)
        z = h @ W1 + b1
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        losses.append(-(onehot * np.log(p)).sum() / n)
        dz = (p - onehot) / n
        dW1, db1 = h.T @ dz, dz.sum(0)
        dh = dz @ W1.T * (h_pre > 0)
        dW0, db0 = x.T @ dh, dh.sum(0)
        W0, b0, W1, b1 = W0 - 0.5 * dW0, b0 - 0.5 * db0, W1 - 0.5 * dW1, b1 - 0.5 * db1
    np.testing.assert_allclose(hist.losses, losses, rtol=1e-10)
    got = model.weights()
    for k, want in (("W0", W0), ("b0", b0), ("W1", W1), ("b1", b1)):
        np.testing.assert_allclose(got[k], want, rtol=1e-9, atol=1e-12)


def test_a_stopped_run_resumes_from_its_checkpoint(s, separable, monkeypatch):
    feats = ["f0", "f1", "f2", "f3"]

    def run(checkpoint, epochs, stop_at=None):
        model = ml.SoftmaxRegression(s, 4, 2, dtype="float64", seed=1)
        opt = ml.Adam(0.05)
        if stop_at is not None:  # Ctrl-C in the middle of a step
            real, calls = train.Stepper.step, []

            def step(self, x, y):
                calls.append(1)
                if len(calls) == stop_at:
                    raise KeyboardInterrupt
                return real(self, x, y)

            monkeypatch.setattr(train.Stepper, "step", step)
        try:
            hist = ml.fit(model, "points", feats, "label", epochs=epochs, batch_size=500, optimizer=opt,
                          checkpoint=checkpoint, progress=False)  # fmt: skip
            return model, hist
        finally:
            monkeypatch.undo()

    whole, hist = run("ck_whole", 3)
    with pytest.raises(KeyboardInterrupt):
        run("ck_stopped", 3, stop_at=7)  # 3 batches an epoch: stopped in the third epoch
    resumed, again = run("ck_stopped", 3)
    assert again.resumed_after == 2 and again.ran == 1 and len(again.losses) == 3
    np.testing.assert_allclose(again.losses, hist.losses, rtol=1e-12)
    for k in ("W", "b"):
        np.testing.assert_allclose(resumed.weights()[k], whole.weights()[k], rtol=1e-12)
    assert not any(t.startswith("ck_stopped__e1__") for t in s.tables())  # the older epoch was dropped


def test_save_and_load(s, separable):
    x, _ = separable
    model = ml.MLP(s, [4, 3, 2], activation="tanh", dtype="float64", seed=2)
    model.save("saved_mlp")
    back = ml.load(s, "saved_mlp")
    assert isinstance(back, ml.MLP) and back.activation == "tanh"
    np.testing.assert_allclose(back.predict(x).numpy(), model.predict(x).numpy(), rtol=1e-12)
    with pytest.raises(ts.TableNotFoundError, match="no saved model 'nope'"):
        ml.load(s, "nope")
    for bad in ("", 123, "_ts_model"):
        with pytest.raises(ts.TensorSQLError, match="save model: "):
            model.save(bad)
    for name, kind, config, match in [
        ("broken1", "linear_regression", '{"dtype": "float64"}', "no field 'n_features'"),
        ("broken2", "linear_regression", "{", "Expecting property name"),
        ("broken3", "mlp", "[1]", "corrupted"),
        ("broken4", "xx", "{}", "unknown kind 'xx'"),
    ]:
        s.execute(f"INSERT INTO tensorsql_models VALUES ('{name}', '{kind}', '{config}')")
        with pytest.raises(ts.CatalogError, match=f"saved model '{name}'.*{match}"):
            ml.load(s, name)


def test_a_foreign_models_table_stops_a_save_before_its_weights(tmp_path):
    with ts.connect(str(tmp_path / "foreign.duckdb")) as s:
        s.execute("CREATE TABLE tensorsql_models (id INTEGER)")
        with pytest.raises(ts.TensorSQLError):
            ml.LinearRegression(s, 2).save("lin")
        assert not any(t.startswith("lin__") for t in s.tables())


def test_fit_errors(s, separable):
    table(s, "words", {"f0": [1.0, 2.0], "name": ["a", "b"], "label": [0, 1]})
    table(s, "holes", {"f0": [1.0, None], "label": [0, 1]})
    model = ml.LogisticRegression(s, 1, dtype="float64")
    with pytest.raises(ts.ConfigError, match=r"no label column 'y' in the source"):
        ml.fit(model, "points", ["f0"], "y", progress=False)
    with pytest.raises(ts.ConfigError, match=r"no feature column 'f9'"):
        ml.fit(model, "points", ["f9"], "label", progress=False)
    with pytest.raises(ts.DTypeError, match="fit: column 'name' has type VARCHAR"):
        ml.fit(model, "words", ["name"], "label", progress=False)
    with pytest.raises(ts.ConfigError, match="fit: the query does not parse"):
        ml.fit(model, "SELECT f0, FROM WHERE", label="label", progress=False)
    with pytest.raises(ts.ConfigError, match="a TransformerBlock maps a sequence to a sequence"):
        ml.fit(ml.TransformerBlock(s, 4, 2, 8), "points", ["f0", "f1", "f2", "f3"], "label", progress=False)
    with pytest.raises(ts.ConfigError, match=r"column 'f0' has NULLs"):
        ml.fit(model, "holes", ["f0"], "label", progress=False)
    with pytest.raises(ts.ConfigError, match="4 feature columns for a model of 1 features"):
        ml.fit(model, "points", ["f0", "f1", "f2", "f3"], "label", progress=False)
    with pytest.raises(ts.ConfigError, match="epochs must be a positive int"):
        ml.fit(model, "points", ["f0"], "label", epochs=0)
    softmax = ml.SoftmaxRegression(s, 1, 2)
    with pytest.raises(ts.ConfigError, match=r"labels must be class ids 0\.\.1"):
        ml.fit(softmax, "SELECT f0, CAST(round(f1 * 10) AS INTEGER) AS label FROM points", label="label",
               progress=False)  # fmt: skip
    with pytest.raises(ts.ConfigError, match=r"labels must be class ids \(integers\)"):
        ml.fit(softmax, "SELECT f0, f1 AS label FROM points", label="label", progress=False)


def test_fit_label_and_feature_checks(s):
    """Labels a loss cannot take are ConfigErrors; labels of any numeric SQL type a class id can be read
    from train; NaN and infinities are refused like NULLs (they made every weight NaN)."""
    x = np.linspace(-1, 1, 40)
    y = (x > 0).astype(np.int32)
    table(s, "labels", {"a": x, "y": y, "pm": np.where(x > 0, 1, -1), "big": y * 3})
    logistic = ml.LogisticRegression(s, 1, dtype="float64")
    for col in ("pm", "big"):
        with pytest.raises(ts.ConfigError, match=r"labels must be 0/1 classes or probabilities in \[0, 1\]"):
            ml.fit(logistic, "labels", ["a"], col, epochs=1, progress=False)
    casts = ("y = 1", "y::DECIMAL(18, 0)", "y::HUGEINT", "y::UTINYINT", "y::DOUBLE")
    losses = []
    for cast in casts:  # one batch of all rows: the shuffle hashes the label's value, not its class
        query = f"SELECT a, {cast} AS label FROM labels"
        model = ml.SoftmaxRegression(s, 1, 2, dtype="float64")
        losses.append(ml.fit(model, query, label="label", epochs=2, batch_size=40, progress=False).losses)
        model = ml.LogisticRegression(s, 1, dtype="float64")
        ml.fit(model, query, label="label", epochs=1, batch_size=8, progress=False)
    np.testing.assert_allclose(losses, [losses[0]] * len(casts), rtol=1e-12)  # the same classes
    s.execute("CREATE OR REPLACE TABLE odd AS SELECT a, y FROM labels")
    s.execute("UPDATE odd SET a = 'nan'::DOUBLE WHERE y = 1 AND a > 0.9")
    for cache in (True, False):
        with pytest.raises(ts.ConfigError, match=r"column 'a' has nan \(features and labels must be finite"):
            ml.fit(logistic, "odd", ["a"], "y", epochs=1, cache=cache, progress=False)
        with pytest.raises(ts.ConfigError, match=r"column 'y' has inf"):
            ml.fit(ml.LinearRegression(s, 1, dtype="float64"), "SELECT a, 'inf'::DOUBLE AS y FROM labels",
                   label="y", epochs=1, cache=cache, progress=False)  # fmt: skip
        assert ml.fit(logistic, "labels", ["a"], "y", epochs=1, cache=cache, progress=False).losses  # usable
    with pytest.raises(ts.ConfigError, match=r"columns .* repeat a name"):
        ml.fit(ml.LogisticRegression(s, 2), "labels", ["a", "A"], "y", progress=False)
    with pytest.raises(ts.ConfigError, match="seed must be a non-negative int"):
        ml.fit(logistic, "labels", ["a"], "y", seed=-1, progress=False)
    h = ml.fit(logistic, "labels", ["a"], "y", epochs=np.int64(1), batch_size=np.int32(8), seed=np.uint8(3),
               progress=False)  # fmt: skip
    assert len(h.losses) == 1
    adam = ml.Adam(0.1)
    ml.fit(logistic, "labels", ["a"], "y", epochs=1, optimizer=adam, progress=False)
    with pytest.raises(ts.ConfigError, match=r"optimizer holds state for parameters of shapes .* \(an"):
        ml.fit(ml.MLP(s, [1, 3, 2]), "labels", ["a"], "y", epochs=1, optimizer=adam, progress=False)


def test_fit_reads_a_changing_query_once(s):
    """random() rows: counted in one read and gathered in another, the cached read refused them (and a read
    with fewer rows than counted would have trained on rows never written)."""
    x = np.linspace(-1, 1, 400)
    table(s, "halves", {"a": x, "y": (x > 0).astype(np.int32)})

    def temporary() -> set[str]:  # (another test's garbage may still hold its own until collected)
        return {t for (t,) in s.execute("SELECT table_name FROM duckdb_tables() WHERE temporary")}

    before = temporary()
    for cache in (True, False):
        model = ml.LogisticRegression(s, 1, dtype="float64")
        h = ml.fit(model, "SELECT * FROM halves WHERE random() < 0.5", label="y", epochs=2, batch_size=16,
                   cache=cache, progress=False)  # fmt: skip
        assert len(h.losses) == 2 and all(np.isfinite(h.losses))
    assert temporary() <= before  # fit's snapshot and epoch tables are gone


@pytest.mark.parametrize("cache", [True, False])
def test_columns_named_like_fits_own_helper_columns(s, cache, monkeypatch):
    """A source column named as a helper column of the shuffle (``_ts_pos``, ``_ts_hash``) or of
    ``from_table`` (``_ts_row``) is a column like any other: every row trained on, in the right order."""
    n = 20
    x = np.arange(n) * 0.1
    y = (np.arange(n) % 2).astype(np.int32)
    table(s, "clash", {"_ts_pos": x - 1.0, "_ts_hash": x, "_TS_ROW": -x, "y": y})
    seen, real = [], train.Stepper.step
    monkeypatch.setattr(train.Stepper, "step", lambda me, a, b: seen.append(np.array(a)) or real(me, a, b))
    model = ml.LogisticRegression(s, 3, dtype="float64")
    ml.fit(model, "clash", ["_ts_pos", "_ts_hash", "_TS_ROW"], "y", epochs=1, batch_size=8, cache=cache,
           progress=False)  # fmt: skip
    rows = np.concatenate(seen)
    assert len(rows) == n
    np.testing.assert_allclose(np.sort(rows[:, 1]), x, rtol=1e-15)
    np.testing.assert_allclose(rows[:, 0], rows[:, 1] - 1.0, rtol=1e-15)
    np.testing.assert_allclose(rows[:, 2], -rows[:, 1], rtol=1e-15)
    got = s.from_table("SELECT _ts_hash, _ts_pos, _TS_ROW FROM clash", rows_by="_ts_hash").numpy()
    np.testing.assert_allclose(got, np.stack([x - 1.0, -x], axis=1), rtol=1e-15)


def test_column_names_match_as_duckdb_matches_them(s, separable):
    """Case-insensitively, as in SQL: ``F0`` is the column ``f0``."""
    x, _ = separable
    a, b = ml.LogisticRegression(s, 2, dtype="float64"), ml.LogisticRegression(s, 2, dtype="float64")
    ha = ml.fit(a, "points", ["f0", "f1"], "label", epochs=1, batch_size=400, progress=False)
    hb = ml.fit(b, "points", ["F0", "f1"], "LABEL", epochs=1, batch_size=400, progress=False)
    assert ha.losses == hb.losses
    got = s.from_table("SELECT f0, F1 FROM points", columns=["F0", "f1"]).numpy()
    np.testing.assert_array_equal(got, x[:, :2])


def test_mse_against_integer_predictions_keeps_float_targets(s):
    pred = s.from_numpy(np.arange(3))
    np.testing.assert_allclose(ml.mse(pred, np.full(3, 0.5)).numpy(), np.mean((np.arange(3) - 0.5) ** 2))
    assert ml.mse(s.from_numpy(np.arange(3.0, dtype=np.float32)), np.full(3, 0.5)).dtype == "float32"


def test_bad_model_arguments_are_typed_errors(s):
    for seed in ("1", 1.5, -1, True):
        with pytest.raises(ts.ConfigError, match="seed must be a non-negative int"):
            ml.LinearRegression(s, 2, seed=seed)
    model = ml.LinearRegression(s, 2, dtype="float64", seed=np.int64(3))
    with pytest.raises(ts.ConfigError, match=r"model must be a tensorsql\.ml model"):
        ml.fit("model", "points", ["f0"], "label", progress=False)
    with pytest.raises(ts.ShapeError, match=r"set_params takes 2 weights \('W', 'b'\), got 1"):
        model.set_params([s.from_numpy(np.zeros(2))])
    with pytest.raises(ts.DTypeError, match=r"W must be float64 .* got int64"):
        model.set_params([s.from_numpy(np.zeros(2, dtype=np.int64)), s.from_numpy(np.array(0.0))])
    model.set_params([np.array([1.0, 2.0]), 0.5])  # arrays are uploaded
    assert model.weights()["W"].tolist() == [1.0, 2.0] and model.weights()["b"] == 0.5
    with pytest.raises(ts.DTypeError, match="weight W must be numbers, got str"):
        model.set_params(["ab", 0.5])
    with pytest.raises(ts.ConfigError, match="set_params takes a list of weights"):
        model.set_params("W")
    with pytest.raises(ts.DTypeError, match="features must be numbers, got an array of <U1"):
        model.predict(np.array([["a", "b"]]))
    opt = ml.Adam(0.1)
    opt.step([s.from_numpy(np.ones((3, 2)))], [s.from_numpy(np.ones((3, 2)))])
    with pytest.raises(ts.ShapeError, match=r"parameter 0 has shape \(1, 2\), but the optimizer's 'm'"):
        opt.step([s.from_numpy(np.ones((1, 2)))], [s.from_numpy(np.ones((1, 2)))])


@pytest.mark.parametrize(
    ("model", "optimizer", "match"),
    [
        ("logistic64", ml.Adam(0.1), "with SGD; this fit trains .* with Adam keeping m, v"),
        ("logistic64", ml.SGD(0.1, momentum=0.9), "with SGD; this fit trains .* with SGD keeping velocity"),
        ("logistic32", ml.SGD(0.1), "a float64 logistic_regression .*; this fit trains a float32"),
        ("linear64", ml.SGD(0.1), "logistic_regression .*; this fit trains a float64 linear_regression"),
        ("logistic64x3", ml.SGD(0.1), r"\{'n_features': 4\} .*; this fit trains .*\{'n_features': 3\}"),
    ],
)
def test_a_checkpoint_of_another_model_or_optimizer_is_a_config_error(s, separable, model, optimizer, match):
    """The progress row keeps what it was written for; the tables alone missed Adam -> AdamW, momentum ->
    none, one model kind -> another of the same weights."""
    feats = ["f0", "f1", "f2", "f3"]
    ml.fit(ml.LogisticRegression(s, 4, dtype="float64"), "points", feats, "label", epochs=1, batch_size=600,
           optimizer=ml.SGD(0.1), checkpoint="ck_sgd", progress=False)  # fmt: skip
    other = {
        "logistic64": lambda: ml.LogisticRegression(s, 4, dtype="float64"),
        "logistic32": lambda: ml.LogisticRegression(s, 4),
        "linear64": lambda: ml.LinearRegression(s, 4, dtype="float64"),
        "logistic64x3": lambda: ml.LogisticRegression(s, 3, dtype="float64"),
    }[model]()
    cols = feats[: other.features]
    with pytest.raises(ts.ConfigError, match=r"checkpoint 'ck_sgd' \(epoch 1\) was written for .*" + match):
        ml.fit(other, "points", cols, "label", epochs=2, batch_size=600, optimizer=optimizer,
               checkpoint="ck_sgd", progress=False)  # fmt: skip
    before = set(s.tables())  # a new learning rate resumes
    ml.fit(ml.LogisticRegression(s, 4, dtype="float64"), "points", feats, "label", epochs=2, batch_size=600,
           optimizer=ml.SGD(0.2), checkpoint="ck_sgd", progress=False)  # fmt: skip
    assert "ck_sgd__e2__W" in set(s.tables()) - before
    s.drop("ck_sgd__e2__W")
    s.drop("ck_sgd__e2__b")
    s.execute("DROP TABLE ck_sgd__progress")


def test_scoring_in_sql_equals_the_model(s, separable):
    """A saved model scores new rows with one statement (``predict`` in ``s.sql``), INSERT ... SELECT too."""
    x, _ = separable
    ids = np.arange(len(x))[::-1] * 7 + 1000
    table(s, "new_rows", {"id": ids, **{f"f{i}": x[:, i] for i in range(4)}})
    logistic = ml.LogisticRegression(s, 4, dtype="float64")
    logistic.set_params([s.from_numpy(np.array([1.0, -2.0, 0.5, 0.25])), s.from_numpy(np.array(0.1))])
    logistic.save("scorer")
    got = s.sql("SELECT * FROM predict('scorer', (SELECT id, f0, f1, f2, f3 FROM new_rows), key => 'id')")
    want = dict(zip(ids.tolist(), logistic.predict(x).numpy().tolist(), strict=True))
    rows = got.fetchall()
    assert len(rows) == len(x)
    for key, p in rows:
        assert abs(p - want[key]) <= 1e-12
    mlp = ml.MLP(s, [4, 3, 2], dtype="float64", seed=5)
    mlp.save("scorer_mlp")
    s.execute("CREATE OR REPLACE TABLE predictions (id BIGINT, class BIGINT, prediction DOUBLE)")
    s.sql("INSERT INTO predictions SELECT * FROM predict('scorer_mlp', (FROM new_rows), key => 'id')")
    probs = mlp.predict(x).numpy()
    stored = s.execute("SELECT id, class, prediction FROM predictions")
    assert len(stored) == probs.size
    where = {k: i for i, k in enumerate(ids.tolist())}
    for key, cls, p in stored:
        assert abs(p - probs[where[key], cls]) <= 1e-12
    with pytest.raises(ts.TableNotFoundError, match=r"predict\('nope'.*no saved model 'nope'"):
        s.sql("SELECT * FROM predict('nope', (SELECT * FROM new_rows), key => 'id')")
    with pytest.raises(ts.SQLFrontendError, match=r"gives 2 feature columns .* takes 4"):
        s.sql("SELECT * FROM predict('scorer', (SELECT id, f0, f1 FROM new_rows), key => 'id')")
    with pytest.raises(ts.SQLFrontendError, match="predict takes"):
        s.sql("SELECT * FROM predict('scorer', (SELECT * FROM new_rows))")
    with pytest.raises(ts.SQLFrontendError, match="no key column 'nope'"):
        s.sql("SELECT * FROM predict('scorer', (SELECT * FROM new_rows), key => 'nope')")


@pytest.mark.parametrize("now", [True, False])
def test_scoring_in_sql_now_or_inside_duckdb(s, separable, monkeypatch, now):
    """Features that fit in memory are scored from one read of the rows (``now``); more (``PREDICT_BYTES``
    lowered here) are made into a matrix inside DuckDB: the same rows either way. A model saved again, or
    its weight table changed in place, scores with what is stored now; a NULL feature is an error naming
    the column and the row's key."""
    from tensorsql.frontend import sql as sqlfront

    if not now:
        monkeypatch.setattr(sqlfront, "PREDICT_BYTES", 0)
    x, _ = separable
    ids = np.arange(len(x)) * 3 + 5
    table(s, "score_rows", {"id": ids, **{f"f{i}": x[:, i] for i in range(4)}})
    model = ml.SoftmaxRegression(s, 4, 3, dtype="float64", seed=2)
    model.save("score3")
    query = "SELECT * FROM predict('score3', (SELECT id, f0, f1, f2, f3 FROM score_rows), key => 'id')"

    def check(m):
        probs = m.predict(x).numpy()
        rows = s.sql(query).fetchall()
        assert len(rows) == probs.size
        where = {k: i for i, k in enumerate(ids.tolist())}
        for key, cls, p in rows:
            assert abs(p - probs[where[key], cls]) <= 1e-12

    check(model)
    check(model)  # the model loaded once, validated again
    again = ml.SoftmaxRegression(s, 4, 3, dtype="float64", seed=9)
    again.save("score3")  # saved again: other weights
    check(again)
    w = np.array(again.weights()["W"]) * 2
    s.execute(f"UPDATE score3__W SET tensor = {_blob_literal(w)}")  # the weights changed in place
    changed = ml.SoftmaxRegression(s, 4, 3, dtype="float64")
    changed.set_params([w, again.weights()["b"]])
    check(changed)
    views = {v for (v,) in s.execute("SELECT view_name FROM duckdb_views() WHERE temporary")}
    table(s, "score_nulls", {"id": ids[:3], "f0": [1.0, None, 2.0], "f1": [0.0] * 3, "f2": [0.0] * 3,
                             "f3": [0.0] * 3})  # fmt: skip
    with pytest.raises(ts.TensorSQLError, match=r"column 'f0' is NULL in row"):
        s.sql("SELECT * FROM predict('score3', (FROM score_nulls), key => 'id')").fetchall()
    import gc

    gc.collect()
    assert {v for (v,) in s.execute("SELECT view_name FROM duckdb_views() WHERE temporary")} <= views


def _blob_literal(a: np.ndarray) -> str:
    return "'" + "".join(f"\\x{b:02x}" for b in a.astype(np.float64).tobytes()) + "'::BLOB"


def test_fit_reads_a_table_in_a_schema(s, separable):
    x, y = separable
    s.execute('CREATE SCHEMA IF NOT EXISTS "Train Data"')
    table(s, "schema_rows", {**{f"f{i}": x[:, i] for i in range(4)}, "label": y})
    s.execute('CREATE OR REPLACE TABLE "Train Data".rows AS SELECT * FROM schema_rows')
    feats = [f"f{i}" for i in range(4)]
    here = ml.LogisticRegression(s, 4, dtype="float64", seed=3)
    there = ml.LogisticRegression(s, 4, dtype="float64", seed=3)
    for model, source in ((here, "schema_rows"), (there, '"Train Data".rows')):
        ml.fit(model, source, feats, "label", epochs=2, batch_size=256, optimizer=ml.SGD(0.1), seed=1,
               progress=False)  # fmt: skip
    ours, theirs = here.weights(), there.weights()
    assert ours.keys() == theirs.keys()
    for name, value in ours.items():
        np.testing.assert_array_equal(value, theirs[name])


def test_model_names_in_another_case_are_the_same_model(s):
    """DuckDB's table names fold case: "Churn" and "churn" shared weight tables, and loading one gave the
    other's weights."""
    a = ml.LogisticRegression(s, 2, dtype="float64")
    a.set_params([s.from_numpy(np.array([1.0, 2.0])), s.from_numpy(np.array(0.5))])
    a.save("Churn")
    b = ml.LogisticRegression(s, 2, dtype="float64")
    b.set_params([s.from_numpy(np.array([-7.0, 9.0])), s.from_numpy(np.array(0.0))])
    b.save("churn")  # the same model, saved again
    rows = s.execute("SELECT name FROM tensorsql_models WHERE lower(name) = 'churn'")
    assert rows == [("churn",)]
    for name in ("Churn", "CHURN"):
        np.testing.assert_array_equal(ml.load(s, name).weights()["W"], [-7.0, 9.0])


def test_saving_a_model_inside_the_users_transaction_keeps_it(s):
    """A save's own BEGIN inside the user's failed and aborted it, and its ROLLBACK ended the user's
    transaction: the user's writes were lost. A save is now part of the user's transaction."""
    s.execute("CREATE OR REPLACE TABLE audit (x INTEGER)")
    model = ml.LinearRegression(s, 3, dtype="float64", seed=4)
    s.execute("BEGIN")
    s.execute("INSERT INTO audit VALUES (1)")
    model.save("in_txn")
    s.execute("COMMIT")
    assert s.execute("SELECT * FROM audit") == [(1,)]
    np.testing.assert_array_equal(ml.load(s, "in_txn").weights()["W"], model.weights()["W"])
    s.execute("BEGIN")
    model.save("rolled_back")
    s.execute("ROLLBACK")  # the user's rollback takes the save with it
    with pytest.raises(ts.TableNotFoundError, match="no saved model 'rolled_back'"):
        ml.load(s, "rolled_back")


def test_lookups_inside_the_users_transaction_do_not_abort_it(tmp_path):
    """fit's checkpoint and ml.load read tables that may not exist yet: a failed read inside the user's
    transaction aborted it, and its COMMIT then kept none of the user's writes."""
    s = ts.connect(str(tmp_path / "tx.duckdb"))
    x = np.linspace(-1, 1, 32)
    table(s, "rows", {"a": x, "y": (x > 0).astype(np.int32)})
    s.execute("CREATE TABLE audit (x INTEGER)")
    s.execute("BEGIN")
    s.execute("INSERT INTO audit VALUES (1)")
    with pytest.raises(ts.TableNotFoundError, match="no saved model 'churn'"):
        ml.load(s, "churn")  # "load, or else train"
    model = ml.LogisticRegression(s, 1, dtype="float64")
    ml.fit(model, "rows", ["a"], "y", epochs=1, batch_size=8, checkpoint="ck", progress=False)
    model.save("churn")
    s.execute("INSERT INTO audit VALUES (2)")
    s.execute("COMMIT")
    trained = model.weights()["W"]
    s.close()
    with ts.connect(str(tmp_path / "tx.duckdb")) as again:
        assert again.execute("SELECT x FROM audit ORDER BY x") == [(1,), (2,)]
        np.testing.assert_array_equal(ml.load(again, "churn").weights()["W"], trained)
        assert {"ck__e1__W", "ck__e1__b"} <= set(again.tables())


def test_scoring_a_sampled_query_keeps_each_row_with_its_key(s, separable):
    """The query is read once: with USING SAMPLE, a key read apart from its features was another row's."""
    x, _ = separable
    table(s, "sampled_rows", {"id": np.arange(len(x)), **{f"f{i}": x[:, i] for i in range(4)}})
    model = ml.LogisticRegression(s, 4, dtype="float64")
    model.set_params([s.from_numpy(np.array([1.0, -2.0, 0.5, 0.25])), s.from_numpy(np.array(0.1))])
    model.save("sample_scorer")
    want = model.predict(x).numpy()
    query = "SELECT id, f0, f1, f2, f3 FROM sampled_rows USING SAMPLE 10 ROWS"
    for _ in range(3):
        rows = s.sql(f"SELECT * FROM predict('sample_scorer', ({query}), key => 'id')").fetchall()
        assert len(rows) == 10
        for key, p in rows:
            assert abs(p - want[key]) <= 1e-12


def _block_reference(w, x, heads, causal=True):
    """The LLaMA-shaped pre-norm block in numpy: RMSNorm, causal multi-head attention, ReLU MLP."""

    def rms(v, g):
        return v / np.sqrt((v * v).mean(1, keepdims=True) + 1e-6) * g

    seq, d = x.shape
    n = rms(x, w["g1"])
    q, k, v = (np.einsum("sd,dhe->hse", n, w[name]) for name in ("Wq", "Wk", "Wv"))
    scores = np.einsum("hse,hte->hst", q, k) / np.sqrt(d // heads)
    if causal:
        scores = scores + np.triu(np.full((seq, seq), -1e300), 1)
    p = np.exp(scores - scores.max(2, keepdims=True))
    p /= p.sum(2, keepdims=True)
    h = np.einsum("hse,hed->sd", np.einsum("hst,hte->hse", p, v), w["Wo"]) + x
    m = rms(h, w["g2"])
    return np.maximum(m @ w["W1"] + w["b1"], 0) @ w["W2"] + w["b2"] + h


@pytest.mark.parametrize("causal", [True, False])
def test_transformer_block_forward_and_gradients(s, causal):
    """Forward against numpy; every weight's gradient against central differences of the numpy loss."""
    seq, d, heads, hidden = 5, 8, 2, 12
    block = ml.TransformerBlock(s, d, heads, hidden, causal=causal, dtype="float64", seed=3)
    x, y = RNG.standard_normal((seq, d)), RNG.standard_normal((seq, d))
    w = block.weights()
    want = _block_reference(w, x, heads, causal)
    np.testing.assert_allclose(block.forward(x).numpy(), want, rtol=1e-12, atol=1e-12 * np.abs(want).max())
    grads = ts.grad(block.loss(block.forward(x), y), [block.params[k] for k in block.names])

    def loss(weights):
        return ((_block_reference(weights, x, heads, causal) - y) ** 2).mean()

    value = loss(w)
    for name, g in zip(block.names, grads, strict=True):
        got = g.numpy()
        for idx in list(np.ndindex(w[name].shape))[:: max(1, w[name].size // 6)]:
            bump = np.zeros_like(w[name])
            bump[idx] = 1e-6
            num = (loss({**w, name: w[name] + bump}) - loss({**w, name: w[name] - bump})) / 2e-6
            assert abs(got[idx] - num) <= 1e-6 * max(1.0, value, abs(num)), (name, idx, got[idx], num)


def test_transformer_block_trains_and_saves(s):
    block = ml.TransformerBlock(s, 8, 2, 16, dtype="float64", seed=4)
    x, y = RNG.standard_normal((6, 8)), RNG.standard_normal((6, 8))
    opt = ml.Adam(0.01)
    first = float(block.loss(block.forward(x), y).numpy())
    for _ in range(5):
        loss = block.loss(block.forward(x), y)
        grads = ts.grad(loss, [block.params[k] for k in block.names])
        block.set_params(opt.step([block.params[k] for k in block.names], grads))
    assert float(block.loss(block.forward(x), y).numpy()) < first
    block.save("block")
    back = ml.load(s, "block")
    assert isinstance(back, ml.TransformerBlock) and back.heads == 2
    np.testing.assert_allclose(back.forward(x).numpy(), block.forward(x).numpy(), rtol=1e-12)
    with pytest.raises(ts.ConfigError, match="model=8 is not a multiple of heads=3"):
        ml.TransformerBlock(s, 8, 3, 16)


def test_closing_the_session_while_the_next_epoch_is_sorted(separable, monkeypatch):
    """The session closed while the next epoch's order is sorted on its thread: the close succeeds, and
    closing the rows afterwards waits for the sort and leaves no thread behind."""
    from sqlglot import exp

    monkeypatch.setattr(train, "GATHER_SPLIT_BYTES", 1)
    monkeypatch.setattr(train, "SORT_AHEAD_ROWS", 1)
    x, y = separable
    real = train._Cached._sort

    def slow(self, seed, epoch):
        time.sleep(0.2)
        return real(self, seed, epoch)

    monkeypatch.setattr(train._Cached, "_sort", slow)
    s2 = ts.connect(threads=2)
    table(s2, "points", {**{f"f{i}": x[:, i] for i in range(4)}, "label": y})
    model = ml.LogisticRegression(s2, 4, dtype="float64")
    rows = train._Cached(s2.local_executor, exp.select(exp.Star()).from_("points"), ["f0", "f1", "f2", "f3"],
                         "label", model, len(y), 300)  # fmt: skip
    batches = rows.epoch(0, 0, then=1)
    next(batches)
    s2.close()
    assert s2.closed
    rows.close()
    names = [t.name for t in threading.enumerate()]
    assert not [n for n in names if n.startswith(("tensorsql-gather", "tensorsql-shuffle"))]


def test_fit_sources_and_settings(s):
    """A finite value beyond a float32 model's range (1e300) trained every weight to NaN; a checkpoint
    resumed under a name in another case left its last epoch's tables; fewer epochs than a checkpoint
    holds returned its weights silently; features as a generator or numpy array, and a source that opens
    with a parenthesis, a comment or VALUES, raised untyped errors or read as a table name."""
    table(s, "wide_rows", {"a": np.linspace(-1, 1, 40), "y": (np.arange(40) % 2).astype(np.int32),
                           "r": np.linspace(0, 1, 40)})  # fmt: skip
    for cache in (True, False):
        with pytest.raises(ts.ConfigError, match=r"column 'a' has \S+e\+(299|300), beyond float32's range"):
            ml.fit(ml.LogisticRegression(s, 1, dtype="float32"), "SELECT a * 1e300 AS a, y FROM wide_rows",
                   label="y", epochs=1, cache=cache, progress=False)  # fmt: skip
        with pytest.raises(ts.ConfigError, match=r"column 'r' has 1e\+39, beyond float32's range"):
            ml.fit(ml.LinearRegression(s, 1, dtype="float32"), "SELECT a, r + 1e39 AS r FROM wide_rows",
                   label="r", epochs=1, cache=cache, progress=False)  # fmt: skip
    for feats in ((c for c in ["a"]), np.array(["a"])):
        assert ml.fit(ml.LogisticRegression(s, 1), "wide_rows", feats, "y", epochs=1, progress=False).losses
    for query in ("(SELECT a, y FROM wide_rows)", "-- a note\nSELECT a, y FROM wide_rows",
                  "/* a note */ (SELECT a, y FROM wide_rows)", "VALUES (0.5, 1), (-0.5, 0)"):  # fmt: skip
        label = "col1" if query.startswith("VALUES") else "y"
        assert ml.fit(ml.LogisticRegression(s, 1), query, label=label, epochs=1, progress=False).losses
    model, adam = ml.LogisticRegression(s, 1, dtype="float64"), ml.Adam(0.1)
    ml.fit(model, "wide_rows", ["a"], "y", epochs=1, optimizer=adam, checkpoint="case_ck", progress=False)
    ml.fit(model, "wide_rows", ["a"], "y", epochs=2, optimizer=adam, checkpoint="CASE_CK", progress=False)
    left = sorted(n for n in s.tables() if n.lower().startswith("case_ck__e"))
    assert left and all(n.startswith("CASE_CK__e2__") for n in left), left
    with pytest.raises(ts.ConfigError, match="holds 2 epochs, more than epochs=1"):
        ml.fit(model, "wide_rows", ["a"], "y", epochs=1, optimizer=adam, checkpoint="case_ck", progress=False)
    assert ml.LinearRegression(s, n_features=np.int64(2)).n_features == 2


def test_scoring_with_a_key_named_like_the_position_column(s):
    """A key column named _ts_pos collided with the rewrite's own position column: 2 rows of 3, keys paired
    with other rows' predictions."""
    model = ml.LinearRegression(s, 1, dtype="float64")
    model.set_params([s.from_numpy(np.array([2.0])), s.from_numpy(np.array(0.5))])
    model.save("pos_scorer")
    table(s, "pos_rows", {"_ts_pos": np.array([3, 1, 2]), "a": np.array([10.5, 2.5, 5.0])})
    q = "SELECT * FROM predict('pos_scorer', (SELECT _ts_pos, a FROM pos_rows), key => '_ts_pos') ORDER BY 1"
    assert s.sql(q).fetchall() == [(1, 5.5), (2, 10.5), (3, 21.5)]


def test_tables_named_like_query_words_are_tables(s):
    """A source is a query when its first whole word is SELECT, WITH, VALUES or FROM: "withdrawals" and
    "values2" are tables (their first six letters read as a query; found by review)."""
    for name in ("withdrawals", "values2", "fromage"):
        table(s, name, {"a": np.array([1.0, 2.0]), "y": np.array([0, 1], np.int32)})
        assert ml.fit(ml.LogisticRegression(s, 1), name, ["a"], "y", epochs=1, progress=False).losses


def test_checkpoint_refusals_leave_the_model_alone_and_a_finished_resume_holds_its_weights(s, separable):
    """A fit refused for a checkpoint of more epochs had already set the model's weights and the optimizer's
    state from it; a resume with nothing left to train left the model reading the checkpoint's tables
    (dropped with the checkpoint, the model could not be saved); a progress table fit did not write was
    altered, or raised KeyError/JSONDecodeError."""
    feats = ["f0", "f1", "f2", "f3"]

    def run(model, opt, epochs, ck):
        return ml.fit(model, "points", feats, "label", epochs=epochs, batch_size=400, optimizer=opt,
                      checkpoint=ck, progress=False)  # fmt: skip

    run(ml.LogisticRegression(s, 4, dtype="float64"), ml.Adam(0.1), 3, "ckr")
    model, opt = ml.LogisticRegression(s, 4, dtype="float64"), ml.Adam(0.1)
    with pytest.raises(ts.ConfigError, match="holds 3 epochs, more than epochs=2"):
        run(model, opt, 2, "ckr")
    np.testing.assert_array_equal(model.weights()["W"], np.zeros(4))
    assert opt.steps == 0 and not opt.state
    again = ml.LogisticRegression(s, 4, dtype="float64")
    hist = run(again, ml.Adam(0.1), 3, "ckr")  # nothing left: the weights read into memory
    assert hist.ran == 0 and hist.resumed_after == 3
    weights = again.weights()["W"]
    for name in [t for t in s.tables() if t.lower().startswith("ckr__")]:
        s.drop(name)
    again.save("ckr_model")  # it read the dropped tables before
    np.testing.assert_array_equal(ml.load(s, "ckr_model").weights()["W"], weights)
    s.execute("CREATE OR REPLACE TABLE job__progress AS SELECT 'load' AS task, 1.0 AS pct")
    with pytest.raises(ts.ConfigError, match="'job__progress' is not the progress table of a checkpoint"):
        run(ml.LogisticRegression(s, 4), ml.SGD(0.1), 1, "job")
    assert [c for (c,) in s.execute("SELECT column_name FROM information_schema.columns "
                                    "WHERE table_name = 'job__progress'")] == ["task", "pct"]  # fmt: skip
    assert not any(t.lower().startswith("job__e") for t in s.tables())
    run(ml.LogisticRegression(s, 4), ml.SGD(0.1), 1, "ckd")
    damages = (
        ("losses = 'n/a'", "losses 'n/a'"),
        ("epoch = NULL", "epoch None"),
        ("setup = 'garbage'", "setup 'garbage'"),
        ("setup = '[1, 2]'", r"setup '\[1, 2\]'"),
    )
    for damage, match in damages:
        s.execute("CREATE OR REPLACE TABLE ckd_keep AS FROM ckd__progress")
        s.execute(f"UPDATE ckd__progress SET {damage}")
        with pytest.raises(ts.ConfigError, match=f"checkpoint 'ckd' is damaged \\({match}"):
            run(ml.LogisticRegression(s, 4), ml.SGD(0.1), 2, "ckd")
        s.execute("DELETE FROM ckd__progress")
        s.execute("INSERT INTO ckd__progress FROM ckd_keep")


def test_fit_reads_wide_integers_and_decimals_as_doubles(s):
    """UHUGEINT 2**128 - 1 came through Arrow as decimal128(38, 0), wrapped to -1: trained as a label of -1
    with no error; wide DECIMALs came as Python objects past the finiteness check."""
    big = 2**128 - 1
    s.execute(f"CREATE OR REPLACE TABLE huge AS SELECT 1.0 AS a, {big}::UHUGEINT AS y, 2.5::DECIMAL(38,1) d")
    model = ml.LinearRegression(s, 1, dtype="float64")
    h = ml.fit(model, "huge", ["a"], "y", epochs=1, batch_size=1, optimizer=ml.SGD(0.1), progress=False)
    np.testing.assert_allclose(h.losses, [float(big) ** 2], rtol=1e-12)
    model = ml.LinearRegression(s, 1, dtype="float64")
    h = ml.fit(model, "SELECT d, 0.0 AS y FROM huge", ["d"], "y", epochs=1, batch_size=1, progress=False)
    np.testing.assert_allclose(h.losses, [0.0])
    with pytest.raises(ts.DTypeError, match="column 'y' has type VARCHAR; the label must be numeric"):
        ml.fit(model, "SELECT d, 'x' AS y FROM huge", ["d"], "y", epochs=1, progress=False)


def test_model_and_checkpoint_tables_never_replace_a_users_tables(s, separable):
    """model.save and a checkpoint replaced (then dropped) tables of their names that they had not written:
    a user's ``churn__W`` row, a user's tensor ``churn__b``, a plain ``ck__e1__W``."""
    s.execute("CREATE OR REPLACE TABLE users_only__W AS SELECT 42 AS important")
    with pytest.raises(ts.CatalogError, match="table 'users_only__W' exists and is not this model's"):
        ml.LinearRegression(s, 2, dtype="float64").save("users_only")
    assert s.execute("SELECT * FROM users_only__W") == [(42,)]
    s.save(s.from_numpy(np.arange(3.0)), "churn2__b", replace=True)
    with pytest.raises(ts.CatalogError, match="table 'churn2__b' exists"):
        ml.LinearRegression(s, 2, dtype="float64").save("churn2")
    np.testing.assert_array_equal(s.table("churn2__b").numpy(), np.arange(3.0))
    mine = ml.LinearRegression(s, 2, dtype="float64")
    mine.save("mine")
    mine.save("MINE")  # its own tables: saved again
    s.execute("CREATE OR REPLACE TABLE cku__e1__W AS SELECT 'keep me' AS note")
    with pytest.raises(ts.ConfigError, match="would write table 'cku__e1__W', a table or view it did not"):
        ml.fit(ml.LogisticRegression(s, 4), "points", ["f0", "f1", "f2", "f3"], "label", epochs=2,
               checkpoint="cku", progress=False)  # fmt: skip
    assert s.execute("SELECT * FROM cku__e1__W") == [("keep me",)]
    with pytest.raises(ts.ConfigError, match="'_ts_ck' is a name tensorsql reserves"):
        ml.fit(ml.LogisticRegression(s, 4), "points", ["f0", "f1", "f2", "f3"], "label", epochs=1,
               checkpoint="_ts_ck", progress=False)  # fmt: skip
    s.execute("UPDATE tensorsql_models SET config = replace(config, '2', '3') WHERE lower(name) = 'mine'")
    with pytest.raises(ts.CatalogError, match="saved model 'mine': its weights do not fit its"):
        ml.load(s, "mine")


def test_a_save_over_a_model_of_other_weights_replaces_only_that_models_tables(s):
    """A save over a saved model replaced every ``<name>__<weight>`` it wrote, also a user's table the old
    model had none of (an MLP of more layers over a linear model: the user's ``churn3__W0`` rows were
    overwritten). Only the old model's tables are replaced, its weights the new one has
    not are dropped, and a user's table is a CatalogError with nothing written."""
    ml.LinearRegression(s, 2, dtype="float64").save("churn3")
    s.execute("CREATE TABLE churn3__W0 (customer VARCHAR, important INTEGER)")
    s.execute("INSERT INTO churn3__W0 VALUES ('alice', 1), ('bob', 2)")
    with pytest.raises(ts.CatalogError, match=r"table 'churn3__W0' exists and is not this model's \(the"):
        ml.MLP(s, [2, 3, 2], dtype="float64").save("churn3")
    assert s.execute("SELECT * FROM churn3__W0 ORDER BY customer") == [("alice", 1), ("bob", 2)]
    assert isinstance(ml.load(s, "churn3"), ml.LinearRegression)
    s.execute("DROP TABLE churn3__W0")
    mlp = ml.MLP(s, [2, 3, 2], dtype="float64")
    mlp.save("churn3")
    loaded = ml.load(s, "churn3")
    assert isinstance(loaded, ml.MLP)
    for k, v in mlp.weights().items():
        np.testing.assert_array_equal(loaded.weights()[k], v)
    left = {t.lower() for t in s.tables() if t.lower().startswith("churn3__")}
    assert left == {f"churn3__{k}".lower() for k in mlp.names}  # the linear model's W and b dropped
    ml.LinearRegression(s, 2, dtype="float64").save("CHURN3")  # and back: the MLP's tables go
    assert {t.lower() for t in s.tables() if t.lower().startswith("churn3__")} == {"churn3__w", "churn3__b"}


def test_a_checkpoint_never_replaces_a_tensor_it_did_not_write(s, separable, monkeypatch):
    """A checkpoint took any tensor table of an epoch to come for its own leftovers: a user's tensor
    ``jobp__e1__W`` or a saved model ``jobp__e1``'s weights were replaced by epoch 1, then dropped after epoch
    2. The progress row now marks the epoch whose tables are being written: a run stopped
    halfway through writing them resumes over those, and only those."""
    feats = ["f0", "f1", "f2", "f3"]
    ml.LinearRegression(s, 4, dtype="float64").save("jobp__e1")
    s.save(s.from_numpy(np.arange(4.0)), "jobp__e2__b", replace=True)
    for epochs in (1, 2):
        with pytest.raises(ts.ConfigError, match="would write table 'jobp__e1__W', a table or view it did"):
            ml.fit(ml.LogisticRegression(s, 4, dtype="float64"), "points", feats, "label", epochs=epochs,
                   checkpoint="jobp", progress=False)  # fmt: skip
    assert isinstance(ml.load(s, "jobp__e1"), ml.LinearRegression)
    np.testing.assert_array_equal(s.table("jobp__e2__b").numpy(), np.arange(4.0))

    def fit(model, epochs):
        return ml.fit(model, "points", feats, "label", epochs=epochs, batch_size=600, optimizer=ml.SGD(0.1),
                      checkpoint="ck_half", progress=False)  # fmt: skip

    whole = ml.LogisticRegression(s, 4, dtype="float64", seed=3)
    ml.fit(whole, "points", feats, "label", epochs=3, batch_size=600, optimizer=ml.SGD(0.1), progress=False)
    real, saves = s.save, []

    def save(rel, name, **kw):  # stopped between the second epoch's two weight tables
        saves.append(name)
        if name == "ck_half__e2__b":
            raise KeyboardInterrupt
        return real(rel, name, **kw)

    monkeypatch.setattr(s, "save", save)
    with pytest.raises(KeyboardInterrupt):
        fit(ml.LogisticRegression(s, 4, dtype="float64", seed=3), 3)
    monkeypatch.undo()
    assert "ck_half__e2__W" in set(s.tables())  # a leftover of the stopped run: its own, replaced
    model = ml.LogisticRegression(s, 4, dtype="float64", seed=3)
    hist = fit(model, 3)
    assert hist.resumed_after == 1
    for k in ("W", "b"):
        np.testing.assert_allclose(model.weights()[k], whole.weights()[k], rtol=1e-12)
    assert not any(t.startswith(("ck_half__e1__", "ck_half__e2__")) for t in s.tables())


def test_a_model_or_optimizer_given_no_session_or_no_relations_is_a_config_error(s):
    with pytest.raises(ts.ConfigError, match="LinearRegression: the first argument must be a tensorsql"):
        ml.LinearRegression(None, 2)
    with pytest.raises(ts.ConfigError, match="load: the first argument must be a tensorsql Session, got"):
        ml.load("churn", "churn")
    with pytest.raises(ts.ConfigError, match="step: params must be a sequence of tensor relations"):
        ml.SGD(0.1).step(None, None)
    with pytest.raises(ts.ConfigError, match="step: grads must be a sequence of tensor relations"):
        ml.SGD(0.1).step([s.from_numpy(np.zeros(2))], [np.zeros(2)])
