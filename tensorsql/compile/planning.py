"""Choosing every tensor's blocking: the expression graph -> planner.EinGraph -> EinDecomp -> block sizes.

Array operands (``E.Operand``) are free to split: the executor uploads them in the blocking the plan reads
them with. Stored relations are not: the planner gets their blocking (``EinGraph.input(parts=)``) and
charges every read of one in another blocking, so EinDecomp plans over them as they are stored; the plan
still competes with keeping the operands' own blocking (which may make another number of calls than p).
Engine terms (what a join, a re-split or a query step costs on this engine) come from the executor's
``EngineProfile``, and so does the cap on block bytes: EinDecomp chooses among partitionings whose blocks
fit it, and ``fit_blocks`` holds every strategy's blocks (explicit ``blocks=`` included) to it.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
from dataclasses import dataclass

import planner as P
from tensorsql.compile.fuse import fused_steps
from tensorsql.compile.lower import default_partitioning
from tensorsql.compile.plan import PlanInfo
from tensorsql.compile.profile import EngineProfile
from tensorsql.dtypes import DTYPES
from tensorsql.errors import PlanError
from tensorsql.frontend.subscripts import label_name
from tensorsql.ir import expr as E
from tensorsql.ir.blocking import MAX_BLOCK_BYTES, Partitioning, ceil_div, numel, slice_blocks

#: every strategy a user can name: the one registry, shared with the planner (``planner.strategies``)
STRATEGIES = P.STRATEGIES
_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
#: below this many elements in all inputs together, one block per tensor: splitting cannot pay off
SMALL_ELEMENTS = 1 << 16


def check_strategy(strategy: object) -> str:
    if not isinstance(strategy, str) or strategy not in STRATEGIES:
        raise PlanError(f"unknown strategy {strategy!r}; choose one of {', '.join(STRATEGIES)}")
    return strategy


@dataclass(frozen=True)
class PlanOptions:
    """How a relation asks to be planned, validated once where it is made: a strategy (None: the session's
    default) and explicit parts per label (``blocks=``, label -> parts)."""

    strategy: str | None = None
    blocks: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        if self.strategy is not None:
            check_strategy(self.strategy)

    @property
    def parts(self) -> dict[int, int] | None:
        return dict(self.blocks) if self.blocks else None
def cost_model_path() -> pathlib.Path:
    env = os.environ.get("TENSORSQL_COST_MODEL")
    if env:
        return pathlib.Path(env)
    return (
        pathlib.Path(os.environ.get("XDG_CACHE_HOME", pathlib.Path.home() / ".cache"))
        / "tensorsql"
        / ("cost_model.json")
    )


def load_cost_model(workers: int, engine: EngineProfile | None = None) -> P.CostModel:
    """The calibrated model (``python -m tensorsql.calibrate``) if there is one, else the defaults, with the
    engine's own terms on top unless the file sets them."""
    path = cost_model_path()
    cm = P.CostModel()
    if path.is_file():
        try:
            cm = P.CostModel.load(path)
        except (OSError, ValueError, P.PlanningError):
            cm = P.CostModel()
    if cm.join_byte is None and engine is not None:  # unless the file sets them (it then gives join_byte)
        cm = dataclasses.replace(
            cm,
            join_byte=engine.join_byte,
            serial_join=True,
            assemble_byte=engine.join_byte,
            split_flops=engine.split_flops,
        )
    # the executor's own terms (a cluster's): its re-split and stage costs unless the file sets them, and how
    # it runs a step's calls (``task_join``: a property of the executor, not of the machine)
    if engine is not None:
        if cm.repart_byte is None and engine.repart_byte is not None:
            cm = dataclasses.replace(cm, repart_byte=engine.repart_byte)
        if not cm.exchange and engine.exchange:
            cm = dataclasses.replace(cm, exchange=engine.exchange)
        if engine.task_join:
            cm = dataclasses.replace(cm, task_join=True)
    return dataclasses.replace(cm, workers=max(1, workers))


