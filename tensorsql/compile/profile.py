"""An engine's costs and limits as planning sees them: compile plans for any engine from these alone, and
each engine (``backends``) describes itself with one."""

from __future__ import annotations

from dataclasses import dataclass

from tensorsql.ir.blocking import MAX_BLOCK_BYTES


@dataclass(frozen=True)
class EngineProfile:
    """Costs and limits of an engine that planning and the physical passes take into account.

    join_byte: seconds per byte a join or aggregation hands through the engine (memory speed, one thread);
    split_flops: flops per worker from which one kernel call parallelizes itself (fewer, larger blocks lose
    nothing); step_seconds: what a contraction costs as a query step of its own beyond its kernel work (what
    fusing it saves); pin_pairs: joins of fewer block pairs pin their left side's block shapes (a DuckDB
    join-buffer workaround); side_joins: whether one-block sides may be paired by position;
    max_block_bytes: no block a plan makes (input as read, intermediate, output) may be larger (a session's
    setting: ``connect(max_block_bytes=...)``); repart_byte: seconds per byte of a tensor the engine re-splits
    (None: the planner's own pricing, ``planner.CostModel.repart_byte``); exchange: seconds a re-split
    between two steps costs beyond its bytes (a cluster's stage boundary; ``planner.CostModel.exchange``);
    task_join: calls beyond the engine's threads merge into a task per thread that reads each of its blocks
    once (a cluster's stage; ``planner.CostModel.task_join``).
    """

    join_byte: float
    split_flops: float
    step_seconds: float
    pin_pairs: int = 0
    side_joins: bool = False
    max_block_bytes: int = MAX_BLOCK_BYTES
    repart_byte: float | None = None
    exchange: float = 0.0
    task_join: bool = False
