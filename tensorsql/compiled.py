"""Compiled expressions (``Session.compile``): a lazy graph over placeholders planned once, then run on new
arrays per call. With ``share``, the steps several outputs use are computed once per call: as one statement
of the whole graph where the executor can (``Executor.many``), else a plan per shared step and output."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tensorsql.arguments import as_array
from tensorsql.compile.plan import Plan
from tensorsql.dtypes import DTYPES
from tensorsql.errors import DTypeError, EinsumError, ShapeError
from tensorsql.ir import expr as E
from tensorsql.ir import tra as T
from tensorsql.relation import TensorRelation

if TYPE_CHECKING:
    from tensorsql.session import Session

#: numbers the stored-relation names of a compiled graph's shared steps (``Compiled``)
_shared_ids = itertools.count()


class Compiled:
    """``Session.compile``'s result: ``f(*arrays)`` -> array (or a tuple, for several outputs)."""

    def __init__(
        self,
        session: Session,
        outputs: TensorRelation | Sequence[TensorRelation],
        inputs: Sequence[TensorRelation],
        share: bool = False,
    ) -> None:
        single = isinstance(outputs, TensorRelation)
        for given, what in ((outputs, "outputs"), (inputs, "inputs")):
            if not (single and what == "outputs") and (
                isinstance(given, str | bytes | TensorRelation) or not isinstance(given, Iterable)
            ):
                raise ShapeError(f"compile: {what} must be a list of relations, got {type(given).__name__}")
        inputs = list(inputs)
        outs = [outputs] if single else list(outputs)  # type: ignore[list-item]
        self._single = single
        self._leaves: list[E.Operand] = []
        for i, rel in enumerate(inputs):
            if not (isinstance(rel, TensorRelation) and isinstance(rel.node, E.Operand)):
                raise ShapeError(f"compile: input {i} must be a placeholder (Session.placeholder)")
            if rel.session is not session:
                raise ShapeError(f"compile: input {i} belongs to another session")
            if any(rel.node is leaf for leaf in self._leaves):  # the last array given would silently win
                raise ShapeError(f"compile: input {i} is input {self._leaves.index(rel.node)} again")
            self._leaves.append(rel.node)
        #: each input's (placeholder, shape, dtype): an array that matches takes no further check per call
        self._wants = [(leaf, leaf.shape, np.dtype(DTYPES[leaf.dtype])) for leaf in self._leaves]
        self._session = session
        self._plans: list[Plan] = []
        self._bound: list[dict[E.Operand, np.ndarray]] = []
        for j, rel in enumerate(outs):
            if not isinstance(rel, TensorRelation) or rel.session is not session:
                raise ShapeError(f"compile: output {j} must be a relation of this session")
        merged: dict[E.Operand, np.ndarray] = {}
        for j, rel in enumerate(outs):  # outputs of one cached call with other arrays: fresh leaves
            node = merge_into(merged, rel)
            if node is not rel.node:
                leaves = [n for n in E.topological(node) if isinstance(n, E.Operand)]
                bound = {n: merged[n] for n in leaves if n in merged}
                outs[j] = TensorRelation(session, node, bound, rel.options)
        #: shared steps, each run before the outputs into the placeholder that stands for it
        self._stages: list[tuple[Plan, dict[E.Operand, np.ndarray], E.Operand]] = []
        #: the whole graph as one run (``Executor.many``) and the arrays bound in it; None: plan by plan
        self._many: tuple[Callable, dict[E.Operand, np.ndarray]] | None = None
        self._outs = outs
        if share and len(outs) > 1:
            self._many = self._plan_many(outs)
        if self._many is None:
            self._plan_each(outs, share)

    def _plan_many(self, outs: list[TensorRelation]) -> tuple[Callable, dict[E.Operand, np.ndarray]] | None:
        """The outputs and the steps they share as one run of the executor, when it can: each shared step
        is planned by itself, and read by the later plans as a stored relation of the step's blocking."""
        session = self._session
        many = getattr(session.executor, "many", None)
        if many is None or not session.result_sink:  # it writes its outputs through result sinks only
            return None
        bindings: dict[E.Operand, np.ndarray] = {}
        for rel in outs:
            bindings.update(rel.bindings)
        uid = next(_shared_ids)
        done: dict[E.Node, E.Node] = {}
        stages: list[tuple[str, Plan]] = []
        for i, node in enumerate(shared_steps([rel.node for rel in outs])):
            plan = TensorRelation(session, E.substitute(node, done), bindings).plan()
            table = f"_ts_shared_{uid}_{i}"
            blocks = plan.block_shape()
            complete = not T.may_lack_blocks(plan.tra)  # from arrays alone: no absent block to fill later
            done[node] = E.Source(
                shape=node.shape, dtype=node.dtype, table=table, block_shape=blocks, complete=complete
            )
            stages.append((table, plan))
        plans = []
        for j, rel in enumerate(outs):
            plan = TensorRelation(session, E.substitute(rel.node, done), rel.bindings, rel.options).plan()
            self._check_known(plan, j, set(self._leaves), bindings)
            plans.append(plan)
        for _, plan in stages:
            self._check_known(plan, None, set(self._leaves), bindings)
        run = many(stages, plans)
        if run is None:
            return None
        return run, {op: a for op, a in bindings.items() if op not in self._leaves}

    @staticmethod
    def _check_known(plan: Plan, j: int | None, known: set[E.Operand], bindings: Mapping) -> None:
        missing = [op.name for op in plan.operands if op not in known and op not in bindings]
        if missing:
            what = "a shared step" if j is None else f"output {j}"
            raise ShapeError(f"compile: {what} depends on placeholders not in inputs: {missing}")

    def _plan_each(self, outs: list[TensorRelation], share: bool) -> None:
        """A plan per output (and per shared step, whose value the later plans read as an array)."""
        session = self._session
        done: dict[E.Node, E.Node] = {}
        if share and len(outs) > 1:
            bindings: dict[E.Operand, np.ndarray] = {}
            for rel in outs:
                bindings.update(rel.bindings)
            for i, node in enumerate(shared_steps([rel.node for rel in outs])):
                step = TensorRelation(session, E.substitute(node, done), bindings)
                stand_in = E.Operand(shape=node.shape, dtype=node.dtype, name=f"shared{i}")
                self._stages.append((step.plan(), self._bound_of(step), stand_in))
                done[node] = stand_in
        known = set(self._leaves) | {stand_in for _, _, stand_in in self._stages}
        for j, rel in enumerate(outs):
            if done:
                rel = TensorRelation(session, E.substitute(rel.node, done), rel.bindings, rel.options)
            plan = rel.plan()
            self._check_known(plan, j, known, rel.bindings)
            self._plans.append(plan)
            self._bound.append(self._bound_of(rel))

    def _bound_of(self, rel: TensorRelation) -> dict[E.Operand, np.ndarray]:
        return {op: a for op, a in rel.bindings.items() if op not in self._leaves}

    def __call__(self, *arrays: object) -> object:
        if len(arrays) != len(self._leaves):
            raise EinsumError(f"expected {len(self._leaves)} input arrays, got {len(arrays)}")
        given: dict[E.Operand, np.ndarray] = {}
        for i, ((leaf, shape, want), a) in enumerate(zip(self._wants, arrays, strict=True)):
            arr = a if type(a) is np.ndarray else as_array(a, f"input {i}")
            if arr.shape != shape:
                raise ShapeError(f"input {i} ({leaf.name!r}) has shape {arr.shape}, expected {leaf.shape}")
            given[leaf] = arr if arr.dtype == want else _coerced(arr, i, leaf, want)
        self._session.check_read(self, [o.node for o in self._outs])
        if self._many is not None and self._session.result_sink:
            self._session.require_open("compute")
            run, bound = self._many
            results = run({**bound, **given})
            if results is not None:
                return results[0] if self._single else tuple(results)
            # an absent block (a sparse stored input: it stays so): from now on the plans run one by one,
            # which fill it with zeros
            self._many = None
        if not self._plans:
            self._plan_each(self._outs, share=True)
        for plan, bound, stand_in in self._stages:
            given[stand_in] = self._session.value(plan, {**bound, **given})
        results = [
            self._session.value(plan, {**bound, **given})
            for plan, bound in zip(self._plans, self._bound, strict=True)
        ]
        return results[0] if self._single else tuple(results)


