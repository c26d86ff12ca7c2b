"""The paper's matrix chains (A x B) + (C x (D x E)) on a local Dask cluster, side by side:
tensorsql on the cluster with each strategy (time; the bytes fed to its kernel calls as the planner's cost
model counts them and as the workers measured them, and of those the bytes that came from other workers;
the planner's modelled cost), ``dask.array`` on the same workers (dask's own chunks and hand-chosen ones), and
single-process tensorsql on the same machine, the chain over the arrays themselves (the plan blocks the
operands as it reads them, as in the paper; a relation keeps them on the workers after its first run) on
the cluster and in one process, and numpy's own GEMMs in one process (the time the chain's
FLOPs take on this machine's cores: no plan on the same cores can be much faster). Each tensorsql row also
gives the CPU time per run of every process it uses (the client's with its scheduler, and each worker's):
on a machine whose cores the workers fill, the distributed overhead is that CPU over the one-process run's.

Run: ``python -m benchmarks.cluster [--workers 2,4] [--s-square 1024] [--s-skewed 2000] [--repeat 3]``.
Timing: one warm-up run, then the best of ``--repeat``; inputs are uploaded once (relations), as dask.array
inputs are persisted once.
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import numpy as np

import tensorsql as ts
from benchmarks.chain import STRATEGIES, chain, shapes


def _best(fn, repeat: int) -> tuple[float, object]:
    secs, out, _ = _timed(fn, repeat, [])
    return secs, out


def _timed(fn, repeat: int, pids: list[int]) -> tuple[float, object, float]:
    """(best seconds, last result, CPU seconds per run of the processes ``pids``, over the timed runs)."""
    import psutil

    procs = [psutil.Process(p) for p in pids]

    def cpu() -> float:
        return sum(t.user + t.system for t in (p.cpu_times() for p in procs))

    out = fn()
    best = float("inf")
    c0 = cpu()
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return best, out, (cpu() - c0) / max(1, repeat)


def _dask_array(client, arrays: dict[str, np.ndarray], chunks: object, repeat: int) -> float:
    import dask.array as da

    parts = {k: client.persist(da.from_array(v, chunks=chunks)) for k, v in arrays.items()}
    expr = parts["A"] @ parts["B"] + parts["C"] @ (parts["D"] @ parts["E"])
    secs, _ = _best(lambda: expr.compute(), repeat)
    return secs


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", default="2,4")
    ap.add_argument("--s-square", type=int, default=1024)
    ap.add_argument("--s-skewed", type=int, default=2000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", message=".*(Large object|Increasing number of chunks|Sending large).*")
    rng = np.random.default_rng(0)
    cases = {
        kind: {k: rng.standard_normal(sh).astype(np.float32) for k, sh in shapes(kind, size).items()}
        for kind, size in (("square", args.s_square), ("skewed", args.s_skewed))
    }
    single: dict[str, float] = {}
    single_cpu: dict[str, float] = {}
    floor: dict[str, float] = {}
    for kind, a in cases.items():  # numpy's own GEMMs in this process: what the chain's FLOPs take here
        floor[kind], _ = _best(lambda a=a: a["A"] @ a["B"] + a["C"] @ (a["D"] @ a["E"]), args.repeat)
    single_arrays: dict[str, float] = {}
    with ts.connect(threads=2) as s:
        for kind, arrays in cases.items():
            rels = {k: s.from_numpy(v) for k, v in arrays.items()}
            single[kind], _, single_cpu[kind] = _timed(
                lambda s=s, rels=rels: chain(s, rels, "eindecomp").numpy(), args.repeat, [os.getpid()]
            )
            single_arrays[kind], _ = _best(chain(s, arrays, "eindecomp").numpy, args.repeat)
    for workers in (int(w) for w in args.workers.split(",")):
        with ts.connect(workers=workers) as cs:
            # the client's process (with the LocalCluster's scheduler) and the workers' processes
            pids = [os.getpid(), *cs.client.run(os.getpid).values()]
            for kind, arrays in cases.items():
                want = arrays["A"] @ arrays["B"] + arrays["C"] @ (arrays["D"] @ arrays["E"])
                print(f"\n{kind} chain, {workers} workers x 1 thread, p={cs.p}")
                print(
                    f"  {'run':28s} {'time (s)':>9s} {'model MB':>9s} {'fed MB':>8s} {'fed/model':>9s} "
                    f"{'network MB':>10s} {'model cost':>11s} {'CPU/run ms':>10s}"
                )
                times, cpus = {}, {}
                for strategy in STRATEGIES:
                    rels = {k: cs.from_numpy(v) for k, v in arrays.items()}
                    rel = chain(cs, rels, strategy)
                    secs, out, cpu = _timed(rel.numpy, args.repeat, pids)
                    np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-2 * np.abs(want).max())
                    stages = cs.executor.last_run
                    model = sum(st.modelled for st in stages) / 1e6
                    fed = sum(st.fed or 0 for st in stages) / 1e6
                    moved = sum(st.moved or 0 for st in stages) / 1e6
                    times[strategy] = secs
                    cpus[strategy] = cpu
                    cost = rel.plan().info.cost or 0.0
                    print(
                        f"  tensorsql {strategy:18s} {secs:9.3f} {model:9.2f} {fed:8.2f} {fed / model:9.3f} "
                        f"{moved:10.2f} {cost:11.4e} {1e3 * cpu:10.1f}"
                    )
                # the chain over the arrays themselves: the plan blocks every operand as it reads it (the
                # paper's setting), and the relation keeps them on the workers after its first run
                over = chain(cs, arrays, "eindecomp")
                secs, out, _ = _timed(over.numpy, args.repeat, [])
                np.testing.assert_allclose(out, want, rtol=2e-3, atol=2e-2 * np.abs(want).max())
                times["arrays"] = secs
                stages = len(cs.executor.last_run)
                plural = "s" * (stages > 1)
                print(f"  {'tensorsql eindecomp, arrays':28s} {secs:9.3f}   ({stages} stage{plural})")
                auto = _dask_array(cs.client, arrays, "auto", args.repeat)
                side = max(1, max(arrays["A"].shape) // 2)  # half the chain's long side
                hand = _dask_array(cs.client, arrays, (side, side), args.repeat)
                print(f"  {'dask.array, auto chunks':28s} {auto:9.3f}")
                print(f"  {'dask.array, ' + str(side) + '^2 chunks':28s} {hand:9.3f}")
                one = f"{1e3 * single_cpu[kind]:.1f}"
                print(f"  {'tensorsql, one process':28s} {single[kind]:9.3f} {'':52s} {one:>10s}")
                print(f"  {'tensorsql, one proc, arrays':28s} {single_arrays[kind]:9.3f}")
                print(f"  {'numpy, one process':28s} {floor[kind]:9.3f}")
                e = times["eindecomp"]
                # CPU times tick in 10 ms: a tiny run may read as none
                cpu_ratio = f"{cpus['eindecomp'] / single_cpu[kind]:.2f}x" if single_cpu[kind] else "n/a"
                print(
                    f"  eindecomp: {times['sqrt'] / e:.2f}x faster than sqrt, "
                    f"{min(auto, hand) / e:.2f}x than dask.array's best, "
                    f"{e / single[kind]:.2f}x the single-process time "
                    f"({cpu_ratio} its CPU); "
                    f"dask.array's best is {min(auto, hand) / floor[kind]:.2f}x numpy's one-process time"
                )
                print(
                    f"  over the arrays: {times['arrays'] / single_arrays[kind]:.2f}x the single-process "
                    f"time over the arrays, {min(auto, hand) / times['arrays']:.2f}x faster than "
                    "dask.array's best"
                )


if __name__ == "__main__":
    main()
