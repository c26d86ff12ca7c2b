"""SQL surfaces, side by side in one run:

1. ``einsum`` through ``Session.sql`` against the same computation through ``s.einsum`` over the same stored
   tensor tables, each returning the result's block rows as Arrow (the relation built, planned and run
   on every call by both): the 4096² float32 matmul and the einsum trees of benchmark (d). Target: ≤ 1.05x.
   Both start from table names (``s.table`` per operand in Python; one lookup per statement in SQL); a
   third column holds the relations from before the timing, so ``s.sql`` pays its lookup, parse and
   rewrite against a call that pays none of them.
2. ``tensor_cells`` of a 4096x4096 float32 tensor: rows per second, next to DuckDB's own ``unnest`` of an
   equivalent LIST column and next to numpy -> Arrow -> DuckDB (the rows made in numpy and scanned).

Run: ``python -m benchmarks.sql [--repeat 5] [--quick]``. Timing: best of ``--repeat`` after a warm-up, the
two sides of a pair interleaved.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import pyarrow as pa

import tensorsql as ts
from benchmarks.__main__ import TREES, _fit, _sizes


def _best(fns: dict[str, object], repeat: int) -> dict[str, float]:
    for fn in fns.values():
        fn()  # type: ignore[operator]
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(repeat):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()  # type: ignore[operator]
            best[name] = min(best[name], time.perf_counter() - t)
    return best


def einsum_vs_sql(s: ts.Session, repeat: int, quick: bool) -> None:
    rng = np.random.default_rng(4)
    n = 1024 if quick else 4096
    cases = [("matmul", "ij,jk->ik", {"i": n, "j": n, "k": n})]
    for name, spec, sizes in TREES:
        sz, _ = _fit(spec, _sizes(spec, sizes), 2_000_000 if quick else 24_000_000)
        cases.append((name, spec, sz))
    print(
        f"{'case':10s} {'s.einsum (s)':>13s} {'s.sql (s)':>10s} {'ratio':>7s}  (target <= 1.05)"
        f"  {'s.einsum, tables held (s)':>26s} {'ratio':>7s}"
    )
    for name, spec, sz in cases:
        lhs = spec.split("->")[0].split(",")
        names = []
        for i, term in enumerate(lhs):
            arr = rng.standard_normal(tuple(sz[c] for c in term)).astype(np.float32)
            table = f"bench_{name}_{i}"
            s.save(s.from_numpy(arr), table, replace=True)
            names.append(table)
        operands = ", ".join(f'"{t}"' for t in names)
        statement = f"SELECT * FROM einsum('{spec}', {operands})"

        def python(spec: str = spec, names: list[str] = names) -> pa.Table:
            return s.einsum(spec, *[s.table(t) for t in names]).to_arrow()

        held = [s.table(t) for t in names]

        def python_held(spec: str = spec, held: list = held) -> pa.Table:
            return s.einsum(spec, *held).to_arrow()

        def sql(statement: str = statement) -> pa.Table:
            return s.sql(statement).to_arrow_table()  # type: ignore[union-attr]

        a, b = python(), sql()
        assert a.num_rows == b.num_rows
        best = _best({"python": python, "sql": sql, "held": python_held}, repeat)
        print(
            f"{name:10s} {best['python']:13.4f} {best['sql']:10.4f} {best['sql'] / best['python']:7.3f}"
            f"                   {best['held']:26.4f} {best['sql'] / best['held']:7.3f}"
        )


def cells_rate(s: ts.Session, repeat: int, quick: bool) -> None:
    n = 1024 if quick else 4096
    x = np.random.default_rng(5).standard_normal((n, n)).astype(np.float32)
    s.save(s.from_numpy(x), "bench_cells", replace=True)
    con = s.executor.con  # type: ignore[attr-defined]
    lists = pa.table({"i0": np.arange(n), "l": pa.array(list(x), pa.list_(pa.float32()))})
    con.register("bench_lists", lists)

    def cells() -> object:
        return s.sql("SELECT count(*), sum(value) FROM tensor_cells(bench_cells)").fetchall()  # type: ignore[union-attr]

    def unnest() -> object:
        return con.sql("SELECT count(*), sum(v) FROM (SELECT unnest(l) AS v FROM bench_lists)").fetchall()

    def from_numpy() -> object:
        i0, i1 = np.indices(x.shape).reshape(2, -1)
        rows = pa.table({"i0": i0, "i1": i1, "value": x.reshape(-1)})
        con.register("bench_rows", rows)
        try:
            return con.sql("SELECT count(*), sum(value) FROM bench_rows").fetchall()
        finally:
            con.unregister("bench_rows")

    best = _best({"tensor_cells": cells, "unnest": unnest, "numpy": from_numpy}, repeat)
    rows = n * n
    print(f"\ntensor_cells of a {n}x{n} float32 tensor ({rows:,} rows), rows per second:")
    for name, label in (
        ("tensor_cells", "tensor_cells (SQL, from the blocks)"),
        ("unnest", "DuckDB unnest of a LIST column"),
        ("numpy", "numpy -> Arrow -> DuckDB"),
    ):
        print(f"  {label:38s} {rows / best[name] / 1e6:8.1f} M rows/s ({best[name]:.3f} s)")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args(argv)
    with ts.connect(threads=2) as s:
        einsum_vs_sql(s, args.repeat, args.quick)
        cells_rate(s, args.repeat, args.quick)


if __name__ == "__main__":
    main()
