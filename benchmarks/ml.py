"""Machine learning (issue 16), side by side in one run:

1. Logistic regression on ``--rows`` x 100 float32 features read from a DuckDB table, ``--epochs`` epochs,
   mini-batch 8192, Adam: ``ml.fit`` (batches read from the table, shuffled in DuckDB) against numpy by hand
   (the table read once into memory, the same Adam, shuffled with numpy) and scikit-learn's
   ``SGDClassifier`` (``partial_fit`` per batch, where installed). Wall time per epoch, final loss and
   accuracy. torch is not installed by the project (its wheel bundles CUDA: gigabytes); the issue's torch
   column is left out and said so.
2. One training step of the FFNN (batch 1024, 784-1024-1024-10, SGD): tensorsql (``fit``'s compiled step:
   loss and gradients, then the SGD update, each planned once) against numpy by hand.

Run: ``python -m benchmarks.ml [--rows 1000000] [--epochs 10] [--quick]``.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

import tensorsql as ts
from benchmarks.sql import _best
from tensorsql import ml
from tensorsql.ml.train import Stepper

FEATURES = 100


def _table(s: ts.Session, rows: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(16)
    x = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    w = rng.standard_normal(FEATURES).astype(np.float32)
    y = (x @ w + 0.5 * rng.standard_normal(rows) > 0).astype(np.int32)
    con = s.executor.con  # type: ignore[attr-defined]
    con.register("bench_ml_rows", pa.table({**{f"f{i}": x[:, i] for i in range(FEATURES)}, "label": y}))
    s.execute("CREATE OR REPLACE TABLE bench_ml AS SELECT * FROM bench_ml_rows")
    con.unregister("bench_ml_rows")
    return x, y


def _bce(z: np.ndarray, y: np.ndarray) -> float:
    return float(np.mean(np.logaddexp(0, z) - y * z))


def logistic(s: ts.Session, rows: int, epochs: int, batch: int) -> None:
    x, y = _table(s, rows)
    feats = [f"f{i}" for i in range(FEATURES)]
    print(f"logistic regression: {rows:,} rows x {FEATURES} float32 features, {epochs} epochs, batch {batch}")

    model = ml.LogisticRegression(s, FEATURES, dtype="float32")
    t = time.perf_counter()
    ml.fit(model, "bench_ml", feats, "label", epochs=epochs, batch_size=batch, optimizer=ml.Adam(0.05),
           progress=False)  # fmt: skip
    ts_time = (time.perf_counter() - t) / epochs
    z = model.forward(x).numpy()
    rows_out = [("tensorsql ml.fit (from the table)", ts_time, _bce(z, y), float(((z > 0) == y).mean()))]

    # numpy by hand: the table read into memory once (timed), the same Adam
    t = time.perf_counter()
    data = s.executor.con.sql("SELECT * FROM bench_ml").fetchnumpy()  # type: ignore[attr-defined]
    xs = np.column_stack([data[f] for f in feats]).astype(np.float32)
    ys = np.asarray(data["label"], dtype=np.float32)
    read = time.perf_counter() - t
    w, b = np.zeros(FEATURES, np.float32), np.float32(0)
    m = [np.zeros_like(w), np.float32(0)]
    v = [np.zeros_like(w), np.float32(0)]
    rng = np.random.default_rng(0)
    step = 0
    t = time.perf_counter()
    for _ in range(epochs):
        order = rng.permutation(len(ys))
        for lo in range(0, len(ys), batch):
            idx = order[lo : lo + batch]
            xb, yb = xs[idx], ys[idx]
            p = 1 / (1 + np.exp(-(xb @ w + b)))
            gz = (p - yb) / len(yb)
            grads = [xb.T @ gz, gz.sum()]
            step += 1
            new = []
            for i, (param, g) in enumerate(zip((w, b), grads, strict=True)):
                m[i] = 0.9 * m[i] + 0.1 * g
                v[i] = 0.999 * v[i] + 0.001 * g * g
                mh, vh = m[i] / (1 - 0.9**step), v[i] / (1 - 0.999**step)
                new.append(param - 0.05 * mh / (np.sqrt(vh) + 1e-8))
            w, b = new
    np_time = (time.perf_counter() - t + read) / epochs
    z = x @ w + b
    rows_out.append(("numpy by hand (table read once)", np_time, _bce(z, y), float(((z > 0) == y).mean())))

    try:
        from sklearn.linear_model import SGDClassifier
    except ImportError:
        rows_out.append(("scikit-learn SGDClassifier", float("nan"), float("nan"), float("nan")))
    else:
        clf = SGDClassifier(loss="log_loss", learning_rate="constant", eta0=0.01, random_state=0)
        t = time.perf_counter()
        for _ in range(epochs):
            order = rng.permutation(len(ys))
            for lo in range(0, len(ys), batch):
                idx = order[lo : lo + batch]
                clf.partial_fit(xs[idx], ys[idx], classes=[0, 1])
        sk_time = (time.perf_counter() - t + read) / epochs
        z = clf.decision_function(x)
        rows_out.append(("scikit-learn SGDClassifier", sk_time, _bce(z, y), float(((z > 0) == y).mean())))
    print(f"  {'':36s} {'s / epoch':>10s} {'final loss':>11s} {'accuracy':>9s} {'vs tensorsql':>13s}")
    for name, sec, loss, acc in rows_out:
        ratio = ts_time / sec if sec == sec else float("nan")
        print(f"  {name:36s} {sec:10.3f} {loss:11.4f} {acc:9.4f} {ratio:13.2f}")
    print("  torch CPU: not installed (the issue's torch peer is not measured)")


def ffnn_step(s: ts.Session, batch: int, layers: list[int], repeat: int) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((batch, layers[0])).astype(np.float32)
    labels = rng.integers(0, layers[-1], batch)
    model = ml.MLP(s, layers, dtype="float32", seed=0)
    opt = ml.SGD(0.01)
    onehot = model.targets(labels)

    stepper = Stepper(model, opt)  # fit's step: compiled once, run on arrays (a plan per output)

    def tensorsql_step() -> None:
        stepper.step(x, onehot)

    def shared_step() -> None:  # planned each call, the forward pass stored once for all gradients
        params = [model.params[k] for k in model.names]
        loss = model.loss(model.forward(x), onehot)
        _, *grads = s.compute([loss, *ts.grad(loss, params)], store=True)
        model.set_params(opt.step(params, grads))

    weights = model.weights()
    ws = [weights[k] for k in model.names]

    def numpy_step() -> None:
        acts, pre = [x], []
        h = x
        n = len(layers) - 1
        for i in range(n):
            z = h @ ws[2 * i] + ws[2 * i + 1]
            pre.append(z)
            h = np.maximum(z, 0) if i < n - 1 else z
            acts.append(h)
        z = acts[-1]
        p = np.exp(z - z.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
        g = (p - onehot) / batch
        for i in reversed(range(n)):
            gw, gb = acts[i].T @ g, g.sum(0)
            if i:
                g = (g @ ws[2 * i].T) * (pre[i - 1] > 0)
            ws[2 * i] -= 0.01 * gw
            ws[2 * i + 1] -= 0.01 * gb

    best = _best({"tensorsql": tensorsql_step, "shared": shared_step, "numpy": numpy_step}, repeat)
    shape = "-".join(map(str, layers))
    print(f"\nFFNN training step (batch {batch}, {shape}, SGD): numpy by hand {best['numpy']:.3f} s")
    for name, label in (("tensorsql", "fit's compiled step"), ("shared", "Session.compute (shared forward)")):
        print(f"  tensorsql, {label:34s} {best[name]:.3f} s, ratio {best[name] / best['numpy']:.2f}")
    print("  torch CPU: not installed (the issue's torch peer is not measured)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    rows, epochs = (50_000, 2) if args.quick else (args.rows, args.epochs)
    with ts.connect(threads=2) as s:
        logistic(s, rows, epochs, 8192)
        layers = [784, 128, 128, 10] if args.quick else [784, 1024, 1024, 10]
        ffnn_step(s, 256 if args.quick else 1024, layers, args.repeat)


if __name__ == "__main__":
    main()
