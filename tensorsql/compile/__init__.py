"""Compilation: expression graph -> partitioning (EinDecomp) -> TRA -> physical passes -> a finished Plan.

``compile_plan`` is the one path every front end and every executor shares.
"""

from __future__ import annotations

from tensorsql.compile import lower, planning, rewrite
from tensorsql.compile.plan import Plan, PlanInfo
from tensorsql.compile.profile import EngineProfile
from tensorsql.ir import expr as E


def operands_of(root: E.Node) -> tuple[E.Operand, ...]:
    """The graph's array operands, in topological order (the numbering of ``T.Input``)."""
    return tuple(n for n in E.topological(root) if isinstance(n, E.Operand))


def compile_plan(
    root: E.Node,
    *,
    strategy: str,
    workers: int,
    profile: EngineProfile,
    blocks: dict[int, int] | None = None,
) -> Plan:
    """Partition (EinDecomp unless told otherwise, or the explicit ``blocks`` per label), lower to TRA, and
    run the physical passes for the engine described by ``profile``."""
    if blocks:
        part = planning.override_blocks(root, blocks, profile.max_block_bytes)
        info = PlanInfo("blocks", 0, notes=[f"explicit blocks={blocks}"])
    else:
        part, info = planning.plan_blocks(root, strategy=strategy, threads=workers, engine=profile)
    operands = operands_of(root)
    tra = rewrite.physical(lower.lower(root, part, operands), profile)
    return Plan(root, part, tra, info, operands)


def in_gemm_order(plan: Plan, profile: EngineProfile) -> tuple[Plan, tuple[int, ...]] | None:
    """The plan with its root contraction in the GEMM's own output order and the permutation back, or None
    (``rewrite.gemm_order``)."""
    found = rewrite.gemm_order(plan.root, plan.partitioning)
    if found is None:
        return None
    root, part, perm = found
    tra = rewrite.physical(lower.lower(root, part, plan.operands), profile)
    return Plan(root, part, tra, plan.info, plan.operands), perm


__all__ = ["Plan", "PlanInfo", "compile_plan", "in_gemm_order", "operands_of"]
