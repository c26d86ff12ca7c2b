"""Planner speed and plan quality: LLaMA-7B-shaped graph planning time, and the paper's matrix chains.

Run: ``python benchmarks/planner_speed.py``. Prints the time to plan a 32-layer LLaMA graph at p = 16
(target < 2 s) and the modelled cost (elements moved) of every strategy on the square and skewed chains at
p = 16, with the ratio to SQRT (target: skewed EinDecomp <= 0.5x SQRT).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import planner
from planner.models import llama_graph, matrix_chain


def main(p: int = 16, s: int = 1000) -> None:
    t0 = time.perf_counter()
    g = llama_graph()
    t1 = time.perf_counter()
    plan = planner.decompose(g, p)
    t2 = time.perf_counter()
    n_einsum = sum(1 for v in g.vertices if v.einsum is not None)
    print(f"llama graph: {len(g)} vertices ({n_einsum} einsums), built in {t1 - t0:.3f} s")
    print(f"eindecomp plan time at p={p}: {t2 - t1:.3f} s (target < 2 s)")
    print(f"  notes: {'; '.join(plan.notes) or '-'}")
    for strategy in planner.PLANNER_STRATEGIES:
        c = planner.decompose(g, p, strategy).cost
        print(f"  llama {strategy:9s} cost {c:.4e}  ratio to eindecomp {c / plan.cost:.2f}")
    for kind in ("square", "skewed"):
        chain = matrix_chain(kind, s)
        costs = {st: planner.decompose(chain, p, st).cost for st in planner.PLANNER_STRATEGIES}
        print(f"{kind} chain (s={s}), p={p}:")
        for st, c in costs.items():
            note = "  (1 kernel call per vertex: not comparable)" if st == "none" else ""
            print(f"  {st:9s} cost {c:.4e}  ratio to sqrt {c / costs['sqrt']:.3f}{note}")
        print(f"  eindecomp / sqrt = {costs['eindecomp'] / costs['sqrt']:.3f}")


if __name__ == "__main__":
    main()
