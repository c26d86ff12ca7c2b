"""The executor seam: what the facade (``Session``) needs from an engine. The engine's planning terms
(``EngineProfile``) are compile's own (``compile.profile``), which plans without importing any engine.

An executor receives finished plans (``compile.plan.Plan``) and runs them; it never plans. The embedded
DuckDB executor (``backends.duckdb``) is the first implementation; a cluster and GPU executors implement the
same protocol.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from tensorsql.compile.profile import EngineProfile

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

    from tensorsql.compile.plan import Plan
    from tensorsql.ir import expr as E


@dataclass(frozen=True)
class CatalogEntry:
    name: str
    dtype: str
    shape: tuple[int, ...]
    block_shape: tuple[int, ...]


#: operand bindings of one run: each Operand leaf of the plan -> the array it stands for
Bindings = Mapping["E.Operand", "np.ndarray"]


@runtime_checkable
class Catalog(Protocol):
    """Named, stored tensor relations and their metadata."""

    def get(self, name: str) -> CatalogEntry: ...
    def get_many(self, names: Sequence[str]) -> dict[str, CatalogEntry]:
        """Those of ``names`` that are stored, by name folded to lower case, in one lookup."""
        ...

    def names(self) -> list[str]: ...
    def exists(self, name: str) -> bool: ...
    def drop(self, name: str) -> None: ...


@runtime_checkable
class KernelSet(Protocol):
    """The block kernels an engine runs: where they come from and the functions they provide."""

    def functions(self) -> list[str]: ...


@runtime_checkable
class Executor(Protocol):
    """Runs finished plans. ``workers`` is the parallelism the planner aims its kernel calls at."""

    name: str
    profile: EngineProfile
    catalog: Catalog
    kernel_set: KernelSet

    @property
    def workers(self) -> int: ...
    def upload(
        self, table: pa.Table, layout: tuple[tuple[int, ...], tuple[int, ...], str], *, verified: bool = ...
    ) -> str: ...
    def release(self, name: str) -> None: ...
    def run_arrow(self, plan: Plan, bindings: Bindings, *, keep: bool = ...) -> pa.Table: ...
    def run_into(self, plan: Plan, bindings: Bindings, out: np.ndarray, *, keep: bool = ...) -> bool: ...
    def fast(self, plan: Plan) -> Callable[[Bindings], np.ndarray | None] | None: ...
    def many(
        self, stages: Sequence[tuple[str, Plan]], outputs: Sequence[Plan]
    ) -> Callable[[Bindings], list[np.ndarray] | None] | None:
        """Plans of one graph as one run (None: not supported, or not for these plans): each stage's result
        is read by later plans as the stored relation named by the stage's table."""
        ...

    def store(
        self, plan: Plan, bindings: Bindings, name: str | None, *, replace: bool = ..., temporary: bool = ...
    ) -> str: ...
    def drop(self, name: str) -> None: ...
    def text(self, plan: Plan, pretty: bool = True) -> str: ...
    def notes(self, plan: Plan) -> list[str]: ...
    def close(self) -> None: ...


__all__ = ["Bindings", "Catalog", "CatalogEntry", "EngineProfile", "Executor", "KernelSet"]
