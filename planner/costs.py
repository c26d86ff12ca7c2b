"""Partition enumeration and the EinDecomp cost model (docs "EinDecomp").

A partitioning ``d`` gives every distinct label of an EinSum a number of parts (shared labels are
co-partitioned). Costs count tensor elements moved, as in the paper, with its typos corrected.

Ragged sizes (``b % d != 0``): tiles on the upper edge are smaller, but the planner costs every tile at
the full extent ``ceil(b / d)`` — the upper bound the paper's formulas assume — and "number of consumer
tiles" (``n / nc`` in the repartition formula) is ``prod(d_to)``. Both reduce to the paper's formulas when
d divides b. Any ``p`` works (not only powers of two): ``viable`` lists every ordered factorization of p over
the labels with ``d[l] <= b[l]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields
from functools import cache, lru_cache
from pathlib import Path

import numpy as np

from . import ops
from .einsum import EinSum, PlanningError

__all__ = [
    "CostModel",
    "agg_cost",
    "block_elements",
    "capped_viable",
    "join_cost",
    "kernel_calls",
    "repart_cost",
    "split_to_fit",
    "viable",
]


# ---- enumeration ---------------------------------------------------------------------------------------
@cache
def _divisors(n: int) -> tuple[int, ...]:
    small = [k for k in range(1, math.isqrt(n) + 1) if n % k == 0]
    return tuple(sorted(set(small + [n // k for k in small])))


@lru_cache(maxsize=4096)
def _factorizations(bounds: tuple[int, ...], p: int) -> tuple[tuple[int, ...], ...]:
    """All d with prod(d) == p and 1 <= d[i] <= bounds[i] (ordered, lexicographic)."""
    out: list[tuple[int, ...]] = []
    n = len(bounds)
    # suffix capacity lets us prune branches whose remaining labels cannot absorb the remaining factor
    cap = [1] * (n + 1)
    for i in range(n - 1, -1, -1):
        cap[i] = min(cap[i + 1] * bounds[i], p + 1)

    def rec(i: int, rest: int, acc: tuple[int, ...]) -> None:
        if i == n:
            if rest == 1:
                out.append(acc)
            return
        for f in _divisors(rest):
            if f > bounds[i]:
                break
            if rest // f <= cap[i + 1]:
                rec(i + 1, rest // f, (*acc, f))

    if p >= 1:
        rec(0, p, ())
    return tuple(out)


def _label_bounds(e: EinSum) -> tuple[int, ...]:
    return tuple(n for _, n in e.sizes)


def viable(einsum: EinSum, p: int) -> list[dict[str, int]]:
    """Every partitioning with exactly ``p`` kernel calls (N(d) = p), as label -> parts dicts."""
    _check_p(p)
    return [dict(zip(einsum.labels, d, strict=False)) for d in _factorizations(_label_bounds(einsum), p)]


@lru_cache(maxsize=4096)
def viable_array(einsum: EinSum, p: int) -> np.ndarray:
    """``viable`` as a (K, L) int array, columns in ``einsum.labels`` order (read-only, cached)."""
    rows = _factorizations(_label_bounds(einsum), p)
    arr = np.array(rows, dtype=np.int64).reshape(len(rows), len(einsum.labels))
    arr.setflags(write=False)
    return arr


@lru_cache(maxsize=4096)
def effective_p(einsum: EinSum, p: int) -> int:
    """The largest divisor of p that the EinSum can be split into (p itself unless the tensor is too small).

    A 3x5 matmul cannot make 16 kernel calls; it gets 8 (fewer calls rather than an invalid plan).
    """
    bounds = _label_bounds(einsum)
    for q in reversed(_divisors(p)):
        if _factorizations(bounds, q):
            return q
    return 1  # unreachable: q = 1 always has the all-ones vector


def _check_p(p: int) -> None:
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise PlanningError(f"p (the number of kernel calls) must be a positive int, got {p!r}")


# ---- a cap on block sizes --------------------------------------------------------------------------------
#: rows kept in a capped domain: enough for the cheapest splits, small enough for the pairwise edge tables
CAPPED_ROWS = 512
#: call counts tried above the lower bound before settling for the greedy split's count
CAPPED_TRIES = 256


def split_to_fit(
    sizes: Mapping[Hashable, int],
    tensors: Sequence[tuple[Sequence[Hashable], int]],
    cap: int,
    blocks: Mapping[Hashable, int] | None = None,
) -> dict[Hashable, int]:
    """Block size per label such that every tensor's block (its weight times the product of its labels'
    blocks; a repeated label counts once per occurrence) is at most ``cap``.

    Starts from ``blocks`` (whole labels where not given) and halves the largest block of the worst tensor
    until all fit (ties: the tensor's first label), so labels already small enough are left alone.
    """
    out = {lab: max(1, min(n, blocks.get(lab, n) if blocks else n)) for lab, n in sizes.items()}

    def cost(t: tuple[Sequence[Hashable], int]) -> int:
        return t[1] * math.prod(out[lab] for lab in t[0])

    while tensors:
        worst = max(tensors, key=cost)
        if cost(worst) <= cap:
            break
        labels = [lab for lab in dict.fromkeys(worst[0]) if out[lab] > 1]
        if not labels:
            raise PlanningError(f"a block of one element ({worst[1]}) exceeds the block cap of {cap}")
        lab = max(labels, key=out.__getitem__)
        out[lab] = -(-out[lab] // 2)
    return out


def block_elements(einsum: EinSum, D: np.ndarray) -> np.ndarray:
    """The largest block (elements) of the vertex's operands, as it reads them, and output, per row of D."""
    ix = _index(einsum)
    ext = np.ceil(ix.bounds / D.astype(np.float64))
    blocks = [ext[:, list(t)].prod(axis=1) for t in (*ix.ops, ix.out)]
    return np.max(blocks, axis=0)


def _frozen(a: np.ndarray) -> np.ndarray:
    a = np.ascontiguousarray(a)
    a.setflags(write=False)
    return a


def _cheapest(einsum: EinSum, D: np.ndarray) -> np.ndarray:
    """At most CAPPED_ROWS rows of D, those that move the fewest elements (join + aggregation)."""
    if len(D) <= CAPPED_ROWS:
        return D
    lc = local_costs(einsum, D)
    keep = np.sort(np.argsort(lc["join"] + lc["agg"], kind="stable")[:CAPPED_ROWS])
    return D[keep]


@lru_cache(maxsize=4096)
def capped_viable(einsum: EinSum, p: int, max_block: int | None) -> np.ndarray:
    """The partitionings the planner chooses among for ``p`` kernel calls when no block of the vertex (an
    operand as read, the output) may exceed ``max_block`` elements.

    ``viable_array`` at ``effective_p`` when some of those fit; otherwise the fitting rows of the least call
    count that has any, searched upward from the count the largest tensor needs, and at worst the count of
    a greedy split (``split_to_fit``), which always fits. Read-only, cached.
    """
    base = viable_array(einsum, effective_p(einsum, p))
    if max_block is None:
        return base
    fit = base[block_elements(einsum, base) <= max_block]
    if len(fit) == len(base):  # the cap removes nothing: the planner's own domain, as without a cap
        return base
    if len(fit):
        return _frozen(_cheapest(einsum, fit))
    bounds = _label_bounds(einsum)
    sizes = dict(einsum.sizes)
    tensors = [(labels, 1) for labels in (*einsum.inputs, einsum.output)]
    blocks = split_to_fit(sizes, tensors, max_block)
    greedy = np.array([[-(-n // blocks[lab]) for lab, n in einsum.sizes]], dtype=np.int64)
    top = int(greedy.prod())
    biggest = max(math.prod(sizes[lab] for lab in labels) for labels, _ in tensors)
    low = max(int(base[0].prod()) + 1, -(-biggest // max_block))
    for q in range(low, min(top, low + CAPPED_TRIES)):
        rows = np.array(_factorizations(bounds, q), dtype=np.int64).reshape(-1, len(bounds))
        fit = rows[block_elements(einsum, rows) <= max_block] if len(rows) else rows
        if len(fit):
            return _frozen(_cheapest(einsum, fit))
    rows = np.array(_factorizations(bounds, top), dtype=np.int64).reshape(-1, len(bounds))
    fit = rows[block_elements(einsum, rows) <= max_block]
    return _frozen(_cheapest(einsum, fit if len(fit) else greedy))


# ---- vectorized costs ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Index:
    """Column indices of an EinSum's labels, per role (repeated labels such as 'ii' repeat the index)."""

    ops: tuple[tuple[int, ...], ...]
    out: tuple[int, ...]
    agg: tuple[int, ...]
    bounds: np.ndarray


@lru_cache(maxsize=4096)
def _index(e: EinSum) -> _Index:
    pos = {lab: i for i, lab in enumerate(e.labels)}
    return _Index(
        tuple(tuple(pos[lab] for lab in op) for op in e.inputs),
        tuple(pos[lab] for lab in e.output),
        tuple(pos[lab] for lab in e.agg_labels),
        np.array(_label_bounds(e), dtype=np.float64),
    )


def local_costs(e: EinSum, D: np.ndarray) -> dict[str, np.ndarray]:
    """Per-row kernel calls, join and aggregation element counts and flops for partitionings D (K, L)."""
    ix = _index(e)
    Df = D.astype(np.float64)
    ext = np.ceil(ix.bounds / Df)
    calls = Df.prod(axis=1)
    sizes = [ext[:, list(op)].prod(axis=1) for op in ix.ops]
    join = calls * sum(sizes)
    nagg = Df[:, list(ix.agg)].prod(axis=1)
    nz = ext[:, list(ix.out)].prod(axis=1)
    agg = calls / nagg * (nagg - 1) * nz
    flops = calls * ext.prod(axis=1) * (ops.MAP_FLOPS if e.is_unary else ops.JOIN_FLOPS + ops.AGG_FLOPS)
    return {"calls": calls, "join": join, "agg": agg, "flops": flops}


def repart_matrix(bound: Sequence[int], F: np.ndarray, T: np.ndarray) -> np.ndarray:
    """cost_repart for every (row of F, row of T): producer parts F (n1, r) to consumer parts T (n2, r)."""
    b = np.asarray(bound, dtype=np.float64)
    ef = np.ceil(b / np.asarray(F, dtype=np.float64))  # producer tile extents
    et = np.ceil(b / np.asarray(T, dtype=np.float64))  # consumer tile extents
    n_p = ef.prod(axis=1)[:, None]
    n_c = et.prod(axis=1)[None, :]
    n_int = np.minimum(ef[:, None, :], et[None, :, :]).prod(axis=2)
    tiles_c = np.asarray(T, dtype=np.float64).prod(axis=1)[None, :]  # n / nc
    cost = (n_c / n_int - 1.0) * tiles_c * (n_c + n_p) + (n_p != n_int) * n_p * tiles_c
    return cost


# ---- scalar (public) costs -----------------------------------------------------------------------------
def _parts(e: EinSum, d: Mapping[str, int] | Sequence[int]) -> np.ndarray:
    """Normalize a partitioning (label dict, missing labels = 1, or a tuple in ``e.labels`` order)."""
    if isinstance(d, Mapping):
        unknown = set(d) - set(e.labels)
        if unknown:
            raise PlanningError(f"partitioning names labels not in {e.subscripts!r}: {sorted(unknown)}")
        vals = [d.get(lab, 1) for lab in e.labels]
    else:
        vals = list(d)
        if len(vals) != len(e.labels):
            raise PlanningError(
                f"partitioning {tuple(vals)} has {len(vals)} entries; {e.subscripts!r} has labels {e.labels}"
            )
    for lab, v, n in zip(e.labels, vals, _label_bounds(e), strict=False):
        if isinstance(v, bool) or int(v) != v or not 1 <= v <= n:
            raise PlanningError(f"label {lab!r}: parts {v!r} must be an int in 1..{n}")
    return np.array([vals], dtype=np.int64)


def _num(x: float) -> int | float:
    x = float(x)
    return int(x) if x.is_integer() else x


def kernel_calls(einsum: EinSum, d: Mapping[str, int] | Sequence[int]) -> int:
    """N(d): product of parts over the distinct labels of the inputs."""
    return int(_parts(einsum, d).prod())


def join_cost(einsum: EinSum, d: Mapping[str, int] | Sequence[int]) -> int | float:
    """N(d) * (nX + nY) elements fed to kernels (N(d) * nX for a unary EinSum)."""
    return _num(local_costs(einsum, _parts(einsum, d))["join"][0])


def agg_cost(einsum: EinSum, d: Mapping[str, int] | Sequence[int]) -> int | float:
    """(N / nagg) * (nagg - 1) * nZ elements moved to aggregate partial results."""
    return _num(local_costs(einsum, _parts(einsum, d))["agg"][0])


def repart_cost(bound: Sequence[int], d_from: Sequence[int], d_to: Sequence[int]) -> int | float:
    """Elements moved to turn a tensor of shape ``bound`` split ``d_from`` into one split ``d_to``."""
    bound, d_from, d_to = tuple(bound), tuple(d_from), tuple(d_to)
    if not len(bound) == len(d_from) == len(d_to):
        raise PlanningError(f"repart_cost: bound {bound}, d_from {d_from}, d_to {d_to} differ in rank")
    for n, a, c in zip(bound, d_from, d_to, strict=False):
        if not (1 <= a <= n and 1 <= c <= n):
            raise PlanningError(f"repart_cost: parts {d_from} / {d_to} must lie in 1..bound {bound}")
    return _num(repart_matrix(bound, np.array([d_from]), np.array([d_to]))[0, 0])


# ---- machine cost model --------------------------------------------------------------------------------
@dataclass(frozen=True)
class CostModel:
    """Seconds = (per_call * N + per_byte * bytes_moved + per_flop * flops) / min(N, workers).

    (The planner refines the divisor per vertex: calls into one output block run in order, and a call of
    ``split_flops`` per worker or more runs on several workers; see ``decompose._local_terms``.)

    Element counts (join, aggregation, repartition) become bytes via ``itemsize``. ``workers`` is how many
    kernel calls run at once; with the default 1 the formula is exactly the sum, and splitting only adds
    overhead, so ``choose_p`` prefers few large blocks. Defaults are what ``python -m tensorsql.calibrate
    --threads 2`` measured on the project's 2-core AVX-512 machine (2026-11-21): ~3 us per kernel call,
    ~6 ns per byte a repartition moves through DuckDB, ~14 ps per flop of a whole single-block matmul query.
    """

    per_call: float = 3e-6
    per_byte: float = 6e-9
    per_flop: float = 1.4e-11
    itemsize: int = 4
    workers: int = 1
    #: seconds per byte a join or aggregation hands through the engine (blocks copied at memory speed);
    #: None: the same as per_byte (the paper's model: every element moved costs the same)
    join_byte: float | None = None
    #: the engine hands a join's blocks through on one thread (a block relation has too few rows for
    #: DuckDB to split a scan), so the join term is not divided over the workers
    serial_join: bool = False
    #: seconds per byte to assemble a graph output whose blocks are not row slabs into one array (row
    #: slabs reach numpy without a copy), and to gather the blocks of an input free to split (one without a
    #: stored layout: an array operand) that a step reads split otherwise than in row slabs (row slabs of an
    #: array are read in place); 0: neither costs anything (the paper's model)
    assemble_byte: float = 0.0
    #: a kernel call with this many flops per worker or more splits itself over the workers (the kernels'
    #: threaded GEMM, udf_kernels/src/gemm.cpp); 0: a call always runs on one worker
    split_flops: float = 0.0
    #: seconds per byte of a tensor an engine re-splits, where it assembles every element of the new blocks
    #: once from pieces of the old ones (what ``python -m tensorsql.calibrate`` measures as ``per_byte``);
    #: None: a repartition costs ``per_byte`` per element of the paper's count (which charges a re-split as
    #: a join of the overlapping tiles and an aggregation: 2-15x the tensor for the usual re-splits)
    repart_byte: float | None = None
    #: seconds a repartition between two EinSum vertices, or an aggregation whose partial blocks of one
    #: output block come from different tasks (more summed parts than the calls merged into ``workers`` tasks
    #: can keep together), costs beyond its bytes: on a cluster each is a stage boundary (a round trip
    #: through the scheduler, the next stage's tasks planned afresh); 0: steps of one query (one process)
    exchange: float = 0.0
    #: calls beyond ``workers`` merge into a task per worker (along the summed labels first, then the
    #: largest), which reads each of its blocks once: the join term counts the blocks each task reads, not
    #: each call's (a cluster's stage); False: every call is fed its blocks (the paper)
    task_join: bool = False

    def __post_init__(self) -> None:
        for name in (
            "per_call",
            "per_byte",
            "per_flop",
            "join_byte",
            "split_flops",
            "assemble_byte",
            "repart_byte",
            "exchange",
        ):
            v = getattr(self, name)
            if v is None and name in ("join_byte", "repart_byte"):
                continue
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0 or not math.isfinite(v):
                raise PlanningError(f"CostModel.{name} must be a finite number >= 0, got {v!r}")
        for name in ("serial_join", "task_join"):
            if not isinstance(getattr(self, name), bool):
                raise PlanningError(f"CostModel.{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("itemsize", "workers"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise PlanningError(f"CostModel.{name} must be a positive int, got {v!r}")

    @property
    def join_byte_cost(self) -> float:
        return self.per_byte if self.join_byte is None else self.join_byte

    def seconds(self, calls: float, elements: float, flops: float) -> float:
        """Modelled time of one vertex: N calls moving ``elements`` and doing ``flops``."""
        par = max(1, min(calls, self.workers))
        return (
            self.per_call * calls + self.per_byte * self.itemsize * elements + self.per_flop * flops
        ) / par

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> CostModel:
        """Read coefficients written by ``save`` (or calibration); missing keys keep their defaults."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise PlanningError(f"cannot read cost model {str(path)!r}: {exc}") from None
        if not isinstance(data, dict):
            raise PlanningError(f"cost model {str(path)!r} must hold a JSON object")
        unknown = set(data) - {f.name for f in fields(cls)}
        if unknown:
            raise PlanningError(f"cost model {str(path)!r} has unknown keys {sorted(unknown)}")
        return cls(**data)