def _coerced(arr: np.ndarray, i: int, leaf: E.Operand, want: np.dtype) -> np.ndarray:
    """Input ``i`` in its placeholder's dtype: the same values in native byte order, or a same-kind cast that
    keeps every value; anything else a DTypeError."""
    if arr.dtype.name == leaf.dtype:  # big-endian float64: the same values
        return arr.astype(want)
    if not np.can_cast(arr.dtype, want, "same_kind"):
        raise DTypeError(f"input {i} ({leaf.name!r}) has dtype {arr.dtype}, expected {leaf.dtype}")
    with np.errstate(over="ignore", invalid="ignore"):  # found below, as a typed error
        cast = arr.astype(want)
    if not np.can_cast(arr.dtype, want, "safe") and not _kept(arr, cast):
        # a narrowing cast that changes values: int64 300 into an int8 placeholder was 44
        raise DTypeError(
            f"input {i} ({leaf.name!r}) of dtype {arr.dtype} has values that {leaf.dtype} cannot "
            "hold (it would wrap or overflow); pass an array of the placeholder's dtype"
        )
    return cast


def shared_steps(roots: Sequence[E.Node]) -> list[E.Node]:
    """The steps (not leaves) of the graphs of ``roots`` that two or more consumers use (a root counts as a
    use), inputs before consumers."""
    uses: dict[E.Node, int] = {}
    order: list[E.Node] = []
    seen: set[E.Node] = set()
    for root in roots:
        uses[root] = uses.get(root, 0) + 1
        for node in E.topological(root):
            if node not in seen:
                seen.add(node)
                order.append(node)
                for child in E.children(node):
                    uses[child] = uses.get(child, 0) + 1
    return [n for n in order if uses.get(n, 0) >= 2 and E.children(n)]


