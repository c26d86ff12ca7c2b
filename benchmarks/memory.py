"""A matmul of two stored tables that together pass ``memory_limit``: tensorsql runs it in waves.

For the same two n x n float32 tables in a database file: tensorsql under ``--limit`` (waves), the same plan
as one query under the same limit (what ran before the waves: it fails), and numpy's matmul of the arrays
in memory, with no limit (the peer). Each tensorsql run is a fresh process, so its peak RSS is its own; the
returned array (n^2 float32) is part of it.

Run: ``python -m benchmarks.memory [--n 20000 --limit 2GB --block 800]`` (defaults: a 4096^2 case under
64 MB, ~1 minute on the 2-core VM).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import tensorsql as ts

ROOT = Path(__file__).resolve().parent.parent


def _arrays(n: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.standard_normal((n, n), dtype=np.float32), rng.standard_normal((n, n), dtype=np.float32)


def _child(path: str, limit: str, waves: bool) -> None:
    """One run in this (fresh) process; prints a JSON line."""
    import resource

    from tensorsql.backends.duckdb import staged
    from tensorsql.backends.duckdb.executor import DuckDBExecutor

    if not waves:  # the one-query plan, as before the waves
        DuckDBExecutor.wave_budget = property(lambda self: 1 << 62)  # type: ignore[method-assign]
    queries = {"n": 0}
    execute = staged.StagedRun.execute

    def counted(self, query):  # type: ignore[no-untyped-def]
        queries["n"] += 1
        return execute(self, query)

    staged.StagedRun.execute = counted  # type: ignore[method-assign]
    out: dict[str, object] = {}
    t0 = time.perf_counter()
    with ts.connect(path, threads=2, memory_limit=limit, read_only=True, temp_directory=path + ".spill") as s:
        try:
            res = s.einsum("ij,jk->ik", s.table("X"), s.table("Y")).numpy()
            out["seconds"] = time.perf_counter() - t0
            np.save(path + ".out.npy", res[:16])
        except ts.TensorSQLError as exc:
            out["seconds"] = time.perf_counter() - t0
            out["error"] = f"{type(exc).__name__}: {str(exc)[:160]}"
    out["queries"] = queries["n"]
    out["peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    print(json.dumps(out))


def _run(path: str, limit: str, waves: bool) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.memory", "--child", path, "--limit", limit]
    if not waves:
        cmd.append("--one-query")
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--limit", default="64MB")
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--one-query", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child, args.limit, not args.one_query)
        return
    x, y = _arrays(args.n)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "xy.duckdb")
        with ts.connect(path) as s:
            s.from_numpy(x, block_shape=(args.block, args.block)).save("X")
            s.from_numpy(y, block_shape=(args.block, args.block)).save("Y")
        t0 = time.perf_counter()
        want = x @ y
        numpy_s = time.perf_counter() - t0
        waved = _run(path, args.limit, True)
        err = float(np.abs(np.load(path + ".out.npy") - want[:16]).max()) if "error" not in waved else None
        one = _run(path, args.limit, False)
    table = 2 * args.n * args.n * 4 / 1e9
    print(f"memory: ij,jk->ik, two stored {args.n}^2 float32 tables ({table:.2f} GB together)")
    print(f"        in {args.block}^2 blocks, memory_limit={args.limit}, 2 threads")
    print(f"  numpy (in memory, no limit)   {numpy_s:9.2f} s")
    if "error" in waved:
        print(f"  tensorsql, waves              FAILED: {waved['error']}")
    else:
        ratio = waved["seconds"] / numpy_s
        print(
            f"  tensorsql, waves              {waved['seconds']:9.2f} s  {ratio:5.1f}x numpy  "
            f"{waved['queries']} queries  peak RSS {waved['peak_rss_gb']:.2f} GB  max |error| {err:.2g}"
        )
    print(
        f"  tensorsql, one query (before) {one['seconds']:9.2f} s  "
        f"{one.get('error', 'ran')}  peak RSS {one['peak_rss_gb']:.2f} GB"
    )


if __name__ == "__main__":
    main()
