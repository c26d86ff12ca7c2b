"""Choosing every tensor's blocking: the expression graph -> planner.EinGraph -> EinDecomp -> block sizes.

The planner prices inputs as free to split. That holds for numpy operands (tensorsql splits them when
it uploads them) but not for stored relations, whose re-split is real work; so for stored inputs the
EinDecomp plan competes with keeping the operands' own blocking, each charged its input repartitions.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from collections.abc import Callable
from dataclasses import dataclass, field

import planner as P
from tensorsql import expr as E
from tensorsql.errors import PlanError
from tensorsql.lower import Partitioning, default_partitioning, fused_steps
from tensorsql.subscripts import label_name

STRATEGIES = ("eindecomp", "sqrt", "data", "model", "none", "operands")
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: below this many elements in all inputs together, one block per tensor: splitting cannot pay off
SMALL_ELEMENTS = 1 << 16
#: seconds per byte a join hands through DuckDB on the project's machine (64 joined pairs of 4 MiB blocks,
#: 512 MiB, in ~0.15 s); a repartition (per_byte) costs ~20x more per byte: it slices and re-assembles in SQL
JOIN_BYTE = 3e-10
#: a kernel call of this many flops per worker or more runs as one threaded GEMM about as fast as split
#: calls do (2 workers: a 4096^2 float32 matmul as one block 1.02x numpy's time, as two row panels 1.12x;
#: the 1.2 GFLOP step of benchmark (d)'s TRN tree 15 ms against 17 ms), so fewer, larger blocks lose no
#: parallelism. Its permutes and copies stay serial: the square chain's 2 GFLOP calls measured ~1.1x slower
#: as single blocks than split (RESULTS.md).
SPLIT_FLOPS = 1e8
#: seconds a contraction costs as a query step of its own (join, group-by, result blob, pipeline) beyond its
#: kernel work: what fusing it into its consumer's kernel call saves (``lower.fused_steps``). Steps of a few
#: hundred microseconds of GEMM measured 0.6-0.9 ms each as steps of one query (benchmark (d)'s TRN tree).
STEP_SECONDS = 5e-4


def cost_model_path() -> pathlib.Path:
    env = os.environ.get("TENSORSQL_COST_MODEL")
    if env:
        return pathlib.Path(env)
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "tensorsql"
        / ("cost_model.json")
    )


def load_cost_model(workers: int) -> P.CostModel:
    """The calibrated model (``python -m tensorsql.calibrate``) if there is one, else the defaults."""
    path = cost_model_path()
    cm = P.CostModel()
    if path.is_file():
        try:
            cm = P.CostModel.load(path)
        except (OSError, ValueError, P.PlanningError):
            cm = P.CostModel()
    if cm.join_byte is None:  # the engine's terms, unless the file sets them (it then gives join_byte)
        cm = dataclasses.replace(
            cm, join_byte=JOIN_BYTE, serial_join=True, assemble_byte=JOIN_BYTE, split_flops=SPLIT_FLOPS
        )
    return dataclasses.replace(cm, workers=max(1, workers))


@dataclass
class PlanInfo:
    """What the planner decided and why, for explain()."""

    strategy: str
    p: int
    cost: float | None = None
    unit: str = "elements"
    node_costs: dict[int, dict[str, float]] = field(default_factory=dict)
    node_parts: dict[int, dict[str, int]] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    #: costs the SQRT/data/model baselines would have; computed on first explain(), not on every plan
    more_baselines: Callable[[], dict[str, float]] | None = field(default=None, repr=False)
    input_blocks: dict[int, tuple[int, ...]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _Graph:
    """The planner's view of an expression graph, with the maps back to expression nodes."""

    def __init__(self, root: E.Node) -> None:
        self.g = P.EinGraph()
        self.vertex: dict[int, P.Vertex] = {}
        self.node_of: dict[P.Vertex, E.Node] = {}
        self.letters: dict[int, dict[int, str]] = {}
        for node in E.topological(root):
            if any(n == 0 for n in node.shape):
                raise PlanError("zero-size dimension: nothing to plan")
            if isinstance(node, E.Source | E.Reblock):
                v = self.g.input(f"n{len(self.vertex)}", node.shape)
            elif isinstance(node, E.EinSum):
                labels = list(dict.fromkeys(x for t in node.in_labels for x in t))
                if len(labels) > len(_LETTERS):
                    raise PlanError("more than 52 labels in one step")
                m = {x: _LETTERS[i] for i, x in enumerate(labels)}
                self.letters[id(node)] = m
                spec = (
                    ",".join("".join(m[x] for x in t) for t in node.in_labels)
                    + "->"
                    + "".join(m[x] for x in node.out_labels)
                )
                ins = [self.vertex[id(c)] for c in node.inputs]
                join = node.join if len(ins) == 2 else "identity"
                v = self.g.einsum(spec, *ins, join=join, agg=node.agg)
            elif isinstance(node, E.Map | E.Cast):
                letters = _LETTERS[: len(node.shape)]
                fn = node.fn if isinstance(node, E.Map) else "cast"
                v = self.g.einsum(f"{letters}->{letters}", self.vertex[id(node.input)], join=fn)
            else:
                raise TypeError(f"unhandled expression node {type(node).__name__}")
            self.vertex[id(node)] = v
            self.node_of[v] = node

    def parts_of(self, node: E.Node, block_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(_ceil(n, b) for n, b in zip(node.shape, block_shape, strict=True))

    def partitioning(self, plan: P.Plan) -> Partitioning:
        label_blocks: dict[int, dict[int, int]] = {}
        shapes: dict[int, tuple[int, ...]] = {}
        for v, node in self.node_of.items():
            if isinstance(node, E.Source | E.Reblock):
                shapes[id(node)] = node.block_shape
            elif isinstance(node, E.EinSum):
                parts = plan.partitions[v]
                sizes = {
                    x: n
                    for c, t in zip(node.inputs, node.in_labels, strict=True)
                    for x, n in zip(t, c.shape, strict=True)
                }
                blocks = {x: _ceil(sizes[x], parts.get(ch, 1)) for x, ch in self.letters[id(node)].items()}
                label_blocks[id(node)] = blocks
                shapes[id(node)] = tuple(blocks[x] for x in node.out_labels)
            else:
                shapes[id(node)] = tuple(
                    _ceil(n, d) for n, d in zip(node.shape, plan.layouts[v], strict=True)
                )
        return Partitioning(label_blocks, shapes)

    def as_partitions(self, part: Partitioning) -> dict[P.Vertex, dict[str, int]]:
        """A Partitioning as the planner's parts per label, to cost it with ``planner.evaluate``."""
        out: dict[P.Vertex, dict[str, int]] = {}
        for v, node in self.node_of.items():
            if isinstance(node, E.EinSum):
                sizes = {
                    x: n
                    for c, t in zip(node.inputs, node.in_labels, strict=True)
                    for x, n in zip(t, c.shape, strict=True)
                }
                blocks = part.label_blocks[id(node)]
                out[v] = {ch: _ceil(sizes[x], blocks[x]) for x, ch in self.letters[id(node)].items()}
            elif isinstance(node, E.Map | E.Cast):
                parts = self.parts_of(node, part.block_shapes[id(node)])
                out[v] = dict(zip(_LETTERS, parts, strict=False))
        return out

    def input_repart(self, plan: P.Plan, stored: set[int]) -> float:
        """What re-splitting the stored inputs into the layouts ``plan`` reads them with costs."""
        total = 0.0
        for (v, k), want in plan.operand_layouts.items():
            u = v.inputs[k]
            node = self.node_of[u]
            if u.einsum is None and id(node) in stored:
                have = self.parts_of(node, node.block_shape)  # type: ignore[attr-defined]
                elements = P.repart_cost(node.shape, have, want)
                if plan.cost_model is not None:
                    elements = plan.cost_model.seconds(0, elements, 0)
                total += elements
        return total

    def wanted_inputs(self, plan: P.Plan) -> dict[int, tuple[int, ...]]:
        """Block shape each input is read with (by its first consumer)."""
        out: dict[int, tuple[int, ...]] = {}
        for (v, k), want in plan.operand_layouts.items():
            node = self.node_of[v.inputs[k]]
            if isinstance(node, E.Source) and id(node) not in out:
                out[id(node)] = tuple(_ceil(n, d) for n, d in zip(node.shape, want, strict=True))
        return out


def _record(info: PlanInfo, graph: _Graph, plan: P.Plan) -> None:
    info.cost = plan.cost
    info.unit = "seconds" if plan.cost_model is not None else "elements"
    for v, node in graph.node_of.items():
        if v in plan.breakdown:
            info.node_costs[id(node)] = dict(plan.breakdown[v])
        # parts shown in the einsum's own label names (the planner works on per-vertex letters); inputs,
        # maps and casts by dimension
        if isinstance(node, E.EinSum) and v in plan.partitions:
            parts = plan.partitions[v]
            info.node_parts[id(node)] = {
                label_name(x): parts.get(ch, 1) for x, ch in graph.letters[id(node)].items()
            }
        elif v in plan.layouts:
            info.node_parts[id(node)] = {f"dim{i}": d for i, d in enumerate(plan.layouts[v])}
    info.notes.extend(plan.notes)


def plan_blocks(
    root: E.Node,
    *,
    strategy: str,
    threads: int,
    free_inputs: set[int] | None = None,
    cost_model: P.CostModel | None = None,
) -> tuple[Partitioning, PlanInfo]:
    """Block sizes for every node of ``root`` under ``strategy`` (see STRATEGIES)."""
    if strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    free = free_inputs or set()
    if strategy == "operands":
        return default_partitioning(root), PlanInfo("operands", 0, notes=["blocks follow the operands"])
    try:
        graph = _Graph(root)
    except (PlanError, P.PlanningError) as exc:
        info = PlanInfo("operands", 0, notes=[f"planner skipped ({exc}); blocks follow the operands"])
        return default_partitioning(root), info
    inputs = [graph.node_of[v] for v in graph.g.vertices if v.einsum is None]
    stored = {id(n) for n in inputs if id(n) not in free}
    total = sum(_numel(n.shape) for n in inputs)
    cm = cost_model if cost_model is not None else load_cost_model(threads)
    try:
        if strategy == "eindecomp":
            p = 1 if total < SMALL_ELEMENTS else P.choose_p(graph.g, max(1, threads), cm)
        else:
            p = max(1, threads)
        plan = P.decompose(graph.g, p, strategy, cm)
        if strategy == "eindecomp" and p > 1 and cm.join_byte is not None:
            plan, p = _prefer_fused(root, graph, plan, p, cm)
    except Exception as exc:  # a planner failure must not cost the user their einsum
        info = PlanInfo(
            "operands", 0, notes=[f"planner failed ({type(exc).__name__}: {exc}); blocks follow the operands"]
        )
        return default_partitioning(root), info
    info = PlanInfo(strategy, p)
    _record(info, graph, plan)
    chosen = graph.partitioning(plan)
    if strategy == "eindecomp":
        info.more_baselines = lambda: {
            base: P.decompose(graph.g, max(1, threads), base, cm).cost for base in ("sqrt", "data", "model")
        }
        if stored:
            # the operands' own blocking, when re-splitting stored inputs costs more than it saves
            own = default_partitioning(root)
            own_plan = P.evaluate(graph.g, graph.as_partitions(own), cm, p=p, strategy="operands")
            own_cost = own_plan.cost + graph.input_repart(own_plan, stored)
            mine = plan.cost + graph.input_repart(plan, stored)
            info.baselines["operands"] = own_cost
            if own_cost < mine:
                info = PlanInfo(
                    "operands",
                    p,
                    baselines=info.baselines,
                    more_baselines=info.more_baselines,
                    notes=[
                        f"kept the operands' blocking: {own_cost:.3g} < eindecomp {mine:.3g} "
                        "with the stored inputs' repartitions"
                    ],
                )
                _record(info, graph, own_plan)
                return own, info
    info.input_blocks = graph.wanted_inputs(plan)
    return chosen, info


def _prefer_fused(root: E.Node, graph: _Graph, plan: P.Plan, p: int, cm: P.CostModel) -> tuple[P.Plan, int]:
    """The plan at ``p`` or the one-block plan (p = 1), whichever costs less once the query steps that fuse
    into one kernel call (``lower.fused_steps``) are credited. Only under the engine's cost terms: the paper's
    model has no per-step cost."""
    one = P.decompose(graph.g, 1, "eindecomp", cm)
    fused = fused_steps(root, graph.partitioning(one))
    mine = plan.cost - STEP_SECONDS * fused_steps(root, graph.partitioning(plan))
    if one.cost - STEP_SECONDS * fused < mine:
        note = (
            f"one block per tensor (p=1): {one.cost:.4g} s less {fused} fused steps "
            f"beats p={p} at {plan.cost:.4g} s"
        )
        return dataclasses.replace(one, notes=(*one.notes, note)), 1
    return plan, p


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


def override_blocks(root: E.Node, parts: dict[int, int]) -> Partitioning:
    """Explicit ``blocks={label: parts}``: those labels split so, everything else as the operands are."""
    base = default_partitioning(root)
    label_blocks = {}
    shapes = dict(base.block_shapes)
    for node in E.topological(root):
        if isinstance(node, E.EinSum):
            sizes = {
                x: n
                for c, t in zip(node.inputs, node.in_labels, strict=True)
                for x, n in zip(t, c.shape, strict=True)
            }
            blocks = dict(base.label_blocks[id(node)])
            for x in blocks:
                if x in parts:
                    blocks[x] = max(1, _ceil(sizes[x], parts[x]))
            label_blocks[id(node)] = blocks
            shapes[id(node)] = tuple(blocks[x] for x in node.out_labels)
        elif isinstance(node, E.Map | E.Cast):
            shapes[id(node)] = shapes[id(node.input)]
    return Partitioning(label_blocks, shapes)


def describe(info: PlanInfo) -> list[str]:
    lines = [f"strategy={info.strategy} p={info.p}"]
    if info.cost is not None:
        lines[0] += f" modelled cost={info.cost:.4g} {info.unit}"
    if info.more_baselines is not None:
        info.baselines = {**info.more_baselines(), **info.baselines}
        info.more_baselines = None
    if info.baselines:
        lines.append("baselines: " + ", ".join(f"{k}={v:.4g}" for k, v in info.baselines.items()))
    lines += [f"note: {n}" for n in info.notes]
    return lines


__all__ = [
    "STRATEGIES",
    "PlanInfo",
    "cost_model_path",
    "describe",
    "load_cost_model",
    "override_blocks",
    "plan_blocks",
]
