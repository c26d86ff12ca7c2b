"""Einsum instances from the ``einsum_benchmark`` package's generators (its generators only: nothing is
downloaded), sized so that ``opt_einsum.contract`` takes about 10 ms to 5 s on a 2-core machine.

Each instance is made by a generator with fixed arguments and seed, so every run (and every machine) times
the same equations and shapes. ``pip install einsum_benchmark`` (``make bench`` installs it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Instance:
    name: str
    family: str
    make: Callable[[], tuple[str, list[tuple[int, ...]]]]

    def build(self) -> tuple[str, list[tuple[int, ...]]]:
        """The equation, its labels renamed in order of appearance to opt_einsum's symbols (letters, then
        non-ASCII: some generators use digits, which numpy's grammar lacks), and the shapes."""
        from opt_einsum import get_symbol

        made = self.make()
        eq, shapes = made[0].replace(" ", ""), made[1]
        names: dict[str, str] = {}
        for ch in eq:
            if ch not in ",->" and ch not in names:
                names[ch] = get_symbol(len(names))
        eq = "".join(names.get(ch, ch) for ch in eq)
        return eq, [tuple(int(n) for n in s) for s in shapes]

    def arrays(self, seed: int = 0) -> tuple[str, list[np.ndarray]]:
        """The equation and float64 operands (standard normal, scaled so long contractions stay finite)."""
        eq, shapes = self.build()
        rng = np.random.default_rng(seed)
        return eq, [rng.standard_normal(s) for s in shapes]


def _generators():
    try:
        from einsum_benchmark.generators.language_model import p_first_and_last, sliding_likelihood
        from einsum_benchmark.generators.quantum_computing import matrix_product_state
        from einsum_benchmark.generators.random import connected_hypernetwork, connected_network
        from einsum_benchmark.generators.structured import lattice, matrix_chain, tree
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the einsum instances need the einsum_benchmark package: pip install einsum_benchmark "
            "(make bench installs it)"
        ) from exc
    return {
        "network": connected_network,
        "hypernetwork": connected_hypernetwork,
        "tree": tree,
        "lattice": lattice,
        "chain": matrix_chain,
        "mps": matrix_product_state,
        "lm_first_last": p_first_and_last,
        "lm_sliding": sliding_likelihood,
    }


def instances() -> list[Instance]:
    """The instances, in a fixed order."""
    g = _generators()
    net, hyper, tree, lattice = g["network"], g["hypernetwork"], g["tree"], g["lattice"]
    chain, mps, pfl, slide = g["chain"], g["mps"], g["lm_first_last"], g["lm_sliding"]
    return [
        Instance("network 10 (s0)", "network", lambda: net(10, 3.0, 2, 4, 14, seed=0)),
        Instance("network 10 (s2)", "network", lambda: net(10, 3.0, 2, 6, 18, seed=2)),
        Instance("network 12 (s3)", "network", lambda: net(12, 3.0, 2, 5, 16, seed=3)),
        Instance("network 30 (s5)", "network", lambda: net(30, 3.5, 2, 3, 9, seed=5)),
        Instance("network 40 (s0)", "network", lambda: net(40, 3.0, 2, 3, 7, seed=0)),
        Instance(
            "network 15, global dim (s0)", "network", lambda: net(15, 3.0, 3, 3, 9, seed=0, global_dim=True)
        ),
        Instance(
            "hypernetwork 20 (s1)",
            "hypernetwork",
            lambda: hyper(
                20, 3.0, 5, 3, number_of_output_indices=2, min_axis_size=3, max_axis_size=9, seed=1
            ),
        ),
        Instance(
            "hypernetwork 40 (s0)",
            "hypernetwork",
            lambda: hyper(
                40, 2.5, 5, 3, number_of_output_indices=2, min_axis_size=2, max_axis_size=7, seed=0
            ),
        ),
        Instance(
            "hypernetwork 20, self edges (s1)",
            "hypernetwork",
            lambda: hyper(
                20,
                3.0,
                6,
                3,
                number_of_output_indices=2,
                number_of_self_edges=2,
                number_of_single_summation_indices=2,
                min_axis_size=3,
                max_axis_size=8,
                seed=1,
            ),
        ),
        Instance("tree 50 (s0)", "tree", lambda: tree(50, 6, 16, 2, seed=0)),
        Instance("tree 50 (s1)", "tree", lambda: tree(50, 6, 16, 2, seed=1)),
        Instance("tree 100 (s0)", "tree", lambda: tree(100, 4, 10, 2, seed=0)),
        Instance("tree 200 (s11)", "tree", lambda: tree(200, 3, 8, 2, seed=11)),
        Instance("lattice 3x3x3 (s0)", "lattice", lambda: lattice((3, 3, 3), False, 3, 4, seed=0)),
        Instance("lattice 3x3x3 (s1)", "lattice", lambda: lattice((3, 3, 3), False, 3, 4, seed=1)),
        Instance("lattice 5x6 (s7)", "lattice", lambda: lattice((5, 6), False, 8, 12, seed=7)),
        Instance("lattice 4x4 cyclic (s8)", "lattice", lambda: lattice((4, 4), True, 6, 9, seed=8)),
        Instance("matrix chain 10 (s0)", "chain", lambda: chain(10, 100, 1000, True, seed=0)),
        Instance("matrix chain 10 (s1)", "chain", lambda: chain(10, 100, 1000, True, seed=1)),
        Instance("matrix chain 30 (s9)", "chain", lambda: chain(30, 200, 1200, True, seed=9)),
        Instance("matrix chain 60 (s10)", "chain", lambda: chain(60, 100, 600, True, seed=10)),
        Instance("mps 40 sites (s0)", "mps", lambda: mps(40, 8, 32, 48, seed=0)),
        Instance("mps 100 sites (s0)", "mps", lambda: mps(100, 4, 16, 48, seed=0)),
        Instance("mps 100 sites (s1)", "mps", lambda: mps(100, 4, 16, 48, seed=1)),
        Instance("language model p(first, last), depth 2", "language model", lambda: pfl(2, 8, 60)),
        Instance("language model p(first, last), depth 3", "language model", lambda: pfl(3, 4, 40)),
        Instance("language model sliding likelihood", "language model", lambda: slide(1, 8, 80, 40)),
    ]
