"""Measure the planner's cost coefficients on this machine: ``python -m tensorsql.calibrate [--out PATH]``.

per_call: seconds per block-kernel call (many tiny blocks, so the call overhead dominates);
per_flop: seconds per flop of a single-block float32 matmul; per_byte: seconds per byte a repartition
moves. Written as JSON where the planner looks (``TENSORSQL_COST_MODEL`` or ~/.cache/tensorsql/).
"""

from __future__ import annotations

import argparse
import pathlib
import time

import numpy as np

import planner as P
from tensorsql.api import connect
from tensorsql.compile import planning


def _best(fn, repeat: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(threads: int = 1) -> P.CostModel:
    rng = np.random.default_rng(0)
    with connect(threads=threads) as s:
        # per call: 64x64 @ 64x64 in 4x4 blocks = 16^3 = 4096 tiny kernel calls
        a = s.from_numpy(rng.standard_normal((64, 64)).astype(np.float32), block_shape=(4, 4))
        b = s.from_numpy(rng.standard_normal((64, 64)).astype(np.float32), block_shape=(4, 4))
        calls = 16**3
        per_call = _best(lambda: s.einsum("ij,jk->ik", a, b, strategy="operands").numpy()) / calls
        # per flop: one 1024^3 block product
        n = 1024
        x = s.from_numpy(rng.standard_normal((n, n)).astype(np.float32), block_shape=(n, n))
        y = s.from_numpy(rng.standard_normal((n, n)).astype(np.float32), block_shape=(n, n))
        per_flop = _best(lambda: s.einsum("ij,jk->ik", x, y, strategy="operands").numpy()) / (2 * n**3)
        # per byte: re-split a 2048^2 float32 tensor from row blocks to column blocks
        m = 2048
        z = s.from_numpy(rng.standard_normal((m, m)).astype(np.float32), block_shape=(256, m))
        moved = m * m * 4
        per_byte = _best(lambda: z.reblock((m, 256)).numpy()) / moved
    return P.CostModel(per_call=per_call, per_byte=per_byte, per_flop=per_flop, itemsize=4, workers=threads)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(planning.cost_model_path()), help="where to write the JSON")
    ap.add_argument("--threads", type=int, default=1, help="DuckDB threads while measuring")
    args = ap.parse_args(argv)
    cm = measure(args.threads)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    cm.save(args.out)
    print(f"per_call={cm.per_call:.3e} s  per_byte={cm.per_byte:.3e} s  per_flop={cm.per_flop:.3e} s")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
