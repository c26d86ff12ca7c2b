"""The main job (``make demo``): warehouse rows -> tensor relations -> einsums as SQL, checked by numpy."""

from __future__ import annotations

import sys

import numpy as np

import tensorsql as ts


def _check(name: str, got: np.ndarray, want: np.ndarray) -> bool:
    ok = got.shape == want.shape and np.allclose(got, want, rtol=1e-9, atol=1e-9)
    err = float(np.max(np.abs(got - want))) if got.shape == want.shape and got.size else 0.0
    print(f"[{'ok' if ok else 'MISMATCH'}] {name}: shape {got.shape}, max |tensorsql - numpy| = {err:.2e}")
    return ok


def main() -> int:
    rng = np.random.default_rng(7)
    s = ts.connect()  # embedded, in-process DuckDB
    # 1. A warehouse table of rows (i, j, value) ... loaded into DuckDB as plain SQL rows.
    n, m, p = 300, 200, 150
    a = rng.standard_normal((n, m))
    con = s.executor.con  # the embedded DuckDB connection, as a warehouse loader would use it
    con.execute("CREATE TABLE readings (sensor INTEGER, feature INTEGER, val DOUBLE)")
    rows = [(i, j, float(a[i, j])) for i in range(n) for j in range(m)]
    con.executemany("INSERT INTO readings VALUES (?, ?, ?)", rows[:2000])
    con.register("_demo_rest", _as_arrow(rows[2000:]))
    con.execute("INSERT INTO readings SELECT * FROM _demo_rest")
    con.unregister("_demo_rest")

    # 2. ... turned into a blocked tensor relation inside DuckDB (no Python loop over rows).
    A = s.from_sql("SELECT sensor, feature, val FROM readings", shape=(n, m), block_shape=(128, 64))
    B = s.from_numpy(rng.standard_normal((m, p)), block_shape=(64, 64))
    C = s.from_numpy(rng.standard_normal((p, 40)), block_shape=(50, 40))
    ok = True

    # 3. A contraction chain (A @ B) @ C as one SQL plan.
    chain = s.einsum("ij,jk,kl->il", A, B, C)
    print("== contraction chain 'ij,jk,kl->il' ==")
    print(chain.explain())
    ok &= _check("chain", chain.numpy(), a @ B.numpy() @ C.numpy())

    # 4. An extended EinSum: pairwise squared L2 distances Z[i,k] = sum_j (X[i,j] - Y[j,k])^2.
    X = rng.standard_normal((60, 16))
    Y = rng.standard_normal((16, 45))
    dist = s.einsum(
        "ij,jk->ik",
        s.from_numpy(X, block_shape=(32, 8)),
        s.from_numpy(Y, block_shape=(8, 32)),
        join="sqdiff",
        agg="sum",
    )
    print("\n== pairwise L2 distances: einsum('ij,jk->ik', join='sqdiff', agg='sum') ==")
    print(dist.sql())
    ok &= _check("L2 distances", dist.numpy(), ((X[:, :, None] - Y[None, :, :]) ** 2).sum(axis=1))

    # 5. A softmax built from EinSum steps: max, subtract, exp, sum, divide.
    logits = s.from_numpy(rng.standard_normal((50, 30)) * 3, block_shape=(16, 16))
    sm = ts.softmax(logits, over=1)
    print("\n== softmax over axis 1 ==")
    print(sm.explain().split("== SQL ==")[0])
    L = logits.numpy()
    e = np.exp(L - L.max(axis=1, keepdims=True))
    ok &= _check("softmax", sm.numpy(), e / e.sum(axis=1, keepdims=True))

    # 6. The drop-in: numpy arrays in, numpy out.
    t = rng.standard_normal((4, 5, 6))
    ok &= _check(
        "ts.einsum('abc,cd->abd')",
        ts.einsum("abc,cd->abd", t, X[:6, :3]),
        np.einsum("abc,cd->abd", t, X[:6, :3]),
    )
    print("\nall results match numpy" if ok else "\nSOME RESULTS DO NOT MATCH")
    return 0 if ok else 1


def _as_arrow(rows: list[tuple[int, int, float]]):
    import pyarrow as pa

    i, j, v = zip(*rows, strict=True)
    return pa.table({"sensor": pa.array(i, pa.int32()), "feature": pa.array(j, pa.int32()), "val": v})


if __name__ == "__main__":
    sys.exit(main())
