"""TensorRelation: a tensor stored (or to be computed) as a relation of (block keys, tensor blob)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from tensorsql import blocks as B
from tensorsql import expr as E
from tensorsql.dtypes import DTYPES

if TYPE_CHECKING:
    from tensorsql.session import Session

#: results from this size on may come back as a transposed view of the GEMM-ordered result (numpy())
GEMM_ORDER_BYTES = 1 << 20


class TensorRelation:
    """A handle on an expression node in a session; computing happens on ``numpy()``/``save()``/...

    Relations from ``from_numpy``/``from_sql``/``table`` are stored; ``einsum`` results are lazy and
    run as one SQL statement when their value is first asked for.
    """

    __slots__ = ("__weakref__", "_gemm_order", "_plan", "_plan_options", "node", "session")

    def __init__(self, session: Session, node: E.Node, plan_options: dict | None = None) -> None:
        self.session = session
        self.node = node
        self._plan_options = plan_options or {}
        self._plan = None
        self._gemm_order: tuple | bool | None = False  # not looked at yet

    def plan(self):  # -> session.Plan (not imported here: session imports this module)
        """The plan this relation runs with (computed once)."""
        if self._plan is None:
            self._plan = self.session.plan(self.node, **self._plan_options)
        return self._plan

    @property
    def shape(self) -> tuple[int, ...]:
        return self.node.shape

    @property
    def ndim(self) -> int:
        return len(self.node.shape)

    @property
    def dtype(self) -> np.dtype:
        return DTYPES[self.node.dtype]

    @property
    def block_shape(self) -> tuple[int, ...]:
        return self.plan().partitioning.block_shapes[id(self.node)]

    def numpy(self) -> np.ndarray:
        """The value as a new array, its blocks written into it by the kernels (``Session.run_into``).

        A big contraction whose output interleaves its operands' labels comes back as a transposed view of
        its GEMM-ordered result (``Session.gemm_order``), like numpy's own contractions; every other result
        is C-contiguous. Without result sinks (``TENSORSQL_RESULT_SINK=0``, or a result with absent blocks)
        the blocks come through Arrow and are assembled.
        """
        if self._gemm_order is False:
            big = self.dtype.itemsize * math.prod(self.shape) >= GEMM_ORDER_BYTES
            self._gemm_order = self.session.gemm_order(self.plan()) if big else None
        plan, perm = self._gemm_order or (self.plan(), None)
        arr = self.session.run_into(plan)
        if arr is None:
            root = plan.root
            arr = B.assemble(
                self.session.run(plan), root.shape, plan.partitioning.block_shapes[id(root)], root.dtype
            )
        return arr if perm is None else arr.transpose(perm)

    def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def to_arrow(self) -> pa.Table:
        """Key columns and the ``tensor`` blob column, with dtype/shape/block_shape in schema metadata."""
        table = self.session.run(self.plan())
        return table.replace_schema_metadata(B.metadata(self.shape, self.block_shape, self.node.dtype))

    def save(self, name: str, *, replace: bool = False) -> TensorRelation:
        """Store as a table ``name`` with a catalog entry; returns the stored relation."""
        return self.session.save(self, name, replace=replace)

    def materialize(self) -> TensorRelation:
        """Compute once into a temporary table, so later uses read the blocks instead of recomputing."""
        return self.session.materialize(self)

    def sql(self, pretty: bool = True) -> str:
        return self.plan().sql(pretty=pretty)

    def explain(self) -> str:
        return self.plan().explain()

    def reblock(
        self, block_shape: tuple[int, ...] | None = None, blocks: tuple[int, ...] | None = None
    ) -> TensorRelation:
        """The same tensor with another block shape (a repartition done in SQL by slice/assemble)."""
        bs = B.resolve_block_shape(self.shape, block_shape, blocks, "reblock")
        node = E.Reblock(shape=self.shape, dtype=self.node.dtype, input=self.node, block_shape=bs)
        return TensorRelation(self.session, node, dict(self._plan_options))

    def __repr__(self) -> str:
        kind = "stored" if isinstance(self.node, E.Source) else "lazy"
        return f"<TensorRelation {kind} shape={self.shape} dtype={self.node.dtype}>"
