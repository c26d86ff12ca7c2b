"""EinDecomp: choose a partitioning for every EinSum vertex of an EinGraph, plus comparison baselines.

The optimisation is a min-sum problem: one variable per EinSum vertex (its index into ``viable``), a unary
term per vertex (join + aggregation) and a pairwise term per producer -> consumer edge (repartition).
Inputs are not variables: one declared without a layout costs nothing in every partitioning (the paper's
inputs, pre-partitioned offline); one stored in a layout of its own (``EinGraph.input(parts=)``) charges each
consumer the repartition from that layout, a unary term of the consumer.

It is solved by variable elimination with numpy (min over one axis of broadcast sums). On a tree this *is*
the paper's DP: eliminating a vertex leaves a table over its consumer, M[v, d]. On a DAG it plans shared
vertices jointly — the table keeps the shared vertex's choice as an axis until all its consumers have
been folded in — which is exact as long as the tables stay small. The fallback is the paper's
linearization: a vertex with more than ``joint_consumers`` consumers keeps only the edge on its longest
path, the other edges are ignored while optimising (and then charged as fixed terms in a few refinement
rounds); if some table would still exceed ``joint_cap`` entries, every shared vertex is linearized, which
leaves a forest and so pairwise tables only. ``Plan.cost`` always charges every edge, whatever was solved.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np

from .costs import (
    CostModel,
    _divisors,
    _index,
    block_elements,
    capped_viable,
    effective_p,
    local_costs,
    repart_matrix,
)
from .einsum import EinSum, PlanningError
from .graph import EinGraph, Vertex
from .strategies import OPERANDS, PLANNER_STRATEGIES

__all__ = ["Plan", "best_of", "choose_p", "decompose", "evaluate", "plans_by_p"]


@dataclass(frozen=True, eq=False)
class Plan:
    """A partitioning per vertex with its modelled cost.

    ``partitions``: EinSum vertex -> {label: parts}; an input vertex gets its layout (a stored input's own,
    ``EinGraph.input(parts=)``; else the split its first consumer reads it with), keyed by that consumer's
    labels (a repeated label: its last dimension's parts). ``layouts``: vertex -> parts per dimension of
    the vertex's tensor. ``operand_layouts``: (consumer, operand index) -> parts the consumer reads that
    operand with (differs from the producer's layout where a repartition happens). ``breakdown``: EinSum
    vertex -> {join, agg, repart, compute, total, calls}; units are elements moved when ``cost_model`` is
    None (compute is then 0), else seconds.
    """

    graph: EinGraph
    p: int
    strategy: str
    partitions: dict[Vertex, dict[str, int]]
    layouts: dict[Vertex, tuple[int, ...]]
    operand_layouts: dict[tuple[Vertex, int], tuple[int, ...]]
    breakdown: dict[Vertex, dict[str, float]]
    cost: float
    cost_model: CostModel | None = None
    notes: tuple[str, ...] = field(default=())

    def calls(self, v: Vertex) -> int:
        """Kernel calls N(d) of an EinSum vertex."""
        return int(self.breakdown[v]["calls"])

    @property
    def repartitions(self) -> list[tuple[Vertex, Vertex, int, tuple[int, ...], tuple[int, ...]]]:
        """(producer, consumer, operand, from parts, to parts) for every edge that must be re-split: from an
        EinSum vertex, or from an input stored in a layout of its own (``EinGraph.input(parts=)``)."""
        out = []
        for (v, k), want in self.operand_layouts.items():
            u = v.inputs[k]
            if (u.einsum is not None or u.layout is not None) and self.layouts[u] != want:
                out.append((u, v, k, self.layouts[u], want))
        return out


# ---- cached numeric pieces -----------------------------------------------------------------------------
def _domain(e: EinSum, p: int, max_block: int | None = None) -> np.ndarray:
    return capped_viable(e, p, max_block)


def _model_scale(cm: CostModel, calls: np.ndarray) -> np.ndarray:
    return 1.0 / np.minimum(calls, cm.workers)


def _local_terms(e: EinSum, D: np.ndarray, cm: CostModel | None) -> dict[str, np.ndarray]:
    lc = local_costs(e, D)
    if cm is None:
        zero = np.zeros_like(lc["join"])
        return {"join": lc["join"], "agg": lc["agg"], "compute": zero, "calls": lc["calls"]}
    # calls that reduce into the same output block run one after another (the executor's fused aggregate
    # accumulates a group in order), so a vertex runs in parallel only across its output blocks
    out = list(dict.fromkeys(_index(e).out))
    groups = D[:, out].astype(np.float64).prod(axis=1) if out else np.ones(len(D))
    s = _model_scale(cm, groups)
    byte = cm.join_byte_cost * cm.itemsize
    # a big call splits its GEMM over the workers itself, so fewer, larger blocks lose no parallelism
    split = np.ones(len(D))
    if cm.split_flops > 0:
        per_call = lc["flops"] / np.maximum(lc["calls"], 1)
        split = np.clip(np.floor(per_call / cm.split_flops), 1, cm.workers)
    s_compute = 1.0 / np.minimum(np.maximum(groups, split), cm.workers)
    ix = _index(e)
    join = lc["join"]
    crossing = np.zeros(len(D), dtype=bool)
    if cm.task_join or cm.exchange:
        tasks = _task_cuts(D, ix.agg, cm.workers)
        if ix.agg:  # partial blocks of one output block made by different tasks: a stage combines them
            crossing = (tasks[:, list(ix.agg)] > 1).any(axis=1)
        if cm.task_join:
            ext = np.ceil(ix.bounds / D.astype(np.float64)) * (D / tasks)  # a task's extent per label
            join = tasks.astype(np.float64).prod(axis=1) * sum(ext[:, list(op)].prod(axis=1) for op in ix.ops)
    return {
        "join": join * byte * (1.0 if cm.serial_join else s),
        "agg": lc["agg"] * byte * s + crossing * cm.exchange,
        "compute": (cm.per_call * lc["calls"] + cm.per_flop * lc["flops"]) * s_compute,
        "calls": lc["calls"],
    }


def _task_cuts(D: np.ndarray, summed: tuple[int, ...], workers: int) -> np.ndarray:
    """The tasks a cluster's stage runs each row of D's calls as: where there are more calls than
    ``workers``, neighbouring calls merge (a label's parts halved, rounding up) until at most ``workers``
    tasks remain, the summed labels first (their partials then add up inside a task), then the most split
    label; so the executor's ``_Run.cuts_keeping`` without its memory floor (ties go to the later label
    here, to the larger key name there). All rows at once, one halving per round."""
    tasks = np.array(D, dtype=np.int64)
    L = tasks.shape[1]
    is_summed = np.zeros(L, dtype=bool)
    is_summed[list(summed)] = True
    order = np.arange(L)[None, :]
    while True:
        rows = np.flatnonzero(tasks.astype(np.float64).prod(axis=1) > workers)
        if not len(rows):
            return tasks
        sub = tasks[rows]
        splittable = sub > 1
        first = splittable & is_summed[None, :]
        pool = np.where(first.any(axis=1)[:, None], first, splittable)
        pick = np.where(pool, sub * (L + 1) + order, -1).argmax(axis=1)
        at = np.arange(len(rows))
        sub[at, pick] = -(-sub[at, pick] // 2)
        tasks[rows] = sub


def _assemble_vector(e: EinSum, D: np.ndarray, cm: CostModel | None) -> np.ndarray:
    """Seconds to assemble a graph output into one array when its blocks are not row slabs (some
    dimension after the first is split): one more copy of the result (``CostModel.assemble_byte``)."""
    if cm is None or cm.assemble_byte == 0:
        return np.zeros(len(D))
    dims = list(dict.fromkeys(_index(e).out))
    if len(dims) < 2:
        return np.zeros(len(D))
    split_later = (D[:, dims[1:]] > 1).any(axis=1)
    numel = float(np.prod(np.asarray(e.output_shape, dtype=np.float64)))
    return split_later * (numel * cm.itemsize * cm.assemble_byte)


def _gather_terms(
    shape: tuple[int, ...], ev: EinSum, k: int, Dv: np.ndarray, cm: CostModel | None
) -> np.ndarray:
    """Seconds to gather an input free to split (no stored layout: an array operand) into the blocks operand
    k of ``ev`` reads it in, per row of Dv: one copy of the tensor (``CostModel.assemble_byte``) unless the
    blocks are row slabs (only its first dimension longer than 1 split), which are read in place."""
    if cm is None or cm.assemble_byte == 0:
        return np.zeros(len(Dv))
    T = Dv[:, list(_index(ev).ops[k])]
    lead = next((d for d, n in enumerate(shape) if n > 1), None)
    others = [d for d in range(len(shape)) if d != lead]
    if not others:
        return np.zeros(len(Dv))
    gathered = (T[:, others] > 1).any(axis=1)
    numel = float(np.prod(np.asarray(shape, dtype=np.float64)))
    return gathered * (numel * cm.itemsize * cm.assemble_byte)


@lru_cache(maxsize=4096)
def _gather_vector(
    shape: tuple[int, ...], ev: EinSum, k: int, p: int, cm: CostModel | None, max_block: int | None
) -> np.ndarray:
    vec = _gather_terms(shape, ev, k, _domain(ev, p, max_block), cm)
    vec.setflags(write=False)
    return vec


def _leading_nudge(e: EinSum, D: np.ndarray, unary: np.ndarray) -> np.ndarray | float:
    """Among equal-cost splits of a graph output, prefer those on its leading dimensions: the result's
    blocks are then row slabs, which reach numpy without a copy. The nudge (1e-9 of the vertex's cheapest
    cost per later split dimension) never outweighs a real cost difference; it steers the search only and
    is not part of any plan's cost."""
    if not len(unary):
        return 0.0
    dims = list(dict.fromkeys(_index(e).out))
    later = sum((D[:, d] > 1) * r for r, d in enumerate(dims))
    return 1e-9 * max(float(np.min(unary)), 1e-300) * later


@lru_cache(maxsize=4096)
def _local_table(e: EinSum, p: int, cm: CostModel | None, max_block: int | None) -> dict[str, np.ndarray]:
    """``_local_terms`` over the whole domain, computed once per (vertex, p, model, cap): the DP's unary
    vectors and the chosen plan's breakdown both read it."""
    t = _local_terms(e, _domain(e, p, max_block), cm)
    for a in t.values():
        a.setflags(write=False)
    return t


@lru_cache(maxsize=4096)
def _local_vector(e: EinSum, p: int, cm: CostModel | None, max_block: int | None) -> np.ndarray:
    t = _local_table(e, p, cm, max_block)
    vec = t["join"] + t["agg"] + t["compute"]
    vec.setflags(write=False)
    return vec


def _edge_terms(
    eu: EinSum, ev: EinSum, k: int, Du: np.ndarray, Dv: np.ndarray, cm: CostModel | None
) -> np.ndarray:
    """Repartition cost (model units) for every (row of Du, row of Dv) on edge u -> operand k of v."""
    F = Du[:, list(_index(eu).out)]
    T = Dv[:, list(_index(ev).ops[k])]
    return _repart_terms(eu.output_shape, F, T, Dv, cm, exchange=True)


def _repart_terms(
    bound: tuple[int, ...],
    F: np.ndarray,
    T: np.ndarray,
    Dv: np.ndarray,
    cm: CostModel | None,
    *,
    exchange: bool,
) -> np.ndarray:
    """Cost (model units) of re-splitting a tensor of shape ``bound`` from each row of F to each row of T,
    the consumer's rows of its partitionings being Dv: the paper's element count; under a cost model,
    seconds spread over the consumer's calls (``CostModel.repart_byte`` per byte of the tensor where set),
    plus ``CostModel.exchange`` per re-split where ``exchange`` (between EinSum vertices: a stage boundary
    on a cluster; a stored input is re-split inside the tasks that read it)."""
    if len(F) * len(T) <= 64:  # evaluation of one plan: no point deduplicating
        R = repart_matrix(bound, F, T)
    else:  # many viable vectors share an output/operand split: cost each distinct pair once
        Fu, inv_f = np.unique(F, axis=0, return_inverse=True)
        Tu, inv_t = np.unique(T, axis=0, return_inverse=True)
        R = repart_matrix(bound, Fu, Tu)[inv_f.reshape(-1)][:, inv_t.reshape(-1)]
    if cm is None:
        return R
    moved = R > 0
    if cm.repart_byte is None:
        seconds = R * (cm.per_byte * cm.itemsize)
    else:
        numel = float(np.prod(np.asarray(bound, dtype=np.float64)))
        seconds = moved * (numel * cm.itemsize * cm.repart_byte)
    seconds = seconds * _model_scale(cm, Dv.astype(np.float64).prod(axis=1))[None, :]
    if exchange and cm.exchange:
        seconds = seconds + moved * cm.exchange
    return seconds


@lru_cache(maxsize=4096)
def _input_vector(
    shape: tuple[int, ...],
    layout: tuple[int, ...],
    ev: EinSum,
    k: int,
    p: int,
    cm: CostModel | None,
    max_block: int | None,
) -> np.ndarray:
    """What reading an input stored split ``layout`` as operand k of ``ev`` costs, per row of ev's domain."""
    Dv = _domain(ev, p, max_block)
    vec = _input_terms(shape, layout, ev, k, Dv, cm)
    vec.setflags(write=False)
    return vec


def _input_terms(
    shape: tuple[int, ...], layout: tuple[int, ...], ev: EinSum, k: int, Dv: np.ndarray, cm: CostModel | None
) -> np.ndarray:
    T = Dv[:, list(_index(ev).ops[k])]
    return _repart_terms(shape, np.array([layout], dtype=np.int64), T, Dv, cm, exchange=False)[0]


@lru_cache(maxsize=4096)
def _edge_matrix(
    eu: EinSum, ev: EinSum, k: int, p: int, cm: CostModel | None, max_block: int | None
) -> np.ndarray:
    M = _edge_terms(eu, ev, k, _domain(eu, p, max_block), _domain(ev, p, max_block), cm)
    M.setflags(write=False)
    return M


# ---- evaluation ----------------------------------------------------------------------------------------
def _row(e: EinSum, d: Mapping[str, int] | Sequence[int] | np.ndarray) -> np.ndarray:
    from .costs import _parts

    if isinstance(d, np.ndarray):
        return d.reshape(1, -1).astype(np.int64)
    return _parts(e, d)


def _build_plan(
    graph: EinGraph,
    rows: dict[Vertex, np.ndarray],
    p: int,
    strategy: str,
    cm: CostModel | None,
    notes=(),
    *,
    at: dict[Vertex, int] | None = None,
    max_block: int | None = None,
) -> Plan:
    """The plan of one row per EinSum vertex. ``at``: each row's index in the vertex's domain at (p,
    max_block), when it came from there: its terms are then read from the tables the DP built."""
    partitions: dict[Vertex, dict[str, int]] = {}
    layouts: dict[Vertex, tuple[int, ...]] = {}
    operand_layouts: dict[tuple[Vertex, int], tuple[int, ...]] = {}
    breakdown: dict[Vertex, dict[str, float]] = {}
    total = 0.0
    for v in graph.vertices:
        e = v.einsum
        if e is None:
            continue
        d = rows[v]
        ix = _index(e)
        partitions[v] = {lab: int(x) for lab, x in zip(e.labels, d[0], strict=False)}
        layouts[v] = tuple(int(d[0, i]) for i in ix.out)
        i = at.get(v) if at is not None else None
        if i is not None:
            table = _local_table(e, p, cm, max_block)
            b = {key: float(table[key][i]) for key in ("join", "agg", "compute", "calls")}
        else:
            t = _local_terms(e, d, cm)
            b = {key: float(t[key][0]) for key in ("join", "agg", "compute", "calls")}
        repart = 0.0
        for k, u in enumerate(v.inputs):
            operand_layouts[(v, k)] = tuple(int(d[0, j]) for j in ix.ops[k])
            if u.einsum is not None:
                iu = at.get(u) if at is not None else None
                if i is not None and iu is not None:
                    repart += float(_edge_matrix(u.einsum, e, k, p, cm, max_block)[iu, i])
                else:
                    repart += float(_edge_terms(u.einsum, e, k, rows[u], d, cm)[0, 0])
            elif u.layout is not None:
                if i is not None:
                    repart += float(_input_vector(u.shape, u.layout, e, k, p, cm, max_block)[i])
                else:
                    repart += float(_input_terms(u.shape, u.layout, e, k, d, cm)[0])
            elif i is not None:  # an input free to split, read in blocks that are not row slabs: gathered
                repart += float(_gather_vector(u.shape, e, k, p, cm, max_block)[i])
            else:
                repart += float(_gather_terms(u.shape, e, k, d, cm)[0])
        b["repart"] = repart
        b["total"] = b["join"] + b["agg"] + b["repart"] + b["compute"]
        if not graph.consumers(v):
            b["assemble"] = float(_assemble_vector(e, d, cm)[0])
            b["total"] += b["assemble"]
        breakdown[v] = b
        total += b["total"]
    for v in graph.vertices:  # inputs: a stored one's own layout, else the one its first consumer reads
        if v.einsum is not None:
            continue
        layouts[v] = v.layout or tuple(1 for _ in v.shape)
        partitions[v] = {}
        for c in graph.consumers(v):
            k = c.inputs.index(v)
            layouts[v] = v.layout or operand_layouts[(c, k)]
            partitions[v] = dict(zip(c.einsum.inputs[k], layouts[v], strict=False))
            break
    return Plan(graph, p, strategy, partitions, layouts, operand_layouts, breakdown, total, cm, tuple(notes))


def evaluate(
    graph: EinGraph,
    partitions: Mapping[Vertex, Mapping[str, int] | Sequence[int]],
    cost_model: CostModel | None = None,
    *,
    p: int = 0,
    strategy: str = "custom",
) -> Plan:
    """Cost a given partitioning of every EinSum vertex with the same model ``decompose`` uses."""
    rows = {}
    for v in graph.vertices:
        if v.einsum is not None:
            if v not in partitions:
                raise PlanningError(f"no partitioning given for {v!r}")
            rows[v] = _row(v.einsum, partitions[v])
    return _build_plan(graph, rows, p, strategy, cost_model)


# ---- min-sum variable elimination ----------------------------------------------------------------------
class _TooBig(Exception):
    pass


#: the most variables one elimination table may join (numpy's limit is 64 axes)
MAX_SCOPE = 32


def _min_sum(
    doms: list[int], unary: list[np.ndarray], pairs: dict[tuple[int, int], np.ndarray], cap: float
) -> list[int]:
    """argmin over x of sum_i unary[i][x_i] + sum_(u,v) pairs[u,v][x_u, x_v], by greedy-order elimination.

    Eliminates the variable whose new table is smallest (ties: earliest, i.e. topological order, so a tree
    is solved leaves-first exactly like the paper's DP). Raises _TooBig when no table fits under ``cap``.
    """
    n = len(doms)
    nbr: list[set[int]] = [set() for _ in range(n)]
    fac_of: list[set[int]] = [set() for _ in range(n)]
    factors: dict[int, tuple[tuple[int, ...], np.ndarray]] = {}
    counter = 0

    def add(scope: tuple[int, ...], arr: np.ndarray) -> None:
        nonlocal counter
        factors[counter] = (scope, arr)
        for v in scope:
            fac_of[v].add(counter)
        counter += 1

    unary = list(unary)
    edges: list[tuple[int, int, np.ndarray]] = []
    for (u, v), M in pairs.items():
        # a variable of one value (a small tensor's one partitioning) has nothing to choose: its edges are
        # unary terms of the other side. Left in, eliminating it would join its neighbours into one table of
        # size-1 axes whose count passes numpy's 64 (a deep network's gradient)
        if doms[u] == 1 or doms[v] == 1:
            if doms[u] > 1:
                unary[u] = unary[u] + M[:, 0]
            elif doms[v] > 1:
                unary[v] = unary[v] + M[0, :]
            continue
        edges.append((u, v, M) if u < v else (v, u, M.T))
    for i in range(n):
        add((i,), unary[i])
    for u, v, M in edges:
        add((u, v), M)
        nbr[u].add(v)
        nbr[v].add(u)

    def score(x: int) -> int:
        s = 1
        for y in nbr[x]:
            s *= doms[y]
        return s

    cur = [score(i) for i in range(n)]
    heap = [(cur[i], i) for i in range(n)]
    heapq.heapify(heap)
    done = [False] * n
    trail: list[tuple[int, tuple[int, ...], np.ndarray]] = []
    while heap:
        s, x = heapq.heappop(heap)
        if done[x] or s != cur[x]:
            continue
        if s * doms[x] > cap or len(nbr[x]) >= MAX_SCOPE:  # numpy's arrays have at most 64 axes
            raise _TooBig
        done[x] = True
        U = sorted(nbr[x] | {x})
        pos = {v: j for j, v in enumerate(U)}
        acc: np.ndarray | float = 0.0
        for fid in fac_of[x]:
            scope, arr = factors.pop(fid)
            shape = [1] * len(U)
            for v in scope:
                shape[pos[v]] = doms[v]
                if v != x:
                    fac_of[v].discard(fid)
            acc = acc + arr.reshape(shape)
        fac_of[x] = set()
        acc = np.asarray(acc)
        ax = pos[x]
        arg = acc.argmin(axis=ax)
        best = acc.min(axis=ax)
        scope = tuple(v for v in U if v != x)
        trail.append((x, scope, arg))
        if scope:
            add(scope, best)
        for y in scope:
            nbr[y].discard(x)
            nbr[y].update(z for z in scope if z != y)
            cur[y] = score(y)
            heapq.heappush(heap, (cur[y], y))
    vals = [0] * n
    for x, scope, arg in reversed(trail):
        vals[x] = int(arg[tuple(vals[s] for s in scope)])
    return vals


class _Problem:
    """The EinSum vertices of a graph as variables, with cached unary and edge tables."""

    def __init__(self, graph: EinGraph, p: int, cm: CostModel | None, max_block: int | None = None) -> None:
        self.graph, self.p, self.cm = graph, p, cm
        self.verts = [v for v in graph.vertices if v.einsum is not None]
        self.idx = {v: i for i, v in enumerate(self.verts)}
        self.D = [_domain(v.einsum, p, max_block) for v in self.verts]
        self.doms = [len(d) for d in self.D]
        outputs = set(graph.outputs)
        self.unary = [
            _local_vector(v.einsum, p, cm, max_block) + _assemble_vector(v.einsum, d, cm)
            if v in outputs
            else _local_vector(v.einsum, p, cm, max_block)
            for v, d in zip(self.verts, self.D, strict=True)
        ]
        for i, v in enumerate(self.verts):  # reading an input (re-split or gathered): a term of the reader
            for k, u in enumerate(v.inputs):
                if u.einsum is None and u.layout is not None:
                    self.unary[i] = self.unary[i] + _input_vector(
                        u.shape, u.layout, v.einsum, k, p, cm, max_block
                    )
                elif u.einsum is None and cm is not None and cm.assemble_byte:
                    self.unary[i] = self.unary[i] + _gather_vector(u.shape, v.einsum, k, p, cm, max_block)
        self.nudge = [
            _leading_nudge(v.einsum, d, u) if v in outputs else 0.0
            for v, d, u in zip(self.verts, self.D, self.unary, strict=True)
        ]
        # edges (u, v, k): EinSum producer u feeds operand k of EinSum consumer v
        self.edges = [
            (self.idx[u], i, k)
            for i, v in enumerate(self.verts)
            for k, u in enumerate(v.inputs)
            if u.einsum is not None
        ]
        self.edge_tab = [
            _edge_matrix(self.verts[u].einsum, self.verts[v].einsum, k, p, cm, max_block)
            for u, v, k in self.edges
        ]

    def total(self, vals: list[int]) -> float:
        t = sum(float(self.unary[i][x]) for i, x in enumerate(vals))
        return t + sum(
            float(M[vals[u], vals[v]]) for (u, v, _), M in zip(self.edges, self.edge_tab, strict=False)
        )

    def solve(self, cut: set[int], fixed: list[int] | None, cap: float) -> list[int]:
        unary = [u + t for u, t in zip(self.unary, self.nudge, strict=True)]
        pairs: dict[tuple[int, int], np.ndarray] = {}
        for j, ((u, v, _), M) in enumerate(zip(self.edges, self.edge_tab, strict=False)):
            if j in cut:
                if fixed is not None:
                    unary[v] = unary[v] + M[fixed[u]]
                continue
            pairs[(u, v)] = pairs[(u, v)] + M if (u, v) in pairs else M
        return _min_sum(self.doms, unary, pairs, cap)

    def heights(self) -> list[int]:
        """Longest path (in EinSum vertices) from each vertex to a sink."""
        h = [0] * len(self.verts)
        out: list[list[int]] = [[] for _ in self.verts]
        for u, v, _ in self.edges:
            out[u].append(v)
        for i in range(len(self.verts) - 1, -1, -1):
            h[i] = 1 + max((h[c] for c in out[i]), default=0)
        return h

    def cuts(self, max_consumers: int) -> set[int]:
        """Edges dropped by linearization: shared vertices with > max_consumers consumers keep the edge
        to the consumer on their longest path (the paper's longest path first)."""
        h = self.heights()
        by_prod: dict[int, list[int]] = {}
        for j, (u, _, _) in enumerate(self.edges):
            by_prod.setdefault(u, []).append(j)
        cut: set[int] = set()
        for js in by_prod.values():
            consumers = {self.edges[j][1] for j in js}
            if len(consumers) <= max_consumers:
                continue
            keep = max(sorted(consumers), key=lambda c: h[c])
            cut.update(j for j in js if self.edges[j][1] != keep)
        return cut


def _eindecomp(prob: _Problem, joint_consumers: int, joint_cap: float) -> tuple[list[int], list[str]]:
    notes: list[str] = []
    cut = prob.cuts(joint_consumers)
    try:
        vals = prob.solve(cut, None, joint_cap)
    except _TooBig:
        notes.append(f"joint tables over {joint_cap:g} entries: every shared vertex linearized")
        cut = prob.cuts(1)
        vals = prob.solve(cut, None, math.inf)
    if cut:
        notes.append(f"{len(cut)} edge(s) linearized")
        best = prob.total(vals)
        for _ in range(3):  # charge the ignored edges as fixed terms given the current choice
            cand = prob.solve(cut, vals, math.inf)
            c = prob.total(cand)
            if c >= best * (1 - 1e-12):
                break
            vals, best = cand, c
    return vals, notes


# ---- baselines -----------------------------------------------------------------------------------------
def _baseline_row(e: EinSum, p: int, strategy: str, max_block: int | None = None) -> np.ndarray:
    """The viable partitioning nearest (in log parts) to the baseline's target; ties favour the labels the
    baseline splits first. Always a valid vector with N(d) = effective_p(e, p), or more calls where blocks
    would exceed ``max_block`` (elements); "none" splits nothing unless a block would exceed it."""
    L = len(e.labels)
    ones = np.ones((1, L), dtype=np.int64)
    if L == 0 or (strategy == "none" and (max_block is None or block_elements(e, ones)[0] <= max_block)):
        return ones
    D = _domain(e, 1 if strategy == "none" else p, max_block)
    q = math.prod(int(v) for v in D[0])  # Python ints: 2**50 x 2**50 parts wrapped int64
    ix = _index(e)
    out = list(dict.fromkeys(ix.out)) or [0]
    rest = [i for i in range(L) if i not in out]
    target = np.zeros(L)
    if strategy == "none":
        prio = out + rest
    elif strategy == "data":
        target[out[0]] = math.log(q)
        prio = out + rest
    elif strategy == "model":
        target[out[-1]] = math.log(q)
        prio = out[::-1] + rest
    else:  # sqrt: the first two output labels ~ sqrt(p) each (one label gets p if the output is a vector)
        k = min(2, len(out))
        for i in out[:k]:
            target[i] = math.log(q) / k
        prio = out + rest
    logd = np.log(D.astype(np.float64))
    dist = np.round(np.abs(logd - target).sum(axis=1), 9)
    keys = [-logd[:, i] for i in reversed(prio)] + [dist]
    best = np.lexsort(keys)[0]
    return D[best : best + 1]


# ---- entry points --------------------------------------------------------------------------------------
def _check_max_block(max_block: object) -> None:
    bad = isinstance(max_block, bool) or not isinstance(max_block, int) or max_block < 1
    if max_block is not None and bad:
        raise PlanningError(f"max_block must be a positive int (elements) or None, got {max_block!r}")


def _check_strategy(strategy: object) -> None:
    """A strategy ``decompose`` computes; "operands" and unknown names raise PlanningError."""
    if strategy == OPERANDS:
        raise PlanningError(
            f"strategy {OPERANDS!r} is tensorsql's keep-the-operands'-blocking strategy, not a planner "
            "strategy: every step's blocking follows tensorsql's propagation of its operands' "
            f"(planner.evaluate costs a given blocking); planner strategies: {', '.join(PLANNER_STRATEGIES)}"
        )
    if not isinstance(strategy, str) or strategy not in PLANNER_STRATEGIES:
        raise PlanningError(f"unknown strategy {strategy!r}; choose one of {', '.join(PLANNER_STRATEGIES)}")


def decompose(
    graph: EinGraph,
    p: int,
    strategy: str = "eindecomp",
    cost_model: CostModel | None = None,
    *,
    joint_consumers: int = 3,
    joint_cap: float = 2**20,
    max_block: int | None = None,
) -> Plan:
    """Partition every EinSum vertex of ``graph`` into ``p`` kernel calls and cost the result.

    A vertex too small for p kernel calls gets the largest divisor of p it can take (``effective_p``).
    ``max_block``: no block of any vertex (an operand as read, an output) may hold more elements; a vertex
    whose tensors need it gets more than p calls (``capped_viable``).
    ``cost_model`` None costs elements moved (the paper); a CostModel costs seconds. "none" ignores p.
    ``strategy`` is one of ``PLANNER_STRATEGIES``; "operands" (tensorsql's keep-the-blocking strategy, see
    ``planner.strategies``) raises PlanningError, as does an unknown name.
    """
    if not isinstance(graph, EinGraph):
        raise PlanningError(f"decompose needs an EinGraph, got {type(graph).__name__}")
    if isinstance(p, bool) or not isinstance(p, int) or p < 1:
        raise PlanningError(f"p must be a positive int, got {p!r}")
    _check_strategy(strategy)
    if cost_model is not None and not isinstance(cost_model, CostModel):
        raise PlanningError(f"cost_model must be a CostModel or None, got {type(cost_model).__name__}")
    _check_max_block(max_block)
    verts = [v for v in graph.vertices if v.einsum is not None]
    notes: list[str] = []
    if strategy == "eindecomp":
        prob = _Problem(graph, p, cost_model, max_block)
        vals, notes = _eindecomp(prob, joint_consumers, joint_cap)
        rows = {v: prob.D[i][vals[i] : vals[i] + 1] for i, v in enumerate(verts)}
        at = {v: vals[i] for i, v in enumerate(verts)}
    else:
        rows = {v: _baseline_row(v.einsum, p, strategy, max_block) for v in verts}
        at = None
    small = [v.name for v in verts if strategy != "none" and effective_p(v.einsum, p) != p]
    if small:
        notes.append(f"{len(small)} vertex(es) too small for p={p}, fewer calls: {', '.join(small[:5])}")
    calls = {v: math.prod(int(x) for x in rows[v].ravel()) for v in verts}  # Python ints: no int64 wrap
    capped = [v.name for v in verts if calls[v] > max(p, 1) and strategy != "none"]
    capped += [v.name for v in verts if strategy == "none" and calls[v] > 1]
    if capped:
        notes.append(
            f"{len(capped)} vertex(es) split into more calls to keep blocks within {max_block} elements: "
            + ", ".join(capped[:5])
        )
    return _build_plan(graph, rows, p, strategy, cost_model, notes, at=at, max_block=max_block)


def _candidates(max_p: int) -> list[int]:
    primes = [q for q in _divisors(max_p) if q > 1 and all(q % r for r in range(2, math.isqrt(q) + 1))]
    cands = {1, max_p} | {1 << k for k in range(max_p.bit_length()) if 1 << k <= max_p}
    cands |= {m for m in range(2, max_p + 1) if any(m % q == 0 for q in primes)}
    return sorted(cands)


def plans_by_p(
    graph: EinGraph,
    max_p: int,
    cost_model: CostModel | None = None,
    strategy: str = "eindecomp",
    *,
    max_block: int | None = None,
) -> dict[int, Plan]:
    """The plan at every candidate kernel-call count ``choose_p`` weighs (1..max_p: powers of two and
    multiples of max_p's prime factors), so a caller that goes on with one of them (or compares two) does
    not decompose the graph again."""
    if isinstance(max_p, bool) or not isinstance(max_p, int) or max_p < 1:
        raise PlanningError(f"max_p must be a positive int, got {max_p!r}")
    cm = cost_model if cost_model is not None else CostModel()
    return {q: decompose(graph, q, strategy, cm, max_block=max_block) for q in _candidates(max_p)}


def best_of(plans: Mapping[int, Plan]) -> Plan:
    """The least modelled cost among ``plans_by_p``'s plans; a tie goes to fewer calls."""
    best: Plan | None = None
    for q in sorted(plans):
        if best is None or plans[q].cost < best.cost * (1 - 1e-12):
            best = plans[q]
    if best is None:
        raise PlanningError("no candidate plans")
    return best


def choose_p(
    graph: EinGraph,
    max_p: int,
    cost_model: CostModel | None = None,
    strategy: str = "eindecomp",
    *,
    max_block: int | None = None,
) -> int:
    """The kernel-call count (1..max_p: powers of two and multiples of max_p's prime factors) whose plan has
    the least modelled time. With per-call overhead dominating, fewer larger blocks win. ``max_block`` as in
    ``decompose``."""
    return best_of(plans_by_p(graph, max_p, cost_model, strategy, max_block=max_block)).p