class _Graph:
    """The planner's view of an expression graph, with the maps back to expression nodes."""

    def __init__(self, root: E.Node) -> None:
        self.g = P.EinGraph()
        self.vertex: dict[E.Node, P.Vertex] = {}
        self.node_of: dict[P.Vertex, E.Node] = {}
        self.letters: dict[E.Node, dict[int, str]] = {}
        for node in E.topological(root):
            if any(n == 0 for n in node.shape):
                raise PlanError("zero-size dimension: nothing to plan")
            if isinstance(node, E.Source | E.Reblock):
                # a stored relation (or an explicit reblock) has a blocking of its own: the planner charges
                # every read of it split otherwise (the DP plans over it, not as if it were free to split)
                parts = self.parts_of(node, node.block_shape)
                v = self.g.input(f"n{len(self.vertex)}", node.shape, parts)
            elif isinstance(node, E.Operand | E.Slice):
                # an array operand is uploaded in the blocking its reader wants; a slice keeps its input's
                # blocking (``slice_blocks``), which its reader reads in any blocking (``lower._reblock``)
                v = self.g.input(f"n{len(self.vertex)}", node.shape)
            elif isinstance(node, E.EinSum):
                labels = list(dict.fromkeys(x for t in node.in_labels for x in t))
                if len(labels) > len(_LETTERS):
                    raise PlanError("more than 52 labels in one step")
                m = {x: _LETTERS[i] for i, x in enumerate(labels)}
                self.letters[node] = m
                spec = (
                    ",".join("".join(m[x] for x in t) for t in node.in_labels)
                    + "->"
                    + "".join(m[x] for x in node.out_labels)
                )
                ins = [self.vertex[c] for c in node.inputs]
                join = node.join if len(ins) == 2 else "identity"
                v = self.g.einsum(spec, *ins, join=join, agg=node.agg)
            elif isinstance(node, E.Map | E.Cast):
                letters = _LETTERS[: len(node.shape)]
                fn = node.fn if isinstance(node, E.Map) else "cast"
                v = self.g.einsum(f"{letters}->{letters}", self.vertex[node.input], join=fn)
            else:
                raise TypeError(f"unhandled expression node {type(node).__name__}")
            self.vertex[node] = v
            self.node_of[v] = node

    def parts_of(self, node: E.Node, block_shape: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(ceil_div(n, b) for n, b in zip(node.shape, block_shape, strict=True))

    def partitioning(self, plan: P.Plan) -> Partitioning:
        """The plan's blocks per node; an array operand is read in the blocking its first consumer wants."""
        wanted = self.wanted_inputs(plan)
        label_blocks: dict[E.EinSum, dict[int, int]] = {}
        shapes: dict[E.Node, tuple[int, ...]] = {}
        for v, node in self.node_of.items():
            if isinstance(node, E.Source | E.Reblock):
                shapes[node] = node.block_shape
            elif isinstance(node, E.Operand):
                shapes[node] = wanted.get(node, tuple(max(1, n) for n in node.shape))
            elif isinstance(node, E.Slice):
                shapes[node] = slice_blocks(node.count, node.keep, shapes[node.input])
            elif isinstance(node, E.EinSum):
                parts = plan.partitions[v]
                sizes = {
                    x: n
                    for c, t in zip(node.inputs, node.in_labels, strict=True)
                    for x, n in zip(t, c.shape, strict=True)
                }
                blocks = {x: ceil_div(sizes[x], parts.get(ch, 1)) for x, ch in self.letters[node].items()}
                kept: set[int] = set()  # a label split as two stored operands are: the first one's blocks
                for c, t in zip(node.inputs, node.in_labels, strict=True):
                    for x, n, b in zip(t, c.shape, _stored_blocks(c), strict=True):
                        d = parts.get(self.letters[node][x], 1)
                        if b is not None and x not in kept and _block(n, d, b) == b:
                            blocks[x] = b
                            kept.add(x)
                label_blocks[node] = blocks
                shapes[node] = tuple(blocks[x] for x in node.out_labels)
            else:  # a map or cast
                child = node.input  # type: ignore[attr-defined]
                shapes[node] = tuple(
                    _block(n, d, b)
                    for n, d, b in zip(node.shape, plan.layouts[v], _stored_blocks(child), strict=True)
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
                blocks = part.label_blocks[node]
                out[v] = {ch: ceil_div(sizes[x], blocks[x]) for x, ch in self.letters[node].items()}
            elif isinstance(node, E.Map | E.Cast):
                parts = self.parts_of(node, part.block_shapes[node])
                out[v] = dict(zip(_LETTERS, parts, strict=False))
        return out

    def wanted_inputs(self, plan: P.Plan) -> dict[E.Node, tuple[int, ...]]:
        """Block shape each input leaf is read with (by its first consumer)."""
        out: dict[E.Node, tuple[int, ...]] = {}
        for (v, k), want in plan.operand_layouts.items():
            node = self.node_of[v.inputs[k]]
            if isinstance(node, E.Source | E.Operand) and node not in out:
                out[node] = tuple(ceil_div(n, d) for n, d in zip(node.shape, want, strict=True))
        return out


def _stored_blocks(node: E.Node) -> tuple[int | None, ...]:
    """A stored relation's (or an explicit reblock's) block shape; None per dimension for any other node."""
    if isinstance(node, E.Source | E.Reblock):
        return node.block_shape
    return (None,) * len(node.shape)


def _block(n: int, parts: int, stored: int | None) -> int:
    """The block of a dimension of ``n`` split in ``parts``: a stored operand's own (``stored``) where it is
    split so. A ragged 10 in blocks of 6 is 2 parts; ceil(10 / 2) = 5 would re-split it, a re-split the
    planner did not charge."""
    if stored is not None and ceil_div(n, stored) == parts:
        return stored
    return ceil_div(n, parts)


def _record(info: PlanInfo, graph: _Graph, plan: P.Plan) -> None:
    info.cost = plan.cost
    info.unit = "seconds" if plan.cost_model is not None else "elements"
    for v, node in graph.node_of.items():
        if v in plan.breakdown:
            info.node_costs[node] = dict(plan.breakdown[v])
        # parts shown in the einsum's own label names (the planner works on per-vertex letters); inputs,
        # maps and casts by dimension
        if isinstance(node, E.EinSum) and v in plan.partitions:
            parts = plan.partitions[v]
            info.node_parts[node] = {
                label_name(x): parts.get(ch, 1) for x, ch in graph.letters[node].items()
            }
        elif v in plan.layouts:
            info.node_parts[node] = {f"dim{i}": d for i, d in enumerate(plan.layouts[v])}
    info.notes.extend(plan.notes)


def plan_blocks(
    root: E.Node,
    *,
    strategy: str,
    threads: int,
    engine: EngineProfile | None = None,
    cost_model: P.CostModel | None = None,
) -> tuple[Partitioning, PlanInfo]:
    """Block sizes for every node of ``root`` under ``strategy`` (see STRATEGIES), every block within the
    engine's ``max_block_bytes``.

    Array operands (``E.Operand``) are free to split; stored relations (``E.Source``) are charged their
    re-split. A graph the planner cannot model (a zero-size dimension, more than 52 labels in a step) keeps
    the operands' blocking, with a note; any other planner error is a bug and surfaces.
    """
    cap = max_block_bytes(engine)
    part, info = _plan_blocks(root, strategy, threads, engine, cost_model, cap)
    return _capped(root, part, info, cap)


def max_block_bytes(engine: EngineProfile | None) -> int:
    return engine.max_block_bytes if engine is not None else MAX_BLOCK_BYTES


def _itemsize(dtype: str) -> int:
    dt = DTYPES.get(dtype)
    return dt.itemsize if dt is not None else 16


def _max_block_elements(root: E.Node, cap: int) -> int:
    """The cap in elements of the graph's widest dtype (the planner counts elements, not bytes)."""
    return max(1, cap // max(_itemsize(n.dtype) for n in E.topological(root)))


def _capped(
    root: E.Node, part: Partitioning, info: PlanInfo, cap: int
) -> tuple[Partitioning, PlanInfo]:
    fitted = fit_blocks(root, part, cap)
    if fitted is not part:
        info.notes.append(f"blocks split further to stay within {cap} bytes (max_block_bytes)")
    return fitted, info


def _plan_blocks(
    root: E.Node,
    strategy: str,
    threads: int,
    engine: EngineProfile | None,
    cost_model: P.CostModel | None,
    cap: int,
) -> tuple[Partitioning, PlanInfo]:
    if strategy == "operands":
        return default_partitioning(root), PlanInfo("operands", 0, notes=["blocks follow the operands"])
    try:
        graph = _Graph(root)
    except (PlanError, P.PlanningError) as exc:
        info = PlanInfo("operands", 0, notes=[f"planner skipped ({exc}); blocks follow the operands"])
        return default_partitioning(root), info
    inputs = [graph.node_of[v] for v in graph.g.vertices if v.einsum is None]
    # a slice takes whatever blocking its consumer reads it in (``lower._reblock``): no re-split to cost
    stored = {n for n in inputs if not isinstance(n, E.Operand | E.Slice)}
    total = sum(numel(n.shape) for n in inputs)
    cm = cost_model if cost_model is not None else load_cost_model(threads, engine)
    limit = _max_block_elements(root, cap)
    try:
        if strategy == "eindecomp":
            # each candidate p decomposed once: the best of them, and p = 1 for the fused comparison below
            by_p = (
                {1: P.decompose(graph.g, 1, strategy, cm, max_block=limit)}
                if total < SMALL_ELEMENTS
                else P.plans_by_p(graph.g, max(1, threads), cm, max_block=limit)
            )
            plan = P.best_of(by_p)
            p = plan.p
        else:
            p = max(1, threads)
            plan = P.decompose(graph.g, p, strategy, cm, max_block=limit)
        if strategy == "eindecomp" and p > 1 and cm.join_byte is not None and engine is not None:
            plan, p = _prefer_fused(root, graph, plan, by_p[1], cm, engine.step_seconds)
    except P.PlanningError as exc:  # a graph outside the planner's model: keep the operands' blocking
        info = PlanInfo("operands", 0, notes=[f"planner skipped ({exc}); blocks follow the operands"])
        return default_partitioning(root), info
    info = PlanInfo(strategy, p)
    _record(info, graph, plan)
    chosen = graph.partitioning(plan)
    if strategy == "eindecomp":
        info.more_baselines = lambda: {
            base: P.decompose(graph.g, max(1, threads), base, cm, max_block=limit).cost
            for base in ("sqrt", "data", "model")
        }
        if stored:
            # the operands' own blocking, which may make more (or fewer) calls than p: the plan at p charged
            # its stored inputs' repartitions already, and so does this one
            own = fit_blocks(root, default_partitioning(root), cap)
            own_plan = P.evaluate(graph.g, graph.as_partitions(own), cm, p=p, strategy="operands")
            info.baselines["operands"] = own_plan.cost
            if own_plan.cost < plan.cost:
                info = PlanInfo(
                    "operands",
                    p,
                    baselines=info.baselines,
                    more_baselines=info.more_baselines,
                    notes=[
                        f"kept the operands' blocking: {own_plan.cost:.3g} < eindecomp {plan.cost:.3g}, "
                        "each with its stored inputs' repartitions"
                    ],
                )
                _record(info, graph, own_plan)
                return own, info
    return chosen, info


def _prefer_fused(
    root: E.Node,
    graph: _Graph,
    plan: P.Plan,
    one: P.Plan,
    cm: P.CostModel,
    step_seconds: float,
) -> tuple[P.Plan, int]:
    """The plan at ``p`` or the one-block plan (p = 1), whichever costs less once the query steps that fuse
    into one kernel call (``fuse.fused_steps``) are credited ``step_seconds`` each; the split plan must save
    at least one more step: it has query steps the one-block plan lacks (grouping partial blocks, reblocking
    between steps split differently), which the model does not charge. (A logistic regression's step, 8192
    x 100 float32, split in two: 5.3 ms; one block per tensor: 3.4 ms.) Only under the engine's cost terms:
    the paper's model has no per-step cost."""
    p = plan.p
    fused = fused_steps(root, graph.partitioning(one))
    mine = plan.cost - step_seconds * fused_steps(root, graph.partitioning(plan))
    if one.cost - step_seconds * fused < mine + step_seconds:
        note = (
            f"one block per tensor (p=1): {one.cost:.4g} s less {fused} fused steps "
            f"beats p={p} at {plan.cost:.4g} s (a split must save a query step, {step_seconds:.2g} s)"
        )
        return dataclasses.replace(one, notes=(*one.notes, note)), 1
    return plan, p


def override_blocks(
    root: E.Node, parts: dict[int, int], max_bytes: int = MAX_BLOCK_BYTES
) -> Partitioning:
    """Explicit ``blocks={label: parts}``: those labels split so, everything else as the operands are; an
    array operand is uploaded in the blocking its first consumer reads. A block that would exceed
    ``max_bytes`` is split further (``fit_blocks``)."""
    base = default_partitioning(root)
    label_blocks = {}
    shapes = dict(base.block_shapes)
    placed: set[E.Node] = set()
    for node in E.topological(root):
        if isinstance(node, E.EinSum):
            sizes = _label_sizes(node)
            blocks = dict(base.label_blocks[node])
            for x in blocks:
                if x in parts:
                    blocks[x] = max(1, ceil_div(sizes[x], parts[x]))
            label_blocks[node] = blocks
            shapes[node] = tuple(blocks[x] for x in node.out_labels)
            for child, labels in zip(node.inputs, node.in_labels, strict=True):
                if isinstance(child, E.Operand) and child not in placed:
                    placed.add(child)
                    shapes[child] = tuple(blocks[x] for x in labels)
        elif isinstance(node, E.Map | E.Cast):
            shapes[node] = shapes[node.input]
        elif isinstance(node, E.Slice):
            shapes[node] = slice_blocks(node.count, node.keep, shapes[node.input])
    return fit_blocks(root, Partitioning(label_blocks, shapes), max_bytes)


def _label_sizes(node: E.EinSum) -> dict[int, int]:
    return {
        x: n
        for c, t in zip(node.inputs, node.in_labels, strict=True)
        for x, n in zip(t, c.shape, strict=True)
    }


def _reads(node: E.Node, part: Partitioning) -> dict[E.Node, tuple[int, ...]]:
    """The block shape ``node`` reads each of its inputs with under ``part``."""
    if isinstance(node, E.EinSum):
        blocks = part.label_blocks[node]
        return {c: tuple(blocks[x] for x in t) for c, t in zip(node.inputs, node.in_labels, strict=True)}
    if isinstance(node, E.Map | E.Cast):
        return {node.input: part.block_shapes[node]}
    return {}


def fit_blocks(root: E.Node, part: Partitioning, max_bytes: int) -> Partitioning:
    """``part`` with every block a plan makes within ``max_bytes``: each EinSum's operands as it reads them
    and its output, every map and cast, every array operand. A block too big is cut by halving the largest
    label of the tensor that overflows (``planner.split_to_fit``): blocks within the cap keep their size.
    Stored relations keep the blocks they were stored with (a plan reads them re-split). Returns ``part``
    itself when nothing needed a cut."""
    label_blocks = dict(part.label_blocks)
    shapes = dict(part.block_shapes)
    order = list(E.topological(root))
    for node in order:
        if isinstance(node, E.EinSum):
            tensors = [(t, _itemsize(c.dtype)) for c, t in zip(node.inputs, node.in_labels, strict=True)]
            tensors.append((node.out_labels, _itemsize(node.dtype)))
            blocks = P.split_to_fit(_label_sizes(node), tensors, max_bytes, part.label_blocks[node])
            if blocks != part.label_blocks[node]:
                label_blocks[node] = blocks
                shapes[node] = tuple(blocks[x] for x in node.out_labels)
        elif isinstance(node, E.Map | E.Cast):
            width = max(_itemsize(node.dtype), _itemsize(node.input.dtype))
            shapes[node] = fit_shape(node.shape, shapes[node], width, max_bytes)
        elif isinstance(node, E.Slice):  # the input's blocks, as fitted
            shapes[node] = slice_blocks(node.count, node.keep, shapes[node.input])
    fitted = Partitioning(label_blocks, shapes)
    # an array operand is read in the blocking of the consumer it was placed for (its first consumer reading
    # it in its planned blocks); each consumer's reads computed once (a graph of n steps: O(n), not O(n^2))
    placed: dict[E.Node, E.Node] = {}
    for c in order:
        for child, shape in _reads(c, part).items():
            if isinstance(child, E.Operand) and child not in placed and shape == part.block_shapes[child]:
                placed[child] = c
    for node in order:
        if isinstance(node, E.Operand):
            at = placed.get(node)
            shape = _reads(at, fitted)[node] if at is not None else shapes[node]
            shapes[node] = fit_shape(node.shape, shape, _itemsize(node.dtype), max_bytes)
    if label_blocks == part.label_blocks and shapes == part.block_shapes:
        return part
    return fitted


def fit_shape(
    shape: tuple[int, ...], block: tuple[int, ...], itemsize: int, max_bytes: int
) -> tuple[int, ...]:
    """``block`` split (its largest dimension halved first) until a block of ``shape`` holds at most
    ``max_bytes``."""
    dims = tuple(range(len(shape)))
    sizes = dict(zip(dims, shape, strict=True))
    fit = P.split_to_fit(sizes, [(dims, itemsize)], max_bytes, dict(zip(dims, block, strict=True)))
    return tuple(max(1, min(fit[d], max(1, n))) for d, n in zip(dims, shape, strict=True))


__all__ = [
    "STRATEGIES",
    "PlanOptions",
    "check_strategy",
    "cost_model_path",
    "fit_blocks",
    "load_cost_model",
    "max_block_bytes",
    "override_blocks",
    "plan_blocks",
]