def merge_into(bindings: dict[E.Operand, np.ndarray], rel: TensorRelation) -> E.Node:
    """``rel``'s node, its bindings added to ``bindings``. Relations made from one cached call share their
    graph (``Session.einsum``), so two of them bind the same leaves to different arrays: where a leaf is
    bound already to another array, ``rel``'s graph is rebuilt over fresh leaves and those are bound."""
    clash = [leaf for leaf, arr in rel.bindings.items() if leaf in bindings and bindings[leaf] is not arr]
    if not clash:
        bindings.update(rel.bindings)
        return rel.node
    fresh: dict[E.Node, E.Node] = {
        leaf: E.Operand(shape=leaf.shape, dtype=leaf.dtype, name=leaf.name) for leaf in clash
    }
    for leaf, arr in rel.bindings.items():
        bindings[fresh.get(leaf, leaf)] = arr  # type: ignore[index]
    return E.substitute(rel.node, fresh)


def _kept(before: np.ndarray, after: np.ndarray) -> bool:
    """Whether a narrowing cast kept every value: integers exactly, floats without overflowing to
    infinity (rounding to the narrower float is the cast's point)."""
    if after.dtype.kind in "iu":  # compared as values (numpy's mixed-sign comparisons are exact): a round
        # trip through the cast could not see uint8 200 wrapped to int8 -56, of the same width
        return bool(np.array_equal(after, before))
    with np.errstate(invalid="ignore"):
        return not bool(np.any(np.isinf(after) & np.isfinite(before)))


def compute(session: Session, rels: Sequence[TensorRelation], store: bool) -> list:
    """``Session.compute``: each shared step is stored once, then every relation is run over the stored
    steps."""
    session.require_open("compute")
    if isinstance(rels, TensorRelation) or not isinstance(rels, Sequence):
        raise ShapeError("compute takes a list of relations")
    rels = [session._own(r, "compute") for r in rels]
    bindings: dict[E.Operand, np.ndarray] = {}
    roots = [merge_into(bindings, r) for r in rels]
    done: dict[E.Node, E.Node] = {}
    for node in shared_steps(roots):  # a shared step reads the shared steps below it
        rel = TensorRelation(session, E.substitute(node, done), bindings)
        done[node] = session.materialize(rel).node
    out = []
    for r, root in zip(rels, roots, strict=True):
        rel = TensorRelation(session, E.substitute(root, done), bindings, r.options)
        out.append(session.materialize(rel) if store else rel.numpy())
    return out
