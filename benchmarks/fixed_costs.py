"""Fixed costs: first and warm calls of generated einsums, small calls, lazy relations, scoring in SQL and
small training, each against its peer in the same run.

Sections (``--only``, comma-separated; all by default):

- ``instances``: every instance of ``benchmarks.instances`` (the ``einsum_benchmark`` package's generators;
  opt_einsum takes 10 ms-5 s on each). *First call*: ``ts.einsum`` on an equation and shapes this process
  has not planned (measured once per instance, each its own first) against ``opt_einsum.contract``, which
  searches its path on every call (best of 3). *Warm call*: ``ts.einsum`` with its plan cached against
  ``opt_einsum.contract_expression`` (best of ``--repeat`` each). Targets: first calls <= 3x (geometric
  mean) and <= 10x (worst); warm calls <= 1.0x (geometric mean) and <= 1.5x (worst).
- ``small``: the runner's section f: 32^2 ``ts.einsum``, a ``contract_expression`` call and a lazy relation
  run again against a ``SELECT 1`` round trip on the session's connection, and a lazy relation made again
  (``s.einsum(...).numpy()``) against ``ts.einsum``; targets <= 1.5x.
- ``predict``: SQL ``predict(...)`` of a saved logistic regression over 1,000 rows; target <= 20 ms.
- ``fit``: an epoch of ``ml.fit`` (batch 64, an MLP with one hidden layer of 32, Adam) on each of
  scikit-learn's bundled classification sets against torch CPU on the same threads, the same model,
  optimizer, batch and epochs; target <= 1.5x. Needs scikit-learn and torch (``make bench``).

Timing: each side is timed in rounds of its own with a pause between (OpenBLAS's threads spin for ~0.1 s
after a call and would slow whichever side runs next on a 2-core machine).

Run: ``python -m benchmarks.fixed_costs [--only instances,small,predict,fit] [--repeat 5] [--markdown]
[--write-results]`` (the last rewrites this benchmark's section of benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import opt_einsum  # noqa: E402

import tensorsql as ts  # noqa: E402
from benchmarks.__main__ import ROWS, Row, emit, machine, markdown, write_results  # noqa: E402

PAUSE = 0.3  # seconds between one side's rounds and the other's


def _best(fn: Callable[[], object], repeat: int) -> float:
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def _per_call(fn: Callable[[], object], calls: int, repeat: int) -> float:
    for _ in range(10):
        fn()
    best = math.inf
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t) / calls)
    return best


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def section_instances(repeat: int, quick: bool) -> None:
    from benchmarks.instances import instances

    chosen = instances()[::3][:4] if quick else instances()
    ts.einsum("ij,jk->ik", np.ones((3, 4)), np.ones((4, 5)))  # the default session opened, not timed
    firsts, warms = [], []
    for inst in chosen:
        eq, ops = inst.arrays()
        time.sleep(PAUSE)
        t = time.perf_counter()
        got = ts.einsum(eq, *ops)
        first = time.perf_counter() - t
        time.sleep(PAUSE)
        want = opt_einsum.contract(eq, *ops)
        peer_first = _best(lambda eq=eq, ops=ops: opt_einsum.contract(eq, *ops), 3)
        scale = max(1.0, float(np.max(np.abs(want))))
        err = float(np.max(np.abs(np.asarray(got) - want))) / scale
        expr = opt_einsum.contract_expression(eq, *[o.shape for o in ops])
        time.sleep(PAUSE)
        warm = _best(lambda eq=eq, ops=ops: ts.einsum(eq, *ops), repeat)
        time.sleep(PAUSE)
        peer_warm = _best(lambda expr=expr, ops=ops: expr(*ops), repeat)
        note = f"{len(ops)} operands; max |diff| / max |value| = {err:.1e}"
        firsts.append(first / peer_first)
        warms.append(warm / peer_warm)
        emit(Row("instances", f"first call: {inst.name}", first, "oe.contract", peer_first, 10.0, note))
        emit(Row("instances", f"warm call: {inst.name}", warm, "oe expression", peer_warm, 1.5, note))
    gf, gw = _geomean(firsts), _geomean(warms)
    print(f"  first calls: geometric mean {gf:.2f}x (target <= 3x), worst {max(firsts):.2f}x (<= 10x)")
    print(f"  warm calls: geometric mean {gw:.2f}x (target <= 1.0x), worst {max(warms):.2f}x (<= 1.5x)")
    # the means as rows of their own (ratios of ratios: 'seconds' here are the ratios)
    emit(
        Row(
            "instances",
            "first calls, geometric mean of ratios",
            gf,
            "1x",
            1.0,
            3.0,
            f"{len(firsts)} instances",
        )
    )
    emit(
        Row(
            "instances", "warm calls, geometric mean of ratios", gw, "1x", 1.0, 1.0, f"{len(warms)} instances"
        )
    )


def section_small(repeat: int, quick: bool) -> None:
    """32^2 calls against a ``SELECT 1`` round trip, and a lazy relation made again against ``ts.einsum``
    (the runner's section f, every row's rounds interleaved)."""
    from benchmarks.__main__ import section_f

    section_f(repeat, quick)


def section_predict(repeat: int, quick: bool) -> None:
    from tensorsql import ml

    s = ts.connect()
    s.sql(
        "CREATE TABLE visits AS SELECT range AS id, random() AS pages, random() AS minutes, "
        "random() AS recency FROM range(1000)"
    )
    s.sql(
        "CREATE TABLE labelled AS SELECT *, CAST(pages + 2 * minutes - recency > 1 AS INTEGER) AS bought "
        "FROM visits"
    )
    model = ml.LogisticRegression(s, 3, dtype="float64")
    ml.fit(model, "labelled", ["pages", "minutes", "recency"], "bought", epochs=2, batch_size=128,
           optimizer=ml.Adam(0.3), progress=False)  # fmt: skip
    model.save("buyers")
    query = "SELECT * FROM predict('buyers', (SELECT id, pages, minutes, recency FROM visits), key => 'id')"
    took = _per_call(lambda: s.sql(query).fetchall(), 5 if quick else 20, repeat)
    emit(
        Row(
            "predict",
            "SQL predict(...) over 1,000 rows",
            took,
            "target",
            0.020,
            1.0,
            "a saved logistic regression",
        )
    )
    s.close()


def section_fit(repeat: int, quick: bool) -> None:
    try:
        import torch
        from sklearn import datasets
    except ImportError as exc:
        print(f"  fit: skipped ({exc}; make bench installs scikit-learn and torch)")
        return
    import pyarrow as pa

    from tensorsql import ml

    threads, epochs, batch = 2, 3 if quick else 5, 64
    torch.set_num_threads(threads)
    for name in ("iris", "wine", "breast_cancer", "digits"):
        d = getattr(datasets, f"load_{name}")()
        x = d.data.astype(np.float64)
        x = (x - x.mean(0)) / (x.std(0) + 1e-9)
        y = d.target.astype(np.int32)
        layers = [x.shape[1], 32, int(y.max()) + 1]
        s = ts.connect(threads=threads)
        feats = [f"f{i}" for i in range(x.shape[1])]
        s.executor.con.register("_rows", pa.table({**{f: x[:, i] for i, f in enumerate(feats)}, "label": y}))
        s.execute("CREATE TABLE rows AS SELECT * FROM _rows")

        def ours(s=s, layers=layers, feats=feats) -> None:
            model = ml.MLP(s, layers, dtype="float64")
            ml.fit(model, "rows", feats, "label", epochs=epochs, batch_size=batch, optimizer=ml.Adam(0.01),
                   progress=False)  # fmt: skip

        def theirs(x=x, y=y, layers=layers) -> None:
            torch.manual_seed(0)
            net = torch.nn.Sequential(
                torch.nn.Linear(layers[0], layers[1]), torch.nn.ReLU(), torch.nn.Linear(layers[1], layers[2])
            ).double()
            opt = torch.optim.Adam(net.parameters(), lr=0.01)
            xt, yt = torch.from_numpy(x), torch.from_numpy(y.astype(np.int64))
            loss_fn = torch.nn.CrossEntropyLoss()
            g = torch.Generator().manual_seed(0)
            for _ in range(epochs):
                perm = torch.randperm(len(xt), generator=g)
                for lo in range(0, len(xt), batch):
                    idx = perm[lo : lo + batch]
                    opt.zero_grad()
                    loss_fn(net(xt[idx]), yt[idx]).backward()
                    opt.step()

        ours()  # the first fit of this structure compiles its step: a later fit (the one timed) reuses it
        time.sleep(PAUSE)
        t_ours = _best(ours, repeat) / epochs
        time.sleep(PAUSE)
        t_theirs = _best(theirs, repeat) / epochs
        note = (
            f"{len(x)} rows x {x.shape[1]} features, MLP {layers}, batch {batch}, Adam, {epochs} epochs a fit"
        )
        emit(Row("fit", f"fit epoch: {name}", t_ours, "torch", t_theirs, 1.5, note))
        s.close()


SECTIONS = {
    "instances": section_instances,
    "small": section_small,
    "predict": section_predict,
    "fit": section_fit,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.fixed_costs", description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--quick", action="store_true", help="4 instances, fewer calls and epochs (a smoke run)")
    ap.add_argument("--markdown", action="store_true", help="print the rows as a Markdown table at the end")
    ap.add_argument(
        "--write-results",
        action="store_true",
        help="rewrite this benchmark's section of benchmarks/RESULTS.md with the rows of the run",
    )
    args = ap.parse_args(argv)
    print(machine())
    for name in args.only.split(","):
        if name not in SECTIONS:
            ap.error(f"unknown section {name!r}; sections: {', '.join(SECTIONS)}")
        print(f"== {name} ==", flush=True)
        SECTIONS[name](args.repeat, args.quick)
    if args.markdown:
        print(markdown())
    failed = [r for r in ROWS if r.verdict == "FAIL"]
    print(f"{len(ROWS)} rows, {len(failed)} over their target")
    if args.write_results:
        command = "python -m benchmarks.fixed_costs " + " ".join(argv if argv is not None else sys.argv[1:])
        write_results("fixed_costs", command.strip(), ROWS)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
