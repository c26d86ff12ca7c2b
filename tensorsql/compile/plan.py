"""A finished plan: the expression graph, its partitioning, the TRA plan after the physical passes, and what
the planner decided. Engine-free and picklable (keyed by the nodes themselves), so a plan can be cached,
shown, or shipped to another process; an executor keeps its own state for it (SQL, prepared statements)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from tensorsql.frontend.numpy import describe_labels
from tensorsql.frontend.subscripts import label_name
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.ir.blocking import Partitioning


@dataclass(eq=False)
class PlanInfo:
    """What the planner decided and why, for explain()."""

    strategy: str
    p: int
    cost: float | None = None
    unit: str = "elements"
    node_costs: dict[E.Node, dict[str, float]] = field(default_factory=dict)
    node_parts: dict[E.Node, dict[str, int]] = field(default_factory=dict)
    baselines: dict[str, float] = field(default_factory=dict)
    #: costs the SQRT/data/model baselines would have; computed on first explain(), not on every plan
    more_baselines: Callable[[], dict[str, float]] | None = field(default=None, repr=False)
    notes: list[str] = field(default_factory=list)

    def resolve_baselines(self) -> dict[str, float]:
        """The baselines, computing the deferred ones (once)."""
        if self.more_baselines is not None:
            self.baselines = {**self.more_baselines(), **self.baselines}
            self.more_baselines = None
        return self.baselines

    def __getstate__(self) -> dict:
        self.resolve_baselines()  # the deferred ones are a closure over the planner's graph: not picklable
        return dict(self.__dict__)


@dataclass(frozen=True, eq=False)
class Plan:
    """Everything between an expression and an executor: partitioning, TRA plan, operand slots."""

    root: E.Node
    partitioning: Partitioning
    tra: T.Rel
    info: PlanInfo
    #: the graph's array operands, numbered as ``T.Input.index``: what a run binds to data
    operands: tuple[E.Operand, ...] = ()

    def block_shape(self, node: E.Node | None = None) -> tuple[int, ...]:
        return self.partitioning.block_shapes[self.root if node is None else node]


def describe(info: PlanInfo) -> list[str]:
    lines = [f"strategy={info.strategy} p={info.p}"]
    if info.cost is not None:
        lines[0] += f" modelled cost={info.cost:.4g} {info.unit}"
    if info.resolve_baselines():
        lines.append("baselines: " + ", ".join(f"{k}={v:.4g}" for k, v in info.baselines.items()))
    lines += [f"note: {n}" for n in info.notes]
    return lines


def _node_line(plan: Plan, node: E.Node, names: dict[E.Node, str]) -> str:
    if isinstance(node, E.Source):
        desc = f"Source {node.table}"
    elif isinstance(node, E.Operand):
        desc = f"Operand {node.name}"
    elif isinstance(node, E.EinSum):
        spec = ",".join(describe_labels(t) for t in node.in_labels) + "->" + describe_labels(node.out_labels)
        args = ", ".join(names[c] for c in node.inputs)
        blocks = plan.partitioning.label_blocks[node]
        part = " ".join(f"{label_name(k)}:{v}" for k, v in blocks.items())
        desc = f"EinSum '{spec}' join={node.join} agg={node.agg} ({args}) label blocks [{part}]"
    elif isinstance(node, E.Map):
        param = "" if node.param is None else f"({node.param})"
        desc = f"Map {node.fn}{param} ({names[node.input]})"
    elif isinstance(node, E.Cast):
        desc = f"Cast ({names[node.input]})"
    elif isinstance(node, E.Reblock):
        desc = f"Reblock ({names[node.input]})"
    elif isinstance(node, E.Slice):
        dims = ", ".join(
            f"{a}:{b}:{n}" if keep else f"{a}(dropped)"
            for a, n, b, keep in zip(node.start, node.count, node.step, node.keep, strict=True)
        )
        desc = f"Slice start:step:count [{dims}] ({names[node.input]})"
    else:
        raise TypeError(f"unhandled expression node {type(node).__name__}")
    line = f"{names[node]} = {desc} shape={node.shape} {node.dtype} blocks={plan.block_shape(node)}"
    parts = plan.info.node_parts.get(node)
    if parts:
        line += " parts[" + " ".join(f"{k}:{v}" for k, v in parts.items()) + "]"
    cost = plan.info.node_costs.get(node)
    if cost:
        keys = ("join", "agg", "repart", "assemble", "total")
        line += " cost[" + " ".join(f"{k}={cost[k]:.3g}" for k in keys if k in cost) + "]"
    return line


def explain(plan: Plan, sql: str | None = None, notes: list[str] | None = None) -> str:
    """The plan whole: planner decisions, EinGraph, TRA plan (with the physical choices), and the SQL the
    executor would run (``sql``, from the executor: the plan itself holds no engine text), with the
    executor's ``notes`` on how it runs it (in waves under a memory limit, say)."""
    lines = ["== Plan ==", *describe(plan.info), "", "== EinGraph =="]
    names: dict[E.Node, str] = {}
    for node in E.topological(plan.root):
        names[node] = f"v{len(names)}"
        lines.append(_node_line(plan, node, names))
    lines += ["", "== TRA plan ==", T.render(plan.tra)]
    if notes:
        lines += ["", "== Execution ==", *notes]
    if sql is not None:
        lines += ["", "== SQL ==", sql]
    return "\n".join(lines)


__all__ = ["Plan", "PlanInfo", "describe", "explain"]
